#include "vm_config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "gpa_layout.h"
#include "recorded_qemu.h"

namespace hvtrace::hostd {
namespace {

using ::testing::HasSubstr;

// Debian 12's QEMU, as recorded: the layout tests below plan for it.
const QemuCaps& Qemu72() {
  static const QemuCaps caps = RecordedQemu("7.2");
  return caps;
}

VmConfig BaseConfig() {
  VmConfig c;
  c.name = "t1";
  c.kernel = "/k/vmlinuz";
  c.initrd = "/k/initrd.img";
  c.qmp_socket = "/tmp/t1.qmp";
  c.console_socket = "/tmp/t1.con";
  c.console_log = "/tmp/t1.log";
  return c;
}

// Value following |flag| the |nth| time it appears, or "" if absent.
std::string ArgAfter(const std::vector<std::string>& argv, const std::string& flag, int nth = 0) {
  for (size_t i = 0; i + 1 < argv.size(); ++i) {
    if (argv[i] == flag && nth-- == 0) return argv[i + 1];
  }
  return "";
}

std::vector<std::string> AllAfter(const std::vector<std::string>& argv, const std::string& flag) {
  std::vector<std::string> out;
  for (size_t i = 0; i + 1 < argv.size(); ++i) {
    if (argv[i] == flag) out.push_back(argv[i + 1]);
  }
  return out;
}

TEST(GpaLayoutTest, DesignRecipeLayout) {
  // DESIGN §4.2: -m 1088M, 16 MiB range → node 0 = 1 GiB, node 1 = 64 MiB, range at 0x40000000.
  auto layout = ComputeBootRangeLayout({MachineType::kPc, 1088 * kMiB, 16 * kMiB, 0});
  ASSERT_TRUE(layout.ok()) << layout.error().message;
  EXPECT_EQ(layout->node0_bytes, 1024 * kMiB);
  EXPECT_EQ(layout->node1_bytes, 64 * kMiB);
  EXPECT_EQ(layout->range_gpa, 0x40000000u);
  EXPECT_EQ(layout->file_offset, 0u);
}

TEST(GpaLayoutTest, ExplicitNode0) {
  auto layout = ComputeBootRangeLayout({MachineType::kPc, 1024 * kMiB, 32 * kMiB, 512 * kMiB});
  ASSERT_TRUE(layout.ok()) << layout.error().message;
  EXPECT_EQ(layout->range_gpa, 512 * kMiB);
  EXPECT_EQ(layout->node1_bytes, 512 * kMiB);
}

TEST(GpaLayoutTest, NodeSizeRoundedToAlignment) {
  // 4 KiB range + 48 MiB headroom rounds node 1 up to 50 MiB.
  auto layout = ComputeBootRangeLayout({MachineType::kPc, 1024 * kMiB, 4096, 0});
  ASSERT_TRUE(layout.ok()) << layout.error().message;
  EXPECT_EQ(layout->node1_bytes, 50 * kMiB);
  EXPECT_EQ(layout->node0_bytes % kNodeAlignment, 0u);
}

TEST(GpaLayoutTest, RefusesRangeTooLargeForItsNode) {
  // Node 1 is 64 MiB; 32 MiB + 48 MiB headroom does not fit.
  auto layout = ComputeBootRangeLayout({MachineType::kPc, 1088 * kMiB, 32 * kMiB, 1024 * kMiB});
  ASSERT_FALSE(layout.ok());
  EXPECT_THAT(layout.error().message, HasSubstr("too large for its node"));
  // A range that leaves exactly the headroom fits.
  EXPECT_TRUE(ComputeBootRangeLayout({MachineType::kPc, 1088 * kMiB, 16 * kMiB, 1024 * kMiB}).ok());
}

TEST(GpaLayoutTest, RefusesUnalignedSizesAndAddresses) {
  EXPECT_THAT(
      ComputeBootRangeLayout({MachineType::kPc, 1088 * kMiB, 16 * kMiB + 100, 0}).error().message,
      HasSubstr("page size"));
  EXPECT_FALSE(ComputeBootRangeLayout({MachineType::kPc, 1088 * kMiB, 0, 0}).ok());
  EXPECT_THAT(ComputeBootRangeLayout({MachineType::kPc, 1088 * kMiB, 16 * kMiB, 1024 * kMiB + 4096})
                  .error()
                  .message,
              HasSubstr("aligned"));
  EXPECT_THAT(
      ComputeBootRangeLayout({MachineType::kPc, 1088 * kMiB + 4096, 16 * kMiB, 0}).error().message,
      HasSubstr("multiple"));
}

TEST(GpaLayoutTest, RefusesMemoryAboveLowMemoryLimit) {
  EXPECT_EQ(LowMemoryLimit(MachineType::kPc, 1024 * kMiB), 0xe0000000u);
  EXPECT_EQ(LowMemoryLimit(MachineType::kPc, 4096 * kMiB), 0xc0000000u);
  EXPECT_EQ(LowMemoryLimit(MachineType::kQ35, 1024 * kMiB), 0xb0000000u);
  EXPECT_EQ(LowMemoryLimit(MachineType::kQ35, 3072 * kMiB), 0x80000000u);
  // 3 GiB fits below pc's 3.5 GiB, but not below q35's 2.75 GiB.
  EXPECT_TRUE(ComputeBootRangeLayout({MachineType::kPc, 3072 * kMiB, 16 * kMiB, 0}).ok());
  auto q35 = ComputeBootRangeLayout({MachineType::kQ35, 3072 * kMiB, 16 * kMiB, 0});
  ASSERT_FALSE(q35.ok());
  EXPECT_THAT(q35.error().message, HasSubstr("low-memory limit"));
  EXPECT_FALSE(ComputeBootRangeLayout({MachineType::kPc, 8192 * kMiB, 16 * kMiB, 0}).ok());
}

TEST(GpaLayoutTest, RefusesRangeLargerThanMemoryOrTinyNode0) {
  EXPECT_FALSE(ComputeBootRangeLayout({MachineType::kPc, 256 * kMiB, 512 * kMiB, 0}).ok());
  EXPECT_THAT(ComputeBootRangeLayout({MachineType::kPc, 256 * kMiB, 128 * kMiB, 0}).error().message,
              HasSubstr("node 0"));
  EXPECT_FALSE(
      ComputeBootRangeLayout({MachineType::kPc, 1024 * kMiB, 16 * kMiB, 2048 * kMiB}).ok());
}

TEST(VmConfigTest, BasicArgv) {
  auto plan = BuildQemuPlan(BaseConfig(), /*kvm_usable=*/false, Qemu72());
  ASSERT_TRUE(plan.ok()) << plan.error().message;
  const auto& argv = plan->argv;
  EXPECT_EQ(argv[0], "qemu-system-x86_64");
  EXPECT_EQ(ArgAfter(argv, "-machine"), "pc");
  EXPECT_EQ(ArgAfter(argv, "-accel"), "tcg,thread=single");
  EXPECT_EQ(ArgAfter(argv, "-smp"), "2");
  EXPECT_EQ(ArgAfter(argv, "-m"), "1088M");
  EXPECT_EQ(ArgAfter(argv, "-kernel"), "/k/vmlinuz");
  EXPECT_EQ(ArgAfter(argv, "-initrd"), "/k/initrd.img");
  EXPECT_EQ(ArgAfter(argv, "-append"), "console=ttyS0");
  EXPECT_EQ(ArgAfter(argv, "-device"), "pvpanic");
  EXPECT_EQ(ArgAfter(argv, "-action"), "panic=pause");
  EXPECT_EQ(ArgAfter(argv, "-serial"), "chardev:hvt_con");
  EXPECT_THAT(
      AllAfter(argv, "-chardev"),
      ::testing::ElementsAre(
          "socket,id=hvt_con,path=/tmp/t1.con,server=on,wait=off,logfile=/tmp/t1.log,logappend=on",
          "socket,id=hvt_qmp,path=/tmp/t1.qmp,server=on,wait=off"));
  EXPECT_EQ(ArgAfter(argv, "-mon"), "chardev=hvt_qmp,mode=control");
  EXPECT_FALSE(plan->boot_range.has_value());
  EXPECT_EQ(std::count(argv.begin(), argv.end(), "-numa"), 0);
}

TEST(VmConfigTest, AccelSelection) {
  VmConfig c = BaseConfig();
  EXPECT_EQ(ArgAfter(BuildQemuPlan(c, true, Qemu72())->argv, "-accel"), "kvm");
  c.accel = Accel::kTcg;
  EXPECT_EQ(ArgAfter(BuildQemuPlan(c, true, Qemu72())->argv, "-accel"), "tcg,thread=single");
  c.accel = Accel::kKvm;
  EXPECT_THAT(BuildQemuPlan(c, false, Qemu72()).error().message, HasSubstr("/dev/kvm"));
}

TEST(VmConfigTest, BootRangeMatchesDesignRecipe) {
  VmConfig c = BaseConfig();
  c.cmdline = "console=ttyS0 quiet";
  c.boot_range = BootRangeConfig{};
  c.boot_range->backing_path = "/dev/shm/t1-boot";
  c.boot_range->events = "sched:sched_switch,irq";
  auto plan = BuildQemuPlan(c, false, Qemu72());
  ASSERT_TRUE(plan.ok()) << plan.error().message;
  const auto& argv = plan->argv;
  EXPECT_THAT(AllAfter(argv, "-object"),
              ::testing::ElementsAre(
                  "memory-backend-ram,id=hvt_node0,size=1073741824",
                  "memory-backend-file,id=hvt_node1,size=67108864,mem-path=/dev/shm/t1-boot,"
                  "share=on"));
  EXPECT_THAT(AllAfter(argv, "-numa"), ::testing::ElementsAre("node,nodeid=0,memdev=hvt_node0",
                                                              "node,nodeid=1,memdev=hvt_node1"));
  EXPECT_EQ(ArgAfter(argv, "-append"),
            "console=ttyS0 quiet memmap=16M$0x40000000 "
            "trace_instance=boot_map@0x40000000:16M,sched:sched_switch,irq");
  ASSERT_TRUE(plan->boot_range.has_value());
  EXPECT_EQ(plan->boot_range->range_gpa, 0x40000000u);
}

TEST(VmConfigTest, RefusesBootRangeTooLargeForItsNode) {
  VmConfig c = BaseConfig();
  c.boot_range = BootRangeConfig{};
  c.boot_range->backing_path = "/dev/shm/x";
  c.boot_range->range_bytes = 64 * kMiB;
  c.boot_range->node0_bytes = 1024 * kMiB;
  auto plan = BuildQemuPlan(c, false, Qemu72());
  ASSERT_FALSE(plan.ok());
  EXPECT_THAT(plan.error().message, HasSubstr("too large for its node"));
  EXPECT_THAT(plan.error().message, HasSubstr("VM 't1'"));
}

TEST(VmConfigTest, RefusesUnalignedBootRange) {
  VmConfig c = BaseConfig();
  c.boot_range = BootRangeConfig{};
  c.boot_range->backing_path = "/dev/shm/x";
  c.boot_range->range_bytes = 16 * kMiB + 512;
  EXPECT_FALSE(BuildQemuPlan(c, false, Qemu72()).ok());
  c.boot_range->range_bytes = 16 * kMiB;
  c.boot_range->node0_bytes = 1000 * kMiB + 4096;
  EXPECT_FALSE(BuildQemuPlan(c, false, Qemu72()).ok());
}

TEST(VmConfigTest, RefusesBootRangeTooSmallPerCpu) {
  VmConfig c = BaseConfig();
  c.vcpus = 8;
  c.boot_range = BootRangeConfig{};
  c.boot_range->backing_path = "/dev/shm/x";
  c.boot_range->range_bytes = 64 * 4096;
  EXPECT_THAT(BuildQemuPlan(c, false, Qemu72()).error().message, HasSubstr("vCPUs only"));
}

TEST(VmConfigTest, Malicious_BootRangeNamesCannotInjectCmdlineTokens) {
  VmConfig c = BaseConfig();
  c.boot_range = BootRangeConfig{};
  c.boot_range->backing_path = "/dev/shm/x";
  c.boot_range->events = "irq init=/bin/sh";
  EXPECT_FALSE(BuildQemuPlan(c, false, Qemu72()).ok());
  c.boot_range->events = "irq";
  c.boot_range->instance_name = "a@0:1M";
  EXPECT_FALSE(BuildQemuPlan(c, false, Qemu72()).ok());
}

TEST(VmConfigTest, Ivshmem) {
  VmConfig c = BaseConfig();
  c.ivshmem.push_back({"ivs0", "/dev/shm/t1-ivs0", 4 * kMiB, true});
  c.ivshmem.push_back({"ivs1", "/dev/shm/t1,ivs1", 64 * 1024, true});
  auto plan = BuildQemuPlan(c, false, Qemu72());
  ASSERT_TRUE(plan.ok()) << plan.error().message;
  EXPECT_THAT(
      AllAfter(plan->argv, "-object"),
      ::testing::ElementsAre(
          "memory-backend-file,id=hvt_ivs0,size=4194304,mem-path=/dev/shm/t1-ivs0,share=on",
          "memory-backend-file,id=hvt_ivs1,size=65536,mem-path=/dev/shm/t1,,ivs1,share=on"));
  EXPECT_THAT(AllAfter(plan->argv, "-device"),
              ::testing::ElementsAre("pvpanic", "ivshmem-plain,memdev=hvt_ivs0,id=ivs0",
                                     "ivshmem-plain,memdev=hvt_ivs1,id=ivs1"));
}

TEST(VmConfigTest, VmcoreinfoDeviceOnlyWhenAsked) {
  VmConfig c = BaseConfig();
  auto without = BuildQemuPlan(c, false, Qemu72());
  ASSERT_TRUE(without.ok());
  EXPECT_THAT(AllAfter(without->argv, "-device"), ::testing::ElementsAre("pvpanic"));
  c.vmcoreinfo = true;
  auto with = BuildQemuPlan(c, false, Qemu72());
  ASSERT_TRUE(with.ok());
  EXPECT_THAT(AllAfter(with->argv, "-device"), ::testing::ElementsAre("pvpanic", "vmcoreinfo"));
}

TEST(VmConfigTest, RefusesNonPowerOfTwoIvshmem) {
  VmConfig c = BaseConfig();
  c.ivshmem.push_back({"ivs0", "/dev/shm/t1-ivs0", 3 * kMiB, true});
  auto plan = BuildQemuPlan(c, false, Qemu72());
  ASSERT_FALSE(plan.ok());
  EXPECT_THAT(plan.error().message, HasSubstr("power of two"));
  c.ivshmem[0].size_bytes = 0;
  EXPECT_FALSE(BuildQemuPlan(c, false, Qemu72()).ok());
  c.ivshmem[0].size_bytes = 1024;  // Power of two but below a page.
  EXPECT_FALSE(BuildQemuPlan(c, false, Qemu72()).ok());
}

TEST(VmConfigTest, RefusesDuplicateIdsAndSharedBackingFiles) {
  VmConfig c = BaseConfig();
  c.ivshmem.push_back({"ivs0", "/dev/shm/a", 4 * kMiB, true});
  c.ivshmem.push_back({"ivs0", "/dev/shm/b", 4 * kMiB, true});
  EXPECT_FALSE(BuildQemuPlan(c, false, Qemu72()).ok());
  c.ivshmem[1].id = "ivs1";
  c.ivshmem[1].backing_path = "/dev/shm/a";
  EXPECT_THAT(BuildQemuPlan(c, false, Qemu72()).error().message, HasSubstr("already used"));
}

TEST(VmConfigTest, RefusesImpossibleBasics) {
  VmConfig c = BaseConfig();
  c.vcpus = 0;
  EXPECT_FALSE(BuildQemuPlan(c, false, Qemu72()).ok());
  c = BaseConfig();
  c.memory_bytes = 1000 * kMiB + 1;
  EXPECT_FALSE(BuildQemuPlan(c, false, Qemu72()).ok());
  c = BaseConfig();
  c.kernel.clear();
  EXPECT_FALSE(BuildQemuPlan(c, false, Qemu72()).ok());
  c = BaseConfig();
  c.qmp_socket = "/tmp/" + std::string(200, 'q');
  EXPECT_THAT(BuildQemuPlan(c, false, Qemu72()).error().message, HasSubstr("unix socket paths"));
}

TEST(VmConfigTest, Q35AndPciPanic) {
  VmConfig c = BaseConfig();
  c.machine = MachineType::kQ35;
  c.panic_device = PanicDevice::kPci;
  c.pause_on_panic = false;
  auto plan = BuildQemuPlan(c, false, Qemu72());
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(ArgAfter(plan->argv, "-machine"), "q35");
  EXPECT_EQ(ArgAfter(plan->argv, "-device"), "pvpanic-pci");
  EXPECT_EQ(ArgAfter(plan->argv, "-action"), "");
}

TEST(VmConfigTest, KernelSizeSyntax) {
  EXPECT_EQ(KernelSize(16 * kMiB), "16M");
  EXPECT_EQ(KernelSize(12 * 1024), "12K");
  EXPECT_EQ(KernelSize(1000), "1000");
}

// The metadata channel: a virtio-serial port named org.hvtrace.agent.0 on a
// socket QEMU listens on (hvtraced connects); none unless asked for.
TEST(VmConfigTest, MetaChannelPortWhenASocketIsGiven) {
  auto plain = BuildQemuPlan(BaseConfig(), /*kvm_usable=*/false, Qemu72());
  ASSERT_TRUE(plain.ok()) << plain.error().message;
  for (const std::string& d : AllAfter(plain->argv, "-device")) {
    EXPECT_EQ(d.find("virtserialport"), std::string::npos) << d;
  }
  VmConfig config = BaseConfig();
  config.meta_socket = "/run/hvtrace/mem/hvtrace-vm.meta";
  auto plan = BuildQemuPlan(config, /*kvm_usable=*/false, Qemu72());
  ASSERT_TRUE(plan.ok()) << plan.error().message;
  const auto devices = AllAfter(plan->argv, "-device");
  EXPECT_NE(std::find(devices.begin(), devices.end(), "virtio-serial-pci,id=hvtrace-vser"),
            devices.end());
  EXPECT_NE(std::find(devices.begin(), devices.end(),
                      "virtserialport,bus=hvtrace-vser.0,chardev=hvtrace-meta,"
                      "name=org.hvtrace.agent.0"),
            devices.end());
  const auto chardevs = AllAfter(plan->argv, "-chardev");
  EXPECT_NE(std::find(chardevs.begin(), chardevs.end(),
                      "socket,id=hvtrace-meta,path=/run/hvtrace/mem/hvtrace-vm.meta,server=on,"
                      "wait=off"),
            chardevs.end());
  config.meta_socket = "/tmp/" + std::string(200, 'x');
  auto refused = BuildQemuPlan(config, /*kvm_usable=*/false, Qemu72());
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(refused.error().message, ::testing::HasSubstr("metadata channel socket"));
}

}  // namespace
}  // namespace hvtrace::hostd

namespace hvtrace::hostd {
namespace {

size_t CountOf(const std::vector<std::string>& argv, const std::string& arg) {
  return static_cast<size_t>(std::count(argv.begin(), argv.end(), arg));
}

std::string After(const std::vector<std::string>& argv, const std::string& flag) {
  auto it = std::find(argv.begin(), argv.end(), flag);
  return it == argv.end() || std::next(it) == argv.end() ? std::string() : *std::next(it);
}

TEST(VmConfigTest, NoSandboxNoRunasUnlessAsked) {
  auto plan = BuildQemuPlan(BaseConfig(), false, Qemu72());
  ASSERT_TRUE(plan.ok()) << plan.error().message;
  EXPECT_EQ(CountOf(plan->argv, "-sandbox"), 0u);
  EXPECT_EQ(CountOf(plan->argv, "-runas"), 0u);
}

TEST(VmConfigTest, SandboxDeniesExecPrivilegesObsoleteAndResourceControl) {
  VmConfig c = BaseConfig();
  c.sandbox = true;
  auto plan = BuildQemuPlan(c, false, Qemu72());
  ASSERT_TRUE(plan.ok()) << plan.error().message;
  EXPECT_EQ(CountOf(plan->argv, "-sandbox"), 1u);
  EXPECT_EQ(After(plan->argv, "-sandbox"),
            "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny");
  EXPECT_EQ(CountOf(plan->argv, "-runas"), 0u);
}

// Dropping root calls setgid/setuid after the filter is in place: with a
// user the sandbox must allow that one privilege change, and still deny
// spawning. QEMU 7.2 spells it -runas USER.
TEST(VmConfigTest, RunasKeepsTheSandboxButAllowsTheUidChange) {
  VmConfig c = BaseConfig();
  c.sandbox = true;
  c.run_as = "hvtrace-qemu";
  auto plan = BuildQemuPlan(c, false, Qemu72());
  ASSERT_TRUE(plan.ok()) << plan.error().message;
  EXPECT_EQ(After(plan->argv, "-runas"), "hvtrace-qemu");
  EXPECT_EQ(CountOf(plan->argv, "-run-with"), 0u);
  EXPECT_EQ(After(plan->argv, "-sandbox"),
            "on,obsolete=deny,elevateprivileges=allow,spawn=deny,resourcecontrol=deny");
  c.run_as = "-daemonize";
  auto bad = BuildQemuPlan(c, false, Qemu72());
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("is not a user name"), std::string::npos);
}

// QEMU 10.0 has no -runas (removed in 10.0): the same VM drops root with
// -run-with user=, and the sandbox still allows exactly that.
TEST(VmConfigTest, Qemu10DropsRootWithRunWithUser) {
  VmConfig c = BaseConfig();
  c.sandbox = true;
  c.run_as = "hvtrace-qemu";
  auto plan = BuildQemuPlan(c, false, RecordedQemu("10.0"));
  ASSERT_TRUE(plan.ok()) << plan.error().message;
  EXPECT_EQ(After(plan->argv, "-run-with"), "user=hvtrace-qemu");
  EXPECT_EQ(CountOf(plan->argv, "-runas"), 0u);
  EXPECT_EQ(After(plan->argv, "-sandbox"),
            "on,obsolete=deny,elevateprivileges=allow,spawn=deny,resourcecontrol=deny");
}

// Everything else hvtraced puts on the line is spelled the same for both
// releases: only the root-dropping pair differs.
TEST(VmConfigTest, Qemu72AndQemu10DifferOnlyInHowQemuDropsRoot) {
  VmConfig c = BaseConfig();
  c.sandbox = true;
  c.run_as = "hvtrace-qemu";
  c.boot_range = BootRangeConfig{};
  c.boot_range->backing_path = "/dev/shm/t1-boot";
  c.ivshmem.push_back(IvshmemConfig{"ivs0", "/dev/shm/t1-ivs", 4 * kMiB, true});
  c.meta_socket = "/tmp/t1.meta";
  c.panic_device = PanicDevice::kPci;
  auto old_plan = BuildQemuPlan(c, false, Qemu72());
  auto new_plan = BuildQemuPlan(c, false, RecordedQemu("10.0"));
  ASSERT_TRUE(old_plan.ok()) << old_plan.error().message;
  ASSERT_TRUE(new_plan.ok()) << new_plan.error().message;
  std::vector<std::string> a = old_plan->argv, b = new_plan->argv;
  const auto drop = [](std::vector<std::string>& v, const std::string& flag) {
    auto it = std::find(v.begin(), v.end(), flag);
    ASSERT_NE(it, v.end()) << flag;
    v.erase(it, it + 2);
  };
  drop(a, "-runas");
  drop(b, "-run-with");
  EXPECT_EQ(a, b);
}

TEST(VmConfigTest, ScopeLauncherRunsQemuInItsOwnTransientScope) {
  EXPECT_EQ(VmScopeUnit("web1"), "hvtrace-vm-web1.scope");
  EXPECT_EQ(VmScopeUnit("a b/c"), "hvtrace-vm-a\\x20b\\x2fc.scope");
  const std::vector<std::string> launcher = SystemdScopeLauncher("web1");
  EXPECT_EQ(launcher,
            (std::vector<std::string>{"systemd-run", "--scope", "--unit=hvtrace-vm-web1.scope",
                                      "--collect", "--quiet", "--"}));
  auto plan = BuildQemuPlan(BaseConfig(), false, Qemu72());
  ASSERT_TRUE(plan.ok());
  // Without systemd: QEMU's argv as planned.
  EXPECT_EQ(LaunchArgv({}, plan->argv), plan->argv);
  // With systemd: systemd-run ... -- then exactly that argv.
  const std::vector<std::string> all = LaunchArgv(launcher, plan->argv);
  ASSERT_EQ(all.size(), launcher.size() + plan->argv.size());
  EXPECT_TRUE(std::equal(launcher.begin(), launcher.end(), all.begin()));
  EXPECT_TRUE(std::equal(plan->argv.begin(), plan->argv.end(), all.begin() + launcher.size()));
}

TEST(VmConfigTest, SystemdBootedLooksForItsRuntimeDirectory) {
  EXPECT_FALSE(SystemdBooted("/nonexistent/run/systemd/system"));
  EXPECT_TRUE(SystemdBooted("/"));  // A directory: what sd_booted(3) tests.
  EXPECT_FALSE(SystemdBooted("/proc/self/status"));
}

}  // namespace
}  // namespace hvtrace::hostd
