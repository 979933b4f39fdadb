#include "command.h"

#include <algorithm>
#include <cstdio>

#include "control_protocol.h"
#include "state_dir.h"
#include "units.h"

namespace hvtrace::cli {

int ExitCodeForDaemonError(std::string_view code) {
  if (code == hostd::kErrBadRequest) return kExitUsage;
  if (code == hostd::kErrUnknownVm || code == hostd::kErrUnknownCapture) return kExitUnknownVm;
  if (code == hostd::kErrBusy) return kExitBusy;
  if (code == hostd::kErrDenied) return kExitDenied;
  // vm_failed, internal, too_large, unknown_command (an older hvtraced), and
  // codes this CLI does not know yet.
  return kExitFailed;
}

const char* ExitStatusHelp() {
  return "Exit status (every command):\n"
         "  0  ok\n"
         "  1  failed: hvtraced answered vm_failed or internal, or a local step failed;\n"
         "     report/show: nothing could be read\n"
         "  2  usage: unknown command or flag, bad value, missing argument; or a\n"
         "     request hvtraced refused as bad_request\n"
         "  3  report --strict: the file had problems (good events were still printed)\n"
         "  4  hvtraced knows no VM of that name (unknown_vm), or no such capture\n"
         "     (unknown_capture)\n"
         "  5  hvtraced is not reachable on its socket, or did not answer in time\n"
         "  6  hvtraced is busy with an earlier request for that VM (busy): try again\n"
         "  7  hvtraced refused this user (permission_denied), or this user cannot read\n"
         "     an input file (boot --kernel/--initrd, adopt --boot-region)\n";
}

void AddDaemonFlags(CLI::App& app, DaemonFlags& flags, bool json) {
  app.add_option("--socket", flags.socket,
                 "hvtraced's control socket (default: $HVTRACE_SOCKET, the config file's socket, "
                 "/run/hvtrace/hvtraced.sock)")
      ->type_name("PATH");
  if (json) app.add_flag("--json", flags.json, "print hvtraced's reply as JSON");
}

CLI::Option* AddVmName(CLI::App& app, std::string& name, const std::string& what) {
  return app
      .add_option_function<std::string>(
          "NAME",
          [&name](const std::string& v) {
            if (Status s = hostd::ValidateVmName(v); !s.ok())
              throw CLI::ValidationError("NAME", s.error().message);
            name = v;
          },
          what)
      ->required()
      ->type_name("");
}

CLI::Option* AddSizeOption(CLI::App& app, const std::string& flag, uint64_t bare_unit,
                           uint64_t granule, std::function<void(uint64_t)> store,
                           const std::string& help) {
  return app
      .add_option_function<std::string>(
          flag,
          [flag, bare_unit, granule, store = std::move(store)](const std::string& v) {
            Result<uint64_t> bytes = hostd::ParseSize(v, bare_unit);
            if (!bytes.ok()) throw CLI::ValidationError(flag, bytes.error().message);
            if (*bytes % granule != 0) {
              throw CLI::ValidationError(flag, "size '" + v + "' is not a whole number of " +
                                                   hostd::SizeText(granule) + " units");
            }
            store(*bytes / granule);
          },
          help)
      ->type_name("SIZE");
}

namespace {

// One duration option; |names| may be several ("--a,--b"), and messages
// name them all ("--a/--b").
CLI::Option* AddOneDuration(CLI::App& app, const std::string& names,
                            std::chrono::milliseconds bare_unit, std::chrono::milliseconds min,
                            std::chrono::milliseconds max,
                            std::function<void(std::chrono::milliseconds)> store,
                            const std::string& help) {
  std::string label = names;
  std::replace(label.begin(), label.end(), ',', '/');
  return app
      .add_option_function<std::string>(
          names,
          [label, bare_unit, min, max, store = std::move(store)](const std::string& v) {
            Result<std::chrono::milliseconds> d = hostd::ParseDuration(v, bare_unit);
            if (!d.ok()) throw CLI::ValidationError(label, d.error().message);
            if (*d < min || *d > max) {
              throw CLI::ValidationError(label, "duration '" + v + "' is outside " +
                                                    std::to_string(min.count()) + "ms.." +
                                                    std::to_string(max.count()) + "ms");
            }
            store(*d);
          },
          help)
      ->type_name("DURATION");
}

}  // namespace

void AddDurationOption(CLI::App& app, const std::string& flag, const std::string& ms_alias,
                       std::chrono::milliseconds min, std::chrono::milliseconds max,
                       std::function<void(std::chrono::milliseconds)> store,
                       const std::string& help) {
  AddOneDuration(app, flag, std::chrono::seconds(1), min, max, store, help);
  if (!ms_alias.empty()) {
    AddOneDuration(app, ms_alias, std::chrono::milliseconds(1), min, max, store, "")->group("");
  }
}

CLI::Option* AddCountOption(CLI::App& app, const std::string& flag, uint64_t min, uint64_t max,
                            std::function<void(uint64_t)> store, const std::string& help) {
  return app
      .add_option_function<std::string>(
          flag,
          [flag, min, max, store = std::move(store)](const std::string& v) {
            uint64_t n = 0;
            bool ok = !v.empty() && v.size() <= 19;
            for (char c : v) {
              ok = ok && c >= '0' && c <= '9';
              if (ok) n = n * 10 + static_cast<uint64_t>(c - '0');
            }
            if (!ok || n < min || n > max) {
              throw CLI::ValidationError(flag, "'" + v + "' is not a number from " +
                                                   std::to_string(min) + " to " +
                                                   std::to_string(max));
            }
            store(n);
          },
          help)
      ->type_name("N");
}

void AddFormatFlags(CLI::App& app, bool& json) {
  auto* format =
      app.add_option_function<std::string>(
             "-f,--format", [&json](const std::string& v) { json = v == "json"; },
             "output: text (as trace-cmd report prints it, the default) or json (one object per "
             "line)")
          ->type_name("text|json")
          ->check([](const std::string& v) {
            return v == "text" || v == "json" ? std::string() : "'" + v + "' is not text or json";
          });
  app.add_flag("--json", json, "the same as --format json")->excludes(format);
}

void PrintJson(const nlohmann::json& value) {
  std::printf("%s\n", value.dump(2, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
}

}  // namespace hvtrace::cli
