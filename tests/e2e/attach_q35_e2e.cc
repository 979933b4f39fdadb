// `hvtrace attach` on a q35 VM (6.12 guest, QEMU launched by the test).
//
// q35's pcie.0 takes no hot-plug: the region needs a free pcie-root-port
// whose 64-bit prefetchable window (pref64-reserve) holds its BAR, or the
// guest cannot map it while QEMU's device_add still answers {}. The VM has
// one spare port with a 4 MiB window. A 16 MiB attach must be refused,
// saying what the VM needs, with nothing plugged and no region file left;
// a 4 MiB attach goes onto that port, the agent maps it, a marker reaches
// the host, and `hvtrace detach` unplugs it again (DEVICE_DELETED). A
// third attach is ejected by the guest itself: the VM is detached as well.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "attach_region_host.h"
#include "guest_harness.h"
#include "hvtraced_harness.h"
#include "stream_reader.h"

namespace hvtrace::e2e {
namespace {

using nlohmann::json;

// How many ivshmem devices (1af4:1110) the guest sees.
std::string GuestIvshmemCount(TestGuest& guest) {
  auto r = guest.Run("cat /sys/bus/pci/devices/*/device | grep -c 0x1110 || true");
  return r.ok() ? r->output : "?";
}

// How many ivshmem devices (1af4:1110) QEMU's query-pci lists, behind
// bridges too.
int QemuIvshmemCount(const json& devices) {
  int n = 0;
  if (!devices.is_array()) return 0;
  for (const json& d : devices) {
    if (!d.is_object()) continue;
    const json id = d.value("id", json::object());
    if (id.is_object() && id.value("vendor", 0) == 0x1af4 && id.value("device", 0) == 0x1110) ++n;
    if (d.contains("pci_bridge") && d["pci_bridge"].is_object()) {
      n += QemuIvshmemCount(d["pci_bridge"].value("devices", json::array()));
    }
  }
  return n;
}

TEST(AttachQ35E2e, RefusedWithoutARootPortWindowThenPlugsIntoTheSpareRootPort) {
  if (std::string why = QemuUnavailableReason(); !why.empty()) GTEST_SKIP() << why;
  if (access((std::string(HVTRACE_BIN_DIR) + "/hvtrace-agent").c_str(), X_OK) != 0) {
    GTEST_SKIP() << "hvtrace-agent not built";
  }
  auto image = ImageWithThisAgent("6.12");
  ASSERT_TRUE(image.ok()) << image.error().message;

  TestGuest guest("attach-q35");
  hostd::VmConfig config = guest.MakeConfig(*image);
  config.machine = hostd::MachineType::kQ35;
  const std::string daemon_qmp = AddDaemonMonitor(config, "attach-q35");
  config.extra_args.insert(
      config.extra_args.end(),
      {"-device", "pcie-root-port,id=hvt-rp0,bus=pcie.0,chassis=1,pref64-reserve=4M"});
  auto booted = guest.Boot(config);
  ASSERT_TRUE(booted.ok()) << booted.error().message << guest.Diagnostics();
  ASSERT_EQ(guest.Run("(hvtrace-agent > /tmp/agent.log 2>&1 &)")->status, 0);

  HvtracedProcess hvt({.tag = "q35"});
  Status started = hvt.Start();
  ASSERT_TRUE(started.ok()) << started.error().message;
  const std::string name = "q35-" + std::to_string(::getpid());
  const std::string region_file = hvt.dir() + "/run/mem/hvtrace-" + name + "-attach";
  struct Cleanup {
    std::string path;
    ~Cleanup() { std::filesystem::remove(path); }
  } cleanup{region_file};
  auto diag = [&] {
    auto agent = guest.Run("cat /tmp/agent.log");
    return guest.Diagnostics() + "\n--- agent ---\n" + (agent.ok() ? agent->output : "?") +
           "\n--- hvtraced ---\n" + hvt.LogTail();
  };

  // 16 MiB does not fit the port's 4 MiB window: refused, and why.
  const RunResult refused =
      hvt.Hvtrace({"attach", name, "--qmp", daemon_qmp, "--size", "16M", "--wait-ms", "5000"});
  std::printf("[q35] refused attach (exit %d): %s", refused.status, refused.output.c_str());
  EXPECT_EQ(refused.status, 1);
  for (const char* needed : {"q35", "no free pcie-root-port", "hvt-rp0 window 4M",
                             "-device pcie-root-port,", "pref64-reserve=16M", "pc machine type"}) {
    EXPECT_NE(refused.output.find(needed), std::string::npos) << "refusal lacks '" << needed << "'";
  }
  EXPECT_EQ(refused.output.find("plugged as"), std::string::npos)
      << "a refusal must not read as success";
  EXPECT_FALSE(std::filesystem::exists(region_file)) << "a refused attach left its region file";
  auto pci = guest.qmp().Execute("query-pci", json::object(), kCommandTimeout);
  ASSERT_TRUE(pci.ok()) << pci.error().message;
  int on_bus = 0;
  for (const json& bus : *pci) on_bus += QemuIvshmemCount(bus.value("devices", json::array()));
  EXPECT_EQ(on_bus, 0) << "an ivshmem device is on the bus after a refusal";
  auto objects = guest.qmp().Execute("qom-list", {{"path", "/objects"}}, kCommandTimeout);
  ASSERT_TRUE(objects.ok()) << objects.error().message;
  EXPECT_EQ(objects->dump().find("hvtrace-mem-"), std::string::npos)
      << "a memory backend left behind";
  auto status = hvt.HvtraceJson({"status", name});
  ASSERT_TRUE(status.ok()) << status.error().message;
  EXPECT_NE(status->dump().find("pref64-reserve"), std::string::npos)
      << "status should keep the refusal: " << status->dump(2);

  // 4 MiB fits: plugged onto the spare port, the agent maps it.
  auto attached =
      hvt.HvtraceJson({"attach", name, "--size", "4M", "--pump-ms", "50", "--wait-ms", "60000"});
  ASSERT_TRUE(attached.ok()) << attached.error().message << diag();
  EXPECT_NE((*attached)["transport"]["machine"].get<std::string>().find("q35"), std::string::npos)
      << attached->dump(2);
  EXPECT_EQ((*attached)["device"]["bus"], "hvt-rp0") << attached->dump(2);
  ASSERT_FALSE((*attached)["guest"].is_null()) << attached->dump(2) << diag();
  EXPECT_EQ((*attached)["guest"]["kernel_release"], image->release);
  EXPECT_NE(GuestIvshmemCount(guest).find('1'), std::string::npos);
  std::printf("[q35] attach on %s: plugged in %.1f ms, agent announced %.1f ms later\n",
              (*attached)["device"]["bus"].get<std::string>().c_str(),
              (*attached)["plug_ms"].get<double>(), (*attached)["announce_ms"].get<double>());

  StreamReader stream(hvt, name);
  ASSERT_TRUE(stream.WaitForNote("streaming VM", std::chrono::seconds(10))) << stream.output();
  ASSERT_EQ(
      guest.Run("echo HVT-Q35-MARK > /sys/kernel/tracing/instances/hvtrace/trace_marker")->status,
      0);
  ASSERT_TRUE(stream.WaitForText("HVT-Q35-MARK", std::chrono::seconds(30)))
      << "the marker never reached the host\n"
      << stream.output() << diag();

  // Unplug from the root port (the guest's hot-plug driver must let go).
  auto detached = hvt.HvtraceJson({"detach", name, "--timeout-ms", "30000"});
  ASSERT_TRUE(detached.ok()) << detached.error().message << diag();
  EXPECT_EQ((*detached)["detached"], true);
  EXPECT_FALSE(detached->contains("object_del_error")) << detached->dump(2);
  EXPECT_TRUE(WaitUntil([&] { return GuestIvshmemCount(guest).find('0') != std::string::npos; },
                        std::chrono::seconds(20)))
      << "the guest still sees the device\n"
      << diag();
  std::printf("[q35] detach: DEVICE_DELETED after %.1f ms\n",
              (*detached)["device_deleted_ms"].get<double>());
  EXPECT_TRUE(stream.WaitForExit(std::chrono::seconds(5))) << stream.output();
  EXPECT_NE(stream.end().find("region detached"), std::string::npos) << stream.end();

  // Attached again, then the guest ejects the device itself (slot power
  // off): the DEVICE_DELETED nobody asked for marks the VM detached too.
  auto again = hvt.HvtraceJson({"attach", name, "--size", "4M", "--wait-ms", "60000"});
  ASSERT_TRUE(again.ok()) << again.error().message << diag();
  ASSERT_FALSE((*again)["guest"].is_null()) << again->dump(2) << diag();
  StreamReader second(hvt, name);
  ASSERT_TRUE(second.WaitForNote("streaming VM", std::chrono::seconds(10))) << second.output();
  ASSERT_EQ(
      guest
          .Run("for s in /sys/bus/pci/slots/*; do a=$(cat $s/address); "
               "grep -qs 0x1110 /sys/bus/pci/devices/$a.0/device && echo 0 > $s/power; done; true")
          ->status,
      0);
  EXPECT_TRUE(WaitUntil([&] { return GuestIvshmemCount(guest).find('0') != std::string::npos; },
                        std::chrono::seconds(20)))
      << "the guest could not eject the device\n"
      << diag();
  const auto ejected = std::chrono::steady_clock::now();
  EXPECT_TRUE(WaitUntil(
      [&] {
        auto st = hvt.HvtraceJson({"status", name});
        return st.ok() && st->contains("attach") && (*st)["attach"]["attached"] == false;
      },
      std::chrono::seconds(20)))
      << "a guest-side eject left the VM attached\n"
      << hvt.LogTail();
  std::printf(
      "[q35] guest-side eject: status says detached %.0f ms after the guest saw the device go\n",
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - ejected)
          .count());
  EXPECT_TRUE(second.WaitForExit(std::chrono::seconds(5))) << second.output();
  EXPECT_NE(second.end().find("region detached"), std::string::npos) << second.end();
  const RunResult after_eject = hvt.Hvtrace({"detach", name});
  EXPECT_EQ(after_eject.status, 1);
  EXPECT_NE(after_eject.output.find("no region is attached"), std::string::npos)
      << after_eject.output;
}

}  // namespace
}  // namespace hvtrace::e2e
