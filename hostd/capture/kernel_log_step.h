// The capture step that reads the guest kernel's log (its printk ring
// buffer) out of guest memory while the vCPUs are still stopped, after the
// region copies are durable, beside the rest of their decode once it has
// settled the newest boot's KASLR offset, before the guest is released.
//
// How the ring is found, with no agent and no debuginfo:
//   1. The kernel's own VMCOREINFO text, at `vmcoreinfo_data` (a pointer)
//      and `vmcoreinfo_size`: their addresses come from the boot's kallsyms
//      (the formats cache). Read straight from guest RAM when the backend
//      mapped it (kernel_memory_direct.h: the image found by its banner, the
//      KASLR offset from VMCOREINFO). Otherwise through the backend's reader
//      (QMP memsave) with the symbols moved by a KASLR offset: the one the
//      decode established for the newest boot, else 0, else each 2 MiB step
//      of x86_64's kernel image area; a candidate is accepted only when the
//      guest's `linux_banner` there reads exactly as the harvest's
//      /proc/version.
//   2. VMCOREINFO's SYMBOL/OFFSET/SIZE entries locate and describe the ring
//      (hvtrace/printk_ring.h reads it).
// Everything the guest gave (the pointer, the size, the text) is bounded.
// What was read is kept (printk-memory.zst, vmcoreinfo.txt) so the log can be
// read again by a fixed reader.
#ifndef HVTRACE_HOSTD_CAPTURE_KERNEL_LOG_STEP_H_
#define HVTRACE_HOSTD_CAPTURE_KERNEL_LOG_STEP_H_

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "capture_inputs.h"
#include "capture_store.h"
#include "formats_service.h"
#include "hvtrace/kernel_log.h"
#include "hvtrace/memory_record.h"
#include "hvtrace/result.h"

namespace hvtrace::hostd {

inline constexpr const char* kKernelLogFileName = "kernel.log";

// Reads the log through |in.guest_ram| or |in.read_guest_memory| with the kallsyms of
// |in.region_file|'s kernel key, writes vmcoreinfo.txt and printk-memory.zst,
// and records manifest extra.kernel_log ({source, lines, lost, malformed,
// truncated, ms, ...} or {error}) and extra.timing_ms.kernel_log. Never
// fails: a log that cannot be read is said in the manifest. nullopt when
// there is no log.
std::optional<KernelLog> ReadKernelLogStep(const CaptureInputs& in, FormatsService* formats,
                                           PendingCapture& pending, CaptureManifest& manifest);

// The step in two halves, so that the reads can run beside the decode: they
// touch neither the capture nor its manifest (CaptureService::Build starts
// them with the decode).
struct GuestLogRead {
  Result<KernelLog> log = Error{"not read"};
  MemoryRecord record;     // Every read, for printk-memory.zst.
  std::string vmcoreinfo;  // The guest's VMCOREINFO text, for vmcoreinfo.txt.
  nlohmann::json info = nlohmann::json::object();  // Becomes extra.kernel_log.
  double read_ms = 0, write_ms = 0;
  bool files_written = false;
};
// The reads; |kaslr_hint| gives the first KASLR offset tried, asked only
// when the reads go through |in.read_guest_memory| (it may wait for the
// decode to settle it).
using KaslrHintSource = std::function<std::optional<int64_t>()>;
GuestLogRead ReadGuestLog(const CaptureInputs& in, FormatsService* formats,
                          const KaslrHintSource& kaslr_hint);
// Writes |read|'s files (vmcoreinfo.txt, printk-memory.zst, kernel.log)
// into |pending|, once; any thread, beside the decode.
void WriteGuestLogFiles(GuestLogRead& read, PendingCapture& pending);
// Writes what |read| found (its files, if not yet) and records it in
// |manifest|, as ReadKernelLogStep does.
std::optional<KernelLog> StoreGuestLog(GuestLogRead read, PendingCapture& pending,
                                       CaptureManifest& manifest);
// The newest boot's KASLR offset as the decode recorded it in |manifest|
// (extra.boots[-1].decoded_with.kaslr.delta); nullopt when there is none.
std::optional<int64_t> DecodedKaslrDelta(const CaptureManifest& manifest);

// kernel.log: one line per record, `SEQ<TAB>[SECONDS.MICROS]<TAB>T<pid>|C<cpu><TAB>TEXT`,
// the text made printable (PrintableLogText).
std::string KernelLogText(const KernelLog& log);

}  // namespace hvtrace::hostd

#endif  // HVTRACE_HOSTD_CAPTURE_KERNEL_LOG_STEP_H_
