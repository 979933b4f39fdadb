#include "durable_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "unique_fd.h"

namespace hvtrace::hostd {
namespace {

namespace fs = std::filesystem;

std::string Why(int err) { return std::strerror(err); }

// All of |data| to |fd|; the error says where it stopped.
Status WriteWhole(int fd, std::string_view data, const fs::path& path) {
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      return Error{"cannot write " + path.string() + " at offset " + std::to_string(done) + " of " +
                   std::to_string(data.size()) + ": " +
                   (n == 0 ? std::string("write returned 0") : Why(errno))};
    }
    done += static_cast<size_t>(n);
  }
  return {};
}

fs::path StagedName(const fs::path& path) {
  return path.parent_path() / ("." + path.filename().string() + ".tmp");
}

}  // namespace

Status FsyncDir(const fs::path& dir) {
  UniqueFd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (fd.get() < 0 || ::fsync(fd.get()) != 0) {
    return Error{"fsync of directory " + dir.string() + ": " + Why(errno)};
  }
  return {};
}

Status StageFileDurably(const fs::path& path, std::string_view data, mode_t mode) {
  const fs::path tmp = StagedName(path);
  UniqueFd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, mode));
  if (fd.get() < 0) return Error{"cannot create " + tmp.string() + ": " + Why(errno)};
  Status written = WriteWhole(fd.get(), data, path);
  if (written.ok() && ::fsync(fd.get()) != 0) {
    written = Error{"fsync " + tmp.string() + " for " + path.string() + ": " + Why(errno)};
  }
  if (written.ok() && fd.Close() != 0) {
    written = Error{"closing " + tmp.string() + " for " + path.string() + ": " + Why(errno)};
  }
  if (!written.ok()) ::unlink(tmp.c_str());
  return written;
}

Status PublishStagedFile(const fs::path& path) {
  const fs::path tmp = StagedName(path);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    return Error{"cannot rename " + tmp.string() + " to " + path.string() + ": " + Why(err)};
  }
  return FsyncDir(path.parent_path());
}

Status WriteFileDurably(const fs::path& path, std::string_view data, mode_t mode) {
  if (Status s = StageFileDurably(path, data, mode); !s.ok()) return s;
  return PublishStagedFile(path);
}

}  // namespace hvtrace::hostd
