#include "daemon_call.h"

#include <chrono>
#include <cstdio>

#include "config.h"
#include "control_client.h"

namespace hvtrace::cli {

int CallDaemon(const std::string& command, const std::string& socket_flag,
               const DaemonRequest& request, nlohmann::json* result,
               const std::function<void(const nlohmann::json&)>& on_item) {
  auto client = hostd::ControlClient::Connect(hostd::ResolveClientSocket(socket_flag),
                                              std::chrono::seconds(5));
  if (!client.ok()) {
    std::fprintf(stderr, "hvtrace %s: %s\n", command.c_str(), client.error().message.c_str());
    return kExitNoDaemon;
  }
  auto reply = client->Call(request.cmd, request.args, request.timeout, on_item);
  if (!reply.ok()) {
    std::fprintf(stderr, "hvtrace %s: %s\n", command.c_str(), reply.error().message.c_str());
    return kExitNoDaemon;
  }
  if (!reply->ok) {
    std::fprintf(stderr, "hvtrace %s: %s\n", command.c_str(), reply->error.c_str());
    return ExitCodeForDaemonError(reply->code);
  }
  *result = std::move(reply->result);
  return kExitOk;
}

}  // namespace hvtrace::cli
