// The one path from a VM backend's bytes and facts to a committed capture.
//
// A backend (QMP, libvirt, …) only says what there is to copy and what it
// knows (CaptureInputs); everything else happens here, the same way for every
// backend:
//
//   1. boot range: copied into a private buffer and written to region.bin,
//      fsynced; the recovery record (the manifest so far) is written next, so
//      from here on a daemon that dies leaves a capture the next run finishes
//   2. attach region: copied (slots rewritten during the copy count as torn),
//      attach-region.bin written durably, the recovery record updated
//   3. both decoded from the private copies (never the live memory) with the
//      daemon's FormatsService: boot-<n>.trace.dat, region-gen-<N>.trace.dat
//   4. the manifest (layout: capture_store.h) committed, retention applied
//
// Before step 1 the capture is admitted by the disk budget
// (capture_budget.h: byte budgets, free-space reserve, panic captures kept
// from cheaper triggers); retention after step 4 follows the same classes.
// A failure after step 1 never throws the durable copy away: the capture is
// committed with what it has (manifest.extra.incomplete says what failed),
// or, when even that fails (a full disk), kept for the next start.
//
// Recovery at start-up (Recover) runs steps 3–4 for every capture a previous
// run left after step 1 or 2.
#ifndef HVTRACE_HOSTD_CAPTURE_SERVICE_H_
#define HVTRACE_HOSTD_CAPTURE_SERVICE_H_

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "capture_budget.h"
#include "capture_inputs.h"
#include "capture_store.h"
#include "formats_service.h"
#include "hvtrace/result.h"

namespace hvtrace::hostd {

struct CaptureRequest {
  std::string vm;
  std::string trigger;
  HostTime triggered;
  std::vector<RecordedEvent> events;  // The VM's recent events, oldest first.
  CaptureInputs inputs;
  size_t retention = 20;  // Captures kept per VM; 0 = all.
  // A panic found by a restarted daemon whose region is byte-identical to the
  // newest panic capture's is that capture: nothing new is committed.
  bool dedupe_same_panic = false;
  // Further triggers this capture stands for, by trigger ({"crashloaded":
  // 57}): the VM's supervisor coalesced them instead of capturing each
  // (supervisor.h). Kept as manifest extra.coalesced.
  std::map<std::string, uint64_t> coalesced;
  // How the daemon's capture queue ran it ({"lane", "waited_for_a_slot",
  // "trigger_to_dispatch_ms", "trigger_to_worker_ms"},
  // capture_queue.h); null when it did not go through one. Kept as manifest
  // extra.queue, with whether it waited for a set of copy buffers.
  nlohmann::json queue;
  // Called (on the capture's thread, must not block) once every region copy
  // is durable, before decoding: a guest that waits to leave its kernel
  // (trigger "guest-leaving") may go from then on. Not called when the
  // capture fails before that.
  std::function<void()> on_durable;
};

struct CaptureOutcome {
  std::string id;
  std::string trigger;
  bool deduplicated = false;  // An earlier capture holds it (see above).
  double trigger_to_disk_ms = 0;
  std::string retention_error;  // Pruning failed (the capture is committed).
  // A later step failed after the raw copy was durable: committed with what
  // it has (manifest.extra.incomplete holds this).
  std::string incomplete;
  nlohmann::json disk;  // Admission: need, free bytes, evicted captures.
};

// Test seam: called right after the given step; the tests of recovery make
// it kill the process (tests/tools/hvtraced_crash_after_region.cc) or throw,
// nothing else sets it.
struct CaptureFaults {
  // Every region copy and the recovery record are durable; nothing is
  // decoded or committed yet.
  std::function<void()> after_copies_durable;
  // The capture is committed (its directory renamed into place); its upload
  // queue entry is not written yet (Daemon's on_committed, uploader.h).
  std::function<void()> before_upload_queued;
};

// The metadata-channel store of the VM whose captures |store| holds
// (<vm dir>/meta beside <vm dir>/captures): a capture decodes with its own
// VM's metadata only.
std::filesystem::path MetaDirOfStore(const CaptureStore& store);

// The largest private copies one capture makes: a region file (boot range)
// and an attach region.
struct CopySizes {
  uint64_t region_file = 0;
  uint64_t attach = 0;
};

// The copy buffers of a CaptureService: one set per capture that can be in
// flight, whatever the number of VMs.
struct CopyPoolStats {
  size_t sets = 0;                // Sets of buffers (the workers).
  uint64_t bytes = 0;             // Held by the sets not out on a capture.
  CopySizes reserved;             // Each set's buffers hold this much.
  uint64_t grown_at_capture = 0;  // Copies that had to allocate (0: none did).
  nlohmann::json ToJson() const;
};

class CaptureService {
 public:
  // |formats| may be null (captures keep their raw copies, counted only).
  // |copy_buffers| sets of private copies may be in flight at once (the
  // workers).
  // |budget| null: no byte budgets and no reserve (free space is still
  // checked against the capture's need).
  CaptureService(std::shared_ptr<FormatsService> formats, size_t copy_buffers,
                 CaptureFaults faults = {}, std::shared_ptr<CaptureBudget> budget = nullptr);
  ~CaptureService();

  // Grows every set of copy buffers ahead of time to hold |sizes| (never
  // shrinks them), so a panic capture copies without allocating or faulting
  // in pages. The memory is sets × the largest regions, not one per VM.
  void Reserve(CopySizes sizes);
  CopyPoolStats copy_pool() const;

  // Steps 1–4 for one capture into |store|. Blocking: run it on a worker.
  Result<CaptureOutcome> Take(const CaptureStore& store, const CaptureRequest& request);

  struct RecoveryReport {
    std::vector<CaptureEntry> recovered;  // Committed now.
    std::vector<std::string> removed;     // Why each other directory went.
    std::vector<std::string> kept;        // Durable but not committable now (why).
  };
  // Finishes (steps 3–4) or removes every capture of |store| a previous run
  // left incomplete. Fails only when the directory cannot be listed.
  Result<RecoveryReport> Recover(const CaptureStore& store);

  FormatsService* formats() const { return formats_.get(); }

 private:
  struct CopyBuffers;
  class BufferLease;
  // Sets |*waited| when every set was out on another capture at the call.
  BufferLease AcquireBuffer(bool* waited);
  Status Build(const CaptureRequest& request, const std::filesystem::path& meta_dir,
               CopyBuffers& copies, PendingCapture& pending, CaptureManifest& manifest);

  std::shared_ptr<FormatsService> formats_;
  CaptureFaults faults_;
  std::shared_ptr<CaptureBudget> budget_;
  mutable std::mutex mu_;
  std::condition_variable free_cv_;
  size_t sets_ = 0;
  std::vector<std::unique_ptr<CopyBuffers>> free_buffers_;
  CopySizes reserved_;
  std::atomic<uint64_t> grown_at_capture_{0};
};

}  // namespace hvtrace::hostd

#endif  // HVTRACE_HOSTD_CAPTURE_SERVICE_H_
