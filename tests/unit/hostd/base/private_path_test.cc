// private_path.h: what hvtraced trusts and creates next to local users who
// may race it — a planted file, a symlink, a directory others can write.
#include "private_path.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "test_support.h"

namespace hvtrace::hostd {
namespace {

namespace fs = std::filesystem;
using test_support::TempDir;
using ::testing::HasSubstr;

TEST(PrivatePathTest, TrustsRootsOwnPathsAndStickyTmp) {
  TempDir dir;  // Under /tmp: root's sticky directory.
  EXPECT_TRUE(CheckTrustedPath(dir.path(), "test").ok());
  EXPECT_TRUE(CheckTrustedPath("/", "test").ok());
}

TEST(PrivatePathTest, Malicious_SymlinksAndWritableComponentsAreRefused) {
  TempDir dir;
  fs::create_directory(dir.path() / "real");
  std::ofstream(dir.path() / "real" / "file") << "x";
  fs::create_directory_symlink(dir.path() / "real", dir.path() / "link");
  Status s = CheckTrustedPath(dir.path() / "link" / "file", "formats cache");
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.error().message, HasSubstr((dir.path() / "link").string() + " is a symlink"));
  EXPECT_THAT(s.error().message, HasSubstr("formats cache"));

  fs::permissions(dir.path() / "real", fs::perms::others_write, fs::perm_options::add);
  s = CheckTrustedPath(dir.path() / "real" / "file", "formats cache");
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.error().message, HasSubstr("writable by others"));
  EXPECT_THAT(s.error().message, HasSubstr("mode 0757"));
  fs::permissions(dir.path() / "real", fs::perms::others_write, fs::perm_options::remove);
  EXPECT_TRUE(CheckTrustedPath(dir.path() / "real" / "file", "x").ok());

  if (::geteuid() == 0) {
    ASSERT_EQ(::chown((dir.path() / "real" / "file").c_str(), 65534, 65534), 0);
    s = CheckTrustedPath(dir.path() / "real" / "file", "x");
    ASSERT_FALSE(s.ok());
    EXPECT_THAT(s.error().message, HasSubstr("belongs to another user (owner uid 65534"));
  }
}

TEST(PrivatePathTest, PrivateDirIsMadeOnceAndMustStayPrivate) {
  TempDir dir;
  const fs::path mem = dir.path() / "run" / "mem";
  ASSERT_TRUE(EnsurePrivateDir(mem, "mem").ok());
  struct stat st {};
  ASSERT_EQ(::stat(mem.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0700u);
  EXPECT_TRUE(EnsurePrivateDir(mem, "mem").ok());  // Again: fine.
  fs::permissions(mem, fs::perms::group_read | fs::perms::group_exec, fs::perm_options::add);
  Status s = EnsurePrivateDir(mem, "guest memory directory");
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.error().message, HasSubstr("guest memory directory"));
  EXPECT_THAT(s.error().message, HasSubstr("mode 0750"));
}

// The name is planted before the daemon creates its file: a file, a
// symlink to a file the attacker wants written, a directory. Each is
// refused and left alone, never opened or followed.
TEST(PrivatePathTest, Malicious_ExclusiveCreateNeverOpensWhatIsThere) {
  TempDir dir;
  const fs::path target = dir.path() / "victim";
  std::ofstream(target) << "precious";
  fs::create_symlink(target, dir.path() / "planted-link");
  std::ofstream(dir.path() / "planted-file") << "theirs";
  fs::create_directory(dir.path() / "planted-dir");
  for (const char* name : {"planted-link", "planted-file", "planted-dir"}) {
    Result<UniqueFd> fd = CreateExclusiveFile(dir.path() / name, 0600, "backing file");
    ASSERT_FALSE(fd.ok()) << name;
    EXPECT_THAT(fd.error().message, HasSubstr("already exists")) << name;
  }
  EXPECT_EQ(test_support::ReadText(target), "precious");
  Result<UniqueFd> fd = CreateExclusiveFile(dir.path() / "new", 0600, "backing file");
  ASSERT_TRUE(fd.ok()) << fd.error().message;
  struct stat st {};
  ASSERT_EQ(::fstat(fd->get(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0600u);
  EXPECT_EQ(st.st_uid, ::geteuid());
}

// The guest memory directory: QEMU's group may traverse it (0710), nobody
// else may enter, and nobody but the daemon may list or create entries.
TEST(PrivatePathTest, GuestMemoryDirGivesQemuTraverseOnly) {
  TempDir dir;
  const fs::path mem = dir.path() / "mem";
  ASSERT_TRUE(EnsureGuestMemoryDir(mem, std::nullopt, "guest memory").ok());
  struct stat st {};
  ASSERT_EQ(::stat(mem.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0700u);

  const gid_t qemu_gid = 65534;
  Status s = EnsureGuestMemoryDir(mem, qemu_gid, "guest memory");
  ASSERT_TRUE(s.ok()) << s.error().message;
  ASSERT_EQ(::stat(mem.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0710u);
  EXPECT_EQ(st.st_gid, qemu_gid);
  // A VM that runs as root later neither refuses nor takes back the grant
  // other VMs' QEMUs rely on.
  EXPECT_TRUE(EnsureGuestMemoryDir(mem, std::nullopt, "guest memory").ok());
  ASSERT_EQ(::stat(mem.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0710u);
}

TEST(PrivatePathTest, Malicious_GuestMemoryDirOthersCanListOrWriteIsRefused) {
  TempDir dir;
  const fs::path mem = dir.path() / "mem";
  ASSERT_TRUE(EnsureGuestMemoryDir(mem, std::nullopt, "guest memory").ok());
  for (mode_t mode : {0750, 0730, 0701, 0711}) {
    ASSERT_EQ(::chmod(mem.c_str(), mode), 0);
    Status s = EnsureGuestMemoryDir(mem, 65534, "guest memory");
    ASSERT_FALSE(s.ok()) << std::oct << mode;
    EXPECT_THAT(s.error().message, HasSubstr("mode 0700 or 0710"));
  }
  ASSERT_EQ(::chmod(mem.c_str(), 0700), 0);
  fs::remove(mem);
  fs::create_directory_symlink(dir.path(), mem);
  Status s = EnsureGuestMemoryDir(mem, 65534, "guest memory");
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.error().message, HasSubstr("not a symlink"));
}

}  // namespace
}  // namespace hvtrace::hostd
