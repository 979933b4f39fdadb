#include "capped_file.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>

#include "test_support.h"

namespace hvtrace::hostd {
namespace {

namespace fs = std::filesystem;
using test_support::TempDir;
using ::testing::HasSubstr;

TEST(CappedFileTest, ReadsWholeFilesUpToTheCap) {
  TempDir dir;
  const fs::path file = dir.path() / "a";
  std::ofstream(file) << "hello";
  auto text = ReadCappedFile(file, 5);
  ASSERT_TRUE(text.ok()) << text.error().message;
  EXPECT_EQ(*text, "hello");
  auto bytes = ReadCappedFileBytes(file, 5);
  ASSERT_TRUE(bytes.ok());
  EXPECT_EQ(bytes->size(), 5u);
  EXPECT_THAT(ReadCappedFile(file, 4).error().message, HasSubstr("more than the 4-byte limit"));
}

TEST(CappedFileTest, RefusesSymlinksDirectoriesAndMissingFiles) {
  TempDir dir;
  const fs::path file = dir.path() / "a";
  std::ofstream(file) << "x";
  fs::create_symlink(file, dir.path() / "link");
  EXPECT_THAT(ReadCappedFile(dir.path() / "link", 10).error().message, HasSubstr("link"));
  EXPECT_THAT(ReadCappedFile(dir.path(), 10).error().message, HasSubstr("not a regular file"));
  EXPECT_THAT(ReadCappedFile(dir.path() / "none", 10).error().message, HasSubstr("cannot open"));
  auto missing = ReadCappedFile(dir.path() / "none", 10, /*missing_ok=*/true);
  ASSERT_TRUE(missing.ok());
  EXPECT_TRUE(missing->empty());
}

TEST(CappedFileTest, FileTailIsTheLastBytesOrNothing) {
  TempDir dir;
  const fs::path file = dir.path() / "log";
  std::ofstream(file) << "first line\nlast line\n";
  EXPECT_EQ(ReadFileTail(file, 10), "last line\n");
  EXPECT_EQ(ReadFileTail(file, 4096), "first line\nlast line\n");
  std::ofstream(dir.path() / "empty");
  EXPECT_EQ(ReadFileTail(dir.path() / "empty", 10), "");
  EXPECT_EQ(ReadFileTail(dir.path() / "none", 10), "");
  EXPECT_EQ(ReadFileTail("", 10), "");
  fs::create_symlink(file, dir.path() / "link");
  EXPECT_EQ(ReadFileTail(dir.path() / "link", 10), "");
  // No writer: a blocking open would never return.
  ASSERT_EQ(::mkfifo((dir.path() / "fifo").c_str(), 0600), 0);
  EXPECT_EQ(ReadFileTail(dir.path() / "fifo", 10), "");
}

}  // namespace
}  // namespace hvtrace::hostd
