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
#include "replies.h"
#include "requests.h"
#include "show_crash.h"
#include "upload_stats.h"

namespace hvtrace::cli {
namespace {

using nlohmann::json;

std::string Str(const json& j, const char* key, const char* fallback = "-") {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  if (it->is_string()) return it->get<std::string>();
  return hostd::DumpJson(*it);
}

const char* Or(const std::optional<std::string>& s, const char* fallback = "-") {
  return s ? s->c_str() : fallback;
}

// A command that sends one request (|Message|, requests.h) and prints the
// reply (|Reply|, replies.h) as text, or as JSON with --json.
template <class Message, class Reply>
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
    Reply reply;
    if (int rc = CallDaemon(name(), flags_.socket, *Request(), &result, &reply); rc != kExitOk)
      return rc;
    round_trip_ms_ =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started)
            .count();
    if (flags_.json) {
      PrintJson(result);
      return kExitOk;
    }
    return PrintText(reply);
  }

 protected:
  virtual int PrintText(const Reply& reply) const = 0;
  const Message& message() const { return message_; }
  double round_trip_ms() const { return round_trip_ms_; }

 private:
  static constexpr bool kTakesName = requires(Message m) { m.name; };
  Message message_;
  DaemonFlags flags_;
  double round_trip_ms_ = 0;
};

class PingCommand final : public QueryCommand<hostd::PingRequest, hostd::PingReply> {
 public:
  int PrintText(const hostd::PingReply& pong) const override {
    std::printf("hvtraced (pid %d) is up for %.1f s; round trip %.2f ms\n", pong.pid,
                static_cast<double>(pong.uptime_ms) / 1000.0, round_trip_ms());
    // The fleet upload (docs/fleet.md): what waits, and why.
    hostd::UploadStats upload;
    if (int rc = ParseReply(name(), pong.upload, &upload); rc != kExitOk) return rc;
    if (!upload.enabled) return kExitOk;
    std::printf("upload to %s/%s: %llu pending, %llu uploaded", upload.endpoint.c_str(),
                upload.bucket.c_str(), static_cast<unsigned long long>(upload.pending),
                static_cast<unsigned long long>(upload.uploaded));
    if (upload.given_up > 0)
      std::printf(", %llu given up", static_cast<unsigned long long>(upload.given_up));
    if (!upload.last_error.empty()) {
      std::printf("; last error (%s): %s", upload.last_error_at.c_str(), upload.last_error.c_str());
    }
    std::printf("\n");
    for (const hostd::UploadCaptureState& c : upload.captures) {
      if (c.state == "uploaded") continue;
      std::printf("  %s/%s %s, %llu attempt(s)%s%s\n", c.vm.c_str(), c.id.c_str(), c.state.c_str(),
                  static_cast<unsigned long long>(c.attempts), c.last_error.empty() ? "" : ": ",
                  c.last_error.c_str());
    }
    return kExitOk;
  }
};

class ListCommand final : public QueryCommand<hostd::ListRequest, hostd::ListReply> {
 public:
  int PrintText(const hostd::ListReply& list) const override {
    if (list.vms.empty()) {
      std::printf("no VMs\n");
      return kExitOk;
    }
    std::printf("%-20s %-8s %-10s %8s  %-32s %s\n", "NAME", "KIND", "STATE", "CAPTURES",
                "LAST CAPTURE", "LAST ERROR");
    for (const hostd::VmStatusReply& vm : list.vms) {
      std::printf("%-20s %-8s %-10s %8llu  %-32s %s\n", vm.name.c_str(), vm.kind.c_str(),
                  vm.state.c_str(), static_cast<unsigned long long>(vm.captures_taken),
                  vm.last_capture ? vm.last_capture->id.c_str() : "-", Or(vm.last_error));
    }
    return kExitOk;
  }
};

class StatusCommand final : public QueryCommand<hostd::StatusRequest, hostd::VmStatusReply> {
 public:
  int PrintText(const hostd::VmStatusReply& vm) const override {
    const auto row = [](const char* key, const std::string& value) {
      std::printf("%-16s %s\n", key, value.c_str());
    };
    const auto count = [](uint64_t n) { return std::to_string(n); };
    row("name", vm.name);
    row("kind", vm.kind);
    row("state", vm.state);
    row("formats", Or(vm.formats));
    row("last_event", Or(vm.last_event));
    row("events_seen", count(vm.events_seen));
    row("captures_taken", count(vm.captures_taken));
    row("captures_failed", count(vm.captures_failed));
    row("last_capture", vm.last_capture ? hostd::DumpJson(hostd::MessageToJson(*vm.last_capture))
                                        : std::string("-"));
    row("last_error", Or(vm.last_error));
    row("captures_dir", vm.captures_dir);
    // The metadata channel (hvtrace/meta_channel.h): what decodes a
    // disk-booted guest's captures.
    const json& meta = vm.meta;
    if (!meta.is_object()) {
      row("meta", "none");
      return kExitOk;
    }
    const auto n = [&](const char* key) { return meta.value(key, uint64_t{0}); };
    std::printf("%-16s %s, %llu boots accepted, %llu refused%s\n", "meta",
                Str(meta, "state").c_str(), static_cast<unsigned long long>(n("boots_accepted")),
                static_cast<unsigned long long>(n("boots_refused")),
                meta.contains("last_refusal")
                    ? (" (last: " + Str(meta, "last_refusal") + ")").c_str()
                    : "");
    return kExitOk;
  }
};

class CapturesCommand final : public QueryCommand<hostd::CapturesRequest, hostd::CapturesReply> {
 public:
  int PrintText(const hostd::CapturesReply& reply) const override {
    if (!reply.captures.is_array() || reply.captures.empty()) {
      std::printf("no captures for %s\n", message().name.c_str());
      return kExitOk;
    }
    std::printf("%-36s %-12s %10s %9s  %-40s %s\n", "CAPTURE", "TRIGGER", "EVENTS", "BAD PAGES",
                "CRASH", "PATH");
    for (const json& c : reply.captures) {
      if (c.contains("error")) {
        std::printf("%-36s damaged: %s\n", Str(c, "id").c_str(), Str(c, "error").c_str());
        continue;
      }
      json totals = c.value("totals", json::object());
      std::printf("%-36s %-12s %10s %9s  %-40s %s\n", Str(c, "id").c_str(),
                  Str(c, "trigger").c_str(), Str(totals, "events").c_str(),
                  Str(totals, "bad_pages").c_str(), CrashReasonColumn(c, 40).c_str(),
                  Str(c, "path").c_str());
    }
    return kExitOk;
  }
};

class DaemonShutdownCommand final
    : public QueryCommand<hostd::ShutdownRequest, hostd::ShutdownReply> {
 public:
  int PrintText(const hostd::ShutdownReply&) const override {
    std::printf("hvtraced is stopping\n");
    return kExitOk;
  }
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
