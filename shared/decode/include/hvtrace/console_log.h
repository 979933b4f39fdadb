// The kernel log rebuilt from `printk:console` events (sans I/O).
//
// Every printk passes the printk:console tracepoint (printk_sprint ->
// trace_console) with the record's text: level prefix and trailing newline
// already stripped, a KERN_CONT fragment as its own event. Its format:
//
//   field:__data_loc char[] msg;  offset:8;  size:4;  signed:0;
//   print fmt: "%s", __get_str(msg)
//
// A boot range that records the event holds the log from the moment the
// boot instance existed up to the panic line and its call trace
// (oops_enter() stops only the top-level buffer). The records are guest
// bytes: each is copied, its __data_loc reference bounded by the payload,
// the text cut at its first NUL and at kMaxKernelLogLine; a record that
// fails a check is counted in KernelLog::malformed and skipped.
#ifndef HVTRACE_CONSOLE_LOG_H_
#define HVTRACE_CONSOLE_LOG_H_

#include <cstdint>
#include <optional>
#include <span>

#include "hvtrace/format.h"
#include "hvtrace/kernel_log.h"

namespace hvtrace {

// Where printk:console keeps its text, from the event's format.
struct ConsoleMsgField {
  uint32_t id = 0;      // The event id (a record's common_type).
  uint32_t offset = 0;  // The u32 __data_loc reference's offset.
};
// nullopt when |format| is not printk:console or has no `__data_loc char[]
// msg` field of 4 bytes.
std::optional<ConsoleMsgField> FindConsoleMsgField(const EventFormat& format);

// One record of the boot, as the range reader bounded it.
struct ConsoleEventRecord {
  uint64_t ts_ns = 0;
  int32_t cpu = -1;
  std::span<const std::byte> payload;  // Starts with struct trace_entry.
};

// Most lines kept: a boot logging for days would otherwise hold every line
// the range kept (a 16 MiB range holds ~200 k short events).
inline constexpr size_t kMaxConsoleLogLines = 200000;

// Builds the log (source "console-events") from |records| in time order;
// records of other events are ignored. Multi-line texts become one record
// per line, each with the event's time, CPU and common_pid.
KernelLog KernelLogFromConsoleEvents(const ConsoleMsgField& field,
                                     std::span<const ConsoleEventRecord> records);

}  // namespace hvtrace

#endif  // HVTRACE_CONSOLE_LOG_H_
