// Trouble a guest lives on after (issue #42, item 3): hvtraced watches the
// kernel log the guest's boot range records in host memory (log_watch.h)
// and takes `warn` and `oops` captures with the guest never paused. A 6.12
// and a 7.3 guest under TCG (each release's own printk and oops layout),
// hvt_beta loaded, panic_on_oops=0:
//   1. a WARN storm (hvt_beta's warn=N, in bursts for several seconds):
//      captures are rate-limited by guest_capture_interval (the rest
//      coalesced into them), each says `warn` with the module's WARNING
//      line, and the VM's captures stay inside capture_bytes_per_vm;
//   2. an oops in the module (a NULL write in hvt_beta_oops, in a child
//      shell): an `oops` capture whose summary names the BUG and Oops lines,
//      RIP and the module's frame, taken while the vCPUs ran;
//   3. the guest still runs and is still traced: a marker written after the
//      oops is in a capture taken after it.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "guest_harness.h"
#include "hvtraced_harness.h"
#include "test_support.h"
#include "vm_console.h"

namespace hvtrace::e2e {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;
using namespace std::chrono_literals;
using test_support::ReadText;

constexpr auto kInterval = 3s;             // guest_capture_interval below.
constexpr uint64_t kBudget = 64ull << 20;  // capture_bytes_per_vm below.

size_t Occurrences(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

// Allocated bytes, as the disk budget counts them (region.bin is sparse).
uint64_t BytesUnder(const fs::path& dir) {
  uint64_t bytes = 0;
  std::error_code ec;
  for (const auto& e : fs::recursive_directory_iterator(dir, ec)) {
    struct stat st {};
    if (::lstat(e.path().c_str(), &st) == 0 && S_ISREG(st.st_mode))
      bytes += static_cast<uint64_t>(st.st_blocks) * 512;
  }
  return bytes;
}

json Manifest(const HvtracedProcess& daemon, const std::string& vm, const std::string& id) {
  return json::parse(
      ReadText(fs::path(daemon.state_dir()) / "vms" / vm / "captures" / id / "manifest.json"));
}

class LogWatchE2e : public ::testing::TestWithParam<std::string> {};

TEST_P(LogWatchE2e, WarnStormRateLimitedThenOopsCapturedWhileTheGuestRunsOn) {
  if (std::string why = QemuUnavailableReason(); !why.empty()) GTEST_SKIP() << why;
  auto image = GuestImageWithTestModules(GetParam());
  ASSERT_TRUE(image.ok()) << image.error().message;
  auto cache_root = CacheWithFormatsOf(*image);
  ASSERT_TRUE(cache_root.ok()) << cache_root.error().message;
  HvtracedProcess daemon(
      HvtracedOptions{.tag = "logwatch",
                      .config = "vm_on_shutdown = stop\ncache_dir = " + cache_root->string() +
                                "\nguest_capture_interval = 3s\nlog_watch_interval = 250ms\n"
                                "capture_bytes_per_vm = 64M\n"});
  ASSERT_TRUE(daemon.Start().ok()) << daemon.log();
  const std::string name = "logwatch-" + std::to_string(::getpid());
  auto guest = BootGuestWithHvtBeta(
      daemon, name, image->kernel, image->initrd,
      "echo 0 > /proc/sys/kernel/panic_on_oops && echo 0 > /proc/sys/kernel/panic_on_warn");
  ASSERT_TRUE(guest.ok()) << guest.error().message;
  hostd::GuestConsole& console = *guest->console;
  auto tail = [&] { return ConsoleAndLog(*guest, daemon); };

  // 1. The storm: 10 bursts of 4 WARNINGs, half a second apart.
  const auto storm_start = std::chrono::steady_clock::now();
  auto storm = console.Run(
      "for i in $(seq 1 10); do echo 4 > /sys/module/hvt_beta/parameters/warn; sleep 0.5; done",
      kCommandTimeout);
  ASSERT_TRUE(storm.ok() && storm->status == 0) << tail();
  const double storm_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - storm_start).count();
  auto first = daemon.WaitForCapture(name, "warn", 30s);
  ASSERT_TRUE(first.ok()) << first.error().message << tail();
  // The captures the storm's triggers made: the last one starts at most an
  // interval after the storm ended.
  std::this_thread::sleep_for(kInterval + 4s);
  const std::string log = daemon.log();
  const size_t warn_captures = Occurrences(log, " (warn) stored");
  // One at the first trigger, one per interval after it, one trailing; the
  // last WARNING is seen up to a look (250 ms) after the storm ended.
  const size_t bound = static_cast<size_t>((storm_s + 1.0) / 3.0) + 2;
  std::printf("[log watch e2e] storm of 40 WARNINGs over %.1f s: %zu warn capture(s) (bound %zu)\n",
              storm_s, warn_captures, bound);
  EXPECT_GE(warn_captures, 1u) << log;
  EXPECT_LE(warn_captures, bound) << log;
  EXPECT_NE(log.find("trigger(s) coalesced into it"), std::string::npos)
      << "no warn capture stands for coalesced triggers:\n"
      << log;
  {
    const json m = Manifest(daemon, name, (*first)["id"]);
    ASSERT_TRUE(m.contains("crash")) << m["extra"].dump(2);
    EXPECT_EQ(m["crash"]["kind"], "warn") << m["crash"].dump(2);
    // 6.12: "WARNING: CPU: 0 PID: 174 at …"; 7.3: "WARNING: hvt_beta.c:109 at
    // warn_set+0x52/0x90 [hvt_beta], CPU#0: sh/174".
    const std::string line = m["crash"].value("warning_line", "");
    EXPECT_TRUE(line.starts_with(GetParam() == "6.12" ? "WARNING: CPU: " : "WARNING: hvt_beta.c:"))
        << m["crash"].dump(2);
    EXPECT_NE(m["crash"].value("warning_line", "").find("[hvt_beta]"), std::string::npos)
        << m["crash"].dump(2);
    EXPECT_EQ(m["extra"]["consistency"]["vcpus_stopped"], false) << m["extra"].dump(2);
  }
  const fs::path captures = fs::path(daemon.state_dir()) / "vms" / name / "captures";
  EXPECT_LE(BytesUnder(captures), kBudget);

  // 2. The oops, in a child shell (the task that writes dies holding the
  // module's parameter lock): the console's shell lives on.
  auto oops = console.Run("sh -c 'echo 1 > /sys/module/hvt_beta/parameters/oops'; echo survived",
                          kCommandTimeout);
  ASSERT_TRUE(oops.ok()) << tail();
  EXPECT_NE(oops->output.find("survived"), std::string::npos) << oops->output;
  auto captured = daemon.WaitForCapture(name, "oops", 60s);
  ASSERT_TRUE(captured.ok()) << captured.error().message << tail();
  {
    const json m = Manifest(daemon, name, (*captured)["id"]);
    ASSERT_TRUE(m.contains("crash")) << m["extra"].dump(2);
    const json& crash = m["crash"];
    EXPECT_EQ(crash["kind"], "oops") << crash.dump(2);
    EXPECT_TRUE(crash.value("bug_line", "").starts_with("BUG: kernel NULL pointer dereference"))
        << crash.dump(2);
    EXPECT_NE(crash.value("rip", "").find("hvt_beta_oops+0x"), std::string::npos) << crash.dump(2);
    bool module_frame = false;
    for (const json& f : crash["frames"]) {
      module_frame |= f["function"].get<std::string>().starts_with("oops_set+0x") &&
                      f.value("module", "") == "hvt_beta";
    }
    EXPECT_TRUE(module_frame) << crash["frames"].dump(2);
    EXPECT_EQ(m["extra"]["consistency"]["vcpus_stopped"], false) << m["extra"].dump(2);
  }

  // 3. Still running, still traced.
  auto status = daemon.Call("status", {{"name", name}});
  ASSERT_TRUE(status.ok()) << status.error().message;
  EXPECT_EQ((*status)["state"], "running") << status->dump(2);
  const json& watch = (*status)["log_watch"];
  EXPECT_GT(watch.value("looks", 0), 0) << status->dump(2);
  EXPECT_GE(watch.value("warn", 0), 1) << watch.dump();
  EXPECT_GE(watch.value("oops", 0), 1) << watch.dump();
  EXPECT_FALSE(watch.contains("error")) << watch.dump();
  std::printf("[log watch e2e] status log_watch: %s\n", watch.dump().c_str());
  auto marked = console.Run(
      "echo hvt-after-oops > /sys/kernel/tracing/instances/boot_map/trace_marker && echo ok",
      kCommandTimeout);
  ASSERT_TRUE(marked.ok() && marked->status == 0) << tail();
  auto manual = daemon.Call("capture", {{"name", name}});
  ASSERT_TRUE(manual.ok()) << manual.error().message << tail();
  const RunResult shown =
      daemon.Hvtrace({"show", name + "/" + (*manual)["capture"].get<std::string>()});
  EXPECT_EQ(shown.status, 0) << shown.output;
  EXPECT_NE(shown.output.find("hvt-after-oops"), std::string::npos)
      << "the marker written after the oops is not in the capture";
  EXPECT_LE(BytesUnder(captures), kBudget);
  EXPECT_TRUE(daemon.Call("stop", {{"name", name}}).ok());
}

INSTANTIATE_TEST_SUITE_P(Kernels, LogWatchE2e, ::testing::Values("6.12", "7.3"),
                         [](const ::testing::TestParamInfo<std::string>& p) {
                           return KernelParamName(p.param);
                         });

}  // namespace
}  // namespace hvtrace::e2e
