// CLI commands that ask hvtraced about itself and its VMs: ping, list,
// status, captures, daemon-shutdown. Each takes --socket PATH and --json
// (print the daemon's result as it came).
#include <chrono>
#include <cstdio>
#include <string>

#include "command.h"
#include "command_table.h"
#include "control_protocol.h"
#include "daemon_call.h"
#include "requests.h"

namespace hvtrace::cli {
namespace {

using nlohmann::json;

std::string Str(const json& j, const char* key, const char* fallback = "-") {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  if (it->is_string()) return it->get<std::string>();
  return hostd::DumpJson(*it);
}

// A command that sends one request (|Message|, requests.h) and prints the
// result as text, or as JSON with --json.
template <class Message>
class QueryCommand : public Command {
 public:
  void Define(CLI::App& app) override {
    if constexpr (kTakesName) AddVmName(app, message_.name);
    AddDaemonFlags(app, flags_);
  }
  std::optional<DaemonRequest> Request() const override { return ToDaemonRequest(message_); }
  int Run() override {
    const auto started = std::chrono::steady_clock::now();
    json result;
    if (int rc = CallDaemon(name(), flags_.socket, *Request(), &result); rc != kExitOk) return rc;
    round_trip_ms_ =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started)
            .count();
    if (flags_.json) {
      PrintJson(result);
    } else {
      PrintText(result);
    }
    return kExitOk;
  }

 protected:
  virtual void PrintText(const json& result) const = 0;
  const Message& message() const { return message_; }
  double round_trip_ms() const { return round_trip_ms_; }

 private:
  static constexpr bool kTakesName = requires(Message m) { m.name; };
  Message message_;
  DaemonFlags flags_;
  double round_trip_ms_ = 0;
};

class PingCommand final : public QueryCommand<hostd::PingRequest> {
 public:
  void PrintText(const json& result) const override {
    std::printf("hvtraced (pid %s) is up for %.1f s; round trip %.2f ms\n",
                Str(result, "pid").c_str(), result.value("uptime_ms", 0) / 1000.0, round_trip_ms());
    // The fleet upload (docs/fleet.md): what waits, and why.
    const json upload = result.value("upload", json::object());
    if (upload.is_object() && upload.value("enabled", false)) {
      std::printf("upload to %s/%s: %s pending, %s uploaded", Str(upload, "endpoint").c_str(),
                  Str(upload, "bucket").c_str(), Str(upload, "pending").c_str(),
                  Str(upload, "uploaded").c_str());
      if (upload.value("given_up", 0) > 0)
        std::printf(", %s given up", Str(upload, "given_up").c_str());
      const std::string error = upload.value("last_error", "");
      if (!error.empty()) {
        std::printf("; last error (%s): %s", Str(upload, "last_error_at").c_str(), error.c_str());
      }
      std::printf("\n");
      for (const json& c : upload.value("captures", json::array())) {
        if (!c.is_object() || c.value("state", "") == "uploaded") continue;
        std::printf(
            "  %s/%s %s, %s attempt(s)%s\n", Str(c, "vm").c_str(), Str(c, "id").c_str(),
            Str(c, "state").c_str(), Str(c, "attempts").c_str(),
            c.value("last_error", "").empty() ? "" : (": " + c.value("last_error", "")).c_str());
      }
    }
  }
};

class ListCommand final : public QueryCommand<hostd::ListRequest> {
 public:
  void PrintText(const json& result) const override {
    const json vms = result.value("vms", json::array());
    if (!vms.is_array() || vms.empty()) {
      std::printf("no VMs\n");
      return;
    }
    std::printf("%-20s %-8s %-10s %8s  %-32s %s\n", "NAME", "KIND", "STATE", "CAPTURES",
                "LAST CAPTURE", "LAST ERROR");
    for (const json& vm : vms) {
      std::string last = "-";
      if (auto it = vm.find("last_capture"); it != vm.end() && it->is_object())
        last = Str(*it, "id");
      std::printf("%-20s %-8s %-10s %8s  %-32s %s\n", Str(vm, "name").c_str(),
                  Str(vm, "kind").c_str(), Str(vm, "state").c_str(),
                  Str(vm, "captures_taken").c_str(), last.c_str(), Str(vm, "last_error").c_str());
    }
  }
};

class StatusCommand final : public QueryCommand<hostd::StatusRequest> {
 public:
  void PrintText(const json& result) const override {
    for (const char* key :
         {"name", "kind", "state", "formats", "last_event", "events_seen", "captures_taken",
          "captures_failed", "last_capture", "last_error", "captures_dir"}) {
      std::printf("%-16s %s\n", key, Str(result, key).c_str());
    }
    // The metadata channel (hvtrace/meta_channel.h): what decodes a
    // disk-booted guest's captures.
    const json meta = result.value("meta", json());
    if (!meta.is_object()) {
      std::printf("%-16s %s\n", "meta", "none");
      return;
    }
    const auto n = [&](const char* key) { return meta.value(key, uint64_t{0}); };
    std::printf("%-16s %s, %llu boots accepted, %llu refused%s\n", "meta",
                Str(meta, "state").c_str(), static_cast<unsigned long long>(n("boots_accepted")),
                static_cast<unsigned long long>(n("boots_refused")),
                meta.contains("last_refusal")
                    ? (" (last: " + Str(meta, "last_refusal") + ")").c_str()
                    : "");
  }
};

class CapturesCommand final : public QueryCommand<hostd::CapturesRequest> {
 public:
  void PrintText(const json& result) const override {
    const json captures = result.value("captures", json::array());
    if (!captures.is_array() || captures.empty()) {
      std::printf("no captures for %s\n", message().name.c_str());
      return;
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
  }
};

class DaemonShutdownCommand final : public QueryCommand<hostd::ShutdownRequest> {
 public:
  void PrintText(const json&) const override { std::printf("hvtraced is stopping\n"); }
};

}  // namespace

void AddDaemonCommands(CommandTable& table) {
  table.Add("ping", "check that hvtraced answers on its control socket",
            std::make_unique<PingCommand>());
  table.Add("list", "list the VMs hvtraced knows and their state", std::make_unique<ListCommand>());
  table.Add("status", "show one VM's state, last event, last capture and last error",
            std::make_unique<StatusCommand>());
  table.Add("captures", "list a VM's captures (newest last)", std::make_unique<CapturesCommand>());
  table.Add("daemon-shutdown", "ask hvtraced to stop cleanly",
            std::make_unique<DaemonShutdownCommand>());
}

}  // namespace hvtrace::cli
