// What one QEMU binary supports, learned from the binary itself, so that
// hvtraced chooses each spelling by capability, not by version, and refuses a
// QEMU that lacks something before any VM starts.
//
// Four outputs of the binary are read (QemuCapsText): `-version`, `-help`
// (its options, and whether an option takes an argument), `-device help`
// (device names and aliases) and `-trace help` (trace event names, one per
// line). The parsers are plain functions over that text: the text comes from
// whatever binary the configuration names, so they bound every name and
// count and take garbage as "supports less", never as an error. The probe
// runs the binary four times with a deadline and a cap on the output, and
// QemuCapsFor caches the result per binary (resolved path, device, inode,
// size and mtime: a package upgrade is probed again).
//
// What changed between QEMU 7.2 (Debian 12) and 10.0 (Debian 13) in what
// hvtraced uses (QEMU's docs/about/removed-features.rst, deprecated.rst):
//   -runas USER  deprecated in 9.1, removed in 10.0: -run-with user=USER
//                (-run-with itself exists since 8.1, user= only since 9.1,
//                so its help line is checked for "user=", RunAsArgs).
// Nothing else hvtraced passes on QEMU's command line (-machine pc, -accel,
// -numa node,memdev=, memory-backend-file share=on, -chardev socket
// server=on,wait=off, -mon, -action panic=pause, -sandbox, -msg, -D, -trace,
// -device ivshmem-plain/pvpanic/pvpanic-pci/virtio-*), nor a QMP command it
// sends (object-add, device_add, device_del, object-del, memsave,
// trace-event-set-state, query-status, query-pci, query-cpus-fast, cont,
// stop, quit), nor a trace event of boot_trace.h was removed or renamed up to
// 10.2; device_add's argument types are checked strictly since 9.2 (ours are
// typed right). CheckQemuArgv still checks each one against the binary.
#ifndef HVTRACE_HOSTD_QEMU_CAPS_H_
#define HVTRACE_HOSTD_QEMU_CAPS_H_

#include <chrono>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "hvtrace/result.h"

namespace hvtrace::hostd {

// The binary's own words, as the probe captured them.
struct QemuCapsText {
  std::string version;      // -version
  std::string help;         // -help
  std::string device_help;  // -device help
  std::string trace_help;   // -trace help
};

struct QemuCaps {
  std::string binary;   // As configured (messages name it).
  std::string version;  // "10.0.13"; empty when -version said nothing usable.
  // Every option of -help, "-name" form, and whether it takes an argument.
  std::map<std::string, bool, std::less<>> options;
  bool run_with_user = false;                  // -run-with accepts user= (QEMU 9.1+).
  std::set<std::string, std::less<>> devices;  // Names and aliases.
  std::set<std::string, std::less<>> trace_events;

  // "QEMU 10.0.13 (/usr/bin/qemu-system-x86_64)", for messages.
  std::string Describe() const;
  bool HasOption(std::string_view option) const { return options.contains(option); }
  bool HasDevice(std::string_view device) const { return devices.contains(device); }
  bool HasTraceEvent(std::string_view event) const { return trace_events.contains(event); }
};

// "7.2.22" from "QEMU emulator version 7.2.22 (Debian ...)"; empty if absent.
std::string ParseQemuVersion(std::string_view version_text);
// Options from -help: lines starting with "-NAME"; an option takes an
// argument when its name is followed by one space and more text ("-runas
// user"), not when followed by two or more spaces or nothing ("-nodefaults").
std::map<std::string, bool, std::less<>> ParseQemuOptions(std::string_view help);
// Whether -help's -run-with line offers user= (9.1+; 8.1-9.0 had only
// async-teardown= and chroot=).
bool ParseRunWithUser(std::string_view help);
// Names and aliases from `name "X", bus B, alias "Y", desc "..."` lines.
std::set<std::string, std::less<>> ParseQemuDevices(std::string_view device_help);
// One event name per line ([a-z0-9_]).
std::set<std::string, std::less<>> ParseQemuTraceEvents(std::string_view trace_help);
QemuCaps ParseQemuCaps(const QemuCapsText& text, const std::string& binary);

// How this QEMU drops root to |user|: {"-run-with", "user=USER"} where
// -run-with has user=, else {"-runas", "USER"}; an error naming the QEMU when
// it has neither.
Result<std::vector<std::string>> RunAsArgs(const QemuCaps& caps, const std::string& user);

// Devices hvtraced needs from every QEMU it boots, whatever the command line
// says: ivshmem-plain is hot-plugged over QMP by `hvtrace attach`.
inline constexpr std::string_view kAlwaysRequiredDevices[] = {"ivshmem-plain"};

// Checks QEMU's argv (argv[0] the binary, then options and their values)
// against |caps|: each option, each -device driver, each -trace enable=
// event, -run-with's keys, and kAlwaysRequiredDevices. The first miss is an
// error that starts with |vm| and names the option, the QEMU version and
// binary, and what hvtraced needs it for.
Status CheckQemuArgv(const QemuCaps& caps, const std::vector<std::string>& argv,
                     const std::string& vm);

// Runs |binary| four times (-version, -help, -device help, -trace help),
// each within |deadline| and capped at 4 MiB of output. Errors name the
// binary and what failed (not found, exit status, timeout).
Result<QemuCapsText> RunQemuCapsProbe(
    const std::string& binary, std::chrono::milliseconds deadline = std::chrono::seconds(20));

// The capabilities of |binary| (a path, or a name looked up in PATH as exec
// does), probed once per binary version in this process and then shared.
// Thread-safe; the first call per binary blocks for the probe (~0.5 s).
Result<std::shared_ptr<const QemuCaps>> QemuCapsFor(const std::string& binary);

}  // namespace hvtrace::hostd

#endif  // HVTRACE_HOSTD_QEMU_CAPS_H_
