#include "daemon_call.h"

#include <cstdio>

namespace hvtrace::cli {

Result<hostd::ControlClient> ConnectDaemon(const char* command, const std::string& socket_flag) {
  auto client = hostd::ControlClient::Connect(hostd::ResolveClientSocket(socket_flag), std::chrono::seconds(5));
  if (!client.ok()) std::fprintf(stderr, "hvtrace %s: %s\n", command, client.error().message.c_str());
  return client;
}

std::optional<nlohmann::json> CallDaemon(const char* command, const std::string& socket_flag,
                                         std::string_view request, const nlohmann::json& args,
                                         std::chrono::milliseconds timeout) {
  auto client = ConnectDaemon(command, socket_flag);
  if (!client.ok()) return std::nullopt;
  auto reply = client->Call(request, args, timeout);
  if (!reply.ok()) {
    std::fprintf(stderr, "hvtrace %s: %s\n", command, reply.error().message.c_str());
    return std::nullopt;
  }
  if (!reply->ok) {
    std::fprintf(stderr, "hvtrace %s: %s\n", command, reply->error.c_str());
    return std::nullopt;
  }
  return reply->result;
}

}  // namespace hvtrace::cli
