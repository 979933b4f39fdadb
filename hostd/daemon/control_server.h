// The control socket server of hvtraced (protocol: control_protocol.h).
//
// Runs on one io_context thread. Each connection reads into a LineFramer,
// answers bad requests itself, and hands good ones to the RequestHandler on
// the I/O thread; the handler must return quickly and post slow work
// elsewhere, replying later through the thread-safe Responder.
//
// Access: the socket file is created with mode 0660 and the configured group,
// and every peer's SO_PEERCRED and SO_PEERGROUPS are read on accept: a peer
// with no role (access.h) is refused at once, so a socket whose mode someone
// loosened still refuses strangers; the handler checks each request's role.
// Descriptors a client passes (fd_passing.h) are queued per connection and
// handed to the request that declares them. Limits: connections at once, requests in flight per
// connection (more get a "busy" error), and unsent reply bytes per connection
// (a client that stops reading is disconnected).
#ifndef HVTRACE_HOSTD_CONTROL_SERVER_H_
#define HVTRACE_HOSTD_CONTROL_SERVER_H_

#include <sys/types.h>

#include <atomic>
#include <boost/asio/io_context.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <boost/asio/steady_timer.hpp>
#include <cstddef>
#include <filesystem>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "access.h"
#include "control_protocol.h"
#include "hvtrace/result.h"
#include "json_message.h"

namespace hvtrace::hostd {

struct ControlServerOptions {
  std::filesystem::path socket_path;
  std::optional<gid_t> group;  // Socket group: the socket file's group.
  AccessPolicy access;         // Who may connect at all (any role).
  size_t max_connections = 32;
  size_t max_in_flight = 16;  // Per connection.
  size_t max_unsent_bytes = 32 * 1024 * 1024;
};

class ControlConnection;

// Sends the replies to one request. Any thread may call it; the lines are
// written in call order. Exactly one final reply (Reply, Fail or End) is sent;
// calls after it are ignored. A Responder dropped without a final reply sends
// an "internal" error, so a client never waits forever.
class Responder {
 public:
  Responder(std::weak_ptr<ControlConnection> connection, int64_t id);
  Responder(const Responder&) = delete;
  Responder& operator=(const Responder&) = delete;
  ~Responder();

  int64_t id() const { return id_; }
  // Replies, stream items and stream ends are messages with one mapping
  // (control/replies.h, json_message.h), never JSON built on the spot.
  template <JsonMessage M>
  void Reply(const M& reply) {
    ReplyJson(MessageToJson(reply));
  }
  void Fail(std::string_view code, std::string_view message);
  // A stream item; with |fds| (at most kMaxFdsPerRequest) they are sent with
  // SCM_RIGHTS along with the line's first byte, and the line says "fds":N.
  template <JsonMessage M>
  void Stream(const M& item, std::vector<SharedFd> fds = {}) {
    StreamJson(MessageToJson(item), std::move(fds));
  }
  template <JsonMessage M>
  void End(const M& result) {
    EndJson(MessageToJson(result));
  }
  // False once the client's connection is gone (it hung up, or was dropped
  // for not reading): a long-running stream stops then.
  bool connected() const { return !connection_.expired(); }

 private:
  void ReplyJson(const nlohmann::json& result);
  void StreamJson(const nlohmann::json& item, std::vector<SharedFd> fds);
  void EndJson(const nlohmann::json& result);
  void Send(std::string line, bool final, std::vector<SharedFd> fds = {});

  std::weak_ptr<ControlConnection> connection_;
  int64_t id_;
  std::atomic<bool> finished_{false};
};

using RequestHandler =
    std::function<void(const Request&, const PeerCredentials&, std::shared_ptr<Responder>)>;

class ControlServer {
 public:
  ControlServer(boost::asio::io_context& io, ControlServerOptions options, RequestHandler handler);
  ~ControlServer();

  // Binds the socket (removing a stale socket file, never another kind of
  // file), sets its mode and group, and starts accepting. The caller holds
  // the lock that proves no other daemon uses this path.
  Status Listen();

  // Stops accepting, lets each connection flush what it has queued (up to a
  // second), then closes it and removes the socket file. I/O thread only.
  // Destroy the server only once the io_context no longer runs its handlers.
  void Close();

  // New limits (a config reload) for the connections and requests that
  // come next; I/O thread only.
  void SetLimits(size_t max_connections, size_t max_in_flight) {
    options_.max_connections = max_connections;
    options_.max_in_flight = max_in_flight;
  }

  size_t connection_count() const { return connections_.size(); }
  const ControlServerOptions& options() const { return options_; }

 private:
  friend class ControlConnection;
  void Accept();
  void Forget(ControlConnection* connection);
  bool PeerAllowed(const PeerCredentials& peer) const;

  boost::asio::io_context& io_;
  ControlServerOptions options_;
  RequestHandler handler_;
  boost::asio::local::stream_protocol::acceptor acceptor_;
  boost::asio::steady_timer accept_retry_;
  std::set<std::shared_ptr<ControlConnection>> connections_;
  bool bound_ = false;
  bool closed_ = false;
};

}  // namespace hvtrace::hostd

#endif  // HVTRACE_HOSTD_CONTROL_SERVER_H_
