// Capture store: one directory per capture of a VM's trace region,
//
//   <captures>/<UTC time>-<trigger>[-N]/manifest.json
//                                       region.bin      raw copy of the region
//                                       trace*.dat      decoded, when available
//
// e.g. 20250612T101530.123Z-panic. A capture is written into a hidden
// ".tmp-…" directory beside the final one and renamed into place only when
// every file (and the manifest, last) is written and fsynced, so a reader
// never sees half a capture, and a failure (a full disk, a crash) leaves
// nothing visible but an error naming the path.
//
// manifest.json (format "hvtrace-capture" version 2), the same keys for
// every backend:
//   vm, trigger, id; host_time {triggered, completed} each {realtime_ns,
//   monotonic_ns, utc}; kernel {path, formats_key, release, … as known};
//   region {kind: boot-range | shmem | attach, source, size, offset, gpa; for
//   attach: region_id, geometry, files; a boot range with an attached region
//   beside it holds that one as region.attach}; cpus [{cpu, events, pages,
//   lost_events, bad_pages {reason: count}, bad_pages_total}]; totals {events,
//   pages, lost_events, bad_pages}; validation {...} (the reader's report);
//   qmp_events [{event, realtime_ns, monotonic_ns, data}] (libvirt events are
//   translated to QMP's names); files [{name, bytes}];
//   extra {transport {kind: qmp | libvirt, … what that backend knows},
//          consistency {vcpus_stopped, note, pages_being_written?},
//          timing_ms {copy, region_write, region_fsync, …, trigger_to_decoded
//          (trace.dat files and crash summary written), kernel_log, vmcore,
//          trigger_to_guest_memory_read (after those, when they ran)},
//          disk {need_bytes, free_bytes_before, free_bytes_after_evicting,
//          reserve_met, evicted} (the admission, capture_budget.h),
//          incomplete (what failed after the raw copy was durable, if anything),
//          formats {key, cache, state, decoded, …}, boots [...], and when
//          decoded trace_clock and pipeline_ms (boot ranges),
//          attach {...} (attach regions)};
//   recovered {at, note} when a later daemon run finished the capture.
// Version 1 (before the backends shared one capture path) had extra.qmp /
// extra.libvirt instead of extra.transport and extra.consistency.
//
// A daemon that dies mid-capture must not lose the raw copy: once region.bin
// is durable the backend writes a recovery record (recovery.json: the
// manifest so far) into the hidden directory, and the next daemon run
// finishes such captures (capture_recovery.h) instead of removing them. A
// hidden directory without a record held no durable copy and is removed.
#ifndef HVTRACE_HOSTD_CAPTURE_STORE_H_
#define HVTRACE_HOSTD_CAPTURE_STORE_H_

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "host_time.h"
#include "hvtrace/result.h"
#include "region_file.h"

namespace hvtrace::hostd {

struct CpuCaptureCounts {
  int cpu = 0;
  uint64_t events = 0;
  uint64_t pages = 0;
  uint64_t lost_events = 0;
  std::map<std::string, uint64_t> bad_pages;  // Reason → count.
  // Pages written with the missed-events flag because the page before them
  // was bad or skipped (its events are lost, their number unknown).
  uint64_t lost_marked = 0;
};

// A QMP (or libvirt) event as the daemon saw it.
struct RecordedEvent {
  std::string event;
  HostTime time;
  nlohmann::json data;
};

struct CaptureManifest {
  std::string vm;
  std::string trigger;  // panic, crashloaded, reset, shutdown, qemu-gone, manual, …
  HostTime triggered;
  HostTime completed;  // Set by Commit.
  nlohmann::json kernel = nlohmann::json::object();
  nlohmann::json region = nlohmann::json::object();
  std::vector<CpuCaptureCounts> cpus;
  nlohmann::json validation = nlohmann::json::object();
  std::vector<RecordedEvent> qmp_events;
  nlohmann::json extra = nlohmann::json::object();
  // Null, or how a later daemon run finished this capture.
  nlohmann::json recovered;
  // Null, or why the guest died: the crash summary of its kernel log
  // (hostd/decode/crash_step.h CrashJson).
  nlohmann::json crash;

  nlohmann::json ToJson() const;
  // The fields a recovery record keeps (vm, trigger, host_time.triggered,
  // kernel, region, qmp_events, extra); counts and validation are not read.
  // The record is ours but on disk, so every member is checked.
  static Result<CaptureManifest> FromJson(const nlohmann::json& doc);
};

// The file a capture directory holds from the moment its region copy is
// durable until the capture is committed.
inline constexpr std::string_view kRecoveryRecordName = "recovery.json";
// A committed capture's description (CaptureManifest::ToJson).
inline constexpr std::string_view kManifestName = "manifest.json";
inline constexpr int kManifestVersion = 2;

// One committed capture, as listed.
struct CaptureEntry {
  std::string id;  // Directory name.
  std::filesystem::path dir;
  nlohmann::json summary;  // id, trigger, times, totals, files; or "error".
};

// A committed capture's directory as a listing finds it, before any of its
// files is read. A committed capture is never changed in place (Commit
// renames a finished directory into the store), so the same id and inode
// are the same capture: CaptureBudget reads each one's manifest once.
struct CaptureDirent {
  std::string id;  // Directory name.
  std::filesystem::path dir;
  uint64_t inode = 0;
};

// CaptureEntry::summary of the committed capture |id| at |dir|: its manifest,
// read and checked (a damaged one gives an "error" member).
nlohmann::json SummarizeCapture(const std::string& id, const std::filesystem::path& dir);

// Where a capture sorts in a listing, before its id: its trigger's realtime
// ns from |summary|, INT64_MAX when the summary has none.
int64_t ListingOrder(const nlohmann::json& summary);

// 1..32 characters from [a-z0-9-].
Status ValidateTrigger(std::string_view trigger);

// A capture being written. Destroying it without Commit removes everything it
// wrote, unless its raw copy is durable (a recovery record exists): that stays
// for the next start to finish (Abandon removes it too).
class PendingCapture {
 public:
  PendingCapture(const PendingCapture&) = delete;
  PendingCapture& operator=(const PendingCapture&) = delete;
  ~PendingCapture();

  // The hidden directory the capture is assembled in; other writers (the
  // trace.dat writer) may create files here too.
  const std::filesystem::path& dir() const { return temp_dir_; }

  // Writes and fsyncs dir()/|name|. Errors name the file and offset.
  Status WriteFile(std::string_view name, std::span<const std::byte> data);
  // WriteFile for several files at once: all written, then all synced, then
  // each published; on an error none is.
  struct NamedBytes {
    std::string_view name;
    std::span<const std::byte> data;
  };
  Status WriteFiles(std::span<const NamedBytes> files);

  struct RegionCopyStats {
    double copy_ms = 0;          // Reading the region into |copy|.
    double write_ms = 0;         // Writing into the page cache, writeback started.
    double sync_ms = 0;          // The final fdatasync.
    uint64_t bytes_written = 0;  // Non-zero pages; zero pages stay holes.
    // Page faults of the copying thread while it copied (source and |copy|).
    uint64_t copy_minor_faults = 0;
    // The thread's own CPU time in the copy, and how often it was taken off
    // the CPU against its will: a copy slower than its CPU time waited for a
    // core; one whose CPU time alone is slow stalled on memory (faults, or
    // the hypervisor below this host).
    double copy_cpu_ms = 0;
    uint64_t involuntary_switches = 0;
  };
  // Copies |size| bytes at |offset| of the region file |file| (named
  // |source| in errors; |size| is what hostd configured) into |copy| — the
  // private copy everything else reads — and into dir()/|name|, durable on
  // return. Through the file's kept mapping when it maps this range (page
  // tables filled: no faults), with pread otherwise. Chunk by chunk, so the
  // disk works while the CPU copies: each chunk is read once, its non-zero
  // pages are written (zero pages stay holes: a ring buffer that is not full
  // is mostly zeros) and their writeback started (sync_file_range) before
  // the next chunk is read; one fdatasync at the end. |copy| must be |size|
  // bytes: the caller's buffer (a pooled PageBuffer at panic time: no
  // allocation, no page faults).
  Result<RegionCopyStats> CopyRegion(std::string_view name, const RegionFile& file,
                                     const std::filesystem::path& source, uint64_t offset,
                                     uint64_t size, std::span<std::byte> copy);

  // Writes recovery.json (|manifest| as it stands) durably: call it once the
  // raw copy is durable, so a daemon that dies before Commit leaves a capture
  // the next run can finish.
  Status WriteRecoveryRecord(const CaptureManifest& manifest);
  // The same in two halves (durable_file.h): Stage writes and fsyncs the
  // record under a hidden name and may run while the copy is being made (on
  // another thread; it touches nothing the copy does); Publish, once the
  // copy is durable, renames it in and fsyncs the directory.
  Status StageRecoveryRecord(const CaptureManifest& manifest);
  Status PublishRecoveryRecord();

  // Writes manifest.json (listing the finished files and their sizes),
  // fsyncs it and every file it lists, then the directory, in one flush
  // (files other writers left unsynced, TraceDatSync::kCallerSyncs, become
  // durable here), renames the directory to its final name, and returns the
  // entry. Only finished files are listed and kept: every file is written
  // under a hidden part name and renamed when whole, so hidden names and
  // writers' "*.tmp.*" files are what a failed or killed writer left, and go. The
  // recovery record is not listed and is removed once the capture is
  // visible. On error nothing is left visible; a capture whose raw copy is
  // durable (a recovery record exists) stays in dir() for the next start to
  // finish, and the error says so — a full disk at the manifest must not
  // delete the one durable copy of a panic.
  Result<CaptureEntry> Commit(CaptureManifest manifest);

  // Whether a recovery record was written: the raw copy is durable.
  bool durable() const;
  // Whether a failed Commit left dir() for the next start (see above).
  bool kept() const { return kept_; }

  // Removes everything written, durable or not (a capture found to be a
  // duplicate of an earlier one, or one recovery cannot finish).
  void Abandon();

 private:
  friend class CaptureStore;
  PendingCapture(std::filesystem::path captures_dir, std::filesystem::path temp_dir,
                 std::string base_name);
  void Discard();
  // Ends a failed Commit: removes the capture, or keeps a durable one.
  Error Fail(const std::string& message);

  std::filesystem::path captures_dir_;
  std::filesystem::path temp_dir_;
  std::string base_name_;
  bool done_ = false;
  bool kept_ = false;
};

class CaptureStore {
 public:
  explicit CaptureStore(std::filesystem::path captures_dir)
      : captures_dir_(std::move(captures_dir)) {}

  const std::filesystem::path& dir() const { return captures_dir_; }

  // Starts a capture named after |triggered| (UTC) and |trigger|.
  Result<std::unique_ptr<PendingCapture>> Begin(std::string_view trigger,
                                                const HostTime& triggered) const;

  // Committed captures, oldest first. A capture whose manifest cannot be read
  // is listed with an "error" in its summary rather than hidden.
  Result<std::vector<CaptureEntry>> List() const;

  // The committed captures' directories, in no order, none of their files
  // read: one pass over the store's directory.
  Result<std::vector<CaptureDirent>> ListDirents() const;

  // Removes the oldest captures so that at most |keep| remain (0: keep all).
  // Returns how many were removed.
  Result<size_t> Prune(size_t keep) const;

  // The ".tmp-…" directories left by a daemon that died mid-capture, oldest
  // name first.
  Result<std::vector<std::filesystem::path>> ListIncomplete() const;

  // Takes over one of them (as ListIncomplete names it) to finish or drop
  // it (Abandon); destroying the result without either keeps a durable one.
  Result<std::unique_ptr<PendingCapture>> Resume(const std::filesystem::path& temp_dir) const;

 private:
  std::filesystem::path captures_dir_;
};

// Copies |size| bytes at |offset| of a region file (a /dev/shm backing file)
// into memory. |size| comes from what hostd configured, never from the guest;
// a file shorter than offset + size is an error naming the path.
Result<std::vector<std::byte>> CopyRegionFile(const std::filesystem::path& path, uint64_t offset,
                                              uint64_t size);

// The same from a region file the caller keeps open (QEMU may have unlinked
// it); |path| names it in errors.
Result<std::vector<std::byte>> CopyRegionFd(int fd, const std::filesystem::path& path,
                                            uint64_t offset, uint64_t size);

}  // namespace hvtrace::hostd

#endif  // HVTRACE_HOSTD_CAPTURE_STORE_H_
