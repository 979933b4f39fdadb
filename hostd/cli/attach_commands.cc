// CLI commands for attach mode (issue #5), all through hvtraced:
//   attach NAME [--qmp SOCK] [--size 16M] [--events LIST] [--pump-ms N] [--wait-ms N]
//   detach NAME [--timeout-ms N]
//   stream NAME [--format text|json] [--from-start]
// The daemon owns the region files (root-owned under /dev/shm), so `stream`
// gets decoded lines over the control socket rather than mapping the file.
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
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

using nlohmann::json;


struct Parsed {
  std::vector<std::string> positional;
  std::string socket;
  bool json_output = false;
  json args = json::object();
};

// Parses "16", "16M", "16m", "1G" as MiB.
std::optional<uint64_t> ParseSizeMib(const std::string& text) {
  if (text.empty()) return std::nullopt;
  char* end = nullptr;
  errno = 0;
  const unsigned long long n = std::strtoull(text.c_str(), &end, 10);
  if (errno != 0 || end == text.c_str()) return std::nullopt;
  const std::string unit(end);
  if (unit.empty() || unit == "M" || unit == "m" || unit == "MiB") return n;
  if (unit == "G" || unit == "g" || unit == "GiB") return n * 1024;
  return std::nullopt;
}

std::optional<uint64_t> ParseNumber(const std::string& text) {
  char* end = nullptr;
  errno = 0;
  const unsigned long long n = std::strtoull(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || errno != 0) return std::nullopt;
  return n;
}

// Flags common to the three commands plus |extra| (flag -> handler).
bool Parse(const char* command, const char* usage, int argc, char** argv, Parsed& out,
           const std::function<int(std::string_view flag, const char* value)>& extra) {
  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i];
    const char* next = i + 1 < argc ? argv[i + 1] : nullptr;
    if (arg == "-h" || arg == "--help") {
      std::printf("usage: hvtrace %s %s\n", command, usage);
      std::exit(0);
    } else if (arg == "--socket") {
      if (!next) {
        std::fprintf(stderr, "hvtrace %s: --socket needs a value\n", command);
        return false;
      }
      out.socket = argv[++i];
    } else if (arg == "--json") {
      out.json_output = true;
    } else if (arg.size() > 1 && arg[0] == '-') {
      // Handler returns how many values it used, or -1.
      const int used = extra(arg, next);
      if (used < 0) return false;
      i += used;
    } else {
      out.positional.emplace_back(arg);
    }
  }
  if (out.positional.size() != 1) {
    std::fprintf(stderr, "usage: hvtrace %s %s\n", command, usage);
    return false;
  }
  out.args["name"] = out.positional[0];
  return true;
}

std::optional<json> CallOnce(const char* command, const Parsed& p, std::string_view cmd,
                             std::chrono::milliseconds timeout) {
  return CallDaemon(command, p.socket, cmd, p.args, timeout);
}

const char* kAttachUsage =
    "NAME [--qmp SOCK] [--size 16M] [--events LIST] [--pump-ms 50] [--wait-ms 30000]\n"
    "          [--socket PATH] [--json]\n"
    "  Hot-plugs an ivshmem-plain region (a power-of-two size) into the running\n"
    "  VM and waits for hvtrace-agent in the guest to announce itself. --qmp\n"
    "  adopts a QEMU hvtraced does not watch yet. --events: kernel events for\n"
    "  the agent to pump (SYSTEM:EVENT or SYSTEM:*, comma separated); trace_marker\n"
    "  writes and direct-write events always come.";

const char* kDetachUsage =
    "NAME [--timeout-ms 10000] [--socket PATH] [--json]\n"
    "  Unplugs the region (device_del, waits for DEVICE_DELETED, object-del).\n"
    "  hvtraced keeps the region mapped: `hvtrace capture NAME` still reads it.";

const char* kStreamUsage =
    "NAME [--format text|json] [--from-start] [--socket PATH]\n"
    "  Prints the attached region's events live, as `trace-cmd report` does\n"
    "  (or JSON lines). Ctrl-C ends it; so does the VM going away.";

}  // namespace

int RunAttach(int argc, char** argv) {
  Parsed p;
  bool ok = Parse("attach", kAttachUsage, argc, argv, p, [&](std::string_view flag, const char* v) -> int {
    if (v == nullptr) {
      std::fprintf(stderr, "hvtrace attach: %.*s needs a value\n", static_cast<int>(flag.size()), flag.data());
      return -1;
    }
    if (flag == "--qmp") {
      p.args["qmp"] = v;
    } else if (flag == "--events") {
      p.args["events"] = v;
    } else if (flag == "--size") {
      auto mib = ParseSizeMib(v);
      if (!mib) {
        std::fprintf(stderr, "hvtrace attach: --size wants MiB (16, 16M, 1G), not '%s'\n", v);
        return -1;
      }
      p.args["size_mib"] = *mib;
    } else if (flag == "--pump-ms" || flag == "--wait-ms") {
      auto n = ParseNumber(v);
      if (!n) {
        std::fprintf(stderr, "hvtrace attach: %.*s wants a number, not '%s'\n", static_cast<int>(flag.size()),
                     flag.data(), v);
        return -1;
      }
      p.args[flag == "--pump-ms" ? "pump_interval_ms" : "wait_ms"] = *n;
    } else {
      std::fprintf(stderr, "hvtrace attach: unknown flag %.*s\n", static_cast<int>(flag.size()), flag.data());
      return -1;
    }
    return 1;
  });
  if (!ok) return 2;
  const uint64_t wait_ms = p.args.value("wait_ms", uint64_t{30000});
  auto result = CallOnce("attach", p, "attach", std::chrono::milliseconds(wait_ms + 30000));
  if (!result) return 1;
  if (p.json_output) {
    std::printf("%s\n", result->dump(2).c_str());
    return (*result)["guest"].is_null() ? 1 : 0;
  }
  const json& region = (*result)["region"];
  std::printf("%s: region %s (%llu MiB) plugged as %s in %.1f ms\n", p.positional[0].c_str(),
              region.value("file", std::string()).c_str(),
              static_cast<unsigned long long>(region.value("size", uint64_t{0}) >> 20),
              result->value("/device/id"_json_pointer, std::string()).c_str(), result->value("plug_ms", 0.0));
  const json& guest = (*result)["guest"];
  if (guest.is_null()) {
    std::fprintf(stderr, "hvtrace attach: %s\n", result->value("note", std::string("no agent announced")).c_str());
    return 1;
  }
  std::printf("guest: kernel %s, %u CPU(s), boot id %s (generation %llu), agent pid %u, clock %s; "
              "announced %.1f ms after the plug\n",
              guest.value("kernel_release", std::string()).c_str(), guest.value("nr_cpus", 0u),
              guest.value("boot_id", std::string()).c_str(),
              static_cast<unsigned long long>(guest.value("boot_generation", uint64_t{0})),
              guest.value("agent_pid", 0u), guest.value("trace_clock", std::string()).c_str(),
              result->value("announce_ms", 0.0));
  return 0;
}

int RunDetach(int argc, char** argv) {
  Parsed p;
  bool ok = Parse("detach", kDetachUsage, argc, argv, p, [&](std::string_view flag, const char* v) -> int {
    if (flag == "--timeout-ms" && v != nullptr) {
      auto n = ParseNumber(v);
      if (!n) return -1;
      p.args["timeout_ms"] = *n;
      return 1;
    }
    std::fprintf(stderr, "hvtrace detach: unknown flag or missing value: %.*s\n", static_cast<int>(flag.size()),
                 flag.data());
    return -1;
  });
  if (!ok) return 2;
  const uint64_t timeout = p.args.value("timeout_ms", uint64_t{10000});
  auto result = CallOnce("detach", p, "detach", std::chrono::milliseconds(timeout + 15000));
  if (!result) return 1;
  if (p.json_output) {
    std::printf("%s\n", result->dump(2).c_str());
    return 0;
  }
  std::printf("%s: %s unplugged (DEVICE_DELETED after %.1f ms); region %s kept for captures\n",
              p.positional[0].c_str(), result->value("device", std::string()).c_str(),
              result->value("device_deleted_ms", 0.0),
              result->value("/region/file"_json_pointer, std::string()).c_str());
  if (result->contains("object_del_error")) {
    std::fprintf(stderr, "hvtrace detach: warning: object-del %s\n",
                 (*result)["object_del_error"].get<std::string>().c_str());
  }
  return 0;
}

namespace {

void OnInterrupt(int) {
  // The daemon sees the socket close and stops this stream.
  static const char kMsg[] = "\nhvtrace stream: interrupted\n";
  ssize_t ignored = ::write(STDERR_FILENO, kMsg, sizeof kMsg - 1);
  (void)ignored;
  ::_exit(0);
}

}  // namespace

int RunStream(int argc, char** argv) {
  Parsed p;
  bool ok = Parse("stream", kStreamUsage, argc, argv, p, [&](std::string_view flag, const char* v) -> int {
    if (flag == "--format" && v != nullptr) {
      if (std::strcmp(v, "text") != 0 && std::strcmp(v, "json") != 0) {
        std::fprintf(stderr, "hvtrace stream: --format is text or json, not '%s'\n", v);
        return -1;
      }
      p.args["format"] = v;
      return 1;
    }
    if (flag == "--from-start") {
      p.args["from"] = "start";
      return 0;
    }
    std::fprintf(stderr, "hvtrace stream: unknown flag or missing value: %.*s\n", static_cast<int>(flag.size()),
                 flag.data());
    return -1;
  });
  if (!ok) return 2;
  ::signal(SIGINT, OnInterrupt);
  ::signal(SIGTERM, OnInterrupt);
  ::signal(SIGPIPE, SIG_IGN);
  auto client = ConnectDaemon("stream", p.socket);
  if (!client.ok()) return 1;
  bool write_failed = false;
  auto reply = client->Call("stream", p.args, std::chrono::hours(24 * 365), [&](const json& item) {
    if (item.contains("text") && item["text"].is_string()) {
      const std::string& text = item["text"].get_ref<const std::string&>();
      if (std::fwrite(text.data(), 1, text.size(), stdout) != text.size() || std::fflush(stdout) != 0) {
        if (!write_failed) ::_exit(1);  // Reader gone (e.g. `| head`).
        write_failed = true;
      }
    } else if (item.contains("note") && item["note"].is_string()) {
      std::fprintf(stderr, "hvtrace stream: %s\n", item["note"].get<std::string>().c_str());
    }
  });
  if (!reply.ok()) {
    std::fprintf(stderr, "hvtrace stream: %s\n", reply.error().message.c_str());
    return 1;
  }
  if (!reply->ok) {
    std::fprintf(stderr, "hvtrace stream: %s\n", reply->error.c_str());
    return 1;
  }
  std::fprintf(stderr, "hvtrace stream: ended: %s (%llu events, %llu pages missed)\n",
               reply->result.value("reason", std::string("?")).c_str(),
               static_cast<unsigned long long>(reply->result.value("events", uint64_t{0})),
               static_cast<unsigned long long>(reply->result.value("pages_missed", uint64_t{0})));
  return 0;
}

}  // namespace hvtrace::cli
