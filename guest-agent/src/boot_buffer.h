// `hvtrace-agent boot-buffer enable [--dry-run] | disable [--dry-run] | status`:
// inside a guest whose domain `hvtrace setup` gave the shared NUMA cell 1,
// puts the kernel parameters of the boot range on the guest's own kernel
// command line, through the boot loader the guest uses.
//
// The range is found from the guest's own view of node 1: the ACPI SRAT's
// memory affinity structures (/sys/firmware/acpi/tables/SRAT; QEMU writes
// proximity domain N for NUMA node N), else the node's memory blocks in sysfs
// (block-granular, so only when the SRAT is unreadable). The parameters follow
// the host's rule (hostd/libvirt/domain_xml.cc FindDomainBootCell): the range
// starts at node 1 and is node 1 less the 48 MiB headroom, page-aligned; this
// is the agent's own copy of that rule (the static agent does not link hostd),
// and a unit test checks both agree.
//
// The boot loader also gets kprobe_event= with the handshake kprobes
// (hvtrace/handshake_kprobes.h), so the boot timeline has the built-in
// virtio drivers' status writes; the initramfs hook's hvtrace-boot-probes
// copies them into the boot instance; and trace_clock=local, which keeps
// those records there until then (kKeepLocalTraceClock, same header).
//
// Boot loaders: syslinux/extlinux (/boot/syslinux/syslinux.cfg,
// /boot/extlinux/extlinux.conf): every APPEND line gets the parameters, and a
// marker comment records them so disable removes exactly those (the file is
// rewritten atomically). GRUB: /etc/default/grub.d/hvtrace.cfg extends
// GRUB_CMDLINE_LINUX_DEFAULT, then update-grub. The file is shell, and
// grub.cfg treats '$' as a variable, so memmap=SIZE$ADDR is written there as
// memmap=SIZE\\\$ADDR (shell → SIZE\$ADDR in grub.cfg → SIZE$ADDR for Linux);
// GRUB's other metacharacters in kprobe_event= (';', '<', '>', '|', '&')
// get one backslash, which the shell's double quotes keep.
#ifndef HVTRACE_AGENT_BOOT_BUFFER_H_
#define HVTRACE_AGENT_BOOT_BUFFER_H_

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "hvtrace/result.h"

namespace hvtrace::agent {

// The events `hvtrace setup` and `hvtrace boot` put in the boot instance
// (hostd/qemu/boot_request.h kDefaultBootEvents; a unit test keeps them equal).
inline constexpr const char* kBootBufferDefaultEvents =
    "initcall:initcall_start,initcall:initcall_finish,irq:irq_handler_entry,"
    "irq:irq_handler_exit,irq:softirq_entry,irq:softirq_exit,timer:hrtimer_expire_entry,"
    "timer:timer_expire_entry,"
    "sched:sched_switch,sched:sched_wakeup,sched:sched_process_exec,sched:sched_process_exit,"
    "sched:sched_process_fork,task:task_rename,printk:console";
inline constexpr const char* kBootBufferInstance = "boot_map";

// One enabled memory affinity structure of an SRAT.
struct SratMemory {
  uint32_t proximity = 0;
  uint64_t base = 0;
  uint64_t length = 0;
  bool hotpluggable = false;
};

// Parses an SRAT (the whole table, header included). Truncated or malformed
// tables are errors naming the offset; disabled entries are skipped.
Result<std::vector<SratMemory>> ParseSrat(std::span<const std::byte> table);

struct NodeRange {
  uint64_t start = 0;
  uint64_t bytes = 0;
  std::string source;  // "ACPI SRAT" or "sysfs memory blocks".
};

// Node |node|'s memory: the contiguous boot-time (not hot-pluggable) SRAT
// ranges of proximity domain |node|.
Result<NodeRange> NodeRangeFromSrat(std::span<const std::byte> table, uint32_t node);
// From <sys>/devices/system/node/node<N>/memory<M> and
// <sys>/devices/system/memory/block_size_bytes.
Result<NodeRange> NodeRangeFromSysfs(const std::filesystem::path& sys, uint32_t node);

// The whole of a small file (sysfs, ACPI tables, boot loader configs); an
// error when it is larger than |limit| bytes.
Result<std::string> ReadSmallFile(const std::filesystem::path& path, size_t limit);

struct BootBufferParams {
  uint64_t gpa = 0;
  uint64_t bytes = 0;
  std::string kernel_params;  // memmap=SIZE$ADDR trace_instance=NAME@ADDR:SIZE[,EVENTS]
  // What the boot loader gets: |kernel_params| and the handshake kprobes
  // (hvtrace/handshake_kprobes.h), which the boot timeline needs for the
  // built-in virtio drivers' writes; the host's `hvtrace boot --trace-boot`
  // puts the same definitions on its command line.
  std::string loader_params;
};
// The host's rule for a node 1 at |node|.
Result<BootBufferParams> BootBufferKernelParams(const NodeRange& node, std::string_view instance,
                                                std::string_view events);

// Where the guest's files are; tests point these at a temporary tree.
struct BootBufferPaths {
  std::filesystem::path root = "/";    // Boot loader files, relative to it.
  std::filesystem::path sys = "/sys";  // SRAT, node and memory sysfs.
  std::filesystem::path proc_cmdline = "/proc/cmdline";
  std::filesystem::path tracefs = "/sys/kernel/tracing";
  std::string update_grub = "update-grub";  // Empty: do not run it.
};

struct BootBufferOptions {
  BootBufferPaths paths;
  std::string events = kBootBufferDefaultEvents;
  bool dry_run = false;
};

// The boot loader edits, on text (no I/O): |params| added to every APPEND line
// plus the marker, and the exact removal. Adding to a file that already has
// the marker replaces what the marker names.
std::string SyslinuxEnable(std::string_view config, std::string_view params);
Result<std::string> SyslinuxDisable(std::string_view config);
// The whole /etc/default/grub.d/hvtrace.cfg for |params|.
std::string GrubDropIn(std::string_view params);

// `hvtrace-agent boot-buffer ARGS...` (ARGS after "boot-buffer"); returns the
// exit status. Messages go to |out| and |err|.
int RunBootBufferCommand(const std::vector<std::string>& args, const BootBufferPaths& paths,
                         std::FILE* out, std::FILE* err);

}  // namespace hvtrace::agent

#endif  // HVTRACE_AGENT_BOOT_BUFFER_H_
