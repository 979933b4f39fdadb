// Why the guest died, read from its kernel log (sans I/O): the panic line,
// the oops / BUG / WARNING line, the task, pid and CPU, the taint flags,
// RIP, and the call trace, as the kernel printed them.
//
// The lines it looks for (x86-64, 6.12 and 7.x; checked against the real
// panics of both guests in tests/fixtures/kernel-log/):
//
//   Kernel panic - not syncing: sysrq triggered crash
//   BUG: kernel NULL pointer dereference, address: 0000000000000000
//   Oops: 0002 [#1] PREEMPT SMP NOPTI
//   WARNING: CPU: 1 PID: 209 at drivers/x.c:12 f+0x1/0x2 [mod]     (to 6.18)
//   WARNING: x.c:12 at f+0x1/0x2 [mod], CPU#1: sh/209            (6.19+, 7.x)
//   CPU: 1 UID: 0 PID: 209 Comm: sh Not tainted 6.12.48+deb12-amd64 #1 ...
//   Tainted: [O]=OOT_MODULE, [D]=DIE            (7.x: the flags in words)
//   RIP: 0010:sysrq_handle_crash+0x1a/0x20
//   Call Trace:
//    <TASK>
//    ? __die+0x23/0x70                           (unreliable frame)
//    hvt_oops_write+0x15/0x30 [hvtrace_test]     (a module's frame)
//    </TASK>
//   Kernel Offset: 0x2ac00000 from 0xffffffff81000000 (relocation ...)
//
// The crash is the last panic line of the log; without one, the last oops
// or WARNING. Its block starts at the oops/BUG/WARNING line that led to it
// (or the panic line itself: sysrq's panic() dumps the stack after it) and
// the first CPU:, RIP: and call trace after that start are its own. The log
// is guest text: every string kept is PrintableLogText (escaped, bounded),
// frames are capped at kMaxCrashFrames, and a line of another shape is
// simply not used.
#ifndef HVTRACE_CRASH_SUMMARY_H_
#define HVTRACE_CRASH_SUMMARY_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "hvtrace/kallsyms_table.h"
#include "hvtrace/kernel_log.h"

namespace hvtrace {

inline constexpr size_t kMaxCrashFrames = 64;

struct CrashFrame {
  std::string function;     // "sysrq_handle_crash+0x1a/0x20", or the raw "0x..." text.
  std::string module;       // "hvtrace_test" for "[hvtrace_test]"; empty for the kernel.
  bool unreliable = false;  // Printed with "? ": a stale address on the stack.
  bool symbolized = false;  // A raw address named with the boot's kallsyms.
  std::string context;      // "TASK", "IRQ", "NMI", "SOFTIRQ": the stack it was on.
};

struct CrashSummary {
  bool found = false;
  std::string kind;    // "panic" | "oops" | "warn" ("" when !found).
  std::string reason;  // The panic's reason, else the oops/BUG/WARNING line.
  std::string panic_line, bug_line, oops_line, warning_line;
  std::string task;  // Comm.
  int32_t pid = -1, cpu = -1;
  std::string taint;          // "not tainted", the flags ("G   D"), or 7.x's words.
  std::string rip;            // "0010:sysrq_handle_crash+0x1a/0x20" (the text after "RIP: ").
  std::string kernel_offset;  // "0x2ac00000" from "Kernel Offset:", when printed.
  std::string cpu_line;       // The whole "CPU: ..." line.
  std::vector<CrashFrame> frames;
  uint64_t frames_dropped = 0;  // Beyond kMaxCrashFrames.
  uint64_t ts_ns = 0;           // The block's first line: where the crash began.
  size_t first_line = 0;        // Its index in the log's records.
};

// Names raw-address frames: |table| parsed from |kallsyms| (the harvest's),
// |delta| the boot's KASLR offset to it (the address minus |delta| is the
// harvest's). Only the kernel image's symbols: the harvest's module
// addresses are another boot's.
struct CrashSymbolizer {
  const KallsymsTable* table = nullptr;
  std::string_view kallsyms;
  int64_t delta = 0;
};

CrashSummary SummarizeCrash(const KernelLog& log, const CrashSymbolizer& symbols = {});

// "Kernel panic - not syncing: X" -> "X"; empty when |text| is not one.
std::string_view PanicReason(std::string_view text);

// What one log line says went wrong: "panic" (a panic line), "oops" (an
// Oops:, BUG:, kernel BUG at or general protection fault line), "warn" (a
// __warn() line, either form above), or "" (anything else). Leading blanks
// are ignored.
std::string_view TroubleOfLine(std::string_view text);

}  // namespace hvtrace

#endif  // HVTRACE_CRASH_SUMMARY_H_
