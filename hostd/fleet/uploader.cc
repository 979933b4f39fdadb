#include "uploader.h"

#include <pthread.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>

#include "capture_index.h"
#include "daemon_log.h"
#include "host_time.h"
#include "zstd_file.h"

namespace hvtrace::hostd {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

UploadCaptureState UploadRow(std::string vm, std::string id, std::string state, uint64_t attempts,
                             std::string last_error) {
  UploadCaptureState row;
  row.vm = std::move(vm);
  row.id = std::move(id);
  row.state = std::move(state);
  row.attempts = attempts;
  row.last_error = std::move(last_error);
  return row;
}

std::string NameOf(const std::string& vm, const std::string& id) { return vm + "/" + id; }

// Order in the store: the manifest first, then what decodes, then the raw
// regions (the largest); the index objects come after all of them.
int Rank(const std::string& file) {
  if (file == "manifest.json") return 0;
  if (file.ends_with(".trace.dat") || file.ends_with(".dat")) return 1;
  if (CompressedInStore(file)) return 3;
  return 2;
}

}  // namespace

Uploader::Uploader(UploaderOptions options)
    : options_(std::move(options)), queue_(options_.queue_root) {
  options_.s3.cancelled = [this] { return stop_.load(); };
}

Uploader::~Uploader() { Stop(); }

Status Uploader::Start() {
  std::error_code ec;
  fs::create_directories(queue_.root(), ec);
  if (ec) return Error{"upload queue " + queue_.root().string() + ": " + ec.message()};
  fs::permissions(queue_.root(), fs::perms::owner_all, ec);
  std::vector<std::string> bad;
  auto entries = queue_.Scan(&bad);
  if (!entries.ok()) return entries.error();
  for (const std::string& b : bad) LogErr("upload queue: " + b + " (left in place)");
  {
    std::lock_guard lock(mu_);
    for (const UploadEntry& e : *entries) {
      pending_.insert(NameOf(e.ref.vm, e.ref.id));
      states_[NameOf(e.ref.vm, e.ref.id)] = UploadRow(
          e.ref.vm, e.ref.id, e.last_error.empty() ? "pending" : "error", e.attempts, e.last_error);
    }
  }
  if (!entries->empty()) {
    LogNotice("upload: " + std::to_string(entries->size()) +
              " capture(s) queued by an earlier run resume");
  }
  if (size_t requeued = RequeueUnconfirmed(); requeued != 0) {
    LogNotice("upload: " + std::to_string(requeued) +
              " committed capture(s) had no queue entry and are not confirmed in the store "
              "(an earlier run stopped between the commit and the entry): queued");
  }
  s3_ = std::make_unique<S3Client>(options_.s3);
  thread_ = std::thread([this] { Loop(); });
  return {};
}

void Uploader::Stop() {
  stop_ = true;
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

Status Uploader::Enqueue(const std::string& vm, const std::string& id, const fs::path& dir) {
  const std::string name = NameOf(vm, id);
  {
    std::lock_guard lock(mu_);
    if (pending_.count(name) != 0) return {};
  }
  auto entry =
      MakeUploadEntry({options_.host, vm, id}, options_.prefix, dir, HostTime::Now().realtime_ns);
  Status saved = entry.ok() ? queue_.Save(*entry) : Status(entry.error());
  std::lock_guard lock(mu_);
  if (!saved.ok()) {
    // Nothing durable records it: the next start's scan queues it again.
    const std::string error = "capture " + name + " cannot be queued: " + saved.error().message;
    states_[name] = UploadRow(vm, id, "error", 0, saved.error().message);
    last_error_ = error;
    last_error_at_ = UtcStamp(HostTime::Now().realtime_ns);
    return Error{error};
  }
  pending_.insert(name);
  states_[name] = UploadRow(vm, id, "pending", 0, "");
  kicked_ = true;
  cv_.notify_all();
  return {};
}

size_t Uploader::RequeueUnconfirmed() {
  if (options_.vms_root.empty()) return 0;
  size_t queued = 0;
  std::error_code ec;
  for (const auto& vm_dir : fs::directory_iterator(options_.vms_root, ec)) {
    const std::string vm = vm_dir.path().filename().string();
    std::error_code cec;
    for (const auto& capture : fs::directory_iterator(vm_dir.path() / "captures", cec)) {
      const std::string id = capture.path().filename().string();
      // Hidden: a capture still being written or recovered (capture_store.h).
      if (id.empty() || id[0] == '.' || !capture.is_directory(cec)) continue;
      if (!fs::exists(capture.path() / "manifest.json", cec)) continue;
      if (queue_.Pending(vm, id) || queue_.Uploaded(vm, id)) continue;
      if (Status s = Enqueue(vm, id, capture.path()); !s.ok()) {
        LogErr("upload: " + s.error().message);
        continue;
      }
      ++queued;
    }
  }
  return queued;
}

bool Uploader::Pending(const std::string& vm, const std::string& id) const {
  {
    std::lock_guard lock(mu_);
    if (pending_.count(NameOf(vm, id)) != 0) return true;
  }
  return queue_.Pending(vm, id);
}

void Uploader::Kick() {
  {
    std::lock_guard lock(mu_);
    kicked_ = true;
  }
  cv_.notify_all();
}

UploadStats Uploader::Stats() const {
  std::lock_guard lock(mu_);
  UploadStats stats;
  stats.enabled = true;
  stats.endpoint = options_.s3.endpoint;
  stats.bucket = options_.s3.bucket;
  stats.prefix = options_.prefix;
  stats.host = options_.host;
  for (const auto& [name, row] : states_) {
    stats.captures.push_back(row);
    stats.pending += row.state == "pending" || row.state == "error";
  }
  stats.uploaded = uploaded_;
  stats.failed_attempts = failed_attempts_;
  stats.lost = lost_;
  stats.given_up = given_up_;
  stats.last_error = last_error_;
  stats.last_error_at = last_error_at_;
  stats.last_uploaded = last_uploaded_;
  return stats;
}

Result<UploadEntry> MakeUploadEntry(const FleetCaptureRef& ref, const std::string& prefix,
                                    const fs::path& dir, int64_t queued_ns) {
  UploadEntry e;
  e.ref = ref;
  e.prefix = prefix;
  e.dir = dir;
  e.queued_ns = queued_ns;
  auto manifest = ReadManifest(dir);
  if (!manifest.ok()) return manifest.error();
  std::vector<std::string> files = {"manifest.json"};
  for (const json& f : manifest->value("files", json::array())) {
    if (!f.is_object() || !f.contains("name") || !f["name"].is_string()) continue;
    const std::string name = f["name"];
    if (name.empty() || name.find('/') != std::string::npos || name[0] == '.') continue;
    if (name != "manifest.json") files.push_back(name);
  }
  std::stable_sort(files.begin(), files.end(),
                   [](const std::string& a, const std::string& b) { return Rank(a) < Rank(b); });
  const std::string base = CaptureKeyPrefix(e.prefix, e.ref);
  for (const std::string& f : files) {
    e.objects.push_back({f, base + ObjectNameOf(f), CompressedInStore(f), false, "", ""});
  }
  return e;
}

void Uploader::Wait(std::chrono::milliseconds delay) {
  std::unique_lock lock(mu_);
  cv_.wait_for(lock, delay, [this] { return stop_.load() || kicked_; });
  kicked_ = false;
}

void Uploader::Loop() {
  // Uploads are background work: below the capture workers and QEMU.
  ::setpriority(PRIO_PROCESS, static_cast<id_t>(::syscall(SYS_gettid)), 10);
  // Named, so its CPU shows apart in /proc/PID/task (bench/upload.sh).
  ::pthread_setname_np(::pthread_self(), "hvt-upload");
  std::chrono::milliseconds backoff = options_.retry_min;
  while (!stop_) {
    std::vector<std::string> bad;
    auto entries = queue_.Scan(&bad);
    bool failed = false;
    if (!entries.ok()) {
      LogErr("upload: " + entries.error().message);
      failed = true;
    } else {
      for (UploadEntry& e : *entries) {
        if (stop_) break;
        Status s = Process(e);
        if (!s.ok()) {
          RecordFailure(e, s.error().message);
          failed = true;
          // The store failing (its errors start "S3 ") fails the others too:
          // wait. A local problem (an unreadable file) is this capture's own:
          // the next ones go on, and after |local_attempts| it is given up.
          if (s.error().message.starts_with("S3 ")) break;
          if (!stop_ && e.attempts >= static_cast<uint64_t>(options_.local_attempts))
            GiveUp(e, s.error().message);
        }
      }
    }
    if (stop_) break;
    if (failed) {
      Wait(backoff);
      backoff = std::min(backoff * 2, options_.retry_max);
    } else {
      backoff = options_.retry_min;
      Wait(std::chrono::hours(1));
    }
  }
}

Status Uploader::UploadObject(UploadEntry& e, size_t i) {
  hostd::UploadObject& obj = e.objects[i];
  if (!obj.upload_id.empty()) {
    // A multipart upload an earlier attempt left: gone before we start over.
    if (Status s = s3_->AbortMultipart(obj.key, obj.upload_id); !s.ok()) return s;
    obj.upload_id.clear();
    if (Status s = queue_.Save(e); !s.ok()) return s;
  }
  fs::path source = e.dir / obj.file;
  fs::path scratch;
  if (obj.compress) {
    scratch = queue_.ScratchPath(e.ref.vm, e.ref.id, obj.file + ".zst");
    if (Status s = CompressFile(source, scratch); !s.ok()) return s;
    source = scratch;
  }
  auto etag = s3_->PutFile(obj.key, source, [&](const std::string& upload_id) {
    obj.upload_id = upload_id;
    (void)queue_.Save(e);  // Best effort: a failed save only loses the abort.
  });
  std::error_code ec;
  if (!scratch.empty()) fs::remove(scratch, ec);
  if (!etag.ok()) {
    obj.upload_id.clear();  // PutFile aborted it.
    return etag.error();
  }
  obj.upload_id.clear();
  obj.done = true;
  obj.etag = *etag;
  return queue_.Save(e);
}

Status Uploader::Process(UploadEntry& e) {
  std::error_code ec;
  if (!fs::exists(e.dir / "manifest.json", ec)) {
    // Retention had to evict it for a panic's space (capture_budget.h).
    LogErr("upload: capture " + NameOf(e.ref.vm, e.ref.id) + " (" + e.dir.string() +
           ") was removed locally before its upload was confirmed; dropped from the queue");
    {
      std::lock_guard lock(mu_);
      ++lost_;
      pending_.erase(NameOf(e.ref.vm, e.ref.id));
      states_[NameOf(e.ref.vm, e.ref.id)] =
          UploadRow(e.ref.vm, e.ref.id, "lost", e.attempts, "removed locally before upload");
    }
    return queue_.Remove(e.ref.vm, e.ref.id);
  }
  for (size_t i = 0; i < e.objects.size(); ++i) {
    if (stop_) return Error{"stopping"};
    if (e.objects[i].done) continue;
    if (Status s = UploadObject(e, i); !s.ok()) return s;
    std::lock_guard lock(mu_);
    auto& row = states_[NameOf(e.ref.vm, e.ref.id)];
    row.objects_done = i + 1;
    row.objects = e.objects.size();
  }
  auto index = BuildCaptureIndex(e.dir, e.ref);
  if (!index.ok()) return index.error();
  const std::string text = index->dump(1);
  const auto bytes = std::as_bytes(std::span(text));
  auto etag = s3_->PutBytes(CaptureKeyPrefix(e.prefix, e.ref) + "index.json", bytes);
  if (!etag.ok()) return etag.error();
  // The listing copy last: present means complete.
  etag = s3_->PutBytes(IndexListKey(e.prefix, e.ref), bytes);
  if (!etag.ok()) return etag.error();
  // Confirmed: the marker first, so no start-up scan queues it again.
  if (Status s = queue_.MarkUploaded(e.ref.vm, e.ref.id); !s.ok()) return s;
  if (Status s = queue_.Remove(e.ref.vm, e.ref.id); !s.ok()) return s;
  RecordDone(e);
  return {};
}

void Uploader::RecordFailure(UploadEntry& e, const std::string& error) {
  if (stop_) return;  // A cancelled transfer is no failure.
  ++e.attempts;
  e.last_error = error;
  e.last_attempt_ns = HostTime::Now().realtime_ns;
  (void)queue_.Save(e);
  {
    std::lock_guard lock(mu_);
    ++failed_attempts_;
    last_error_ = "capture " + NameOf(e.ref.vm, e.ref.id) + ": " + error;
    last_error_at_ = UtcStamp(e.last_attempt_ns);
    auto& row = states_[NameOf(e.ref.vm, e.ref.id)];
    row = UploadRow(e.ref.vm, e.ref.id, "error", e.attempts, error);
  }
  if (error != logged_error_) {
    LogWarning("upload: capture " + NameOf(e.ref.vm, e.ref.id) +
               " stays local and queued: " + error);
    logged_error_ = error;
  }
}

void Uploader::GiveUp(const UploadEntry& e, const std::string& error) {
  const std::string name = NameOf(e.ref.vm, e.ref.id);
  const std::string why = "capture " + name + " (" + e.dir.string() + "): upload given up after " +
                          std::to_string(e.attempts) + " attempts: " + error +
                          "; the capture stays local, not in the store";
  LogErr("upload: " + why);
  // The marker too: a restart must not queue it again (nothing changed).
  Status marked = queue_.MarkUploaded(e.ref.vm, e.ref.id);
  Status removed = queue_.Remove(e.ref.vm, e.ref.id);
  if (!marked.ok() || !removed.ok()) {
    LogErr("upload: capture " + name +
           ": cannot drop its queue entry: " + (marked.ok() ? removed : marked).error().message);
  }
  std::lock_guard lock(mu_);
  ++given_up_;
  pending_.erase(name);
  last_error_ = why;
  last_error_at_ = UtcStamp(HostTime::Now().realtime_ns);
  states_[name] = UploadRow(e.ref.vm, e.ref.id, "given-up", e.attempts, error);
}

void Uploader::RecordDone(const UploadEntry& e) {
  const std::string name = NameOf(e.ref.vm, e.ref.id);
  LogNotice("upload: capture " + name + " uploaded to " + options_.s3.endpoint + "/" +
            options_.s3.bucket + "/" + CaptureKeyPrefix(e.prefix, e.ref) + " (" +
            std::to_string(e.objects.size() + 2) + " objects)");
  logged_error_.clear();
  std::lock_guard lock(mu_);
  ++uploaded_;
  last_uploaded_ = name;
  pending_.erase(name);
  states_[name] = UploadRow(e.ref.vm, e.ref.id, "uploaded", e.attempts + 1, "");
  // Keep the last few uploaded rows; pending and failed ones stay.
  recently_uploaded_.push_back(name);
  if (recently_uploaded_.size() > 20) {
    states_.erase(recently_uploaded_.front());
    recently_uploaded_.pop_front();
  }
}

}  // namespace hvtrace::hostd
