// The CLI's one way to talk to hvtraced: connect to its control socket and
// make a request, printing any failure as "hvtrace COMMAND: why" on stderr
// (the caller then only chooses its exit status).
#ifndef HVTRACE_HOSTD_CLI_DAEMON_CALL_H_
#define HVTRACE_HOSTD_CLI_DAEMON_CALL_H_

#include <chrono>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "config.h"
#include "control_client.h"
#include "hvtrace/result.h"

namespace hvtrace::cli {

// Connects to the socket |socket_flag| names (empty: the default one, see
// ResolveClientSocket); for long-lived calls such as stream.
Result<hostd::ControlClient> ConnectDaemon(const char* command, const std::string& socket_flag);

// One request and its successful result; nullopt (after printing why) when
// the daemon cannot be reached, the reply does not come within |timeout|, or
// the daemon answers with an error.
std::optional<nlohmann::json> CallDaemon(const char* command, const std::string& socket_flag,
                                         std::string_view request, const nlohmann::json& args,
                                         std::chrono::milliseconds timeout);

}  // namespace hvtrace::cli

#endif  // HVTRACE_HOSTD_CLI_DAEMON_CALL_H_
