// Hostile guests and isolation, against two real 6.12 guests at once.
//
// Each guest gets its own hot-plugged region and runs this build's agent;
// each writes markers tagged with its own name through trace_marker and the
// direct-write library. TwoVmsAttachedAtOnceStayIsolated checks that every
// tag lands in its own VM's region only. ScribblerIsReportedAndSkipped runs
// `hvtrace-guest-test scribble all` in one guest (wrong lengths, torn slots,
// counters running backwards, a format table that lies, broken pages, symbol
// and comm areas that lie, a rewritten host header) while the host keeps reading both regions: the
// reader reports each kind of damage by reason, never fails, keeps the good
// pages (the guest's markers written after the scribbling are decoded), and
// the other VM's region shows not a single issue the whole time.
// ThroughOneHvtraced does the same with both VMs attached by one hvtraced
// (`attach`, `stream`, `capture`): the daemon keeps running, its stream of
// the other VM carries every one of that VM's markers and none of the
// hostile one's, and the captures report the damage by reason in one VM's
// manifest and none in the other's.
#include <gtest/gtest.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "attach_region_host.h"
#include "hvtrace/region_text.h"
#include "hvtraced_harness.h"
#include "stream_reader.h"
#include "test_support.h"

namespace hvtrace::e2e {
namespace {

using SteadyClock = std::chrono::steady_clock;

constexpr uint64_t kRegionSize = 4ull << 20;
constexpr char kEvents[] = "sched:sched_switch,sched:sched_wakeup,timer:hrtimer_expire_entry";

// One guest with a hot-plugged region and its agent running.
struct AttachedGuest {
  std::unique_ptr<TestGuest> guest;
  std::unique_ptr<HostRegion> region;
  std::string tag;

  std::string Log() {
    auto r = guest->Run("cat /tmp/agent.log /tmp/scribble.log 2>/dev/null");
    return r.ok() ? r->output : "(console gone)";
  }
};

Status Start(AttachedGuest* g, const GuestImage& image, const std::string& tag,
             uint64_t region_id) {
  g->tag = tag;
  g->guest = std::make_unique<TestGuest>("hostile-" + tag);
  if (Status s = g->guest->Boot(g->guest->MakeConfig(image)); !s.ok()) {
    return Error{tag + ": " + s.error().message + g->guest->Diagnostics()};
  }
  auto started = g->guest->Run("(hvtrace-agent > /tmp/agent.log 2>&1 &)");
  if (!started.ok()) return started.error();
  auto region =
      HostRegion::Create(g->guest->ShmPath("region"), kRegionSize, 2, region_id, 50, kEvents);
  if (!region.ok()) return region.error();
  g->region = std::move(*region);
  if (Status s = HotplugRegion(g->guest->qmp(), "hv1", "ivs1", g->region->path(), kRegionSize);
      !s.ok())
    return s;
  const bool running = WaitUntil(
      [&] {
        const RegionSnapshot s = g->region->Read();
        return s.guest.present && s.guest.status.state == region::kStateRunning;
      },
      std::chrono::seconds(30));
  if (!running) return Error{tag + ": the agent never announced itself\n" + g->Log()};
  return Status();
}

// Writes |count| markers "HVT-<tag>-<what>-n" through trace_marker and (with
// |dw|) as many through the direct-write library.
Status Mark(AttachedGuest* g, const std::string& what, int count, bool dw = true) {
  const std::string prefix = "HVT-" + g->tag + "-" + what;
  auto k = g->guest->Run("for i in $(seq " + std::to_string(count) + "); do echo " + prefix +
                         "-K$i > /sys/kernel/tracing/instances/hvtrace/trace_marker; done");
  if (!k.ok() || k->status != 0) return Error{g->tag + ": trace_marker failed"};
  if (!dw) return Status();
  auto d = g->guest->Run("hvtrace-guest-test dw-write --count " + std::to_string(count) + " " +
                         prefix + "-D");
  if (!d.ok() || d->status != 0)
    return Error{g->tag + ": dw-write failed: " + (d.ok() ? d->output : "")};
  return Status();
}

// Markers of |tag| found in |records|: trace_marker ones and direct-write ones.
std::pair<int, int> CountTag(const std::vector<RegionRecord>& records, const std::string& prefix) {
  int k = 0, d = 0;
  for (const RegionRecord& r : records) {
    if (r.payload.find(prefix) == std::string::npos) continue;
    (r.direct_write ? d : k)++;
  }
  return {k, d};
}

// Damage in a snapshot of a live region. A slot or text area its own agent
// was rewriting while the host copied it is reported as torn — the normal
// race of reading a live region (the next read has it whole), not damage —
// so it is left out.
uint64_t DamageIn(const RegionSnapshot& s) {
  return s.issue_total() - s.issue_count(RegionIssue::kSlotTorn) -
         s.issue_count(RegionIssue::kCommsTorn) - s.issue_count(RegionIssue::kSymbolsTorn);
}

class AttachHostileE2e : public ::testing::Test {
 protected:
  void SetUp() override {
    if (std::string why = QemuUnavailableReason(); !why.empty()) GTEST_SKIP() << why;
    if (access((std::string(HVTRACE_BIN_DIR) + "/hvtrace-agent").c_str(), X_OK) != 0) {
      GTEST_SKIP() << "hvtrace-agent not built";
    }
    auto image = ImageWithThisAgent();
    ASSERT_TRUE(image.ok()) << image.error().message;
    ASSERT_TRUE(Start(&a_, *image, "VMA", 0xaaaa0001).ok());
    ASSERT_TRUE(Start(&b_, *image, "VMB", 0xbbbb0002).ok());
  }

  AttachedGuest a_, b_;
};

TEST_F(AttachHostileE2e, TwoVmsAttachedAtOnceStayIsolated) {
  ASSERT_TRUE(Mark(&a_, "iso", 20).ok());
  ASSERT_TRUE(Mark(&b_, "iso", 20).ok());
  std::pair<int, int> a_in_a, b_in_b;
  ASSERT_TRUE(WaitUntil(
      [&] {
        a_in_a = CountTag(AllRecords(a_.region->Read()), "HVT-VMA-iso");
        b_in_b = CountTag(AllRecords(b_.region->Read()), "HVT-VMB-iso");
        return a_in_a == std::make_pair(20, 20) && b_in_b == std::make_pair(20, 20);
      },
      std::chrono::seconds(30)))
      << "A has " << a_in_a.first << "+" << a_in_a.second << ", B has " << b_in_b.first << "+"
      << b_in_b.second;
  const RegionSnapshot sa = a_.region->Read(), sb = b_.region->Read();
  const auto ra = AllRecords(sa), rb = AllRecords(sb);
  EXPECT_EQ(CountTag(ra, "HVT-VMB"), std::make_pair(0, 0)) << "B's markers in A's region";
  EXPECT_EQ(CountTag(rb, "HVT-VMA"), std::make_pair(0, 0)) << "A's markers in B's region";
  EXPECT_NE(sa.guest.boot_id, sb.guest.boot_id);
  EXPECT_EQ(DamageIn(sa), 0u);
  EXPECT_EQ(DamageIn(sb), 0u);
  std::printf(
      "isolation: A region %zu records, B region %zu records; 20+20 tagged markers each, none "
      "crossed\n",
      ra.size(), rb.size());
}

TEST_F(AttachHostileE2e, ScribblerIsReportedAndSkippedAndTheOtherVmIsUntouched) {
  // Enough pages in every CPU ring for the scribbler to pick from.
  ASSERT_TRUE(Mark(&a_, "before", 50).ok());
  ASSERT_TRUE(WaitUntil(
      [&] {
        const RegionSnapshot s = a_.region->Read();
        for (const RegionRing& r : s.cpus) {
          if (r.index < 2 && r.published < 8) return false;
        }
        return true;
      },
      std::chrono::seconds(60)))
      << a_.Log();
  ASSERT_EQ(DamageIn(b_.region->Read()), 0u);

  // Both trackers see each region once before the damage, so counters that
  // then run backwards have something to run back from.
  RegionTracker tracker_a(a_.region->geometry());
  RegionTracker tracker_b(b_.region->geometry());
  {
    RegionSnapshot sa = a_.region->Read(), sb = b_.region->Read();
    tracker_a.Update(&sa);
    tracker_b.Update(&sb);
  }
  ASSERT_EQ(
      a_.guest->Run("(hvtrace-guest-test scribble --repeat-ms 4000 all > /tmp/scribble.log 2>&1 &)")
          ->status,
      0);
  // The text areas' content is checked when it is inflated, as stream and
  // capture do.
  RegionTextCache texts_a, texts_b;
  std::array<uint64_t, static_cast<size_t>(RegionIssue::kCount)> seen{};
  uint64_t reads = 0, b_issues = 0, b_torn = 0, a_good_pages_min = UINT64_MAX;
  std::vector<std::string> examples, b_examples;
  const auto end = SteadyClock::now() + std::chrono::seconds(8);
  while (SteadyClock::now() < end) {
    RegionSnapshot sa = a_.region->Read();
    tracker_a.Update(&sa);
    texts_a.Update(&sa);
    for (size_t i = 0; i < seen.size(); ++i) seen[i] += sa.issues[i];
    for (const RegionProblem& p : sa.problems) {
      if (examples.size() < 12 &&
          seen[static_cast<size_t>(p.issue)] == sa.issues[static_cast<size_t>(p.issue)]) {
        examples.push_back(std::string(RegionIssueName(p.issue)) + " @" + std::to_string(p.offset) +
                           " " + p.where + ": " + p.detail);
      }
    }
    uint64_t good = 0;
    for (const RegionRing& r : sa.cpus) good += r.pages.size();
    a_good_pages_min = std::min(a_good_pages_min, good);
    RegionSnapshot sb = b_.region->Read();
    tracker_b.Update(&sb);
    texts_b.Update(&sb);
    b_issues += DamageIn(sb);
    b_torn += sb.issue_count(RegionIssue::kSlotTorn);
    for (const RegionProblem& p : sb.problems) {
      if (b_examples.size() < 5)
        b_examples.push_back(std::string(RegionIssueName(p.issue)) + " " + p.where + ": " +
                             p.detail);
    }
    ++reads;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  const std::string scribble_log = a_.guest->Run("cat /tmp/scribble.log")->output;
  std::printf("scribbler said:\n%s", scribble_log.c_str());
  std::printf(
      "host reads of A during the scribbling: %llu; issues by reason (summed over reads):\n",
      static_cast<unsigned long long>(reads));
  for (size_t i = 0; i < seen.size(); ++i) {
    if (seen[i] != 0)
      std::printf("  %-28s %llu\n", RegionIssueName(static_cast<RegionIssue>(i)),
                  static_cast<unsigned long long>(seen[i]));
  }
  for (const std::string& e : examples) std::printf("  e.g. %s\n", e.c_str());
  std::printf("fewest good CPU pages in one read of A: %llu\n",
              static_cast<unsigned long long>(a_good_pages_min));
  std::printf(
      "other VM (B) over the same %llu reads: %llu issues, %llu slots caught mid-write by the "
      "copy\n",
      static_cast<unsigned long long>(reads), static_cast<unsigned long long>(b_issues),
      static_cast<unsigned long long>(b_torn));
  for (const std::string& e : b_examples) std::printf("  B: %s\n", e.c_str());

  // Every kind of damage is reported by its reason.
  for (RegionIssue issue : {RegionIssue::kHeaderMismatch, RegionIssue::kSlotLengthOutOfRange,
                            RegionIssue::kSlotCommitPastLength, RegionIssue::kSlotTorn,
                            RegionIssue::kFormatIdMismatch, RegionIssue::kFormatFingerprintMismatch,
                            RegionIssue::kFormatBadKind, RegionIssue::kFormatParseError,
                            RegionIssue::kFormatConflict, RegionIssue::kFormatOutOfRange,
                            RegionIssue::kSlotPageError, RegionIssue::kCounterBackwards}) {
    EXPECT_GT(seen[static_cast<size_t>(issue)], 0u) << RegionIssueName(issue) << " never reported";
  }
  // The comm area lies (a 4 MiB region has no symbol area: the daemon test
  // below covers that one).
  EXPECT_GT(seen[static_cast<size_t>(RegionIssue::kCommsBad)], 0u)
      << "comm area lies never reported";
  EXPECT_GT(seen[static_cast<size_t>(RegionIssue::kRingCounterBehind)] +
                seen[static_cast<size_t>(RegionIssue::kSlotMisplaced)],
            0u)
      << "a slot claiming a page the ring never published was not reported";
  // The rest is kept: good pages in every read.
  EXPECT_GT(a_good_pages_min, 0u);
  // The other VM saw nothing of it.
  EXPECT_EQ(b_issues, 0u);

  // The hostile guest's agent keeps running and its new events still decode.
  // (Its direct-write programs cannot attach any more: the scribbler broke
  // the host header they check; they must say so and exit, not crash.)
  ASSERT_TRUE(Mark(&a_, "after", 5, /*dw=*/false).ok());
  auto dw_after = a_.guest->Run("hvtrace-guest-test dw-write HVT-VMA-after-D");
  ASSERT_TRUE(dw_after.ok());
  EXPECT_EQ(dw_after->status, 1) << dw_after->output;
  std::printf("dw-write in the scribbled guest: %s", dw_after->output.c_str());
  ASSERT_TRUE(Mark(&b_, "after", 5).ok());
  std::pair<int, int> a_after, b_after;
  EXPECT_TRUE(WaitUntil(
      [&] {
        a_after = CountTag(AllRecords(a_.region->Read()), "HVT-VMA-after");
        b_after = CountTag(AllRecords(b_.region->Read()), "HVT-VMB-after");
        return a_after.first == 5 && b_after == std::make_pair(5, 5);
      },
      std::chrono::seconds(30)))
      << "after the scribbling: A " << a_after.first << ", B " << b_after.first << "+"
      << b_after.second << "\n"
      << a_.Log();
  const RegionSnapshot sb = b_.region->Read();
  EXPECT_EQ(DamageIn(sb), 0u);
  EXPECT_EQ(CountTag(AllRecords(sb), "HVT-VMA"), std::make_pair(0, 0));
  EXPECT_EQ(a_.guest->Run("pidof hvtrace-agent")->status, 0) << "the hostile guest's agent died\n"
                                                             << a_.Log();
}

// Both guests attached by one hvtraced, over its own QMP monitor per guest.
TEST(AttachHostileDaemonE2e, ThroughOneHvtracedTheOtherVmsStreamAndCaptureAreUntouched) {
  using nlohmann::json;
  namespace fs = std::filesystem;
  if (std::string why = QemuUnavailableReason(); !why.empty()) GTEST_SKIP() << why;
  if (access((std::string(HVTRACE_BIN_DIR) + "/hvtraced").c_str(), X_OK) != 0)
    GTEST_SKIP() << "no hvtraced";
  auto image = ImageWithThisAgent();
  ASSERT_TRUE(image.ok()) << image.error().message;

  struct Vm {
    std::unique_ptr<TestGuest> guest;
    std::string name, qmp, tag;
  };
  Vm vms[2];
  const char* tags[2] = {"VMA", "VMB"};
  for (int i = 0; i < 2; ++i) {
    Vm& v = vms[i];
    v.tag = tags[i];
    v.guest = std::make_unique<TestGuest>(std::string("hostile-d-") + tags[i]);
    v.name = std::string("hostile-") + tags[i] + "-" + std::to_string(getpid());
    v.qmp = "/tmp/hvt-" + v.name + ".qmp";
    hostd::VmConfig config = v.guest->MakeConfig(*image);
    config.extra_args.insert(config.extra_args.end(),
                             {"-qmp", "unix:" + v.qmp + ",server=on,wait=off"});
    ASSERT_TRUE(v.guest->Boot(config).ok()) << v.guest->Diagnostics();
    ASSERT_EQ(v.guest->Run("(hvtrace-agent > /tmp/agent.log 2>&1 &)")->status, 0);
  }
  struct Cleanup {
    std::vector<std::string> paths;
    ~Cleanup() {
      for (const std::string& p : paths) std::filesystem::remove(p);
    }
  } cleanup{{vms[0].qmp, vms[1].qmp}};  // The regions go with the daemon's run dir.
  HvtracedProcess daemon({.tag = "hostile"});
  Status started = daemon.Start();
  ASSERT_TRUE(started.ok()) << started.error().message;
  for (Vm& v : vms) {
    // 16 MiB (the default): regions from 8 MiB on have a symbol area.
    auto attached = daemon.Call("attach", {{"name", v.name},
                                           {"qmp", v.qmp},
                                           {"size_mib", 16},
                                           {"pump_interval_ms", 50},
                                           {"events", kEvents},
                                           {"wait_ms", 60000}});
    ASSERT_TRUE(attached.ok()) << attached.error().message << daemon.log();
    ASSERT_FALSE((*attached)["guest"].is_null()) << attached->dump(2);
  }
  StreamReader stream_a(daemon, vms[0].name);
  StreamReader stream_b(daemon, vms[1].name);
  for (StreamReader* s : {&stream_a, &stream_b}) {
    ASSERT_TRUE(s->WaitForNote("streaming VM", std::chrono::seconds(10))) << s->output();
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  auto mark = [&](Vm& v, const std::string& what, int count) {
    return v.guest->Run("for i in $(seq " + std::to_string(count) + "); do echo HVT-" + v.tag +
                        "-" + what +
                        "-$i > /sys/kernel/tracing/instances/hvtrace/trace_marker; done");
  };
  ASSERT_EQ(mark(vms[0], "before", 50)->status, 0);
  ASSERT_EQ(mark(vms[1], "before", 20)->status, 0);
  std::this_thread::sleep_for(
      std::chrono::seconds(3));  // Pages pile up in A's rings for the scribbler.

  // The agent's own symbols first, so the scribbler's lies come after them.
  ASSERT_TRUE(WaitUntil(
      [&] {
        auto r = vms[0].guest->Run("grep -q 'symbols: ' /tmp/agent.log");
        return r.ok() && r->status == 0;
      },
      std::chrono::seconds(30)));
  ASSERT_EQ(
      vms[0]
          .guest
          ->Run("(hvtrace-guest-test scribble --repeat-ms 4000 all > /tmp/scribble.log 2>&1 &)")
          ->status,
      0);
  ASSERT_EQ(mark(vms[1], "during", 20)->status, 0);
  std::this_thread::sleep_for(std::chrono::seconds(5));  // Until the scribbler is done.
  ASSERT_EQ(mark(vms[0], "after", 5)->status, 0);
  ASSERT_EQ(mark(vms[1], "after", 5)->status, 0);

  // The daemon lives and still streams both.
  EXPECT_TRUE(stream_a.WaitFor(
      [](const std::string& t) { return t.find("HVT-VMA-after-5") != std::string::npos; },
      std::chrono::seconds(30)))
      << "the hostile VM's later events never came through\n"
      << stream_a.notes() << daemon.log();
  EXPECT_TRUE(stream_b.WaitFor(
      [](const std::string& t) { return t.find("HVT-VMB-after-5") != std::string::npos; },
      std::chrono::seconds(30)))
      << stream_b.notes() << daemon.log();
  ASSERT_TRUE(daemon.Call("status", {{"name", vms[1].name}}).ok()) << daemon.log();
  const std::string text_b = stream_b.text();
  for (const char* what : {"before", "during", "after"}) {
    const int count = std::string(what) == "after" ? 5 : 20;
    for (int i = 1; i <= count; ++i) {
      const std::string m = std::string("HVT-VMB-") + what + "-" + std::to_string(i) + "\n";
      EXPECT_NE(text_b.find(m), std::string::npos) << m << " missing from B's stream";
    }
  }
  EXPECT_EQ(text_b.find("HVT-VMA"), std::string::npos) << "A's events in B's stream";
  EXPECT_EQ(stream_a.text().find("HVT-VMB"), std::string::npos) << "B's events in A's stream";
  std::printf("stream notes of the hostile VM:\n%s", stream_a.notes().c_str());
  std::printf("stream notes of the other VM:\n%s", stream_b.notes().c_str());

  // Captures: the damage by reason for A, nothing for B.
  auto manifest_of = [&](const Vm& v) -> json {
    auto c = daemon.Call("capture", {{"name", v.name}});
    if (!c.ok()) return json{{"error", c.error().message}};
    const fs::path dir = fs::path(daemon.state_dir()) / "vms" / v.name / "captures" /
                         (*c)["capture"].get<std::string>();
    return json::parse(test_support::ReadText(dir / "manifest.json"), nullptr, false);
  };
  const json ma = manifest_of(vms[0]), mb = manifest_of(vms[1]);
  ASSERT_TRUE(ma.contains("extra")) << ma.dump(2);
  ASSERT_TRUE(mb.contains("extra")) << mb.dump(2);
  const json& ia = ma["extra"]["attach"]["issues"];
  const json& ib = mb["extra"]["attach"]["issues"];
  std::printf("capture of the hostile VM: issues %s\n", ia["by_reason"].dump().c_str());
  std::printf("capture of the other VM: issues %s\n", ib["by_reason"].dump().c_str());
  EXPECT_GT(ia["total"].get<uint64_t>(), 0u);
  for (const char* reason :
       {"header_mismatch", "format_id_mismatch", "format_fingerprint_mismatch", "format_bad_kind",
        "format_conflict", "format_out_of_range", "format_parse_error", "symbols_bad"}) {
    EXPECT_TRUE(ia["by_reason"].contains(reason)) << reason << " not in " << ia.dump();
  }
  // Caught mid-rewrite by the copy (the guest kept running): not damage.
  uint64_t b_torn = 0;
  for (const char* torn : {"slot_torn", "symbols_torn", "comms_torn"})
    b_torn += ib["by_reason"].value(torn, uint64_t{0});
  EXPECT_EQ(ib["total"].get<uint64_t>() - b_torn, 0u) << ib.dump(2);
  EXPECT_EQ(vms[0].guest->Run("pidof hvtrace-agent")->status, 0)
      << "the hostile guest's agent died";
}

}  // namespace
}  // namespace hvtrace::e2e
