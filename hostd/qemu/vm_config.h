// VmConfig: what a guest hvtrace boots looks like, and the pure function that
// turns it into a command line for the QEMU at hand (its QemuCaps: QEMU 7.2
// to 10.x; qemu_caps.h). No I/O happens here except in
// KvmUsable(), so every layout rule is unit-tested.
#ifndef HVTRACE_HOSTD_VM_CONFIG_H_
#define HVTRACE_HOSTD_VM_CONFIG_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "gpa_layout.h"
#include "hvtrace/result.h"
#include "qemu_caps.h"

namespace hvtrace::hostd {

enum class Accel { kAuto, kKvm, kTcg };
enum class PanicDevice { kNone, kIsa, kPci };

// A guest-physical range backed by a host file at the start of NUMA node 1,
// where the 6.12+ kernel's persistent ring buffer lives from early boot.
struct BootRangeConfig {
  std::string backing_path;  // QEMU creates it unless |prepared|.
  uint64_t range_bytes = 16 * kMiB;
  uint64_t node0_bytes = 0;  // 0: smallest node 1 that fits (see gpa_layout.h).
  std::string instance_name = "boot_map";
  std::string events;             // e.g. "sched:sched_switch,irq"; may be empty.
  bool remove_on_cleanup = true;  // Only if the launcher created the file.
  // The launcher created the (empty) file itself, O_EXCL in a private
  // directory, and QEMU only sizes and maps it; Cleanup removes it.
  bool prepared = false;
};

// A cold-plugged ivshmem-plain device backed by a host file.
struct IvshmemConfig {
  std::string id;                  // QEMU device id, e.g. "ivs0".
  std::string backing_path;        // Usually /dev/shm/<unique>.
  uint64_t size_bytes = 4 * kMiB;  // Must be a power of two: QEMU aborts otherwise.
  bool remove_on_cleanup = true;
};

struct VmConfig {
  std::string name = "hvtrace-guest";
  std::string qemu_binary = "qemu-system-x86_64";
  MachineType machine = MachineType::kPc;
  Accel accel = Accel::kAuto;
  std::string cpu_model;  // Empty: QEMU's default for the accelerator.
  int vcpus = 2;
  uint64_t memory_bytes = 1088 * kMiB;  // Whole MiB.
  std::string kernel;
  std::string initrd;          // May be empty.
  std::string cmdline;         // "console=ttyS0" is added when missing.
  std::string qmp_socket;      // Unix socket path; QEMU listens (server=on,wait=off).
  std::string console_log;     // Everything the guest writes to ttyS0.
  std::string console_socket;  // Optional unix socket for ttyS0 input/output.
  // Optional unix socket of the metadata channel (hvtrace/meta_channel.h):
  // a virtio-serial port named org.hvtrace.agent.0 the guest agent writes
  // to; QEMU listens, hvtraced connects.
  std::string meta_socket;
  std::string qemu_log;  // QEMU's own stdout/stderr; empty: /dev/null.
  PanicDevice panic_device = PanicDevice::kIsa;
  bool pause_on_panic = true;
  // -device vmcoreinfo: the guest hands QEMU its VMCOREINFO note, which
  // dump-guest-memory then writes into a vmcore.
  bool vmcoreinfo = false;  // -action panic=pause: keeps the memory to read.
  bool no_reboot = false;
  std::optional<BootRangeConfig> boot_range;
  std::vector<IvshmemConfig> ivshmem;
  // Not empty: QEMU traces |trace_events| into this file (boot_trace.h).
  std::string trace_log;
  std::vector<std::string> trace_events;
  // Handshake devices (boot_trace.h): "virtio-blk", "virtio-net", "virtio-serial".
  std::vector<std::string> devices;
  std::vector<std::string> extra_args;  // Appended verbatim, last.
  // QEMU's seccomp sandbox (kQemuSandboxArg): no exec, no obsolete or
  // privilege-raising syscalls, no resource control.
  bool sandbox = false;
  // Not empty: QEMU drops root to this user once its files are open
  // (-run-with user= or -runas, whichever it has: RunAsArgs in qemu_caps.h).
  std::string run_as;
  // Not empty: run QEMU through this command (its argv, ending in "--"),
  // e.g. SystemdScopeLauncher; the plan's argv stays QEMU's own.
  std::vector<std::string> launcher;
};

// The -sandbox value for VmConfig::sandbox; with run_as, privileges must
// stay allowed, since dropping root (-run-with user=, -runas) calls
// setgid/setuid after the filter.
inline constexpr std::string_view kQemuSandboxArg =
    "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny";
inline constexpr std::string_view kQemuSandboxRunAsArg =
    "on,obsolete=deny,elevateprivileges=allow,spawn=deny,resourcecontrol=deny";

// True when systemd is the init system (sd_booted(3): |marker| exists).
bool SystemdBooted(const std::string& marker = "/run/systemd/system");
// The systemd unit hvtraced runs VM |vm| in: "hvtrace-vm-" + |vm| with
// anything a unit name may not hold escaped as \xNN (systemd-escape).
std::string VmScopeUnit(const std::string& vm);
// systemd-run --scope --unit=VmScopeUnit(vm) --collect --quiet --: QEMU
// becomes its own transient scope (its own cgroup), so stopping or
// restarting hvtraced.service never kills it; vm_on_shutdown decides.
std::vector<std::string> SystemdScopeLauncher(const std::string& vm);

// The whole command line a launch execs: launcher, then the plan's argv.
std::vector<std::string> LaunchArgv(const std::vector<std::string>& launcher,
                                    const std::vector<std::string>& qemu_argv);

// The result of planning a VM: its argv and the boot range layout used.
struct QemuPlan {
  std::vector<std::string> argv;
  std::optional<BootRangeLayout> boot_range;
};

// True when KVM really runs guests of |kernel| here: kvm_probe.h's verdict
// (a boot sector and then |kernel| itself must finish under KVM;
// HVTRACE_ACCEL=tcg|kvm decides without probing). Computed once per kernel
// per process; blocks up to ~25 s the first time, so call it off any thread
// that must stay responsive.
bool KvmUsable(const std::string& kernel);

// Builds the argv (argv[0] = qemu_binary) for the QEMU |caps| describes
// (QemuCapsFor(config.qemu_binary)): each spelling chosen by what it has, and
// anything it lacks refused (CheckQemuArgv). |kvm_usable| resolves
// Accel::kAuto; Accel::kKvm without it is an error. Errors name the offending
// setting.
Result<QemuPlan> BuildQemuPlan(const VmConfig& config, bool kvm_usable, const QemuCaps& caps);

// |v| as a QEMU option value: a literal comma is doubled (a path with a
// comma would otherwise start another option).
std::string OptValue(const std::string& v);

// Kernel command-line size syntax: "16M", "512K" or plain bytes.
std::string KernelSize(uint64_t bytes);

}  // namespace hvtrace::hostd

#endif  // HVTRACE_HOSTD_VM_CONFIG_H_
