#include "fd_passing.h"

#include <sys/socket.h>

#include <cerrno>
#include <cstring>

namespace hvtrace::hostd {
namespace {

// One SCM_RIGHTS message carrying |fds| in |control| (room for
// kMaxFdsPerRequest; callers check the count first).
void AttachFds(struct msghdr& msg, char* control, std::span<const int> fds) {
  msg.msg_control = control;
  msg.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
  struct cmsghdr* cmsg = CMSG_FIRSTHDR(&msg);
  cmsg->cmsg_level = SOL_SOCKET;
  cmsg->cmsg_type = SCM_RIGHTS;
  cmsg->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
  std::memcpy(CMSG_DATA(cmsg), fds.data(), sizeof(int) * fds.size());
}

}  // namespace

Status SendWithFds(int socket, std::string_view bytes, std::span<const int> fds) {
  if (fds.size() > kMaxFdsPerRequest) {
    return Error{"cannot pass " + std::to_string(fds.size()) +
                 " descriptors in one request (at most " + std::to_string(kMaxFdsPerRequest) + ")"};
  }
  alignas(struct cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFdsPerRequest)] = {};
  bool fds_sent = fds.empty();
  while (!bytes.empty()) {
    struct iovec iov = {const_cast<char*>(bytes.data()), bytes.size()};
    struct msghdr msg = {};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    if (!fds_sent) AttachFds(msg, control, fds);
    ssize_t n = ::sendmsg(socket, &msg, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Error{std::strerror(errno)};
    }
    fds_sent = true;
    bytes.remove_prefix(static_cast<size_t>(n));
  }
  return {};
}

ssize_t SendSomeWithFds(int socket, std::string_view bytes, std::span<const int> fds) {
  if (fds.size() > kMaxFdsPerRequest || bytes.empty()) {
    errno = EINVAL;
    return -1;
  }
  alignas(struct cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFdsPerRequest)] = {};
  struct iovec iov = {const_cast<char*>(bytes.data()), bytes.size()};
  struct msghdr msg = {};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  if (!fds.empty()) AttachFds(msg, control, fds);
  ssize_t n;
  do {
    n = ::sendmsg(socket, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
  } while (n < 0 && errno == EINTR);
  return n;
}

ssize_t RecvWithFds(int socket, std::span<char> buf, std::vector<SharedFd>& fds, bool* truncated) {
  // Room for more than we accept, so a peer sending too many is detected
  // (MSG_CTRUNC) rather than silently cut at our limit.
  alignas(struct cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFdsPerRequest * 2)];
  struct iovec iov = {buf.data(), buf.size()};
  struct msghdr msg = {};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  ssize_t n = ::recvmsg(socket, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
  if (n < 0) return n;
  *truncated = (msg.msg_flags & MSG_CTRUNC) != 0;
  size_t count = 0;
  for (struct cmsghdr* cmsg = CMSG_FIRSTHDR(&msg); cmsg != nullptr;
       cmsg = CMSG_NXTHDR(&msg, cmsg)) {
    if (cmsg->cmsg_level != SOL_SOCKET || cmsg->cmsg_type != SCM_RIGHTS) continue;
    const size_t k = (cmsg->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < k; ++i) {
      int fd;
      std::memcpy(&fd, CMSG_DATA(cmsg) + i * sizeof(int), sizeof fd);
      fds.push_back(std::make_shared<UniqueFd>(fd));
      ++count;
    }
  }
  if (count > kMaxFdsPerRequest) *truncated = true;
  return n;
}

}  // namespace hvtrace::hostd
