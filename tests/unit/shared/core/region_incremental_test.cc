#include "hvtrace/region_incremental.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

#include "guest_region_setup.h"
#include "hvtrace/dwtrace.hpp"
#include "hvtrace/fingerprint.h"
#include "hvtrace/region_text.h"
#include "hvtrace/region_writer.h"
#include "test_support.h"

namespace hvtrace {
namespace {

using test_support::Bytes;
using test_support::ReadFixture;

// Everything a full read returns, compared field by field with what the
// incremental reader returns for the same live bytes.
void ExpectSame(const RegionSnapshot& full, const RegionSnapshot& inc, const std::string& when) {
  SCOPED_TRACE(when);
  EXPECT_EQ(full.guest.present, inc.guest.present);
  EXPECT_EQ(full.guest.boot_generation, inc.guest.boot_generation);
  EXPECT_EQ(full.guest.boot_id, inc.guest.boot_id);
  EXPECT_EQ(full.guest.kernel_release, inc.guest.kernel_release);
  EXPECT_EQ(full.guest.status.heartbeat, inc.guest.status.heartbeat);
  EXPECT_EQ(full.clock_sync.size(), inc.clock_sync.size());
  ASSERT_EQ(full.formats.size(), inc.formats.size());
  for (size_t i = 0; i < full.formats.size(); ++i) {
    EXPECT_EQ(full.formats[i].index, inc.formats[i].index);
    EXPECT_EQ(full.formats[i].id, inc.formats[i].id);
    EXPECT_EQ(full.formats[i].boot_generation, inc.formats[i].boot_generation);
    EXPECT_EQ(full.formats[i].text, inc.formats[i].text);
    EXPECT_EQ(full.formats[i].parsed.has_value(), inc.formats[i].parsed.has_value());
  }
  EXPECT_TRUE(full.cpu_layout == inc.cpu_layout);
  for (auto [a, b] : {std::pair{&full.symbols, &inc.symbols}, std::pair{&full.comms, &inc.comms}}) {
    EXPECT_EQ(a->present, b->present);
    EXPECT_EQ(a->seq, b->seq);
    ASSERT_EQ(a->stored.size(), b->stored.size());
    EXPECT_TRUE(std::equal(a->stored.begin(), a->stored.end(), b->stored.begin()));
  }
  for (auto [fr, ir] :
       {std::pair{&full.cpus, &inc.cpus}, std::pair{&full.dw_rings, &inc.dw_rings}}) {
    ASSERT_EQ(fr->size(), ir->size());
    for (size_t r = 0; r < fr->size(); ++r) {
      const RegionRing& a = (*fr)[r];
      const RegionRing& b = (*ir)[r];
      EXPECT_EQ(a.published, b.published);
      EXPECT_EQ(a.lost_events, b.lost_events);
      EXPECT_EQ(a.comm, b.comm);
      ASSERT_EQ(a.pages.size(), b.pages.size()) << "ring " << r;
      for (size_t p = 0; p < a.pages.size(); ++p) {
        const RegionPage& x = a.pages[p];
        const RegionPage& y = b.pages[p];
        EXPECT_EQ(x.sequence, y.sequence);
        EXPECT_EQ(x.slot, y.slot);
        EXPECT_EQ(x.length, y.length);
        EXPECT_EQ(x.flags, y.flags);
        EXPECT_EQ(x.clock, y.clock);
        EXPECT_EQ(x.records, y.records);
        EXPECT_EQ(x.page_error, y.page_error);
        // Only the first |length| bytes mean anything (an open page's tail
        // is still being written).
        EXPECT_EQ(std::memcmp(x.page.data(), y.page.data(), x.length), 0)
            << "ring " << r << " page " << x.sequence;
      }
    }
  }
  EXPECT_EQ(full.issues, inc.issues);
  ASSERT_EQ(full.problems.size(), inc.problems.size());
  for (size_t i = 0; i < full.problems.size(); ++i) {
    EXPECT_EQ(full.problems[i].issue, inc.problems[i].issue);
    EXPECT_EQ(full.problems[i].where, inc.problems[i].where);
    EXPECT_EQ(full.problems[i].offset, inc.problems[i].offset);
    EXPECT_EQ(full.problems[i].detail, inc.problems[i].detail);
  }
}

// A region as hostd and the agent build one (formats, symbols, comms,
// kernel pages on two CPUs), and a direct-write program writing into it.
class RegionIncrementalTest : public ::testing::Test {
 protected:
  void SetUp() override {
    RegionPlanOptions opt;
    opt.max_cpus = 2;
    opt.dw_rings = 2;
    opt.dw_slots = 4;
    opt.symbol_area_size = 64 << 10;
    opt.comm_area_size = 8 << 10;
    opt.region_id = 0x77;
    auto plan = PlanRegion(1 << 20, opt);
    ASSERT_TRUE(plan.ok()) << plan.error().message;
    geometry_ = *plan;
    mem_.assign(geometry_.region_size, std::byte{0});
    ASSERT_TRUE(InitRegionHeader(mem_, geometry_, 42).ok());
    auto guest = GuestRegion::Attach(mem_.data(), mem_.size());
    ASSERT_TRUE(guest.ok()) << guest.error().message;
    guest_.emplace(*guest);
    guest_->WriteIdentity(test_support::TestGuestIdentity());
    ASSERT_TRUE(test_support::PublishHeaderPage(*guest_));
    ASSERT_TRUE(test_support::PublishEvent(*guest_, region::kFormatKernelEvent, "sched",
                                           test_support::SchedSwitchFormat()));
    ASSERT_TRUE(
        guest_->WriteTextArea(TextAreaKind::kSymbols, 1, EncodeText("ffffffff81000000 T _text\n"))
            .ok());
    for (int i = 0; i < 3; ++i)
      pages_.push_back(Bytes(ReadFixture("pages/cpu0-" + std::to_string(i) + ".bin")));
    PushCpu(0);
    PushCpu(1);
    auto tracer = dw::Tracer::FromMemory(mem_.data(), mem_.size());
    ASSERT_TRUE(tracer.ok()) << tracer.error().message;
    tracer_ = std::move(*tracer);
    auto ev = tracer_->Register("test", "ev", {{"n", "int", 0, 4, true}});
    ASSERT_TRUE(ev.ok());
    event_ = *ev;
    WriteEvents(10);
    auto reader = IncrementalRegionReader::Create(geometry_);
    ASSERT_TRUE(reader.ok()) << reader.error().message;
    reader_ = std::move(*reader);
  }

  void PushCpu(uint32_t cpu, uint32_t flags = 0) {
    guest_->PushCpuPage(cpu, 1, pages_[pushed_++ % pages_.size()], flags);
  }
  void WriteEvents(int n) {
    for (int i = 0; i < n; ++i) {
      int32_t v = written_++;
      tracer_->Write(event_, &v, sizeof v);
    }
  }
  RegionSnapshot Full() {
    std::vector<std::byte> copy;
    CopyLiveRegion(mem_.data(), geometry_, &copy);
    auto s = ReadRegion(std::move(copy), geometry_);
    EXPECT_TRUE(s.ok());
    return std::move(*s);
  }
  // Reads both ways and expects the same.
  void Compare(const std::string& when) {
    RegionSnapshot full = Full();
    ExpectSame(full, *reader_->Read(mem_.data()), when);
  }
  template <typename T>
  T* At(uint64_t offset) {
    return reinterpret_cast<T*>(mem_.data() + offset);
  }
  region::SlotDesc* CpuDesc(uint32_t cpu, uint32_t slot) {
    return At<region::SlotDesc>(geometry_.CpuDescOffset(cpu, slot));
  }
  // What an idle read must copy: the small parts, and no page.
  uint64_t SmallParts() const {
    const RegionGeometry& g = geometry_;
    uint64_t n = region::kControlAreaSize + sizeof(region::FormatTableHeader) +
                 2 * sizeof(region::FormatEntry) + 2 * sizeof(region::TextAreaHeader);
    n += g.max_cpus * (sizeof(region::CpuRingHeader) + g.slots_per_cpu * sizeof(region::SlotDesc));
    n += g.dw_rings * (sizeof(region::DwRingHeader) + g.dw_slots * sizeof(region::SlotDesc));
    return n;
  }

  RegionGeometry geometry_;
  std::vector<std::byte> mem_;
  std::optional<GuestRegion> guest_;
  std::vector<std::vector<std::byte>> pages_;
  size_t pushed_ = 0;
  std::unique_ptr<dw::Tracer> tracer_;
  uint16_t event_ = 0;
  int32_t written_ = 0;
  std::unique_ptr<IncrementalRegionReader> reader_;
};

TEST_F(RegionIncrementalTest, FirstReadEqualsAFullRead) {
  Compare("first read");
  const RegionSnapshot full = Full();
  EXPECT_EQ(full.cpus[0].pages.size(), 1u);
  size_t dw_pages = 0;
  for (const RegionRing& ring : full.dw_rings) dw_pages += ring.pages.size();
  EXPECT_GT(dw_pages, 0u);
  EXPECT_TRUE(full.symbols.present);
  EXPECT_EQ(full.formats.size(), 3u);  // header_page, sched_switch, test:ev
}

TEST_F(RegionIncrementalTest, IdleReadsCopyNoPage) {
  reader_->Read(mem_.data());
  EXPECT_GT(reader_->pages_copied(), 0u);
  for (int i = 0; i < 3; ++i) {
    reader_->Read(mem_.data());
    EXPECT_EQ(reader_->pages_copied(), 0u);
    // Three format entries now (the dw event's).
    EXPECT_EQ(reader_->bytes_copied(), SmallParts() + sizeof(region::FormatEntry));
  }
  // One event appended to the open direct-write page: that page only.
  WriteEvents(1);
  reader_->Read(mem_.data());
  EXPECT_EQ(reader_->pages_copied(), 1u);
  EXPECT_EQ(reader_->bytes_copied(),
            SmallParts() + sizeof(region::FormatEntry) + geometry_.slot_size);
  // A CPU page pushed: that page only.
  PushCpu(1);
  reader_->Read(mem_.data());
  EXPECT_EQ(reader_->pages_copied(), 1u);
  Compare("after a push");
}

TEST_F(RegionIncrementalTest, MatchesAFullReadAfterRandomGuestWrites) {
  std::mt19937 rng(16);
  int formats = 0;
  for (int round = 0; round < 300; ++round) {
    const int ops = 1 + static_cast<int>(rng() % 4);
    for (int op = 0; op < ops; ++op) {
      switch (rng() % 10) {
        case 0:
        case 1:
          PushCpu(rng() % 2, rng() % 4 == 0 ? uint32_t{region::kSlotPartial} : 0u);
          break;
        case 2:
        case 3:
          WriteEvents(1 + static_cast<int>(rng() % 200));
          break;
        case 4: {
          // A new direct-write event: the format area changes.
          auto ev = tracer_->Register("test", "ev" + std::to_string(formats++),
                                      {{"n", "int", 0, 4, true}});
          if (ev.ok()) event_ = *ev;
          break;
        }
        case 5:
          ASSERT_TRUE(
              guest_
                  ->WriteTextArea(TextAreaKind::kComms, 1,
                                  EncodeText("1 init\n" + std::to_string(100 + round) + " sh\n"))
                  .ok());
          break;
        case 6:
          guest_->AddClockSync(round, round, round, round);
          guest_->status()->heartbeat++;
          break;
        case 7: {
          // Hostile: a seq moved (forward, backwards, odd) without content.
          region::SlotDesc* d = CpuDesc(rng() % 2, rng() % geometry_.slots_per_cpu);
          const uint32_t how = rng() % 3;
          d->seq = how == 0 ? d->seq + 2 : how == 1 ? (d->seq >= 2 ? d->seq - 2 : 0) : d->seq | 1;
          break;
        }
        case 8: {
          // Hostile: a length that lies, then the truth again some rounds later.
          region::SlotDesc* d = CpuDesc(rng() % 2, rng() % geometry_.slots_per_cpu);
          d->length = static_cast<uint32_t>(rng() % (2 * geometry_.slot_size));
          break;
        }
        case 9:
          // Hostile: a published count that lies.
          At<region::CpuRingHeader>(geometry_.CpuRingOffset(rng() % 2))->published += rng() % 3;
          break;
      }
    }
    Compare("round " + std::to_string(round));
    if (HasFatalFailure() || HasFailure()) break;
  }
}

TEST_F(RegionIncrementalTest, AnUnchangedRingIsKeptOnlyWhileWhatJudgedItIs) {
  // Generation 2 with a page of it on CPU 0; both rings then stay as they are.
  region::GuestIdentity id = test_support::TestGuestIdentity();
  id.boot_generation = 2;
  guest_->WriteIdentity(id);
  guest_->PushCpuPage(0, 2, pages_[0], 0);
  Compare("generation 2");
  Compare("idle");
  // Hostile: the generation goes back to 1. No ring byte moved, but CPU 0's
  // generation-2 page is now from the future: a kept ring would still show it.
  id.boot_generation = 1;
  guest_->WriteIdentity(id);
  RegionSnapshot* s = reader_->Read(mem_.data());
  EXPECT_EQ(s->issue_count(RegionIssue::kSlotBadGeneration), 1u);
  Compare("generation back to 1");
  Compare("idle again");  // A ring with a problem is read every time.
  id.boot_generation = 2;
  guest_->WriteIdentity(id);
  Compare("generation 2 again");
  Compare("idle at 2");
  // Generation 2's header_page arrives, a 32-bit one: its page is walked
  // with another layout, though no ring byte moved.
  ASSERT_TRUE(guest_
                  ->PublishFormat(region::kFormatHeaderPage, 2, 0, "ftrace",
                                  "\tfield: u64 timestamp;\toffset:0;\tsize:8;\tsigned:0;\n"
                                  "\tfield: local_t commit;\toffset:8;\tsize:4;\tsigned:1;\n"
                                  "\tfield: int overwrite;\toffset:8;\tsize:1;\tsigned:1;\n"
                                  "\tfield: char data;\toffset:12;\tsize:4084;\tsigned:0;\n",
                                  0)
                  .ok());
  Compare("a 32-bit header_page for generation 2");
}

TEST_F(RegionIncrementalTest, Malicious_SeqMovedWithoutContentIsCopiedAgain) {
  reader_->Read(mem_.data());
  CpuDesc(0, 0)->seq += 2;
  reader_->Read(mem_.data());
  EXPECT_EQ(reader_->pages_copied(), 1u);
  Compare("seq forward");
  CpuDesc(0, 0)->seq -= 2;  // Back to the seq the first read saw.
  reader_->Read(mem_.data());
  EXPECT_EQ(reader_->pages_copied(), 1u);
  Compare("seq backwards");
  CpuDesc(0, 0)->seq |= 1;
  RegionSnapshot* s = reader_->Read(mem_.data());
  EXPECT_EQ(s->issue_count(RegionIssue::kSlotTorn), 1u);
  EXPECT_TRUE(s->cpus[0].pages.empty());
  Compare("seq odd");
}

TEST_F(RegionIncrementalTest, Malicious_LengthLiesAreCaughtEveryRead) {
  reader_->Read(mem_.data());
  const uint32_t truth = CpuDesc(0, 0)->length;
  CpuDesc(0, 0)->length = 1 << 20;
  for (int i = 0; i < 2; ++i) {
    RegionSnapshot* s = reader_->Read(mem_.data());
    EXPECT_EQ(s->issue_count(RegionIssue::kSlotLengthOutOfRange), 1u);
    EXPECT_TRUE(s->cpus[0].pages.empty());
  }
  // Shorter than the page's commit: the commit check, not a stale walk.
  CpuDesc(0, 0)->length = 64;
  EXPECT_EQ(reader_->Read(mem_.data())->issue_count(RegionIssue::kSlotCommitPastLength), 1u);
  Compare("short length");
  CpuDesc(0, 0)->length = truth;
  EXPECT_EQ(reader_->Read(mem_.data())->cpus[0].pages.size(), 1u);
  Compare("truth again");
}

TEST_F(RegionIncrementalTest, Malicious_FormatRewrittenUnderTheSameEntryIsReadAgain) {
  reader_->Read(mem_.data());
  // The guest breaks entry 1's seq: torn in both reads, then back.
  auto* e = At<region::FormatEntry>(geometry_.FormatEntryOffset(1));
  const uint32_t seq = e->seq;
  e->seq = seq + 1;
  EXPECT_EQ(reader_->Read(mem_.data())->issue_count(RegionIssue::kFormatTorn), 1u);
  EXPECT_EQ(reader_->Read(mem_.data())->issue_count(RegionIssue::kFormatTorn), 1u);
  Compare("entry torn");
  e->seq = seq + 2;
  EXPECT_EQ(reader_->Read(mem_.data())->issue_count(RegionIssue::kFormatTorn), 0u);
  Compare("entry back");
}

TEST_F(RegionIncrementalTest, LiveReadNeverReturnsATornPage) {
  // As RegionTest.LiveCopyNeverReturnsATornPage for the full copy: a writer
  // keeps pushing numbered pages to CPU 1 while we read; a page copied while
  // it was rewritten, or whose descriptor belongs to another write, shows as
  // a mismatch between its number and its descriptor's sequence.
  const RegionGeometry g = geometry_;
  for (uint32_t s = 0; s < g.slots_per_cpu; ++s) *CpuDesc(1, s) = region::SlotDesc{};
  At<region::CpuRingHeader>(g.CpuRingOffset(1))->published = 0;
  uint64_t pages = 0, bad = 0, copied = 0;
  {
    test_support::NumberedPageWriter writer(*guest_, 1, pages_[0]);
    while (writer.written() < 2 * g.slots_per_cpu) std::this_thread::yield();
    for (int round = 0; round < 300; ++round) {
      RegionSnapshot* s = reader_->Read(mem_.data());
      copied += reader_->pages_copied();
      for (const RegionPage& p : s->cpus[1].pages) {
        bad += test_support::NumberedPageWriter::Matches(p) ? 0 : 1;
        ++pages;
      }
    }
  }
  EXPECT_GT(pages, 0u);
  EXPECT_GT(copied, 0u);
  EXPECT_EQ(bad, 0u) << "pages whose content is not the write their descriptor describes";
}

// The guest rewrites a slot exactly while the reader copies its page: the
// page is mapped without access, and the fault the copy takes is the guest's
// write (new seq and content), after which the copy resumes. The reader must
// report the slot torn, not return the half-old page, and copy it whole at
// its next read.
struct RewriteOnTouch {
  std::byte* page = nullptr;
  size_t page_size = 0;
  region::SlotDesc* desc = nullptr;
  int faults = 0;
};
RewriteOnTouch g_rewrite;

void RewriteDuringCopy(int, siginfo_t* info, void*) {
  auto* at = static_cast<std::byte*>(info->si_addr);
  if (at < g_rewrite.page || at >= g_rewrite.page + g_rewrite.page_size) std::abort();
  ::mprotect(g_rewrite.page, g_rewrite.page_size, PROT_READ | PROT_WRITE);
  g_rewrite.desc->seq += 1;  // The guest begins its write...
  std::memset(g_rewrite.page + 64, 0x5a, 64);
  g_rewrite.desc->seq += 1;  // ...and ends it before the copy resumes.
  ++g_rewrite.faults;
}

TEST_F(RegionIncrementalTest, Malicious_SlotRewrittenDuringTheCopyIsTornNotHalfRead) {
  const size_t size = geometry_.region_size;
  void* map = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(map, MAP_FAILED);
  auto* live = static_cast<std::byte*>(map);
  std::memcpy(live, mem_.data(), size);
  reader_->Read(live);
  // A new page published in CPU 0's slot 0, and the guest rewriting it again
  // while the reader copies it.
  auto* desc = reinterpret_cast<region::SlotDesc*>(live + geometry_.CpuDescOffset(0, 0));
  desc->seq += 2;
  g_rewrite = {live + geometry_.CpuPageOffset(0, 0), geometry_.slot_size, desc, 0};
  struct sigaction action {
  }, old{};
  action.sa_sigaction = RewriteDuringCopy;
  action.sa_flags = SA_SIGINFO;
  ASSERT_EQ(::sigaction(SIGSEGV, &action, &old), 0);
  ASSERT_EQ(::mprotect(g_rewrite.page, g_rewrite.page_size, PROT_NONE), 0);
  RegionSnapshot* s = reader_->Read(live);
  ::sigaction(SIGSEGV, &old, nullptr);
  EXPECT_EQ(g_rewrite.faults, 1);
  EXPECT_EQ(s->issue_count(RegionIssue::kSlotTorn), 1u);
  EXPECT_TRUE(s->cpus[0].pages.empty()) << "a page copied while the guest rewrote it";
  // The next read copies the rewritten page whole.
  s = reader_->Read(live);
  EXPECT_EQ(reader_->pages_copied(), 1u);
  EXPECT_EQ(s->issue_count(RegionIssue::kSlotTorn), 0u);
  ASSERT_EQ(s->cpus[0].pages.size(), 1u);
  EXPECT_EQ(s->cpus[0].pages[0].page[64], std::byte{0x5a});
  ::munmap(map, size);
}

TEST_F(RegionIncrementalTest, LiveGuestFromTheControlAreaAlone) {
  const RegionGuestInfo full = Full().guest;
  const RegionGuestInfo live = ReadLiveGuest(mem_.data(), geometry_);
  EXPECT_TRUE(live.present);
  EXPECT_EQ(live.boot_generation, full.boot_generation);
  EXPECT_EQ(live.kernel_release, full.kernel_release);
  EXPECT_EQ(live.nr_cpus, full.nr_cpus);
  At<region::GuestIdentity>(region::kGuestIdentityOffset)->seq |= 1;
  EXPECT_FALSE(ReadLiveGuest(mem_.data(), geometry_).present);
  At<region::GuestIdentity>(region::kGuestIdentityOffset)->nr_cpus = 5000;
  At<region::GuestIdentity>(region::kGuestIdentityOffset)->seq += 1;
  EXPECT_FALSE(ReadLiveGuest(mem_.data(), geometry_).present);
}

TEST(RegionIncremental, RefusesABadGeometry) {
  RegionGeometry g;
  g.region_size = 3;
  EXPECT_FALSE(IncrementalRegionReader::Create(g).ok());
}

}  // namespace
}  // namespace hvtrace
