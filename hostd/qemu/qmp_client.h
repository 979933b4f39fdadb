// QMP client for QEMU's monitor socket, on Boost.Asio.
//
// QmpClient is the asynchronous client for code that already runs an
// io_context (hvtraced); QmpSyncClient wraps it with its own I/O thread for
// tests and command-line tools. Both speak QMP as QEMU 7.2 does: greeting,
// qmp_capabilities, then commands carrying an "id" that the reply echoes, and
// asynchronous events interleaved with replies.
//
// QEMU 7.2 serves ONE QMP client per monitor socket: a second connection is
// accepted by the kernel but gets no greeting until the first one closes. The
// owner of the connection (the test, or hvtraced's per-VM backend) must
// multiplex every user of the VM's monitor over its one client; Connect fails
// with a message saying so when no greeting arrives.
#ifndef HVTRACE_HOSTD_QMP_CLIENT_H_
#define HVTRACE_HOSTD_QMP_CLIENT_H_

#include <sys/types.h>

#include <atomic>
#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "hvtrace/result.h"
#include "qmp_framer.h"

namespace hvtrace::hostd {

struct QmpEvent {
  std::string name;          // "GUEST_PANICKED", "STOP", "SHUTDOWN", ...
  nlohmann::json data;       // The event's "data" object; {} when absent.
  int64_t qemu_seconds = 0;  // QEMU's timestamp (host wall clock).
  int64_t qemu_microseconds = 0;
  std::chrono::steady_clock::time_point received;  // When we parsed it.
};

class QmpClient : public std::enable_shared_from_this<QmpClient> {
 public:
  using ReplyHandler = std::function<void(Result<nlohmann::json>)>;  // The "return" value.
  using EventHandler = std::function<void(const QmpEvent&)>;
  using DisconnectHandler = std::function<void(const Error&)>;
  using ConnectHandler = std::function<void(Status)>;

  static std::shared_ptr<QmpClient> Create(
      boost::asio::any_io_executor executor,
      size_t max_message_bytes = QmpFramer::kDefaultMaxMessageBytes);
  ~QmpClient();

  // Handlers run on the client's strand. Set them before AsyncConnect so no
  // event is missed.
  void SetEventHandler(EventHandler handler);
  // Called once when the connection ends for any reason other than Close():
  // EOF (QEMU exited or was killed), a read error, or a protocol error.
  void SetDisconnectHandler(DisconnectHandler handler);

  // Connects to |socket_path|, retrying while QEMU has not created or is not
  // yet listening on it, reads the greeting and negotiates capabilities, all
  // within |timeout|.
  void AsyncConnect(std::string socket_path, std::chrono::milliseconds timeout,
                    ConnectHandler handler);

  // Sends {"execute": command, "arguments": arguments, "id": N}. The handler
  // gets the reply's "return" value, the QMP error ("class: desc"), a timeout
  // error, or the disconnect error. A reply arriving after its timeout is
  // dropped. Safe to call from any thread.
  void AsyncExecute(std::string command, nlohmann::json arguments,
                    std::chrono::milliseconds timeout, ReplyHandler handler);

  // Closes the connection; pending commands fail with "closed". Idempotent;
  // the disconnect handler is not called.
  void Close();

  // The greeting's "QMP" object (version, capabilities); set once connected.
  const nlohmann::json& greeting() const { return greeting_; }
  // The pid of the process listening on the socket (SO_PEERCRED), once
  // connected; -1 before, or when the kernel did not say.
  pid_t peer_pid() const { return peer_pid_.load(); }

 private:
  enum class State { kIdle, kConnecting, kNegotiating, kReady, kClosed };
  struct Pending {
    std::string command;
    ReplyHandler handler;
    std::unique_ptr<boost::asio::steady_timer> timer;
  };

  QmpClient(boost::asio::any_io_executor executor, size_t max_message_bytes);
  void TryConnect();
  void StartRead();
  void HandleMessage(nlohmann::json message);
  void Send(std::string command, nlohmann::json arguments, std::chrono::milliseconds timeout,
            ReplyHandler handler);
  void WriteNext();
  void Shutdown(const Error& error, bool notify);
  void FinishConnect(Status status);

  boost::asio::strand<boost::asio::any_io_executor> strand_;
  boost::asio::local::stream_protocol::socket socket_;
  boost::asio::steady_timer connect_deadline_;
  boost::asio::steady_timer retry_timer_;
  QmpFramer framer_;
  State state_ = State::kIdle;
  std::string socket_path_;
  std::chrono::milliseconds connect_timeout_{0};
  ConnectHandler connect_handler_;
  EventHandler event_handler_;
  DisconnectHandler disconnect_handler_;
  nlohmann::json greeting_;
  std::atomic<pid_t> peer_pid_{-1};
  uint64_t next_id_ = 1;
  std::map<uint64_t, Pending> pending_;
  std::deque<std::string> write_queue_;
  bool writing_ = false;
  std::vector<char> read_buffer_;
};

// A blocking facade: runs its own io_context on a thread. All methods are
// thread-safe. Every event received since Connect is recorded.
class QmpSyncClient {
 public:
  static Result<std::unique_ptr<QmpSyncClient>> Connect(
      const std::string& socket_path, std::chrono::milliseconds timeout = std::chrono::seconds(10),
      size_t max_message_bytes = QmpFramer::kDefaultMaxMessageBytes);
  ~QmpSyncClient();
  QmpSyncClient(const QmpSyncClient&) = delete;
  QmpSyncClient& operator=(const QmpSyncClient&) = delete;

  Result<nlohmann::json> Execute(const std::string& command,
                                 nlohmann::json arguments = nlohmann::json::object(),
                                 std::chrono::milliseconds timeout = std::chrono::seconds(10));

  // Returns the oldest event named |name| that no earlier WaitForEvent call
  // returned, waiting up to |timeout| for it. Fails at the deadline or as soon
  // as the connection is gone with no such event left.
  Result<QmpEvent> WaitForEvent(const std::string& name, std::chrono::milliseconds timeout);

  // Waits until the connection is gone and returns why; nullopt at the
  // deadline.
  std::optional<Error> WaitForDisconnect(std::chrono::milliseconds timeout);

  std::vector<QmpEvent> events() const;
  bool connected() const;
  // When the disconnect was noticed (for latency checks).
  std::optional<std::chrono::steady_clock::time_point> disconnected_at() const;
  const nlohmann::json& greeting() const { return client_->greeting(); }
  pid_t peer_pid() const { return client_->peer_pid(); }

 private:
  QmpSyncClient();
  void OnEvent(const QmpEvent& event);
  void OnDisconnect(const Error& error);

  boost::asio::io_context io_;
  std::shared_ptr<QmpClient> client_;
  std::thread thread_;
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<QmpEvent> events_;
  std::vector<bool> consumed_;
  std::optional<Error> disconnect_;
  std::optional<std::chrono::steady_clock::time_point> disconnected_at_;
};

}  // namespace hvtrace::hostd

#endif  // HVTRACE_HOSTD_QMP_CLIENT_H_
