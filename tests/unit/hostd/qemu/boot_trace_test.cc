#include "boot_trace.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "boot_request.h"
#include "recorded_qemu.h"
#include "vm_config.h"

namespace hvtrace::hostd {
namespace {

bool Has(const std::vector<std::string>& argv, const std::string& arg) {
  return std::find(argv.begin(), argv.end(), arg) != argv.end();
}

bool HasPrefix(const std::vector<std::string>& argv, const std::string& prefix) {
  return std::any_of(argv.begin(), argv.end(),
                     [&](const std::string& a) { return a.rfind(prefix, 0) == 0; });
}

Result<QemuPlan> PlanFor(const nlohmann::json& args) {
  auto request = ParseMessage<BootRequest>(args);
  if (!request.ok()) return request.error();
  BootPaths paths = DefaultBootPaths(request->name, "/run/hvt", "/var/lib/hvtrace/vms/g1");
  auto config = MakeBootVmConfig(*request, paths);
  if (!config.ok()) return config.error();
  static const QemuCaps caps = RecordedQemu("7.2");
  return BuildQemuPlan(*config, false, caps);
}

TEST(BootTraceTest, WithoutTraceBootNothingChanges) {
  auto plan = PlanFor({{"name", "g1"}, {"kernel", "/k/vmlinuz"}});
  ASSERT_TRUE(plan.ok()) << plan.error().message;
  EXPECT_FALSE(Has(plan->argv, "-trace"));
  EXPECT_FALSE(Has(plan->argv, "-D"));
  EXPECT_FALSE(Has(plan->argv, "-msg"));
  EXPECT_FALSE(Has(plan->argv, "-netdev"));
  EXPECT_FALSE(Has(plan->argv, "-drive"));
}

// Not the handshake trace, but the same boot request: a VM hvtraced boots
// always has QEMU's vmcoreinfo device (a vmcore then carries VMCOREINFO),
// and the per-VM vmcore setting is checked.
TEST(BootTraceTest, BootedVmsHaveVmcoreinfoAndVmcoreIsChecked) {
  auto plan = PlanFor({{"name", "g1"}, {"kernel", "/k/vmlinuz"}, {"vmcore", "on-panic"}});
  ASSERT_TRUE(plan.ok()) << plan.error().message;
  EXPECT_TRUE(Has(plan->argv, "vmcoreinfo"));
  auto request = ParseMessage<BootRequest>(
      nlohmann::json{{"name", "g1"}, {"kernel", "/k/vmlinuz"}, {"vmcore", "always"}});
  ASSERT_FALSE(request.ok());
  EXPECT_NE(request.error().message.find("not one of off, on-panic"), std::string::npos);
}

TEST(BootTraceTest, TraceBootAddsLogAndCuratedEvents) {
  auto plan = PlanFor({{"name", "g1"}, {"kernel", "/k/vmlinuz"}, {"trace_boot", true}});
  ASSERT_TRUE(plan.ok()) << plan.error().message;
  const auto& a = plan->argv;
  auto d = std::find(a.begin(), a.end(), "-D");
  ASSERT_NE(d, a.end());
  EXPECT_EQ(*(d + 1), "/var/lib/hvtrace/vms/g1/qemu-trace.log");
  auto msg = std::find(a.begin(), a.end(), "-msg");
  ASSERT_NE(msg, a.end());
  EXPECT_EQ(*(msg + 1), "timestamp=on");
  for (const std::string& e : BootTraceEvents()) EXPECT_TRUE(Has(a, "enable=" + e)) << e;
  // Per-I/O events stay off.
  for (const char* e : {"enable=virtio_notify", "enable=virtio_queue_notify", "enable=pci_cfg_read",
                        "enable=virtio_blk_handle_read"}) {
    EXPECT_FALSE(Has(a, e)) << e;
  }
  EXPECT_EQ(std::count(a.begin(), a.end(), "-trace"), static_cast<long>(BootTraceEvents().size()));
}

std::string KernelCmdline(const QemuPlan& plan) {
  auto it = std::find(plan.argv.begin(), plan.argv.end(), "-append");
  return it == plan.argv.end() || it + 1 == plan.argv.end() ? "" : *(it + 1);
}

TEST(BootTraceTest, TraceBootAddsTheHandshakeKprobesToTheGuestCommandLine) {
  auto plain = PlanFor({{"name", "g1"}, {"kernel", "/k/vmlinuz"}});
  ASSERT_TRUE(plain.ok()) << plain.error().message;
  EXPECT_EQ(KernelCmdline(*plain).find("kprobe_event="), std::string::npos);
  auto traced = PlanFor({{"name", "g1"}, {"kernel", "/k/vmlinuz"}, {"trace_boot", true}});
  ASSERT_TRUE(traced.ok()) << traced.error().message;
  EXPECT_NE(KernelCmdline(*traced).find(kHandshakeKprobeParam), std::string::npos)
      << KernelCmdline(*traced);
  EXPECT_NE(KernelCmdline(*traced).find(" trace_clock=local"), std::string::npos)
      << KernelCmdline(*traced);
  // A command line with its own boot kprobes (or trace clock) keeps them.
  auto own = PlanFor({{"name", "g1"},
                      {"kernel", "/k/vmlinuz"},
                      {"trace_boot", true},
                      {"append", "kprobe_event=p:kprobes/mine,do_sys_open"}});
  ASSERT_TRUE(own.ok()) << own.error().message;
  EXPECT_EQ(KernelCmdline(*own).find(kHandshakeKprobeParam), std::string::npos);
  EXPECT_NE(KernelCmdline(*own).find("kprobes/mine"), std::string::npos);
  auto clock = PlanFor({{"name", "g1"},
                        {"kernel", "/k/vmlinuz"},
                        {"trace_boot", true},
                        {"append", "trace_clock=global"}});
  ASSERT_TRUE(clock.ok()) << clock.error().message;
  EXPECT_EQ(KernelCmdline(*clock).find("trace_clock=local"), std::string::npos);
}

TEST(BootTraceTest, DevicesHaveHostPrivateBackends) {
  auto plan = PlanFor({{"name", "g1"},
                       {"kernel", "/k/vmlinuz"},
                       {"devices", {"virtio-blk", "virtio-net", "virtio-serial"}}});
  ASSERT_TRUE(plan.ok()) << plan.error().message;
  const auto& a = plan->argv;
  EXPECT_TRUE(Has(a, "driver=null-co,id=hvt_blk0,if=none,read-zeroes=on,size=64M"));
  EXPECT_TRUE(Has(a, "virtio-blk-pci,drive=hvt_blk0,id=hvt_dev_blk"));
  EXPECT_TRUE(Has(a, "user,id=hvt_net0,restrict=on"));
  EXPECT_TRUE(Has(a, "virtio-net-pci,netdev=hvt_net0,id=hvt_dev_net"));
  EXPECT_TRUE(Has(a, "virtio-serial-pci,id=hvt_dev_vser"));
  // No file or host network reaches the guest through them.
  EXPECT_FALSE(HasPrefix(a, "file="));
  EXPECT_FALSE(std::any_of(a.begin(), a.end(), [](const std::string& s) {
    return s.find("hostfwd") != std::string::npos || s.find("tap") != std::string::npos;
  }));
}

TEST(BootTraceTest, RequestRoundTrips) {
  auto r = ParseMessage<BootRequest>(
      {{"name", "g1"}, {"kernel", "/k"}, {"trace_boot", true}, {"devices", {"virtio-net"}}});
  ASSERT_TRUE(r.ok()) << r.error().message;
  // Through text, as the daemon receives it (MessageToJson's cpus is a signed int).
  auto again = ParseMessage<BootRequest>(nlohmann::json::parse(MessageToJson(*r).dump()));
  ASSERT_TRUE(again.ok()) << again.error().message;
  EXPECT_TRUE(again->trace_boot);
  EXPECT_EQ(again->devices, std::vector<std::string>{"virtio-net"});
}

TEST(BootTraceTest, BadRequestsNameTheField) {
  struct Case {
    nlohmann::json extra;
    std::string want;
  } cases[] = {
      {{{"trace_boot", "yes"}}, "args.trace_boot must be true or false"},
      {{{"devices", "virtio-blk"}}, "args.devices must be a list"},
      {{{"devices", {1}}}, "args.devices must hold strings"},
      {{{"devices", {"e1000"}}}, "device 'e1000' is not one of"},
      {{{"devices", {"virtio-net", "virtio-net"}}}, "device 'virtio-net' is given twice"},
      {{{"devices", {"a", "b", "c", "d"}}}, "at most 3"},
  };
  for (const Case& c : cases) {
    nlohmann::json args = {{"name", "g1"}, {"kernel", "/k"}};
    args.update(c.extra);
    auto r = ParseMessage<BootRequest>(args);
    ASSERT_FALSE(r.ok()) << c.extra.dump();
    EXPECT_NE(r.error().message.find(c.want), std::string::npos) << r.error().message;
  }
}

TEST(BootTraceTest, ArgsRefuseRelativePathAndOddEvents) {
  EXPECT_FALSE(BootTraceArgs("qemu-trace.log", BootTraceEvents()).ok());
  EXPECT_FALSE(BootTraceArgs("/x/qemu-trace.log", {}).ok());
  EXPECT_FALSE(BootTraceArgs("/x/qemu-trace.log", {"virtio_*"}).ok());
  EXPECT_FALSE(BootTraceArgs("/x/qemu-trace.log", {"a,file=/etc/passwd"}).ok());
  auto ok = BootTraceArgs("/x/qemu-trace.log", {"fw_cfg_read"});
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(*ok, (std::vector<std::string>{"-msg", "timestamp=on", "-D", "/x/qemu-trace.log",
                                           "-trace", "enable=fw_cfg_read"}));
}

}  // namespace
}  // namespace hvtrace::hostd
