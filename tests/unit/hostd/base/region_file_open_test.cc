// Opening a VM's region file by path (region_file_open.h): the checks both
// backends rely on when they read guest bytes from a file a local user may
// have replaced.
#include "region_file_open.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "test_support.h"

namespace hvtrace::hostd {
namespace {

class RegionFileOpenTest : public ::testing::Test {
 protected:
  void MakeFile(const std::string& name, uintmax_t size) {
    std::ofstream(dir_ / name).close();
    std::filesystem::resize_file(dir_ / name, size);
  }
  RegionFileExpectation Spec(const std::string& file) {
    RegionFileExpectation spec;
    spec.owner_label = "domain 'd1'";
    spec.path = dir_ / file;
    spec.size = 4096;
    spec.owner_uid = ::geteuid();
    return spec;
  }
  test_support::TempDir tmp_{"hvt-regionfile"};
  const std::filesystem::path dir_ = tmp_.path();
};

TEST_F(RegionFileOpenTest, OpensQemusRegularFile) {
  MakeFile("ram-node1", 8192);
  Result<int> fd = OpenRegionFileChecked(Spec("ram-node1"));
  ASSERT_TRUE(fd.ok()) << fd.error().message;
  ::close(*fd);
}

// A FIFO where QEMU's file should be: refused at once, never waited on (the
// old open blocked a worker until someone wrote to it).
TEST_F(RegionFileOpenTest, Malicious_FifoIsRefusedWithoutBlocking) {
  ASSERT_EQ(::mkfifo((dir_ / "ram-node1").c_str(), 0600), 0);
  const auto t0 = std::chrono::steady_clock::now();
  Result<int> fd = OpenRegionFileChecked(Spec("ram-node1"));
  ASSERT_FALSE(fd.ok());
  EXPECT_NE(fd.error().message.find("not a regular file"), std::string::npos) << fd.error().message;
  EXPECT_NE(fd.error().message.find("domain 'd1'"), std::string::npos);
  std::printf(
      "[ fifo ] refused in %.3f ms: %s\n",
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count(),
      fd.error().message.c_str());
}

TEST_F(RegionFileOpenTest, Malicious_SymlinkAndStrangersFileAreRefused) {
  MakeFile("real", 8192);
  std::filesystem::create_symlink(dir_ / "real", dir_ / "ram-node1");
  Result<int> fd = OpenRegionFileChecked(Spec("ram-node1"));
  ASSERT_FALSE(fd.ok());
  EXPECT_NE(fd.error().message.find("cannot open"), std::string::npos) << fd.error().message;

  // A file of another user (not QEMU's, not root's).
  if (::geteuid() == 0) {
    ASSERT_EQ(::chown((dir_ / "real").c_str(), 65534, 65534), 0);
    RegionFileExpectation spec = Spec("real");
    spec.owner_uid = 64055;
    fd = OpenRegionFileChecked(spec);
    ASSERT_FALSE(fd.ok());
    EXPECT_NE(fd.error().message.find("belongs to uid 65534"), std::string::npos)
        << fd.error().message;
  }
  // Too short for the range.
  RegionFileExpectation spec = Spec("real");
  spec.owner_uid.reset();
  spec.size = 1 << 20;
  fd = OpenRegionFileChecked(spec);
  ASSERT_FALSE(fd.ok());
  EXPECT_NE(fd.error().message.find("less than"), std::string::npos) << fd.error().message;
}

// A file that is not the one QEMU maps (this process maps no such file).
TEST_F(RegionFileOpenTest, Malicious_FileQemuDoesNotMapIsRefused) {
  MakeFile("ram-node1", 8192);
  RegionFileExpectation spec = Spec("ram-node1");
  spec.mapped_by = ::getpid();
  Result<int> fd = OpenRegionFileChecked(spec);
  ASSERT_FALSE(fd.ok());
  EXPECT_NE(fd.error().message.find("is not the file QEMU pid"), std::string::npos)
      << fd.error().message;
  // Once "QEMU" (this process) maps it, it is the one.
  const int map_fd = ::open(spec.path.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(map_fd, 0);
  void* map = ::mmap(nullptr, 8192, PROT_READ, MAP_SHARED, map_fd, 0);
  ASSERT_NE(map, MAP_FAILED);
  fd = OpenRegionFileChecked(spec);
  EXPECT_TRUE(fd.ok()) << fd.error().message;
  if (fd.ok()) ::close(*fd);
  ::munmap(map, 8192);
  ::close(map_fd);
}

}  // namespace
}  // namespace hvtrace::hostd
