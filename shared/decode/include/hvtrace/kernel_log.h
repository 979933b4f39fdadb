// The guest kernel's log (what `dmesg` prints), as hvtrace recovers it from
// host memory: from the guest's printk ring buffer read while the vCPUs are
// stopped (printk_ring.h), or from the `printk:console` events the boot
// range recorded. Both sources hand their lines over in this one shape, so
// the crash summary, `hvtrace show --log` and the writers have one input.
//
// The text is guest data: stored as the guest wrote it (bounded), and made
// printable only when shown (PrintableLogText), so nothing the guest wrote
// reaches a terminal raw.
#ifndef HVTRACE_KERNEL_LOG_H_
#define HVTRACE_KERNEL_LOG_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace hvtrace {

// Longest line kept; the kernel's own limit (PRINTKRB_RECORD_MAX /
// LOG_LINE_MAX) is 1024 bytes, longer text is cut and counted.
inline constexpr size_t kMaxKernelLogLine = 1024;

// One record of the log, one line (a record whose text holds newlines is
// split into one record per line, each keeping the record's time).
struct KernelLogRecord {
  uint64_t seq = 0;    // printk sequence number; 0 where the source has none.
  uint64_t ts_ns = 0;  // The kernel's timestamp (local_clock, ns since boot).
  int32_t cpu = -1;    // The CPU that logged it, -1 unknown.
  int32_t pid = -1;    // The task that logged it, -1 unknown.
  int level = -1;      // Log level 0..7, -1 unknown.
  std::string text;    // Without the trailing newline; not yet sanitized.
};

struct KernelLog {
  // "printk-ring" | "console-events" | "serial": where the lines came from.
  std::string source;
  std::vector<KernelLogRecord> records;  // In the kernel's order.
  // Records known to be gone before the first one kept: the ring wrapped
  // (first seq > 0), or the events began after the boot did.
  uint64_t lost = 0;
  // Records skipped because they did not parse (each bound and check that
  // failed counts one); what parsed is kept.
  uint64_t malformed = 0;
  // Lines cut at kMaxKernelLogLine.
  uint64_t truncated = 0;
};

// |text| with every byte that is not printable ASCII or valid UTF-8 text
// (control characters, ESC, DEL, invalid UTF-8) written as \xNN, so a
// terminal shows it and never interprets it.
std::string PrintableLogText(std::string_view text);

// (*text)[from..] made printable as PrintableLogText does, its newlines and
// tabs kept: an event line shown on a terminal, where the guest wrote the
// strings (a trace_marker write, a /dev/kmsg line through printk:console, a
// task name). Text that is already printable is left as it is, after one
// scan.
void MakePrintableFrom(std::string* text, size_t from);

// Appends dmesg's stamp of |ts_ns|: "[%5lu.%06lu]" (seconds, then
// microseconds), no space after it.
void AppendDmesgStamp(uint64_t ts_ns, std::string* out);

// One record as dmesg prints it: "[%5lu.%06lu] text" (the text made
// printable), no newline.
std::string DmesgLine(const KernelLogRecord& record);

// Every record of |log|, one DmesgLine per line, each ending in '\n'.
std::string DmesgText(const KernelLog& log);

}  // namespace hvtrace

#endif  // HVTRACE_KERNEL_LOG_H_
