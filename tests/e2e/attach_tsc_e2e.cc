// Direct-write events stamped with the guest's TSC, on a real guest (6.12):
// hvtraced puts them on the kernel's trace clock with the agent's clock-sync
// samples, so they come out interleaved, in the order they were written, with
// trace_marker events written between them, in the live stream and in the
// capture (trace-cmd and `hvtrace show`).
//
// TCG guests have no invariant TSC, so Clock::kAuto picks CLOCK_MONOTONIC
// there; the guest program forces the TSC (`dw-write --tsc`).
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "attach_region_host.h"
#include "guest_harness.h"
#include "hvtraced_harness.h"
#include "stream_reader.h"
#include "test_support.h"
#include "trace_text.h"

namespace hvtrace::e2e {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

using test_support::MarkerLine;
using test_support::ReadText;
using test_support::RunCommand;

// The markers in the order the guest wrote them: kernel (trace_marker) and
// direct-write (TSC) alternately.
std::vector<std::string> Markers() {
  std::vector<std::string> m;
  for (int i = 0; i < 4; ++i) {
    m.push_back("HVT-TK" + std::to_string(i));
    if (i < 3) m.push_back("HVT-TD" + std::to_string(i));
  }
  return m;
}

// Checks that |text| holds every marker once, in the written order and at
// non-decreasing times; prints the lines.
void ExpectInterleaved(const std::string& what, const std::string& text) {
  size_t prev_at = 0;
  uint64_t prev_ns = 0;
  std::string shown;
  for (const std::string& marker : Markers()) {
    const std::string line = MarkerLine(text, marker);
    ASSERT_FALSE(line.empty()) << what << ": " << marker << " missing in:\n"
                               << text.substr(0, 4000);
    const size_t at = text.find(line);
    EXPECT_GE(at, prev_at) << what << ": " << marker << " out of order:\n" << text.substr(0, 4000);
    const uint64_t ns = LineTimeNs(line);
    EXPECT_GT(ns, 0u) << line;
    EXPECT_GE(ns, prev_ns) << what << ": " << marker << " earlier than the marker before it";
    if (marker.starts_with("HVT-TD")) {
      EXPECT_NE(line.find("marker:"), std::string::npos) << line;
    } else {
      EXPECT_NE(line.find("print:"), std::string::npos) << line;
    }
    prev_at = at;
    prev_ns = ns;
    shown += "  " + line + "\n";
  }
  std::printf("[attach tsc] %s:\n%s", what.c_str(), shown.c_str());
}

TEST(AttachTscE2e, TscStampedDirectWritesInterleaveWithKernelMarkersInStreamAndCapture) {
  if (std::string why = QemuUnavailableReason(); !why.empty()) GTEST_SKIP() << why;
  if (access((std::string(HVTRACE_BIN_DIR) + "/hvtrace-agent").c_str(), X_OK) != 0) {
    GTEST_SKIP() << "hvtrace-agent not built";
  }
  auto image = ImageWithThisAgent("6.12");
  ASSERT_TRUE(image.ok()) << image.error().message;

  const std::string tag = "attach-tsc";
  TestGuest guest(tag);
  hostd::VmConfig config = guest.MakeConfig(*image);
  const std::string daemon_qmp = AddDaemonMonitor(config, tag);
  auto booted = guest.Boot(config);
  ASSERT_TRUE(booted.ok()) << booted.error().message << guest.Diagnostics();
  auto agent = guest.Run("(hvtrace-agent > /tmp/agent.log 2>&1 &)");
  ASSERT_TRUE(agent.ok()) << agent.error().message;

  HvtracedProcess daemon({.tag = tag});
  Status started = daemon.Start();
  ASSERT_TRUE(started.ok()) << started.error().message;
  const std::string name = tag + "-" + std::to_string(::getpid());
  struct Cleanup {
    std::string path;
    ~Cleanup() { std::filesystem::remove(path); }
  } cleanup{daemon.dir() + "/run/mem/hvtrace-" + name + "-attach"};
  auto diag = [&] {
    return guest.Diagnostics() + "\n--- agent ---\n" + guest.Run("cat /tmp/agent.log")->output +
           "\n--- hvtraced ---\n" + daemon.log();
  };
  auto attached = daemon.Call("attach", {{"name", name},
                                         {"qmp", daemon_qmp},
                                         {"size_mib", 16},
                                         {"pump_interval_ms", 50},
                                         {"wait_ms", 60000}});
  ASSERT_TRUE(attached.ok()) << attached.error().message << diag();
  ASSERT_FALSE((*attached)["guest"].is_null()) << attached->dump(2) << diag();
  EXPECT_EQ((*attached)["guest"]["trace_clock"], "mono");

  StreamReader stream(daemon, name);
  ASSERT_TRUE(stream.WaitForNote("streaming VM", std::chrono::seconds(10))) << stream.output();
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // The stream's first look is taken.

  // One guest command: kernel marker, TSC direct write, kernel marker, ...
  std::string cmd;
  for (const std::string& marker : Markers()) {
    if (!cmd.empty()) cmd += "; ";
    cmd += marker.starts_with("HVT-TK")
               ? "echo " + marker + " > /sys/kernel/tracing/instances/hvtrace/trace_marker"
               : "hvtrace-guest-test dw-write --tsc " + marker;
  }
  auto wrote = guest.Run(cmd);
  ASSERT_TRUE(wrote.ok()) << wrote.error().message;
  ASSERT_EQ(wrote->status, 0) << wrote->output;
  // The guest program really stamped with the TSC.
  size_t tsc_runs = 0;
  for (size_t at = wrote->output.find("clock tsc"); at != std::string::npos;
       at = wrote->output.find("clock tsc", at + 1)) {
    ++tsc_runs;
  }
  EXPECT_EQ(tsc_runs, 3u) << wrote->output;

  const bool all_seen = stream.WaitFor(
      [](const std::string& t) {
        return t.find("HVT-TK3") != std::string::npos && t.find("HVT-TD2") != std::string::npos;
      },
      std::chrono::seconds(30));
  ASSERT_TRUE(all_seen) << "stream text:\n"
                        << stream.text() << "\nnotes:\n"
                        << stream.notes() << diag();
  ExpectInterleaved("stream", stream.text());
  EXPECT_EQ(stream.notes().find("raw TSC"), std::string::npos) << stream.notes();

  // A capture of the running guest: the same order in the trace.dat.
  auto c = daemon.Call("capture", {{"name", name}});
  ASSERT_TRUE(c.ok()) << c.error().message << diag();
  const fs::path dir =
      fs::path(daemon.state_dir()) / "vms" / name / "captures" / (*c)["capture"].get<std::string>();
  const json manifest = json::parse(ReadText(dir / "manifest.json"));
  const json& attach = manifest["extra"]["attach"];
  bool tsc_ring = false;
  for (const json& ring : attach["rings"]) {
    if (ring.value("clock", "") != "x86-tsc" || ring.value("pages_present", 0) == 0) continue;
    tsc_ring = true;
    EXPECT_EQ(ring.value("time_stamps", ""), "converted to mono") << ring.dump();
  }
  EXPECT_TRUE(tsc_ring) << attach["rings"].dump(2);
  EXPECT_GE(attach["clock_sync"]["sound"].get<int>(), 2) << attach["clock_sync"].dump();
  EXPECT_FALSE(fs::exists(dir / "region-gen-1-tsc.trace.dat")) << "every TSC ring was converted";
  std::printf("[attach tsc] clock sync: %s; issues %s\n", attach["clock_sync"].dump().c_str(),
              attach["issues"]["by_reason"].dump().c_str());
  const fs::path dat = dir / "region-gen-1.trace.dat";
  ASSERT_TRUE(fs::exists(dat)) << manifest.dump(2);
  ExpectInterleaved("capture, trace-cmd report",
                    RunCommand("trace-cmd report " + dat.string() + " 2>&1"));
  ExpectInterleaved(
      "capture, hvtrace show",
      RunCommand(std::string(HVTRACE_BIN_DIR) + "/hvtrace show " + dir.string() + " 2>/dev/null"));
}

}  // namespace
}  // namespace hvtrace::e2e
