#include "capture_fetch.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>
#include <vector>

#include "command.h"
#include "config.h"
#include "control_client.h"
#include "daemon_call.h"
#include "replies.h"
#include "requests.h"
#include "unique_fd.h"

namespace hvtrace::cli {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

bool PlainName(const std::string& part) {
  return !part.empty() && part.size() < 256 && part[0] != '.' &&
         part.find('/') == std::string::npos && part.find('\0') == std::string::npos;
}

std::string User() { return "uid " + std::to_string(::geteuid()); }

struct ReceivedFile {
  std::string name;
  uint64_t bytes = 0;
  hostd::SharedFd fd;
};

bool IsRawRegion(const std::string& name) {
  return name == "region.bin" || name == "region.attach";
}

// Copies the data of |in| (|bytes| long) into the new file |name| in
// |dir_fd|, keeping holes (a region copy is mostly zeros, stored sparse).
Status CopyFile(const ReceivedFile& file, int dir_fd) {
  hostd::UniqueFd out(::openat(dir_fd, file.name.c_str(),
                               O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
  if (out.get() < 0) return Error{"cannot create " + file.name + ": " + std::strerror(errno)};
  const int in = file.fd->get();
  const off_t size = static_cast<off_t>(file.bytes);
  if (::ftruncate(out.get(), size) != 0) {
    return Error{"cannot size " + file.name + ": " + std::strerror(errno)};
  }
  std::vector<char> buf(1 << 20);
  off_t pos = 0;
  while (pos < size) {
    off_t data = ::lseek(in, pos, SEEK_DATA);
    if (data < 0 && errno == ENXIO) break;  // Only a hole is left.
    if (data < 0) data = pos;               // No SEEK_DATA here: copy it all.
    off_t hole = ::lseek(in, data, SEEK_HOLE);
    if (hole < 0 || hole > size) hole = size;
    for (off_t at = data; at < hole;) {
      const size_t want = static_cast<size_t>(std::min<off_t>(hole - at, buf.size()));
      const ssize_t n = ::pread(in, buf.data(), want, at);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return Error{"reading " + file.name + ": " + std::strerror(errno)};
      if (n == 0) return Error{file.name + " shrank while copied"};
      for (ssize_t done = 0; done < n;) {
        const ssize_t w =
            ::pwrite(out.get(), buf.data() + done, static_cast<size_t>(n - done), at + done);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0) return Error{"writing the copy of " + file.name + ": " + std::strerror(errno)};
        done += w;
      }
      at += n;
    }
    pos = hole;
  }
  if (out.Close() != 0)
    return Error{"writing the copy of " + file.name + ": " + std::strerror(errno)};
  return {};
}

// Receives the capture's descriptors: one per stream item {file, bytes}.
// Names come from the daemon's directory listing; they are checked anyway,
// since they become file names here.
int ReceiveFiles(const std::string& reference, const std::string& socket_flag,
                 std::vector<ReceivedFile>* files, hostd::CaptureFilesReply* end) {
  hostd::CaptureFilesRequest request;
  const size_t slash = reference.find('/');
  if (slash == std::string::npos) {
    request.capture = reference;
  } else {
    request.name = reference.substr(0, slash);
    request.capture = reference.substr(slash + 1);
  }
  auto client = hostd::ControlClient::Connect(hostd::ResolveClientSocket(socket_flag),
                                              std::chrono::seconds(5));
  if (!client.ok()) {
    std::fprintf(stderr, "hvtrace show: capture %s, as %s: %s\n", reference.c_str(), User().c_str(),
                 client.error().message.c_str());
    return client.error().message.starts_with("permission denied on ") ? kExitDenied
                                                                       : kExitNoDaemon;
  }
  auto on_item = [files](const json& item, std::vector<hostd::SharedFd> fds) -> Status {
    auto file = hostd::ParseMessage<hostd::CaptureFileItem>(item, "item");
    if (!file.ok() || !PlainName(file->file) || fds.size() != 1) {
      return Error{"hvtraced sent a malformed capture file item: " + hostd::DumpJson(item) +
                   (file.ok() ? std::string() : " (" + file.error().message + ")")};
    }
    files->push_back({file->file, file->bytes, std::move(fds[0])});
    return {};
  };
  auto reply = client->CallForFiles(request.kCommand, hostd::MessageToJson(request),
                                    std::chrono::seconds(60), on_item);
  if (!reply.ok()) {
    std::fprintf(stderr, "hvtrace show: capture %s: %s\n", reference.c_str(),
                 reply.error().message.c_str());
    return kExitNoDaemon;
  }
  if (!reply->ok) {
    std::fprintf(stderr, "hvtrace show: capture %s, as %s: %s\n", reference.c_str(), User().c_str(),
                 reply->error.c_str());
    return ExitCodeForDaemonError(reply->code);
  }
  return ParseReply("show", reply->result, end);
}

}  // namespace

bool IsCaptureReference(const std::string& arg) {
  struct stat st;
  if (::lstat(arg.c_str(), &st) == 0 || errno != ENOENT) return false;
  const size_t slash = arg.find('/');
  if (slash == std::string::npos) return PlainName(arg);
  return PlainName(arg.substr(0, slash)) && PlainName(arg.substr(slash + 1));
}

std::string CaptureReferenceHint(const fs::path& path) {
  const fs::path id = path.filename();
  const fs::path captures = path.parent_path();
  const fs::path vm = captures.parent_path();
  if (captures.filename() != "captures" || vm.parent_path().filename() != "vms" ||
      !PlainName(id.string()) || !PlainName(vm.filename().string())) {
    return "";
  }
  return "; read it through hvtraced instead: `hvtrace show " + vm.filename().string() + "/" +
         id.string() + "`";
}

FetchedCapture::~FetchedCapture() {
  if (root_.empty()) return;
  std::error_code ec;
  fs::remove_all(root_, ec);
}

int FetchCapture(const std::string& reference, const std::string& socket_flag,
                 FetchedCapture* out) {
  std::vector<ReceivedFile> files;
  hostd::CaptureFilesReply end;
  if (int rc = ReceiveFiles(reference, socket_flag, &files, &end); rc != kExitOk) return rc;
  const std::string& vm = end.vm;
  const std::string& id = end.capture;
  if (!PlainName(vm) || !PlainName(id)) {
    std::fprintf(stderr, "hvtrace show: capture %s: hvtraced's reply names no capture: %s\n",
                 reference.c_str(), hostd::DumpJson(hostd::MessageToJson(end)).c_str());
    return kExitFailed;
  }
  out->name_ = vm + "/" + id;
  const char* tmp = std::getenv("TMPDIR");
  std::string templ =
      std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/hvtrace-capture-XXXXXX";
  if (::mkdtemp(templ.data()) == nullptr) {  // Mode 0700: this user's only.
    std::fprintf(stderr, "hvtrace show: capture %s: mkdtemp %s: %s\n", out->name_.c_str(),
                 templ.c_str(), std::strerror(errno));
    return kExitFailed;
  }
  out->root_ = templ;
  out->dir_ = out->root_ / id;
  hostd::UniqueFd dir_fd;
  if (::mkdir(out->dir_.c_str(), 0700) == 0) {
    dir_fd = hostd::UniqueFd(::open(out->dir_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  }
  if (dir_fd.get() < 0) {
    std::fprintf(stderr, "hvtrace show: capture %s: cannot make %s: %s\n", out->name_.c_str(),
                 out->dir_.c_str(), std::strerror(errno));
    return kExitFailed;
  }
  bool decoded = false;
  for (const ReceivedFile& f : files) decoded |= f.name.ends_with(".trace.dat");
  for (const ReceivedFile& f : files) {
    if (decoded && IsRawRegion(f.name)) continue;
    if (Status s = CopyFile(f, dir_fd.get()); !s.ok()) {
      std::fprintf(stderr, "hvtrace show: capture %s: %s\n", out->name_.c_str(),
                   s.error().message.c_str());
      return kExitFailed;
    }
  }
  return kExitOk;
}

}  // namespace hvtrace::cli
