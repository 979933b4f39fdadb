#include "log_rotation.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include "unique_fd.h"

namespace hvtrace::hostd {
namespace {

namespace fs = std::filesystem;

std::string Errno(int err) { return std::strerror(err); }

fs::path Numbered(const fs::path& path, int n) { return path.string() + "." + std::to_string(n); }

// Copies [offset, end) of |in| into a new file |out| (written aside, then
// renamed over it).
Status CopyTail(int in, const fs::path& source, uint64_t offset, uint64_t end,
                const fs::path& out) {
  const fs::path aside = out.string() + ".new";
  ::unlink(aside.c_str());
  UniqueFd fd(::open(aside.c_str(), O_CREAT | O_EXCL | O_WRONLY | O_NOFOLLOW | O_CLOEXEC, 0640));
  if (fd.get() < 0) return Error{"cannot create " + aside.string() + ": " + Errno(errno)};
  std::vector<char> buf(1 << 16);
  auto fail = [&](const std::string& what) {
    ::unlink(aside.c_str());
    return Error{what};
  };
  for (uint64_t at = offset; at < end;) {
    const size_t want = static_cast<size_t>(std::min<uint64_t>(buf.size(), end - at));
    ssize_t n = ::pread(in, buf.data(), want, static_cast<off_t>(at));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return fail("reading " + source.string() + ": " + Errno(errno));
    if (n == 0) break;  // Truncated meanwhile.
    for (ssize_t done = 0; done < n;) {
      ssize_t w = ::write(fd.get(), buf.data() + done, static_cast<size_t>(n - done));
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) return fail("writing " + aside.string() + ": " + Errno(errno));
      done += w;
    }
    at += static_cast<uint64_t>(n);
  }
  if (fd.Close() != 0) return fail("closing " + aside.string() + ": " + Errno(errno));
  if (::rename(aside.c_str(), out.c_str()) != 0) {
    return fail("cannot rename " + aside.string() + " to " + out.string() + ": " + Errno(errno));
  }
  return {};
}

}  // namespace

Result<bool> RotateLogIfLarger(const fs::path& path, uint64_t max_bytes, int files) {
  UniqueFd fd(::open(path.c_str(), O_RDWR | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
  if (fd.get() < 0) {
    if (errno == ENOENT) return false;
    return Error{"cannot open log " + path.string() + ": " + Errno(errno)};
  }
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return Error{"fstat " + path.string() + ": " + Errno(errno)};
  if (!S_ISREG(st.st_mode)) return Error{"log " + path.string() + " is not a regular file"};
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size <= max_bytes) return false;
  if (files > 1) {
    ::unlink(Numbered(path, files - 1).c_str());
    for (int n = files - 2; n >= 1; --n) {
      // A missing older copy is fine.
      if (::rename(Numbered(path, n).c_str(), Numbered(path, n + 1).c_str()) != 0 &&
          errno != ENOENT) {
        return Error{"cannot rename " + Numbered(path, n).string() + ": " + Errno(errno)};
      }
    }
    if (Status s = CopyTail(fd.get(), path, size - max_bytes, size, Numbered(path, 1)); !s.ok()) {
      // Still truncate: the cap matters more than the old lines.
      if (::ftruncate(fd.get(), 0) != 0) {
        return Error{s.error().message + "; truncating " + path.string() + ": " + Errno(errno)};
      }
      return s.error();
    }
  }
  if (::ftruncate(fd.get(), 0) != 0) {
    return Error{"truncating " + path.string() + ": " + Errno(errno)};
  }
  return true;
}

}  // namespace hvtrace::hostd
