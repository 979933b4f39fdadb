#include "capture_store.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <memory>
#include <system_error>
#include <thread>

#include "bus_guard.h"
#include "durable_file.h"
#include "state_dir.h"
#include "unique_fd.h"

namespace hvtrace::hostd {
namespace {

using nlohmann::json;

std::string Errno(int err) { return std::strerror(err); }

json TimeJson(const HostTime& t) {
  return {{"realtime_ns", t.realtime_ns},
          {"monotonic_ns", t.monotonic_ns},
          {"utc", UtcStamp(t.realtime_ns)}};
}

// Writes |data| to a new |path|; fsyncs it unless |sync| is false (the
// caller then syncs it with others, SyncFiles).
Status WriteAll(const std::filesystem::path& path, std::span<const std::byte> data, int flags,
                bool sync = true) {
  UniqueFd fd(::open(path.c_str(), flags | O_WRONLY | O_CLOEXEC, 0640));
  if (fd.get() < 0) return Error{"cannot create " + path.string() + ": " + Errno(errno)};
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = ::write(fd.get(), data.data() + done, data.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Error{"writing " + path.string() + " at offset " + std::to_string(done) + " of " +
                   std::to_string(data.size()) + ": " + Errno(errno)};
    }
    if (n == 0) {
      return Error{"writing " + path.string() + " at offset " + std::to_string(done) +
                   ": write returned 0"};
    }
    done += static_cast<size_t>(n);
  }
  if (sync && ::fsync(fd.get()) != 0) {
    return Error{"fsync " + path.string() + ": " + Errno(errno)};
  }
  if (fd.Close() != 0) return Error{"closing " + path.string() + ": " + Errno(errno)};
  return {};
}

// A file of a capture is written under a hidden name (PartName) and renamed
// to its own only once whole and durable, so a name without a leading '.'
// is always a finished file: a crash or a full disk mid-write leaves a part
// file that Commit drops, never a short file listed in files[].
std::filesystem::path PartName(const std::filesystem::path& path) {
  return path.parent_path() / ("." + path.filename().string() + ".part");
}

// Renames |part| to |path|; on error removes |part|.
Status Publish(const std::filesystem::path& part, const std::filesystem::path& path) {
  if (::rename(part.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(part.c_str());
    return Error{"cannot rename " + part.string() + " to " + path.string() + ": " + Errno(err)};
  }
  return {};
}

// WriteAll into |path|'s part file (PartName), removed again when that
// fails. Errors name |path|, which must not exist yet.
Status WritePart(const std::filesystem::path& path, std::span<const std::byte> data, bool sync) {
  const std::filesystem::path part = PartName(path);
  struct stat st;
  if (::lstat(path.c_str(), &st) == 0) return Error{"cannot create " + path.string() + ": exists"};
  Status s = WriteAll(part, data, O_CREAT | O_EXCL, sync);
  if (s.ok()) return s;
  ::unlink(part.c_str());
  std::string message = s.error().message;
  const std::string part_text = part.string();
  if (size_t at = message.find(part_text); at != std::string::npos) {
    message.replace(at, part_text.size(), path.string());
  }
  return Error{message};
}

// WritePart, then Publish. Errors name |path|.
Status WriteFinished(const std::filesystem::path& path, std::span<const std::byte> data,
                     bool sync = true) {
  if (Status s = WritePart(path, data, sync); !s.ok()) return s;
  return Publish(PartName(path), path);
}

// Not a finished capture file: a hidden name (part files, the recovery
// record's aside copy) or a writer's temporary ("x.tmp.XXXXXX", the
// trace.dat writer's).
bool Unfinished(const std::string& name) {
  return name.empty() || name.front() == '.' || name.find(".tmp.") != std::string::npos;
}

// Reads exactly |out.size()| bytes at |offset| of |fd|; errors name |path|.
Status PreadFully(int fd, const std::filesystem::path& path, uint64_t offset,
                  std::span<std::byte> out) {
  uint64_t done = 0;
  while (done < out.size()) {
    ssize_t n =
        ::pread(fd, out.data() + done, out.size() - done, static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return Error{"reading region " + path.string() + " at offset " +
                   std::to_string(offset + done) + ": " + Errno(errno)};
    }
    if (n == 0) {
      return Error{"region " + path.string() + " shrank while copying, at offset " +
                   std::to_string(offset + done)};
    }
    done += static_cast<uint64_t>(n);
  }
  return {};
}

// Copies the bytes at |at| of the range [offset, offset + size) of |file|
// into |out|: through the file's kept mapping (see bus_guard.h for why and
// what a shrinking file does), or with pread where it could not be mapped.
Status CopyChunk(const RegionFile& file, const std::filesystem::path& path, uint64_t offset,
                 uint64_t size, uint64_t at, std::span<std::byte> out) {
  const std::span<const std::byte> mapped = file.mapped(offset, size);
  if (mapped.empty()) return PreadFully(file.fd(), path, offset + at, out);
  if (!GuardedCopy(out.data(), mapped.data() + at, out.size())) {
    return Error{"region " + path.string() + " shrank while copying, between offsets " +
                 std::to_string(offset + at) + " and " + std::to_string(offset + at + out.size())};
  }
  return {};
}

// This thread's CPU time so far, in ms.
double ThreadCpuMs() {
  struct timespec t;
  if (::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t) != 0) return 0;
  return static_cast<double>(t.tv_sec) * 1e3 + static_cast<double>(t.tv_nsec) / 1e6;
}

// Checks that |fd| holds |size| bytes at |offset|.
Status CheckRegionSize(int fd, const std::filesystem::path& path, uint64_t offset, uint64_t size) {
  struct stat st;
  if (::fstat(fd, &st) != 0) return Error{"fstat " + path.string() + ": " + Errno(errno)};
  uint64_t file_size = static_cast<uint64_t>(st.st_size);
  if (offset > file_size || size > file_size - offset) {
    return Error{"region " + path.string() + " is " + std::to_string(file_size) +
                 " bytes, shorter than offset " + std::to_string(offset) + " + size " +
                 std::to_string(size)};
  }
  return {};
}

Status PwriteFully(int fd, const std::filesystem::path& path, uint64_t offset,
                   std::span<const std::byte> data) {
  uint64_t done = 0;
  while (done < data.size()) {
    ssize_t n =
        ::pwrite(fd, data.data() + done, data.size() - done, static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      return Error{"writing " + path.string() + " at offset " + std::to_string(offset + done) +
                   ": " + (n < 0 ? Errno(errno) : std::string("write returned 0"))};
    }
    done += static_cast<uint64_t>(n);
  }
  return {};
}

bool AllZero(std::span<const std::byte> page) {
  // memcmp against the page's own first byte shifted by one: zero iff the
  // first byte is zero and every byte equals its neighbour.
  return page.empty() || (page[0] == std::byte{0} &&
                          std::memcmp(page.data(), page.data() + 1, page.size() - 1) == 0);
}

constexpr uint64_t kPage = 4096;

// Writes the non-zero pages of |chunk| (at |at| of the file) to |fd|, each
// run of them in one call, zero pages left as holes; starts their writeback
// (the final fdatasync waits for it). Adds the bytes written to |*written|.
Status WriteChunkPages(int fd, const std::filesystem::path& path, uint64_t at,
                       std::span<const std::byte> chunk, uint64_t* written) {
  const uint64_t len = chunk.size();
  uint64_t run = 0, run_len = 0;
  for (uint64_t p = 0; p <= len; p += kPage) {
    const bool zero = p == len || AllZero(chunk.subspan(p, std::min(kPage, len - p)));
    if (!zero) {
      if (run_len == 0) run = p;
      run_len += std::min(kPage, len - p);
      continue;
    }
    if (run_len == 0) continue;
    if (Status s = PwriteFully(fd, path, at + run, chunk.subspan(run, run_len)); !s.ok()) return s;
    *written += run_len;
    run_len = 0;
  }
  (void)::sync_file_range(fd, static_cast<off_t>(at), static_cast<off_t>(len),
                          SYNC_FILE_RANGE_WRITE);
  return {};
}

// The writing half of a region copy, on a thread of its own: it writes each
// chunk as soon as the copying thread has copied it, so the two overlap
// instead of taking turns (the copy 2.6-2.8 ms and the writes 1.7-2.6 ms of a
// 16 MiB boot range). bench/capture_latency.sh 5 against the commit before,
// alternately, 2026-12-04: region + recovery record durable 6.2-6.8 ->
// 5.4-5.6 ms median (6.12, 7.3; bench/README.md). Without a thread (none to
// be had) the copying thread writes each chunk itself.
class ChunkWriter {
 public:
  ChunkWriter(int fd, const std::filesystem::path& path, std::span<const std::byte> copy,
              uint64_t chunk)
      : fd_(fd), path_(path), copy_(copy), chunk_(chunk) {
    try {
      thread_ = std::thread([this] { Run(); });
    } catch (const std::system_error&) {
      // Written inline by Copied().
    }
  }
  ~ChunkWriter() { (void)Finish(/*abandon=*/true); }
  ChunkWriter(const ChunkWriter&) = delete;
  ChunkWriter& operator=(const ChunkWriter&) = delete;

  // Chunk |index| is in the copy: written now (no thread) or by the thread.
  // False once a write failed (Finish says which).
  bool Copied(uint64_t index) {
    if (!thread_.joinable()) return Write(index).ok();
    copied_.store(index + 1, std::memory_order_release);
    copied_.notify_one();
    return !failed_.load(std::memory_order_acquire);
  }
  // Waits for the writes (all copied chunks, or none more after a copy that
  // failed: |abandon|); the first write error, if any.
  Status Finish(bool abandon = false) {
    if (thread_.joinable()) {
      // Only this thread stores to copied_.
      const uint64_t copied = copied_.load(std::memory_order_relaxed);
      copied_.store(abandon ? kAbandoned : copied | kLast, std::memory_order_release);
      copied_.notify_one();
      thread_.join();
    }
    return status_;
  }
  double write_ms() const { return write_ms_; }
  uint64_t written() const { return written_; }

 private:
  static constexpr uint64_t kLast = uint64_t{1} << 62;  // No chunk after these.
  static constexpr uint64_t kAbandoned = uint64_t{1} << 63;

  void Run() {
    for (uint64_t index = 0;; ++index) {
      uint64_t have = copied_.load(std::memory_order_acquire);
      while (!(have & (kLast | kAbandoned)) && have <= index) {
        copied_.wait(have, std::memory_order_acquire);
        have = copied_.load(std::memory_order_acquire);
      }
      if ((have & kAbandoned) || index >= (have & ~kLast)) return;
      if (!Write(index).ok()) {
        failed_.store(true, std::memory_order_release);
        return;
      }
    }
  }
  Status Write(uint64_t index) {
    const auto t0 = std::chrono::steady_clock::now();
    const uint64_t at = index * chunk_;
    const auto bytes = copy_.subspan(at, std::min(chunk_, copy_.size() - at));
    Status s = WriteChunkPages(fd_, path_, at, bytes, &written_);
    write_ms_ += MsBetween(t0, std::chrono::steady_clock::now());
    if (!s.ok() && status_.ok()) status_ = s;
    return s;
  }
  const int fd_;
  const std::filesystem::path& path_;
  const std::span<const std::byte> copy_;
  const uint64_t chunk_;
  std::atomic<uint64_t> copied_{0};  // Chunks copied, with kLast or kAbandoned.
  std::atomic<bool> failed_{false};
  Status status_;  // The writer's until joined.
  double write_ms_ = 0;
  uint64_t written_ = 0;
  std::thread thread_;  // Last: started once the rest is set.
};

// fsyncs every file of |paths|. Files written with their sync left to a
// later step reach the disk here together: writeback is started on all of
// them first (ext4 allocates their blocks in the running journal
// transaction), so the first fsync commits one transaction holding all of
// them and the others find little left to do (one flush, where a flush per
// file cost 10-20 ms each on this machine; each of the three guest-log
// files, written and fsynced in turn, took 0.4-4.3 ms at a panic, 2026-12-05).
Status SyncEach(const std::vector<std::filesystem::path>& paths) {
  std::vector<UniqueFd> fds;
  fds.reserve(paths.size());
  for (const std::filesystem::path& path : paths) {
    UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
    if (fd.get() < 0) return Error{"cannot open " + path.string() + ": " + Errno(errno)};
    // Only a start: the fsync below makes the file durable.
    (void)::sync_file_range(fd.get(), 0, 0, SYNC_FILE_RANGE_WRITE);
    fds.push_back(std::move(fd));
  }
  for (size_t i = 0; i < fds.size(); ++i) {
    if (::fsync(fds[i].get()) != 0)
      return Error{"fsync " + paths[i].string() + ": " + Errno(errno)};
  }
  return {};
}

// fsyncs every file |names| in |dir| (SyncEach), then |dir|.
Status SyncFiles(const std::filesystem::path& dir, const std::vector<std::string>& names) {
  std::vector<std::filesystem::path> paths;
  paths.reserve(names.size());
  for (const std::string& name : names) paths.push_back(dir / name);
  if (Status s = SyncEach(paths); !s.ok()) return s;
  return FsyncDir(dir);
}

Status ValidateFileName(std::string_view name) {
  if (name.empty() || name.size() > 128 || name.front() == '.' ||
      name.find('/') != std::string_view::npos || name.find('\0') != std::string_view::npos) {
    return Error{"invalid capture file name '" + std::string(name) + "'"};
  }
  return {};
}

}  // namespace

json CaptureManifest::ToJson() const {
  json cpu_list = json::array();
  uint64_t events = 0, pages = 0, lost = 0, bad = 0;
  for (const auto& c : cpus) {
    uint64_t cpu_bad = 0;
    for (const auto& [reason, n] : c.bad_pages) cpu_bad += n;
    cpu_list.push_back({{"cpu", c.cpu},
                        {"events", c.events},
                        {"pages", c.pages},
                        {"lost_events", c.lost_events},
                        {"bad_pages", c.bad_pages},
                        {"bad_pages_total", cpu_bad}});
    if (c.lost_marked != 0) cpu_list.back()["lost_marked_pages"] = c.lost_marked;
    events += c.events;
    pages += c.pages;
    lost += c.lost_events;
    bad += cpu_bad;
  }
  json events_list = json::array();
  for (const auto& e : qmp_events) {
    events_list.push_back({{"event", e.event},
                           {"realtime_ns", e.time.realtime_ns},
                           {"monotonic_ns", e.time.monotonic_ns},
                           {"data", e.data}});
  }
  json doc = {
      {"format", "hvtrace-capture"},
      {"version", kManifestVersion},
      {"vm", vm},
      {"trigger", trigger},
      {"host_time", {{"triggered", TimeJson(triggered)}, {"completed", TimeJson(completed)}}},
      {"kernel", kernel},
      {"region", region},
      {"cpus", cpu_list},
      {"totals", {{"events", events}, {"pages", pages}, {"lost_events", lost}, {"bad_pages", bad}}},
      {"validation", validation},
      {"qmp_events", events_list},
      {"extra", extra}};
  if (!recovered.is_null()) doc["recovered"] = recovered;
  if (!crash.is_null()) doc["crash"] = crash;
  return doc;
}

Result<CaptureManifest> CaptureManifest::FromJson(const json& doc) {
  auto bad = [](const std::string& what) { return Error{"capture manifest: " + what}; };
  if (!doc.is_object()) return bad("not a JSON object");
  CaptureManifest m;
  auto str = [&](const char* key, std::string* out) -> Status {
    auto it = doc.find(key);
    if (it == doc.end() || !it->is_string()) return bad(std::string(key) + " is not a string");
    *out = it->get<std::string>();
    return {};
  };
  if (Status s = str("vm", &m.vm); !s.ok()) return s.error();
  if (Status s = str("trigger", &m.trigger); !s.ok()) return s.error();
  if (Status s = ValidateTrigger(m.trigger); !s.ok()) return bad(s.error().message);
  auto time_of = [](const json& t, HostTime* out) {
    if (!t.is_object() || !t.contains("realtime_ns") || !t.contains("monotonic_ns") ||
        !t["realtime_ns"].is_number_integer() || !t["monotonic_ns"].is_number_integer()) {
      return false;
    }
    out->realtime_ns = t["realtime_ns"].get<int64_t>();
    out->monotonic_ns = t["monotonic_ns"].get<int64_t>();
    return true;
  };
  const json* host_time = doc.contains("host_time") ? &doc["host_time"] : nullptr;
  if (host_time == nullptr || !host_time->is_object() || !host_time->contains("triggered") ||
      !time_of((*host_time)["triggered"], &m.triggered)) {
    return bad("host_time.triggered is missing or malformed");
  }
  for (auto [key, out] : {std::pair{"kernel", &m.kernel}, std::pair{"region", &m.region},
                          std::pair{"extra", &m.extra}}) {
    auto it = doc.find(key);
    if (it == doc.end()) continue;
    if (!it->is_object()) return bad(std::string(key) + " is not an object");
    *out = *it;
  }
  // The fields the capture steps read back with json::value(), which throws
  // on a value of another type.
  for (auto [obj, key] : {std::pair{&m.region, "kind"}, std::pair{&m.kernel, "path"},
                          std::pair{&m.kernel, "formats_key"}}) {
    if (obj->contains(key) && !(*obj)[key].is_string()) {
      return bad(std::string(obj == &m.region ? "region." : "kernel.") + key + " is not a string");
    }
  }
  if (auto it = doc.find("qmp_events"); it != doc.end()) {
    if (!it->is_array()) return bad("qmp_events is not an array");
    for (const json& e : *it) {
      RecordedEvent ev;
      if (!e.is_object() || !e.contains("event") || !e["event"].is_string() ||
          !time_of(e, &ev.time)) {
        return bad("a qmp_events entry is malformed");
      }
      ev.event = e["event"].get<std::string>();
      ev.data = e.value("data", json());
      m.qmp_events.push_back(std::move(ev));
    }
  }
  return m;
}

Status ValidateTrigger(std::string_view trigger) {
  bool ok = !trigger.empty() && trigger.size() <= 32 &&
            std::all_of(trigger.begin(), trigger.end(), [](char c) {
              return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-';
            });
  if (!ok) return Error{"invalid capture trigger '" + std::string(trigger.substr(0, 40)) + "'"};
  return {};
}

PendingCapture::PendingCapture(std::filesystem::path captures_dir, std::filesystem::path temp_dir,
                               std::string base_name)
    : captures_dir_(std::move(captures_dir)),
      temp_dir_(std::move(temp_dir)),
      base_name_(std::move(base_name)) {}

PendingCapture::~PendingCapture() {
  // A durable copy outlives whatever ended this capture early (an error, an
  // exception): the next start finishes it. Only Abandon removes it.
  if (!done_ && durable()) {
    done_ = true;
    kept_ = true;
    return;
  }
  Discard();
}

void PendingCapture::Abandon() { Discard(); }

void PendingCapture::Discard() {
  if (done_) return;
  done_ = true;
  std::error_code ec;
  std::filesystem::remove_all(temp_dir_, ec);
}

Status PendingCapture::WriteFile(std::string_view name, std::span<const std::byte> data) {
  if (done_) return Error{"capture in " + temp_dir_.string() + " is already finished"};
  if (Status s = ValidateFileName(name); !s.ok()) return s;
  return WriteFinished(temp_dir_ / std::string(name), data);
}

Status PendingCapture::WriteFiles(std::span<const NamedBytes> files) {
  if (done_) return Error{"capture in " + temp_dir_.string() + " is already finished"};
  std::vector<std::filesystem::path> paths, parts;
  struct DropParts {
    std::vector<std::filesystem::path>& parts;
    bool keep = false;
    ~DropParts() {
      if (!keep)
        for (const auto& part : parts) ::unlink(part.c_str());
    }
  } drop{parts};
  for (const NamedBytes& f : files) {
    if (Status s = ValidateFileName(f.name); !s.ok()) return s;
    paths.push_back(temp_dir_ / std::string(f.name));
    if (Status s = WritePart(paths.back(), f.data, /*sync=*/false); !s.ok()) return s;
    parts.push_back(PartName(paths.back()));
  }
  if (Status s = SyncEach(parts); !s.ok()) return s;
  drop.keep = true;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (Status s = Publish(parts[i], paths[i]); !s.ok()) {
      for (size_t j = i + 1; j < parts.size(); ++j) ::unlink(parts[j].c_str());
      return s;
    }
  }
  return {};
}

Status PendingCapture::WriteRecoveryRecord(const CaptureManifest& manifest) {
  if (Status s = StageRecoveryRecord(manifest); !s.ok()) return s;
  return PublishRecoveryRecord();
}

Status PendingCapture::StageRecoveryRecord(const CaptureManifest& manifest) {
  if (done_) return Error{"capture in " + temp_dir_.string() + " is already finished"};
  json record = {
      {"format", "hvtrace-capture-recovery"}, {"version", 1}, {"manifest", manifest.ToJson()}};
  const std::string text = record.dump(2, ' ', false, json::error_handler_t::replace) + "\n";
  // Whole or absent (read back by start-up recovery).
  return StageFileDurably(temp_dir_ / std::string(kRecoveryRecordName), text);
}

Status PendingCapture::PublishRecoveryRecord() {
  if (done_) return Error{"capture in " + temp_dir_.string() + " is already finished"};
  return PublishStagedFile(temp_dir_ / std::string(kRecoveryRecordName));
}

Result<PendingCapture::RegionCopyStats> PendingCapture::CopyRegion(
    std::string_view name, const RegionFile& file, const std::filesystem::path& source,
    uint64_t offset, uint64_t size, std::span<std::byte> copy) {
  // 1 MiB: large enough for few system calls, small enough that the disk
  // and the writing thread start early.
  constexpr uint64_t kChunk = 1u << 20;
  if (done_) return Error{"capture in " + temp_dir_.string() + " is already finished"};
  if (Status s = ValidateFileName(name); !s.ok()) return s.error();
  if (Status s = CheckRegionSize(file.fd(), source, offset, size); !s.ok()) return s.error();
  if (copy.size() != size) {
    return Error{"copy of region " + source.string() + ": a buffer of " +
                 std::to_string(copy.size()) + " bytes for " + std::to_string(size)};
  }
  // Errors name |path|; the bytes go to its part file until they are durable.
  const std::filesystem::path path = temp_dir_ / std::string(name);
  const std::filesystem::path part = PartName(path);
  struct stat existing;
  if (::lstat(path.c_str(), &existing) == 0) {
    return Error{"cannot create " + path.string() + ": exists"};
  }
  UniqueFd out(::open(part.c_str(), O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0640));
  if (out.get() < 0) return Error{"cannot create " + path.string() + ": " + Errno(errno)};
  struct RemovePart {
    const std::filesystem::path& part;
    bool keep = false;
    ~RemovePart() {
      if (!keep) ::unlink(part.c_str());
    }
  } remove_part{part};
  if (::ftruncate(out.get(), static_cast<off_t>(size)) != 0) {
    return Error{"cannot size " + path.string() + " to " + std::to_string(size) + ": " +
                 Errno(errno)};
  }
  RegionCopyStats stats;
  struct rusage before;
  ::getrusage(RUSAGE_THREAD, &before);
  ChunkWriter writer(out.get(), path, copy, kChunk);
  for (uint64_t at = 0; at < size; at += kChunk) {
    const auto t0 = std::chrono::steady_clock::now();
    const double cpu0 = ThreadCpuMs();
    std::span<std::byte> chunk(copy.data() + at, std::min(kChunk, size - at));
    if (Status s = CopyChunk(file, source, offset, size, at, chunk); !s.ok()) {
      (void)writer.Finish(/*abandon=*/true);
      return s.error();
    }
    stats.copy_cpu_ms += ThreadCpuMs() - cpu0;
    stats.copy_ms += MsBetween(t0, std::chrono::steady_clock::now());
    if (!writer.Copied(at / kChunk)) break;  // Finish says why.
  }
  struct rusage after;
  ::getrusage(RUSAGE_THREAD, &after);
  if (Status s = writer.Finish(); !s.ok()) return s.error();
  stats.write_ms = writer.write_ms();
  stats.bytes_written = writer.written();
  stats.copy_minor_faults = static_cast<uint64_t>(after.ru_minflt - before.ru_minflt);
  stats.involuntary_switches = static_cast<uint64_t>(after.ru_nivcsw - before.ru_nivcsw);
  const auto t3 = std::chrono::steady_clock::now();
  if (::fdatasync(out.get()) != 0) return Error{"fdatasync " + path.string() + ": " + Errno(errno)};
  if (out.Close() != 0) return Error{"closing " + path.string() + ": " + Errno(errno)};
  if (Status s = Publish(part, path); !s.ok()) return s.error();
  remove_part.keep = true;
  stats.sync_ms = MsBetween(t3, std::chrono::steady_clock::now());
  return stats;
}

bool PendingCapture::durable() const {
  struct stat st;
  return ::lstat((temp_dir_ / std::string(kRecoveryRecordName)).c_str(), &st) == 0 &&
         S_ISREG(st.st_mode);
}

Error PendingCapture::Fail(const std::string& message) {
  if (!durable()) {
    Discard();
    return Error{message};
  }
  // The raw copy and its recovery record are durable: they are worth more
  // than the error, so they stay for the next daemon start (Recover).
  ::unlink((temp_dir_ / std::string(kManifestName)).c_str());
  done_ = true;
  kept_ = true;
  return Error{message + "; the durable copy and its recovery record are kept in " +
               temp_dir_.string() + " (the next hvtraced start finishes the capture)"};
}

Result<CaptureEntry> PendingCapture::Commit(CaptureManifest manifest) {
  if (done_) return Error{"capture in " + temp_dir_.string() + " is already finished"};
  manifest.completed = HostTime::Now();
  json files = json::array();
  std::error_code ec;
  std::vector<std::pair<std::string, uint64_t>> listing;
  for (std::filesystem::directory_iterator it(temp_dir_, ec), end; !ec && it != end;
       it.increment(ec)) {
    const std::string name = it->path().filename().string();
    std::error_code type_ec;
    if (Unfinished(name) || !it->is_regular_file(type_ec) || it->is_symlink(type_ec)) {
      // Left by a writer that failed or died: never part of a capture.
      std::filesystem::remove_all(it->path(), type_ec);
      continue;
    }
    std::error_code size_ec;
    uint64_t bytes = it->file_size(size_ec);
    if (!size_ec) listing.emplace_back(name, bytes);
  }
  if (ec) return Fail("cannot list " + temp_dir_.string() + ": " + ec.message());
  std::sort(listing.begin(), listing.end());
  for (const auto& [name, bytes] : listing) {
    if (name != kManifestName && name != kRecoveryRecordName) {
      files.push_back({{"name", name}, {"bytes", bytes}});
    }
  }
  json doc = manifest.ToJson();
  doc["files"] = std::move(files);
  std::vector<std::string> synced_names;
  for (const auto& [name, bytes] : listing) {
    if (name != kManifestName) synced_names.push_back(name);
  }
  synced_names.emplace_back(kManifestName);

  // The name is chosen before the manifest is written so the manifest can
  // carry it; a concurrent capture of the same millisecond takes the next
  // suffix (RENAME_NOREPLACE settles the race).
  for (int attempt = 1; attempt <= 100; ++attempt) {
    std::string id = base_name_ + (attempt > 1 ? "-" + std::to_string(attempt) : "");
    std::filesystem::path final_dir = captures_dir_ / id;
    if (std::filesystem::exists(final_dir, ec)) continue;
    doc["id"] = id;
    std::string text = doc.dump(2, ' ', false, json::error_handler_t::replace) + "\n";
    std::filesystem::path manifest_path = temp_dir_ / std::string(kManifestName);
    ::unlink(manifest_path.c_str());  // An earlier attempt's.
    Status s = WriteFinished(manifest_path, std::as_bytes(std::span(text.data(), text.size())),
                             /*sync=*/false);
    // The manifest and every file it lists durable before the capture is
    // visible, in one flush.
    if (s.ok()) s = SyncFiles(temp_dir_, synced_names);
    if (!s.ok()) return Fail(s.error().message);
    if (::renameat2(AT_FDCWD, temp_dir_.c_str(), AT_FDCWD, final_dir.c_str(), RENAME_NOREPLACE) !=
        0) {
      int err = errno;
      if (err == EEXIST || err == ENOTEMPTY) continue;
      return Fail("cannot rename " + temp_dir_.string() + " to " + final_dir.string() + ": " +
                  Errno(err));
    }
    done_ = true;
    // The capture is visible now: its recovery record has served (a crash
    // before this unlink leaves it in a committed capture, where it is not
    // listed and harms nothing). A failed directory fsync only weakens
    // durability across a host crash, so it is reported, not undone.
    ::unlink((final_dir / std::string(kRecoveryRecordName)).c_str());
    Status synced = FsyncDir(captures_dir_);
    CaptureEntry entry{id, final_dir, SummarizeCapture(id, final_dir)};
    if (!synced.ok()) entry.summary["warning"] = synced.error().message;
    return entry;
  }
  return Fail("no free capture name for " + (captures_dir_ / base_name_).string());
}

Result<std::unique_ptr<PendingCapture>> CaptureStore::Begin(std::string_view trigger,
                                                            const HostTime& triggered) const {
  if (Status s = ValidateTrigger(trigger); !s.ok()) return s.error();
  if (Status s = MakeDirs(captures_dir_, 0750); !s.ok()) return s.error();
  std::string base = UtcStamp(triggered.realtime_ns) + "-" + std::string(trigger);
  std::string tmpl = (captures_dir_ / (".tmp-" + base + "-XXXXXX")).string();
  if (::mkdtemp(tmpl.data()) == nullptr) {
    return Error{"cannot create capture directory " + tmpl + ": " + Errno(errno)};
  }
  // Setgid kept: the capture's files take the state dir's group (the
  // observers', so `hvtrace show` works without root).
  ::chmod(tmpl.c_str(), 02750);
  return std::unique_ptr<PendingCapture>(new PendingCapture(captures_dir_, tmpl, base));
}

Result<size_t> CaptureStore::Prune(size_t keep) const {
  if (keep == 0) return size_t{0};
  auto entries = List();
  if (!entries.ok()) return entries.error();
  size_t removed = 0;
  for (size_t i = 0; i + keep < entries->size(); ++i) {
    std::error_code ec;
    std::filesystem::remove_all((*entries)[i].dir, ec);
    if (ec) return Error{"cannot remove " + (*entries)[i].dir.string() + ": " + ec.message()};
    ++removed;
  }
  return removed;
}

Result<std::vector<std::filesystem::path>> CaptureStore::ListIncomplete() const {
  std::vector<std::filesystem::path> found;
  std::error_code ec;
  std::filesystem::directory_iterator it(captures_dir_, ec);
  if (ec) {
    if (ec == std::errc::no_such_file_or_directory) return found;
    return Error{"cannot list " + captures_dir_.string() + ": " + ec.message()};
  }
  for (std::filesystem::directory_iterator end; it != end; it.increment(ec)) {
    std::error_code type_ec;
    if (it->path().filename().string().starts_with(".tmp-") && it->is_directory(type_ec) &&
        !it->is_symlink(type_ec)) {
      found.push_back(it->path());
    }
  }
  if (ec) return Error{"cannot list " + captures_dir_.string() + ": " + ec.message()};
  std::sort(found.begin(), found.end());
  return found;
}

Result<std::unique_ptr<PendingCapture>> CaptureStore::Resume(
    const std::filesystem::path& temp_dir) const {
  // ".tmp-<base>-XXXXXX" (mkdtemp's six characters), in this store.
  const std::string name = temp_dir.filename().string();
  if (temp_dir.parent_path() != captures_dir_ || !name.starts_with(".tmp-") ||
      name.size() < 5 + 1 + 7 || name[name.size() - 7] != '-') {
    return Error{temp_dir.string() + " is not an incomplete capture of " + captures_dir_.string()};
  }
  std::string base = name.substr(5, name.size() - 5 - 7);
  return std::unique_ptr<PendingCapture>(
      new PendingCapture(captures_dir_, temp_dir, std::move(base)));
}

Result<std::vector<std::byte>> CopyRegionFile(const std::filesystem::path& path, uint64_t offset,
                                              uint64_t size) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) return Error{"cannot open region " + path.string() + ": " + Errno(errno)};
  return CopyRegionFd(fd.get(), path, offset, size);
}

Result<std::vector<std::byte>> CopyRegionFd(int fd, const std::filesystem::path& path,
                                            uint64_t offset, uint64_t size) {
  if (Status s = CheckRegionSize(fd, path, offset, size); !s.ok()) return s.error();
  std::vector<std::byte> copy(size);
  if (Status s = PreadFully(fd, path, offset, copy); !s.ok()) return s.error();
  return copy;
}

}  // namespace hvtrace::hostd
