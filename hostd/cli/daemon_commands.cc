// CLI commands that talk to hvtraced over its control socket: ping, list,
// status, captures, daemon-shutdown. Each accepts --socket PATH (default:
// $HVTRACE_SOCKET, then the config file's socket, then
// /run/hvtrace/hvtraced.sock) and --json (print the daemon's raw result).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "commands.h"
#include "config.h"
#include "control_client.h"
#include "daemon_call.h"

namespace hvtrace::cli {
namespace {

using hostd::ControlClient;
using hostd::Reply;
using nlohmann::json;

constexpr auto kReplyTimeout = std::chrono::seconds(30);

struct CommonArgs {
  std::string socket;
  bool json_output = false;
  std::vector<std::string> positional;
};

// Parses --socket/--json and positional arguments; false on a usage error.
bool ParseCommon(int argc, char** argv, const char* usage, size_t want_positional,
                 CommonArgs& out) {
  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      std::printf("usage: hvtrace %s\n", usage);
      std::exit(0);
    } else if (arg == "--json") {
      out.json_output = true;
    } else if (arg == "--socket") {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "hvtrace %s: --socket needs a path\n", argv[0]);
        return false;
      }
      out.socket = argv[++i];
    } else if (arg.starts_with("--socket=")) {
      out.socket = std::string(arg.substr(9));
    } else if (arg.starts_with("-")) {
      std::fprintf(stderr, "hvtrace %s: unknown option '%s'\n", argv[0], argv[i]);
      return false;
    } else {
      out.positional.emplace_back(arg);
    }
  }
  if (out.positional.size() != want_positional) {
    std::fprintf(stderr, "usage: hvtrace %s\n", usage);
    return false;
  }
  return true;
}

std::optional<json> CallDaemon(const char* command_name, const CommonArgs& args, std::string_view cmd,
                               const json& cmd_args) {
  return cli::CallDaemon(command_name, args.socket, cmd, cmd_args, kReplyTimeout);
}

std::string Str(const json& j, const char* key, const char* fallback = "-") {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  if (it->is_string()) return it->get<std::string>();
  return hostd::DumpJson(*it);
}

void PrintJson(const json& j) { std::printf("%s\n", j.dump(2, ' ', false, json::error_handler_t::replace).c_str()); }

}  // namespace

int RunPing(int argc, char** argv) {
  CommonArgs args;
  if (!ParseCommon(argc, argv, "ping [--socket PATH] [--json]", 0, args)) return 2;
  auto started = std::chrono::steady_clock::now();
  auto result = CallDaemon("ping", args, "ping", json::object());
  if (!result) return 1;
  double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started)
                  .count();
  if (args.json_output) {
    PrintJson(*result);
  } else {
    std::printf("hvtraced (pid %s) is up for %.1f s; round trip %.2f ms\n",
                Str(*result, "pid").c_str(), result->value("uptime_ms", 0) / 1000.0, ms);
  }
  return 0;
}

int RunList(int argc, char** argv) {
  CommonArgs args;
  if (!ParseCommon(argc, argv, "list [--socket PATH] [--json]", 0, args)) return 2;
  auto result = CallDaemon("list", args, "list", json::object());
  if (!result) return 1;
  if (args.json_output) {
    PrintJson(*result);
    return 0;
  }
  const json& vms = (*result)["vms"];
  if (!vms.is_array() || vms.empty()) {
    std::printf("no VMs\n");
    return 0;
  }
  std::printf("%-20s %-8s %-10s %8s  %-32s %s\n", "NAME", "KIND", "STATE", "CAPTURES",
              "LAST CAPTURE", "LAST ERROR");
  for (const json& vm : vms) {
    std::string last = "-";
    if (auto it = vm.find("last_capture"); it != vm.end() && it->is_object()) last = Str(*it, "id");
    std::printf("%-20s %-8s %-10s %8s  %-32s %s\n", Str(vm, "name").c_str(),
                Str(vm, "kind").c_str(), Str(vm, "state").c_str(),
                Str(vm, "captures_taken").c_str(), last.c_str(), Str(vm, "last_error").c_str());
  }
  return 0;
}

int RunStatus(int argc, char** argv) {
  CommonArgs args;
  if (!ParseCommon(argc, argv, "status NAME [--socket PATH] [--json]", 1, args)) return 2;
  auto result = CallDaemon("status", args, "status", json{{"name", args.positional[0]}});
  if (!result) return 1;
  if (args.json_output) {
    PrintJson(*result);
    return 0;
  }
  for (const char* key : {"name", "kind", "state", "last_event", "events_seen", "captures_taken",
                          "captures_failed", "last_capture", "last_error", "captures_dir"}) {
    std::printf("%-16s %s\n", key, Str(*result, key).c_str());
  }
  return 0;
}

int RunCaptures(int argc, char** argv) {
  CommonArgs args;
  if (!ParseCommon(argc, argv, "captures NAME [--socket PATH] [--json]", 1, args)) return 2;
  auto result = CallDaemon("captures", args, "captures", json{{"name", args.positional[0]}});
  if (!result) return 1;
  if (args.json_output) {
    PrintJson(*result);
    return 0;
  }
  const json& captures = (*result)["captures"];
  if (!captures.is_array() || captures.empty()) {
    std::printf("no captures for %s\n", args.positional[0].c_str());
    return 0;
  }
  std::printf("%-36s %-12s %10s %9s  %s\n", "CAPTURE", "TRIGGER", "EVENTS", "BAD PAGES", "PATH");
  for (const json& c : captures) {
    if (c.contains("error")) {
      std::printf("%-36s damaged: %s\n", Str(c, "id").c_str(), Str(c, "error").c_str());
      continue;
    }
    json totals = c.value("totals", json::object());
    std::printf("%-36s %-12s %10s %9s  %s\n", Str(c, "id").c_str(), Str(c, "trigger").c_str(),
                Str(totals, "events").c_str(), Str(totals, "bad_pages").c_str(),
                Str(c, "path").c_str());
  }
  return 0;
}

int RunDaemonShutdown(int argc, char** argv) {
  CommonArgs args;
  if (!ParseCommon(argc, argv, "daemon-shutdown [--socket PATH]", 0, args)) return 2;
  auto result = CallDaemon("daemon-shutdown", args, "shutdown", json::object());
  if (!result) return 1;
  std::printf("hvtraced is stopping\n");
  return 0;
}

}  // namespace hvtrace::cli
