// A store's listing: its committed captures' directories and the summary of
// each one's manifest (capture_store.h).
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>

#include "capture_store.h"
#include "unique_fd.h"

namespace hvtrace::hostd {
namespace {

using nlohmann::json;

constexpr size_t kMaxManifestBytes = 16 * 1024 * 1024;

Result<std::string> ReadSmallFile(const std::filesystem::path& path, size_t max) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) return Error{"cannot open " + path.string() + ": " + std::strerror(errno)};
  std::string text;
  char buf[65536];
  for (;;) {
    ssize_t n = ::read(fd.get(), buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Error{"reading " + path.string() + ": " + std::strerror(errno)};
    }
    if (n == 0) break;
    if (text.size() + static_cast<size_t>(n) > max) {
      return Error{path.string() + " is larger than " + std::to_string(max) + " bytes"};
    }
    text.append(buf, static_cast<size_t>(n));
  }
  return text;
}

}  // namespace

// The manifest is ours, but a disk or a person may have damaged it, so every
// member is checked before use.
json SummarizeCapture(const std::string& id, const std::filesystem::path& dir) {
  json summary = {{"id", id}, {"path", dir.string()}};
  auto text = ReadSmallFile(dir / std::string(kManifestName), kMaxManifestBytes);
  if (!text.ok()) {
    summary["error"] = text.error().message;
    return summary;
  }
  json doc = json::parse(*text, nullptr, false);
  if (doc.is_discarded() || !doc.is_object()) {
    summary["error"] = (dir / std::string(kManifestName)).string() + " is not a JSON object";
    return summary;
  }
  for (const char* key : {"vm", "trigger", "totals", "files", "kernel", "recovered"}) {
    if (auto it = doc.find(key); it != doc.end()) summary[key] = *it;
  }
  if (auto ht = doc.find("host_time"); ht != doc.end() && ht->is_object()) {
    if (auto tr = ht->find("triggered"); tr != ht->end()) summary["triggered"] = *tr;
  }
  // Only the crash's kind and reason: a listing stays small.
  if (auto crash = doc.find("crash"); crash != doc.end() && crash->is_object()) {
    json brief = json::object();
    for (const char* key : {"kind", "reason"}) {
      if (auto it = crash->find(key); it != crash->end() && it->is_string()) brief[key] = *it;
    }
    summary["crash"] = std::move(brief);
  }
  return summary;
}

int64_t ListingOrder(const json& summary) {
  const auto t = summary.find("triggered");
  if (t == summary.end() || !t->is_object()) return INT64_MAX;
  const auto ns = t->find("realtime_ns");
  return ns != t->end() && ns->is_number_integer() ? ns->get<int64_t>() : INT64_MAX;
}

Result<std::vector<CaptureEntry>> CaptureStore::List() const {
  Result<std::vector<CaptureDirent>> dirents = ListDirents();
  if (!dirents.ok()) return dirents.error();
  // Names sort by millisecond; within one millisecond (or when a clock was
  // set back) the manifest's trigger time decides, so the order is the order
  // of the triggers.
  std::vector<std::pair<int64_t, CaptureEntry>> keyed;
  for (CaptureDirent& d : *dirents) {
    json summary = SummarizeCapture(d.id, d.dir);
    const int64_t order = ListingOrder(summary);
    keyed.emplace_back(order, CaptureEntry{std::move(d.id), std::move(d.dir), std::move(summary)});
  }
  std::sort(keyed.begin(), keyed.end(), [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first < b.first : a.second.id < b.second.id;
  });
  std::vector<CaptureEntry> entries;
  for (auto& [order, e] : keyed) entries.push_back(std::move(e));
  return entries;
}

Result<std::vector<CaptureDirent>> CaptureStore::ListDirents() const {
  std::vector<CaptureDirent> found;
  std::unique_ptr<DIR, int (*)(DIR*)> dir(::opendir(captures_dir_.c_str()), ::closedir);
  if (!dir) {
    if (errno == ENOENT) return found;
    return Error{"cannot list " + captures_dir_.string() + ": " + std::strerror(errno)};
  }
  for (;;) {
    errno = 0;
    const dirent* e = ::readdir(dir.get());
    if (e == nullptr) {
      if (errno != 0)
        return Error{"cannot list " + captures_dir_.string() + ": " + std::strerror(errno)};
      return found;
    }
    const std::string name = e->d_name;
    if (name.empty() || name.front() == '.') continue;
    uint64_t inode = e->d_ino;
    if (e->d_type != DT_DIR) {
      // A link, or a filesystem that does not say: what it names (listings
      // have always followed links).
      if (e->d_type != DT_LNK && e->d_type != DT_UNKNOWN) continue;
      struct stat st;
      if (::fstatat(::dirfd(dir.get()), e->d_name, &st, 0) != 0 || !S_ISDIR(st.st_mode)) continue;
      inode = st.st_ino;
    }
    found.push_back({name, captures_dir_ / name, inode});
  }
}

}  // namespace hvtrace::hostd
