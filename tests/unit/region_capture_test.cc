#include "region_capture.h"

#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>

#include <gtest/gtest.h>

#include "hvtrace/fingerprint.h"
#include "hvtrace/page.h"
#include "hvtrace/region_writer.h"
#include "hvtrace/tracedat.h"
#include "region_stream.h"
#include "test_support.h"

namespace hvtrace::hostd {
namespace {

namespace fs = std::filesystem;

std::string ReadFixture(const std::string& rel) {
  return test_support::ReadText(std::string(HVTRACE_FIXTURES_DIR) + "/" + rel);
}

std::vector<std::byte> Bytes(const std::string& s) {
  std::vector<std::byte> out(s.size());
  std::memcpy(out.data(), s.data(), s.size());
  return out;
}

// A direct-write event as programs register it (the dwtrace text shape).
constexpr uint32_t kDwId = region::kDwFirstEventId;
const char kDwFormat[] =
    "name: hvt_value\n"
    "ID: 49152\n"
    "format:\n"
    "\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n"
    "\tfield:unsigned char common_flags;\toffset:2;\tsize:1;\tsigned:0;\n"
    "\tfield:unsigned char common_preempt_count;\toffset:3;\tsize:1;\tsigned:0;\n"
    "\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;\n"
    "\n"
    "\tfield:int value;\toffset:8;\tsize:4;\tsigned:1;\n"
    "\n"
    "print fmt: \"value=%d\", REC->value\n";

struct DwPayload {
  uint16_t type;
  uint8_t flags;
  uint8_t preempt;
  int32_t pid;
  int32_t value;
  int32_t pad;
};

std::string Shell(const std::string& cmd) { return test_support::RunCommand(cmd); }

size_t Count(const std::string& hay, const std::string& needle) {
  size_t n = 0;
  for (size_t at = hay.find(needle); at != std::string::npos; at = hay.find(needle, at + 1)) ++n;
  return n;
}

// A region as hvtraced and the agent fill it: real kernel pages (this host's
// sched_switch fixture) on two CPUs and one direct-write ring with events
// written by a page writer, as the direct-write library does.
class RegionCaptureTest : public ::testing::Test {
 protected:
  void SetUp() override {
    RegionPlanOptions opt;
    opt.max_cpus = 2;
    opt.region_id = 0xabc;
    auto plan = PlanRegion(1 << 20, opt);
    ASSERT_TRUE(plan.ok()) << plan.error().message;
    geometry_ = *plan;
    mem_.assign(geometry_.region_size, std::byte{0});
    ASSERT_TRUE(InitRegionHeader(mem_, geometry_, 42).ok());
    auto guest = GuestRegion::Attach(mem_.data(), mem_.size());
    ASSERT_TRUE(guest.ok()) << guest.error().message;
    region::GuestIdentity id{};
    id.boot_generation = 1;
    std::strcpy(id.kernel_release, "6.12.9-test");
    id.nr_cpus = 2;
    id.trace_clock = region::kClockMono;
    id.page_size = 4096;
    guest->WriteIdentity(id);
    ASSERT_TRUE(guest->PublishFormat(region::kFormatHeaderPage, 1, 0, "ftrace",
                                     ReadFixture("pages/header_page.txt"), 0).ok());
    const std::string sched = ReadFixture("boot_map/formats/sched/sched_switch/format");
    auto parsed = ParseEventFormat("sched", sched);
    ASSERT_TRUE(parsed.ok());
    ASSERT_TRUE(guest->PublishFormat(region::kFormatKernelEvent, 1, parsed->id, "sched", sched,
                                     EventFingerprint(*parsed)).ok());
    auto dw = ParseEventFormat("hvtrace", kDwFormat);
    ASSERT_TRUE(dw.ok()) << dw.error().message;
    ASSERT_TRUE(guest->PublishFormat(region::kFormatDwEvent, 1, kDwId, "hvtrace", kDwFormat,
                                     EventFingerprint(*dw)).ok());
    for (int i = 0; i < 3; ++i) {
      guest->PushCpuPage(0, 1, Bytes(ReadFixture("pages/cpu0-" + std::to_string(i) + ".bin")), 0);
    }
    guest->PushCpuPage(1, 1, Bytes(ReadFixture("pages/cpu1-0.bin")), 0);
    guest_.emplace(*guest);
    WriteDwPage(0, 0, 5, 1000);
  }

  // Writes |n| events (values 0..n-1, times start, start+10, ...) as page
  // |sequence| of direct-write ring |ring|, published and closed.
  void WriteDwPage(uint32_t ring, uint64_t sequence, int n, uint64_t start, uint32_t generation = 1) {
    region::DwRingHeader* h = guest_->dw_ring(ring);
    h->pid = 77;
    h->tid = 78;
    h->boot_generation = generation;
    h->clock = region::kClockMono;
    std::strcpy(h->comm, "dwprog");
    const uint32_t slot = static_cast<uint32_t>(sequence % geometry_.dw_slots);
    std::span<std::byte> page(guest_->dw_page(ring, slot), geometry_.slot_size);
    std::fill(page.begin(), page.end(), std::byte{0});
    PageWriter w(page, PageLayout::Default(geometry_.slot_size), start);
    for (int i = 0; i < n; ++i) {
      DwPayload p{static_cast<uint16_t>(kDwId), 0, 0, 78, i, 0};
      ASSERT_TRUE(w.Append(start + 10 * static_cast<uint64_t>(i),
                           std::span(reinterpret_cast<const std::byte*>(&p), sizeof p)));
    }
    w.Finish();
    region::SlotDesc* d = guest_->dw_desc(ring, slot);
    d->seq = 2 * (sequence + 1);
    d->sequence = sequence;
    d->boot_generation = generation;
    d->length = 16 + w.used();
    d->flags = 0;
    h->published = sequence + 1;
  }

  RegionSnapshot Read() {
    auto snap = ReadRegion(mem_, geometry_);
    EXPECT_TRUE(snap.ok());
    return std::move(*snap);
  }

  fs::path TempDir() {
    dirs_.push_back(std::make_unique<test_support::TempDir>("region_capture_test"));
    EXPECT_FALSE(dirs_.back()->path().empty());
    return dirs_.back()->path();
  }

  RegionGeometry geometry_;
  std::vector<std::byte> mem_;
  std::optional<GuestRegion> guest_;
  std::vector<std::unique_ptr<test_support::TempDir>> dirs_;
};

TEST_F(RegionCaptureTest, OneTraceDatPerGenerationThatTraceCmdReads) {
  RegionSnapshot s = Read();
  ASSERT_EQ(s.issue_total(), 0u);
  const fs::path dir = TempDir();
  auto r = WriteRegionTraceDats(s, dir);
  ASSERT_TRUE(r.ok()) << r.error().message;
  ASSERT_EQ(r->generations.size(), 1u);
  const RegionGenerationFile& g = r->generations[0];
  EXPECT_EQ(g.file, "region-gen-1.trace.dat");
  EXPECT_EQ(g.dw_events, 5u);
  EXPECT_GT(g.kernel_events, 0u);
  EXPECT_EQ(g.events, g.dw_events + g.kernel_events);
  EXPECT_EQ(g.last_dw_timestamp, 1040u);
  // Kernel CPUs 0 and 1, then the direct-write ring as trace CPU 2.
  ASSERT_EQ(r->cpu_counts.size(), 2u + geometry_.dw_rings);
  EXPECT_EQ(r->cpu_counts[2].events, 5u);
  EXPECT_EQ(r->attach["rings"][2]["comm"], "dwprog");

  // Our reader and trace-cmd (an oracle nobody here wrote) agree on it.
  auto dat = TraceDat::Open((dir / g.file).string());
  ASSERT_TRUE(dat.ok()) << dat.error().message;
  if (Shell("command -v trace-cmd").empty()) GTEST_SKIP() << "trace-cmd not installed";
  const std::string report = Shell("trace-cmd report " + (dir / g.file).string() + " 2>&1");
  EXPECT_EQ(Count(report, "hvt_value:"), 5u) << report.substr(0, 2000);
  for (int i = 0; i < 5; ++i) EXPECT_NE(report.find("value=" + std::to_string(i)), std::string::npos);
  EXPECT_EQ(Count(report, "sched_switch:"), r->cpu_counts[0].events + r->cpu_counts[1].events -
                                                 g.unknown_id);
  EXPECT_NE(report.find("dwprog-78"), std::string::npos) << "saved cmdlines name the dw thread";
}

TEST_F(RegionCaptureTest, CaptureWritesRawCopyTraceDatAndManifest) {
  const fs::path dir = TempDir();
  CaptureStore store(dir);
  auto pending = store.Begin("manual", HostTime::Now());
  ASSERT_TRUE(pending.ok()) << pending.error().message;
  CaptureManifest manifest;
  manifest.vm = "t";
  manifest.trigger = "manual";
  guest_->status()->max_push_gap_ns = 123456;
  RegionCaptureOptions options;
  auto r = BuildRegionCapture(mem_, geometry_, options, **pending, manifest);
  ASSERT_TRUE(r.ok()) << r.error().message;
  auto entry = (*pending)->Commit(manifest);
  ASSERT_TRUE(entry.ok()) << entry.error().message;
  EXPECT_TRUE(fs::exists(entry->dir / "attach-region.bin"));
  EXPECT_EQ(fs::file_size(entry->dir / "attach-region.bin"), geometry_.region_size);
  EXPECT_TRUE(fs::exists(entry->dir / "region-gen-1.trace.dat"));
  std::ifstream in(entry->dir / "manifest.json");
  const nlohmann::json m = nlohmann::json::parse(in);
  EXPECT_EQ(m["extra"]["attach"]["loss_window"]["agent_max_push_gap_ns"], 123456);
  EXPECT_EQ(m["extra"]["attach"]["guest"]["kernel_release"], "6.12.9-test");
  EXPECT_EQ(m["kernel"]["release"], "6.12.9-test");
  EXPECT_EQ(m["cpus"].size(), 2u + geometry_.dw_rings);
}

TEST_F(RegionCaptureTest, OlderGenerationGetsItsOwnFile) {
  // The guest rebooted (kexec): generation 2 now; ring 1 still holds a page
  // of generation 1, whose formats are still in the table.
  region::GuestIdentity id = guest_->ReadIdentity();
  id.boot_generation = 2;
  guest_->WriteIdentity(id);
  auto dw = ParseEventFormat("hvtrace", kDwFormat);
  ASSERT_TRUE(guest_->PublishFormat(region::kFormatDwEvent, 2, kDwId, "hvtrace", kDwFormat,
                                    EventFingerprint(*dw)).ok());
  WriteDwPage(1, 0, 3, 5000, 2);
  RegionSnapshot s = Read();
  EXPECT_EQ(s.issue_total(), 0u) << s.problems[0].detail;
  auto r = WriteRegionTraceDats(s, TempDir());
  ASSERT_TRUE(r.ok()) << r.error().message;
  ASSERT_EQ(r->generations.size(), 2u);
  EXPECT_EQ(r->generations[0].file, "region-gen-1.trace.dat");
  EXPECT_EQ(r->generations[1].file, "region-gen-2.trace.dat");
  EXPECT_EQ(r->generations[1].dw_events, 3u);
  EXPECT_EQ(r->generations[1].unknown_id, 0u);
}

TEST_F(RegionCaptureTest, Malicious_TornAndBadSlotsCountedRestKept) {
  // A torn CPU slot, a direct-write page whose length cuts a record in two.
  reinterpret_cast<region::SlotDesc*>(mem_.data() + geometry_.CpuDescOffset(0, 1))->seq |= 1;
  WriteDwPage(0, 0, 5, 1000);
  guest_->dw_desc(0, 0)->length = 16 + 8 + 4;  // One record and half of the next.
  RegionSnapshot s = Read();
  EXPECT_EQ(s.issue_count(RegionIssue::kSlotTorn), 1u);
  const fs::path dir = TempDir();
  auto r = WriteRegionTraceDats(s, dir);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->cpu_counts[0].pages, 2u);
  EXPECT_EQ(r->attach["issues"]["by_reason"]["slot_torn"], 1);
  EXPECT_EQ(r->generations[0].dw_events, 0u + r->cpu_counts[2].events);
  if (Shell("command -v trace-cmd").empty()) GTEST_SKIP() << "trace-cmd not installed";
  const std::string report = Shell("trace-cmd report " + (dir / "region-gen-1.trace.dat").string() + " 2>&1");
  EXPECT_EQ(Count(report, "hvt_value:"), r->cpu_counts[2].events) << report.substr(0, 1500);
}

TEST_F(RegionCaptureTest, Malicious_FormatsThatLieAreNotUsed) {
  // The dw format entry claims another fingerprint: not used, its events are
  // counted as unknown ids, the kernel events still decode.
  for (uint32_t i = 0; i < geometry_.format_entries; ++i) {
    auto* e = reinterpret_cast<region::FormatEntry*>(mem_.data() + geometry_.FormatEntryOffset(i));
    if (e->kind == region::kFormatDwEvent) e->fingerprint ^= 1;
  }
  RegionSnapshot s = Read();
  EXPECT_EQ(s.issue_count(RegionIssue::kFormatFingerprintMismatch), 1u);
  auto r = WriteRegionTraceDats(s, TempDir());
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_GE(r->generations[0].unknown_id, 5u);
  EXPECT_GT(r->generations[0].kernel_events, 0u);
}

TEST_F(RegionCaptureTest, Malicious_RandomScribblesNeverCrash) {
  std::mt19937_64 rng(7);
  const std::vector<std::byte> clean = mem_;
  for (int round = 0; round < 40; ++round) {
    mem_ = clean;
    for (int k = 0; k < 200; ++k) {
      // Favour the control area, descriptors and page headers.
      uint64_t at = rng() % (round % 2 ? geometry_.region_size : geometry_.cpu_offset + 8192);
      mem_[at] = static_cast<std::byte>(rng());
    }
    auto s = ReadRegion(mem_, geometry_);
    ASSERT_TRUE(s.ok());
    const fs::path dir = TempDir();
    auto r = WriteRegionTraceDats(*s, dir);
    ASSERT_TRUE(r.ok()) << r.error().message;
    fs::remove_all(dir);
  }
}

// ---- Streaming ----------------------------------------------------------

std::chrono::steady_clock::time_point T(int ms) {
  return std::chrono::steady_clock::time_point(std::chrono::milliseconds(ms));
}

TEST_F(RegionCaptureTest, StreamSkipsWhatWasThereUnlessFromStart) {
  RegionStreamer now(geometry_, {});
  RegionSnapshot s1 = Read();
  EXPECT_EQ(now.Feed(&s1, T(0), true).events, 0u);
  RegionStreamer all(geometry_, RegionStreamOptions{false, true, std::chrono::milliseconds(1000)});
  RegionSnapshot s2 = Read();
  auto out = all.Feed(&s2, T(0), true);
  EXPECT_GT(out.events, 5u);
  EXPECT_EQ(Count(out.text, "hvt_value:"), 5u);
  // Plus trace-cmd's "CPU:N [EVENTS DROPPED]" lines for the fixture's pages.
  EXPECT_GE(Count(out.text, "\n"), out.events);
  EXPECT_LE(Count(out.text, "\n"), out.events + Count(out.text, "EVENTS DROPPED"));
}

TEST_F(RegionCaptureTest, StreamHoldsDirectWritesUntilTheAgentPushedPast) {
  RegionStreamer st(geometry_, {});
  RegionSnapshot s0 = Read();
  st.Feed(&s0, T(0), false);
  // New dw events at 2000.., the agent last pushed at 1500: held.
  WriteDwPage(0, 1, 3, 2000);
  guest_->status()->last_push_mono_ns = 1500;
  RegionSnapshot s1 = Read();
  auto out1 = st.Feed(&s1, T(50), false);
  EXPECT_EQ(out1.events, 0u) << out1.text;
  // A push at 2015 releases the first two (2000, 2010), not 2020.
  guest_->status()->last_push_mono_ns = 2015;
  RegionSnapshot s2 = Read();
  auto out2 = st.Feed(&s2, T(100), false);
  EXPECT_EQ(out2.events, 2u) << out2.text;
  EXPECT_NE(out2.text.find("value=1"), std::string::npos);
  // The agent stops pushing: the rest comes after max_hold anyway.
  RegionSnapshot s3 = Read();
  EXPECT_EQ(st.Feed(&s3, T(500), false).events, 0u);
  RegionSnapshot s4 = Read();
  auto out4 = st.Feed(&s4, T(1100), false);
  EXPECT_EQ(out4.events, 1u);
  EXPECT_NE(out4.text.find("value=2"), std::string::npos);
}

TEST_F(RegionCaptureTest, StreamJsonLinesAndMissedPagesNoted) {
  RegionStreamer st(geometry_, RegionStreamOptions{true, false, std::chrono::milliseconds(1000)});
  RegionSnapshot s0 = Read();
  st.Feed(&s0, T(0), false);
  // The ring wraps past what the stream saw: pages 1..dw_slots+1.
  for (uint64_t seq = 1; seq <= geometry_.dw_slots + 1; ++seq) WriteDwPage(0, seq, 1, 3000 + seq);
  RegionSnapshot s1 = Read();
  auto out = st.Feed(&s1, T(50), true);
  ASSERT_FALSE(out.notes.empty());
  EXPECT_NE(out.notes[0].find("1 page(s) overwritten"), std::string::npos) << out.notes[0];
  EXPECT_EQ(out.events, geometry_.dw_slots);
  EXPECT_NE(out.text.find("\"event\":\"hvt_value\""), std::string::npos) << out.text;
}

}  // namespace
}  // namespace hvtrace::hostd
