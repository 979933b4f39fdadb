#include "region_capture.h"

#include "hostd/decode/region_capture_fixture.h"

namespace hvtrace::hostd {
namespace {

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

}  // namespace
}  // namespace hvtrace::hostd
