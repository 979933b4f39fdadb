// Capture pipeline for a boot-range region: a private copy of the guest's
// persistent ring buffer -> validated decode (ReadBootMap) -> one trace.dat
// per boot + the manifest's counts, and each boot's kernel log and crash
// summary (crash_step.h).
//
// The region is hostile. The caller passes a copy it owns (CopyRegionFile or
// a copy of the mapping made while the VM was paused); nothing here reads the
// live region. A bad CPU or page is reported and skipped, every good record
// is kept:
//   - a page whose tail failed to walk is written with its commit cut at the
//     first bad record (the good records before it stay readable by
//     trace-cmd, the bad bytes never reach it);
//   - skipped pages (a duplicated slot, a corrupt time) are counted as bad
//     pages by reason and not written;
//   - records whose event id has no format are counted ("unknown_id") and
//     stay in region.bin.
// trace-cmd (and so `hvtrace show`) prints sched_switch, sched_wakeup and
// hrtimer_expire_entry through libtraceevent's plugins ("A:1 [120] S ==>
// B:2 [120]", "A:1 [120] CPU:000", "hrtimer=P now=N function=F/0x0") where
// the guest's trace file prints the kernel's print fmt; the guest prints %p
// as "(____ptrval____)" until its hash key is ready, trace-cmd the value.
// The boot buffer has no saved_cmdlines: each trace.dat's cmdlines name every
// pid the trace names by the name covering most of its events (MostUsedNames,
// hvtrace/task_names.h), then the boot's comms from the metadata channel for
// the others; trace-cmd prints "<...>" for a pid neither names. `hvtrace show`
// names each event's task as it was at that time (TaskNameTimeline).
#ifndef HVTRACE_HOSTD_CAPTURE_PIPELINE_H_
#define HVTRACE_HOSTD_CAPTURE_PIPELINE_H_

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "capture_store.h"
#include "formats_cache.h"
#include "hvtrace/boot_map.h"
#include "hvtrace/kernel_log.h"
#include "hvtrace/result.h"
#include "hvtrace/tracedat_writer.h"

namespace hvtrace::hostd {

// Progress of long work: |stage| is "decode", "write" or "region"; |done| of
// |total| units (pages for decode/write, bytes for region).
struct CaptureProgress {
  std::string_view stage;
  uint64_t done = 0;
  uint64_t total = 0;
};

// Told a boot's KASLR offset (BootMapCaptureOptions::newest_kaslr).
using KaslrHook = std::function<void(std::optional<int64_t>)>;

// The offset a boot's decoded_with.kaslr holds ({"delta": N, ...}); nullopt
// when it holds none.
std::optional<int64_t> KaslrDeltaOf(const nlohmann::json& kaslr);

// Threads reading the region's CPUs (ReadBootMap) at a panic: one. With
// two, the read's join waited for its second thread to get a CPU while the
// guest-log thread, started at the same moment, held the other one: the
// read took 1.4-3.0 ms in 4 of 10 panics instead of 0.5-1.1 ms
// (bench/capture_latency.sh 5, 6.12 guest, two rounds of each build in turn,
// 2026-12-05 16:13-16:15 UTC; bench/README).
inline constexpr int kDecodeThreads = 1;

struct BootMapCaptureOptions {
  int cpus = 0;                       // The guest's nr_cpu_ids when known; 0 derives it.
  uint32_t subbuf_size = 4096;        // Sub-buffer size (the guest's PAGE_SIZE).
  uint32_t long_size = 8;             // The guest's userspace long (x86_64: 8).
  std::string trace_clock = "local";  // The boot instance's clock.
  bool write_region = true;           // Also write region.bin (the raw copy).
  // The newest boot's kernel log when the capture recovered it otherwise
  // (the printk ring buffer): its boot-<n>.kernel.log and crash summary come
  // from it instead of the console events (crash_step.h). May be null.
  const KernelLog* ring_log = nullptr;
  // Called from the calling thread now and then; may be empty.
  std::function<void(const CaptureProgress&)> progress;
  // Told the newest boot's KASLR offset as soon as it is settled, before
  // that boot's symbols, trace.dat and kernel log are written: the delta its
  // decoded_with.kaslr will hold, nullopt when it holds none. Lets a capture
  // read guest memory beside the rest of the decode. Called at most once,
  // from the calling thread; may be empty.
  KaslrHook newest_kaslr;
  // The region's boot map as the caller read it already (BootKernels), with
  // the options it was read with: the decode uses it instead of reading the
  // region again when those are the options it reads with (at a 6.12 panic
  // the second read was 3.3 M instructions). Must outlive the call; may be
  // null.
  const BootMap* map = nullptr;
  BootMapOptions map_read_with;
};

// One boot found in the region (0 = oldest).
struct CaptureBoot {
  uint32_t boot = 0;
  std::string file;  // "boot-<n>.trace.dat"
  uint64_t events = 0;
  uint64_t pages = 0;            // Pages written to the file.
  uint64_t first_timestamp = 0;  // ns of the guest's trace clock
  uint64_t last_timestamp = 0;
  std::vector<uint64_t> events_per_cpu;
  // With per-boot formats: which metadata decoded this boot (manifest
  // extra.boots[n].decoded_with); null otherwise.
  nlohmann::json decoded_with;
  // extra.boots[n].kernel_log and the boot's crash (crash_step.h); null
  // when the boot has no log / no crash in it.
  nlohmann::json kernel_log;
  nlohmann::json crash;
};

struct CaptureResult {
  std::string layout;  // "linux-6.12", ...
  int cpus = 0;
  std::vector<CpuCaptureCounts> cpu_counts;  // For CaptureManifest::cpus.
  std::vector<uint64_t> unknown_id_events;   // Per CPU: ids without a format.
  std::vector<CaptureBoot> boots;
  uint64_t events = 0, unknown_id = 0, bad_pages = 0, lost_events = 0;
  nlohmann::json validation;       // For CaptureManifest::validation.
  std::vector<std::string> files;  // Written into the capture directory.
  double decode_ms = 0, write_ms = 0;
  // Of write_ms: in WriteTraceDat, and before it: the KASLR offset, the
  // kallsyms subset (with printk formats moved), and the wait for the task
  // names after those. names_ms is their own time, on a thread beside them.
  double files_ms = 0, kaslr_ms = 0, symbols_ms = 0, names_wait_ms = 0, names_ms = 0;
  // The kernel logs and the crash summary: their own time, on a thread
  // beside the trace.dat files, and the wait for them after those (of write_ms).
  double kernel_log_ms = 0, kernel_log_wait_ms = 0;
};

// Decodes |region_copy| with |formats| and writes into |out|: region.bin
// (when opts.write_region) and boot-<n>.trace.dat for every boot. Fills
// |manifest|'s kernel (formats key, release), cpus, validation and
// extra.boots; the caller sets vm, trigger, times, region and QMP events and
// commits. Fails only when nothing can be decoded (ReadBootMap's refusal:
// not a 6.12 layout, no meta anywhere) or a file cannot be written; the
// message says which region/file.
Result<CaptureResult> BuildBootMapCapture(std::span<const std::byte> region_copy,
                                          const KernelFormats& formats,
                                          const BootMapCaptureOptions& opts, PendingCapture& out,
                                          CaptureManifest& manifest);

// The formats one boot of a range decodes with.
struct BootFormats {
  const KernelFormats* formats = nullptr;  // Null: the formats passed to the build.
  std::string cmdlines;                    // saved_cmdlines text for its trace.dat.
  // The kallsyms and printk_formats are this boot's own (the metadata
  // channel's): no KASLR relocation, once the boot's own events agree
  // (EstablishKaslr; evidence against them prints the boot raw).
  bool own_symbols = false;
  nlohmann::json source;  // For the manifest: where the formats came from.
};
// Boot |boot| (0 = oldest) → its formats; |last_timestamps| has one entry
// per boot of the region: its newest event's time (ns of the guest's trace
// clock, 0 when it has none). Called once per boot, in order, before any
// file is written; the pointers must outlive the build.
using BootFormatsFor =
    std::function<BootFormats(uint32_t boot, std::span<const uint64_t> last_timestamps)>;
// Every boot with |formats| (the kernel file's harvest).
BootFormatsFor SameFormats(const KernelFormats& formats);

// The same with formats per boot (the metadata channel's, one bundle per
// boot of the guest): |formats| gives the page layout and decodes the boots
// |per_boot| leaves without.
Result<CaptureResult> BuildBootMapCapture(std::span<const std::byte> region_copy,
                                          const KernelFormats& formats,
                                          const BootFormatsFor& per_boot,
                                          const BootMapCaptureOptions& opts, PendingCapture& out,
                                          CaptureManifest& manifest);
// The same into |dir| (no region.bin, whatever opts.write_region says): for
// DecodeBootRange (boot_range_decode.h), whose callers hold region.bin.
Result<CaptureResult> BuildBootMapCapture(std::span<const std::byte> region_copy,
                                          const KernelFormats& formats,
                                          const BootFormatsFor& per_boot,
                                          const BootMapCaptureOptions& opts,
                                          const std::filesystem::path& dir,
                                          CaptureManifest& manifest);

// Without formats (the kernel's are not cached yet): reads |region_copy|
// with the 6.12 default page layout and fills |manifest|'s cpus, validation
// and extra.boots as BuildBootMapCapture would, writing no file. Event ids
// are not checked. Fails only as ReadBootMap refuses.
Result<CaptureResult> CountBootMapCapture(std::span<const std::byte> region_copy,
                                          const BootMapCaptureOptions& opts,
                                          CaptureManifest& manifest);

// Builds a KernelFormats from a tracefs-like directory: header_page,
// header_event, events/<system>/<event>/format or <system>/<event>/format
// (the fixture and `trace-cmd` layouts), and kallsyms / printk_formats when
// present. Hostile input: sizes capped, unparsable formats kept with their
// parse_error. For tests and `hvtrace show --formats DIR`.
Result<KernelFormats> KernelFormatsFromDirectory(const std::filesystem::path& dir);

// The manifest entry for |result| (the per-boot list).
nlohmann::json BootsToJson(const CaptureResult& result);

}  // namespace hvtrace::hostd

#endif  // HVTRACE_HOSTD_CAPTURE_PIPELINE_H_
