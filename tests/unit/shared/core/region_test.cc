#include <gtest/gtest.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

#include "guest_region_setup.h"
#include "hvtrace/fingerprint.h"
#include "hvtrace/region_reader.h"
#include "hvtrace/region_writer.h"
#include "test_support.h"

namespace hvtrace {
namespace {

using test_support::Bytes;
using test_support::ReadFixture;

// A region built the way hostd and the agent build one: host header, guest
// identity, header_page + sched_switch formats, three real kernel pages on
// CPU 0 and one on CPU 1.
class RegionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    RegionPlanOptions opt;
    opt.max_cpus = 2;
    opt.region_id = 0x1234;
    auto plan = PlanRegion(1 << 20, opt);
    ASSERT_TRUE(plan.ok()) << plan.error().message;
    geometry_ = *plan;
    mem_.assign(geometry_.region_size, std::byte{0});
    ASSERT_TRUE(InitRegionHeader(mem_, geometry_, 42).ok());
    auto guest = GuestRegion::Attach(mem_.data(), mem_.size());
    ASSERT_TRUE(guest.ok()) << guest.error().message;
    region::GuestIdentity id = test_support::TestGuestIdentity();
    for (int i = 0; i < 16; ++i) id.boot_id[i] = static_cast<uint8_t>(i);
    guest->WriteIdentity(id);
    ASSERT_TRUE(test_support::PublishHeaderPage(*guest));
    ASSERT_TRUE(test_support::PublishEvent(*guest, region::kFormatKernelEvent, "sched",
                                           test_support::SchedSwitchFormat(), 0, &sched_fp_));
    for (int i = 0; i < 3; ++i) {
      guest->PushCpuPage(0, 1, Bytes(ReadFixture("pages/cpu0-" + std::to_string(i) + ".bin")), 0);
    }
    guest->PushCpuPage(1, 1, Bytes(ReadFixture("pages/cpu1-0.bin")), region::kSlotPartial);
    guest->AddClockSync(10, 11, 12, 13);
    guest_.emplace(*guest);
  }

  RegionSnapshot Read() {
    auto snap = ReadRegion(mem_, geometry_);
    EXPECT_TRUE(snap.ok());
    return std::move(*snap);
  }
  template <typename T>
  T* At(uint64_t offset) {
    return reinterpret_cast<T*>(mem_.data() + offset);
  }
  region::SlotDesc* CpuDesc(uint32_t cpu, uint32_t slot) {
    return At<region::SlotDesc>(geometry_.CpuDescOffset(cpu, slot));
  }
  region::FormatEntry* Entry(uint32_t i) {
    return At<region::FormatEntry>(geometry_.FormatEntryOffset(i));
  }

  RegionGeometry geometry_;
  std::vector<std::byte> mem_;
  std::optional<GuestRegion> guest_;
  uint64_t sched_fp_ = 0;
};

TEST(RegionPlan, RefusesSizesQemuCannotMap) {
  RegionPlanOptions opt;
  EXPECT_FALSE(PlanRegion(3 << 20, opt).ok());
  EXPECT_FALSE(PlanRegion(1 << 19, opt).ok());
  opt.slot_size = 5000;
  EXPECT_FALSE(PlanRegion(1 << 22, opt).ok());
}

TEST(RegionPlan, AreasFitAndDoNotOverlap) {
  for (uint32_t cpus : {1u, 2u, 8u, 64u}) {
    for (uint64_t size : {1ull << 20, 4ull << 20, 64ull << 20}) {
      RegionPlanOptions opt;
      opt.max_cpus = cpus;
      auto g = PlanRegion(size, opt);
      if (!g.ok()) {
        EXPECT_GE(cpus, 64u) << g.error().message;  // 64 CPUs do not fit in 1 MiB.
        continue;
      }
      EXPECT_TRUE(ValidateGeometry(*g).ok());
      EXPECT_GE(g->slots_per_cpu, 2u);
      EXPECT_LE(g->CpuPageOffset(cpus - 1, g->slots_per_cpu - 1) + g->slot_size,
                g->dw_rings ? g->dw_offset : size);
      if (g->dw_rings) {
        EXPECT_LE(g->DwPageOffset(g->dw_rings - 1, g->dw_slots - 1) + g->slot_size, size);
      }
      EXPECT_EQ(g->CpuPageOffset(0, 0) % g->slot_size, 0u);
    }
  }
}

TEST(RegionPlan, GeometryRoundTripsThroughTheHeader) {
  RegionPlanOptions opt;
  opt.max_cpus = 4;
  opt.region_id = 77;
  auto g = PlanRegion(4 << 20, opt);
  ASSERT_TRUE(g.ok());
  std::vector<std::byte> mem(g->region_size);
  ASSERT_TRUE(InitRegionHeader(mem, *g, 1).ok());
  EXPECT_TRUE(HasRegionMagic(mem));
  auto back = GeometryFromHeader(std::span(mem).first(256), mem.size());
  ASSERT_TRUE(back.ok()) << back.error().message;
  EXPECT_EQ(*back, *g);
  // The header's size must match the mapping, whatever the header says.
  EXPECT_FALSE(GeometryFromHeader(std::span(mem).first(256), mem.size() * 2).ok());
}

TEST(RegionPlan, MagicIsNotStoredInPlainText) {
  RegionPlanOptions opt;
  auto g = PlanRegion(1 << 20, opt);
  ASSERT_TRUE(g.ok());
  std::vector<std::byte> mem(g->region_size);
  ASSERT_TRUE(InitRegionHeader(mem, *g, 1).ok());
  EXPECT_EQ(std::memcmp(mem.data(), "HVTRACE\0REGION1\0", 16), 0);
  // ... but neither constant in the ABI header is the magic itself.
  EXPECT_NE(region::kRegionMagicXored[0], 0x0045434152545648ull);
  EXPECT_NE(region::kRegionMagicXor[0], 0x0045434152545648ull);
}

TEST_F(RegionTest, ReadsWhatTheGuestPublished) {
  RegionSnapshot s = Read();
  EXPECT_EQ(s.issue_total(), 0u) << (s.problems.empty() ? "" : s.problems[0].detail);
  ASSERT_TRUE(s.guest.present);
  EXPECT_EQ(s.guest.boot_generation, 1u);
  EXPECT_EQ(s.guest.kernel_release, "6.12.9-test");
  EXPECT_EQ(s.guest.boot_id, "00010203-0405-0607-0809-0a0b0c0d0e0f");
  ASSERT_EQ(s.formats.size(), 2u);
  const RegionFormat* sched = s.FindFormat(1, 310);
  ASSERT_NE(sched, nullptr);
  EXPECT_EQ(sched->system, "sched");
  EXPECT_EQ(sched->parsed->name, "sched_switch");
  EXPECT_EQ(sched->fingerprint, sched_fp_);
  EXPECT_EQ(s.cpu_layout.data_offset, 16u);
  ASSERT_EQ(s.cpus.size(), 2u);
  ASSERT_EQ(s.cpus[0].pages.size(), 3u);
  EXPECT_EQ(s.cpus[0].published, 3u);
  for (uint64_t i = 0; i < 3; ++i) {
    const RegionPage& p = s.cpus[0].pages[i];
    EXPECT_EQ(p.sequence, i);
    EXPECT_EQ(p.page_error, PageError::kOk);
    EXPECT_GT(p.records, 0u);
    const std::string want = ReadFixture("pages/cpu0-" + std::to_string(i) + ".bin");
    EXPECT_EQ(std::memcmp(p.page.data(), want.data(), want.size()), 0);
  }
  ASSERT_EQ(s.cpus[1].pages.size(), 1u);
  EXPECT_EQ(s.cpus[1].pages[0].flags, region::kSlotPartial);
  ASSERT_EQ(s.clock_sync.size(), 1u);
  EXPECT_EQ(s.clock_sync[0].tsc, 13u);
}

TEST_F(RegionTest, RingWrapKeepsTheNewestPages) {
  const std::string page = ReadFixture("pages/cpu0-0.bin");
  const uint32_t n = geometry_.slots_per_cpu;
  for (uint32_t i = 0; i < n + 5; ++i) guest_->PushCpuPage(1, 1, Bytes(page), 0);
  RegionSnapshot s = Read();
  EXPECT_EQ(s.issue_total(), 0u);
  ASSERT_EQ(s.cpus[1].pages.size(), n);
  EXPECT_EQ(s.cpus[1].pages.front().sequence, 6u);
  EXPECT_EQ(s.cpus[1].pages.back().sequence, n + 5u);
}

TEST_F(RegionTest, Malicious_TornSlotIsSkippedOthersKept) {
  CpuDesc(0, 1)->seq |= 1;
  RegionSnapshot s = Read();
  EXPECT_EQ(s.issue_count(RegionIssue::kSlotTorn), 1u);
  ASSERT_EQ(s.cpus[0].pages.size(), 2u);
  EXPECT_EQ(s.cpus[0].pages[0].sequence, 0u);
  EXPECT_EQ(s.cpus[0].pages[1].sequence, 2u);
}

TEST_F(RegionTest, Malicious_LengthsOutOfRange) {
  CpuDesc(0, 0)->length = 1 << 20;
  CpuDesc(0, 1)->length = 3;
  // A page whose commit claims more than the slot's length.
  CpuDesc(0, 2)->length = 64;
  RegionSnapshot s = Read();
  EXPECT_EQ(s.issue_count(RegionIssue::kSlotLengthOutOfRange), 2u);
  EXPECT_EQ(s.issue_count(RegionIssue::kSlotCommitPastLength), 1u);
  EXPECT_TRUE(s.cpus[0].pages.empty());
  EXPECT_EQ(s.cpus[1].pages.size(), 1u);
}

TEST_F(RegionTest, Malicious_PageCommitPastEndIsReportedByTheWalker) {
  // Commit larger than the page: the slot length (4096) admits it only if the
  // commit check passes, so make commit exactly fill the page but records lie.
  std::byte* page = mem_.data() + geometry_.CpuPageOffset(0, 0);
  uint32_t bad_header = 0xffffffe0u;  // type_len 0, huge delta; then length 0
  std::memcpy(page + 16, &bad_header, 4);
  uint32_t zero = 0;
  std::memcpy(page + 20, &zero, 4);
  RegionSnapshot s = Read();
  EXPECT_EQ(s.issue_count(RegionIssue::kSlotPageError), 1u);
  ASSERT_FALSE(s.cpus[0].pages.empty());
  EXPECT_NE(s.cpus[0].pages[0].page_error, PageError::kOk);
}

TEST_F(RegionTest, Malicious_CountersThatLie) {
  CpuDesc(0, 1)->sequence = 1 + geometry_.slots_per_cpu;  // Right slot, but past published.
  CpuDesc(0, 2)->sequence = 7;                            // Wrong slot.
  At<region::CpuRingHeader>(geometry_.CpuRingOffset(1))->published = 1000000;  // Page 0 now stale.
  RegionSnapshot s = Read();
  EXPECT_EQ(s.issue_count(RegionIssue::kRingCounterBehind), 1u);
  EXPECT_EQ(s.issue_count(RegionIssue::kSlotMisplaced), 2u);
  EXPECT_EQ(s.cpus[0].pages.size(), 1u);
  EXPECT_TRUE(s.cpus[1].pages.empty());
}

TEST_F(RegionTest, Malicious_BadGeneration) {
  CpuDesc(0, 0)->boot_generation = 0;
  CpuDesc(0, 1)->boot_generation = 9;
  RegionSnapshot s = Read();
  EXPECT_EQ(s.issue_count(RegionIssue::kSlotBadGeneration), 2u);
  EXPECT_EQ(s.cpus[0].pages.size(), 1u);
}

TEST_F(RegionTest, Malicious_FormatTableLies) {
  // Entry 1 is sched_switch: claim another fingerprint.
  Entry(1)->fingerprint ^= 1;
  RegionSnapshot s = Read();
  EXPECT_EQ(s.issue_count(RegionIssue::kFormatFingerprintMismatch), 1u);
  EXPECT_EQ(s.FindFormat(1, 310), nullptr);
  Entry(1)->fingerprint ^= 1;

  Entry(1)->id = 311;
  s = Read();
  EXPECT_EQ(s.issue_count(RegionIssue::kFormatIdMismatch), 1u);
  Entry(1)->id = 310;

  Entry(1)->text_offset = geometry_.format_text_size - 10;
  s = Read();
  EXPECT_EQ(s.issue_count(RegionIssue::kFormatOutOfRange), 1u);

  Entry(1)->text_offset = 0xffffffffu;
  Entry(1)->text_len = 0xffffffffu;
  s = Read();
  EXPECT_EQ(s.issue_count(RegionIssue::kFormatOutOfRange), 1u);

  Entry(0)->kind = 99;
  Entry(1)->seq = 3;
  s = Read();
  EXPECT_EQ(s.issue_count(RegionIssue::kFormatBadKind), 1u);
  EXPECT_EQ(s.issue_count(RegionIssue::kFormatTorn), 1u);
  // Without its header_page the layout falls back to the 64-bit default.
  EXPECT_EQ(s.cpu_layout.data_offset, 16u);
}

TEST_F(RegionTest, Malicious_FormatConflictAndGarbageText) {
  // The same id again, with a different (valid) format.
  std::string text = ReadFixture("boot_map/formats/sched/sched_switch/format");
  const size_t at = text.find("offset:28;\tsize:4;\tsigned:1;");
  ASSERT_NE(at, std::string::npos);
  text.replace(at, 28, "offset:28;\tsize:4;\tsigned:0;");
  auto parsed = ParseEventFormat("sched", text);
  ASSERT_TRUE(parsed.ok()) << parsed.error().message;
  ASSERT_TRUE(guest_
                  ->PublishFormat(region::kFormatKernelEvent, 1, 310, "sched", text,
                                  EventFingerprint(*parsed))
                  .ok());
  ASSERT_TRUE(
      guest_->PublishFormat(region::kFormatKernelEvent, 1, 5, "x", "\x01\x02 garbage", 0).ok());
  RegionSnapshot s = Read();
  EXPECT_EQ(s.issue_count(RegionIssue::kFormatConflict), 1u);
  EXPECT_EQ(s.issue_count(RegionIssue::kFormatParseError), 1u);
  // Neither wins: which records are whose cannot be told, so they print raw.
  EXPECT_EQ(s.FindFormat(1, 310), nullptr);
}

TEST_F(RegionTest, Malicious_GuestOverwritesHostHeader) {
  At<region::HostHeader>(0)->slots_per_cpu = 1u << 30;
  At<region::HostHeader>(0)->region_size = 1ull << 40;
  RegionSnapshot s = Read();
  EXPECT_EQ(s.issue_count(RegionIssue::kHeaderMismatch), 1u);
  // Our geometry still holds: everything else reads.
  EXPECT_EQ(s.cpus[0].pages.size(), 3u);
}

TEST_F(RegionTest, Malicious_IdentityLies) {
  auto* id = At<region::GuestIdentity>(region::kGuestIdentityOffset);
  id->nr_cpus = 4096;
  RegionSnapshot s = Read();
  EXPECT_EQ(s.issue_count(RegionIssue::kIdentityBad), 1u);
  EXPECT_FALSE(s.guest.present);
  id->nr_cpus = 2;
  id->kernel_release[3] = '\n';
  s = Read();
  EXPECT_EQ(s.issue_count(RegionIssue::kIdentityBad), 1u);
  id->seq = 5;
  s = Read();
  EXPECT_EQ(s.issue_count(RegionIssue::kIdentityTorn), 1u);
}

TEST_F(RegionTest, LiveCopyNeverReturnsATornPage) {
  // A writer thread keeps pushing pages to CPU 1 while we copy. Each page
  // carries its own sequence number in its first and last 8 bytes (the time
  // stamp and the padding), so a page copied while it was being rewritten,
  // or whose descriptor belongs to another write, shows up as a mismatch.
  // Start from a clean ring so that every slot holds a numbered page.
  RegionGeometry g = geometry_;
  for (uint32_t s = 0; s < g.slots_per_cpu; ++s) *CpuDesc(1, s) = region::SlotDesc{};
  At<region::CpuRingHeader>(g.CpuRingOffset(1))->published = 0;
  uint64_t pages = 0, skipped = 0, bad = 0;
  {
    test_support::NumberedPageWriter writer(*guest_, 1, Bytes(ReadFixture("pages/cpu0-0.bin")));
    while (writer.written() < 2 * g.slots_per_cpu) std::this_thread::yield();
    std::vector<std::byte> copy;
    for (int round = 0; round < 300; ++round) {
      CopyLiveRegion(mem_.data(), g, &copy);
      auto s = ReadRegion(copy, g);
      if (!s.ok()) break;
      skipped +=
          s->issue_count(RegionIssue::kSlotTorn) + s->issue_count(RegionIssue::kSlotMisplaced);
      for (const RegionPage& p : s->cpus[1].pages) {
        bad += test_support::NumberedPageWriter::Matches(p) ? 0 : 1;
        ++pages;
      }
    }
  }
  EXPECT_GT(pages, 0u);
  EXPECT_EQ(bad, 0u) << "pages whose content is not the write their descriptor describes";
  std::printf("live copies: %llu whole pages, %llu torn/rewritten slots skipped\n",
              static_cast<unsigned long long>(pages), static_cast<unsigned long long>(skipped));
}

TEST_F(RegionTest, TrackerDeliversEachPageOnceAndCountsBackwards) {
  RegionTracker tracker(geometry_);
  RegionSnapshot s1 = Read();
  auto d1 = tracker.Update(&s1);
  EXPECT_EQ(d1.pages.size(), 4u);
  EXPECT_EQ(d1.pages_missed, 0u);
  guest_->PushCpuPage(0, 1, Bytes(ReadFixture("pages/cpu0-0.bin")), 0);
  RegionSnapshot s2 = Read();
  auto d2 = tracker.Update(&s2);
  ASSERT_EQ(d2.pages.size(), 1u);
  EXPECT_EQ(d2.pages[0].page->sequence, 3u);
  // Skip ahead past a whole ring: the overwritten pages are counted missed.
  for (uint32_t i = 0; i < geometry_.slots_per_cpu + 3; ++i) {
    guest_->PushCpuPage(0, 1, Bytes(ReadFixture("pages/cpu0-0.bin")), 0);
  }
  RegionSnapshot s3 = Read();
  auto d3 = tracker.Update(&s3);
  EXPECT_EQ(d3.pages.size(), geometry_.slots_per_cpu);
  EXPECT_EQ(d3.pages_missed, 3u);
  // A guest that rewinds its counter.
  At<region::CpuRingHeader>(geometry_.CpuRingOffset(0))->published = 1;
  RegionSnapshot s4 = Read();
  tracker.Update(&s4);
  EXPECT_GE(s4.issue_count(RegionIssue::kCounterBackwards), 1u);
}

TEST_F(RegionTest, Malicious_RandomScribblesNeverCrash) {
  std::mt19937_64 rng(7);
  const std::vector<std::byte> clean = mem_;
  for (int round = 0; round < 200; ++round) {
    mem_ = clean;
    for (int k = 0; k < 64; ++k) {
      // Aim at the interesting parts: control area, format table, descriptors.
      uint64_t at;
      switch (k % 3) {
        case 0:
          at = rng() % region::kControlAreaSize;
          break;
        case 1:
          at = geometry_.format_offset + rng() % 4096;
          break;
        default:
          at = geometry_.CpuRingOffset(rng() % 2) + rng() % 4096;
          break;
      }
      mem_[at] = static_cast<std::byte>(rng());
    }
    auto s = ReadRegion(mem_, geometry_);
    ASSERT_TRUE(s.ok());
    for (const RegionRing& ring : s->cpus) {
      for (const RegionPage& p : ring.pages) {
        ASSERT_LE(p.length, geometry_.slot_size);
        ASSERT_GE(p.page.data(), s->copy.data());
        ASSERT_LE(p.page.data() + p.page.size(), s->copy.data() + s->copy.size());
      }
    }
  }
}

TEST(RegionReader, RejectsCopiesOfTheWrongSize) {
  RegionPlanOptions opt;
  auto g = PlanRegion(1 << 20, opt);
  ASSERT_TRUE(g.ok());
  EXPECT_FALSE(ReadRegion(std::vector<std::byte>(100), *g).ok());
  RegionGeometry bad = *g;
  bad.cpu_stride = 1;
  EXPECT_FALSE(ReadRegion(std::vector<std::byte>(g->region_size), bad).ok());
}

}  // namespace
}  // namespace hvtrace
