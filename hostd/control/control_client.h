// A blocking client for the hvtraced control socket (protocol:
// control_protocol.h), for the `hvtrace` CLI and tests. Every wait has a
// deadline; replies are size-capped like requests are on the server.
#ifndef HVTRACE_HOSTD_CONTROL_CLIENT_H_
#define HVTRACE_HOSTD_CONTROL_CLIENT_H_

#include <chrono>
#include <deque>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "control_protocol.h"
#include "fd_passing.h"
#include "hvtrace/result.h"

namespace hvtrace::hostd {

class ControlClient {
 public:
  // Errors explain the usual causes (daemon not running, stale socket,
  // permission) and name the socket path.
  static Result<ControlClient> Connect(const std::filesystem::path& socket,
                                       std::chrono::milliseconds timeout);

  ControlClient(ControlClient&& other) noexcept;
  ControlClient& operator=(ControlClient&& other) noexcept;
  ControlClient(const ControlClient&) = delete;
  ControlClient& operator=(const ControlClient&) = delete;
  ~ControlClient();

  // Sends {"id":…,"cmd":cmd,"args":args} and returns the final reply (which
  // may be an error reply: check |ok|). Stream items go to |on_item|.
  // |fds| go along with the request (fd_passing.h; "fds" says how many).
  Result<Reply> Call(std::string_view cmd, const nlohmann::json& args,
                     std::chrono::milliseconds timeout,
                     const std::function<void(const nlohmann::json&)>& on_item = {},
                     std::span<const int> fds = {});
  // Call, for a command whose stream items carry descriptors (fd_passing.h;
  // capture-files): |on_item| gets each item with the descriptors it
  // declared, and its error ends the call.
  using FileItemFn = std::function<Status(const nlohmann::json&, std::vector<SharedFd>)>;
  Result<Reply> CallForFiles(std::string_view cmd, const nlohmann::json& args,
                             std::chrono::milliseconds timeout, const FileItemFn& on_item);
  // Call, after opening the files |args| name (OpenRequestFiles) as the
  // calling user: a file that user cannot read fails here, before anything
  // is sent.
  Result<Reply> CallWithFiles(std::string_view cmd, nlohmann::json args,
                              std::chrono::milliseconds timeout,
                              const std::function<void(const nlohmann::json&)>& on_item = {});

  // Low level, for tests that speak the protocol badly on purpose.
  Status SendRaw(std::string_view bytes);
  // The next reply line, whatever its id.
  Result<Reply> ReadReply(std::chrono::milliseconds timeout);
  // True when the daemon closed the connection (EOF) within |timeout|.
  bool WaitForClose(std::chrono::milliseconds timeout);

  // Shuts the socket down (both ways) without closing it: a Call blocked on
  // another thread (a stream) returns with an error, and the daemon sees the
  // client go. Safe from any thread.
  void Shutdown();

 private:
  ControlClient(int fd, std::filesystem::path socket);
  // Reads until a complete line is buffered; "" + error on EOF/timeout.
  Result<std::string> ReadLine(std::chrono::steady_clock::time_point deadline);
  // ReadLine + ParseReply, with the descriptors a stream item declares.
  Result<Reply> ReadParsedReply(std::chrono::steady_clock::time_point deadline);
  Result<Reply> CallImpl(std::string_view cmd, const nlohmann::json& args,
                         std::chrono::milliseconds timeout,
                         const std::function<Status(Reply&)>& on_item, std::span<const int> fds);

  int fd_ = -1;
  std::filesystem::path socket_;
  LineFramer framer_{kMaxReplyBytes};
  std::deque<Frame> lines_;
  // Descriptors received, not yet claimed by the stream item that declared
  // them (they arrive with its first byte, so before it is complete).
  std::vector<SharedFd> pending_fds_;
  int64_t next_id_ = 1;
};

}  // namespace hvtrace::hostd

#endif  // HVTRACE_HOSTD_CONTROL_CLIENT_H_
