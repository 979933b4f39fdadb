#include "daemon_call.h"

#include <cerrno>
#include <chrono>
#include <cstdio>

#include "config.h"
#include "control_client.h"

namespace hvtrace::cli {

int CallDaemon(const std::string& command, const std::string& socket_flag,
               const DaemonRequest& request, nlohmann::json* result,
               const std::function<void(const nlohmann::json&)>& on_item,
               const CallOptions& options) {
  // Input files are opened first, as the user running hvtrace: the daemon
  // gets the descriptors and never opens a path itself (fd_passing.h). A file
  // this user cannot read stops here, with nothing sent.
  nlohmann::json args = request.args;
  auto files = hostd::OpenRequestFiles(request.cmd, args);
  if (!files.ok()) {
    std::fprintf(stderr, "hvtrace %s: %s\n", command.c_str(), files.error().message.c_str());
    return files.error().message.find("Permission denied") != std::string::npos ? kExitDenied
                                                                                : kExitUsage;
  }
  auto client = hostd::ControlClient::Connect(hostd::ResolveClientSocket(socket_flag),
                                              std::chrono::seconds(5));
  if (!client.ok()) {
    std::fprintf(stderr, "hvtrace %s: %s\n", command.c_str(), client.error().message.c_str());
    // The socket's mode refused this user: as much a refusal as the daemon's.
    return client.error().message.starts_with("permission denied on ") ? kExitDenied
                                                                       : kExitNoDaemon;
  }
  const std::vector<int> fds = files->raw();
  auto reply = client->Call(request.cmd, args, request.timeout, on_item, fds);
  if (!reply.ok()) {
    std::fprintf(stderr, "hvtrace %s: %s\n", command.c_str(), reply.error().message.c_str());
    return kExitNoDaemon;
  }
  if (!reply->ok) {
    const int rc = ExitCodeForDaemonError(reply->code);
    if (rc != kExitDenied || options.print_refusal) {
      std::fprintf(stderr, "hvtrace %s: %s\n", command.c_str(), reply->error.c_str());
    }
    return rc;
  }
  *result = std::move(reply->result);
  return kExitOk;
}

int ReplyUnreadable(const std::string& command, const Error& why) {
  std::fprintf(stderr,
               "hvtrace %s: hvtraced's reply does not parse (%s); is hvtraced the same version "
               "as this hvtrace (%s)?\n",
               command.c_str(), why.message.c_str(), HVTRACE_VERSION);
  return kExitFailed;
}

}  // namespace hvtrace::cli
