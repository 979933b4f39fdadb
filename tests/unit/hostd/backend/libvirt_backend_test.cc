// The parts of the libvirt backend that need no daemon: kernel size parsing
// and the boot-range lookup's refusals.
#include "libvirt_backend.h"

#include <gtest/gtest.h>

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

DomainXmlInfo BootDomain(const std::string& cmdline) {
  DomainXmlInfo info;
  info.name = "no-such-qemu-here-xyz";
  info.cmdline = cmdline;
  info.numa_cells = {{0, 448ull << 20, ""}, {1, 64ull << 20, "shared"}};
  return info;
}

TEST(LibvirtBackend, Malicious_BootRangeLookupRefusesWhatItCannotPlace) {
  Result<LibvirtRegionSpec> r = FindBootRangeRegion(BootDomain("console=ttyS0"));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("no memmap="), std::string::npos) << r.error().message;

  r = FindBootRangeRegion(BootDomain("memmap=16M$zz"));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("cannot parse"), std::string::npos) << r.error().message;

  // The range below node 1 (in node 0): refused.
  r = FindBootRangeRegion(BootDomain("memmap=16M$0x1000000"));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("not in NUMA node 1"), std::string::npos) << r.error().message;

  DomainXmlInfo one_cell = BootDomain("memmap=16M$0x1c000000");
  one_cell.numa_cells.pop_back();
  r = FindBootRangeRegion(one_cell);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("two NUMA cells"), std::string::npos) << r.error().message;

  // Well-formed, but no QEMU runs this domain here.
  r = FindBootRangeRegion(BootDomain("memmap=16M$0x1c000000"));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("no running QEMU"), std::string::npos) << r.error().message;
  EXPECT_NE(r.error().message.find("no-such-qemu-here-xyz"), std::string::npos);
}

}  // namespace
}  // namespace hvtrace::hostd
