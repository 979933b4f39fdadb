#include "control_client.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>
#include <vector>

#include "fd_passing.h"

namespace hvtrace::hostd {
namespace {

using Clock = std::chrono::steady_clock;

int RemainingMs(Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  return left.count() < 0 ? 0 : static_cast<int>(left.count());
}

}  // namespace

Result<ControlClient> ControlClient::Connect(const std::filesystem::path& socket,
                                             std::chrono::milliseconds timeout) {
  struct sockaddr_un addr {};
  addr.sun_family = AF_UNIX;
  const std::string& path = socket.native();
  if (path.size() >= sizeof addr.sun_path) {
    return Error{"socket path " + path + " is too long for a Unix socket"};
  }
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  auto deadline = Clock::now() + timeout;
  for (;;) {
    int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return Error{std::string("socket(): ") + std::strerror(errno)};
    if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) {
      return ControlClient(fd, socket);
    }
    int err = errno;
    ::close(fd);
    // EAGAIN: the listen backlog is full; worth a retry until the deadline.
    if (err == EAGAIN && Clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      continue;
    }
    switch (err) {
      case ENOENT:
        return Error{"hvtraced is not running: no socket at " + path +
                     " (start hvtraced, or pass --socket / set HVTRACE_SOCKET)"};
      case ECONNREFUSED:
        return Error{"nothing listens on " + path + " (hvtraced stopped; stale socket?)"};
      case EACCES:
      case EPERM:
        return Error{"permission denied on " + path +
                     " (run as root or as a member of the socket group)"};
      default:
        return Error{"cannot connect to " + path + ": " + std::strerror(err)};
    }
  }
}

ControlClient::ControlClient(int fd, std::filesystem::path socket)
    : fd_(fd), socket_(std::move(socket)) {}

ControlClient::ControlClient(ControlClient&& other) noexcept
    : fd_(other.fd_),
      socket_(std::move(other.socket_)),
      framer_(std::move(other.framer_)),
      lines_(std::move(other.lines_)),
      pending_fds_(std::move(other.pending_fds_)),
      next_id_(other.next_id_) {
  other.fd_ = -1;
}

ControlClient& ControlClient::operator=(ControlClient&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = other.fd_;
    other.fd_ = -1;
    socket_ = std::move(other.socket_);
    framer_ = std::move(other.framer_);
    lines_ = std::move(other.lines_);
    pending_fds_ = std::move(other.pending_fds_);
    next_id_ = other.next_id_;
  }
  return *this;
}

ControlClient::~ControlClient() {
  if (fd_ >= 0) ::close(fd_);
}

Status ControlClient::SendRaw(std::string_view bytes) {
  while (!bytes.empty()) {
    ssize_t n = ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Error{"sending to " + socket_.string() + ": " + std::strerror(errno)};
    }
    bytes.remove_prefix(static_cast<size_t>(n));
  }
  return {};
}

Result<std::string> ControlClient::ReadLine(Clock::time_point deadline) {
  std::vector<char> buf(65536);
  for (;;) {
    while (!lines_.empty()) {
      Frame frame = std::move(lines_.front());
      lines_.pop_front();
      if (!frame.within_limit) {
        return Error{"reply from " + socket_.string() + " exceeds " +
                     std::to_string(kMaxReplyBytes) + " bytes"};
      }
      if (!IsBlankLine(frame.text)) return std::move(frame.text);
    }
    struct pollfd pfd = {fd_, POLLIN, 0};
    int ready = ::poll(&pfd, 1, RemainingMs(deadline));
    if (ready < 0) {
      if (errno == EINTR) continue;
      return Error{std::string("poll: ") + std::strerror(errno)};
    }
    if (ready == 0) return Error{"no reply from hvtraced on " + socket_.string() + " in time"};
    // recvmsg, not recv: capture-files items carry descriptors.
    bool truncated = false;
    ssize_t n = RecvWithFds(fd_, buf, pending_fds_, &truncated);
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return Error{"reading from " + socket_.string() + ": " + std::strerror(errno)};
    }
    if (truncated || pending_fds_.size() > 2 * kMaxFdsPerRequest) {
      return Error{"hvtraced on " + socket_.string() + " passed more descriptors than declared"};
    }
    if (n == 0) return Error{"hvtraced closed the connection on " + socket_.string()};
    std::vector<Frame> frames;
    framer_.Feed(std::string_view(buf.data(), static_cast<size_t>(n)), frames);
    for (auto& f : frames) lines_.push_back(std::move(f));
  }
}

Result<Reply> ControlClient::ReadParsedReply(Clock::time_point deadline) {
  auto line = ReadLine(deadline);
  if (!line.ok()) return line.error();
  Result<Reply> reply = ParseReply(*line);
  if (!reply.ok() || reply->fd_count == 0) return reply;
  // Sent with the line's first byte, so here by the time the line is whole.
  if (reply->fd_count > pending_fds_.size()) {
    return Error{"a reply from hvtraced on " + socket_.string() + " declares " +
                 std::to_string(reply->fd_count) + " descriptors but " +
                 std::to_string(pending_fds_.size()) + " arrived"};
  }
  const auto end = pending_fds_.begin() + static_cast<ptrdiff_t>(reply->fd_count);
  reply->fds.assign(pending_fds_.begin(), end);
  pending_fds_.erase(pending_fds_.begin(), end);
  return reply;
}

Result<Reply> ControlClient::ReadReply(std::chrono::milliseconds timeout) {
  return ReadParsedReply(Clock::now() + timeout);
}

bool ControlClient::WaitForClose(std::chrono::milliseconds timeout) {
  auto deadline = Clock::now() + timeout;
  for (;;) {
    auto line = ReadLine(deadline);
    if (line.ok()) continue;
    return line.error().message.find("closed the connection") != std::string::npos;
  }
}

Result<Reply> ControlClient::Call(std::string_view cmd, const nlohmann::json& args,
                                  std::chrono::milliseconds timeout,
                                  const std::function<void(const nlohmann::json&)>& on_item,
                                  std::span<const int> fds) {
  return CallImpl(
      cmd, args, timeout,
      [&on_item](Reply& item) -> Status {
        if (on_item) on_item(item.result);
        return {};
      },
      fds);
}

Result<Reply> ControlClient::CallForFiles(std::string_view cmd, const nlohmann::json& args,
                                          std::chrono::milliseconds timeout,
                                          const FileItemFn& on_item) {
  return CallImpl(cmd, args, timeout,
                  [&on_item](Reply& item) { return on_item(item.result, std::move(item.fds)); },
                  {});
}

Result<Reply> ControlClient::CallImpl(std::string_view cmd, const nlohmann::json& args,
                                      std::chrono::milliseconds timeout,
                                      const std::function<Status(Reply&)>& on_item,
                                      std::span<const int> fds) {
  int64_t id = next_id_++;
  nlohmann::json request = {{"id", id}, {"cmd", std::string(cmd)}, {"args", args}};
  if (!fds.empty()) request["fds"] = fds.size();
  std::string line = DumpJson(request) + "\n";
  if (line.size() > kMaxRequestBytes) {
    return Error{"request '" + std::string(cmd) + "' is larger than " +
                 std::to_string(kMaxRequestBytes) + " bytes"};
  }
  auto deadline = Clock::now() + timeout;
  Status sent = SendWithFds(fd_, line, fds);
  if (!sent.ok()) sent = Error{"sending to " + socket_.string() + ": " + sent.error().message};
  if (Status s = sent; !s.ok()) {
    // The daemon may have refused the connection (busy, permission) and
    // closed it before our request went out; its reason is still readable.
    auto refusal = ReadLine(std::min(deadline, Clock::now() + std::chrono::seconds(1)));
    if (refusal.ok()) {
      auto reply = ParseReply(*refusal);
      if (reply.ok() && !reply->id && !reply->ok) return reply;
    }
    return s.error();
  }
  for (;;) {
    auto reply = ReadParsedReply(deadline);
    if (!reply.ok()) return reply.error();
    // A null id is the daemon refusing the connection itself (busy, denied).
    if (reply->id && *reply->id != id) continue;
    if (reply->is_stream_item) {
      if (Status s = on_item(*reply); !s.ok()) return s.error();
      continue;
    }
    return reply;
  }
}

Result<Reply> ControlClient::CallWithFiles(
    std::string_view cmd, nlohmann::json args, std::chrono::milliseconds timeout,
    const std::function<void(const nlohmann::json&)>& on_item) {
  auto files = OpenRequestFiles(cmd, args);
  if (!files.ok()) return files.error();
  const std::vector<int> fds = files->raw();
  return Call(cmd, args, timeout, on_item, fds);
}

void ControlClient::Shutdown() {
  if (fd_ >= 0) ::shutdown(fd_, SHUT_RDWR);
}

}  // namespace hvtrace::hostd
