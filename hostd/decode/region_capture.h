// Capture pipeline for an attach-mode region (ABI: hvtrace/region.h): a
// private copy of the region -> ReadRegion (validated, torn and bad slots
// counted by reason) -> one trace.dat per boot generation + manifest counts.
//
// Files written into the capture:
//   attach-region.bin           the raw copy (everything can be redone from it)
//   region-gen-<N>.trace.dat    boot generation N: CPUs 0..n-1 are the guest's
//                               CPUs (kernel pages the agent pushed), then one
//                               extra CPU per direct-write ring (n + ring)
//   region-gen-<N>-tsc.trace.dat  only when a direct-write ring stamped with
//                               the TSC cannot be put on the trace clock (too
//                               few sound clock-sync samples): those rings,
//                               raw ticks, trace clock "x86-tsc"
// `trace-cmd report` and `hvtrace show` read them like boot-<n>.trace.dat.
//
// Clocks: direct-write rings stamped with the TSC are restamped onto the
// guest's trace clock (hvtrace/region_clock.h), so their events and the
// kernel's sort on one timeline in region-gen-<N>.trace.dat.
//
// Formats come from the region's own format table for that generation (each
// entry checked against its text and fingerprint by ReadRegion). Records
// whose id has no format are counted as "unknown_id" and stay in the raw
// copy. Names: the guest kernel's text symbols and saved_cmdlines from the
// region's text areas (hvtrace/region_text.h) go into each generation's
// kallsyms (only the symbols its events name: KallsymsSubset) and cmdlines
// sections, so trace-cmd prints the function and task names the guest's own
// trace file shows; a direct-write ring's thread id
// and name are added to the cmdlines. An area that is absent or refused
// leaves addresses and <...>, as without it.
//
// The region is hostile: pages come out of ReadRegion bounded by the slot
// size hostd chose; a page whose records fail to walk is written cut at its
// first bad record (the good ones stay readable, the bad bytes never reach
// trace-cmd).
#ifndef HVTRACE_HOSTD_REGION_CAPTURE_H_
#define HVTRACE_HOSTD_REGION_CAPTURE_H_

#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "capture_store.h"
#include "hvtrace/region_reader.h"
#include "hvtrace/region_text.h"
#include "hvtrace/result.h"

namespace hvtrace::hostd {

class LiveRegion;

struct RegionCaptureOptions {
  bool write_region = true;  // attach-region.bin.
  // Notes for the manifest: whether the guest was stopped while copying.
  bool vm_paused = false;
};

// One boot generation's file.
struct RegionGenerationFile {
  uint64_t generation = 0;
  std::string file;  // "region-gen-<N>.trace.dat" (or "...-tsc.trace.dat")
  std::string trace_clock;
  uint64_t events = 0;
  uint64_t kernel_events = 0;
  uint64_t dw_events = 0;
  uint64_t pages = 0;
  uint64_t unknown_id = 0;
  uint64_t first_timestamp = 0;  // Guest trace clock, ns.
  uint64_t last_timestamp = 0;
  uint64_t last_kernel_timestamp = 0;
  uint64_t last_dw_timestamp = 0;
};

struct RegionCaptureResult {
  std::vector<RegionGenerationFile> generations;
  uint64_t events = 0, pages = 0, unknown_id = 0, lost_events = 0, bad_slots = 0;
  uint64_t dw_events_off_clock = 0;          // TSC stamps no conversion can represent.
  std::vector<CpuCaptureCounts> cpu_counts;  // Kernel CPUs, then dw rings (cpu = n + ring).
  nlohmann::json attach;  // manifest.extra["attach"]: guest, loss window, rings, issues.
  std::vector<std::string> files;
};

// "region-gen-<N>.trace.dat"
std::string RegionTraceDatName(uint64_t generation);
// "region-gen-<N>-tsc.trace.dat": TSC rings that could not be converted.
std::string RegionUnplacedTraceDatName(uint64_t generation);

// Writes the trace.dat files for |snapshot| into |dir| (no region.bin, no
// manifest). For captures, tests and `hvtrace show`. |texts| (updated with
// this snapshot) supplies symbols and task names; without it the files have
// the direct-write threads' names only. The files are not fsynced
// (TraceDatSync::kCallerSyncs): PendingCapture::Commit syncs a capture's.
Result<RegionCaptureResult> WriteRegionTraceDats(const RegionSnapshot& snapshot,
                                                 const std::filesystem::path& dir,
                                                 const RegionTextCache* texts = nullptr);

// The whole capture of a region copy: attach-region.bin (when asked),
// region-gen-<N>.trace.dat, and the manifest's cpus, validation (when empty),
// kernel (release, boot id) and extra.attach. Fails only when the copy is
// unusable (wrong size) or a file cannot be written. |copy| is the
// snapshot's while decoding and handed back after (the same allocation, so
// a pooled copy buffer stays in its pool), also on failure once decoded.
Result<RegionCaptureResult> BuildRegionCapture(std::vector<std::byte>& copy,
                                               const RegionGeometry& geometry,
                                               const RegionCaptureOptions& options,
                                               PendingCapture& out, CaptureManifest& manifest);

// Copies |region| now (CopyLiveRegion: slots rewritten during the copy count
// as torn) and captures it, with copy time in extra.attach.copy_ms.
Result<RegionCaptureResult> CaptureLiveRegion(const LiveRegion& region,
                                              const RegionCaptureOptions& options,
                                              PendingCapture& out, CaptureManifest& manifest);

}  // namespace hvtrace::hostd

#endif  // HVTRACE_HOSTD_REGION_CAPTURE_H_
