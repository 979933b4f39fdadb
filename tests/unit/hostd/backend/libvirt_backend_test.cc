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
#include <cstring>
#include <filesystem>
#include <fstream>

#include "hvtrace/boot_map.h"
#include "test_support.h"

namespace hvtrace::hostd {
namespace {

using nlohmann::json;
using test_support::Unzstd;

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

DomainQemu QemuWithNode1(const std::string& object_json) {
  DomainQemu qemu;
  qemu.pid = 4242;
  qemu.uid = 64055;
  qemu.args = {"qemu-system-x86_64", "-name", "guest=d1,debug-threads=on", "-object", object_json};
  return qemu;
}

TEST(LibvirtBackend, Malicious_BootRangeLookupRefusesWhatItCannotPlace) {
  // Without the cell there is no range, whatever <cmdline> says.
  DomainXmlInfo one_cell = BootDomain("memmap=16M$0x1c000000");
  one_cell.numa_cells.pop_back();
  Result<LibvirtRegionSpec> r = FindBootRangeRegion(one_cell, kNoQemu);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("memAccess='shared'"), std::string::npos) << r.error().message;

  // Well-formed, but no QEMU runs this domain here.
  r = FindBootRangeRegion(BootDomain(""), kNoQemu);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("no running QEMU"), std::string::npos) << r.error().message;
  EXPECT_NE(r.error().message.find("no-such-qemu-here-xyz"), std::string::npos);
  EXPECT_NE(r.error().message.find("no pid file"), std::string::npos) << r.error().message;

  // QEMU's node 1 that is not shared, too small, or has no path: refused.
  for (
      const char* object :
      {R"({"qom-type":"memory-backend-file","id":"ram-node1","mem-path":"/r/ram-node1","share":false,"size":67108864})",
       R"({"qom-type":"memory-backend-file","id":"ram-node1","mem-path":"/r/ram-node1","share":true,"size":1048576})",
       R"({"qom-type":"memory-backend-file","id":"ram-node1","share":true,"size":67108864})"}) {
    r = FindBootRangeRegion(BootDomain(""), Result<DomainQemu>(QemuWithNode1(object)));
    ASSERT_FALSE(r.ok()) << object;
    EXPECT_NE(r.error().message.find("cannot hold the range"), std::string::npos)
        << r.error().message;
  }
  r = FindBootRangeRegion(
      BootDomain(""),
      Result<DomainQemu>(QemuWithNode1(R"({"qom-type":"memory-backend-ram","id":"ram-node1"})")));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("no file-backed ram-node1"), std::string::npos);
}

// A disk-booted domain: no kernel parameters in <cmdline>. The range comes
// from the NUMA cell, the file from the command line of the QEMU libvirt
// recorded; the spec carries that QEMU's pid and user so the open checks
// them. A <cmdline> naming another range changes nothing.
TEST(LibvirtBackend, BootRangeFromTheCellAndTheRecordedQemusNode1) {
  const DomainQemu qemu = QemuWithNode1(
      R"({"qom-type":"memory-backend-file","id":"ram-node1","mem-path":"/var/lib/libvirt/qemu/ram/1-d1/ram-node1","share":true,"size":67108864})");
  for (const char* cmdline : {"", "console=ttyS0", "memmap=32M$0x10000000"}) {
    Result<LibvirtRegionSpec> r =
        FindBootRangeRegion(BootDomain(cmdline), Result<DomainQemu>(qemu));
    ASSERT_TRUE(r.ok()) << r.error().message;
    EXPECT_EQ(r->kind, "boot-range");
    EXPECT_EQ(r->path, "/var/lib/libvirt/qemu/ram/1-d1/ram-node1");
    EXPECT_EQ(r->offset, 0u);
    EXPECT_EQ(r->size, 16u << 20);
    EXPECT_EQ(r->gpa, 0x1c000000u);
    EXPECT_EQ(r->qemu_pid, 4242);
    EXPECT_EQ(r->owner_uid, 64055u);
  }
}

// What adopt says about the guest's side of the range: the probe copies the
// range and reads it with the boot_map reader.
class GuestMetaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/hvt-guestmeta-XXXXXX";
    const int fd = ::mkstemp(tmpl);
    ASSERT_GE(fd, 0);
    path_ = tmpl;
    fd_ = fd;
    cell_.layout.range_gpa = 0x1c000000;
    cell_.layout.range_bytes = 16u << 20;
    cell_.kernel_params = "memmap=16M$0x1c000000 trace_instance=boot_map@0x1c000000:16M";
    region_.kind = "boot-range";
    region_.path = path_;
    region_.size = 16u << 20;
    region_.gpa = 0x1c000000;
  }
  void TearDown() override {
    ::close(fd_);
    std::filesystem::remove(path_);
  }
  void Write(const std::vector<std::byte>& bytes, uint64_t file_size) {
    ASSERT_EQ(::ftruncate(fd_, static_cast<off_t>(file_size)), 0);
    ASSERT_EQ(::pwrite(fd_, bytes.data(), bytes.size(), 0), static_cast<ssize_t>(bytes.size()));
  }
  std::string path_;
  int fd_ = -1;
  DomainBootCell cell_;
  LibvirtRegionSpec region_;
};

TEST_F(GuestMetaTest, AFreshCellHasNoMetaAndTheReplySaysWhatTheGuestMustAdd) {
  Write({}, 64u << 20);  // Zeroes, as libvirt's new node-1 file.
  json facts = BootRangeFacts(cell_, region_, fd_, /*running=*/true);
  EXPECT_EQ(facts["gpa"], "0x1c000000");
  EXPECT_EQ(facts["size"], 16u << 20);
  EXPECT_EQ(facts["guest_meta"]["state"], "absent") << facts.dump(2);
  const std::string note = facts["note"];
  EXPECT_NE(note.find("guest has not written a persistent-buffer meta yet"), std::string::npos);
  EXPECT_NE(note.find("trace_instance=boot_map@0x1c000000:16M"), std::string::npos) << note;

  facts = BootRangeFacts(cell_, region_, -1, /*running=*/false);
  EXPECT_EQ(facts["guest_meta"]["state"], "not-running");
  EXPECT_TRUE(facts.contains("note"));
}

// A real 6.12 guest's range (tests/fixtures/boot_map: 16 MiB, 2 vCPUs).
TEST_F(GuestMetaTest, TheGuestsMetaIsFoundAndCounted) {
  const std::vector<std::byte> range =
      Unzstd(std::string(HVTRACE_FIXTURES_DIR) + "/boot_map/region.bin.zst");
  ASSERT_EQ(range.size(), 16u << 20);
  Write(range, 64u << 20);
  json facts = BootRangeFacts(cell_, region_, fd_, /*running=*/true);
  const json& meta = facts["guest_meta"];
  EXPECT_EQ(meta["state"], "present") << facts.dump(2);
  EXPECT_EQ(meta["cpus"], 2);
  EXPECT_EQ(meta["metas_valid"], 2u);
  EXPECT_GT(meta["events"].get<uint64_t>(), 0u);
  EXPECT_FALSE(facts.contains("note")) << facts.dump(2);
}

// Hostile or mismatched metas: reported, never fatal, never believed.
TEST_F(GuestMetaTest, Malicious_MetasThatDoNotFitTheCellsRangeAreReported) {
  // The guest's 16 MiB metas read as a 12 MiB range: no CPU count fits.
  const std::vector<std::byte> range =
      Unzstd(std::string(HVTRACE_FIXTURES_DIR) + "/boot_map/region.bin.zst");
  Write(range, 64u << 20);
  LibvirtRegionSpec small = region_;
  small.size = 12u << 20;
  json meta = ProbeGuestBootMeta(fd_, small);
  EXPECT_EQ(meta["state"], "mismatch") << meta.dump(2);
  EXPECT_NE(meta["message"].get<std::string>().find("12582912"), std::string::npos);

  // Only the magic, the rest garbage.
  std::vector<std::byte> garbage(16u << 20, std::byte{0x5a});
  const uint32_t magic = kBootMapMagic;
  std::memcpy(garbage.data(), &magic, 4);
  Write(garbage, 64u << 20);
  meta = ProbeGuestBootMeta(fd_, region_);
  EXPECT_NE(meta["state"], "present") << meta.dump(2);

  // A file shorter than the range (truncated under us): unreadable, said so.
  ASSERT_EQ(::ftruncate(fd_, 4096), 0);
  meta = ProbeGuestBootMeta(fd_, region_);
  EXPECT_EQ(meta["state"], "unreadable") << meta.dump(2);
  EXPECT_NE(meta["message"].get<std::string>().find(path_), std::string::npos);

  // A cell too large to copy at adopt time is not read at all.
  LibvirtRegionSpec huge = region_;
  huge.size = 1ull << 40;
  meta = ProbeGuestBootMeta(fd_, huge);
  EXPECT_EQ(meta["state"], "unreadable");
}

// OpenRegionFile is region_file_open.h's checked open with the domain's
// facts (its checks are tested in tests/unit/hostd/base/).
TEST(LibvirtRegionFileTest, OpensTheDomainsFileAndNamesTheDomainOtherwise) {
  test_support::TempDir tmp("hvt-regionfile");
  const std::filesystem::path& dir = tmp.path();
  std::ofstream(dir / "ram-node1").close();
  std::filesystem::resize_file(dir / "ram-node1", 8192);
  LibvirtRegionSpec spec;
  spec.kind = "boot-range";
  spec.path = dir / "ram-node1";
  spec.size = 4096;
  spec.owner_uid = ::geteuid();
  Result<int> fd = OpenRegionFile("d1", spec);
  ASSERT_TRUE(fd.ok()) << fd.error().message;
  ::close(*fd);
  spec.qemu_pid = ::getpid();  // This process maps no such file.
  fd = OpenRegionFile("d1", spec);
  ASSERT_FALSE(fd.ok());
  EXPECT_NE(fd.error().message.find("domain 'd1': region"), std::string::npos)
      << fd.error().message;
}

}  // namespace
}  // namespace hvtrace::hostd
