#include "guest_ram.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

namespace hvtrace::hostd {
namespace {

// QEMU 7.2's answer for `-m 512M` split into a RAM node and a file node
// (the boot range's layout), cut after the I/O view began.
constexpr const char* kMtree = R"(FlatView #0
 AS "cpu-smm-0", root: memory
 Root memory region: memory
  0000000000000000-00000000000bffff (prio 0, ram): hvt_node0
  0000000000100000-000000001bffffff (prio 0, ram): hvt_node0 @0000000000100000
  0000000000200000-0000000000ffffff (prio 0, ram): smram-only
  00000000fffc0000-00000000ffffffff (prio 0, rom): pc.bios

FlatView #1
 AS "memory", root: system
 AS "cpu-memory-0", root: system
 Root memory region: system
  0000000000000000-00000000000bffff (prio 0, ram): hvt_node0
  00000000000c0000-00000000000dffff (prio 1, rom): pc.rom
  00000000000e0000-00000000000fffff (prio 0, rom): pc.bios @0000000000020000
  0000000000100000-000000001bffffff (prio 0, ram): hvt_node0 @0000000000100000
  000000001c000000-000000001fffffff (prio 0, ram): hvt_node1
  00000000fec00000-00000000fec00fff (prio 0, i/o): ioapic
  00000000fffc0000-00000000ffffffff (prio 0, rom): pc.bios

FlatView #2
 AS "I/O", root: io
 Root memory region: io
  0000000000000000-0000000000000007 (prio 0, i/o): dma-chan
)";

TEST(GuestRamTest, TheMemorySpacesRamRangesOfAMegabyteOrMore) {
  auto ranges = ParseRamFlatView(kMtree);
  ASSERT_TRUE(ranges.ok()) << ranges.error().message;
  ASSERT_EQ(ranges->size(), 2u);
  EXPECT_EQ((*ranges)[0].gpa, 0x100000u);
  EXPECT_EQ((*ranges)[0].bytes, 0x1bf00000u);
  EXPECT_EQ((*ranges)[1].gpa, 0x1c000000u);
  EXPECT_EQ((*ranges)[1].bytes, 0x4000000u);
}

// Debian 13's QEMU 10.0 (q35, the same nodes): the "memory" view comes
// first, views with no rendering sit among the others; the SMM view's RAM is
// not counted again.
TEST(GuestRamTest, Qemu10ListsTheMemoryViewFirst) {
  const std::string text =
      "FlatView #0\n"
      " AS \"memory\", root: system\n"
      " AS \"cpu-memory-0\", root: system\n"
      " Root memory region: system\n"
      "  0000000000000000-00000000000bffff (prio 0, ram): hvt_node0\n"
      "  00000000000c0000-00000000000dffff (prio 1, rom): pc.rom\n"
      "  0000000000100000-000000001bffffff (prio 0, ram): hvt_node0 @0000000000100000\n"
      "  000000001c000000-000000001fffffff (prio 0, ram): hvt_node1\n"
      "  00000000fee00000-00000000feefffff (prio 4096, i/o): apic-msi\n"
      "\n"
      "FlatView #1\n"
      " AS \"cpu-smm-0\", root: memory\n"
      " Root memory region: memory\n"
      "  0000000000100000-000000001bffffff (prio 0, ram): hvt_node0 @0000000000100000\n"
      "\n"
      "FlatView #2\n"
      " AS \"mch\", root: bus master container\n"
      " Root memory region: (none)\n"
      "  No rendered FlatView\n";
  auto ranges = ParseRamFlatView(text);
  ASSERT_TRUE(ranges.ok()) << ranges.error().message;
  ASSERT_EQ(ranges->size(), 2u);
  EXPECT_EQ((*ranges)[0].gpa, 0x100000u);
  EXPECT_EQ((*ranges)[1].gpa, 0x1c000000u);
}

TEST(GuestRamTest, AnswersWithoutTheMemorySpaceOrRamAreErrors) {
  EXPECT_FALSE(ParseRamFlatView("").ok());
  EXPECT_FALSE(ParseRamFlatView("FlatView #0\n AS \"I/O\", root: io\n"
                                "  0000-0007 (prio 0, i/o): dma\n")
                   .ok());
  EXPECT_FALSE(ParseRamFlatView("FlatView #0\n AS \"memory\", root: system\n"
                                "  0000000000000000-00000000000bffff (prio 0, ram): small\n")
                   .ok());
}

TEST(GuestRamTest, Malicious_GarbledRangeLinesAreSkipped) {
  const std::string text =
      "FlatView #0\n AS \"memory\", root: system\n"
      "  zz-00000000ffffffff (prio 0, ram): a\n"
      "  0000000100000000-00000000000fffff (prio 0, ram): backwards\n"
      "  0000000000100000-000000000fffffff (prio 0, ramd): romd\n"
      "  0000000000100000-000000000fffffff (prio 0, ram\n"
      "  0000000010000000-000000001fffffff (prio 0, ram): good\n";
  auto ranges = ParseRamFlatView(text);
  ASSERT_TRUE(ranges.ok()) << ranges.error().message;
  ASSERT_EQ(ranges->size(), 1u);
  EXPECT_EQ((*ranges)[0].gpa, 0x10000000u);
}

TEST(GuestRamTest, Gpa2HvaAnswers) {
  auto hva = ParseGpa2Hva("Host virtual address for 0x1c000000 (hvt_node1) is 0x7f6577dff000\r\n");
  ASSERT_TRUE(hva.ok()) << hva.error().message;
  EXPECT_EQ(*hva, 0x7f6577dff000u);
  EXPECT_FALSE(ParseGpa2Hva("No memory is mapped at address 0x20000000\r\n").ok());
  EXPECT_FALSE(ParseGpa2Hva("Host virtual address for 0x0 (x) is 0x\r\n").ok());
}

// The reads are process_vm_readv on a real process: this one, whose buffer
// stands at "guest-physical" 1 MiB.
TEST(GuestRamTest, ReadsOnlyInsideItsRanges) {
  std::vector<unsigned char> memory(1 << 16);
  for (size_t i = 0; i < memory.size(); ++i) memory[i] = static_cast<unsigned char>(i * 7);
  GuestRam ram(::getpid(), {{0x100000, memory.size(), reinterpret_cast<uint64_t>(memory.data())}});
  std::vector<std::byte> out(16);
  ASSERT_TRUE(ram.Read(0x100000 + 100, out).ok());
  EXPECT_EQ(std::memcmp(out.data(), memory.data() + 100, out.size()), 0);
  EXPECT_FALSE(ram.Read(0x100000 - 1, out).ok());
  EXPECT_FALSE(ram.Read(0x100000 + memory.size() - 8, out).ok());
  EXPECT_FALSE(ram.Read(~0ull - 4, out).ok());
}

TEST(GuestRamTest, ReadEachStopsAtTheFirstReadOutsideRam) {
  std::vector<unsigned char> memory(1 << 16);
  for (size_t i = 0; i < memory.size(); ++i) memory[i] = static_cast<unsigned char>(i);
  GuestRam ram(::getpid(), {{0x100000, memory.size(), reinterpret_cast<uint64_t>(memory.data())}});
  const std::vector<uint64_t> at = {0x100000, 0x100010, 0x100020, 0x200000, 0x100000};
  std::vector<std::byte> out(4 * at.size());
  ASSERT_EQ(ram.ReadEach(at, 4, out), 3u);
  EXPECT_EQ(static_cast<unsigned char>(out[4]), 0x10);
  EXPECT_EQ(static_cast<unsigned char>(out[8]), 0x20);
  // More reads than one system call takes.
  std::vector<uint64_t> many(3000, 0x100008);
  std::vector<std::byte> big(8 * many.size());
  EXPECT_EQ(ram.ReadEach(many, 8, big), many.size());
  EXPECT_EQ(static_cast<unsigned char>(big[8 * 2999]), 8);
}

}  // namespace
}  // namespace hvtrace::hostd
