// Disk use of the captures: how many and how many bytes each VM and all VMs
// keep, and the free space a capture needs before it starts.
//
// A guest decides how often its cheap triggers fire (crashloaded, reset,
// guest-leaving, …),
// so limits are applied by class: a panic capture (panic, panic-while-away,
// crash) is never evicted to make room for a capture of a cheaper trigger.
// Victims, oldest first within each group:
//   1. this VM's non-panic captures
//   2. other VMs' non-panic captures (only for the total budget and the
//      free-space reserve: the disk is shared)
//   3. for a panic capture only: this VM's older panic captures (budgets and
//      count only; another VM's panic capture is never evicted)
// The capture being made is never a victim of its own admission or pruning.
// A capture whose fleet upload is not confirmed yet (SetUploadPending) is no
// victim of retention (Prune) nor of a cheaper capture's admission: it goes
// only when a panic capture's admission needs its space, after every other
// victim, and its upload is then reported lost (uploader.h). Once uploaded,
// it is a victim as before.
//
// Before a capture starts (Admit), its worst case (every region byte
// written twice: the raw copy and the decoded trace.dat, plus 1 MiB) must fit
// in the per-VM and total budgets and leave |free_reserve| bytes free on the
// filesystem. A non-panic capture that does not fit after evicting what it
// may is refused with an error naming the directory, the bytes free and the
// need; it never evicts for free space. A panic capture evicts older
// non-panic captures until its need and the reserve are free again, and then
// starts in any case (the reserve is there for it): should the disk still
// fill, the capture fails with an error naming the file, and a region.bin
// that was already durable is kept (capture_store.h Commit).
#ifndef HVTRACE_HOSTD_CAPTURE_BUDGET_H_
#define HVTRACE_HOSTD_CAPTURE_BUDGET_H_

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "capture_store.h"
#include "hvtrace/result.h"

namespace hvtrace::hostd {

// panic, panic-while-away and crash.
bool IsPanicTrigger(std::string_view trigger);

// The count per VM (capture_retention) comes with each request (Prune).
struct DiskLimits {
  uint64_t bytes_per_vm = 0;  // Bytes of captures per VM; 0: no limit.
  uint64_t bytes_total = 0;   // Bytes of captures of all VMs; 0: no limit.
  uint64_t free_reserve = 0;  // Bytes left free on the filesystem.
};

// Bytes a capture occupies on disk (allocated blocks: region.bin is sparse).
uint64_t CaptureDiskBytes(const std::filesystem::path& dir);

// Free bytes for an unprivileged writer (statvfs f_bavail) on the
// filesystem holding |path| or its nearest existing parent.
Result<uint64_t> FreeBytes(const std::filesystem::path& path);

// The worst case of a capture of |region_bytes| (see above).
uint64_t CaptureNeed(uint64_t region_bytes);

class CaptureBudget {
 public:
  // |vms_root|: the directory holding <vm>/captures for every VM (StateDir
  // root/vms); empty: each store is alone (its own total).
  CaptureBudget(DiskLimits limits, std::filesystem::path vms_root);

  DiskLimits limits() const {
    std::lock_guard lock(mu_);
    return limits_;
  }
  // New budgets (a config reload); admissions and prunes after it use them.
  void SetLimits(DiskLimits limits) {
    std::lock_guard lock(mu_);
    limits_ = limits;
  }

  // Whether the capture |id| of |vm| still waits for its fleet upload (see
  // above); empty: none does.
  using UploadPendingFn = std::function<bool(const std::string& vm, const std::string& id)>;
  void SetUploadPending(UploadPendingFn fn) {
    std::lock_guard lock(mu_);
    upload_pending_ = std::move(fn);
  }

  struct Admission {
    uint64_t need = 0;         // Worst case, bytes.
    uint64_t free_before = 0;  // On the filesystem, before evicting.
    uint64_t free_after = 0;
    bool reserve_met = true;           // Need + reserve free after evicting.
    std::vector<std::string> evicted;  // "<vm>/<id>", each removed.
    nlohmann::json ToJson() const;
  };
  // Makes room for a |trigger| capture of |region_bytes| into |store| of VM
  // |vm|, or says why it cannot start.
  Result<Admission> Admit(const CaptureStore& store, std::string_view vm, std::string_view trigger,
                          uint64_t region_bytes);

  // After |keep_id| (a |trigger| capture) was committed into |store|:
  // keeps at most |keep| captures of the VM (0: no count limit) and applies
  // the byte budgets with the captures' real sizes. Returns the "<vm>/<id>"
  // of each capture removed.
  Result<std::vector<std::string>> Prune(const CaptureStore& store, std::string_view vm,
                                         std::string_view trigger, std::string_view keep_id,
                                         size_t keep);

 private:
  struct Stored {
    std::string vm;
    std::string id;
    std::filesystem::path dir;
    bool panic = false;
    uint64_t bytes = 0;
    int64_t when = 0;  // Trigger time (realtime ns), for ordering VMs.
  };
  // Every committed capture of every VM (|store| as |vm| when there is no
  // root), oldest first per VM.
  Result<std::vector<Stored>> ListAll(const CaptureStore& store, std::string_view vm) const;
  // Victims in the order above; |others| adds other VMs' non-panic captures,
  // |panics| this VM's panic captures, |pinned| (a panic's admission) the
  // captures still waiting for their upload, last.
  std::vector<const Stored*> Victims(const std::vector<Stored>& all, std::string_view vm,
                                     std::string_view keep_id, bool others, bool panics,
                                     bool pinned) const;

  // What ListAll read of each committed capture, per captures directory, so
  // that an admission (before a panic's copy starts) reads only the captures
  // that are new since the last listing: with 2-3 captures stored, reading
  // every manifest again took 0.2-0.75 ms of the panic's start
  // (bench/capture_latency.sh, 2026-12-04), and grows with the store.
  struct Known {
    uint64_t inode = 0;  // CaptureDirent: the same id and inode, the same capture.
    bool panic = false;
    int64_t order = 0;  // ListingOrder.
    uint64_t bytes = 0;
  };
  mutable std::map<std::filesystem::path, std::map<std::string, Known>> known_;  // Guarded by mu_.
  DiskLimits limits_;                                                            // Guarded by mu_.
  UploadPendingFn upload_pending_;                                               // Guarded by mu_.
  const std::filesystem::path vms_root_;
  mutable std::mutex mu_;  // One admission or pruning at a time: each sees the last.
};

}  // namespace hvtrace::hostd

#endif  // HVTRACE_HOSTD_CAPTURE_BUDGET_H_
