// hvtraced's fleet upload (docs/fleet.md): every committed capture goes to an
// S3 bucket, from a persistent queue (upload_queue.h), on one thread of its
// own at a lower CPU priority, so an upload never delays a capture: Enqueue
// writes the capture's queue entry durably (a few ms: the manifest read, one
// small file and two fsyncs, on the committing worker) and wakes the thread,
// which does the rest. A capture counts as committed once its entry is
// durable; one whose entry a crash prevented is found by Start's scan of the
// capture directories: a committed capture with neither an entry nor a
// marker that the store confirmed it (UploadQueueDir::MarkUploaded) is queued
// again.
//
// Per capture: manifest.json, the trace.dat files, the region files
// compressed (zstd), then the index object twice (fleet_keys.h), the listing
// copy last; each object's ETag is checked and recorded in the entry before
// the next starts, and a multipart upload's id is recorded before its first
// part, so a restart resumes where the last run stopped and aborts the
// multipart upload it left. The entry goes only when all is confirmed.
//
// Failures (the store down, wrong credentials, a missing bucket) keep the
// capture local and queued: the thread waits (upload_retry_min doubling up to
// upload_retry_max) and tries again, oldest capture first (a store error
// ends the round, a local one skips only its capture); the last error is
// logged once per change and shown by `hvtrace ping` (Stats). A local
// failure (a file of the capture that cannot be read) is retried
// |local_attempts| times, then the capture is given up: its entry goes, the
// capture stays on disk, and ping and the log say which file and why.
#ifndef HVTRACE_HOSTD_FLEET_UPLOADER_H_
#define HVTRACE_HOSTD_FLEET_UPLOADER_H_

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <filesystem>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <thread>

#include "hvtrace/result.h"
#include "s3_client.h"
#include "upload_queue.h"
#include "upload_stats.h"

namespace hvtrace::hostd {

struct UploaderOptions {
  S3Config s3;                       // Endpoint, bucket, region, keys.
  std::string prefix;                // NormalizePrefix'd.
  std::string host;                  // FleetHostName() outside tests.
  std::filesystem::path queue_root;  // <state_dir>/upload-queue.
  // <state_dir>/vms (vms/VM/captures/ID): Start's scan for committed
  // captures without an entry; empty: no scan.
  std::filesystem::path vms_root;
  int local_attempts = 5;  // A capture's own (not the store's) failures before it is given up.
  std::chrono::milliseconds retry_min{1000};
  std::chrono::milliseconds retry_max{60000};
};

// The queue entry of the capture |ref| committed in |dir|: its manifest,
// then the files the manifest lists (decoded ones before the raw regions),
// each with its key (fleet_keys.h). Errors name the manifest.
Result<UploadEntry> MakeUploadEntry(const FleetCaptureRef& ref, const std::string& prefix,
                                    const std::filesystem::path& dir, int64_t queued_ns);

class Uploader {
 public:
  explicit Uploader(UploaderOptions options);
  ~Uploader();  // Stop().
  Uploader(const Uploader&) = delete;
  Uploader& operator=(const Uploader&) = delete;

  // Scans the queue directory (entries an earlier run left), queues the
  // committed captures the store has not confirmed and that have no entry
  // (a crash between the commit and the entry), and starts the thread.
  // Fails only when the queue directory cannot be made.
  Status Start();
  // Ends the thread; a transfer in flight is cancelled (its entry stays).
  void Stop();

  // Queues the capture |id| of |vm| committed in |dir|: its entry is durable
  // when this returns ok. Thread-safe; call it from a worker, not the I/O
  // thread. An error names the capture (it stays local; the next start's
  // scan queues it again).
  Status Enqueue(const std::string& vm, const std::string& id, const std::filesystem::path& dir);
  // Whether the capture's upload is not confirmed yet (queued in memory or
  // on disk): retention keeps it (capture_budget.h).
  bool Pending(const std::string& vm, const std::string& id) const;
  // Retry now instead of at the end of the current wait.
  void Kick();

  // {"enabled", "endpoint", "bucket", "prefix", "pending", "uploaded",
  //  "failed_attempts", "lost", "given_up", "last_error", "last_error_at", "last_uploaded",
  //  "captures": [{"vm", "id", "state": pending | error | uploaded | lost,
  //                "attempts", "objects_done", "objects", "last_error"}]}
  // (state "given-up": a local failure |local_attempts| times.)
  UploadStats Stats() const;

 private:
  void Loop();
  // Start's scan: entries for committed captures that have none and are not
  // confirmed in the store. Returns how many were queued.
  size_t RequeueUnconfirmed();
  // Uploads what is left of |entry|; removes it when done.
  Status Process(UploadEntry& entry);
  Status UploadObject(UploadEntry& entry, size_t index);
  void RecordFailure(UploadEntry& entry, const std::string& error);
  void RecordDone(const UploadEntry& entry);
  // A local failure for the |local_attempts|-th time: the entry goes.
  void GiveUp(const UploadEntry& entry, const std::string& error);
  void Wait(std::chrono::milliseconds delay);

  UploaderOptions options_;
  UploadQueueDir queue_;
  std::unique_ptr<S3Client> s3_;  // The thread's only.
  std::thread thread_;
  std::atomic<bool> stop_{false};

  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool kicked_ = false;
  std::set<std::string> pending_;                     // "vm/id": in memory or on disk.
  std::map<std::string, UploadCaptureState> states_;  // "vm/id" → its row in Stats.
  std::deque<std::string> recently_uploaded_;
  uint64_t uploaded_ = 0;
  uint64_t failed_attempts_ = 0;
  uint64_t lost_ = 0;
  uint64_t given_up_ = 0;
  std::string last_error_;
  std::string last_error_at_;
  std::string last_uploaded_;
  std::string logged_error_;  // Thread only: log an error once per change.
};

}  // namespace hvtrace::hostd

#endif  // HVTRACE_HOSTD_FLEET_UPLOADER_H_
