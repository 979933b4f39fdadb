// The host side of a boot in a capture: QEMU's boot-handshake trace log
// (<vm dir>/qemu-trace.log, written by QEMU's `log` trace backend for a VM
// booted with --trace-boot; boot_trace.h) copied into the capture directory
// as qemu-trace.log, with a summary in manifest extra.host_trace:
//
//   {"file": "qemu-trace.log", "source": PATH, "bytes": N, "file_bytes": N,
//    "skipped_head_bytes": N, "events": N, "malformed": N, "dropped": N,
//    "first_problem": "line N: why", "clock": "host CLOCK_REALTIME (µs)",
//    "first_realtime_ns": T, "last_realtime_ns": T, "by_name": {NAME: N, ...}}
//
// or {"source": PATH, "error": why} when the log cannot be read. QEMU writes
// the file without bound (a guest can make it write more); the capture keeps
// at most kHostTraceCopyCap bytes, the newest ones, cut at a line start: the
// boot a capture is about is the newest one. The copy is QEMU's own text;
// lines that do not parse are counted, not dropped from the file.
#ifndef HVTRACE_HOSTD_HOST_TRACE_CAPTURE_H_
#define HVTRACE_HOSTD_HOST_TRACE_CAPTURE_H_

#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "capture_store.h"
#include "hvtrace/result.h"
#include "qemu_trace_log.h"

namespace hvtrace::hostd {

inline constexpr uint64_t kHostTraceCopyCap = 8ull << 20;
inline constexpr size_t kHostTraceMaxNames = 64;  // by_name entries; the rest in "(other)".

struct HostTraceCopy {
  std::string text;                 // What the capture keeps.
  uint64_t file_bytes = 0;          // The file's size when read.
  uint64_t skipped_head_bytes = 0;  // Older bytes left out (the cap, the cut line).
};

// The newest |cap| bytes of the regular file |path| (never through a
// symlink), starting at a line start when anything was skipped.
Result<HostTraceCopy> ReadQemuTraceLogTail(const std::filesystem::path& path,
                                           uint64_t cap = kHostTraceCopyCap);

// extra.host_trace for a parsed copy (see above).
nlohmann::json HostTraceSummary(const QemuTraceLog& log, const HostTraceCopy& copy);

// libvirt's log of a domain (DIR/NAME.log, kept by virtlogd) holds every
// start of the domain, each opened by libvirt's "DATE: starting up libvirt
// version: ..." line and followed by QEMU's command line and stderr: the
// trace lines of `hvtrace setup`'s -trace options and QEMU's own messages.
// What a capture keeps of it: the lines after the newest start line that
// look like trace lines ("TID@..."; the parser then checks them as it
// checks qemu-trace.log); the rest is counted.
struct LibvirtLogTrace {
  std::string text;
  bool start_found = false;    // Else: no start line in the copy; all of it is used.
  uint64_t earlier_bytes = 0;  // Up to and including the newest start line.
  uint64_t other_lines = 0;    // After it, not trace lines (libvirt's, QEMU's messages).
};
LibvirtLogTrace TraceLinesOfNewestStart(std::string_view log);

// Copies |path| into |pending| as qemu-trace.log and sets
// manifest.extra.host_trace. Never fails the capture: a problem is recorded
// in extra.host_trace.error. With |libvirt_log|, |path| is libvirt's log of
// the domain and only TraceLinesOfNewestStart of it is kept
// (extra.host_trace.libvirt_log says what was left out).
void AttachQemuTraceLogStep(const std::filesystem::path& path, PendingCapture& pending,
                            CaptureManifest& manifest, bool libvirt_log = false);

}  // namespace hvtrace::hostd

#endif  // HVTRACE_HOSTD_HOST_TRACE_CAPTURE_H_
