// Attach mode through hvtraced and the `hvtrace` CLI, on real guests (the
// 6.12 and the 6.1 guest) that booted without any region: `hvtrace attach`
// hot-plugs one over QMP and the guest agent announces itself; `stream`
// shows markers written through trace_marker and through the direct-write
// library, in order, as `trace-cmd report` prints them. `hvtrace detach`
// unplugs it (DEVICE_DELETED, object-del) and the region stays readable:
// `hvtrace capture` holds the first session's markers. A second `hvtrace
// attach` in the same guest plugs a fresh region; the agent maps it again,
// markers written after it arrive (`hvtrace stream`), and nothing of the
// first region or of the time in between leaks into it. Then the guest
// crashes and the panic capture holds every direct-write event and the
// kernel events up to the agent's last push. The measured loss window is
// printed.
//
// The guest's QEMU is launched by the test (as a user would); hvtraced gets
// its own QMP monitor (QEMU serves one client per monitor).
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <regex>
#include <sstream>
#include <string>
#include <thread>

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
using Clock = std::chrono::steady_clock;

using test_support::MarkerLine;
using test_support::ReadText;
using test_support::RunCommand;

// The line of |text| holding |needle|, or "".
std::string LineWith(const std::string& text, const std::string& needle) {
  const size_t at = text.find(needle);
  if (at == std::string::npos) return "";
  const size_t start = text.rfind('\n', at);
  const size_t end = text.find('\n', at);
  return text.substr(start == std::string::npos ? 0 : start + 1,
                     (end == std::string::npos ? text.size() : end) -
                         (start == std::string::npos ? 0 : start + 1));
}

// Waits until the guest file |path| holds |needle|.
bool GuestLogHas(TestGuest& guest, const std::string& path, const std::string& needle) {
  return WaitUntil(
      [&] {
        auto r = guest.Run("grep -q '" + needle + "' " + path);
        return r.ok() && r->status == 0;
      },
      std::chrono::seconds(20));
}

// "PREFIX-VERSION" with the version's dots as dashes (guest and VM names).
std::string AttachTag(const std::string& prefix, const std::string& version) {
  std::string tag = prefix + "-" + version;
  for (char& c : tag) c = c == '.' ? '-' : c;
  return tag;
}

// Boots |guest| without a region, with a second QMP monitor for hvtraced (the
// harness keeps the first), and starts the agent. Returns that monitor's path.
Result<std::string> BootWithAgent(TestGuest& guest, const GuestImage& image,
                                  const std::string& tag) {
  hostd::VmConfig config = guest.MakeConfig(image);
  const std::string daemon_qmp = AddDaemonMonitor(config, tag);
  if (auto booted = guest.Boot(config); !booted.ok())
    return Error{booted.error().message + guest.Diagnostics()};
  if (auto agent = guest.Run("(hvtrace-agent > /tmp/agent.log 2>&1 &)"); !agent.ok())
    return agent.error();
  return daemon_qmp;
}

class AttachE2e : public ::testing::TestWithParam<std::string> {};

TEST_P(AttachE2e, AttachStreamMarkersThenCrashCapture) {
  const std::string version = GetParam();
  if (std::string why = QemuUnavailableReason(); !why.empty()) GTEST_SKIP() << why;
  if (access((std::string(HVTRACE_BIN_DIR) + "/hvtrace-agent").c_str(), X_OK) != 0) {
    GTEST_SKIP() << "hvtrace-agent not built";
  }
  auto image = ImageWithThisAgent(version);
  ASSERT_TRUE(image.ok()) << image.error().message;

  const std::string tag = AttachTag("attach", version);
  TestGuest guest(tag);
  auto booted = BootWithAgent(guest, *image, tag);
  ASSERT_TRUE(booted.ok()) << booted.error().message;
  const std::string daemon_qmp = *booted;
  // No region yet: the guest booted without one.
  auto before = guest.Run("cat /sys/bus/pci/devices/*/device | grep -c 0x1110 || true");
  ASSERT_TRUE(before.ok());
  EXPECT_EQ(before->output.find('1'), std::string::npos)
      << "an ivshmem device before attach: " << before->output;

  HvtracedProcess hvt({.tag = tag});  // No libvirt: a QMP VM.
  Status started = hvt.Start();
  ASSERT_TRUE(started.ok()) << started.error().message;
  const std::string name = tag + "-" + std::to_string(::getpid());
  // The region is guest-shared memory: the daemon keeps it in its private
  // <run_dir>/mem, never in world-writable /dev/shm.
  const std::string region_file = hvt.dir() + "/run/mem/hvtrace-" + name + "-attach";
  struct Cleanup {
    std::string path;
    ~Cleanup() { std::filesystem::remove(path); }
  } cleanup{region_file};
  auto diag = [&] {
    return guest.Diagnostics() + "\n--- agent ---\n" + guest.Run("cat /tmp/agent.log")->output +
           "\n--- hvtraced ---\n" + hvt.LogTail();
  };

  const auto attach_start = Clock::now();
  auto attached = hvt.HvtraceJson({"attach", name, "--qmp", daemon_qmp, "--size", "16M",
                                   "--pump-ms", "50", "--wait-ms", "60000"});
  ASSERT_TRUE(attached.ok()) << attached.error().message << diag();
  const json& g = (*attached)["guest"];
  ASSERT_FALSE(g.is_null()) << attached->dump(2) << diag();
  EXPECT_EQ(g["kernel_release"], image->release);
  EXPECT_EQ(g["nr_cpus"], 2);
  EXPECT_EQ(g["boot_generation"], 1);
  EXPECT_EQ((*attached)["region"]["file"], region_file);
  EXPECT_EQ((*attached)["region"]["size"], 16u << 20);
  struct stat region_st {
  }, dir_st{};
  ASSERT_EQ(::stat(region_file.c_str(), &region_st), 0);
  ASSERT_EQ(::stat((hvt.dir() + "/run/mem").c_str(), &dir_st), 0);
  EXPECT_EQ(region_st.st_mode & 07777, 0600u);  // Nobody else reads guest-shared memory.
  EXPECT_EQ(dir_st.st_mode & 07777, 0700u);
  std::printf(
      "[attach %s] attach: plugged in %.1f ms, agent announced %.1f ms later (round trip %.0f ms), "
      "machine %s\n",
      version.c_str(), (*attached)["plug_ms"].get<double>(),
      (*attached)["announce_ms"].get<double>(),
      std::chrono::duration<double, std::milli>(Clock::now() - attach_start).count(),
      (*attached)["transport"]["machine"].get<std::string>().c_str());
  // A second attach while one is plugged is refused.
  const RunResult twice = hvt.Hvtrace({"attach", name, "--wait-ms", "0"});
  EXPECT_EQ(twice.status, 1) << twice.output;
  EXPECT_NE(twice.output.find("already attached"), std::string::npos) << twice.output;

  // The agent publishes the kernel's symbols a few seconds after it
  // attached (read and compressed on a thread); the names below need them.
  ASSERT_TRUE(GuestLogHas(guest, "/tmp/agent.log", "symbols: ")) << "no symbols published\n"
                                                                 << diag();
  auto symbols_line = guest.Run("grep 'symbols: ' /tmp/agent.log");
  std::printf("[attach %s] agent: %s\n", version.c_str(),
              symbols_line.ok() ? symbols_line->output.c_str() : "?");

  // Live stream: markers through both paths, in order, with the right text.
  StreamReader stream(hvt, name);
  ASSERT_TRUE(stream.WaitForNote("streaming VM", std::chrono::seconds(10))) << stream.output();
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // The stream's first look is taken.
  const auto write_start = Clock::now();
  ASSERT_EQ(guest.Run("echo HVT-K1 > /sys/kernel/tracing/instances/hvtrace/trace_marker")->status,
            0);
  auto dw = guest.Run("hvtrace-guest-test dw-write --count 3 HVT-DW");
  ASSERT_TRUE(dw.ok());
  ASSERT_EQ(dw->status, 0) << dw->output;
  ASSERT_EQ(guest.Run("echo HVT-K2 > /sys/kernel/tracing/instances/hvtrace/trace_marker")->status,
            0);
  const bool all_seen = stream.WaitFor(
      [](const std::string& t) {
        return t.find("HVT-K2") != std::string::npos && t.find("HVT-DW 2") != std::string::npos;
      },
      std::chrono::seconds(30));
  const double seen_ms =
      std::chrono::duration<double, std::milli>(Clock::now() - write_start).count();
  const std::string text = stream.text();
  ASSERT_TRUE(all_seen) << "stream text:\n" << text << "\nnotes:\n" << stream.notes() << diag();
  const size_t k1 = text.find("HVT-K1"), d0 = text.find("HVT-DW 0"), d1 = text.find("HVT-DW 1"),
               d2 = text.find("HVT-DW 2"), k2 = text.find("HVT-K2");
  EXPECT_LT(k1, d0) << text;
  EXPECT_LT(d0, d1) << text;
  EXPECT_LT(d1, d2) << text;
  EXPECT_LT(d2, k2) << text;
  const std::string k1_line = LineWith(text, "HVT-K1"), d0_line = LineWith(text, "HVT-DW 0");
  EXPECT_NE(k1_line.find("print:"), std::string::npos) << k1_line;
  // print's ip names tracing_mark_write with the guest's own symbols (the
  // agent's symbol area). The task prints as <...> here, as in the guest's
  // own trace file: the kernel records task names only while some trace
  // event is enabled (TextEqualsTheGuestsOwnTraceFile enables one and
  // compares the whole line with the guest's).
  EXPECT_TRUE(std::regex_search(k1_line, std::regex(R"(print:\s+tracing_mark_write: HVT-K1$)")))
      << k1_line;
  EXPECT_NE(d0_line.find("marker:"), std::string::npos) << d0_line;
  EXPECT_NE(d0_line.find("seq=0 text=HVT-DW 0"), std::string::npos) << d0_line;
  std::printf(
      "[attach %s] stream: 5 markers written and shown in %.0f ms (guest commands over a TCG "
      "console "
      "included)\n  %s\n  %s\n",
      version.c_str(), seen_ms, k1_line.c_str(), d0_line.c_str());

  // Detach: the device goes (DEVICE_DELETED), the agent lets go, the stream
  // ends, and the region stays readable for a capture.
  auto detached = hvt.HvtraceJson({"detach", name});
  ASSERT_TRUE(detached.ok()) << detached.error().message << diag();
  EXPECT_EQ((*detached)["detached"], true);
  EXPECT_EQ((*detached)["device"], (*attached)["device"]["id"]);
  EXPECT_EQ((*detached)["region"]["file"], region_file);
  EXPECT_FALSE(detached->contains("object_del_error")) << detached->dump(2);
  EXPECT_TRUE(stream.WaitForExit(std::chrono::seconds(5))) << stream.output();
  EXPECT_TRUE(stream.done()) << "the stream should end when the region is detached";
  EXPECT_NE(stream.end().find("region detached"), std::string::npos) << stream.end();
  EXPECT_TRUE(GuestLogHas(guest, "/tmp/agent.log", "detached:")) << "the agent did not let go\n"
                                                                 << diag();
  auto devices = guest.Run("cat /sys/bus/pci/devices/*/device | grep -c 0x1110 || true");
  ASSERT_TRUE(devices.ok());
  EXPECT_NE(devices->output.find('0'), std::string::npos)
      << "ivshmem still in the guest: " << devices->output;
  const RunResult twice_detached = hvt.Hvtrace({"detach", name});
  EXPECT_EQ(twice_detached.status, 1);
  EXPECT_NE(twice_detached.output.find("no region is attached"), std::string::npos)
      << twice_detached.output;
  std::printf("[attach %s] detach: DEVICE_DELETED after %.1f ms\n", version.c_str(),
              (*detached)["device_deleted_ms"].get<double>());

  auto first_capture = hvt.HvtraceJson({"capture", name});
  ASSERT_TRUE(first_capture.ok()) << first_capture.error().message << diag();
  const fs::path captures = fs::path(hvt.state_dir()) / "vms" / name / "captures";
  const std::string first_report = RunCommand(
      "trace-cmd report " +
      (captures / (*first_capture)["capture"].get<std::string>() / "region-gen-1.trace.dat")
          .string() +
      " 2>&1");
  for (const char* m : {"HVT-K1", "HVT-K2", "text=HVT-DW 0", "text=HVT-DW 2"}) {
    EXPECT_NE(first_report.find(m), std::string::npos)
        << m << " missing from the detached region's capture\n"
        << first_report.substr(0, 3000);
  }

  // Written while no region is plugged: must reach nobody.
  ASSERT_EQ(guest.Run("echo HVT-GAP > /sys/kernel/tracing/instances/hvtrace/trace_marker")->status,
            0);

  // Re-attach in the same guest (the VM is watched now: no --qmp).
  auto again = hvt.HvtraceJson({"attach", name, "--pump-ms", "50", "--wait-ms", "60000"});
  ASSERT_TRUE(again.ok()) << again.error().message << diag();
  ASSERT_FALSE((*again)["guest"].is_null()) << again->dump(2) << diag();
  EXPECT_NE((*again)["region"]["region_id"], (*attached)["region"]["region_id"]);
  EXPECT_NE((*again)["device"]["id"], (*attached)["device"]["id"]);
  EXPECT_EQ((*again)["guest"]["boot_id"], g["boot_id"]) << "same guest, same boot";
  EXPECT_EQ((*again)["guest"]["boot_generation"], 1);
  std::printf("[attach %s] re-attach: plugged in %.1f ms, agent re-mapped %.1f ms later\n",
              version.c_str(), (*again)["plug_ms"].get<double>(),
              (*again)["announce_ms"].get<double>());

  // `hvtrace stream` (the CLI) shows what is written after the re-attach.
  StreamReader cli(hvt, name);
  ASSERT_TRUE(cli.WaitForNote("streaming VM", std::chrono::seconds(10))) << cli.output();
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  ASSERT_EQ(guest.Run("echo HVT-R-K1 > /sys/kernel/tracing/instances/hvtrace/trace_marker")->status,
            0);
  auto dw_again = guest.Run("hvtrace-guest-test dw-write --count 2 HVT-R-DW");
  ASSERT_TRUE(dw_again.ok());
  ASSERT_EQ(dw_again->status, 0) << dw_again->output;
  ASSERT_TRUE(cli.WaitForText("text=HVT-R-DW 1", std::chrono::seconds(30)))
      << "markers written after the re-attach never reached `hvtrace stream`\n"
      << cli.output() << diag();
  EXPECT_TRUE(cli.WaitForText("HVT-R-K1", std::chrono::seconds(1))) << cli.output();

  // Crash: a burst of trace_marker writes, then direct writes, then panic.
  constexpr int kBurst = 300;
  const std::string crash =
      "i=0; while [ $i -lt " + std::to_string(kBurst) +
      " ]; do echo HVT-LOSS-$i > /sys/kernel/tracing/instances/hvtrace/trace_marker; "
      "i=$((i+1)); done; "
      "hvtrace-guest-test dw-write --count 5 HVT-LAST > /dev/null; echo c > /proc/sysrq-trigger\n";
  ASSERT_TRUE(guest.console().Send(crash).ok());
  fs::path capture_dir;
  const auto deadline = Clock::now() + std::chrono::seconds(90);
  while (Clock::now() < deadline && capture_dir.empty()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    auto list = hvt.HvtraceJson({"captures", name});
    if (!list.ok()) continue;
    for (const json& c : (*list)["captures"]) {
      if (c.value("trigger", "") == "panic") capture_dir = captures / c.value("id", "");
    }
  }
  ASSERT_FALSE(capture_dir.empty()) << "no panic capture\n" << diag();
  EXPECT_TRUE(cli.WaitForExit(std::chrono::seconds(10)))
      << "`hvtrace stream` should end when the guest panics";
  EXPECT_NE(cli.output().find("panicked"), std::string::npos) << cli.output();
  for (const char* old : {"HVT-K1", "HVT-DW", "HVT-GAP"}) {
    EXPECT_EQ(cli.output().find(old), std::string::npos)
        << old << " in the stream after the re-attach";
  }

  const json manifest = json::parse(ReadText(capture_dir / "manifest.json"));
  const json& attach = manifest["extra"]["attach"];
  EXPECT_EQ(manifest["region"]["kind"], "attach") << manifest.dump(2);
  EXPECT_EQ(attach["vm_paused"], true);
  const fs::path dat = capture_dir / "region-gen-1.trace.dat";
  ASSERT_TRUE(fs::exists(dat)) << manifest.dump(2);
  // trace-cmd is the oracle for the file.
  const std::string report = RunCommand("trace-cmd report " + dat.string() + " 2>&1");
  // The second region holds the second session only: nothing from the first
  // region, nothing the kernel buffered while none was plugged.
  EXPECT_NE(report.find("HVT-R-K1"), std::string::npos);
  for (int i = 0; i < 2; ++i) {
    EXPECT_NE(report.find("text=HVT-R-DW " + std::to_string(i)), std::string::npos)
        << "dw event " << i;
  }
  for (const char* old : {"HVT-K1", "HVT-K2", "HVT-DW ", "HVT-GAP"}) {
    EXPECT_EQ(report.find(old), std::string::npos) << old << " leaked into the re-attached region";
  }
  // And the first region was not written after DEVICE_DELETED.
  for (const char* later : {"HVT-GAP", "HVT-R-", "HVT-LOSS", "HVT-LAST"}) {
    EXPECT_EQ(first_report.find(later), std::string::npos)
        << later << " in the detached region's capture";
  }
  uint64_t last_dw_ns = 0;
  for (int i = 0; i < 5; ++i) {
    const std::string line = LineWith(report, "text=HVT-LAST " + std::to_string(i));
    EXPECT_FALSE(line.empty()) << "direct-write event HVT-LAST " << i
                               << " written before the crash is missing";
    if (i == 0) last_dw_ns = LineTimeNs(line);
  }
  // Kernel markers: a prefix 0..k, nothing after the agent's last push.
  int last = -1, present = 0;
  uint64_t last_kernel_ns = 0;
  for (int i = 0; i < kBurst; ++i) {
    const std::string line = MarkerLine(report, "HVT-LOSS-" + std::to_string(i));
    if (line.empty()) continue;
    ++present;
    if (i == last + 1) {
      last = i;
      last_kernel_ns = LineTimeNs(line);
    }
  }
  EXPECT_EQ(present, last + 1) << "kernel markers captured are not a prefix of those written";
  const uint64_t last_push_ns = attach["loss_window"]["agent_last_push_mono_ns"].get<uint64_t>();
  const uint64_t max_gap_ns = attach["loss_window"]["agent_max_push_gap_ns"].get<uint64_t>();
  if (last >= 0) {
    EXPECT_LE(last_kernel_ns, last_push_ns / 1000 * 1000 + 1000);
  }
  std::printf(
      "[attach %s] crash capture: %d/%d trace_marker events captured, 5/5 + 3/3 direct-write "
      "events; "
      "loss window measured %.1f ms (last captured marker %.6f s -> first direct write after the "
      "loop %.6f s), %d marker(s) lost; agent: last push %.6f s, largest push gap %.1f ms; "
      "%llu events in the capture\n",
      version.c_str(), last + 1, kBurst,
      last_dw_ns > last_kernel_ns ? (last_dw_ns - last_kernel_ns) / 1e6 : 0.0, last_kernel_ns / 1e9,
      last_dw_ns / 1e9, kBurst - (last + 1), last_push_ns / 1e9, max_gap_ns / 1e6,
      static_cast<unsigned long long>(manifest["totals"]["events"].get<uint64_t>()));

  // `hvtrace show` prints the capture too.
  const std::string shown =
      RunCommand(std::string(HVTRACE_BIN_DIR) + "/hvtrace show " + capture_dir.string() + " 2>&1");
  EXPECT_NE(shown.find("text=HVT-LAST 4"), std::string::npos) << shown.substr(0, 3000);
}

// One marker line of the guest's own instances/hvtrace/trace or of
// `trace-cmd report` text, in the parts both print: task, pid, CPU, time and
// the print's text ("tracing_mark_write: HVT-T1"). The guest's file has an
// irq-flags column and no event name for print; trace-cmd prints "print:"
// and no flags (without -l).
struct MarkerText {
  std::string comm, pid, cpu, time, message;
  bool operator==(const MarkerText&) const = default;
  std::string Show() const { return comm + "-" + pid + " [" + cpu + "] " + time + ": " + message; }
};
std::optional<MarkerText> ParseGuestTraceLine(const std::string& line) {
  static const std::regex re(R"(^\s*(.+)-(\d+)\s+\[(\d+)\]\s+\S+\s+(\d+\.\d+):\s+(.*\S)\s*$)");
  std::smatch m;
  if (!std::regex_match(line, m, re)) return std::nullopt;
  return MarkerText{m[1], m[2], m[3], m[4], m[5]};
}
std::optional<MarkerText> ParseReportLine(const std::string& line) {
  static const std::regex re(
      R"(^\s*(.+)-(\d+)\s+\[(\d+)\]\s+(?:\S{5,6}\s+)?(\d+\.\d+):\s+print:\s+(.*\S)\s*$)");
  std::smatch m;
  if (!std::regex_match(line, m, re)) return std::nullopt;
  return MarkerText{m[1], m[2], m[3], m[4], m[5]};
}

// The text of an attached VM is the guest's own: for trace_marker writes the
// stream prints what the agent's instance's trace file in the guest prints
// (task name from the guest's saved_cmdlines, the print's ip as the guest's symbol
// tracing_mark_write), and a capture's trace.dat names %ps functions
// (hrtimer_start's function=) from the guest's symbols for trace-cmd too.
// The agent pumps at attach and then only every minute, so the markers are
// still in the guest's buffer when the guest reads its trace file; stopping
// the agent (SIGTERM) pushes them to the region.
TEST_P(AttachE2e, TextEqualsTheGuestsOwnTraceFile) {
  const std::string version = GetParam();
  if (std::string why = QemuUnavailableReason(); !why.empty()) GTEST_SKIP() << why;
  if (access((std::string(HVTRACE_BIN_DIR) + "/hvtrace-agent").c_str(), X_OK) != 0) {
    GTEST_SKIP() << "hvtrace-agent not built";
  }
  auto image = ImageWithThisAgent(version);
  ASSERT_TRUE(image.ok()) << image.error().message;
  const std::string tag = AttachTag("attach-text", version);
  TestGuest guest(tag);
  auto booted = BootWithAgent(guest, *image, tag);
  ASSERT_TRUE(booted.ok()) << booted.error().message;
  const std::string daemon_qmp = *booted;

  HvtracedProcess hvt({.tag = tag});
  Status started = hvt.Start();
  ASSERT_TRUE(started.ok()) << started.error().message;
  const std::string name = tag + "-" + std::to_string(::getpid());
  struct Cleanup {
    std::string path;
    ~Cleanup() { std::filesystem::remove(path); }
  } cleanup{hvt.dir() + "/run/mem/hvtrace-" + name + "-attach"};
  auto diag = [&] {
    return guest.Diagnostics() + "\n--- agent ---\n" + guest.Run("cat /tmp/agent.log")->output +
           "\n--- hvtraced ---\n" + hvt.LogTail();
  };
  auto attached =
      hvt.HvtraceJson({"attach", name, "--qmp", daemon_qmp, "--size", "16M", "--pump-ms", "60000",
                       "--events", "timer:hrtimer_start", "--wait-ms", "60000"});
  ASSERT_TRUE(attached.ok()) << attached.error().message << diag();
  ASSERT_FALSE((*attached)["guest"].is_null()) << attached->dump(2) << diag();
  ASSERT_TRUE(GuestLogHas(guest, "/tmp/agent.log", "symbols: ")) << "no symbols published\n"
                                                                 << diag();
  auto symbols_line = guest.Run("grep 'symbols: ' /tmp/agent.log");
  std::printf("[attach-text %s] agent: %s\n", version.c_str(),
              symbols_line.ok() ? symbols_line->output.c_str() : "?");

  StreamReader stream(hvt, name);
  ASSERT_TRUE(stream.WaitForNote("streaming VM", std::chrono::seconds(10))) << stream.output();
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  // One shell: the builtin echo writes the markers, then the guest's own
  // trace file is read while the agent has not pumped them yet.
  auto own = guest.Run(
      "for m in HVT-T1 HVT-T2 HVT-T3; do echo $m > "
      "/sys/kernel/tracing/instances/hvtrace/trace_marker; done; "
      "grep -E 'HVT-T[0-9]$' /sys/kernel/tracing/instances/hvtrace/trace");
  ASSERT_TRUE(own.ok()) << own.error().message;
  ASSERT_TRUE(guest.Run("kill -TERM $(pidof hvtrace-agent)").ok());
  ASSERT_TRUE(GuestLogHas(guest, "/tmp/agent.log", "agent exit")) << diag();
  ASSERT_TRUE(
      stream.WaitFor([](const std::string& t) { return t.find("HVT-T3") != std::string::npos; },
                     std::chrono::seconds(30)))
      << "stream:\n"
      << stream.text().substr(0, 3000) << "\nnotes:\n"
      << stream.notes() << diag();
  const std::string text = stream.text();
  std::printf("[attach-text %s] the guest's own trace file:\n%s", version.c_str(),
              own->output.c_str());
  for (const char* marker : {"HVT-T1", "HVT-T2", "HVT-T3"}) {
    const std::string guest_line = MarkerLine(own->output, marker);
    const std::string stream_line = MarkerLine(text, marker);
    const auto g = ParseGuestTraceLine(guest_line);
    const auto h = ParseReportLine(stream_line);
    ASSERT_TRUE(g.has_value()) << "guest line: '" << guest_line << "'\n" << own->output;
    ASSERT_TRUE(h.has_value()) << "stream line: '" << stream_line << "'";
    EXPECT_EQ(*h, *g) << "stream:    " << h->Show() << "\nguest's:   " << g->Show();
    EXPECT_EQ(h->message, std::string("tracing_mark_write: ") + marker);
    std::printf("[attach-text %s] stream: %s\n", version.c_str(), stream_line.c_str());
  }

  // The capture's trace.dat carries the symbols and task names: trace-cmd
  // prints the same marker lines and names hrtimer_start's functions.
  auto captured = hvt.HvtraceJson({"capture", name});
  ASSERT_TRUE(captured.ok()) << captured.error().message << diag();
  const fs::path dir = fs::path(hvt.state_dir()) / "vms" / name / "captures" /
                       (*captured)["capture"].get<std::string>();
  const std::string report =
      RunCommand("trace-cmd report " + (dir / "region-gen-1.trace.dat").string() + " 2>&1");
  for (const char* marker : {"HVT-T1", "HVT-T3"}) {
    EXPECT_EQ(ParseReportLine(MarkerLine(report, marker)),
              ParseGuestTraceLine(MarkerLine(own->output, marker)))
        << marker << " in trace-cmd report of the capture:\n"
        << MarkerLine(report, marker);
  }
  std::istringstream lines(report);
  int named = 0, hex = 0;
  std::string example;
  static const std::regex fn_re(R"(hrtimer_start:.*function=([A-Za-z_][A-Za-z0-9_.]*)\b)");
  for (std::string line; std::getline(lines, line);) {
    if (line.find("hrtimer_start:") == std::string::npos) continue;
    std::smatch m;
    if (std::regex_search(line, m, fn_re) && m[1].str().rfind("0x", 0) != 0) {
      if (named++ == 0) example = line;
    } else {
      ++hex;
    }
  }
  EXPECT_GT(named, 0) << "no hrtimer_start with a named function\n" << report.substr(0, 3000);
  const json manifest = json::parse(ReadText(dir / "manifest.json"));
  const json& names = manifest["extra"]["attach"]["names"];
  EXPECT_GT(names["per_generation"]["1"]["symbols"].get<uint64_t>(), 10000u) << names.dump();
  EXPECT_EQ(names["guest_symbols_state"], 1) << names.dump();
  std::printf(
      "[attach-text %s] capture: %d hrtimer_start events name their function, %d do not; e.g.\n  "
      "%s\n"
      "  names: %s\n  region-gen-1.trace.dat %llu bytes, decoded and written in %.1f ms\n",
      version.c_str(), named, hex, example.c_str(), names.dump().c_str(),
      static_cast<unsigned long long>(fs::file_size(dir / "region-gen-1.trace.dat")),
      manifest["extra"]["attach"].value("decode_write_ms", -1.0));
  const std::string shown =
      RunCommand(std::string(HVTRACE_BIN_DIR) + "/hvtrace show " + dir.string() + " 2>&1");
  EXPECT_NE(shown.find(MarkerLine(report, "HVT-T2")), std::string::npos)
      << "hvtrace show prints trace-cmd's line\n"
      << MarkerLine(report, "HVT-T2");

  // SIGTERM while a stream client is connected: the stream ends saying why
  // and the daemon exits (it once waited forever for the stream's worker).
  StreamReader last_stream(hvt, name);
  ASSERT_TRUE(last_stream.WaitForNote("streaming VM", std::chrono::seconds(10)))
      << last_stream.output();
  const double exit_ms = hvt.Stop();
  EXPECT_GE(exit_ms, 0) << "hvtraced needed SIGKILL after SIGTERM with a stream connected\n"
                        << hvt.LogTail();
  ASSERT_TRUE(last_stream.WaitForExit(std::chrono::seconds(5))) << last_stream.output();
  EXPECT_NE(last_stream.end().find("shutting down"), std::string::npos) << last_stream.end();
  // vm_on_shutdown = keep (the default): the adopted guest runs on.
  EXPECT_EQ(guest.Run("echo alive")->status, 0) << guest.Diagnostics();
  std::printf("[attach-text %s] SIGTERM with a stream connected: hvtraced exited after %.1f ms\n",
              version.c_str(), exit_ms);
}

INSTANTIATE_TEST_SUITE_P(Kernels, AttachE2e, ::testing::Values("6.12", "6.1", "7.3"),
                         [](const ::testing::TestParamInfo<std::string>& p) {
                           return KernelParamName(p.param);
                         });

}  // namespace
}  // namespace hvtrace::e2e
