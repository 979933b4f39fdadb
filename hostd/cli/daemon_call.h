// The CLI's one way to talk to hvtraced: connect to its control socket and
// make a request, printing any failure as "hvtrace COMMAND: why" on stderr
// and turning it into the exit status (command.h's table), so the caller
// only returns that status.
#ifndef HVTRACE_HOSTD_CLI_DAEMON_CALL_H_
#define HVTRACE_HOSTD_CLI_DAEMON_CALL_H_

#include <functional>
#include <nlohmann/json.hpp>
#include <string>

#include "command.h"
#include "hvtrace/result.h"
#include "json_message.h"

namespace hvtrace::cli {

struct CallOptions {
  // A refusal of the daemon (kExitDenied from its answer) is printed; off
  // for a request made on the way to another that the daemon judges itself
  // (`boot`'s harvest first: an observer is told `boot` is refused, not the
  // harvest).
  bool print_refusal = true;
};

// Sends |request| to the daemon on the socket |socket_flag| names (empty:
// the default one, see ResolveClientSocket). Stream items go to |on_item|.
// Returns kExitOk with the reply's result in |*result|; kExitNoDaemon when
// the daemon cannot be reached or does not answer within the request's
// timeout; ExitCodeForDaemonError when it answers with an error.
int CallDaemon(const std::string& command, const std::string& socket_flag,
               const DaemonRequest& request, nlohmann::json* result,
               const std::function<void(const nlohmann::json&)>& on_item = {},
               const CallOptions& options = {});

// Prints that hvtraced's reply to |command| does not parse (|why|) and
// returns kExitFailed: a daemon of another version, or its bug.
int ReplyUnreadable(const std::string& command, const Error& why);

// |result| through |Reply|'s one mapping (control/replies.h).
template <class Reply>
int ParseReply(const std::string& command, const nlohmann::json& result, Reply* reply) {
  auto parsed = hostd::ParseMessage<Reply>(result, "reply");
  if (!parsed.ok()) return ReplyUnreadable(command, parsed.error());
  *reply = std::move(*parsed);
  return kExitOk;
}

// CallDaemon, then the result parsed into |*reply|; |*result| keeps it as it
// came, for --json.
template <class Reply>
int CallDaemon(const std::string& command, const std::string& socket_flag,
               const DaemonRequest& request, nlohmann::json* result, Reply* reply,
               const std::function<void(const nlohmann::json&)>& on_item = {},
               const CallOptions& options = {}) {
  if (int rc = CallDaemon(command, socket_flag, request, result, on_item, options); rc != kExitOk) {
    return rc;
  }
  return ParseReply(command, *result, reply);
}

}  // namespace hvtrace::cli

#endif  // HVTRACE_HOSTD_CLI_DAEMON_CALL_H_
