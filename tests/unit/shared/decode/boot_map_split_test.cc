// The 6.15+ persistent-buffer layout (global meta, scratch area, per-CPU
// metas without magic). The pages are the real 6.12 fixture's, laid out the
// way the 6.15+ allocator lays them (RelayoutAs615), so the reader must give
// back exactly the records the 6.12 reader gives; the real 7.3 range is
// tested in boot_map_linux73_test.cc.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "hvtrace/boot_map.h"
#include "hvtrace/page.h"
#include "test_support.h"

namespace hvtrace {
namespace {

using test_support::ReadText;
using test_support::Unzstd;

const std::string kDir = std::string(HVTRACE_FIXTURES_DIR) + "/boot_map/";
constexpr uint64_t kGlobal = 24;
constexpr uint64_t kVa = 0xffff888100000000ull;

PageLayout FixtureLayout() {
  auto layout = PageLayout::FromHeaderPage(ReadText(kDir + "header_page"), 4096);
  EXPECT_TRUE(layout.ok());
  return layout.ok() ? *layout : PageLayout{};
}

uint64_t AlignUp(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

void Put32(std::vector<std::byte>& r, uint64_t off, uint32_t v) { std::memcpy(&r[off], &v, 4); }
void Put64(std::vector<std::byte>& r, uint64_t off, uint64_t v) { std::memcpy(&r[off], &v, 8); }
uint64_t Get64(const std::vector<std::byte>& r, uint64_t off) {
  uint64_t v;
  std::memcpy(&v, &r[off], 8);
  return v;
}

// Where the 6.15+ allocator puts things for |cpus| CPUs with per-CPU metas of
// |meta| bytes (ring_buffer.c rb_range_meta()).
struct Split {
  uint64_t meta = 32, buffers_offset = 0, total = 0;
  uint32_t nr = 0;
  uint64_t MetaOffset(int c) const {
    const uint64_t end0 = AlignUp(buffers_offset + meta + 4 * uint64_t{nr}, 4096) + nr * 4096ull;
    return c == 0 ? buffers_offset
                  : end0 + (c - 1) * (AlignUp(meta + 4 * uint64_t{nr}, 4096) + nr * 4096ull);
  }
  uint64_t Subbufs(int c) const { return AlignUp(MetaOffset(c) + meta + 4 * uint64_t{nr}, 4096); }
};

// The real 6.12 fixture (2 CPUs, 2045 sub-buffers each) in the 6.15+ layout:
// a global meta, a scratch area of 128 module entries with |scratch_header|
// bytes before them, and each CPU's meta, buffers[] and pages copied over.
// The total size is the smallest whole number of pages whose allocator
// prediction is again 2045 sub-buffers per CPU.
struct Relayout {
  std::vector<std::byte> range;
  Split split;
};
Relayout RelayoutAs615(uint64_t meta_size = 32, uint64_t scratch_header = 24, uint64_t fields = 0) {
  const std::vector<std::byte> old = Unzstd(kDir + "region.bin.zst");
  constexpr uint32_t kNr = 2045;
  Relayout out;
  Split& s = out.split;
  s.meta = meta_size;
  const uint64_t scratch = AlignUp(scratch_header + 128 * 64, 8);
  s.buffers_offset = kGlobal + scratch;
  s.nr = kNr;
  for (s.total = 16u << 20;; s.total += 4096) {
    const uint64_t start = AlignUp(meta_size, 8) + scratch;
    uint64_t nr = ((s.total - start) / 2 - meta_size) / 4100;
    for (;; --nr) {
      uint64_t ptr = start;
      for (int c = 0; c < 2; ++c) ptr = AlignUp(ptr + meta_size + 4 * nr, 4096) + nr * 4096;
      if (ptr <= s.total) break;
    }
    if (nr == kNr) break;
  }
  std::vector<std::byte>& r = out.range;
  r.assign(s.total, std::byte{0});
  Put32(r, 0, kBootMapMagic);
  Put32(r, 4, static_cast<uint32_t>(meta_size) | (24u << 16));
  Put64(r, 8, s.total);
  Put64(r, 16, s.buffers_offset);
  for (int c = 0; c < 2; ++c) {
    const uint64_t old_chunk = c * 0x800000ull, old_first = Get64(old, old_chunk + 24);
    const uint64_t m = s.MetaOffset(c), first = kVa + s.Subbufs(c);
    Put64(r, m + fields, first);
    Put64(r, m + fields + 8, Get64(old, old_chunk + 32) - old_first + first);
    Put64(r, m + fields + 16, Get64(old, old_chunk + 40) - old_first + first);
    Put32(r, m + fields + 24, 4096);
    Put32(r, m + fields + 28, kNr);
    std::memcpy(&r[m + meta_size], &old[old_chunk + 56], 4 * kNr);
    std::memcpy(&r[s.Subbufs(c)], &old[old_chunk + 0x3000], 4096ull * kNr);
  }
  return out;
}

// The scratch area of a 6.16+ kernel: clock_id, _text, modules.
void WriteScratch(std::vector<std::byte>& r, uint64_t text,
                  const std::vector<std::pair<uint64_t, std::string>>& mods) {
  Put32(r, kGlobal, 0);  // clock_id: "local".
  Put64(r, kGlobal + 8, text);
  Put64(r, kGlobal + 16, mods.size());
  for (size_t i = 0; i < mods.size(); ++i) {
    const uint64_t e = kGlobal + 24 + 64 * i;
    Put64(r, e, mods[i].first);
    std::memcpy(&r[e + 8], mods[i].second.data(), mods[i].second.size());
  }
}

std::vector<std::vector<std::byte>> Payloads(const BootMap& map) {
  std::vector<std::vector<std::byte>> out;
  for (const BootMapCpu& c : map.cpu) {
    for (const BootMapRecord& rec : c.records)
      out.emplace_back(rec.payload.begin(), rec.payload.end());
  }
  return out;
}

bool HasCheck(const BootMap& map, int cpu, BootMapCheck check) {
  for (const BootMapIssue& i : map.issues) {
    if (i.cpu == cpu && i.check == check) return true;
  }
  return false;
}

class BootMapSplitTest : public ::testing::Test {
 protected:
  void SetUp() override {
    options_.layout = FixtureLayout();
    const std::vector<std::byte> range = Unzstd(kDir + "region.bin.zst");
    auto old = ReadBootMap(range, options_);
    ASSERT_TRUE(old.ok()) << old.error().message;
    expected_ = Payloads(*old);
    ASSERT_GT(expected_.size(), 1000u);
  }
  BootMapOptions options_;
  std::vector<std::vector<std::byte>> expected_;
};

TEST_F(BootMapSplitTest, RealPagesInThe615LayoutGiveTheSameRecords) {
  Relayout rl = RelayoutAs615();
  WriteScratch(rl.range, 0xffffffff9a000000ull,
               {{0xffffffffc0746000ull, "pvpanic_pci"}, {0xffffffffc073a000ull, "pvpanic"}});
  for (int cpus : {0, 2}) {
    SCOPED_TRACE(cpus);
    options_.cpus = cpus;
    auto map = ReadBootMap(rl.range, options_);
    ASSERT_TRUE(map.ok()) << map.error().message;
    EXPECT_EQ(map->layout, "linux-6.15");
    EXPECT_EQ(map->cpus, 2);
    EXPECT_EQ(map->nr_subbufs, 2045u);
    EXPECT_EQ(map->struct_sizes, 0x180020u);
    EXPECT_EQ(map->total_size, rl.split.total);
    EXPECT_EQ(map->buffers_offset, rl.split.buffers_offset);
    EXPECT_EQ(map->geometry_from, "range_size");
    EXPECT_EQ(map->cpu[1].offset, rl.split.MetaOffset(1));
    EXPECT_EQ(Payloads(*map), expected_);
    for (const BootMapIssue& i : map->issues) {
      EXPECT_EQ(i.check, BootMapCheck::kTimeWentBackwards) << i.message;
    }
    const BootMapScratch& s = map->scratch;
    EXPECT_EQ(s.layout, "clock_id");
    EXPECT_EQ(s.text_addr, 0xffffffff9a000000ull);
    ASSERT_EQ(s.modules.size(), 2u);
    EXPECT_EQ(s.modules[0].name, "pvpanic_pci");
    EXPECT_EQ(s.modules[1].addr, 0xffffffffc073a000ull);
  }
}

TEST_F(BootMapSplitTest, The615ScratchWithoutClockAndThe40ByteCpuMetaAreRead) {
  Relayout rl = RelayoutAs615(40, 16, 8);           // kaslr_addr (0) first.
  Put64(rl.range, kGlobal, 0xffffffff81000000ull);  // text_addr first (6.15).
  Put64(rl.range, kGlobal + 8, 1);
  Put64(rl.range, kGlobal + 16, 0xffffffffc0001000ull);
  std::memcpy(&rl.range[kGlobal + 24], "virtio_blk", 10);
  auto map = ReadBootMap(rl.range, options_);
  ASSERT_TRUE(map.ok()) << map.error().message;
  EXPECT_EQ(map->layout, "linux-6.15-kaslr");
  EXPECT_EQ(map->cpus, 2);
  EXPECT_EQ(Payloads(*map), expected_);
  EXPECT_EQ(map->scratch.layout, "text_addr");
  ASSERT_EQ(map->scratch.modules.size(), 1u);
  EXPECT_EQ(map->scratch.modules[0].name, "virtio_blk");
}

TEST_F(BootMapSplitTest, The40ByteCpuMetaWithNrInvalidIsRead) {
  Relayout rl = RelayoutAs615(40, 24, 0);
  Put32(rl.range, rl.split.MetaOffset(1) + 32, 3);  // nr_invalid of CPU 1.
  auto map = ReadBootMap(rl.range, options_);
  ASSERT_TRUE(map.ok()) << map.error().message;
  EXPECT_EQ(map->layout, "linux-6.15-nr-invalid");
  EXPECT_EQ(Payloads(*map), expected_);
  EXPECT_EQ(map->cpu[0].nr_invalid, 0u);
  EXPECT_EQ(map->cpu[1].nr_invalid, 3u);
}

TEST_F(BootMapSplitTest, ACopyLargerThanTotalSizeIsReadAsTotalSizeLong) {
  Relayout rl = RelayoutAs615();
  rl.range.resize(rl.range.size() + (3u << 20), std::byte{0x5a});
  auto map = ReadBootMap(rl.range, options_);
  ASSERT_TRUE(map.ok()) << map.error().message;
  EXPECT_EQ(map->geometry_from, "meta");
  EXPECT_EQ(map->range_size, rl.split.total);
  EXPECT_EQ(map->cpus, 2);
  EXPECT_EQ(Payloads(*map), expected_);
  EXPECT_TRUE(HasCheck(*map, -1, BootMapCheck::kTotalSize));
}

TEST_F(BootMapSplitTest, Malicious_TotalSizeLiesAndTheCopyDecidesTheEnd) {
  Relayout rl = RelayoutAs615();
  for (uint64_t lie : {uint64_t{0}, uint64_t{1} << 40, rl.split.total + 4096}) {
    SCOPED_TRACE(lie);
    Put64(rl.range, 8, lie);
    auto map = ReadBootMap(rl.range, options_);
    ASSERT_TRUE(map.ok()) << map.error().message;
    EXPECT_EQ(map->range_size, rl.split.total);
    EXPECT_EQ(Payloads(*map), expected_);
    EXPECT_TRUE(HasCheck(*map, -1, BootMapCheck::kTotalSize));
  }
}

TEST_F(BootMapSplitTest, Malicious_BuffersOffsetOutsideTheRangeIsRefusedByName) {
  Relayout rl = RelayoutAs615();
  for (uint64_t bad : {uint64_t{0}, uint64_t{23}, uint64_t{8243}, uint64_t{1} << 62}) {
    SCOPED_TRACE(bad);
    Put64(rl.range, 16, bad);
    auto map = ReadBootMap(rl.range, options_);
    ASSERT_FALSE(map.ok());
    EXPECT_NE(map.error().message.find("buffers_offset"), std::string::npos) << map.error().message;
  }
}

TEST_F(BootMapSplitTest, Malicious_BrokenCpu0MetaStillFindsCpu1) {
  Relayout rl = RelayoutAs615();
  Put32(rl.range, rl.split.buffers_offset + 28, 7);  // CPU 0's nr_subbufs.
  Put64(rl.range, rl.split.buffers_offset, 12345);   // first_buffer not a page.
  auto map = ReadBootMap(rl.range, options_);
  ASSERT_TRUE(map.ok()) << map.error().message;
  EXPECT_EQ(map->cpus, 2);
  EXPECT_TRUE(HasCheck(*map, 0, BootMapCheck::kNrSubbufs));
  EXPECT_TRUE(HasCheck(*map, 0, BootMapCheck::kFirstBuffer));
  EXPECT_TRUE(map->cpu[0].records.empty());
  EXPECT_GT(map->cpu[1].records.size(), 100u);
}

TEST_F(BootMapSplitTest, Malicious_OneCorruptSubBufferKeepsTheRestOfItsCpu) {
  Relayout rl = RelayoutAs615();
  auto clean = ReadBootMap(rl.range, options_);
  ASSERT_TRUE(clean.ok());
  // A page in the middle of CPU 1's read order: its second record's header
  // becomes a length that runs off the page.
  const BootMapCpu& c1 = clean->cpu[1];
  size_t victim = c1.pages.size() / 2;
  while (victim < c1.pages.size() && c1.pages[victim].records < 4) ++victim;
  ASSERT_LT(victim, c1.pages.size());
  const uint64_t page_off = c1.pages[victim].offset;
  const uint32_t page_records = c1.pages[victim].records;
  const size_t cpu1_records = c1.records.size();
  const size_t cpu0_records = clean->cpu[0].records.size();
  PageCursor cursor(std::span<const std::byte>(&rl.range[page_off], 4096), options_.layout);
  RawRecord rec;
  ASSERT_TRUE(cursor.Next(&rec));
  ASSERT_TRUE(cursor.Next(&rec));
  Put32(rl.range, page_off + rec.offset, 0);  // type_len 0: the length follows.
  Put32(rl.range, page_off + rec.offset + 4, 60000);
  auto map = ReadBootMap(rl.range, options_);
  ASSERT_TRUE(map.ok()) << map.error().message;
  EXPECT_TRUE(HasCheck(*map, 1, BootMapCheck::kBadPage));
  EXPECT_EQ(map->cpu[1].pages[victim].records, 1u) << "the record before the bad one is kept";
  EXPECT_EQ(map->cpu[1].records.size(), cpu1_records - (page_records - 1));
  EXPECT_EQ(map->cpu[1].stats.rejected_total(), 1u);
  EXPECT_EQ(map->cpu[0].records.size(), cpu0_records);
}

TEST(BootMapScratchTest, Malicious_EntriesAreCheckedOneByOne) {
  Relayout rl = RelayoutAs615();
  WriteScratch(rl.range, 0xffffffff9a000000ull,
               {{0xffffffffc0746000ull, "good_one"},
                {0x1000, "low_address"},
                {0xffffffffc0001000ull, std::string(56, 'x')},  // No NUL.
                {0xffffffffc0002000ull, "bad/name"},
                {0xffffffffc0003000ull, "last_good"}});
  BootMapOptions options;
  auto map = ReadBootMap(rl.range, options);
  ASSERT_TRUE(map.ok()) << map.error().message;
  const BootMapScratch& s = map->scratch;
  ASSERT_EQ(s.modules.size(), 2u);
  EXPECT_EQ(s.modules[0].name, "good_one");
  EXPECT_EQ(s.modules[1].name, "last_good");
  EXPECT_EQ(s.bad_entries, 3u);
  EXPECT_TRUE(HasCheck(*map, -1, BootMapCheck::kScratch));
  // nr_entries beyond the area: read up to its end, reported.
  Put64(rl.range, kGlobal + 16, uint64_t{1} << 60);
  map = ReadBootMap(rl.range, options);
  ASSERT_TRUE(map.ok());
  EXPECT_EQ(map->scratch.modules.size(), 2u);
  EXPECT_NE(map->scratch.problems.front().find("more than the 128"), std::string::npos)
      << map->scratch.problems.front();
}

TEST(BootMapScratchTest, AnUnwrittenScratchAreaIsNotAnError) {
  Relayout rl = RelayoutAs615();
  auto map = ReadBootMap(rl.range, BootMapOptions{});
  ASSERT_TRUE(map.ok()) << map.error().message;
  EXPECT_EQ(map->scratch.layout, "");
  EXPECT_EQ(map->scratch.text_addr, 0u);
  EXPECT_TRUE(map->scratch.modules.empty());
  EXPECT_GT(map->total_records(), 1000u);
}

}  // namespace
}  // namespace hvtrace
