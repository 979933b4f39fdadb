// The parts of the libvirt backend that need no daemon: kernel size parsing,
// the boot-range lookup's refusals, and how a region file is opened (a FIFO,
// a symlink or a stranger's file planted where QEMU's should be is refused).
#include "libvirt_backend.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>

namespace hvtrace::hostd {
namespace {

TEST(LibvirtBackend, ParseKernelSize) {
  EXPECT_EQ(*ParseKernelSize("16M"), 16ull << 20);
  EXPECT_EQ(*ParseKernelSize("4096"), 4096u);
  EXPECT_EQ(*ParseKernelSize("0x40000000"), 0x40000000u);
  EXPECT_EQ(*ParseKernelSize("2G"), 2ull << 30);
  EXPECT_EQ(*ParseKernelSize("64k"), 64u << 10);
  EXPECT_FALSE(ParseKernelSize("").ok());
  EXPECT_FALSE(ParseKernelSize("M").ok());
  EXPECT_FALSE(ParseKernelSize("16Q").ok());
  EXPECT_FALSE(ParseKernelSize("99999999999999999999G").ok());
  EXPECT_FALSE(ParseKernelSize("17179869184G").ok());  // Overflows 64 bits.
}

const Result<DomainQemu> kNoQemu =
    Error{"domain 'no-such-qemu-here-xyz': no pid file for it under libvirtd"};

DomainXmlInfo BootDomain(const std::string& cmdline) {
  DomainXmlInfo info;
  info.name = "no-such-qemu-here-xyz";
  info.cmdline = cmdline;
  info.numa_cells = {{0, 448ull << 20, ""}, {1, 64ull << 20, "shared"}};
  return info;
}

TEST(LibvirtBackend, Malicious_BootRangeLookupRefusesWhatItCannotPlace) {
  Result<LibvirtRegionSpec> r = FindBootRangeRegion(BootDomain("console=ttyS0"), kNoQemu);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("no memmap="), std::string::npos) << r.error().message;

  r = FindBootRangeRegion(BootDomain("memmap=16M$zz"), kNoQemu);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("cannot parse"), std::string::npos) << r.error().message;

  // The range below node 1 (in node 0): refused.
  r = FindBootRangeRegion(BootDomain("memmap=16M$0x1000000"), kNoQemu);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("not in NUMA node 1"), std::string::npos) << r.error().message;

  DomainXmlInfo one_cell = BootDomain("memmap=16M$0x1c000000");
  one_cell.numa_cells.pop_back();
  r = FindBootRangeRegion(one_cell, kNoQemu);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("two NUMA cells"), std::string::npos) << r.error().message;

  // Well-formed, but no QEMU runs this domain here.
  r = FindBootRangeRegion(BootDomain("memmap=16M$0x1c000000"), kNoQemu);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("no running QEMU"), std::string::npos) << r.error().message;
  EXPECT_NE(r.error().message.find("no-such-qemu-here-xyz"), std::string::npos);
  EXPECT_NE(r.error().message.find("no pid file"), std::string::npos) << r.error().message;
}

// The node-1 file comes from the command line of the QEMU libvirt recorded;
// the spec carries that QEMU's pid and user so the open checks them.
TEST(LibvirtBackend, BootRangeFromTheRecordedQemusNode1) {
  DomainQemu qemu;
  qemu.pid = 4242;
  qemu.uid = 64055;
  qemu.args = {
      "qemu-system-x86_64", "-name", "guest=d1,debug-threads=on", "-object",
      R"({"qom-type":"memory-backend-file","id":"ram-node1","mem-path":"/var/lib/libvirt/qemu/ram/1-d1/ram-node1","share":true,"size":67108864})"};
  Result<LibvirtRegionSpec> r =
      FindBootRangeRegion(BootDomain("memmap=16M$0x1c000000"), Result<DomainQemu>(qemu));
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->path, "/var/lib/libvirt/qemu/ram/1-d1/ram-node1");
  EXPECT_EQ(r->offset, 0u);
  EXPECT_EQ(r->size, 16u << 20);
  EXPECT_EQ(r->qemu_pid, 4242);
  EXPECT_EQ(r->owner_uid, 64055u);
}

class RegionFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/hvt-regionfile-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  void MakeFile(const std::string& name, uintmax_t size) {
    std::ofstream(dir_ / name).close();
    std::filesystem::resize_file(dir_ / name, size);
  }
  LibvirtRegionSpec Spec(const std::string& file) {
    LibvirtRegionSpec spec;
    spec.kind = "boot-range";
    spec.path = dir_ / file;
    spec.size = 4096;
    spec.owner_uid = ::geteuid();
    return spec;
  }
  std::filesystem::path dir_;
};

TEST_F(RegionFileTest, OpensQemusRegularFile) {
  MakeFile("ram-node1", 8192);
  Result<int> fd = OpenRegionFile("d1", Spec("ram-node1"));
  ASSERT_TRUE(fd.ok()) << fd.error().message;
  ::close(*fd);
}

// A FIFO where QEMU's file should be: refused at once, never waited on (the
// old open blocked a worker until someone wrote to it).
TEST_F(RegionFileTest, Malicious_FifoIsRefusedWithoutBlocking) {
  ASSERT_EQ(::mkfifo((dir_ / "ram-node1").c_str(), 0600), 0);
  const auto t0 = std::chrono::steady_clock::now();
  Result<int> fd = OpenRegionFile("d1", Spec("ram-node1"));
  ASSERT_FALSE(fd.ok());
  EXPECT_NE(fd.error().message.find("not a regular file"), std::string::npos) << fd.error().message;
  EXPECT_NE(fd.error().message.find("domain 'd1'"), std::string::npos);
  std::printf(
      "[ fifo ] refused in %.3f ms: %s\n",
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count(),
      fd.error().message.c_str());
}

TEST_F(RegionFileTest, Malicious_SymlinkAndStrangersFileAreRefused) {
  MakeFile("real", 8192);
  std::filesystem::create_symlink(dir_ / "real", dir_ / "ram-node1");
  Result<int> fd = OpenRegionFile("d1", Spec("ram-node1"));
  ASSERT_FALSE(fd.ok());
  EXPECT_NE(fd.error().message.find("cannot open"), std::string::npos) << fd.error().message;

  // A file of another user (not QEMU's, not root's).
  if (::geteuid() == 0) {
    ASSERT_EQ(::chown((dir_ / "real").c_str(), 65534, 65534), 0);
    LibvirtRegionSpec spec = Spec("real");
    spec.owner_uid = 64055;
    fd = OpenRegionFile("d1", spec);
    ASSERT_FALSE(fd.ok());
    EXPECT_NE(fd.error().message.find("belongs to uid 65534"), std::string::npos)
        << fd.error().message;
  }
  // Too short for the range.
  LibvirtRegionSpec spec = Spec("real");
  spec.owner_uid.reset();
  spec.size = 1 << 20;
  fd = OpenRegionFile("d1", spec);
  ASSERT_FALSE(fd.ok());
  EXPECT_NE(fd.error().message.find("less than"), std::string::npos) << fd.error().message;
}

// A file that is not the one QEMU maps (this process maps no such file).
TEST_F(RegionFileTest, Malicious_FileQemuDoesNotMapIsRefused) {
  MakeFile("ram-node1", 8192);
  LibvirtRegionSpec spec = Spec("ram-node1");
  spec.qemu_pid = ::getpid();
  Result<int> fd = OpenRegionFile("d1", spec);
  ASSERT_FALSE(fd.ok());
  EXPECT_NE(fd.error().message.find("is not the file QEMU pid"), std::string::npos)
      << fd.error().message;
  // Once "QEMU" (this process) maps it, it is the one.
  const int map_fd = ::open(spec.path.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(map_fd, 0);
  void* map = ::mmap(nullptr, 8192, PROT_READ, MAP_SHARED, map_fd, 0);
  ASSERT_NE(map, MAP_FAILED);
  fd = OpenRegionFile("d1", spec);
  EXPECT_TRUE(fd.ok()) << fd.error().message;
  if (fd.ok()) ::close(*fd);
  ::munmap(map, 8192);
  ::close(map_fd);
}

}  // namespace
}  // namespace hvtrace::hostd
