// The kernel log and the crash summary of one boot of a capture: the
// boot-<n>.kernel.log file (dmesg's lines) and the manifest's account of it
// (extra.boots[n].kernel_log, and `crash` for the crash the capture is
// about). One step of the one capture path (capture_pipeline.cc calls it per
// boot as it writes that boot's trace.dat), so the daemon's capture, its
// recovery and `hvtrace show --region` make the same files.
//
// Where the log comes from: a printk ring buffer read from guest memory
// (the capture's KernelLog, newest boot only) when the capture has one,
// else the boot's printk:console events (console_log.h). The summary
// (crash_summary.h) adds the last events the panicking CPU recorded before
// the crash began, printed as `trace-cmd report` prints them.
#ifndef HVTRACE_HOSTD_CRASH_STEP_H_
#define HVTRACE_HOSTD_CRASH_STEP_H_

#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "formats_cache.h"
#include "hvtrace/boot_map.h"
#include "hvtrace/console_log.h"
#include "hvtrace/crash_summary.h"
#include "hvtrace/kernel_log.h"
#include "hvtrace/tracedat_writer.h"
#include "kallsyms_subset.h"

namespace hvtrace::hostd {

// Events of the panicking CPU kept before the crash.
inline constexpr size_t kCrashEventsBefore = 20;

struct BootLogInputs {
  const BootMap* map = nullptr;
  uint32_t boot = 0;
  const KernelFormats* formats = nullptr;       // The formats the boot decoded with.
  const TraceDatWriterInput* writer = nullptr;  // Its trace.dat's formats, symbols, comms.
  // The boot's KASLR offset to |formats|' kallsyms, when its events proved
  // one (KaslrVerdict): raw call-trace addresses are named with it.
  bool use_symbols = false;
  int64_t kaslr_delta = 0;
  // A log recovered otherwise (the printk ring buffer): used instead of
  // the console events. May be null.
  const KernelLog* ring_log = nullptr;
  // The boot's moved module symbols (KallsymsForEvents); may be null.
  const ModuleKallsyms* modules = nullptr;
};

struct BootLogResult {
  std::string file;           // "boot-<n>.kernel.log"; empty: no log, no file.
  nlohmann::json kernel_log;  // {file, source, lines, lost, malformed, truncated}.
  nlohmann::json crash;       // CrashJson, or null: no crash in the log.
  double ms = 0;
};

// Builds the boot's log and summary and writes the log file into |dir|
// (no fsync: the capture's commit syncs its files).
Result<BootLogResult> WriteBootKernelLog(const BootLogInputs& in, const std::filesystem::path& dir);

// Where |formats|' printk:console event keeps its text; nullopt when the
// kernel has no such event (or its format is not the one console_log.h reads).
std::optional<ConsoleMsgField> ConsoleField(const KernelFormats& formats);

// The boot's log from its printk:console events (empty without the event).
KernelLog ConsoleLogOfBoot(const BootMap& map, uint32_t boot, const KernelFormats& formats);

// The manifest's `crash` object: kind, reason, lines, task/pid/cpu, taint,
// rip, frames[], events_before[], and the log's source and counts.
nlohmann::json CrashJson(const CrashSummary& s, const KernelLog& log, uint32_t boot);

}  // namespace hvtrace::hostd

#endif  // HVTRACE_HOSTD_CRASH_STEP_H_
