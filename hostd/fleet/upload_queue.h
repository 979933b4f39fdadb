// The persistent upload queue: one JSON file per committed capture still to
// upload, <state_dir>/upload-queue/<vm>/<capture-id>.json, written atomically
// (a temp file, fsync, rename, fsync of the directory), so a daemon restart or
// a crash finds every capture that is not confirmed in the store, and how far
// its upload got:
//
//   {"format": "hvtrace-upload", "version": 1, "vm", "id", "host", "prefix",
//    "dir" (the capture directory), "queued_ns",
//    "objects": [{"file": "region.bin", "key": "…/region.bin.zst",
//                 "compress": true, "done": false, "etag": "",
//                 "upload_id": ""  (a multipart upload in flight: aborted
//                                   before the object is sent again)}],
//    "attempts", "last_error", "last_attempt_ns"}
//
// An entry is removed only after every object, the index last, is confirmed
// (ETag checked). The entry itself is the state: there is no other record.
#ifndef HVTRACE_HOSTD_FLEET_UPLOAD_QUEUE_H_
#define HVTRACE_HOSTD_FLEET_UPLOAD_QUEUE_H_

#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "fleet_keys.h"
#include "hvtrace/result.h"

namespace hvtrace::hostd {

struct UploadObject {
  std::string file;  // In the capture directory; "" for the index objects.
  std::string key;
  bool compress = false;
  bool done = false;
  std::string etag;
  std::string upload_id;
};

struct UploadEntry {
  FleetCaptureRef ref;
  std::string prefix;
  std::filesystem::path dir;
  int64_t queued_ns = 0;
  std::vector<UploadObject> objects;  // Index objects are not listed: they come last.
  uint64_t attempts = 0;
  std::string last_error;
  int64_t last_attempt_ns = 0;

  nlohmann::json ToJson() const;
  // The file is ours but on disk: every member is checked; |origin| names it.
  static Result<UploadEntry> FromJson(const nlohmann::json& doc, std::string_view origin);
};

class UploadQueueDir {
 public:
  // |root|: <state_dir>/upload-queue.
  explicit UploadQueueDir(std::filesystem::path root) : root_(std::move(root)) {}
  const std::filesystem::path& root() const { return root_; }

  std::filesystem::path EntryPath(std::string_view vm, std::string_view id) const;
  // Whether the capture has an entry: its upload is not confirmed yet.
  bool Pending(std::string_view vm, std::string_view id) const;

  // Writes |entry| atomically and durably (see above).
  Status Save(const UploadEntry& entry) const;
  // Removes the entry (and its scratch files), durably.
  Status Remove(std::string_view vm, std::string_view id) const;
  // Every entry, oldest queued first; unreadable ones are listed in |bad|
  // ("path: why") and left in place for an operator.
  Result<std::vector<UploadEntry>> Scan(std::vector<std::string>* bad = nullptr) const;

  // The store confirmed every object of the capture: a durable marker
  // (<vm>/<id>.uploaded, empty) written before the entry is removed, so a
  // start-up scan tells a confirmed capture from one whose entry a crash
  // never wrote.
  Status MarkUploaded(std::string_view vm, std::string_view id) const;
  bool Uploaded(std::string_view vm, std::string_view id) const;

  // A scratch file for the entry (a compressed object before its PUT).
  std::filesystem::path ScratchPath(std::string_view vm, std::string_view id,
                                    std::string_view name) const;

 private:
  std::filesystem::path root_;
};

}  // namespace hvtrace::hostd

#endif  // HVTRACE_HOSTD_FLEET_UPLOAD_QUEUE_H_
