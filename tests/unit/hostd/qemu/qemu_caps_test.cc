#include "qemu_caps.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "boot_trace.h"
#include "recorded_qemu.h"
#include "vm_config.h"

namespace hvtrace::hostd {
namespace {

using ::testing::HasSubstr;

const std::vector<std::string> kQemuArgvBase = {"/usr/bin/qemu-system-x86_64", "-nodefaults"};

// Removes every line of |text| that starts with |prefix|.
std::string WithoutLines(const std::string& text, const std::string& prefix) {
  std::string out;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t nl = text.find('\n', pos);
    nl = nl == std::string::npos ? text.size() : nl + 1;
    const std::string line = text.substr(pos, nl - pos);
    if (!line.starts_with(prefix)) out += line;
    pos = nl;
  }
  return out;
}

TEST(QemuCapsTest, VersionsOfBothDebianReleases) {
  EXPECT_EQ(RecordedQemu("7.2").version, "7.2.22");
  EXPECT_EQ(RecordedQemu("10.0").version, "10.0.13");
  EXPECT_EQ(RecordedQemu("10.0").Describe(), "QEMU 10.0.13 (/usr/bin/qemu-system-x86_64)");
  EXPECT_EQ(ParseQemuVersion("QEMU emulator version 6.2.0\n"), "6.2.0");
  EXPECT_EQ(ParseQemuVersion("something else 7.2"), "");
}

// -runas (removed in 10.0) and -run-with user= (9.1+): each release's help
// says which it has, and RunAsArgs spells dropping root accordingly.
TEST(QemuCapsTest, RunAsIsChosenFromEachReleasesHelp) {
  const QemuCaps old_qemu = RecordedQemu("7.2");
  EXPECT_TRUE(old_qemu.HasOption("-runas"));
  EXPECT_FALSE(old_qemu.HasOption("-run-with"));
  EXPECT_FALSE(old_qemu.run_with_user);
  EXPECT_EQ(*RunAsArgs(old_qemu, "hvtrace-qemu"),
            (std::vector<std::string>{"-runas", "hvtrace-qemu"}));

  const QemuCaps new_qemu = RecordedQemu("10.0");
  EXPECT_FALSE(new_qemu.HasOption("-runas"));
  EXPECT_TRUE(new_qemu.run_with_user);
  EXPECT_EQ(*RunAsArgs(new_qemu, "hvtrace-qemu"),
            (std::vector<std::string>{"-run-with", "user=hvtrace-qemu"}));
}

// QEMU 8.1-9.0 had -run-with (async-teardown=, chroot=) but not its user=,
// and still -runas: -run-with alone must not be taken for user=.
TEST(QemuCapsTest, RunWithWithoutUserKeepsRunas) {
  QemuCapsText text = RecordedQemuText("7.2");
  text.help += "-run-with [async-teardown=on|off][,chroot=dir]\n";
  const QemuCaps caps = ParseQemuCaps(text, "/usr/bin/qemu-system-x86_64");
  EXPECT_TRUE(caps.HasOption("-run-with"));
  EXPECT_FALSE(caps.run_with_user);
  EXPECT_EQ(RunAsArgs(caps, "u")->front(), "-runas");
}

TEST(QemuCapsTest, NeitherSpellingIsRefusedNamingTheQemu) {
  QemuCapsText text = RecordedQemuText("7.2");
  text.help = WithoutLines(text.help, "-runas");
  const QemuCaps caps = ParseQemuCaps(text, "/opt/q");
  auto args = RunAsArgs(caps, "hvtrace-qemu");
  ASSERT_FALSE(args.ok());
  EXPECT_THAT(args.error().message, HasSubstr("QEMU 7.2.22 (/opt/q) has neither -run-with user="));
}

TEST(QemuCapsTest, OptionsKnowWhetherTheyTakeAnArgument) {
  for (const char* version : {"7.2", "10.0"}) {
    const QemuCaps caps = RecordedQemu(version);
    EXPECT_TRUE(caps.options.at("-device")) << version;
    EXPECT_TRUE(caps.options.at("-sandbox")) << version;
    EXPECT_TRUE(caps.options.at("-D")) << version;
    EXPECT_FALSE(caps.options.at("-nodefaults")) << version;
    EXPECT_FALSE(caps.options.at("-no-user-config")) << version;
    EXPECT_FALSE(caps.options.at("-no-reboot")) << version;
  }
}

// Every device and QEMU trace event hvtraced uses is in both releases.
TEST(QemuCapsTest, BothReleasesHaveEveryDeviceAndTraceEventHvtracedUses) {
  for (const char* version : {"7.2", "10.0"}) {
    const QemuCaps caps = RecordedQemu(version);
    for (const char* device :
         {"ivshmem-plain", "pvpanic", "pvpanic-pci", "vmcoreinfo", "virtio-blk-pci",
          "virtio-net-pci", "virtio-serial-pci", "virtserialport", "virtio-blk"}) {
      EXPECT_TRUE(caps.HasDevice(device)) << version << " " << device;
    }
    for (const std::string& event : BootTraceEvents()) {
      EXPECT_TRUE(caps.HasTraceEvent(event)) << version << " " << event;
    }
  }
}

// A QEMU without ivshmem-plain cannot serve attach: refused before any VM
// starts, whatever the VM's own command line asks for.
TEST(QemuCapsTest, MissingIvshmemIsRefusedNamingOptionVersionAndPurpose) {
  QemuCapsText text = RecordedQemuText("7.2");
  text.version = "QEMU emulator version 6.2.0 (Debian 1:6.2+dfsg-2)\n";
  text.device_help = WithoutLines(text.device_help, "name \"ivshmem-plain\"");
  const QemuCaps caps = ParseQemuCaps(text, "/usr/bin/qemu-system-x86_64");
  Status s = CheckQemuArgv(caps, kQemuArgvBase, "VM 'demo': ");
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().message,
            "VM 'demo': QEMU 6.2.0 (/usr/bin/qemu-system-x86_64) has no -device ivshmem-plain; "
            "hvtraced needs it for attach (the trace region it plugs into the guest)");
}

VmConfig PanicVm() {
  VmConfig c;
  c.name = "demo";
  c.kernel = "/k/vmlinuz";
  c.qmp_socket = "/tmp/demo.qmp";
  c.trace_log = "/tmp/demo-trace.log";
  c.trace_events = BootTraceEvents();
  return c;
}

TEST(QemuCapsTest, BuildQemuPlanRefusesWhatTheQemuLacks) {
  QemuCapsText no_pvpanic = RecordedQemuText("10.0");
  no_pvpanic.device_help = WithoutLines(no_pvpanic.device_help, "name \"pvpanic\"");
  auto plan = BuildQemuPlan(PanicVm(), false, ParseQemuCaps(no_pvpanic, "/q"));
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.error().message,
            "VM 'demo': QEMU 10.0.13 (/q) has no -device pvpanic; hvtraced needs it for panic "
            "capture (GUEST_PANICKED)");

  QemuCapsText no_event = RecordedQemuText("10.0");
  no_event.trace_help = WithoutLines(no_event.trace_help, "virtio_set_status");
  plan = BuildQemuPlan(PanicVm(), false, ParseQemuCaps(no_event, "/q"));
  ASSERT_FALSE(plan.ok());
  EXPECT_THAT(plan.error().message, HasSubstr("has no trace event virtio_set_status"));

  QemuCapsText no_sandbox = RecordedQemuText("7.2");
  no_sandbox.help = WithoutLines(no_sandbox.help, "-sandbox");
  VmConfig sandboxed = PanicVm();
  sandboxed.sandbox = true;
  plan = BuildQemuPlan(sandboxed, false, ParseQemuCaps(no_sandbox, "/q"));
  ASSERT_FALSE(plan.ok());
  EXPECT_THAT(plan.error().message,
              HasSubstr("QEMU 7.2.22 (/q) has no option -sandbox; hvtraced needs it for "
                        "qemu_sandbox"));

  // Both recorded releases take the whole VM.
  EXPECT_TRUE(BuildQemuPlan(sandboxed, false, RecordedQemu("7.2")).ok());
  EXPECT_TRUE(BuildQemuPlan(sandboxed, false, RecordedQemu("10.0")).ok());
}

TEST(QemuCapsTest, ArgvWalkChecksValuesAndRunWithKeys) {
  const QemuCaps caps = RecordedQemu("10.0");
  auto argv = [](std::vector<std::string> tail) {
    std::vector<std::string> a = kQemuArgvBase;
    a.insert(a.end(), tail.begin(), tail.end());
    return a;
  };
  EXPECT_TRUE(CheckQemuArgv(caps, argv({"-run-with", "user=u", "--device", "pvpanic"}), "").ok());
  EXPECT_THAT(CheckQemuArgv(caps, argv({"-run-with", "chroot=/x"}), "").error().message,
              HasSubstr("chroot=/x"));
  EXPECT_THAT(CheckQemuArgv(caps, argv({"-device"}), "").error().message,
              HasSubstr("-device has no value"));
  EXPECT_THAT(CheckQemuArgv(caps, argv({"stray"}), "").error().message,
              HasSubstr("'stray' is not an option"));
  EXPECT_THAT(CheckQemuArgv(caps, argv({"-runas", "u"}), "").error().message,
              HasSubstr("has no option -runas"));
}

// The help texts come from whatever binary the configuration names: garbage
// means "supports less", never a crash or an unbounded set.
TEST(QemuCapsTest, Malicious_GarbageHelpTextDoesNotCrash) {
  std::mt19937 rng(41);
  std::string noise(1 << 20, '\0');
  for (char& c : noise) c = static_cast<char>(rng());
  const std::string long_line(300000, 'a');
  for (const std::string& text :
       {noise, long_line, std::string("name \"") + long_line, std::string("name \"x"),
        std::string("-") + long_line + " arg", std::string("\n\n-\n- \n--\nname \"\"\n"),
        std::string("QEMU emulator version ....\n"), std::string("QEMU emulator version ")}) {
    const QemuCaps caps = ParseQemuCaps({text, text, text, text}, "/q");
    EXPECT_LE(caps.version.size(), 32u);
    for (const auto& [name, takes_arg] : caps.options) EXPECT_LE(name.size(), 128u);
    for (const std::string& d : caps.devices) EXPECT_LE(d.size(), 128u);
    EXPECT_FALSE(CheckQemuArgv(caps, kQemuArgvBase, "").ok());
  }
  const QemuCaps empty = ParseQemuCaps({}, "/q");
  EXPECT_EQ(empty.Describe(), "QEMU (unknown version) (/q)");
  EXPECT_TRUE(empty.options.empty() && empty.devices.empty() && empty.trace_events.empty());
}

// The probe runs real programs: the host's QEMU (hvtrace's dependency), and
// binaries that are not QEMU at all.
TEST(QemuCapsTest, ProbesTheHostQemuOnceAndExplainsFailures) {
  auto first = QemuCapsFor("qemu-system-x86_64");
  ASSERT_TRUE(first.ok()) << first.error().message;
  EXPECT_FALSE((*first)->version.empty());
  EXPECT_TRUE((*first)->HasDevice("ivshmem-plain"));
  auto second = QemuCapsFor("qemu-system-x86_64");
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(first->get(), second->get());

  auto missing = QemuCapsFor("/nonexistent/qemu-system-x86_64");
  ASSERT_FALSE(missing.ok());
  EXPECT_THAT(missing.error().message, HasSubstr("/nonexistent/qemu-system-x86_64 not found"));
  auto failing = QemuCapsFor("/bin/false");
  ASSERT_FALSE(failing.ok());
  EXPECT_THAT(failing.error().message, HasSubstr("/bin/false -version exited with status 1"));
}

}  // namespace
}  // namespace hvtrace::hostd
