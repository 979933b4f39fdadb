// Capping a log another process keeps open (a guest's console.log, which
// QEMU appends to): copy-then-truncate, never through a symlink.
#include "log_rotation.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <string>

#include "test_support.h"

namespace hvtrace::hostd {
namespace {

namespace fs = std::filesystem;
using test_support::ReadText;
using test_support::TempDir;

void Append(int fd, const std::string& text) {
  ASSERT_EQ(::write(fd, text.data(), text.size()), static_cast<ssize_t>(text.size()));
}

TEST(LogRotationTest, KeepsTheTailAndTheWriterAppendsFromZero) {
  TempDir tmp;
  const fs::path log = tmp.path() / "console.log";
  // The writer as QEMU opens it with logappend=on.
  int writer = ::open(log.c_str(), O_CREAT | O_WRONLY | O_APPEND | O_CLOEXEC, 0640);
  ASSERT_GE(writer, 0);
  std::string first;
  for (int i = 0; i < 1000; ++i) first += "line " + std::to_string(i) + "\n";
  Append(writer, first);
  auto same = RotateLogIfLarger(log, first.size(), 3);
  ASSERT_TRUE(same.ok());
  EXPECT_FALSE(*same);  // Not over the cap.

  auto rotated = RotateLogIfLarger(log, 4096, 3);
  ASSERT_TRUE(rotated.ok()) << rotated.error().message;
  EXPECT_TRUE(*rotated);
  EXPECT_EQ(fs::file_size(log), 0u);
  EXPECT_EQ(ReadText((log.string() + ".1")), first.substr(first.size() - 4096));
  Append(writer, "after rotation\n");
  EXPECT_EQ(ReadText(log.string()), "after rotation\n");  // At offset 0: no hole.

  // Older copies shift; at most |files| in all.
  for (int round = 0; round < 3; ++round) {
    Append(writer, std::string(5000, static_cast<char>('a' + round)) + "\n");
    ASSERT_TRUE(RotateLogIfLarger(log, 4096, 3).ok());
  }
  EXPECT_TRUE(fs::exists(log.string() + ".1"));
  EXPECT_TRUE(fs::exists(log.string() + ".2"));
  EXPECT_FALSE(fs::exists(log.string() + ".3"));
  EXPECT_EQ(ReadText(log.string() + ".1").back(), '\n');
  EXPECT_EQ(ReadText(log.string() + ".1")[0], 'c');
  EXPECT_EQ(ReadText(log.string() + ".2")[0], 'b');
  EXPECT_LE(fs::file_size(log.string() + ".1"), 4096u);

  // One file: truncated, nothing kept.
  Append(writer, std::string(5000, 'z'));
  ASSERT_TRUE(RotateLogIfLarger(log, 4096, 1).ok());
  EXPECT_EQ(fs::file_size(log), 0u);
  ::close(writer);
}

TEST(LogRotationTest, Malicious_SymlinkIsNotFollowed) {
  TempDir tmp;
  const fs::path target = tmp.path() / "precious";
  {
    int fd = ::open(target.c_str(), O_CREAT | O_WRONLY, 0600);
    ASSERT_GE(fd, 0);
    Append(fd, std::string(10000, 'p'));
    ::close(fd);
  }
  const fs::path log = tmp.path() / "console.log";
  fs::create_symlink(target, log);
  auto rotated = RotateLogIfLarger(log, 4096, 2);
  ASSERT_FALSE(rotated.ok());
  EXPECT_NE(rotated.error().message.find(log.string()), std::string::npos);
  EXPECT_EQ(fs::file_size(target), 10000u);
  // A missing log is not an error.
  auto missing = RotateLogIfLarger(tmp.path() / "none.log", 4096, 2);
  ASSERT_TRUE(missing.ok());
  EXPECT_FALSE(*missing);
}

}  // namespace
}  // namespace hvtrace::hostd
