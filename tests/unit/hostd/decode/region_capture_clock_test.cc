#include "region_capture.h"

// Direct-write rings stamped with the TSC, put on the kernel's clock in
// captures and streams (hvtrace/region_clock.h).
#include "hostd/decode/region_capture_fixture.h"

namespace hvtrace::hostd {
namespace {

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

// This file's own suite name: the unit tests of hostd/ share one
// executable, and GoogleTest refuses one suite name for fixtures of
// different translation units.
using RegionCaptureClockTest = RegionCaptureTest;

TEST_F(RegionCaptureClockTest, TscStampsArePutOnTheKernelsClockInCaptureAndStream) {
  // A region with only the test's events: kernel kmark k=0..3 on CPU 1 at
  // t0 + 0, 10, 20, 30 us; direct writes value=0..2 stamped with the TSC at
  // t0 + 5, 15, 25 us.
  std::fill(mem_.begin(), mem_.end(), std::byte{0});
  ASSERT_TRUE(InitRegionHeader(mem_, geometry_, 42).ok());
  auto guest = GuestRegion::Attach(mem_.data(), mem_.size());
  ASSERT_TRUE(guest.ok());
  guest_.emplace(*guest);
  guest_->WriteIdentity(test_support::TestGuestIdentity());
  ASSERT_TRUE(test_support::PublishHeaderPage(*guest_));
  ASSERT_TRUE(test_support::PublishEvent(*guest_, region::kFormatKernelEvent, "test", kKernelFormat,
                                         kKernelId));
  ASSERT_TRUE(
      test_support::PublishEvent(*guest_, region::kFormatDwEvent, "hvtrace", kDwFormat, kDwId));
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

TEST_F(RegionCaptureClockTest, TscPagesThatOutgrowTheirPageWhenRestampedAreSplit) {
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

TEST_F(RegionCaptureClockTest, Malicious_TscRingWithoutSamplesIsKeptApartAndReported) {
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

TEST_F(RegionCaptureClockTest, Malicious_StreamWaitsForTheSecondSampleThenConverts) {
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

TEST_F(RegionCaptureClockTest, Malicious_LyingClockSyncSamplesAreDroppedAndReported) {
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

TEST_F(RegionCaptureClockTest, Malicious_RingClockThatIsNoClockIsReported) {
  dw_clock_ = 99;
  WriteDwPage(0, 0, 2, 1000);
  RegionSnapshot s = Read();
  EXPECT_EQ(s.issue_count(RegionIssue::kDwClockUnknown), 1u);
  auto r = WriteRegionTraceDats(s, TempDir());
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->generations[0].dw_events, 2u);
  EXPECT_EQ(r->attach["rings"][2]["clock"], "unknown 99");
}

TEST_F(RegionCaptureClockTest, PagesKeepTheClockTheirWriterUsedAfterTheRingChangesHands) {
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

TEST_F(RegionCaptureClockTest, Malicious_RandomClockSamplesAndTscStampsNeverCrash) {
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

}  // namespace
}  // namespace hvtrace::hostd
