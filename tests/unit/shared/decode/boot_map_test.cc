#include "hvtrace/boot_map.h"

#include <gtest/gtest.h>
#include <zstd.h>

#include <cstring>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "boot_map_fixture.h"
#include "hvtrace/page.h"
#include "test_support.h"

namespace hvtrace {
namespace {

using test_support::ReadText;
using test_support::Unzstd;

const std::string kDir = std::string(HVTRACE_FIXTURES_DIR) + "/boot_map/";

PageLayout FixtureLayout() {
  auto layout = PageLayout::FromHeaderPage(ReadText(kDir + "header_page"), 4096);
  EXPECT_TRUE(layout.ok());
  return layout.ok() ? *layout : PageLayout{};
}

using boot_map_fixture::TraceLine;
using boot_map_fixture::Usecs;

std::vector<TraceLine> GuestTrace(const std::string& file = kDir + "trace.txt.zst") {
  return boot_map_fixture::GuestTrace(file);
}

// The print event's id and buf offset, from its format file.
struct PrintFormat {
  uint16_t id = 0;
  uint32_t buf_offset = 0;
};
PrintFormat ReadPrintFormat(const std::string& dir = kDir) {
  const std::string text = ReadText(dir + "formats/ftrace/print/format");
  std::smatch m;
  PrintFormat f;
  if (std::regex_search(text, m, std::regex(R"(ID: (\d+))"))) f.id = std::stoi(m[1]);
  if (std::regex_search(text, m, std::regex(R"(char buf\[\];\s*offset:(\d+))"))) {
    f.buf_offset = std::stoi(m[1]);
  }
  return f;
}

uint16_t Type(const BootMapRecord& r) {
  uint16_t type = 0;
  if (r.payload.size() >= 2) std::memcpy(&type, r.payload.data(), 2);
  return type;
}

std::string PrintText(const BootMapRecord& r, const PrintFormat& f) {
  if (r.payload.size() <= f.buf_offset) return {};
  const char* p = reinterpret_cast<const char*>(r.payload.data()) + f.buf_offset;
  std::string s(p, strnlen(p, r.payload.size() - f.buf_offset));
  while (!s.empty() && s.back() == '\n') s.pop_back();
  return s;
}

class BootMapTest : public ::testing::Test {
 protected:
  void SetUp() override {
    range_ = Unzstd(kDir + "region.bin.zst");
    ASSERT_EQ(range_.size(), 16u << 20);
    options_.layout = FixtureLayout();
  }

  // Offsets in the fixture (2 CPUs, 16 MiB: 8 MiB chunks, pages at +0x3000).
  static constexpr uint64_t kCpu1 = 0x800000;
  static constexpr uint64_t kBuffers = 56;
  static constexpr uint64_t kHead = 32;
  static constexpr uint64_t kCommit = 40;
  uint64_t PageOffset(uint64_t chunk, int32_t slot) const {
    return chunk + 0x3000 + 4096ull * slot;
  }
  int32_t Buffer(uint64_t chunk, int i) const {
    int32_t v;
    std::memcpy(&v, range_.data() + chunk + kBuffers + 4 * i, 4);
    return v;
  }
  void Put32(uint64_t off, uint32_t v) { std::memcpy(range_.data() + off, &v, 4); }
  void Put64(uint64_t off, uint64_t v) { std::memcpy(range_.data() + off, &v, 8); }
  uint64_t Get64(uint64_t off) const {
    uint64_t v;
    std::memcpy(&v, range_.data() + off, 8);
    return v;
  }
  Result<BootMap> Read() { return ReadBootMap(range_, options_); }

  static bool HasIssue(const BootMap& map, int cpu, BootMapCheck check) {
    for (const BootMapIssue& i : map.issues) {
      if (i.cpu == cpu && i.check == check) return true;
    }
    return false;
  }

  std::vector<std::byte> range_;
  BootMapOptions options_;
};

TEST_F(BootMapTest, RealFixtureMatchesTheGuestsTraceFile) {
  auto map = Read();
  ASSERT_TRUE(map.ok()) << map.error().message;
  EXPECT_EQ(map->layout, "linux-6.12");
  EXPECT_EQ(map->cpus, 2);
  EXPECT_TRUE(map->cpus_derived);
  EXPECT_EQ(map->nr_subbufs, 2045u);
  EXPECT_EQ(map->chunk_stride, 0x800000u);
  EXPECT_EQ(map->boots, 1u);
  // The only finding on a healthy buffer: early boot's clock steps back when
  // sched_clock switches to the TSC (the guest kernel logged "Ring buffer
  // clock went backwards"); those pages are kept, as the guest shows them.
  for (const BootMapIssue& issue : map->issues) {
    EXPECT_EQ(issue.check, BootMapCheck::kTimeWentBackwards) << issue.message;
  }

  // Per CPU, the guest's lines in time order must be our records in read
  // order: same count, same time stamps in microseconds.
  const std::vector<TraceLine> lines = GuestTrace();
  ASSERT_GT(lines.size(), 1000u);
  std::map<int, std::vector<uint64_t>> want;
  for (const TraceLine& l : lines) want[l.cpu].push_back(l.usecs);
  ASSERT_EQ(want.size(), 2u);
  for (const BootMapCpu& cpu : map->cpu) {
    SCOPED_TRACE("cpu " + std::to_string(cpu.cpu));
    EXPECT_TRUE(cpu.meta_valid);
    EXPECT_EQ(cpu.stats.rejected_total(), 0u);
    std::vector<uint64_t> got;
    for (const BootMapRecord& r : cpu.records) got.push_back(Usecs(r.timestamp));
    EXPECT_EQ(got.size(), want[cpu.cpu].size());
    EXPECT_EQ(got, want[cpu.cpu]);
  }

  // Every marker the guest showed, with its CPU, time and text.
  const PrintFormat print = ReadPrintFormat();
  ASSERT_NE(print.id, 0);
  std::multiset<std::tuple<int, uint64_t, std::string>> want_markers, got_markers;
  for (const TraceLine& l : lines) {
    static const std::string kPrefix = "tracing_mark_write: ";
    if (l.event.rfind(kPrefix, 0) == 0) {
      want_markers.insert({l.cpu, l.usecs, l.event.substr(kPrefix.size())});
    }
  }
  EXPECT_EQ(want_markers.size(), 10u);
  for (const BootMapCpu& cpu : map->cpu) {
    for (const BootMapRecord& r : cpu.records) {
      if (Type(r) == print.id)
        got_markers.insert({cpu.cpu, Usecs(r.timestamp), PrintText(r, print)});
    }
  }
  EXPECT_EQ(got_markers, want_markers);
}

TEST_F(BootMapTest, GivenCpuCountGivesTheSameResult) {
  options_.cpus = 2;
  auto map = Read();
  ASSERT_TRUE(map.ok()) << map.error().message;
  EXPECT_FALSE(map->cpus_derived);
  EXPECT_EQ(map->total_records(), GuestTrace().size());
}

TEST_F(BootMapTest, PagesAreReaderThenHeadToCommit) {
  auto map = Read();
  ASSERT_TRUE(map.ok());
  for (const BootMapCpu& cpu : map->cpu) {
    ASSERT_FALSE(cpu.pages.empty());
    EXPECT_EQ(cpu.pages.front().logical, 0u);
    EXPECT_EQ(static_cast<int64_t>(cpu.pages.front().physical), cpu.reader_slot);
    EXPECT_EQ(static_cast<int64_t>(cpu.pages[1].physical), cpu.head_slot);
    EXPECT_EQ(static_cast<int64_t>(cpu.pages.back().physical), cpu.commit_slot);
  }
}

TEST(BootMapGeometryTest, MatchesTheKernelsSplit) {
  uint32_t nr = 0;
  uint64_t stride = 0;
  ASSERT_TRUE(BootMapGeometry(16u << 20, 2, 4096, 56, &nr, &stride));
  EXPECT_EQ(nr, 2045u);
  EXPECT_EQ(stride, 8u << 20);
  // Three CPUs do not divide the range into page-aligned thirds.
  ASSERT_TRUE(BootMapGeometry(16u << 20, 3, 4096, 56, &nr, &stride));
  EXPECT_EQ(nr, 1363u);
  EXPECT_EQ(stride, 8192u + 1363u * 4096u);
  EXPECT_FALSE(BootMapGeometry(16384, 2, 4096, 56, &nr, &stride));
  EXPECT_FALSE(BootMapGeometry(16u << 20, 0, 4096, 56, &nr, &stride));
  EXPECT_FALSE(BootMapGeometry(16u << 20, 2, 3000, 56, &nr, &stride));
}

TEST_F(BootMapTest, Malicious_BadMagicOnOneCpu) {
  Put32(kCpu1, 0xdeadbeef);
  auto map = Read();
  ASSERT_TRUE(map.ok()) << map.error().message;
  EXPECT_EQ(map->cpus, 2);  // Still derived from CPU 0.
  EXPECT_TRUE(HasIssue(*map, 1, BootMapCheck::kMagic));
  EXPECT_FALSE(map->cpu[1].meta_found);
  EXPECT_TRUE(map->cpu[1].records.empty());
  EXPECT_TRUE(map->cpu[0].meta_valid);
  EXPECT_GT(map->cpu[0].records.size(), 1000u);
}

TEST_F(BootMapTest, Malicious_BadMagicOnCpu0StillFindsCpu1) {
  Put32(0, 0);
  auto map = Read();
  ASSERT_TRUE(map.ok()) << map.error().message;
  EXPECT_EQ(map->cpus, 2);
  EXPECT_TRUE(HasIssue(*map, 0, BootMapCheck::kMagic));
  EXPECT_GT(map->cpu[1].records.size(), 1000u);
}

TEST_F(BootMapTest, Malicious_NoMagicAnywhereIsAnError) {
  Put32(0, 0);
  Put32(kCpu1, 0);
  auto map = Read();
  ASSERT_FALSE(map.ok());
  EXPECT_NE(map.error().message.find("no ring_buffer_meta"), std::string::npos)
      << map.error().message;
}

TEST_F(BootMapTest, Malicious_UnknownGlobalMetaLayoutIsRefusedByName) {
  Put32(4, 64 | (32u << 16));  // struct_sizes: per-CPU 64, global 32: no kernel's.
  Put32(kCpu1, 0);
  auto map = Read();
  ASSERT_FALSE(map.ok());
  EXPECT_NE(map.error().message.find("struct_sizes 0x200040"), std::string::npos)
      << map.error().message;
  EXPECT_NE(map.error().message.find("does not know"), std::string::npos) << map.error().message;
}

TEST_F(BootMapTest, Malicious_StructSizeMismatch) {
  Put32(kCpu1 + 4, 60);
  auto map = Read();
  ASSERT_TRUE(map.ok());
  // CPU 1 no longer scores for the geometry, but CPU 0 pins it; CPU 1 is
  // still read with the range's layout and reported.
  EXPECT_TRUE(HasIssue(*map, 1, BootMapCheck::kStructSize));
  EXPECT_FALSE(map->cpu[1].meta_valid);
  EXPECT_GT(map->cpu[1].records.size(), 1000u);
}

TEST_F(BootMapTest, Malicious_IndexOutOfRange) {
  const auto clean = Read();
  ASSERT_TRUE(clean.ok());
  // A ring position between head and commit.
  const BootMapPage victim = clean->cpu[0].pages[3];
  Put32(kBuffers + 4 * victim.logical, 99999);
  Put32(kBuffers + 4 * 7, static_cast<uint32_t>(-5));
  auto map = Read();
  ASSERT_TRUE(map.ok());
  EXPECT_TRUE(HasIssue(*map, 0, BootMapCheck::kIndexOutOfRange));
  EXPECT_FALSE(map->cpu[0].meta_valid);
  EXPECT_EQ(map->cpu[0].records.size(),
            clean->cpu[0].records.size() - victim.records - clean->cpu[0].pages[7].records);
  EXPECT_EQ(map->cpu[1].records.size(), clean->cpu[1].records.size());
}

TEST_F(BootMapTest, Malicious_DuplicateIndex) {
  const auto clean = Read();
  ASSERT_TRUE(clean.ok());
  // The 6.12 consuming-read bug: one slot appears twice, another is lost.
  const BootMapPage a = clean->cpu[1].pages[2];
  const BootMapPage b = clean->cpu[1].pages[4];
  Put32(kCpu1 + kBuffers + 4 * b.logical, a.physical);
  auto map = Read();
  ASSERT_TRUE(map.ok());
  EXPECT_TRUE(HasIssue(*map, 1, BootMapCheck::kDuplicateIndex));
  size_t skipped = 0;
  for (const BootMapPage& p : map->cpu[1].pages) skipped += p.skipped;
  EXPECT_EQ(skipped, 1u);
  EXPECT_EQ(map->cpu[1].records.size(), clean->cpu[1].records.size() - b.records);
  EXPECT_EQ(map->cpu[0].records.size(), clean->cpu[0].records.size());
}

TEST_F(BootMapTest, Malicious_CommitPastThePage) {
  const auto clean = Read();
  ASSERT_TRUE(clean.ok());
  const BootMapPage victim = clean->cpu[0].pages[5];
  Put64(victim.offset + 8, 5000);
  auto map = Read();
  ASSERT_TRUE(map.ok());
  EXPECT_TRUE(HasIssue(*map, 0, BootMapCheck::kBadPage));
  EXPECT_TRUE(map->cpu[0].meta_valid);  // Metadata is fine; one page is not.
  EXPECT_EQ(map->cpu[0].stats.rejected[static_cast<size_t>(PageError::kCommitPastEnd)], 1u);
  EXPECT_EQ(map->cpu[0].records.size(), clean->cpu[0].records.size() - victim.records);
}

TEST_F(BootMapTest, Malicious_TimeGoingBackwards) {
  const auto clean = Read();
  ASSERT_TRUE(clean.ok());
  const BootMapPage victim = clean->cpu[1].pages[6];
  Put64(victim.offset, 1000);  // Page time stamp far before its neighbours.
  auto map = Read();
  ASSERT_TRUE(map.ok());
  EXPECT_TRUE(HasIssue(*map, 1, BootMapCheck::kTimeWentBackwards));
  EXPECT_EQ(map->boots, 1u);
  EXPECT_EQ(map->cpu[1].records.size(), clean->cpu[1].records.size() - victim.records);
  uint64_t last = 0;
  for (const BootMapRecord& r : map->cpu[1].records) {
    EXPECT_GE(r.timestamp, last);
    last = r.timestamp;
  }
}

TEST_F(BootMapTest, Malicious_HeadAndCommitOutOfRange) {
  const uint64_t first = Get64(24);
  Put64(kHead, first + 4096 * 5000);
  Put64(kCommit, first + 3);
  auto map = Read();
  ASSERT_TRUE(map.ok());
  EXPECT_TRUE(HasIssue(*map, 0, BootMapCheck::kHeadOutOfRange));
  EXPECT_TRUE(HasIssue(*map, 0, BootMapCheck::kCommitOutOfRange));
  // Without head or commit the whole ring is read; the time checks drop
  // what does not follow.
  EXPECT_GT(map->cpu[0].records.size(), 0u);
}

TEST_F(BootMapTest, Malicious_NrSubbufsLies) {
  Put32(52, 0x7fffffff);
  auto map = Read();
  ASSERT_TRUE(map.ok());
  EXPECT_TRUE(HasIssue(*map, 0, BootMapCheck::kNrSubbufs));
  EXPECT_GT(map->cpu[0].records.size(), 1000u);
}

TEST_F(BootMapTest, Malicious_TruncatedRange) {
  range_.resize(range_.size() - 4096 * 100);
  auto map = Read();
  // The geometry of a shorter range predicts other metas; either refused or
  // reported, never a crash or a read past the end.
  if (map.ok()) {
    EXPECT_FALSE(map->issues.empty());
  }
}

TEST_F(BootMapTest, Malicious_GarbageEverywhereButTheMagic) {
  uint32_t x = 12345;
  for (size_t i = 0; i < range_.size(); i += 4) {
    x = x * 1103515245 + 12345;
    std::memcpy(range_.data() + i, &x, 4);
  }
  Put32(0, kBootMapMagic);
  Put32(4, 56);
  Put32(52, 2045);
  Put32(kCpu1, kBootMapMagic);
  Put32(kCpu1 + 4, 56);
  Put32(kCpu1 + 52, 2045);
  auto map = Read();
  ASSERT_TRUE(map.ok());
  EXPECT_EQ(map->cpus, 2);
  EXPECT_FALSE(map->issues.empty());
}

// A guest may put the magic and a meta size on every page start, so that
// each of the ~1,000 geometries tried has a candidate at every chunk start
// (the search then walks chunk starts, not the magic pages): the real
// geometry still wins, as its metas alone agree in nr_subbufs too.
TEST_F(BootMapTest, Malicious_MagicOnEveryPageStillFindsTheGeometry) {
  const auto stride = Read()->chunk_stride;
  for (uint64_t off = 0; off + 4096 <= range_.size(); off += 4096) {
    if (off == 0 || off == kCpu1) continue;
    Put32(off, kBootMapMagic);
    Put32(off + 4, 56);
  }
  auto map = Read();
  ASSERT_TRUE(map.ok()) << map.error().message;
  EXPECT_EQ(map->cpus, 2);
  EXPECT_EQ(map->chunk_stride, stride);
  EXPECT_GT(map->cpu[1].records.size(), 0u);
}

// The real thing: a 6.12.95 guest wrote markers, kexec'd into the same kernel
// (which logged "Ring buffer meta [N] is from previous boot!" and kept
// appending), wrote more markers and panicked.
TEST(BootMapKexecTest, RealKexecFixtureHoldsBothBootsSeparated) {
  const std::string dir = kDir + "kexec/";
  std::vector<std::byte> range = Unzstd(dir + "region.bin.zst");
  ASSERT_EQ(range.size(), 16u << 20);
  BootMapOptions options;
  auto layout = PageLayout::FromHeaderPage(ReadText(dir + "header_page"), 4096);
  ASSERT_TRUE(layout.ok());
  options.layout = *layout;
  auto map = ReadBootMap(range, options);
  ASSERT_TRUE(map.ok()) << map.error().message;
  EXPECT_EQ(map->cpus, 2);
  EXPECT_EQ(map->boots, 2u);
  for (const BootMapIssue& issue : map->issues) {
    EXPECT_EQ(issue.check, BootMapCheck::kTimeWentBackwards) << issue.message;
  }

  // The new boot's trace file shows both boots; per CPU, the same events at
  // the same times.
  const std::vector<TraceLine> lines = GuestTrace(dir + "trace.txt.zst");
  std::map<int, std::vector<uint64_t>> want;
  for (const TraceLine& l : lines) want[l.cpu].push_back(l.usecs);
  for (const BootMapCpu& cpu : map->cpu) {
    std::vector<uint64_t> got;
    for (const BootMapRecord& r : cpu.records) got.push_back(Usecs(r.timestamp));
    EXPECT_EQ(got, want[cpu.cpu]) << "cpu " << cpu.cpu;
  }

  // Markers land in their boot.
  const PrintFormat print = ReadPrintFormat(dir);
  std::map<std::string, uint32_t> marker_boot;
  for (const BootMapCpu& cpu : map->cpu) {
    for (const BootMapRecord& r : cpu.records) {
      if (Type(r) == print.id) marker_boot[PrintText(r, print)] = r.boot;
    }
  }
  ASSERT_EQ(marker_boot.size(), 12u);
  for (const auto& [text, boot] : marker_boot) {
    EXPECT_EQ(boot, text.find("boot0") != std::string::npos ? 0u : 1u) << text;
  }

  // What the first boot's own trace file showed before the kexec is the
  // start of boot 0, per CPU.
  const std::vector<TraceLine> boot0 = GuestTrace(dir + "trace-boot0.txt.zst");
  std::map<int, std::vector<uint64_t>> want0;
  for (const TraceLine& l : boot0) want0[l.cpu].push_back(l.usecs);
  for (const BootMapCpu& cpu : map->cpu) {
    std::vector<uint64_t> got0;
    for (const BootMapRecord& r : cpu.records) {
      if (r.boot == 0 && got0.size() < want0[cpu.cpu].size()) got0.push_back(Usecs(r.timestamp));
    }
    EXPECT_EQ(got0, want0[cpu.cpu]) << "cpu " << cpu.cpu;
  }
}

// CPUs read on several threads give the map one thread gives: pages,
// records, boots and issues alike, on the real kexec fixture (two boots) and
// with one CPU's meta broken.
TEST(BootMapThreadsTest, ThreadsGiveTheSameMap) {
  const std::string dir = kDir + "kexec/";
  std::vector<std::byte> range = Unzstd(dir + "region.bin.zst");
  BootMapOptions options;
  auto layout = PageLayout::FromHeaderPage(ReadText(dir + "header_page"), 4096);
  ASSERT_TRUE(layout.ok());
  options.layout = *layout;
  auto same = [&](const std::vector<std::byte>& bytes) {
    options.threads = 1;
    auto one = ReadBootMap(bytes, options);
    ASSERT_TRUE(one.ok()) << one.error().message;
    for (int threads : {2, 3, 8}) {
      SCOPED_TRACE("threads " + std::to_string(threads));
      options.threads = threads;
      auto many = ReadBootMap(bytes, options);
      ASSERT_TRUE(many.ok()) << many.error().message;
      ASSERT_EQ(many->cpu.size(), one->cpu.size());
      EXPECT_EQ(many->boots, one->boots);
      for (size_t c = 0; c < one->cpu.size(); ++c) {
        const BootMapCpu &a = one->cpu[c], &b = many->cpu[c];
        EXPECT_EQ(b.cpu, a.cpu);
        EXPECT_EQ(b.meta_valid, a.meta_valid);
        ASSERT_EQ(b.records.size(), a.records.size());
        for (size_t i = 0; i < a.records.size(); ++i) {
          EXPECT_EQ(b.records[i].timestamp, a.records[i].timestamp);
          EXPECT_EQ(b.records[i].boot, a.records[i].boot);
          EXPECT_EQ(b.records[i].payload.data(), a.records[i].payload.data());
        }
        ASSERT_EQ(b.pages.size(), a.pages.size());
        for (size_t i = 0; i < a.pages.size(); ++i) EXPECT_EQ(b.pages[i].offset, a.pages[i].offset);
      }
      ASSERT_EQ(many->issues.size(), one->issues.size());
      for (size_t i = 0; i < one->issues.size(); ++i) {
        EXPECT_EQ(many->issues[i].message, one->issues[i].message);
      }
    }
  };
  ASSERT_GT(range.size(), 0x800000u);
  same(range);
  range[0x800000] = std::byte{0x42};  // CPU 1's magic.
  same(range);
}

// A crafted single-CPU range with two boots: the second restarts the clock.
TEST(BootMapBootsTest, KexecSplitsBootsWhereTimeRestarts) {
  const PageLayout layout;  // 4096-byte pages, data at 16.
  const uint64_t range_size = 64 * 1024;
  uint32_t nr = 0;
  uint64_t stride = 0;
  ASSERT_TRUE(BootMapGeometry(range_size, 1, 4096, 56, &nr, &stride));
  std::vector<std::byte> range(range_size);
  const uint64_t first_va = 0xffff888000001000ull;
  auto put32 = [&](uint64_t off, uint32_t v) { std::memcpy(range.data() + off, &v, 4); };
  auto put64 = [&](uint64_t off, uint64_t v) { std::memcpy(range.data() + off, &v, 8); };
  put32(0, kBootMapMagic);
  put32(4, 56);
  put64(24, first_va);
  put64(32, first_va + 4096 * 1);         // head: slot 1
  put64(40, first_va + 4096 * (nr - 1));  // commit: last slot
  put32(48, 4096);
  put32(52, nr);
  for (uint32_t i = 0; i < nr; ++i) put32(56 + 4 * i, i);
  const uint64_t pages = 4096;  // ALIGN(56 + 4 * nr, 4096) for this size.
  // Boot 0 in slots 1..3 at 5 s; boot 1 in the rest at 1 ms.
  std::vector<std::byte> payload(16);
  uint64_t t = 0;
  for (uint32_t slot = 1; slot < nr; ++slot) {
    if (slot == 1) t = 5'000'000'000;
    if (slot == 4) t = 1'000'000;
    std::span<std::byte> page(range.data() + pages + 4096ull * slot, 4096);
    PageWriter writer(page, layout, t);
    for (int k = 0; k < 3; ++k) {
      t += 1000;
      ASSERT_TRUE(writer.Append(t, payload));
    }
    writer.Finish();
  }
  BootMapOptions options;
  options.layout = layout;
  auto map = ReadBootMap(range, options);
  ASSERT_TRUE(map.ok()) << map.error().message;
  EXPECT_EQ(map->cpus, 1);
  EXPECT_EQ(map->boots, 2u);
  for (const BootMapIssue& issue : map->issues) ADD_FAILURE() << issue.message;
  ASSERT_EQ(map->cpu[0].records.size(), 3u * (nr - 1));
  for (const BootMapRecord& r : map->cpu[0].records) {
    EXPECT_EQ(r.boot, r.timestamp >= 5'000'000'000 ? 0u : 1u);
  }
}

// A crafted 6.12 range of |possible| CPUs whose first |online| ones wrote
// |records| records each into ring slot 1; the others have the meta the
// kernel initialises for every possible CPU, with head_buffer 0.
std::vector<std::byte> CraftRange(uint64_t range_size, int possible, int online, int records) {
  const PageLayout layout;
  uint32_t nr = 0;
  uint64_t stride = 0;
  EXPECT_TRUE(BootMapGeometry(range_size, possible, 4096, 56, &nr, &stride));
  std::vector<std::byte> range(range_size);
  auto put32 = [&](uint64_t off, uint32_t v) { std::memcpy(range.data() + off, &v, 4); };
  auto put64 = [&](uint64_t off, uint64_t v) { std::memcpy(range.data() + off, &v, 8); };
  const uint64_t pages = (56 + 4 * uint64_t{nr} + 4095) / 4096 * 4096;
  for (int c = 0; c < possible; ++c) {
    const uint64_t off = static_cast<uint64_t>(c) * stride;
    const uint64_t first_va = 0xffff888000000000ull + off + pages;
    put32(off, kBootMapMagic);
    put32(off + 4, 56);
    put64(off + 24, first_va);
    put32(off + 48, 4096);
    put32(off + 52, nr);
    for (uint32_t i = 0; i < nr; ++i) put32(off + 56 + 4 * i, i);
    if (c >= online) continue;
    put64(off + 32, first_va + 4096);  // head: slot 1
    put64(off + 40, first_va + 4096);  // commit: slot 1
    std::span<std::byte> page(range.data() + off + pages + 4096, 4096);
    PageWriter writer(page, layout, 1000);
    std::vector<std::byte> payload(16);
    for (int k = 0; k < records; ++k) EXPECT_TRUE(writer.Append(1000 + 10 * k, payload));
    writer.Finish();
  }
  return range;
}

bool HasCheck(const BootMap& map, int cpu, BootMapCheck check) {
  for (const BootMapIssue& i : map.issues) {
    if (i.cpu == cpu && i.check == check) return true;
  }
  return false;
}

TEST(BootMapGeometryFromMetaTest, PossibleCpusNeverOnlineAreEmptyNotErrors) {
  BootMapOptions options;  // -smp 2,maxcpus=4: nr_cpu_ids 4, CPUs 0-1 online.
  auto map = ReadBootMap(CraftRange(1 << 20, 4, 2, 5), options);
  ASSERT_TRUE(map.ok()) << map.error().message;
  EXPECT_EQ(map->cpus, 4);
  EXPECT_EQ(map->geometry_from, "range_size");
  EXPECT_EQ(map->total_records(), 10u);
  for (const BootMapIssue& i : map->issues) {
    EXPECT_TRUE(i.cpu >= 2 && i.check == BootMapCheck::kEmpty) << i.message;
  }
  EXPECT_TRUE(HasCheck(*map, 2, BootMapCheck::kEmpty));
  EXPECT_TRUE(HasCheck(*map, 3, BootMapCheck::kEmpty));
}

TEST(BootMapGeometryFromMetaTest, CopyLargerThanTheRangeDecodes) {
  const std::vector<std::byte> exact = CraftRange(1 << 20, 4, 2, 5);
  // Zero padding after the range, an odd amount and an exact multiple; and
  // the rest of a backing file holding other guest memory (non-zero).
  for (uint64_t extra : {uint64_t{12345}, uint64_t{3} << 20, uint64_t{1} << 20}) {
    for (bool garbage : {false, true}) {
      // Garbage after an exact multiple of the range looks like more CPUs
      // with bad metas (they would be reported); zeros do not.
      if (garbage && extra % exact.size() == 0) continue;
      SCOPED_TRACE(std::to_string(extra) + (garbage ? " garbage" : " zeros"));
      std::vector<std::byte> range = exact;
      range.resize(exact.size() + extra);
      uint32_t x = 7;
      for (size_t i = exact.size(); garbage && i < range.size(); ++i) {
        x = x * 1103515245 + 12345;
        range[i] = static_cast<std::byte>(x >> 16);
      }
      BootMapOptions options;
      auto map = ReadBootMap(range, options);
      ASSERT_TRUE(map.ok()) << map.error().message;
      EXPECT_EQ(map->cpus, 4);
      // A little padding can still predict the same chunks from the size.
      if (extra >= exact.size()) {
        EXPECT_EQ(map->geometry_from, "meta");
        EXPECT_EQ(map->range_size, exact.size());
      }
      EXPECT_EQ(map->total_records(), 10u);
      for (const BootMapIssue& i : map->issues)
        EXPECT_EQ(i.check, BootMapCheck::kEmpty) << i.message;
      options.cpus = 4;  // Given: the same.
      auto given = ReadBootMap(range, options);
      ASSERT_TRUE(given.ok()) << given.error().message;
      EXPECT_EQ(given->total_records(), 10u);
    }
  }
}

TEST(BootMapGeometryFromMetaTest, CopySmallerThanTheRangeIsNotReadAsFewerCpus) {
  // 4 MiB of a 2-CPU range: CPU 1's meta is there, its chunk is cut off.
  std::vector<std::byte> range = CraftRange(4 << 20, 2, 2, 5);
  range.resize(3 << 20);
  auto map = ReadBootMap(range, BootMapOptions{});
  if (map.ok()) {
    EXPECT_NE(map->geometry_from, "meta");
  }
}

TEST(BootMapGeometryFromMetaTest, Malicious_MetaZeroLiesAboutTheGeometry) {
  std::vector<std::byte> range = CraftRange(1 << 20, 2, 2, 5);
  range.resize(range.size() + 4096 * 7);
  uint32_t nr = 0;
  std::memcpy(&nr, range.data() + 52, 4);
  for (uint32_t bad_nr : {0u, 2u, nr + 1, 0xffffffffu}) {
    SCOPED_TRACE(bad_nr);
    std::vector<std::byte> copy = range;
    std::memcpy(copy.data() + 52, &bad_nr, 4);
    auto map = ReadBootMap(copy, BootMapOptions{});
    // Meta 0 no longer describes a chunk the kernel would make: refused or
    // reported, never a read past the copy.
    if (map.ok()) {
      EXPECT_FALSE(map->issues.empty());
    }
  }
}

}  // namespace
}  // namespace hvtrace
