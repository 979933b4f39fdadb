// hvtrace show CAPTURE: the crash summary it opens with, and --log (the
// capture's kernel log alone, as dmesg prints it).
//
// The summary is the manifest's `crash` object (hostd/decode/crash_step.h),
// printed before the first boot's events: as '#' lines in text, so readers
// of the event lines (and their comparison with `trace-cmd report`) skip it,
//
//   # crash (boot 0): Kernel panic - not syncing: sysrq triggered crash
//   #   task sh, pid 209, CPU 1; not tainted
//   #   call trace (* unreliable):
//   #     sysrq_handle_crash+0x1a/0x20
//   ...
//
// and as one {"crash": {...}} object (no "event" key) first in JSON. A
// manifest may come from a copied capture: every member is type-checked and
// every string printed through PrintableLogText.
#ifndef HVTRACE_HOSTD_CLI_SHOW_CRASH_H_
#define HVTRACE_HOSTD_CLI_SHOW_CRASH_H_

#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

namespace hvtrace::cli {

// The summary as '#' text lines ('\n' after each); empty without a crash.
std::string CrashSummaryText(const nlohmann::json& manifest);

// The summary's JSON line ('\n' included); empty without a crash.
std::string CrashSummaryJsonLine(const nlohmann::json& manifest);

// "panic: sysrq triggered crash" cut to |width| columns, printable; "-"
// without a crash. For `hvtrace captures` (its summary's crash object).
std::string CrashReasonColumn(const nlohmann::json& summary, size_t width);

// Prints the kernel log files (boot-<n>.kernel.log) of |dir| to |fd|, each
// boot under a "# boot N" line when there are several; only |boot| when
// set. Exit status as `hvtrace show`.
int ShowKernelLogs(const std::filesystem::path& dir, std::optional<uint32_t> boot, int fd);

}  // namespace hvtrace::cli

#endif  // HVTRACE_HOSTD_CLI_SHOW_CRASH_H_
