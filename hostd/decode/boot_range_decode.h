// Decoding a boot range's private copy: boot-<n>.trace.dat files and the
// manifest's counts, validation and extra.formats. One entry point for the
// daemon's live capture, its recovery of a capture the previous run died in
// (capture_recovery.cc) and `hvtrace show` re-decoding a region file.
#ifndef HVTRACE_HOSTD_BOOT_RANGE_DECODE_H_
#define HVTRACE_HOSTD_BOOT_RANGE_DECODE_H_

#include <cstddef>
#include <filesystem>
#include <functional>
#include <memory>
#include <span>
#include <string>

#include "capture_pipeline.h"
#include "capture_store.h"
#include "formats_service.h"

namespace hvtrace::hostd {

struct BootRangeDecodeTimes {
  double formats_ms = 0, decode_ms = 0, write_ms = 0;
  double files_ms = 0;       // Of write_ms: writing the trace.dat files themselves.
  double kernel_log_ms = 0;  // Of write_ms: the kernel logs and crash summary.
  // Before the build: the formats, the metadata channel and BootKernels
  // (of it |boot_kernels_ms|: the map read and each boot's banner).
  double prepare_ms = 0, boot_kernels_ms = 0;
};

// What is known about the VM a boot range comes from.
struct BootRangeSources {
  // The formats cache: the VM's kernel's entry (|kernel_key|) and every
  // entry a boot's console banner may identify (boot_kernels.h). May be null.
  FormatsService* cache = nullptr;
  std::string kernel_key{};   // Empty: the kernel is unknown (an adopted VM).
  std::string kernel_path{};  // Names the kernel in the note on how to decode later.
  // Formats given by the reader (`hvtrace show --formats KEY_OR_DIR`):
  // decode with these instead of |cache|'s entry for |kernel_key|.
  std::shared_ptr<const KernelFormats> formats{};
  std::filesystem::path meta_dir{};  // The VM's metadata channel store; empty: none.
  int cpus = 0;                      // The guest's CPU count when known; 0 derives it.
  // The newest boot's kernel log read from guest memory (the printk ring
  // buffer), preferred to its console events; may be null (crash_step.h).
  const KernelLog* ring_log = nullptr;
  std::function<void(const CaptureProgress&)> progress{};  // May be empty.
  // BootMapCaptureOptions::newest_kaslr; may be empty.
  KaslrHook newest_kaslr{};
};

// The one decode of a boot range copy, for every reader: the daemon's
// capture step, its start-up recovery and `hvtrace show` (--region FILE, a
// capture holding only region.bin) call it, so the same bytes decode the same
// whoever reads them. Writes boot-<n>.trace.dat into |dir| (not region.bin:
// the caller has it) and fills |manifest|'s counts, validation and
// extra.formats: each boot with the metadata its guest sent for it over the
// metadata channel, the others with the given or cached formats (null or
// unknown and no channel metadata: counts only, and extra.formats says how to
// get them). Never fails: a decode error is recorded in
// extra.formats.decode_error and the counts kept. extra.formats.meta and
// extra.boots[n].decoded_with say which metadata decoded what.
BootRangeDecodeTimes DecodeBootRange(std::span<const std::byte> copy,
                                     const BootRangeSources& sources,
                                     const std::filesystem::path& dir, CaptureManifest& manifest);

}  // namespace hvtrace::hostd

#endif  // HVTRACE_HOSTD_BOOT_RANGE_DECODE_H_
