#include "hvtrace/dwtrace.hpp"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <map>
#include <thread>

#include "hvtrace/dwtrace.h"
#include "hvtrace/fingerprint.h"
#include "hvtrace/region_reader.h"

namespace hvtrace {
namespace {

struct Progress {
  int32_t step;
  char what[12];
  uint64_t value;
};

std::vector<dw::Field> ProgressFields() {
  return {{"step", "int", offsetof(Progress, step), 4, true},
          {"what", "char[12]", offsetof(Progress, what), 12, false},
          {"value", "unsigned long long", offsetof(Progress, value), 8, false}};
}

// A region as hostd creates it and the agent announces it, in plain memory.
class DwTest : public ::testing::Test {
 protected:
  void SetUp() override { Make(1 << 20, 2, 0); }

  void Make(uint64_t size, uint32_t cpus, uint32_t dw_rings) {
    RegionPlanOptions opt;
    opt.max_cpus = cpus;
    opt.dw_rings = dw_rings;
    auto plan = PlanRegion(size, opt);
    ASSERT_TRUE(plan.ok()) << plan.error().message;
    geometry_ = *plan;
    mem_.assign(geometry_.region_size, std::byte{0});
    ASSERT_TRUE(InitRegionHeader(mem_, geometry_, 1).ok());
    auto guest = GuestRegion::Attach(mem_.data(), mem_.size());
    ASSERT_TRUE(guest.ok());
    region::GuestIdentity id{};
    id.boot_generation = 3;
    id.nr_cpus = cpus;
    id.page_size = 4096;
    guest->WriteIdentity(id);
  }

  RegionSnapshot Snapshot() {
    std::vector<std::byte> copy;
    CopyLiveRegion(mem_.data(), geometry_, &copy);
    auto s = ReadRegion(std::move(copy), geometry_);
    EXPECT_TRUE(s.ok());
    return std::move(*s);
  }

  // Every direct-write record of the snapshot, per ring in page order.
  struct Event {
    uint64_t ts;
    uint16_t type;
    int32_t pid;
    Progress p;
  };
  static std::map<uint32_t, std::vector<Event>> Events(const RegionSnapshot& s) {
    std::map<uint32_t, std::vector<Event>> out;
    for (const RegionRing& ring : s.dw_rings) {
      for (const RegionPage& page : ring.pages) {
        PageStats stats;
        WalkPage(page.page, s.dw_layout, &stats, [&](const RawRecord& r) {
          Event e{};
          e.ts = r.timestamp;
          std::memcpy(&e.type, r.payload.data(), 2);
          std::memcpy(&e.pid, r.payload.data() + 4, 4);
          std::memcpy(&e.p, r.payload.data() + 8, std::min(sizeof(Progress), r.payload.size() - 8));
          out[ring.index].push_back(e);
        });
      }
    }
    return out;
  }

  RegionGeometry geometry_;
  std::vector<std::byte> mem_;
};

TEST_F(DwTest, RefusesARegionWithoutAnAnnouncedGuest) {
  region::GuestIdentity none{};
  auto guest = GuestRegion::Attach(mem_.data(), mem_.size());
  ASSERT_TRUE(guest.ok());
  std::memset(mem_.data() + region::kGuestIdentityOffset, 0, sizeof(none));
  EXPECT_FALSE(dw::Tracer::FromMemory(mem_.data(), mem_.size()).ok());
  std::vector<std::byte> junk(mem_.size());
  EXPECT_FALSE(dw::Tracer::FromMemory(junk.data(), junk.size()).ok());
}

TEST_F(DwTest, RegisteredFormatParsesWithItsFingerprint) {
  auto t = dw::Tracer::FromMemory(mem_.data(), mem_.size());
  ASSERT_TRUE(t.ok()) << t.error().message;
  auto id = (*t)->Register("myapp", "progress", ProgressFields());
  ASSERT_TRUE(id.ok()) << id.error().message;
  EXPECT_GE(*id, region::kDwFirstEventId);
  // Registering the same layout again in this boot gives the same id; a
  // different layout gets a new one.
  auto again = (*t)->Register("myapp", "progress", ProgressFields());
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, *id);
  auto other = (*t)->Register("myapp", "other", ProgressFields());
  ASSERT_TRUE(other.ok());
  EXPECT_NE(*other, *id);

  RegionSnapshot s = Snapshot();
  EXPECT_EQ(s.issue_total(), 0u);
  const RegionFormat* f = s.FindFormat(3, *id);
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->kind, region::kFormatDwEvent);
  EXPECT_EQ(f->system, "myapp");
  ASSERT_TRUE(f->parsed);
  EXPECT_EQ(f->parsed->name, "progress");
  EXPECT_EQ(f->fingerprint, EventFingerprint(*f->parsed));
  const FieldFormat* what = f->parsed->FindField("what");
  ASSERT_NE(what, nullptr);
  EXPECT_EQ(what->offset, 8 + offsetof(Progress, what));
  EXPECT_EQ(what->type, "char[12]");
  EXPECT_NE(
      f->text.find("print fmt: \"step=%d what=%s value=%llu\", REC->step, REC->what, REC->value"),
      std::string::npos)
      << f->text;
}

TEST_F(DwTest, RejectsBadRegistrations) {
  auto t = dw::Tracer::FromMemory(mem_.data(), mem_.size());
  ASSERT_TRUE(t.ok());
  EXPECT_FALSE((*t)->Register("my app", "x", {}).ok());
  EXPECT_FALSE((*t)->Register("app", "x", {{"a;b", "int", 0, 4, true}}).ok());
  EXPECT_FALSE((*t)->Register("app", "x", {{"a", "int;", 0, 4, true}}).ok());
  EXPECT_FALSE((*t)->Register("app", "x", {{"a", "int", 1u << 20, 4, true}}).ok());
}

TEST_F(DwTest, EveryWriteIsVisibleWhenItReturns) {
  auto t = dw::Tracer::FromMemory(mem_.data(), mem_.size());
  ASSERT_TRUE(t.ok());
  auto id = (*t)->Register("myapp", "progress", ProgressFields());
  ASSERT_TRUE(id.ok());
  // Enough events to span several pages; after each one the host's view
  // (a fresh copy) must end with exactly that event.
  const int n = 400;
  for (int i = 0; i < n; ++i) {
    Progress p{i, "step", static_cast<uint64_t>(i) * 3};
    ASSERT_TRUE((*t)->Write(*id, &p, sizeof(p)));
    if (i % 37 != 0 && i != n - 1) continue;
    RegionSnapshot s = Snapshot();
    ASSERT_EQ(s.issue_total(), 0u) << s.problems[0].detail;
    auto events = Events(s);
    ASSERT_EQ(events.size(), 1u);
    const auto& list = events.begin()->second;
    ASSERT_FALSE(list.empty());
    EXPECT_EQ(list.back().p.step, i);
    EXPECT_EQ(list.back().type, *id);
    EXPECT_EQ(list.back().pid, static_cast<int32_t>(gettid()));
  }
  RegionSnapshot s = Snapshot();
  const auto all = Events(s);
  const auto& list = all.begin()->second;
  // The ring holds dw_slots pages; everything written fits, in order.
  ASSERT_EQ(list.size(), static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    EXPECT_EQ(list[i].p.step, i);
    EXPECT_EQ(list[i].p.value, static_cast<uint64_t>(i) * 3);
    EXPECT_STREQ(list[i].p.what, "step");
    if (i > 0) {
      EXPECT_GE(list[i].ts, list[i - 1].ts);
    }
  }
  // The last page is still open; earlier ones are closed.
  const RegionRing& ring = s.dw_rings[all.begin()->first];
  EXPECT_TRUE(ring.pages.back().flags & region::kSlotOpen);
  EXPECT_FALSE(ring.pages.front().flags & region::kSlotOpen);
}

TEST_F(DwTest, ThreadsGetTheirOwnRingsAndLoseNothing) {
  auto t = dw::Tracer::FromMemory(mem_.data(), mem_.size());
  ASSERT_TRUE(t.ok());
  auto id = (*t)->Register("myapp", "progress", ProgressFields());
  ASSERT_TRUE(id.ok());
  const int threads = 3, per_thread = 150;
  std::vector<std::thread> pool;
  // Every thread holds its ring until all have written: a thread that exits
  // early frees its ring, and a later one may then take it over.
  std::atomic<int> done{0};
  for (int k = 0; k < threads; ++k) {
    pool.emplace_back([&, k] {
      for (int i = 0; i < per_thread; ++i) {
        Progress p{i, "t", static_cast<uint64_t>(k)};
        EXPECT_TRUE((*t)->Write(*id, &p, sizeof(p)));
      }
      done++;
      while (done.load() < threads) std::this_thread::yield();
    });
  }
  for (auto& th : pool) th.join();
  RegionSnapshot s = Snapshot();
  EXPECT_EQ(s.issue_total(), 0u);
  auto events = Events(s);
  ASSERT_EQ(events.size(), static_cast<size_t>(threads));
  for (const auto& [ring, list] : events) {
    ASSERT_EQ(list.size(), static_cast<size_t>(per_thread));
    for (int i = 0; i < per_thread; ++i) {
      EXPECT_EQ(list[i].p.step, i);
      EXPECT_EQ(list[i].p.value, list[0].p.value);  // One writer per ring.
    }
  }
  // The threads exited: their rings are free again.
  for (uint32_t r = 0; r < geometry_.dw_rings; ++r) {
    EXPECT_EQ(
        reinterpret_cast<region::DwRingHeader*>(mem_.data() + geometry_.DwRingOffset(r))->owner,
        0u);
  }
}

TEST_F(DwTest, MoreThreadsThanRingsDropAndCount) {
  Make(1 << 20, 1, 1);
  auto t = dw::Tracer::FromMemory(mem_.data(), mem_.size());
  ASSERT_TRUE(t.ok());
  auto id = (*t)->Register("myapp", "progress", ProgressFields());
  ASSERT_TRUE(id.ok());
  Progress p{1, "main", 0};
  ASSERT_TRUE((*t)->Write(*id, &p, sizeof(p)));  // The main thread holds the one ring.
  bool other_ok = true;
  std::thread([&] { other_ok = (*t)->Write(*id, &p, sizeof(p)); }).join();
  EXPECT_FALSE(other_ok);
  auto* status = reinterpret_cast<region::GuestStatus*>(mem_.data() + region::kGuestStatusOffset);
  EXPECT_EQ(status->dw_rings_exhausted, 1u);
  // Too large for a page: dropped and counted on the ring.
  std::vector<char> big(8192);
  EXPECT_FALSE((*t)->Write(*id, big.data(), static_cast<uint32_t>(big.size())));
}

TEST_F(DwTest, RingWrapKeepsTheNewestPagesWhole) {
  auto t = dw::Tracer::FromMemory(mem_.data(), mem_.size());
  ASSERT_TRUE(t.ok());
  auto id = (*t)->Register("myapp", "progress", ProgressFields());
  ASSERT_TRUE(id.ok());
  const int n = 5000;  // Far more than dw_slots pages hold.
  for (int i = 0; i < n; ++i) {
    Progress p{i, "w", 0};
    ASSERT_TRUE((*t)->Write(*id, &p, sizeof(p)));
  }
  RegionSnapshot s = Snapshot();
  EXPECT_EQ(s.issue_total(), 0u);
  const auto all = Events(s);
  const auto& list = all.begin()->second;
  ASSERT_FALSE(list.empty());
  EXPECT_EQ(list.back().p.step, n - 1);
  for (size_t i = 1; i < list.size(); ++i) EXPECT_EQ(list[i].p.step, list[i - 1].p.step + 1);
}

TEST(DwCApi, OpensAFileWritesAndCloses) {
  char path[] = "/dev/shm/hvtrace-dwtest-XXXXXX";
  const int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  const uint64_t size = 1 << 20;
  ASSERT_EQ(ftruncate(fd, size), 0);
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ASSERT_NE(p, MAP_FAILED);
  std::span<std::byte> mem(static_cast<std::byte*>(p), size);
  RegionPlanOptions opt;
  auto g = PlanRegion(size, opt);
  ASSERT_TRUE(g.ok());
  ASSERT_TRUE(InitRegionHeader(mem, *g, 1).ok());

  EXPECT_EQ(hvt_dw_write(1, "x", 1), -EBADF);
  EXPECT_EQ(hvt_dw_open(path), -EAGAIN);  // No agent announcement yet.
  auto guest = GuestRegion::Attach(mem.data(), size);
  ASSERT_TRUE(guest.ok());
  region::GuestIdentity id{};
  id.boot_generation = 1;
  id.nr_cpus = 1;
  guest->WriteIdentity(id);
  ASSERT_EQ(hvt_dw_open(path), 0);
  const hvt_dw_field fields[] = {{"step", "int", 0, 4, 1}, {"what", "char[12]", 4, 12, 0}};
  const int ev = hvt_dw_register("capp", "mark", fields, 2, nullptr);
  ASSERT_GT(ev, 0);
  struct {
    int32_t step;
    char what[12];
  } e = {7, "hello"};
  EXPECT_EQ(hvt_dw_write(ev, &e, sizeof(e)), 0);
  hvt_dw_close();

  std::vector<std::byte> copy(mem.begin(), mem.end());
  auto s = ReadRegion(std::move(copy), *g);
  ASSERT_TRUE(s.ok());
  ASSERT_NE(s->FindFormat(1, static_cast<uint32_t>(ev)), nullptr);
  uint64_t records = 0;
  for (const RegionRing& ring : s->dw_rings) {
    for (const RegionPage& page : ring.pages) records += page.records;
  }
  EXPECT_EQ(records, 1u);
  munmap(p, size);
  close(fd);
  unlink(path);
}

// The records the fast path does not write: payloads past 112 bytes (a
// length word), time gaps past 27 bits (a TIME_EXTEND first), odd sizes
// (padding) and a payload that does not fit the rest of a page. The host's
// walker must read every one back whole, with its time.
TEST_F(DwTest, AutoClockIsTheTscOnlyWithClockSyncSamplesAndATrustedInvariantTsc) {
  // No clock-sync samples in the region: the host could not convert TSC
  // stamps, so kAuto stays on CLOCK_MONOTONIC whatever the CPU.
  auto before = dw::Tracer::FromMemory(mem_.data(), mem_.size());
  ASSERT_TRUE(before.ok());
  EXPECT_EQ((*before)->clock(), dw::Clock::kMonotonic);
  // The agent's two samples: then the CPU and the kernel decide.
  auto guest = GuestRegion::Attach(mem_.data(), mem_.size());
  ASSERT_TRUE(guest.ok());
  guest->AddClockSync(1000, 0, 0, 3000);
  guest->AddClockSync(2000, 0, 0, 6000);
  auto after = dw::Tracer::FromMemory(mem_.data(), mem_.size());
  ASSERT_TRUE(after.ok());
  const bool tsc = dw::HasInvariantTsc() && dw::KernelTrustsTsc();
  EXPECT_EQ((*after)->clock(), tsc ? dw::Clock::kTsc : dw::Clock::kMonotonic);
  std::printf("this machine: TSC %s, kernel %s it: Clock::kAuto = %s\n",
              dw::HasInvariantTsc() ? "invariant" : "not invariant",
              dw::KernelTrustsTsc() ? "trusts" : "does not trust", tsc ? "TSC" : "CLOCK_MONOTONIC");
  // Forcing a clock is always obeyed.
  EXPECT_EQ((*dw::Tracer::FromMemory(mem_.data(), mem_.size(), dw::Clock::kMonotonic))->clock(),
            dw::Clock::kMonotonic);
  auto forced = dw::Tracer::FromMemory(mem_.data(), mem_.size(), dw::Clock::kTsc);
  ASSERT_TRUE(forced.ok());
  EXPECT_EQ((*forced)->clock(), dw::Clock::kTsc);
  // Each page says which clock stamped it (a ring changes hands).
  auto id = (*forced)->Register("myapp", "tick", {{"n", "int", 0, 4, true}});
  ASSERT_TRUE(id.ok());
  const int n = 1;
  ASSERT_TRUE((*forced)->Write(*id, &n, sizeof n));
  RegionSnapshot s = Snapshot();
  size_t pages = 0;
  for (const RegionRing& ring : s.dw_rings) {
    for (const RegionPage& p : ring.pages) {
      EXPECT_EQ(p.clock, region::kClockTsc);
      ++pages;
    }
  }
  EXPECT_EQ(pages, 1u);
}

TEST_F(DwTest, LargeRecordsTimeGapsAndPaddingReadBackWhole) {
  auto t = dw::Tracer::FromMemory(mem_.data(), mem_.size(), dw::Clock::kMonotonic);
  ASSERT_TRUE(t.ok());
  auto id = (*t)->Register("myapp", "blob", {{"data", "char[2000]", 0, 2000, false}});
  ASSERT_TRUE(id.ok()) << id.error().message;
  // The tail covers each branch of the fast path's inline payload copy.
  std::vector<uint32_t> sizes = {1,    3, 5,  103, 104, 105, 200, 1999, 2000, 7,  2000,
                                 2000, 8, 13, 15,  16,  17,  24,  31,   32,   33, 0};
  std::vector<uint64_t> before;
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (i == 4) std::this_thread::sleep_for(std::chrono::milliseconds(160));  // > 2^27 ns.
    std::vector<uint8_t> blob(sizes[i]);
    for (uint32_t k = 0; k < sizes[i]; ++k) blob[k] = static_cast<uint8_t>(i * 31 + k);
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    before.push_back(static_cast<uint64_t>(ts.tv_sec) * 1000000000ull +
                     static_cast<uint64_t>(ts.tv_nsec));
    ASSERT_TRUE((*t)->Write(*id, blob.data(), sizes[i])) << i;
  }
  RegionSnapshot s = Snapshot();
  ASSERT_EQ(s.issue_total(), 0u) << s.problems[0].detail;
  std::vector<RawRecord> got;
  std::vector<std::vector<std::byte>> payloads;
  for (const RegionRing& ring : s.dw_rings) {
    for (const RegionPage& page : ring.pages) {
      PageStats stats;
      EXPECT_EQ(WalkPage(page.page, s.dw_layout, &stats,
                         [&](const RawRecord& r) {
                           got.push_back(r);
                           payloads.emplace_back(r.payload.begin(), r.payload.end());
                         }),
                PageError::kOk);
    }
  }
  ASSERT_EQ(got.size(), sizes.size());
  for (size_t i = 0; i < sizes.size(); ++i) {
    ASSERT_GE(payloads[i].size(), 8 + sizes[i]) << i;
    EXPECT_LT(payloads[i].size(), 8 + sizes[i] + 4) << i;
    for (uint32_t k = 0; k < sizes[i]; ++k) {
      ASSERT_EQ(static_cast<uint8_t>(payloads[i][8 + k]), static_cast<uint8_t>(i * 31 + k))
          << i << " byte " << k;
    }
    for (size_t k = 8 + sizes[i]; k < payloads[i].size(); ++k)
      EXPECT_EQ(payloads[i][k], std::byte{0}) << i;
    EXPECT_GE(got[i].timestamp, before[i]) << i;
    if (i + 1 < sizes.size()) {
      EXPECT_LE(got[i].timestamp, before[i + 1]) << i;
    }
  }
  EXPECT_GE(got[4].timestamp - got[3].timestamp, 150000000u);
}

// A region file as hostd creates it, announced as the agent does.
std::string MakeRegionFile(const std::string& path, uint64_t region_id) {
  const uint64_t size = 1 << 20;
  RegionPlanOptions opt;
  opt.region_id = region_id;
  auto g = PlanRegion(size, opt);
  EXPECT_TRUE(g.ok());
  std::vector<std::byte> mem(size);
  EXPECT_TRUE(InitRegionHeader(mem, *g, 1).ok());
  auto guest = GuestRegion::Attach(mem.data(), size);
  EXPECT_TRUE(guest.ok());
  region::GuestIdentity id{};
  id.boot_generation = 1;
  id.nr_cpus = 1;
  guest->WriteIdentity(id);
  const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  EXPECT_GE(fd, 0);
  EXPECT_EQ(write(fd, mem.data(), size), static_cast<ssize_t>(size));
  close(fd);
  return path;
}

// The host goes away while a program writes: the file shrinks to nothing
// (every access to its mapping then raises SIGBUS, as a removed BAR does),
// then a new region appears at the same path with another program's event
// already holding the id ours had. Writes in between are dropped and
// counted; afterwards they land in the new region under the new id.
TEST(DwReattach, SurvivesTheRegionGoingAwayAndFollowsANewOne) {
  char tmpl[] = "/dev/shm/hvtrace-dwreattach-XXXXXX";
  const int tfd = mkstemp(tmpl);
  ASSERT_GE(tfd, 0);
  close(tfd);
  const std::string path = MakeRegionFile(tmpl, 0x111);
  auto t = dw::Tracer::Open(path, dw::Clock::kMonotonic);
  ASSERT_TRUE(t.ok()) << t.error().message;
  auto id = (*t)->Register("myapp", "progress", ProgressFields());
  ASSERT_TRUE(id.ok());
  Progress p{1, "before", 1};
  EXPECT_TRUE((*t)->Write(*id, &p, sizeof(p)));

  const uint64_t faults = RegionBusFaults();
  ASSERT_EQ(truncate(path.c_str(), 0), 0);
  std::atomic<uint64_t> other_thread_drops{0};
  std::thread other([&] {
    for (int i = 0; i < 100; ++i) other_thread_drops += (*t)->Write(*id, &p, sizeof(p)) ? 0 : 1;
  });
  for (int i = 0; i < 100; ++i) EXPECT_FALSE((*t)->Write(*id, &p, sizeof(p)));
  other.join();
  EXPECT_EQ(other_thread_drops.load(), 100u);
  EXPECT_GT(RegionBusFaults(), faults);
  EXPECT_GE((*t)->dropped_detached(), 200u);
  EXPECT_FALSE((*t)->attached());

  // The new region: another program registered first and got the id ours had.
  unlink(path.c_str());
  MakeRegionFile(path, 0x222);
  const int fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
  void* mem = mmap(nullptr, 1 << 20, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  ASSERT_NE(mem, MAP_FAILED);
  auto* base = static_cast<std::byte*>(mem);
  uint16_t other_id = 0;
  {
    auto first = dw::Tracer::FromMemory(base, 1 << 20, dw::Clock::kMonotonic);
    ASSERT_TRUE(first.ok());
    auto oid = (*first)->Register("otherapp", "thing", {{"x", "int", 0, 4, true}});
    ASSERT_TRUE(oid.ok());
    other_id = *oid;
  }
  EXPECT_EQ(other_id, *id);
  bool back = false;
  for (int i = 0; i < 400 && !back; ++i) {
    p.step = 2;
    std::snprintf(p.what, sizeof(p.what), "after");
    back = (*t)->Write(*id, &p, sizeof(p));
    if (!back) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_TRUE(back) << "never followed the new region";
  EXPECT_EQ((*t)->reattaches(), 1u);
  EXPECT_TRUE((*t)->attached());

  auto g = PlanRegion(1 << 20, RegionPlanOptions{.region_id = 0x222});
  ASSERT_TRUE(g.ok());
  std::vector<std::byte> copy;
  CopyLiveRegion(base, *g, &copy);
  auto s = ReadRegion(std::move(copy), *g);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->issue_total(), 0u);
  uint64_t ours = 0;
  for (const RegionRing& ring : s->dw_rings) {
    for (const RegionPage& page : ring.pages) {
      PageStats stats;
      WalkPage(page.page, s->dw_layout, &stats, [&](const RawRecord& r) {
        uint16_t type;
        std::memcpy(&type, r.payload.data(), 2);
        const RegionFormat* f = s->FindFormat(1, type);
        ASSERT_NE(f, nullptr);
        EXPECT_EQ(f->parsed->name, "progress") << "written under the other program's id";
        EXPECT_NE(type, other_id);
        ++ours;
        EXPECT_EQ(std::string(reinterpret_cast<const char*>(r.payload.data()) + 12), "after");
      });
    }
  }
  EXPECT_EQ(ours, 1u);
  munmap(mem, 1 << 20);
  unlink(path.c_str());
}

}  // namespace
}  // namespace hvtrace
