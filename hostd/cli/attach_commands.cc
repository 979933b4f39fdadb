// CLI commands for attach mode, all through hvtraced:
//   attach NAME [--qmp SOCK] [--size 16M] [--events LIST] [--pump 50ms] [--wait 30s]
//   detach NAME [--timeout 10s]
//   stream NAME [--json | --format text|json] [--from-start]
// The daemon owns the region files (root-owned under /dev/shm), so `stream`
// gets decoded lines over the control socket rather than mapping the file.
// libvirt-attach / libvirt-detach are hidden old names of attach / detach:
// hvtraced adopts the libvirt domain and hot-plugs the region itself, so
// this binary never talks to libvirt.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>

#include "attach_reply.h"
#include "command.h"
#include "command_table.h"
#include "daemon_call.h"
#include "replies.h"
#include "requests.h"

namespace hvtrace::cli {
namespace {

using nlohmann::json;
using std::chrono::milliseconds;

constexpr uint64_t kMiB = 1ull << 20;

// How much longer than its own wait the CLI waits for a reply.
constexpr milliseconds kAttachReplySlack = std::chrono::seconds(30);
constexpr milliseconds kDetachReplySlack = std::chrono::seconds(15);

// The flags `libvirt-attach` / `libvirt-detach` took when they called libvirt
// from the CLI. hvtraced now names the region (/dev/shm/hvtrace-NAME-attach)
// and uses its own libvirt_uri; the flags are accepted and said to be ignored.
struct LegacyLibvirtFlags {
  std::string shm, uri;
  bool replace_stale = false;

  void Define(CLI::App& app, bool attach) {
    app.add_option("--shm", shm)->group("");
    app.add_option("--uri", uri)->group("");
    if (attach) app.add_flag("--replace-stale", replace_stale)->group("");
  }
  void Note(const std::string& command) const {
    if (shm.empty() && uri.empty() && !replace_stale) return;
    std::fprintf(
        stderr,
        "hvtrace %s: now `hvtrace %s` through hvtraced; --shm, --uri and --replace-stale are "
        "ignored (the region is /dev/shm/hvtrace-NAME-attach, the URI hvtraced's libvirt_uri)\n",
        command.c_str(), command.substr(command.find('-') + 1).c_str());
  }
};

class AttachCommand final : public Command {
 public:
  explicit AttachCommand(bool legacy = false) : legacy_(legacy) {}

  void Define(CLI::App& app) override {
    AddVmName(app, request_.name, "the VM (hvtraced's name for it, or a running libvirt domain)");
    app.add_option("--qmp", qmp_,
                   "adopt the QEMU whose QMP socket this is, if hvtraced does not watch it yet")
        ->type_name("SOCK");
    AddSizeOption(
        app, "--size", kMiB, kMiB, [this](uint64_t mib) { request_.size_mib = mib; },
        "the region, a power of two (default 16M; a bare number is MiB)");
    app.add_option("--events", request_.events,
                   "kernel events for the agent to pump: SYSTEM:EVENT or SYSTEM:*, comma separated "
                   "(trace_marker writes and direct-write events always come)")
        ->type_name("LIST");
    AddDurationOption(
        app, "--pump", "--pump-ms", milliseconds(1), std::chrono::minutes(1),
        [this](milliseconds d) { request_.pump_interval_ms = static_cast<uint64_t>(d.count()); },
        "how often the agent pushes kernel events (default 50ms)");
    // libvirt-attach's --timeout-ms (DEVICE_ADDED) is the nearest thing to --wait.
    AddDurationOption(
        app, "--wait", legacy_ ? "--wait-ms,--timeout-ms" : "--wait-ms", milliseconds(0),
        std::chrono::minutes(10),
        [this](milliseconds d) { request_.wait_ms = static_cast<uint64_t>(d.count()); },
        "how long to wait for the guest agent to announce itself (default 30s)");
    if (legacy_) legacy_flags_.Define(app, /*attach=*/true);
    AddDaemonFlags(app, flags_);
    app.footer(
        "Hot-plugs an ivshmem-plain region into the running VM and waits for hvtrace-agent in the\n"
        "guest to announce itself; without an agent in time the device stays plugged and attach\n"
        "exits 1. A name hvtraced does not watch is adopted: with --qmp as that QEMU, without it\n"
        "as the libvirt domain of that name.");
  }
  std::optional<DaemonRequest> Request() const override {
    hostd::AttachRequest r = request_;
    if (!qmp_.empty()) r.qmp = std::filesystem::absolute(qmp_).string();
    return ToDaemonRequest(r, r.wait() + kAttachReplySlack);
  }
  int Run() override {
    if (legacy_) legacy_flags_.Note(name());
    json result;
    hostd::AttachReply attached;
    if (int rc = CallDaemon(name(), flags_.socket, *Request(), &result, &attached); rc != kExitOk)
      return rc;
    if (flags_.json) {
      PrintJson(result);
      return attached.guest ? kExitOk : kExitFailed;
    }
    std::printf("%s: region %s (%llu MiB) plugged as %s in %.1f ms\n", request_.name.c_str(),
                attached.region.file.c_str(),
                static_cast<unsigned long long>(attached.region.size >> 20),
                attached.device.id.c_str(), attached.plug_ms);
    if (!attached.guest) {
      std::fprintf(stderr, "hvtrace %s: %s\n", name().c_str(),
                   attached.note.value_or("no agent announced").c_str());
      return kExitFailed;
    }
    const hostd::AgentAnnouncement& guest = *attached.guest;
    std::printf(
        "guest: kernel %s, %u CPU(s), boot id %s (generation %llu), agent pid %u, clock %s; "
        "announced %.1f ms after the plug\n",
        guest.kernel_release.c_str(), guest.nr_cpus, guest.boot_id.c_str(),
        static_cast<unsigned long long>(guest.boot_generation), guest.agent_pid,
        guest.trace_clock.c_str(), attached.announce_ms.value_or(0.0));
    return kExitOk;
  }

 private:
  bool legacy_;
  hostd::AttachRequest request_;
  std::string qmp_;
  DaemonFlags flags_;
  LegacyLibvirtFlags legacy_flags_;
};

class DetachCommand final : public Command {
 public:
  explicit DetachCommand(bool legacy = false) : legacy_(legacy) {}

  void Define(CLI::App& app) override {
    AddVmName(app, request_.name);
    AddDurationOption(
        app, "--timeout", "--timeout-ms", milliseconds(1), std::chrono::minutes(10),
        [this](milliseconds d) { request_.timeout_ms = static_cast<uint64_t>(d.count()); },
        "how long the guest may take to release the device (default 10s)");
    if (legacy_) legacy_flags_.Define(app, /*attach=*/false);
    AddDaemonFlags(app, flags_);
    app.footer(
        "Unplugs the region (device_del, waits for DEVICE_DELETED / DEVICE_REMOVED, object-del).\n"
        "hvtraced keeps the region mapped: `hvtrace capture NAME` still reads it.");
  }
  std::optional<DaemonRequest> Request() const override {
    return ToDaemonRequest(request_, request_.timeout() + kDetachReplySlack);
  }
  int Run() override {
    if (legacy_) legacy_flags_.Note(name());
    json result;
    hostd::DetachReply detached;
    if (int rc = CallDaemon(name(), flags_.socket, *Request(), &result, &detached); rc != kExitOk)
      return rc;
    if (flags_.json) {
      PrintJson(result);
      return kExitOk;
    }
    std::printf("%s: %s unplugged (DEVICE_DELETED after %.1f ms); region %s kept for captures\n",
                request_.name.c_str(), detached.device.c_str(), detached.device_deleted_ms,
                detached.region.file.c_str());
    if (detached.object_del_error) {
      std::fprintf(stderr, "hvtrace %s: warning: object-del %s\n", name().c_str(),
                   detached.object_del_error->c_str());
    }
    return kExitOk;
  }

 private:
  bool legacy_;
  hostd::DetachRequest request_;
  DaemonFlags flags_;
  LegacyLibvirtFlags legacy_flags_;
};

void OnInterrupt(int) {
  // The daemon sees the socket close and stops this stream.
  static const char kMsg[] = "\nhvtrace stream: interrupted\n";
  ssize_t ignored = ::write(STDERR_FILENO, kMsg, sizeof kMsg - 1);
  (void)ignored;
  ::_exit(0);
}

class StreamCommand final : public Command {
 public:
  void Define(CLI::App& app) override {
    AddVmName(app, name_);
    AddFormatFlags(app, json_);
    app.add_flag("--from-start", from_start_, "begin with what the region already holds");
    AddDaemonFlags(app, flags_, /*json=*/false);
    app.footer(
        "Prints the attached region's events live, as `trace-cmd report` does (or JSON lines).\n"
        "Ctrl-C ends it; so does the VM going away or the region being detached.");
  }
  std::optional<DaemonRequest> Request() const override {
    hostd::StreamRequest r;
    r.name = name_;
    if (json_) r.format = "json";
    if (from_start_) r.from = "start";
    return ToDaemonRequest(r, std::chrono::hours(24 * 365));
  }
  int Run() override {
    ::signal(SIGINT, OnInterrupt);
    ::signal(SIGTERM, OnInterrupt);
    ::signal(SIGPIPE, SIG_IGN);
    json result;
    hostd::StreamEndReply end;
    const int rc =
        CallDaemon(name(), flags_.socket, *Request(), &result, &end, [this](const json& item) {
          auto chunk = hostd::ParseMessage<hostd::StreamChunk>(item, "item");
          if (!chunk.ok()) {
            std::fprintf(stderr, "hvtrace %s: %s\n", name().c_str(), chunk.error().message.c_str());
            return;
          }
          if (chunk->text) {
            const std::string& text = *chunk->text;
            if (std::fwrite(text.data(), 1, text.size(), stdout) != text.size() ||
                std::fflush(stdout) != 0) {
              ::_exit(kExitFailed);  // Reader gone (e.g. `| head`).
            }
          }
          if (chunk->note)
            std::fprintf(stderr, "hvtrace %s: %s\n", name().c_str(), chunk->note->c_str());
        });
    if (rc != kExitOk) return rc;
    std::fprintf(stderr, "hvtrace %s: ended: %s (%llu events, %llu pages missed)\n", name().c_str(),
                 end.reason.c_str(), static_cast<unsigned long long>(end.events),
                 static_cast<unsigned long long>(end.pages_missed));
    return kExitOk;
  }

 private:
  std::string name_;
  bool json_ = false;
  bool from_start_ = false;
  DaemonFlags flags_;
};

}  // namespace

void AddAttachCommands(CommandTable& table) {
  table.Add("attach", "hot-plug a trace region into a running VM; the guest agent fills it",
            std::make_unique<AttachCommand>());
  table.Add("detach", "unplug the region again (captures still read it)",
            std::make_unique<DetachCommand>());
  table.Add("stream", "print an attached VM's events live (trace-cmd text or JSON lines)",
            std::make_unique<StreamCommand>());
  table.Add("libvirt-attach", "old name of `attach` for libvirt domains",
            std::make_unique<AttachCommand>(true), nullptr, /*hidden=*/true);
  table.Add("libvirt-detach", "old name of `detach` for libvirt domains",
            std::make_unique<DetachCommand>(true), nullptr, /*hidden=*/true);
}

}  // namespace hvtrace::cli
