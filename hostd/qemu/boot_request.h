// What `hvtrace boot` / `hvtrace qemu-args` turn into: a VmConfig with a
// host-backed boot range whose kernel parameters (memmap=, trace_instance=)
// BuildQemuPlan adds, so the guest's persistent ring buffer lives in a host
// file from early boot.
#ifndef HVTRACE_HOSTD_BOOT_REQUEST_H_
#define HVTRACE_HOSTD_BOOT_REQUEST_H_

#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "hvtrace/handshake_kprobes.h"
#include "hvtrace/result.h"
#include "json_message.h"
#include "kernel_file_args.h"
#include "vm_config.h"

namespace hvtrace::hostd {

// Events that show the boot sequence of a 6.12 guest: initcalls, interrupts,
// timers and the scheduler (names checked against the 6.12 guest's tracefs),
// and the kernel log: every printk passes printk:console, so the boot range
// holds the log up to the panic line and its call trace (oops_enter() stops
// the top-level buffer only, never an instance; docs/postmortem.md).
// Writes to instances/boot_map/trace_marker land there too, with no event.
inline constexpr const char* kDefaultBootEvents =
    "initcall:initcall_start,initcall:initcall_finish,irq:irq_handler_entry,"
    "irq:irq_handler_exit,irq:softirq_entry,irq:softirq_exit,timer:hrtimer_expire_entry,"
    "timer:timer_expire_entry,"
    "sched:sched_switch,sched:sched_wakeup,sched:sched_process_exec,sched:sched_process_exit,"
    "sched:sched_process_fork,task:task_rename,printk:console";

// The guest's half of the virtio handshakes from before userspace
// (hvtrace/handshake_kprobes.h): one definition, which the agent's
// `boot-buffer enable` writes too.
using ::hvtrace::kHandshakeKprobeParam;
using ::hvtrace::kKeepLocalTraceClock;

// The `boot` control message (control/requests.h has the others): the CLI
// fills it, the daemon parses it (json_message.h: unknown keys and wrong
// types refused) and builds the VM from it; the initializers are the
// defaults of both. The kernel and initrd, with their descriptors (the
// daemon boots copies of those files), are KernelFileArgs.
struct BootRequest : KernelFileArgs {
  static constexpr const char* kCommand = "boot";
  std::string name;
  std::string append;
  int cpus = 2;
  uint64_t memory_mib = 1088;
  uint64_t trace_size_mib = 16;
  std::string events = kDefaultBootEvents;
  std::string accel = "auto";  // auto | tcg | kvm
  // QEMU's handshake trace events into <vm dir>/qemu-trace.log (boot_trace.h).
  bool trace_boot = false;
  // Handshake devices (boot_trace.h): "virtio-blk", "virtio-net", "virtio-serial".
  std::vector<std::string> devices;
  // "" (the daemon's vmcore setting) | off | on-panic (config.h).
  std::string vmcore;

  template <class Self, class Map>
  static void Fields(Self& r, Map& m) {
    m.Required("name", r.name);
    KernelFileArgs::Fields(r, m);
    m.Field("append", r.append);
    m.Field("cpus", r.cpus, 1, 64);
    m.Field("memory_mib", r.memory_mib, 256, 65536);
    m.Field("trace_size_mib", r.trace_size_mib, 1, 1024);
    m.Field("events", r.events);
    m.Field("accel", r.accel);
    m.Field("trace_boot", r.trace_boot);
    m.List("devices", r.devices, 3);
    m.Field("vmcore", r.vmcore);
  }
  // What one field cannot say: the accel's spelling, the device names.
  Status Check() const;
};

// Where the daemon (or a person running QEMU themselves) puts the VM's
// sockets, logs and backing file.
struct BootPaths {
  std::string qmp_socket;
  std::string console_log;
  std::string console_socket;  // ttyS0, for people and tests to type into.
  std::string meta_socket;     // The metadata channel's host end (vm_config.h).
  std::string qemu_log;
  std::string qemu_trace_log;  // <vm dir>/qemu-trace.log, used with trace_boot.
  // <run_dir>/mem/hvtrace-<name>: a directory only the daemon's user may
  // enter, never a world-writable one such as /dev/shm, where a local user
  // could plant the file before QEMU opens it (kMemoryDirName).
  std::string backing_file;
};
inline constexpr const char* kMemoryDirName = "mem";
BootPaths DefaultBootPaths(const std::string& name, const std::filesystem::path& run_dir,
                           const std::filesystem::path& vm_dir);

Result<Accel> ParseAccel(std::string_view text);
// kvm → true; tcg → false; auto → KvmUsable(kernel) (probe guests, the last
// one |kernel| itself, must finish under KVM).
bool ResolveKvm(Accel accel, const std::string& kernel);

Result<VmConfig> MakeBootVmConfig(const BootRequest& request, const BootPaths& paths);

}  // namespace hvtrace::hostd

#endif  // HVTRACE_HOSTD_BOOT_REQUEST_H_
