// CLI commands for QEMU guests hvtraced watches: boot, qemu-args, adopt,
// capture, stop. All but qemu-args talk to hvtraced (--socket PATH, else
// $HVTRACE_SOCKET, the config file's socket, /run/hvtrace/hvtraced.sock).
#include <cerrno>
#include <chrono>
#include <filesystem>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "boot_request.h"
#include "commands.h"
#include "config.h"
#include "control_client.h"
#include "daemon_call.h"
#include "formats_cache.h"
#include "state_dir.h"

namespace hvtrace::cli {
namespace {

using hostd::BootRequest;
using nlohmann::json;

// boot may probe KVM and waits for QEMU's QMP socket; capture copies and fsyncs.
constexpr auto kReplyTimeout = std::chrono::seconds(60);

std::optional<json> Call(const char* command, const std::string& socket_flag, std::string_view cmd,
                         const json& args) {
  return CallDaemon(command, socket_flag, cmd, args, kReplyTimeout);
}

struct BootArgs {
  BootRequest request;
  std::string socket;
  bool json_output = false;
  bool harvest = true;
  std::string run_dir = "/run/hvtrace";
};

const char* kBootUsage =
    "NAME --kernel K [--initrd I] [--append ARGS] [--cpus N] [--memory MIB]\n"
    "          [--trace-size MIB] [--events LIST] [--accel auto|tcg|kvm] [--no-harvest]\n"
    "          [--socket PATH] [--json]\n"
    "  --events LIST   trace_instance events (default: the boot sequence,\n"
    "                  " "see README); SYSTEM:EVENT or SYSTEM, comma separated";

bool ParseBoot(const char* command, int argc, char** argv, BootArgs& out) {
  std::vector<std::string> positional;
  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i];
    auto value = [&](std::string& dst) {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "hvtrace %s: %s needs a value\n", command, argv[i]);
        return false;
      }
      dst = argv[++i];
      return true;
    };
    auto number = [&](uint64_t& dst) {
      std::string v;
      if (!value(v)) return false;
      char* end = nullptr;
      errno = 0;
      unsigned long long n = std::strtoull(v.c_str(), &end, 10);
      if (v.empty() || *end != '\0' || errno != 0) {
        std::fprintf(stderr, "hvtrace %s: %s wants a number, not '%s'\n", command, argv[i - 1], v.c_str());
        return false;
      }
      dst = n;
      return true;
    };
    uint64_t n = 0;
    if (arg == "-h" || arg == "--help") {
      std::printf("usage: hvtrace %s %s\n", command, kBootUsage);
      std::exit(0);
    } else if (arg == "--kernel") {
      if (!value(out.request.kernel)) return false;
    } else if (arg == "--initrd") {
      if (!value(out.request.initrd)) return false;
    } else if (arg == "--append") {
      if (!value(out.request.append)) return false;
    } else if (arg == "--events") {
      if (!value(out.request.events)) return false;
    } else if (arg == "--accel") {
      if (!value(out.request.accel)) return false;
    } else if (arg == "--socket") {
      if (!value(out.socket)) return false;
    } else if (arg == "--run-dir") {
      if (!value(out.run_dir)) return false;
    } else if (arg == "--cpus") {
      if (!number(n)) return false;
      out.request.cpus = static_cast<int>(n);
    } else if (arg == "--memory") {
      if (!number(out.request.memory_mib)) return false;
    } else if (arg == "--trace-size") {
      if (!number(out.request.trace_size_mib)) return false;
    } else if (arg == "--json") {
      out.json_output = true;
    } else if (arg == "--no-harvest") {
      out.harvest = false;
    } else if (arg.starts_with("-")) {
      std::fprintf(stderr, "hvtrace %s: unknown option '%s'\n", command, argv[i]);
      return false;
    } else {
      positional.emplace_back(arg);
    }
  }
  if (positional.size() != 1 || out.request.kernel.empty()) {
    std::fprintf(stderr, "usage: hvtrace %s %s\n", command, kBootUsage);
    return false;
  }
  out.request.name = positional[0];
  if (auto s = hostd::ValidateVmName(out.request.name); !s.ok()) {
    std::fprintf(stderr, "hvtrace %s: %s\n", command, s.error().message.c_str());
    return false;
  }
  // The daemon resolves paths in its own working directory.
  out.request.kernel = std::filesystem::absolute(out.request.kernel).string();
  if (!out.request.initrd.empty()) out.request.initrd = std::filesystem::absolute(out.request.initrd).string();
  return true;
}

// Harvests the kernel's formats into the CLI's cache unless already there,
// so the capture can be decoded without an agent.
bool EnsureFormats(const BootRequest& r) {
  auto key = hostd::KernelKeyOfFile(r.kernel);
  if (!key.ok()) {
    std::fprintf(stderr, "hvtrace boot: %s\n", key.error().message.c_str());
    return false;
  }
  auto root = hostd::DefaultCacheRoot();
  if (!root.ok()) return true;  // No cache dir: nothing to check.
  auto found = hostd::FormatCache(*root).Lookup(*key);
  if (found.ok() && found->has_value()) return true;
  if (r.initrd.empty()) {
    std::fprintf(stderr, "hvtrace boot: formats for %s are not cached and harvesting needs --initrd\n",
                 r.kernel.c_str());
    return true;
  }
  std::fprintf(stderr, "hvtrace boot: harvesting event formats of %s once (boots it briefly)...\n",
               r.kernel.c_str());
  std::vector<std::string> args = {"formats", "harvest", "--kernel", r.kernel, "--initrd", r.initrd};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  return RunFormats(static_cast<int>(args.size()), argv.data()) == 0;
}

bool ParseNameCommand(const char* command, const char* usage, int argc, char** argv, std::string& name,
                      std::string& socket, bool& json_output, std::vector<std::pair<std::string, std::string*>> opts = {}) {
  std::vector<std::string> positional;
  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i];
    bool matched = false;
    for (auto& [flag, dst] : opts) {
      if (arg == flag) {
        if (i + 1 >= argc) {
          std::fprintf(stderr, "hvtrace %s: %s needs a value\n", command, argv[i]);
          return false;
        }
        *dst = argv[++i];
        matched = true;
      }
    }
    if (matched) continue;
    if (arg == "-h" || arg == "--help") {
      std::printf("usage: hvtrace %s %s\n", command, usage);
      std::exit(0);
    } else if (arg == "--socket") {
      if (i + 1 >= argc) return false;
      socket = argv[++i];
    } else if (arg == "--json") {
      json_output = true;
    } else if (arg.starts_with("-")) {
      std::fprintf(stderr, "hvtrace %s: unknown option '%s'\n", command, argv[i]);
      return false;
    } else {
      positional.emplace_back(arg);
    }
  }
  if (positional.size() != 1) {
    std::fprintf(stderr, "usage: hvtrace %s %s\n", command, usage);
    return false;
  }
  name = positional[0];
  return true;
}

}  // namespace

int RunBoot(int argc, char** argv) {
  BootArgs args;
  if (!ParseBoot("boot", argc, argv, args)) return 2;
  if (args.harvest && !EnsureFormats(args.request)) return 1;
  auto result = Call("boot", args.socket, "boot", args.request.ToJson());
  if (!result) return 1;
  if (args.json_output) {
    std::printf("%s\n", result->dump(2).c_str());
    return 0;
  }
  const json& region = (*result)["region"];
  std::printf("booted %s: QEMU pid %s (%s), boot range %s bytes at GPA 0x%llx in %s\n",
              args.request.name.c_str(), (*result)["pid"].dump().c_str(),
              result->value("kvm", false) ? "KVM" : "TCG", region["size"].dump().c_str(),
              static_cast<unsigned long long>(region.value("gpa", uint64_t{0})),
              region.value("file", std::string()).c_str());
  if (result->contains("kvm_probe")) {
    std::printf("accel auto: %s\n", (*result)["kvm_probe"].get<std::string>().c_str());
  }
  if (result->contains("console_log")) {
    std::printf("console log: %s\nconsole socket: %s\n", (*result)["console_log"].get<std::string>().c_str(),
                result->value("console_socket", std::string()).c_str());
  }
  return 0;
}

int RunQemuArgs(int argc, char** argv) {
  BootArgs args;
  if (!ParseBoot("qemu-args", argc, argv, args)) return 2;
  auto accel = hostd::ParseAccel(args.request.accel);
  if (!accel.ok()) {
    std::fprintf(stderr, "hvtrace qemu-args: %s\n", accel.error().message.c_str());
    return 2;
  }
  hostd::BootPaths paths = hostd::DefaultBootPaths(args.request.name, args.run_dir,
                                                   std::filesystem::path(args.run_dir) / args.request.name);
  auto config = hostd::MakeBootVmConfig(args.request, paths);
  if (!config.ok()) {
    std::fprintf(stderr, "hvtrace qemu-args: %s\n", config.error().message.c_str());
    return 2;
  }
  config->console_log.clear();  // People running QEMU pick their own console.
  config->console_socket.clear();
  config->qemu_log.clear();
  auto plan = hostd::BuildQemuPlan(*config, hostd::ResolveKvm(*accel, config->kernel));
  if (!plan.ok()) {
    std::fprintf(stderr, "hvtrace qemu-args: %s\n", plan.error().message.c_str());
    return 2;
  }
  if (args.json_output) {
    json j = {{"argv", plan->argv}};
    const auto& l = *plan->boot_range;
    j["boot_region"] = paths.backing_file + "@" + std::to_string(l.range_gpa) + ":" + std::to_string(l.range_bytes);
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  std::string line;
  for (const std::string& a : plan->argv) {
    bool quote = a.find_first_of(" $'\"\\,;&|<>()") != std::string::npos;
    std::string q = a;
    if (quote) {
      q = "'";
      for (char c : a) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
      q += "'";
    }
    line += (line.empty() ? "" : " ") + q;
  }
  const auto& l = *plan->boot_range;
  std::printf("%s\n", line.c_str());
  for (size_t i = 0; i + 1 < plan->argv.size(); ++i) {
    if (plan->argv[i] == "-append") std::printf("# kernel parameters: %s\n", plan->argv[i + 1].c_str());
  }
  std::printf("# then: hvtrace adopt %s --qmp %s --boot-region %s@0x%llx:%llu\n", args.request.name.c_str(),
              paths.qmp_socket.c_str(), paths.backing_file.c_str(),
              static_cast<unsigned long long>(l.range_gpa), static_cast<unsigned long long>(l.range_bytes));
  return 0;
}

int RunAdopt(int argc, char** argv) {
  // Without --qmp, NAME is a libvirt domain (libvirt_commands.cc).
  bool has_qmp = false;
  for (int i = 1; i < argc; ++i) has_qmp |= std::string_view(argv[i]) == "--qmp";
  if (!has_qmp) return RunAdoptDomain(argc, argv);
  std::string name, socket, qmp, region;
  bool json_output = false;
  // Without --boot-region the VM has no boot range: `hvtrace attach` gives it a region.
  const char* usage = "NAME --qmp SOCK [--boot-region FILE@GPA:SIZE] [--socket PATH] [--json]";
  if (!ParseNameCommand("adopt", usage, argc, argv, name, socket, json_output,
                        {{"--qmp", &qmp}, {"--boot-region", &region}}) ||
      qmp.empty()) {
    if (qmp.empty()) std::fprintf(stderr, "usage: hvtrace adopt %s\n", usage);
    return 2;
  }
  json adopt_args = {{"name", name}, {"qmp", std::filesystem::absolute(qmp).string()}};
  if (!region.empty()) adopt_args["boot_region"] = region;
  auto result = Call("adopt", socket, "adopt", adopt_args);
  if (!result) return 1;
  if (json_output) {
    std::printf("%s\n", result->dump(2).c_str());
  } else {
    std::printf("adopted %s (QMP %s)\n", name.c_str(), result->value("qmp", std::string()).c_str());
  }
  return 0;
}

int RunCapture(int argc, char** argv) {
  std::string name, socket;
  bool json_output = false;
  if (!ParseNameCommand("capture", "NAME [--socket PATH] [--json]", argc, argv, name, socket, json_output)) return 2;
  auto result = Call("capture", socket, "capture", {{"name", name}});
  if (!result) return 1;
  if (json_output) {
    std::printf("%s\n", result->dump(2).c_str());
  } else {
    std::printf("captured %s: %s (%.1f ms to disk)\n", name.c_str(),
                result->value("capture", std::string()).c_str(), result->value("trigger_to_disk_ms", 0.0));
  }
  return 0;
}

int RunStop(int argc, char** argv) {
  std::string name, socket;
  bool json_output = false;
  if (!ParseNameCommand("stop", "NAME [--socket PATH]", argc, argv, name, socket, json_output)) return 2;
  auto result = Call("stop", socket, "stop", {{"name", name}});
  if (!result) return 1;
  std::printf("stopped watching %s (a VM hvtraced booted is shut down)\n", name.c_str());
  return 0;
}

}  // namespace hvtrace::cli
