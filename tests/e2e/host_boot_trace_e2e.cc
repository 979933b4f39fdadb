// The host side of a VM's boot (`hvtrace boot --trace-boot`), end to end with
// the real 6.12 guest under TCG and the daemon's real boot path: QEMU (under
// its seccomp sandbox) traces the boot handshakes into the file the daemon
// created, a capture of the running VM and the panic capture carry that log
// (qemu-trace.log and manifest extra.host_trace), and a VM booted without
// --trace-boot gets no trace options at all. One guest boot; the second VM
// is stopped as soon as its argv is checked.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "guest_harness.h"
#include "hvtraced_harness.h"
#include "qemu_trace_log.h"
#include "test_support.h"
#include "vm_console.h"

namespace hvtrace::e2e {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;
using test_support::ReadText;

std::string Arg(const hostd::QemuTraceEvent& e, const std::string& key) {
  for (const auto& [k, v] : e.args) {
    if (k == key) return v;
  }
  return {};
}

uint64_t LineCount(const std::string& text) {
  return static_cast<uint64_t>(std::count(text.begin(), text.end(), '\n'));
}

bool Has(const std::vector<std::string>& argv, const std::string& arg) {
  return std::find(argv.begin(), argv.end(), arg) != argv.end();
}

// Whether |vals| (one device's status writes in order) holds the handshake
// 1 -> 3 -> 11 -> 15 after a reset, in that order.
bool WalksToDriverOk(const std::vector<std::string>& vals) {
  const std::vector<std::string> want = {"0", "1", "3", "11", "15"};
  size_t next = 0;
  for (const std::string& v : vals) {
    if (next < want.size() && v == want[next]) ++next;
  }
  return next == want.size();
}

TEST(HostBootTraceE2e, HandshakesFromQemuStartToPanic) {
  if (std::string why = QemuUnavailableReason(); !why.empty()) GTEST_SKIP() << why;
  auto image = FindGuestImage("6.12");
  ASSERT_TRUE(image.ok()) << image.error().message;
  HvtracedProcess daemon({.tag = "hbt", .config = "vm_on_shutdown = stop\n"});
  ASSERT_TRUE(daemon.Start().ok()) << daemon.log();

  // Without --trace-boot: no trace options, no log file (checked first, and
  // the VM is stopped at once: nothing of it needs the guest to boot).
  const std::string plain = "hbt-plain-" + std::to_string(::getpid());
  auto plain_boot = daemon.Call(
      "boot",
      {{"name", plain}, {"kernel", image->kernel}, {"initrd", image->initrd}, {"accel", "tcg"}});
  ASSERT_TRUE(plain_boot.ok()) << plain_boot.error().message << "\n" << daemon.log();
  const std::vector<std::string> plain_argv = (*plain_boot)["argv"];
  for (const char* opt : {"-trace", "-D", "-msg"}) EXPECT_FALSE(Has(plain_argv, opt)) << opt;
  EXPECT_FALSE(plain_boot->contains("qemu_trace_log"));
  EXPECT_FALSE(fs::exists(fs::path(daemon.vm_dir(plain)) / "qemu-trace.log"));
  EXPECT_TRUE(daemon.Call("stop", {{"name", plain}}).ok());

  const std::string name = "hbt-" + std::to_string(::getpid());
  auto booted = daemon.Call("boot", {{"name", name},
                                     {"kernel", image->kernel},
                                     {"initrd", image->initrd},
                                     {"accel", "tcg"},
                                     {"trace_boot", true},
                                     {"devices", {"virtio-blk", "virtio-net", "virtio-serial"}}});
  ASSERT_TRUE(booted.ok()) << booted.error().message << "\n" << daemon.log();
  const std::vector<std::string> argv = (*booted)["argv"];
  const fs::path log_path = fs::path(daemon.vm_dir(name)) / "qemu-trace.log";
  EXPECT_EQ((*booted)["qemu_trace_log"], log_path.string());
  EXPECT_TRUE(Has(argv, "-sandbox")) << (*booted)["argv"].dump();
  EXPECT_TRUE(Has(argv, "timestamp=on"));
  EXPECT_TRUE(Has(argv, log_path.string()));
  EXPECT_TRUE(Has(argv, "enable=virtio_set_status"));
  struct stat st {};
  ASSERT_EQ(::lstat(log_path.c_str(), &st), 0);
  EXPECT_TRUE(S_ISREG(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777, 0600u);

  // A capture while the guest is still booting carries the log so far (at
  // least QEMU's machine reset of every virtio device at its start). QEMU
  // writes them some time after `boot` returns (seen: nothing yet on a
  // loaded machine), so wait until a whole virtio_set_status line is there.
  auto has_reset_line = [&] {
    const std::string text = ReadText(log_path);
    const size_t at = text.find(":virtio_set_status ");
    return at != std::string::npos && text.find('\n', at) != std::string::npos;
  };
  const auto reset_deadline = std::chrono::steady_clock::now() + 30s;
  while (!has_reset_line() && std::chrono::steady_clock::now() < reset_deadline) {
    std::this_thread::sleep_for(20ms);
  }
  const fs::path captures = daemon.captures_dir(name);
  auto early = daemon.Call("capture", {{"name", name}});
  ASSERT_TRUE(early.ok()) << early.error().message << "\n" << daemon.LogTail();
  {
    const fs::path dir = captures / (*early)["capture"].get<std::string>();
    const json m = json::parse(ReadText(dir / "manifest.json"));
    ASSERT_TRUE(m["extra"].contains("host_trace")) << m["extra"].dump(2);
    const json& h = m["extra"]["host_trace"];
    EXPECT_FALSE(h.contains("error")) << h.dump();
    EXPECT_GT(h.value("events", uint64_t{0}), 0u) << h.dump();
    EXPECT_GT(h["by_name"].value("virtio_set_status", uint64_t{0}), 0u) << h.dump();
    EXPECT_EQ(h["bytes"], fs::file_size(dir / "qemu-trace.log"));
    std::printf("[host boot trace] capture while booting: %s events, %s bytes\n",
                h["events"].dump().c_str(), h["bytes"].dump().c_str());
  }

  auto console = hostd::GuestConsole::Connect((*booted)["console_socket"], 10s);
  ASSERT_TRUE(console.ok()) << console.error().message;
  auto tail = [&] { return (*console)->Tail(40) + "\n--- hvtraced ---\n" + daemon.LogTail(); };
  ASSERT_TRUE((*console)->WaitForLine("HVTRACE-GUEST-READY", kBootTimeout).ok()) << tail();

  // Cost: the log at "ready", and what an idle guest adds.
  const std::string at_ready = ReadText(log_path);
  std::this_thread::sleep_for(10s);
  const std::string after_idle = ReadText(log_path);
  std::printf(
      "[host boot trace] at ready: %llu lines, %zu bytes; idle 10 s: +%llu lines, +%zu bytes\n",
      static_cast<unsigned long long>(LineCount(at_ready)), at_ready.size(),
      static_cast<unsigned long long>(LineCount(after_idle) - LineCount(at_ready)),
      after_idle.size() - at_ready.size());
  EXPECT_GT(LineCount(at_ready), 0u);
  EXPECT_LT(at_ready.size(), 1u << 20) << "the curated list should stay small";

  // A capture of the running VM carries the log so far.
  auto manual = daemon.Call("capture", {{"name", name}});
  ASSERT_TRUE(manual.ok()) << manual.error().message << "\n" << tail();
  {
    const fs::path dir = captures / (*manual)["capture"].get<std::string>();
    const json m = json::parse(ReadText(dir / "manifest.json"));
    ASSERT_TRUE(m["extra"].contains("host_trace")) << m["extra"].dump(2);
    EXPECT_GT(m["extra"]["host_trace"]["events"].get<uint64_t>(), 0u);
    EXPECT_TRUE(fs::exists(dir / "qemu-trace.log"));
  }

  ASSERT_TRUE((*console)->Send("echo c > /proc/sysrq-trigger\n").ok());
  auto panic = daemon.WaitForCapture(name, "panic", 90s);
  ASSERT_TRUE(panic.ok()) << panic.error().message << "\n" << tail();
  const fs::path dir = captures / (*panic)["id"].get<std::string>();
  const json m = json::parse(ReadText(dir / "manifest.json"));
  const json& h = m["extra"]["host_trace"];
  ASSERT_TRUE(h.is_object() && !h.contains("error")) << m["extra"].dump(2);
  const std::string text = ReadText(dir / "qemu-trace.log");
  const hostd::QemuTraceLog log = hostd::ParseQemuTraceLog(text);
  std::printf(
      "[host boot trace] panic capture: %zu events, %zu bytes, malformed %llu; by name %s\n",
      log.events.size(), text.size(), static_cast<unsigned long long>(log.malformed_lines),
      h["by_name"].dump().c_str());
  EXPECT_EQ(log.malformed_lines, 0u) << log.first_problem;
  EXPECT_EQ(h["events"].get<uint64_t>(), log.events.size());
  EXPECT_EQ(h["malformed"], 0);
  EXPECT_EQ(h["skipped_head_bytes"], 0);
  EXPECT_GE(text.size(), after_idle.size());  // Everything since QEMU's start.
  EXPECT_EQ(text.compare(0, after_idle.size(), after_idle), 0);

  // Firmware read fw_cfg before the kernel acknowledged any virtio device.
  uint64_t first_fw_cfg = 0, first_ack = 0;
  std::map<std::string, std::vector<std::string>> status_by_vdev;
  std::vector<std::string> vdev_order;
  for (const hostd::QemuTraceEvent& e : log.events) {
    if (e.name == "fw_cfg_read" && first_fw_cfg == 0) first_fw_cfg = e.realtime_ns;
    if (e.name != "virtio_set_status") continue;
    const std::string vdev = Arg(e, "vdev"), val = Arg(e, "val");
    if (!status_by_vdev.count(vdev)) vdev_order.push_back(vdev);
    status_by_vdev[vdev].push_back(val);
    if (val == "1" && first_ack == 0) first_ack = e.realtime_ns;
  }
  ASSERT_NE(first_fw_cfg, 0u) << "no fw_cfg_read";
  ASSERT_NE(first_ack, 0u) << "no ACKNOWLEDGE";
  EXPECT_LT(first_fw_cfg, first_ack);
  // Four virtio devices: the three asked for and the metadata channel's
  // virtio-serial controller. Each is acknowledged by the guest's virtio
  // core (built in); the two virtio-serial ones are driven to DRIVER_OK by
  // the built-in virtio_console, virtio-blk and virtio-net by their modules,
  // which the initramfs loads (build-guest.sh).
  EXPECT_EQ(status_by_vdev.size(), 4u);
  int driver_ok = 0;
  for (const std::string& vdev : vdev_order) {
    const auto& vals = status_by_vdev[vdev];
    std::string seq;
    for (const std::string& v : vals) seq += (seq.empty() ? "" : " ") + v;
    std::printf("[host boot trace] vdev %s: %s\n", vdev.c_str(), seq.c_str());
    EXPECT_NE(std::find(vals.begin(), vals.end(), "1"), vals.end()) << vdev << ": " << seq;
    driver_ok += WalksToDriverOk(vals);
  }
  EXPECT_EQ(driver_ok, 4);
  std::printf("[host boot trace] %d of %zu virtio devices walked 0 1 3 11 15\n", driver_ok,
              status_by_vdev.size());
  EXPECT_TRUE(daemon.Call("stop", {{"name", name}}).ok());
}

}  // namespace
}  // namespace hvtrace::e2e
