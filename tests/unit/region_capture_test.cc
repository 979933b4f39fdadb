#include "region_capture.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <sstream>

#include "capture_service.h"
#include "hvtrace/fingerprint.h"
#include "hvtrace/page.h"
#include "hvtrace/region_text.h"
#include "hvtrace/region_writer.h"
#include "hvtrace/tracedat.h"
#include "live_region.h"
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
    opt.symbol_area_size = 64 << 10;  // Small regions get none by default.
    opt.comm_area_size = 8 << 10;
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
    ASSERT_TRUE(guest
                    ->PublishFormat(region::kFormatHeaderPage, 1, 0, "ftrace",
                                    ReadFixture("pages/header_page.txt"), 0)
                    .ok());
    const std::string sched = ReadFixture("boot_map/formats/sched/sched_switch/format");
    auto parsed = ParseEventFormat("sched", sched);
    ASSERT_TRUE(parsed.ok());
    ASSERT_TRUE(guest
                    ->PublishFormat(region::kFormatKernelEvent, 1, parsed->id, "sched", sched,
                                    EventFingerprint(*parsed))
                    .ok());
    auto dw = ParseEventFormat("hvtrace", kDwFormat);
    ASSERT_TRUE(dw.ok()) << dw.error().message;
    ASSERT_TRUE(guest
                    ->PublishFormat(region::kFormatDwEvent, 1, kDwId, "hvtrace", kDwFormat,
                                    EventFingerprint(*dw))
                    .ok());
    for (int i = 0; i < 3; ++i) {
      guest->PushCpuPage(0, 1, Bytes(ReadFixture("pages/cpu0-" + std::to_string(i) + ".bin")), 0);
    }
    guest->PushCpuPage(1, 1, Bytes(ReadFixture("pages/cpu1-0.bin")), 0);
    guest_.emplace(*guest);
    WriteDwPage(0, 0, 5, 1000);
  }

  // Writes |n| events (values 0..n-1, times start, start+10, ...) as page
  // |sequence| of direct-write ring |ring|, published and closed.
  void WriteDwPage(uint32_t ring, uint64_t sequence, int n, uint64_t start, uint32_t generation = 1,
                   uint64_t step = 10) {
    region::DwRingHeader* h = guest_->dw_ring(ring);
    h->pid = 77;
    h->tid = 78;
    h->boot_generation = generation;
    h->clock = dw_clock_;
    std::strcpy(h->comm, "dwprog");
    const uint32_t slot = static_cast<uint32_t>(sequence % geometry_.dw_slots);
    std::span<std::byte> page(guest_->dw_page(ring, slot), geometry_.slot_size);
    std::fill(page.begin(), page.end(), std::byte{0});
    PageWriter w(page, PageLayout::Default(geometry_.slot_size), start);
    for (int i = 0; i < n; ++i) {
      DwPayload p{static_cast<uint16_t>(kDwId), 0, 0, 78, i, 0};
      ASSERT_TRUE(w.Append(start + step * static_cast<uint64_t>(i),
                           std::span(reinterpret_cast<const std::byte*>(&p), sizeof p)));
    }
    w.Finish();
    region::SlotDesc* d = guest_->dw_desc(ring, slot);
    d->seq = 2 * (sequence + 1);
    d->sequence = sequence;
    d->boot_generation = generation;
    d->length = 16 + w.used();
    d->flags = 0;
    d->clock = dw_clock_;
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

  uint32_t dw_clock_ = region::kClockMono;
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
  for (int i = 0; i < 5; ++i)
    EXPECT_NE(report.find("value=" + std::to_string(i)), std::string::npos);
  EXPECT_EQ(Count(report, "sched_switch:"),
            r->cpu_counts[0].events + r->cpu_counts[1].events - g.unknown_id);
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
  ASSERT_TRUE(guest_
                  ->PublishFormat(region::kFormatDwEvent, 2, kDwId, "hvtrace", kDwFormat,
                                  EventFingerprint(*dw))
                  .ok());
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
  const std::string report =
      Shell("trace-cmd report " + (dir / "region-gen-1.trace.dat").string() + " 2>&1");
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

// An event printing a kernel pointer with %ps (as ftrace's print does with
// its ip), written by task 4242, which only the guest's saved_cmdlines names.
const char kFnFormat[] =
    "name: hvt_fn\n"
    "ID: 49153\n"
    "format:\n"
    "\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n"
    "\tfield:unsigned char common_flags;\toffset:2;\tsize:1;\tsigned:0;\n"
    "\tfield:unsigned char common_preempt_count;\toffset:3;\tsize:1;\tsigned:0;\n"
    "\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;\n"
    "\n"
    "\tfield:unsigned long ip;\toffset:8;\tsize:8;\tsigned:0;\n"
    "\n"
    "print fmt: \"%ps: here\", (void *)REC->ip\n";

TEST_F(RegionCaptureTest, GuestSymbolsAndTaskNamesReachStreamAndCapture) {
  auto fn = ParseEventFormat("hvtrace", kFnFormat);
  ASSERT_TRUE(fn.ok()) << fn.error().message;
  ASSERT_TRUE(guest_
                  ->PublishFormat(region::kFormatDwEvent, 1, kDwId + 1, "hvtrace", kFnFormat,
                                  EventFingerprint(*fn))
                  .ok());
  const std::string used =
      "ffffffffa01a2b30 t tracing_mark_write\nffffffffa01a2c00 T next_function\n";
  const std::string symbols = "ffffffffa0000000 T _text\nffffffffa0100000 T unused_middle\n" +
                              used + "ffffffffa0ff0000 T far_away\n";
  ASSERT_TRUE(guest_->WriteTextArea(TextAreaKind::kSymbols, 1, EncodeText(symbols)).ok());
  ASSERT_TRUE(guest_->WriteTextArea(TextAreaKind::kComms, 1, EncodeText("4242 worker one\n")).ok());
  const uint32_t slot = 1;
  std::span<std::byte> page(guest_->dw_page(1, slot), geometry_.slot_size);
  PageWriter w(page, PageLayout::Default(geometry_.slot_size), 5000);
  struct {
    uint16_t type;
    uint8_t flags, preempt;
    int32_t pid;
    uint64_t ip;
  } rec{static_cast<uint16_t>(kDwId + 1), 0, 0, 4242, 0xffffffffa01a2b47ull};
  ASSERT_TRUE(w.Append(5000, std::span(reinterpret_cast<const std::byte*>(&rec), sizeof rec)));
  w.Finish();
  region::DwRingHeader* h = guest_->dw_ring(1);
  h->tid = 4243;
  h->clock = region::kClockMono;
  std::strcpy(h->comm, "other");
  region::SlotDesc* d = guest_->dw_desc(1, slot);
  d->seq = 2;
  d->sequence = 1;
  d->boot_generation = 1;
  d->length = 16 + w.used();
  d->clock = region::kClockMono;
  h->published = 2;
  const std::string want = "worker one-4242";

  RegionStreamer st(geometry_, RegionStreamOptions{false, true, std::chrono::milliseconds(1000)});
  RegionSnapshot s = Read();
  auto out = st.Feed(&s, T(0), true);
  EXPECT_NE(out.text.find("hvt_fn:               tracing_mark_write: here"), std::string::npos)
      << out.text;
  EXPECT_NE(out.text.find(want), std::string::npos) << out.text;
  EXPECT_EQ(s.issue_total(), 0u);
  RegionStreamer js(geometry_, RegionStreamOptions{true, true, std::chrono::milliseconds(1000)});
  RegionSnapshot sj = Read();
  const std::string json_text = js.Feed(&sj, T(0), true).text;
  EXPECT_NE(json_text.find(R"("event":"hvt_fn","system":"hvtrace","pid":4242,"comm":"worker one")"),
            std::string::npos)
      << json_text;

  RegionSnapshot c = Read();
  RegionTextCache texts;
  texts.Update(&c);
  const fs::path dir = TempDir();
  auto r = WriteRegionTraceDats(c, dir, &texts);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->attach["names"]["per_generation"]["1"]["symbols"], 5);
  // The file carries the symbols the events' values fall in and the next
  // ones (their ends), not the others.
  EXPECT_LT(r->attach["names"]["per_generation"]["1"]["symbols_in_file"].get<int>(), 5);
  EXPECT_EQ(r->attach["names"]["per_generation"]["1"]["guest_tasks"], 1);
  auto dat = TraceDat::Open((dir / "region-gen-1.trace.dat").string());
  ASSERT_TRUE(dat.ok()) << dat.error().message;
  EXPECT_NE(dat->kallsyms().find(used), std::string::npos) << dat->kallsyms();
  EXPECT_EQ(dat->kallsyms().find("unused_middle"), std::string::npos) << dat->kallsyms();
  if (Shell("command -v trace-cmd").empty()) GTEST_SKIP() << "trace-cmd not installed";
  const std::string report =
      Shell("trace-cmd report " + (dir / "region-gen-1.trace.dat").string() + " 2>&1");
  EXPECT_NE(report.find("tracing_mark_write: here"), std::string::npos) << report;
  EXPECT_NE(report.find(want), std::string::npos) << report;
}

TEST_F(RegionCaptureTest, StreamWaitsOnePushSoTaskNamesPublishedWithItAreUsed) {
  auto fn = ParseEventFormat("hvtrace", kFnFormat);
  ASSERT_TRUE(fn.ok());
  ASSERT_TRUE(guest_
                  ->PublishFormat(region::kFormatDwEvent, 1, kDwId + 1, "hvtrace", kFnFormat,
                                  EventFingerprint(*fn))
                  .ok());
  RegionStreamer st(geometry_, {});
  guest_->status()->last_push_mono_ns = 4000;
  RegionSnapshot s0 = Read();
  st.Feed(&s0, T(0), false);
  // An event of task 5151, whose name the kernel records only at its next
  // switch: the push at 5010 brings the event, not yet the name.
  std::span<std::byte> page(guest_->dw_page(2, 0), geometry_.slot_size);
  PageWriter w(page, PageLayout::Default(geometry_.slot_size), 5000);
  struct {
    uint16_t type;
    uint8_t flags, preempt;
    int32_t pid;
    uint64_t ip;
  } rec{static_cast<uint16_t>(kDwId + 1), 0, 0, 5151, 0x1234};
  ASSERT_TRUE(w.Append(5000, std::span(reinterpret_cast<const std::byte*>(&rec), sizeof rec)));
  w.Finish();
  region::SlotDesc* d = guest_->dw_desc(2, 0);
  d->seq = 2;
  d->boot_generation = 1;
  d->length = 16 + w.used();
  d->clock = region::kClockMono;
  guest_->dw_ring(2)->clock = region::kClockMono;
  guest_->dw_ring(2)->published = 1;
  guest_->status()->last_push_mono_ns = 5010;
  RegionSnapshot s1 = Read();
  EXPECT_EQ(st.Feed(&s1, T(50), false).events, 0u);
  // The next push comes with the name.
  ASSERT_TRUE(guest_->WriteTextArea(TextAreaKind::kComms, 1, EncodeText("5151 late name\n")).ok());
  guest_->status()->last_push_mono_ns = 5060;
  RegionSnapshot s2 = Read();
  auto out = st.Feed(&s2, T(100), false);
  EXPECT_EQ(out.events, 1u);
  EXPECT_NE(out.text.find("late name-5151"), std::string::npos) << out.text;
}

TEST_F(RegionCaptureTest, Malicious_LyingTextAreasLeaveAddressesAndAreReported) {
  auto fn = ParseEventFormat("hvtrace", kFnFormat);
  ASSERT_TRUE(fn.ok());
  ASSERT_TRUE(guest_
                  ->WriteTextArea(TextAreaKind::kSymbols, 1,
                                  EncodeText("ffffffff811a2b30 t tracing_mark_write\n"))
                  .ok());
  auto* sym = reinterpret_cast<region::TextAreaHeader*>(mem_.data() + geometry_.symbol_offset);
  sym->crc32 ^= 1;
  auto* comm = reinterpret_cast<region::TextAreaHeader*>(mem_.data() + geometry_.comm_offset);
  comm->seq = 7;  // Torn.
  const fs::path dir = TempDir();
  CaptureStore store(dir);
  auto pending = store.Begin("manual", HostTime::Now());
  ASSERT_TRUE(pending.ok());
  CaptureManifest manifest;
  auto r = BuildRegionCapture(mem_, geometry_, RegionCaptureOptions{}, **pending, manifest);
  ASSERT_TRUE(r.ok()) << r.error().message;
  const auto& by = manifest.extra["attach"]["issues"]["by_reason"];
  EXPECT_EQ(by["symbols_bad"], 1) << manifest.extra["attach"]["issues"].dump(2);
  EXPECT_EQ(by["comms_torn"], 1) << manifest.extra["attach"]["issues"].dump(2);
  EXPECT_EQ(r->attach["names"]["per_generation"]["1"]["symbols"], 0);
  EXPECT_GT(r->events, 0u) << "the events are kept";
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
  // A push at 2015 brought what the kernel wrote before it; the next push
  // (with the task names refreshed) releases the first two (2000, 2010),
  // not 2020.
  guest_->status()->last_push_mono_ns = 2015;
  RegionSnapshot s15 = Read();
  EXPECT_EQ(st.Feed(&s15, T(80), false).events, 0u);
  guest_->status()->last_push_mono_ns = 2065;
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

// ---- Direct-write rings stamped with the TSC ----------------------------

// A 3 GHz TSC with an offset: what the clock-sync samples say.
uint64_t TscAt(uint64_t mono_ns) { return 3 * mono_ns + 777; }

// The kernel events' times in the fixture pages, sorted.
std::vector<uint64_t> KernelTimes(const RegionSnapshot& s) {
  std::vector<uint64_t> t;
  for (const RegionRing& ring : s.cpus) {
    for (const RegionPage& p : ring.pages) {
      PageStats stats;
      WalkPage(p.page, s.cpu_layout, &stats, [&](const RawRecord& r) { t.push_back(r.timestamp); });
    }
  }
  std::sort(t.begin(), t.end());
  return t;
}

// The middle of the widest gap between two kernel events.
uint64_t MidOfWidestGap(const std::vector<uint64_t>& t) {
  uint64_t best = 0, at = 0;
  for (size_t i = 1; i < t.size(); ++i) {
    if (t[i] - t[i - 1] > best) {
      best = t[i] - t[i - 1];
      at = t[i - 1] + best / 2;
    }
  }
  return at;
}

// ts_ns of every JSON line, in output order, and those of hvt_value events.
void JsonTimes(const std::string& text, std::vector<uint64_t>* all, std::vector<uint64_t>* dw) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_object() || !j.contains("ts_ns") || !j["ts_ns"].is_number_unsigned()) continue;
    all->push_back(j["ts_ns"].get<uint64_t>());
    if (j.contains("event") && j["event"] == "hvt_value") dw->push_back(j["ts_ns"].get<uint64_t>());
  }
}

// A kernel event the test's own CPU pages carry (the fixture pages' events
// have ids no published format names, and trace-cmd stops at those).
constexpr uint32_t kKernelId = 500;
const char kKernelFormat[] =
    "name: kmark\n"
    "ID: 500\n"
    "format:\n"
    "\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n"
    "\tfield:unsigned char common_flags;\toffset:2;\tsize:1;\tsigned:0;\n"
    "\tfield:unsigned char common_preempt_count;\toffset:3;\tsize:1;\tsigned:0;\n"
    "\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;\n"
    "\n"
    "\tfield:int value;\toffset:8;\tsize:4;\tsigned:1;\n"
    "\n"
    "print fmt: \"k=%d\", REC->value\n";

TEST_F(RegionCaptureTest, TscStampsArePutOnTheKernelsClockInCaptureAndStream) {
  // A region with only the test's events: kernel kmark k=0..3 on CPU 1 at
  // t0 + 0, 10, 20, 30 us; direct writes value=0..2 stamped with the TSC at
  // t0 + 5, 15, 25 us.
  std::fill(mem_.begin(), mem_.end(), std::byte{0});
  ASSERT_TRUE(InitRegionHeader(mem_, geometry_, 42).ok());
  auto guest = GuestRegion::Attach(mem_.data(), mem_.size());
  ASSERT_TRUE(guest.ok());
  guest_.emplace(*guest);
  region::GuestIdentity id{};
  id.boot_generation = 1;
  id.nr_cpus = 2;
  id.trace_clock = region::kClockMono;
  id.page_size = 4096;
  guest_->WriteIdentity(id);
  ASSERT_TRUE(guest_
                  ->PublishFormat(region::kFormatHeaderPage, 1, 0, "ftrace",
                                  ReadFixture("pages/header_page.txt"), 0)
                  .ok());
  auto kf = ParseEventFormat("test", kKernelFormat);
  ASSERT_TRUE(kf.ok()) << kf.error().message;
  ASSERT_TRUE(guest_
                  ->PublishFormat(region::kFormatKernelEvent, 1, kKernelId, "test", kKernelFormat,
                                  EventFingerprint(*kf))
                  .ok());
  auto dwf = ParseEventFormat("hvtrace", kDwFormat);
  ASSERT_TRUE(guest_
                  ->PublishFormat(region::kFormatDwEvent, 1, kDwId, "hvtrace", kDwFormat,
                                  EventFingerprint(*dwf))
                  .ok());
  const uint64_t t0 = 2000000000000ull;  // 2000 s after the guest's boot.
  std::vector<std::byte> kpage(geometry_.slot_size);
  PageWriter kw(kpage, PageLayout::Default(geometry_.slot_size), t0);
  for (int i = 0; i < 4; ++i) {
    DwPayload p{static_cast<uint16_t>(kKernelId), 0, 0, 1, i, 0};
    ASSERT_TRUE(kw.Append(t0 + 10000 * static_cast<uint64_t>(i),
                          std::span(reinterpret_cast<const std::byte*>(&p), sizeof p)));
  }
  kw.Finish();
  guest_->PushCpuPage(1, 1, kpage, 0);
  // Samples a second apart around the events, as the agent takes them.
  for (uint64_t m : {t0 - 1000000000, t0, t0 + 1000000000})
    guest_->AddClockSync(m, m + 5, m + 7, TscAt(m));
  dw_clock_ = region::kClockTsc;
  WriteDwPage(0, 0, 3, TscAt(t0 + 5000), 1, 30000);  // 10 us apart at 3 GHz.

  RegionSnapshot s = Read();
  EXPECT_EQ(s.issue_total(), 0u) << s.problems[0].detail;
  const fs::path dir = TempDir();
  auto r = WriteRegionTraceDats(s, dir);
  ASSERT_TRUE(r.ok()) << r.error().message;
  ASSERT_EQ(r->generations.size(), 1u) << "no separate file for a ring that could be converted";
  const RegionGenerationFile& g = r->generations[0];
  EXPECT_EQ(g.dw_events, 3u);
  EXPECT_EQ(g.kernel_events, 4u);
  EXPECT_EQ(g.first_timestamp, t0);
  EXPECT_EQ(g.last_dw_timestamp, t0 + 25000);
  EXPECT_EQ(g.last_timestamp, t0 + 30000);
  EXPECT_EQ(r->attach["rings"][2]["clock"], "x86-tsc");
  EXPECT_EQ(r->attach["rings"][2]["time_stamps"], "converted to mono");
  EXPECT_EQ(r->attach["clock_sync"]["sound"], 3);

  // Stream (JSON for the exact ns): kernel and direct writes alternate.
  RegionStreamer st(geometry_, RegionStreamOptions{true, true, std::chrono::milliseconds(1000)});
  RegionSnapshot s2 = Read();
  auto out = st.Feed(&s2, T(0), true);
  std::vector<uint64_t> all, dw;
  JsonTimes(out.text, &all, &dw);
  EXPECT_EQ(all, (std::vector<uint64_t>{t0, t0 + 5000, t0 + 10000, t0 + 15000, t0 + 20000,
                                        t0 + 25000, t0 + 30000}))
      << out.text;
  EXPECT_EQ(dw, (std::vector<uint64_t>{t0 + 5000, t0 + 15000, t0 + 25000}));

  // trace-cmd, the oracle, reads the capture's file in the same order.
  if (Shell("command -v trace-cmd").empty()) GTEST_SKIP() << "trace-cmd not installed";
  const std::string report = Shell("trace-cmd report " + (dir / g.file).string() + " 2>&1");
  std::vector<std::string> order;
  std::istringstream in(report);
  std::string line;
  while (std::getline(in, line)) {
    if (line.find("kmark:") != std::string::npos)
      order.push_back("k" + line.substr(line.find("k=") + 2));
    if (line.find("hvt_value:") != std::string::npos)
      order.push_back("d" + line.substr(line.find("value=") + 6));
  }
  EXPECT_EQ(order, (std::vector<std::string>{"k0", "d0", "k1", "d1", "k2", "d2", "k3"})) << report;
  EXPECT_NE(report.find("2000.000015: hvt_value:"), std::string::npos) << report;
}

TEST_F(RegionCaptureTest, TscPagesThatOutgrowTheirPageWhenRestampedAreSplit) {
  // A 1 MHz TSC: 200,000-tick steps fit a record's 27-bit delta, but are
  // 200 ms each on the trace clock and need a TIME_EXTEND more per record.
  guest_->AddClockSync(1000000000, 0, 0, 1000000);
  guest_->AddClockSync(2000000000, 0, 0, 2000000);
  dw_clock_ = region::kClockTsc;
  const int n = (static_cast<int>(geometry_.slot_size) - 16) / 20;  // Fills the page.
  WriteDwPage(0, 0, n, 1500000, 1, 200000);
  RegionSnapshot s = Read();
  EXPECT_EQ(s.issue_total(), 0u) << s.problems[0].detail;
  const fs::path dir = TempDir();
  auto r = WriteRegionTraceDats(s, dir);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->generations[0].dw_events, static_cast<uint64_t>(n));
  EXPECT_EQ(r->generations[0].last_dw_timestamp, 1500000000ull + 200000000ull * (n - 1));
  if (Shell("command -v trace-cmd").empty()) GTEST_SKIP() << "trace-cmd not installed";
  const std::string report =
      Shell("trace-cmd report " + (dir / "region-gen-1.trace.dat").string() + " 2>&1");
  EXPECT_EQ(Count(report, "hvt_value:"), static_cast<size_t>(n)) << report.substr(0, 2000);
}

TEST_F(RegionCaptureTest, Malicious_TscRingWithoutSamplesIsKeptApartAndReported) {
  dw_clock_ = region::kClockTsc;
  WriteDwPage(0, 0, 4, TscAt(5000000000), 1, 3000);
  RegionSnapshot s = Read();
  EXPECT_EQ(s.issue_count(RegionIssue::kDwClockUnplaceable), 1u);
  ASSERT_FALSE(s.problems.empty());
  EXPECT_EQ(s.problems[0].where, "dw ring 0");
  EXPECT_NE(s.problems[0].detail.find("TSC"), std::string::npos) << s.problems[0].detail;

  // Capture: the kernel's file has no direct writes; they are all in a file
  // of their own, on the TSC clock, that trace-cmd reads.
  const fs::path dir = TempDir();
  auto r = WriteRegionTraceDats(s, dir);
  ASSERT_TRUE(r.ok()) << r.error().message;
  ASSERT_EQ(r->generations.size(), 2u);
  EXPECT_EQ(r->generations[0].file, "region-gen-1.trace.dat");
  EXPECT_EQ(r->generations[0].dw_events, 0u);
  EXPECT_GT(r->generations[0].kernel_events, 0u);
  EXPECT_EQ(r->generations[1].file, "region-gen-1-tsc.trace.dat");
  EXPECT_EQ(r->generations[1].trace_clock, "x86-tsc");
  EXPECT_EQ(r->generations[1].dw_events, 4u);
  EXPECT_EQ(r->generations[1].last_dw_timestamp, TscAt(5000000000) + 9000);
  EXPECT_EQ(r->attach["issues"]["by_reason"]["dw_clock_unplaceable"], 1);

  // Stream: held for max_hold (samples may still come), then printed with a
  // note, after the rest.
  RegionStreamer st(geometry_, RegionStreamOptions{false, true, std::chrono::milliseconds(1000)});
  RegionSnapshot s1 = Read();
  auto out1 = st.Feed(&s1, T(0), false);
  EXPECT_EQ(Count(out1.text, "hvt_value:"), 0u);
  RegionSnapshot s2 = Read();
  auto out2 = st.Feed(&s2, T(1500), false);
  EXPECT_EQ(Count(out2.text, "hvt_value:"), 4u) << out2.text;
  bool noted = false;
  for (const std::string& n : out2.notes)
    noted |= n.find("raw TSC time stamps") != std::string::npos;
  EXPECT_TRUE(noted);
  // `hvtrace show` lists that file right after the generation's own (the
  // sanitizer build builds only the tests, not the CLI).
  const std::string hvtrace = std::string(HVTRACE_BIN_DIR) + "/hvtrace";
  if (access(hvtrace.c_str(), X_OK) == 0) {
    const std::string shown = Shell(hvtrace + " show " + dir.string() + " 2>&1");
    const size_t main_at = shown.find("(region-gen-1.trace.dat)");
    const size_t tsc_at = shown.find("(region-gen-1-tsc.trace.dat)");
    ASSERT_NE(main_at, std::string::npos) << shown.substr(0, 2000);
    ASSERT_NE(tsc_at, std::string::npos) << shown.substr(0, 2000);
    EXPECT_LT(main_at, tsc_at);
    EXPECT_EQ(Count(shown.substr(tsc_at), "hvt_value:"), 4u) << shown.substr(tsc_at, 2000);
    EXPECT_EQ(Count(shown.substr(0, tsc_at), "hvt_value:"), 0u);
  }
  if (Shell("command -v trace-cmd").empty()) GTEST_SKIP() << "trace-cmd not installed";
  const std::string report =
      Shell("trace-cmd report " + (dir / "region-gen-1-tsc.trace.dat").string() + " 2>&1");
  EXPECT_EQ(Count(report, "hvt_value:"), 4u) << report.substr(0, 2000);
}

TEST_F(RegionCaptureTest, Malicious_StreamWaitsForTheSecondSampleThenConverts) {
  const std::vector<uint64_t> kt = KernelTimes(Read());
  const uint64_t mid = MidOfWidestGap(kt);
  guest_->AddClockSync(kt.front(), 0, 0, TscAt(kt.front()));  // One sample: not enough.
  dw_clock_ = region::kClockTsc;
  RegionStreamer st(geometry_, RegionStreamOptions{true, false, std::chrono::milliseconds(1000)});
  RegionSnapshot s0 = Read();
  st.Feed(&s0, T(0), false);
  WriteDwPage(0, 1, 2, TscAt(mid), 1, 3000);
  RegionSnapshot s1 = Read();
  EXPECT_EQ(st.Feed(&s1, T(50), false).events, 0u);
  guest_->AddClockSync(kt.front() + 1000000000, 0, 0, TscAt(kt.front() + 1000000000));
  RegionSnapshot s2 = Read();
  auto out = st.Feed(&s2, T(100), true);
  std::vector<uint64_t> all, dw;
  JsonTimes(out.text, &all, &dw);
  EXPECT_EQ(dw, (std::vector<uint64_t>{mid, mid + 1000})) << out.text;
  for (const std::string& n : out.notes) EXPECT_EQ(n.find("raw TSC"), std::string::npos) << n;
}

TEST_F(RegionCaptureTest, Malicious_LyingClockSyncSamplesAreDroppedAndReported) {
  const std::vector<uint64_t> kt = KernelTimes(Read());
  const uint64_t mid = MidOfWidestGap(kt);
  const uint64_t base = kt.front();
  // Five honest samples, one shifted by a second, one with the TSC
  // running backwards, one empty (seq even but zeros).
  for (int i = 0; i < 5; ++i) {
    const uint64_t m = base - 2000000000 + static_cast<uint64_t>(i) * 1000000000;
    guest_->AddClockSync(m, 0, 0, TscAt(m));
  }
  guest_->AddClockSync(base + 3500000000, 0, 0, TscAt(base + 2500000000));
  guest_->AddClockSync(base + 4000000000, 0, 0, TscAt(base - 9000000000));
  guest_->AddClockSync(0, 0, 0, 0);
  dw_clock_ = region::kClockTsc;
  WriteDwPage(0, 0, 2, TscAt(mid), 1, 3000);
  RegionSnapshot s = Read();
  EXPECT_EQ(s.issue_count(RegionIssue::kClockSyncDropped), 1u);
  EXPECT_EQ(s.issue_count(RegionIssue::kDwClockUnplaceable), 0u);
  auto r = WriteRegionTraceDats(s, TempDir());
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->attach["clock_sync"]["dropped"], 3);
  EXPECT_EQ(r->attach["clock_sync"]["sound"], 5);
  EXPECT_EQ(r->generations.size(), 1u);
  EXPECT_EQ(r->generations[0].last_dw_timestamp, mid + 3000 / 3);
}

TEST_F(RegionCaptureTest, Malicious_RingClockThatIsNoClockIsReported) {
  dw_clock_ = 99;
  WriteDwPage(0, 0, 2, 1000);
  RegionSnapshot s = Read();
  EXPECT_EQ(s.issue_count(RegionIssue::kDwClockUnknown), 1u);
  auto r = WriteRegionTraceDats(s, TempDir());
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->generations[0].dw_events, 2u);
  EXPECT_EQ(r->attach["rings"][2]["clock"], "unknown 99");
}

TEST_F(RegionCaptureTest, PagesKeepTheClockTheirWriterUsedAfterTheRingChangesHands) {
  // A MONOTONIC thread wrote page 0 and exited; a TSC thread claimed the
  // ring (its header now says TSC) and wrote page 1.
  const uint64_t t0 = 5000000000;
  for (uint64_t m : {t0 - 1000000000, t0 + 1000000000}) guest_->AddClockSync(m, 0, 0, TscAt(m));
  WriteDwPage(0, 0, 2, t0, 1, 10000);  // Mono: t0, t0 + 10 us.
  dw_clock_ = region::kClockTsc;
  WriteDwPage(0, 1, 2, TscAt(t0 + 5000), 1, 30000);  // TSC: t0 + 5 us, t0 + 15 us.
  ASSERT_EQ(guest_->dw_ring(0)->clock, region::kClockTsc);
  RegionSnapshot s = Read();
  EXPECT_EQ(s.issue_total(), 0u) << s.problems[0].detail;
  auto r = WriteRegionTraceDats(s, TempDir());
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->generations.size(), 1u);
  EXPECT_EQ(r->generations[0].dw_events, 2u + 2u);
  EXPECT_EQ(r->generations[0].last_dw_timestamp, t0 + 15000);
  EXPECT_EQ(r->attach["rings"][2]["pages_converted"], 1);

  RegionStreamer st(geometry_, RegionStreamOptions{true, true, std::chrono::milliseconds(1000)});
  RegionSnapshot s2 = Read();
  auto out = st.Feed(&s2, T(0), true);
  std::vector<uint64_t> all, dw;
  JsonTimes(out.text, &all, &dw);
  std::sort(dw.begin(), dw.end());
  EXPECT_EQ(dw, (std::vector<uint64_t>{t0, t0 + 5000, t0 + 10000, t0 + 15000})) << out.text;
}

TEST_F(RegionCaptureTest, Malicious_RandomClockSamplesAndTscStampsNeverCrash) {
  std::mt19937_64 rng(11);
  dw_clock_ = region::kClockTsc;
  for (int round = 0; round < 60; ++round) {
    for (int k = 0; k < 1 + round % 16; ++k) {
      const uint64_t m = round % 3 == 0 ? rng() : rng() % 100000000000ull;
      guest_->AddClockSync(m, rng(), rng(), round % 2 ? rng() : 3 * m + rng() % 5000000);
    }
    WriteDwPage(0, 0, 3, rng() >> (1 + round % 40), 1, rng() % 1000000);
    auto s = ReadRegion(mem_, geometry_);
    ASSERT_TRUE(s.ok());
    const fs::path dir = TempDir();
    auto r = WriteRegionTraceDats(*s, dir);
    ASSERT_TRUE(r.ok()) << r.error().message;
    EXPECT_EQ(r->generations.back().dw_events + r->dw_events_off_clock, 3u);
    RegionStreamer st(geometry_, RegionStreamOptions{false, true, std::chrono::milliseconds(1000)});
    auto out = st.Feed(&*s, T(0), true);
    EXPECT_EQ(Count(out.text, "hvt_value:"), 3u)
        << "the stream prints even raw stamps, round " << round;
    fs::remove_all(dir);
  }
}

// The one capture path: an attach region whose capture dies after its copy
// is durable (the daemon killed at that moment) is finished by the next
// run's recovery, as a boot range's is, with the same trace.dat files.
TEST_F(RegionCaptureTest, AttachCaptureThatDiesAfterItsCopyIsRecovered) {
  const fs::path dir = TempDir();
  const fs::path region_file = dir / "region";
  {
    std::ofstream out(region_file, std::ios::binary);
    out.write(reinterpret_cast<const char*>(mem_.data()),
              static_cast<std::streamsize>(mem_.size()));
  }
  auto live = LiveRegion::OpenExisting(region_file);
  ASSERT_TRUE(live.ok()) << live.error().message;
  CaptureStore store(dir / "captures");
  // "Dies": the hook keeps the hidden directory from the unwinding capture
  // and stops it, as SIGKILL would.
  const fs::path kept = dir / "kept";
  CaptureFaults faults;
  faults.after_copies_durable = [&] {
    for (const auto& e : fs::directory_iterator(store.dir())) {
      if (e.path().filename().string().starts_with(".tmp-"))
        fs::copy(e.path(), kept / e.path().filename());
    }
    throw std::runtime_error("killed");
  };
  fs::create_directories(kept);
  CaptureRequest request;
  request.vm = "vm1";
  request.trigger = "panic";
  request.triggered = HostTime::Now();
  request.inputs.attach = *live;
  request.inputs.vcpus_stopped = true;
  request.inputs.transport = {{"kind", "libvirt"}, {"domain", "vm1"}};
  CaptureService dying(nullptr, 1, faults);
  EXPECT_THROW((void)dying.Take(store, request), std::runtime_error);
  ASSERT_FALSE(fs::is_empty(kept));
  for (const auto& e : fs::directory_iterator(kept))
    fs::rename(e.path(), store.dir() / e.path().filename());

  auto report = CaptureService(nullptr, 1).Recover(store);
  ASSERT_TRUE(report.ok()) << report.error().message;
  ASSERT_EQ(report->recovered.size(), 1u) << (report->removed.empty() ? "" : report->removed[0]);
  const fs::path done = report->recovered[0].dir;
  EXPECT_TRUE(fs::exists(done / "attach-region.bin"));
  EXPECT_TRUE(fs::exists(done / "region-gen-1.trace.dat"));
  std::ifstream in(done / "manifest.json");
  const nlohmann::json m = nlohmann::json::parse(in);
  EXPECT_TRUE(m["recovered"].is_object()) << m.dump(2);
  EXPECT_EQ(m["region"]["kind"], "attach");
  EXPECT_EQ(m["extra"]["transport"]["kind"], "libvirt");
  EXPECT_EQ(m["extra"]["consistency"]["vcpus_stopped"], true);
  EXPECT_EQ(m["kernel"]["release"], "6.12.9-test");

  // The same capture taken without dying gives the same files.
  auto whole = CaptureService(nullptr, 1).Take(CaptureStore(dir / "whole"), request);
  ASSERT_TRUE(whole.ok()) << whole.error().message;
  EXPECT_EQ(test_support::ReadText(done / "region-gen-1.trace.dat").size(),
            test_support::ReadText(dir / "whole" / whole->id / "region-gen-1.trace.dat").size());
}

}  // namespace
}  // namespace hvtrace::hostd
