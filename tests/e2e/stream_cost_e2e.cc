// The real-guest half of bench/stream_cost.sh (not a test: it skips unless
// HVTRACE_BENCH_STREAM=1, and asserts no timing). A TCG guest with this
// build's agent is attached to a real hvtraced (16 MiB region, the agent's
// 50 ms pump), one `hvtrace stream` runs, and the guest writes direct-write
// events (hvtrace-guest-test dw-write) at three levels: none, a few writers
// pacing one event per millisecond each, and writers that do not pause. For
// each level it prints hvtraced's own CPU time (utime + stime from
// /proc/<pid>/stat) per second, the guest's event rate as the writers
// counted it, and the events the stream delivered.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "attach_region_host.h"
#include "guest_harness.h"
#include "hvtraced_harness.h"
#include "stream_reader.h"
#include "test_support.h"

namespace hvtrace::e2e {
namespace {

// utime + stime of |pid|, in seconds.
double ProcessCpuSeconds(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // Fields after the command name (which may hold spaces): state is field 3.
  std::istringstream rest(stat.substr(stat.rfind(')') + 2));
  std::string field;
  unsigned long long utime = 0, stime = 0;
  for (int i = 3; i <= 15 && rest >> field; ++i) {
    if (i == 14) utime = std::stoull(field);
    if (i == 15) stime = std::stoull(field);
  }
  return static_cast<double>(utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

size_t CountLines(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

TEST(StreamCostBench, DaemonCpuPerStream) {
  if (getenv("HVTRACE_BENCH_STREAM") == nullptr) GTEST_SKIP() << "bench/stream_cost.sh runs this";
  if (std::string why = QemuUnavailableReason(); !why.empty()) GTEST_SKIP() << why;
  auto image = ImageWithThisAgent("6.12");
  ASSERT_TRUE(image.ok()) << image.error().message;
  const std::string tag = "stream-cost";
  TestGuest guest(tag);
  hostd::VmConfig config = guest.MakeConfig(*image);
  const std::string daemon_qmp = AddDaemonMonitor(config, tag);
  ASSERT_TRUE(guest.Boot(config).ok()) << guest.Diagnostics();
  ASSERT_TRUE(guest.Run("(hvtrace-agent > /tmp/agent.log 2>&1 &)").ok());
  HvtracedProcess hvt({.tag = tag});
  ASSERT_TRUE(hvt.Start().ok());
  const std::string name = tag + "-" + std::to_string(::getpid());
  auto attached = hvt.HvtraceJson({"attach", name, "--qmp", daemon_qmp, "--size", "16M",
                                   "--pump-ms", "50", "--wait-ms", "60000"});
  ASSERT_TRUE(attached.ok()) << attached.error().message << hvt.LogTail();
  ASSERT_FALSE((*attached)["guest"].is_null()) << attached->dump(2);
  // The agent publishes symbols a few seconds after it attached; let that
  // and the first pushes settle before measuring.
  std::this_thread::sleep_for(std::chrono::seconds(8));

  StreamReader stream(hvt, name);
  ASSERT_TRUE(stream.WaitForNote("streaming VM", std::chrono::seconds(10))) << stream.output();
  std::this_thread::sleep_for(std::chrono::seconds(1));
  const int seconds = 10;
  struct Level {
    const char* label;
    int writers;
    int every_ms;  // -1: no writer.
  };
  std::printf(
      "[stream-cost] real TCG guest (6.12, 2 vCPUs), 16 MiB region, one `hvtrace stream`, "
      "%d s per level\n",
      seconds);
  std::printf("[stream-cost] %-22s %12s %14s %12s %12s\n", "level", "hvtraced", "guest events/s",
              "guest KB/s", "streamed");
  for (const Level level : {Level{"idle", 0, -1}, Level{"2 writers, 1/ms each", 2, 1},
                            Level{"4 writers, no pause", 4, 0}}) {
    const std::string mark =
        std::string("L") + std::to_string(level.writers) + "-" + std::to_string(level.every_ms);
    // One short console line (the serial console garbles long ones).
    std::string ids;
    for (int w = 0; w < level.writers; ++w) ids += " " + std::to_string(w);
    const std::string cmd =
        "rm -f /tmp/dw-*; for i in" + ids + "; do (hvtrace-guest-test dw-write --mono --for-ms " +
        std::to_string(seconds * 1000) + " --every-ms " + std::to_string(level.every_ms) + " " +
        mark + " >/tmp/dw-$i 2>&1 &); done";
    const size_t streamed_before = CountLines(stream.text(), mark + " ");
    const double cpu0 = ProcessCpuSeconds(hvt.pid());
    const auto t0 = std::chrono::steady_clock::now();
    if (level.writers > 0) {
      auto run = guest.Run(cmd);
      ASSERT_TRUE(run.ok()) << run.error().message;
    }
    std::this_thread::sleep_until(t0 + std::chrono::seconds(seconds));
    const double cpu = ProcessCpuSeconds(hvt.pid()) - cpu0;
    const double wall =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    // What the writers wrote ("dw-write: id N, W/N events written, ...").
    uint64_t written = 0;
    if (level.writers > 0) {
      std::this_thread::sleep_for(std::chrono::seconds(2));  // Writers print and exit.
      auto out = guest.Run("cat /tmp/dw-*");
      ASSERT_TRUE(out.ok());
      std::istringstream lines(out->output);
      for (std::string line; std::getline(lines, line);) {
        const size_t at = line.find(", ");
        if (line.rfind("dw-write:", 0) == 0 && at != std::string::npos)
          written += std::stoull(line.substr(at + 2));
      }
    }
    // Record: 8-byte header + 68-byte payload, rounded to 4 = 76 bytes.
    const double events_per_s = static_cast<double>(written) / seconds;
    std::printf("[stream-cost] %-22s %10.2f%% %14.0f %12.1f %12zu\n", level.label,
                100.0 * cpu / wall, events_per_s, events_per_s * 76 / 1000,
                CountLines(stream.text(), mark + " ") - streamed_before);
    std::fflush(stdout);
  }
  EXPECT_FALSE(stream.done()) << stream.output();
}

}  // namespace
}  // namespace hvtrace::e2e
