// hvtraced end to end with a real 6.12 guest under TCG: `boot` with a boot
// range, markers written in the guest, an on-demand capture while it runs,
// then a panic → a capture committed by the daemon, timed from the QMP event.
// One guest boot covers all of it (a boot is 10-20 s on this machine).
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "control_client.h"
#include "guest_harness.h"
#include "vm_console.h"

namespace hvtrace::e2e {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

std::string ReadAll(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// hvtraced in a private state/run dir; killed (then reaped) however the test ends.
class DaemonProcess {
 public:
  explicit DaemonProcess(const std::string& tag) {
    dir_ = "/tmp/hvt-" + tag + "-" + std::to_string(::getpid());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    // stop: the daemon's exit also ends the QEMU it booted (keep, the
    // production default, would leave it running after a failed test).
    std::ofstream(dir_ + "/hvtraced.conf") << "socket_group =\naccel = tcg\nvm_on_shutdown = stop\n";
  }
  ~DaemonProcess() {
    Kill();
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  std::string socket() const { return dir_ + "/run/hvtraced.sock"; }
  std::string state_dir() const { return dir_ + "/state"; }
  std::string log() const { return ReadAll(dir_ + "/hvtraced.log"); }

  bool Start() {
    pid_ = ::fork();
    if (pid_ == 0) {
      std::string log = dir_ + "/hvtraced.log";
      std::freopen(log.c_str(), "a", stderr);
      std::string bin = std::string(HVTRACE_BIN_DIR) + "/hvtraced";
      std::string conf = dir_ + "/hvtraced.conf", state = state_dir(), run = dir_ + "/run";
      ::execl(bin.c_str(), bin.c_str(), "--config", conf.c_str(), "--state-dir", state.c_str(),
              "--run-dir", run.c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
    for (int i = 0; i < 100; ++i) {
      if (auto c = hostd::ControlClient::Connect(socket(), 1s); c.ok()) return true;
      std::this_thread::sleep_for(100ms);
    }
    return false;
  }
  void Kill() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGTERM);
    for (int i = 0; i < 50 && ::waitpid(pid_, nullptr, WNOHANG) == 0; ++i) std::this_thread::sleep_for(100ms);
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }

  Result<json> Call(const std::string& cmd, const json& args, std::chrono::milliseconds timeout = 60s) {
    auto c = hostd::ControlClient::Connect(socket(), 5s);
    if (!c.ok()) return c.error();
    auto r = c->Call(cmd, args, timeout);
    if (!r.ok()) return r.error();
    if (!r->ok) return Error{cmd + ": " + r->error};
    return r->result;
  }

 private:
  std::string dir_;
  pid_t pid_ = -1;
};

TEST(HvtracedBootE2e, BootMarkersOnDemandCaptureThenPanicCapture) {
  if (std::string why = QemuUnavailableReason(); !why.empty()) GTEST_SKIP() << why;
  auto image = FindGuestImage("6.12");
  ASSERT_TRUE(image.ok()) << image.error().message;

  DaemonProcess daemon("boote2e");
  ASSERT_TRUE(daemon.Start()) << daemon.log();
  const std::string name = "boot-e2e-" + std::to_string(::getpid());
  auto booted = daemon.Call("boot", {{"name", name},
                                     {"kernel", image->kernel},
                                     {"initrd", image->initrd},
                                     {"accel", "tcg"},
                                     {"trace_size_mib", 16}});
  ASSERT_TRUE(booted.ok()) << booted.error().message << "\n" << daemon.log();
  const std::string console_log = (*booted)["console_log"];
  auto console = hostd::GuestConsole::Connect((*booted)["console_socket"], 10s);
  ASSERT_TRUE(console.ok()) << console.error().message;
  auto tail = [&] { return (*console)->Tail(40) + "\n--- hvtraced ---\n" + daemon.log(); };
  ASSERT_TRUE((*console)->WaitForLine("HVTRACE-GUEST-READY", kBootTimeout).ok()) << tail();

  // Markers through the boot instance's own trace_marker, plus some work.
  const std::string marker = "/sys/kernel/tracing/instances/boot_map/trace_marker";
  constexpr int kMarkers = 20;
  std::string cmd = "for i in $(seq 1 " + std::to_string(kMarkers) + "); do echo hvt-mark-$i > " +
                    marker + "; ls /proc > /dev/null; done";
  auto ran = (*console)->Run(cmd, kCommandTimeout);
  ASSERT_TRUE(ran.ok() && ran->status == 0) << tail();
  auto guest_count = (*console)->Run("grep -c hvt-mark- /sys/kernel/tracing/instances/boot_map/trace", kCommandTimeout);
  ASSERT_TRUE(guest_count.ok()) << tail();

  // On-demand capture while the guest runs.
  auto manual = daemon.Call("capture", {{"name", name}});
  ASSERT_TRUE(manual.ok()) << manual.error().message << "\n" << tail();
  const fs::path captures = fs::path(daemon.state_dir()) / "vms" / name / "captures";
  {
    fs::path dir = captures / (*manual)["capture"].get<std::string>();
    std::string region = ReadAll(dir / "region.bin");
    EXPECT_EQ(region.size(), 16u << 20);
    EXPECT_NE(region.find("hvt-mark-" + std::to_string(kMarkers)), std::string::npos);
    json m = json::parse(ReadAll(dir / "manifest.json"));
    EXPECT_EQ(m["trigger"], "manual");
    EXPECT_TRUE(m["extra"]["qmp"]["consistency"].contains("pages_being_written")) << m.dump(2);
    EXPECT_GT(m["totals"]["events"].get<uint64_t>(), 0u) << m.dump(2);
  }

  // The last marker right before the crash; the panic must be captured.
  ASSERT_TRUE((*console)->Send("echo hvt-last-before-crash > " + marker + "; echo c > /proc/sysrq-trigger\n").ok());
  json panic;
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  while (panic.is_null() && std::chrono::steady_clock::now() < deadline) {
    auto list = daemon.Call("captures", {{"name", name}});
    ASSERT_TRUE(list.ok()) << list.error().message;
    for (const json& c : (*list)["captures"]) {
      if (c.value("trigger", "") == "panic") panic = c;
    }
    if (panic.is_null()) std::this_thread::sleep_for(200ms);
  }
  ASSERT_FALSE(panic.is_null()) << tail();
  fs::path dir = captures / panic["id"].get<std::string>();
  std::string region = ReadAll(dir / "region.bin");
  EXPECT_NE(region.find("hvt-last-before-crash"), std::string::npos);
  json m = json::parse(ReadAll(dir / "manifest.json"));
  bool saw_panic_event = false;
  for (const json& e : m["qmp_events"]) saw_panic_event |= e["event"] == "GUEST_PANICKED";
  EXPECT_TRUE(saw_panic_event) << m.dump(2);
  EXPECT_EQ(m["extra"]["qmp"]["consistency"]["vm_paused"], true);
  auto status = daemon.Call("status", {{"name", name}});
  ASSERT_TRUE(status.ok());
  double ms = (*status)["last_capture"]["trigger_to_disk_ms"].get<double>();
  std::printf("[hvtraced e2e] panic->capture on disk: %.1f ms (16 MiB); copy %.1f ms, write+fsync %.1f ms; "
              "events recovered %s (guest trace file showed %s marker lines, %d written)\n",
              ms, m["extra"]["qmp"]["copy_ms"].get<double>(), m["extra"]["qmp"]["write_fsync_ms"].get<double>(),
              m["totals"]["events"].dump().c_str(), guest_count->output.c_str(), kMarkers);
  EXPECT_LT(ms, 2000.0);  // Goal 50 ms; loose bound for a loaded 2-core CI box.
  EXPECT_TRUE(daemon.Call("stop", {{"name", name}}).ok());
}

}  // namespace
}  // namespace hvtrace::e2e
