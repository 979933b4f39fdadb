#include "upload_queue.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "capped_file.h"
#include "durable_file.h"
#include "unique_fd.h"

namespace hvtrace::hostd {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr uint64_t kMaxEntryBytes = 1 << 20;

}  // namespace

json UploadEntry::ToJson() const {
  json objs = json::array();
  for (const UploadObject& o : objects) {
    objs.push_back({{"file", o.file},
                    {"key", o.key},
                    {"compress", o.compress},
                    {"done", o.done},
                    {"etag", o.etag},
                    {"upload_id", o.upload_id}});
  }
  return {{"format", "hvtrace-upload"},
          {"version", 1},
          {"vm", ref.vm},
          {"id", ref.id},
          {"host", ref.host},
          {"prefix", prefix},
          {"dir", dir.string()},
          {"queued_ns", queued_ns},
          {"objects", std::move(objs)},
          {"attempts", attempts},
          {"last_error", last_error},
          {"last_attempt_ns", last_attempt_ns}};
}

Result<UploadEntry> UploadEntry::FromJson(const json& doc, std::string_view origin) {
  auto bad = [&](const std::string& why) {
    return Error{"upload queue entry " + std::string(origin) + ": " + why};
  };
  try {
    if (!doc.is_object() || doc.value("format", "") != "hvtrace-upload") return bad("not an entry");
    if (doc.value("version", 0) != 1) return bad("unknown version");
    UploadEntry e;
    e.ref.vm = doc.at("vm").get<std::string>();
    e.ref.id = doc.at("id").get<std::string>();
    e.ref.host = doc.at("host").get<std::string>();
    e.prefix = doc.at("prefix").get<std::string>();
    e.dir = doc.at("dir").get<std::string>();
    e.queued_ns = doc.at("queued_ns").get<int64_t>();
    e.attempts = doc.value("attempts", uint64_t{0});
    e.last_error = doc.value("last_error", "");
    e.last_attempt_ns = doc.value("last_attempt_ns", int64_t{0});
    for (const json& o : doc.at("objects")) {
      UploadObject obj;
      obj.file = o.at("file").get<std::string>();
      obj.key = o.at("key").get<std::string>();
      obj.compress = o.at("compress").get<bool>();
      obj.done = o.at("done").get<bool>();
      obj.etag = o.value("etag", "");
      obj.upload_id = o.value("upload_id", "");
      // Files are names in the capture directory, never paths.
      if (obj.file.empty() || obj.file.find('/') != std::string::npos || obj.file[0] == '.') {
        return bad("object file '" + obj.file + "' is not a file name");
      }
      e.objects.push_back(std::move(obj));
    }
    if (e.ref.vm.empty() || e.ref.id.empty() || e.ref.vm.find('/') != std::string::npos ||
        e.ref.id.find('/') != std::string::npos || e.ref.vm[0] == '.' || e.ref.id[0] == '.') {
      return bad("vm or id is not a name");
    }
    return e;
  } catch (const std::exception& ex) {
    return bad(ex.what());
  }
}

fs::path UploadQueueDir::EntryPath(std::string_view vm, std::string_view id) const {
  return root_ / std::string(vm) / (std::string(id) + ".json");
}

bool UploadQueueDir::Pending(std::string_view vm, std::string_view id) const {
  std::error_code ec;
  return fs::exists(EntryPath(vm, id), ec);
}

fs::path UploadQueueDir::ScratchPath(std::string_view vm, std::string_view id,
                                     std::string_view name) const {
  return root_ / std::string(vm) / (std::string(id) + "." + std::string(name) + ".part");
}

Status UploadQueueDir::Save(const UploadEntry& entry) const {
  const fs::path path = EntryPath(entry.ref.vm, entry.ref.id);
  std::error_code ec;
  const bool made = fs::create_directories(path.parent_path(), ec);
  if (ec) return Error{"cannot create " + path.parent_path().string() + ": " + ec.message()};
  if (made) {
    fs::permissions(path.parent_path(), fs::perms::owner_all, ec);
    if (Status s = FsyncDir(root_); !s.ok()) return s;
  }
  return WriteFileDurably(path, entry.ToJson().dump(1), 0600);
}

Status UploadQueueDir::MarkUploaded(std::string_view vm, std::string_view id) const {
  return WriteFileDurably(EntryPath(vm, id).replace_extension(".uploaded"), "", 0600);
}

bool UploadQueueDir::Uploaded(std::string_view vm, std::string_view id) const {
  std::error_code ec;
  return fs::exists(EntryPath(vm, id).replace_extension(".uploaded"), ec);
}

Status UploadQueueDir::Remove(std::string_view vm, std::string_view id) const {
  const fs::path path = EntryPath(vm, id);
  std::error_code ec;
  // Scratch files first: the entry is what says the upload is unfinished.
  for (const auto& e : fs::directory_iterator(path.parent_path(), ec)) {
    const std::string name = e.path().filename().string();
    if (name.starts_with(std::string(id) + ".") && name.ends_with(".part"))
      fs::remove(e.path(), ec);
  }
  if (!fs::remove(path, ec) && ec)
    return Error{"cannot remove " + path.string() + ": " + ec.message()};
  return FsyncDir(path.parent_path());
}

Result<std::vector<UploadEntry>> UploadQueueDir::Scan(std::vector<std::string>* bad) const {
  std::vector<UploadEntry> out;
  std::error_code ec;
  if (!fs::exists(root_, ec)) return out;
  for (const auto& vm_dir : fs::directory_iterator(root_, ec)) {
    if (!vm_dir.is_directory()) continue;
    for (const auto& f : fs::directory_iterator(vm_dir.path(), ec)) {
      const fs::path p = f.path();
      if (p.extension() != ".json") continue;
      auto fail = [&](const std::string& why) {
        if (bad != nullptr) bad->push_back(p.string() + ": " + why);
      };
      Result<std::string> text = ReadCappedFile(p, kMaxEntryBytes);
      if (!text.ok()) {
        fail(text.error().message);
        continue;
      }
      json doc = json::parse(*text, nullptr, false);
      if (doc.is_discarded()) {
        fail("not JSON");
        continue;
      }
      auto entry = UploadEntry::FromJson(doc, p.string());
      if (!entry.ok()) {
        fail(entry.error().message);
        continue;
      }
      out.push_back(std::move(*entry));
    }
  }
  if (ec) return Error{"cannot list " + root_.string() + ": " + ec.message()};
  std::sort(out.begin(), out.end(), [](const UploadEntry& a, const UploadEntry& b) {
    return a.queued_ns != b.queued_ns ? a.queued_ns < b.queued_ns : a.ref.id < b.ref.id;
  });
  return out;
}

}  // namespace hvtrace::hostd
