#include "control_server.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>
#include <cerrno>
#include <cstring>
#include <deque>

#include "daemon_log.h"
#include "fd_passing.h"

namespace hvtrace::hostd {

namespace asio = boost::asio;
using stream_protocol = asio::local::stream_protocol;

namespace {

// The peer's supplementary groups as the kernel recorded them at connect
// time (SO_PEERGROUPS, Linux 4.13): what the process really holds, without a
// /proc/<pid> read that a pid reuse could fool, and without the group
// database, which may disagree with the process (newgrp, setpriv, a group
// granted after login).
std::vector<gid_t> PeerGroups(int fd) {
  std::vector<gid_t> groups(64);
  for (int attempt = 0; attempt < 2; ++attempt) {
    socklen_t len = static_cast<socklen_t>(groups.size() * sizeof(gid_t));
    if (::getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups.data(), &len) == 0) {
      groups.resize(len / sizeof(gid_t));
      return groups;
    }
    if (errno != ERANGE) break;
    groups.resize(len / sizeof(gid_t) + 1);
  }
  return {};
}

// Lets |group| connect to the socket file |path| besides its owning group, by
// a POSIX ACL (user::rw- group::rw- group:GID:rw- mask::rw- other::---): the
// admin group need not also be the socket group. Written as the kernel's
// xattr format directly, so the daemon needs no libacl.
Status GrantGroupAccess(const std::filesystem::path& path, gid_t group) {
  struct Entry {
    uint16_t tag;
    uint16_t perm;
    uint32_t id;
  };
  constexpr uint32_t kUndefined = 0xffffffff;
  constexpr uint16_t kRw = 6;
  struct {
    uint32_t version = 2;
    Entry entries[5];
  } acl;
  acl.entries[0] = {0x01, kRw, kUndefined};  // ACL_USER_OBJ
  acl.entries[1] = {0x04, kRw, kUndefined};  // ACL_GROUP_OBJ
  acl.entries[2] = {0x08, kRw, group};       // ACL_GROUP
  acl.entries[3] = {0x10, kRw, kUndefined};  // ACL_MASK
  acl.entries[4] = {0x20, 0, kUndefined};    // ACL_OTHER
  static_assert(sizeof acl == 4 + 5 * 8);
  if (::setxattr(path.c_str(), "system.posix_acl_access", &acl, sizeof acl, 0) != 0) {
    return Error{"cannot let admin_group gid " + std::to_string(group) + " reach " + path.string() +
                 " (POSIX ACL: " + std::strerror(errno) +
                 "); only admins also in socket_group can connect: put the socket on a file "
                 "system with ACLs (tmpfs has them), or add the admins to socket_group"};
  }
  return {};
}

}  // namespace

// One client. Lives on the I/O thread; Responders reach it by posting.
class ControlConnection : public std::enable_shared_from_this<ControlConnection> {
 public:
  ControlConnection(ControlServer* server, stream_protocol::socket socket)
      : server_(server),
        socket_(std::move(socket)),
        framer_(kMaxRequestBytes),
        close_timer_(socket_.get_executor()) {}

  void Start(bool over_connection_limit) {
    if (over_connection_limit) {
      Enqueue(ErrorReply(std::nullopt, kErrBusy,
                         "hvtraced already serves " +
                             std::to_string(server_->options_.max_connections) +
                             " connections; try again later"),
              false);
      CloseAfterFlush();
      return;
    }
    struct ucred cred;
    socklen_t len = sizeof cred;
    if (::getsockopt(socket_.native_handle(), SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
      Enqueue(ErrorReply(std::nullopt, kErrDenied,
                         std::string("cannot read peer credentials: ") + std::strerror(errno)),
              false);
      CloseAfterFlush();
      return;
    }
    peer_ = PeerCredentials{cred.pid, cred.uid, cred.gid, PeerGroups(socket_.native_handle())};
    if (!server_->PeerAllowed(peer_)) {
      Enqueue(ErrorReply(std::nullopt, kErrDenied,
                         "uid " + std::to_string(peer_.uid) + " (pid " + std::to_string(peer_.pid) +
                             ") may not use hvtraced: needs root, the daemon's user, the "
                             "socket group or the admin group"),
              false);
      CloseAfterFlush();
      return;
    }
    Read();
  }

  // Queues one reply line, with |fds| to pass along its first byte. |final|
  // ends a request.
  void Enqueue(std::string line, bool final, std::vector<SharedFd> fds = {}) {
    if (closed_) return;
    if (final && in_flight_ > 0) --in_flight_;
    unsent_bytes_ += line.size();
    if (server_ && unsent_bytes_ > server_->options_.max_unsent_bytes) {
      // The client stopped reading; holding more replies would let it grow
      // the daemon's memory without bound.
      Close();
      return;
    }
    queue_.push_back({std::move(line), std::move(fds)});
    if (!writing_) WriteNext();
  }

  void CloseAfterFlush() {
    if (closed_ || closing_) return;
    closing_ = true;
    boost::system::error_code ignored;
    socket_.shutdown(stream_protocol::socket::shutdown_receive, ignored);
    if (queue_.empty() && !writing_) {
      Close();
      return;
    }
    close_timer_.expires_after(std::chrono::seconds(1));
    close_timer_.async_wait([self = shared_from_this()](const boost::system::error_code& ec) {
      if (!ec) self->Close();
    });
  }

  void Close() {
    if (closed_) return;
    closed_ = true;
    boost::system::error_code ignored;
    close_timer_.cancel();
    socket_.close(ignored);
    queue_.clear();
    if (server_) server_->Forget(this);
  }

  void Detach() { server_ = nullptr; }
  asio::any_io_executor executor() { return socket_.get_executor(); }

 private:
  // Waits for input, then reads with recvmsg: Asio's reads cannot take the
  // descriptors a client passes along (SCM_RIGHTS).
  void Read() {
    socket_.async_wait(
        stream_protocol::socket::wait_read,
        [self = shared_from_this()](const boost::system::error_code& ec) { self->OnReadable(ec); });
  }

  void OnReadable(boost::system::error_code ec) {
    if (closed_ || closing_) return;
    size_t n = 0;
    if (!ec) {
      bool truncated = false;
      ssize_t got = RecvWithFds(socket_.native_handle(), read_buffer_, pending_fds_, &truncated);
      if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
        Read();
        return;
      }
      if (got < 0) {
        ec = boost::system::error_code(errno, boost::system::system_category());
      } else if (got == 0) {
        ec = asio::error::eof;
      } else {
        n = static_cast<size_t>(got);
      }
      if (truncated || pending_fds_.size() > 2 * kMaxFdsPerRequest) {
        // More descriptors than any request may claim: the client is broken
        // or hostile, and holding them would let it exhaust our fd table.
        pending_fds_.clear();
        Enqueue(ErrorReply(std::nullopt, kErrTooLarge,
                           "too many file descriptors passed (at most " +
                               std::to_string(kMaxFdsPerRequest) + " per request)"),
                false);
        CloseAfterFlush();
        return;
      }
    }
    OnRead(ec, n);
  }

  void OnRead(const boost::system::error_code& ec, size_t n) {
    if (closed_ || closing_) return;
    if (ec) {
      // EOF or error: finish sending what is queued (replies to requests
      // already handled), then close.
      CloseAfterFlush();
      return;
    }
    frames_.clear();
    framer_.Feed(std::string_view(read_buffer_.data(), n), frames_);
    for (Frame& frame : frames_) {
      if (closed_ || closing_ || server_ == nullptr) return;
      HandleFrame(frame);
    }
    if (!closed_ && !closing_) Read();
  }

  void HandleFrame(Frame& frame) {
    if (!frame.within_limit) {
      pending_fds_.clear();
      Enqueue(ErrorReply(std::nullopt, kErrTooLarge,
                         "request at stream offset " + std::to_string(frame.stream_offset) +
                             " exceeds " + std::to_string(kMaxRequestBytes) +
                             " bytes; skipped to the next newline"),
              false);
      return;
    }
    if (IsBlankLine(frame.text)) return;
    auto parsed = ParseRequest(frame.text);
    if (auto* error = std::get_if<RequestError>(&parsed)) {
      // Descriptors sent with a line we could not read are not handed to a
      // later request, which would then get the wrong files.
      pending_fds_.clear();
      Enqueue(ErrorReply(error->id, error->code, error->message), false);
      return;
    }
    Request& request = std::get<Request>(parsed);
    // The descriptors came with the request's first byte, so they are queued
    // by now; a request claiming more than arrived is refused, and what it
    // could claim is dropped so later requests do not get the wrong files.
    if (request.fd_count > pending_fds_.size()) {
      Enqueue(ErrorReply(request.id, kErrBadRequest,
                         "request declares " + std::to_string(request.fd_count) +
                             " file descriptors but " + std::to_string(pending_fds_.size()) +
                             " arrived"),
              false);
      pending_fds_.clear();
      return;
    }
    request.fds.assign(pending_fds_.begin(),
                       pending_fds_.begin() + static_cast<ptrdiff_t>(request.fd_count));
    pending_fds_.erase(pending_fds_.begin(),
                       pending_fds_.begin() + static_cast<ptrdiff_t>(request.fd_count));
    if (in_flight_ >= server_->options_.max_in_flight) {
      Enqueue(ErrorReply(request.id, kErrBusy,
                         "too many requests in flight on this connection (limit " +
                             std::to_string(server_->options_.max_in_flight) + ")"),
              false);
      return;
    }
    request.peer_uid = peer_.uid;
    ++in_flight_;
    auto responder = std::make_shared<Responder>(weak_from_this(), request.id);
    server_->handler_(request, peer_, std::move(responder));
  }

  void WriteNext() {
    if (queue_.empty() || closed_) {
      writing_ = false;
      if (closing_ && !closed_) Close();
      return;
    }
    writing_ = true;
    if (!queue_.front().fds.empty()) {
      // Asio's writes cannot carry SCM_RIGHTS: once the socket is writable,
      // the line's first bytes go out with sendmsg and its descriptors, the
      // rest (if any) through async_write below.
      socket_.async_wait(stream_protocol::socket::wait_write,
                         [self = shared_from_this()](const boost::system::error_code& ec) {
                           self->SendWithDescriptors(ec);
                         });
      return;
    }
    asio::async_write(socket_, asio::buffer(queue_.front().line),
                      [self = shared_from_this()](const boost::system::error_code& ec, size_t) {
                        if (self->closed_) return;
                        if (ec) {
                          self->Close();
                          return;
                        }
                        self->unsent_bytes_ -= self->queue_.front().line.size();
                        self->queue_.pop_front();
                        self->WriteNext();
                      });
  }

  void SendWithDescriptors(const boost::system::error_code& ec) {
    if (closed_) return;
    if (ec) {
      Close();
      return;
    }
    Outgoing& front = queue_.front();
    std::vector<int> raw;
    for (const SharedFd& fd : front.fds) raw.push_back(fd->get());
    const ssize_t n = SendSomeWithFds(socket_.native_handle(), front.line, raw);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      WriteNext();  // Waits for writability again.
      return;
    }
    if (n <= 0) {
      Close();
      return;
    }
    // The descriptors went with the first byte; our copies close now.
    front.fds.clear();
    front.line.erase(0, static_cast<size_t>(n));
    unsent_bytes_ -= static_cast<size_t>(n);
    if (front.line.empty()) queue_.pop_front();
    WriteNext();
  }

  struct Outgoing {
    std::string line;
    std::vector<SharedFd> fds;
  };

  ControlServer* server_;
  stream_protocol::socket socket_;
  LineFramer framer_;
  asio::steady_timer close_timer_;
  PeerCredentials peer_;
  std::array<char, 65536> read_buffer_;
  std::vector<Frame> frames_;
  std::vector<SharedFd> pending_fds_;  // Passed, not yet claimed by a request.
  std::deque<Outgoing> queue_;
  size_t unsent_bytes_ = 0;
  size_t in_flight_ = 0;
  bool writing_ = false;
  bool closing_ = false;
  bool closed_ = false;
};

Responder::Responder(std::weak_ptr<ControlConnection> connection, int64_t id)
    : connection_(std::move(connection)), id_(id) {}

Responder::~Responder() {
  if (!finished_.load()) {
    Send(ErrorReply(id_, kErrInternal, "request ended without a reply (daemon bug)"), true);
  }
}

void Responder::Send(std::string line, bool final, std::vector<SharedFd> fds) {
  if (final && finished_.exchange(true)) return;
  if (!final && finished_.load()) return;
  std::shared_ptr<ControlConnection> connection = connection_.lock();
  if (!connection) return;
  // dispatch, not post: a reply made on the I/O thread itself is queued at
  // once, so replies keep the order of the requests that were answered
  // synchronously (bad lines are answered inline too).
  asio::dispatch(connection->executor(),
                 [connection, line = std::move(line), final, fds = std::move(fds)]() mutable {
                   connection->Enqueue(std::move(line), final, std::move(fds));
                 });
}

void Responder::ReplyJson(const nlohmann::json& result) { Send(OkReply(id_, result), true); }
void Responder::Fail(std::string_view code, std::string_view message) {
  Send(ErrorReply(id_, code, message), true);
}
void Responder::StreamJson(const nlohmann::json& item, std::vector<SharedFd> fds) {
  if (fds.empty()) return Send(StreamItem(id_, item), false);
  const size_t count = fds.size();
  Send(StreamItem(id_, item, count), false, std::move(fds));
}
void Responder::EndJson(const nlohmann::json& result) { Send(StreamEnd(id_, result), true); }

ControlServer::ControlServer(asio::io_context& io, ControlServerOptions options,
                             RequestHandler handler)
    : io_(io),
      options_(std::move(options)),
      handler_(std::move(handler)),
      acceptor_(io),
      accept_retry_(io) {}

ControlServer::~ControlServer() {
  Close();
  for (const auto& c : connections_) c->Detach();
}

Status ControlServer::Listen() {
  const std::filesystem::path& path = options_.socket_path;
  if (path.native().size() >= sizeof(sockaddr_un::sun_path)) {
    return Error{"socket path " + path.string() + " is too long for a Unix socket (max " +
                 std::to_string(sizeof(sockaddr_un::sun_path) - 1) + " bytes)"};
  }
  struct stat st;
  if (::lstat(path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) {
      return Error{path.string() + " exists and is not a socket; refusing to replace it"};
    }
    if (::unlink(path.c_str()) != 0) {
      return Error{"cannot remove stale socket " + path.string() + ": " + std::strerror(errno)};
    }
  }
  boost::system::error_code ec;
  acceptor_.open(stream_protocol(), ec);
  if (ec) return Error{"cannot create socket for " + path.string() + ": " + ec.message()};
  // The socket file must never exist with a looser mode than 0660, not even
  // between bind and chmod.
  mode_t old_mask = ::umask(0117);
  acceptor_.bind(stream_protocol::endpoint(path.string()), ec);
  ::umask(old_mask);
  if (ec) return Error{"cannot bind " + path.string() + ": " + ec.message()};
  bound_ = true;
  if (::chmod(path.c_str(), 0660) != 0) {
    return Error{"cannot chmod 0660 " + path.string() + ": " + std::strerror(errno)};
  }
  if (options_.group && ::chown(path.c_str(), static_cast<uid_t>(-1), *options_.group) != 0) {
    return Error{"cannot set group " + std::to_string(*options_.group) + " on " + path.string() +
                 ": " + std::strerror(errno)};
  }
  const std::optional<gid_t> admin = options_.access.admin_group;
  if (admin && admin != options_.group) {
    // Not fatal: root and admins who are also in socket_group still work.
    if (Status s = GrantGroupAccess(path, *admin); !s.ok()) LogWarning(s.error().message);
  }
  acceptor_.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) return Error{"cannot listen on " + path.string() + ": " + ec.message()};
  Accept();
  return {};
}

void ControlServer::Accept() {
  acceptor_.async_accept(
      [this](const boost::system::error_code& ec, stream_protocol::socket socket) {
        if (closed_) return;
        if (!ec) {
          bool over = connections_.size() >= options_.max_connections;
          auto connection = std::make_shared<ControlConnection>(this, std::move(socket));
          connections_.insert(connection);
          connection->Start(over);
        } else if (ec == asio::error::operation_aborted) {
          return;
        }
        if (!ec) {
          Accept();
          return;
        }
        // Other errors (EMFILE, ECONNABORTED) concern one attempt; keep serving,
        // but after a pause so a lasting EMFILE does not spin the I/O thread.
        accept_retry_.expires_after(std::chrono::milliseconds(100));
        accept_retry_.async_wait([this](const boost::system::error_code& wait_ec) {
          if (!wait_ec && !closed_) Accept();
        });
      });
}

void ControlServer::Forget(ControlConnection* connection) {
  for (auto it = connections_.begin(); it != connections_.end(); ++it) {
    if (it->get() == connection) {
      connections_.erase(it);
      return;
    }
  }
}

bool ControlServer::PeerAllowed(const PeerCredentials& peer) const {
  return PeerRole(options_.access, peer) != Role::kNone;
}

void ControlServer::Close() {
  if (closed_) return;
  closed_ = true;
  boost::system::error_code ignored;
  acceptor_.close(ignored);
  accept_retry_.cancel();
  if (bound_) ::unlink(options_.socket_path.c_str());
  // Copy: closing a connection erases it from the set.
  auto connections = connections_;
  for (const auto& c : connections) c->CloseAfterFlush();
}

}  // namespace hvtrace::hostd
