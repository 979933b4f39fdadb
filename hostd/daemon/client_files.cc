#include "client_files.h"

#include <fcntl.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "daemon.h"
#include "unique_fd.h"

namespace hvtrace::hostd {

Result<uint64_t> CheckClientFile(int fd, const std::string& what, uint64_t max_bytes) {
  struct stat st;
  if (::fstat(fd, &st) != 0) return Error{what + ": fstat: " + std::strerror(errno)};
  // Not a FIFO, socket or device: reading those can block a worker forever
  // or read something that is no file at all.
  if (!S_ISREG(st.st_mode)) return Error{what + " is not a regular file"};
  // O_PATH needs no read permission on the file (only search on its
  // directory), so an O_PATH descriptor proves nothing: refused.
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags < 0 || (flags & O_PATH) != 0 || (flags & O_ACCMODE) == O_WRONLY) {
    return Error{what + ": the descriptor passed is not open for reading"};
  }
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size > max_bytes) {
    return Error{what + " is " + std::to_string(size) + " bytes; hvtraced takes at most " +
                 std::to_string(max_bytes)};
  }
  return size;
}

Status CopyClientFile(int fd, const std::string& what, const std::filesystem::path& dest,
                      uint64_t max_bytes) {
  if (::unlink(dest.c_str()) != 0 && errno != ENOENT) {
    return Error{"cannot remove the old " + dest.string() + ": " + std::strerror(errno)};
  }
  UniqueFd out(::open(dest.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
  if (out.get() < 0) return Error{"cannot create " + dest.string() + ": " + std::strerror(errno)};
  off_t offset = 0;  // pread-like: the client's file offset is not moved.
  uint64_t copied = 0;
  for (;;) {
    const uint64_t want = max_bytes + 1 - copied;
    if (want == 0) {
      ::unlink(dest.c_str());
      return Error{what + " grew past " + std::to_string(max_bytes) + " bytes while copied"};
    }
    ssize_t n = ::sendfile(out.get(), fd, &offset, std::min<uint64_t>(want, 1u << 30));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      ::unlink(dest.c_str());
      return Error{"copying " + what + " to " + dest.string() + ": " + std::strerror(err)};
    }
    if (n == 0) break;
    copied += static_cast<uint64_t>(n);
  }
  if (::fsync(out.get()) != 0 || out.Close() != 0) {
    ::unlink(dest.c_str());
    return Error{"writing " + dest.string() + ": " + std::strerror(errno)};
  }
  return {};
}

Result<uid_t> UnixSocketPeerUid(const std::string& path) {
  struct sockaddr_un addr {};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof addr.sun_path) return Error{"socket path " + path + " is too long"};
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (fd.get() < 0) return Error{std::string("socket(): ") + std::strerror(errno)};
  // Non-blocking: a full backlog is an error, never a wait.
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    return Error{"cannot connect to " + path + ": " + std::strerror(errno)};
  }
  struct ucred cred;
  socklen_t len = sizeof cred;
  if (::getsockopt(fd.get(), SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
    return Error{"cannot read the peer of " + path + ": " + std::strerror(errno)};
  }
  return cred.uid;
}

Result<SharedFd> Daemon::RequestFile(const Request& request, const std::string& key,
                                     uint64_t max_bytes, bool required) const {
  auto name = request.args.find(key);
  const std::string what =
      key + (name != request.args.end() && name->is_string() ? " " + name->get<std::string>()
                                                             : std::string());
  auto index = request.args.find(key + "_fd");
  if (index == request.args.end() || index->is_null()) {
    if (!required && (name == request.args.end() || name->is_null() ||
                      (name->is_string() && name->get<std::string>().empty()))) {
      return SharedFd();
    }
    return Error{request.cmd + ": " + what + " must come as an open file descriptor (args." + key +
                 "_fd): hvtraced never opens a path a client names (`hvtrace " + request.cmd +
                 "` opens it as you and passes it)"};
  }
  if (!index->is_number_unsigned() || index->get<uint64_t>() >= request.fds.size()) {
    return Error{request.cmd + ": args." + key + "_fd names descriptor " + index->dump() +
                 " but the request carries " + std::to_string(request.fds.size())};
  }
  SharedFd fd = request.fds[index->get<size_t>()];
  if (auto size = CheckClientFile(fd->get(), request.cmd + ": " + what, max_bytes); !size.ok()) {
    return size.error();
  }
  return fd;
}

}  // namespace hvtrace::hostd
