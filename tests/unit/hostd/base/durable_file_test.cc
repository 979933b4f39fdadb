// WriteFileDurably: the old contents or the new, never through a symlink,
// no hidden file left behind on success or failure, errors name the path.
#include "durable_file.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "test_support.h"

namespace hvtrace::hostd {
namespace {

namespace fs = std::filesystem;
using test_support::ReadText;
using test_support::TempDir;

void WriteText(const fs::path& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

size_t EntriesIn(const fs::path& dir) {
  size_t n = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(dir)) ++n;
  return n;
}

TEST(DurableFile, ReplacesWholeWithItsModeAndLeavesNothingBeside) {
  TempDir dir("durable_file_test");
  const fs::path path = dir.path() / "record.json";
  ASSERT_TRUE(WriteFileDurably(path, "first\n", 0600).ok());
  ASSERT_TRUE(WriteFileDurably(path, "second, longer\n", 0600).ok());
  EXPECT_EQ(ReadText(path), "second, longer\n");
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0600u);
  EXPECT_EQ(EntriesIn(dir.path()), 1u);
  ASSERT_TRUE(WriteFileDurably(path, "").ok());
  EXPECT_EQ(ReadText(path), "");
}

TEST(DurableFile, APlantedSymlinkAtTheTemporaryNameIsNotFollowed) {
  TempDir dir("durable_file_test");
  const fs::path victim = dir.path() / "victim";
  WriteText(victim, "keep");
  fs::create_symlink(victim, dir.path() / ".record.json.tmp");
  Status s = WriteFileDurably(dir.path() / "record.json", "new");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find(".record.json.tmp"), std::string::npos) << s.error().message;
  EXPECT_EQ(ReadText(victim), "keep");
  EXPECT_FALSE(fs::exists(dir.path() / "record.json"));
}

TEST(DurableFile, AFailedRenameKeepsTheOldFileAndRemovesTheHiddenOne) {
  TempDir dir("durable_file_test");
  const fs::path path = dir.path() / "record.json";
  fs::create_directory(path);  // rename of a file over a directory fails (EISDIR)
  WriteText(path / "inside", "x");
  Status s = WriteFileDurably(path, "new");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find(path.string()), std::string::npos) << s.error().message;
  EXPECT_FALSE(fs::exists(dir.path() / ".record.json.tmp"));
  EXPECT_TRUE(fs::is_directory(path));
}

TEST(DurableFile, AMissingDirectoryIsAnErrorNamingIt) {
  TempDir dir("durable_file_test");
  Status s = WriteFileDurably(dir.path() / "absent" / "record.json", "x");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("absent"), std::string::npos) << s.error().message;
}

}  // namespace
}  // namespace hvtrace::hostd
