// CLI commands for the guests hvtraced watches: boot, qemu-args, adopt,
// capture, stop. All but qemu-args talk to hvtraced (--socket PATH, else
// $HVTRACE_SOCKET, the config file's socket, /run/hvtrace/hvtraced.sock).
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "boot_request.h"
#include "command.h"
#include "command_table.h"
#include "daemon_call.h"
#include "replies.h"
#include "requests.h"
#include "units.h"

namespace hvtrace::cli {
namespace {

using hostd::BootRequest;
using nlohmann::json;

// boot may probe KVM and waits for QEMU's QMP socket; capture copies and
// fsyncs; adopting a libvirt domain reads its XML.
constexpr std::chrono::milliseconds kVmReplyTimeout = std::chrono::seconds(60);

constexpr uint64_t kMiB = 1ull << 20;

// The flags boot and qemu-args share: what the guest looks like.
void AddBootFlags(CLI::App& app, BootRequest& r) {
  AddVmName(app, r.name);
  app.add_option("--kernel", r.kernel, "the guest kernel (bzImage/vmlinuz)")
      ->required()
      ->type_name("PATH");
  app.add_option_function<std::string>(
         "--initrd", [&r](const std::string& path) { r.initrd = path; }, "its initramfs")
      ->type_name("PATH");
  app.add_option("--append", r.append, "more kernel parameters")->type_name("ARGS");
  AddCountOption(
      app, "--cpus", 1, INT32_MAX, [&r](uint64_t n) { r.cpus = static_cast<int>(n); },
      "vCPUs (default 2)");
  AddSizeOption(
      app, "--memory", kMiB, kMiB, [&r](uint64_t mib) { r.memory_mib = mib; },
      "guest memory, 1088M by default (a bare number is MiB)");
  AddSizeOption(
      app, "--trace-size", kMiB, kMiB, [&r](uint64_t mib) { r.trace_size_mib = mib; },
      "the host-backed boot trace range, 16M by default (a bare number is MiB)");
  app.add_option(
         "--events", r.events,
         "trace_instance events, SYSTEM:EVENT or SYSTEM, comma separated (default: the boot "
         "sequence, see README)")
      ->type_name("LIST");
  app.add_flag("--trace-boot", r.trace_boot,
               "also record QEMU's own handshake events (fw_cfg, virtio status, PCI config "
               "writes) from QEMU's start into <vm dir>/qemu-trace.log; captures carry them");
  app.add_option("--vmcore", r.vmcore,
                 "off | on-panic: a panic capture also holds a kdump-compressed dump of guest "
                 "memory (default: the daemon's vmcore setting)")
      ->check(CLI::IsMember({"off", "on-panic"}));
  app.add_option("--device", r.devices,
                 "add a handshake device with a host-private backend: virtio-blk (a null "
                 "disk), virtio-net (isolated user net), virtio-serial; repeatable")
      ->type_name("DEV")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll)
      ->allow_extra_args(false);
  app.add_option("--accel", r.accel,
                 "auto (KVM only when it proves usable; the default), tcg or kvm")
      ->type_name("auto|tcg|kvm")
      ->check([](const std::string& v) {
        auto a = hostd::ParseAccel(v);
        return a.ok() ? std::string() : a.error().message;
      });
}

// The ranges hvtraced enforces, checked before anything is sent or booted.
Status CheckBootRequest(const BootRequest& r) {
  // Through text, as hvtraced receives it (a parsed 4 is unsigned, ToJson's int is not).
  auto checked = hostd::ParseMessage<BootRequest>(json::parse(hostd::MessageToJson(r).dump()));
  if (checked.ok()) return {};
  std::string why = checked.error().message;  // "boot: args.cpus = 99 is outside 1..64"
  if (why.starts_with("boot: ")) why.erase(0, 6);
  return Error{why};
}

// The daemon resolves paths in its own working directory.
std::string Absolute(const std::string& path) {
  return path.empty() ? path : std::filesystem::absolute(path).string();
}

class BootCommand final : public Command {
 public:
  void Define(CLI::App& app) override {
    AddBootFlags(app, request_);
    app.add_flag(
        "!--no-harvest", harvest_,
        "do not wait for hvtraced to harvest the kernel's event formats into its cache first "
        "(it still harvests them in the background; a panic before that keeps region.bin)");
    AddDaemonFlags(app, flags_);
  }
  Status Check() const override { return CheckBootRequest(request_); }
  std::optional<DaemonRequest> Request() const override {
    BootRequest r = request_;
    r.kernel = Absolute(r.kernel);
    if (r.initrd) r.initrd = Absolute(*r.initrd);
    return ToDaemonRequest(r, kVmReplyTimeout);
  }
  int Run() override {
    const DaemonRequest request = *Request();
    if (harvest_) {
      const int rc = EnsureFormatsCached(request.args.value("kernel", ""), flags_.socket);
      if (rc != kExitOk) return rc;
    }
    json result;
    hostd::BootReply booted;
    if (int rc = CallDaemon(name(), flags_.socket, request, &result, &booted); rc != kExitOk)
      return rc;
    if (flags_.json) {
      PrintJson(result);
      return kExitOk;
    }
    std::printf("booted %s: QEMU pid %d (%s), boot range %llu bytes at GPA 0x%llx in %s\n",
                request_.name.c_str(), booted.pid, booted.kvm ? "KVM" : "TCG",
                static_cast<unsigned long long>(booted.region.size),
                static_cast<unsigned long long>(booted.region.gpa), booted.region.file.c_str());
    if (booted.kvm_probe) std::printf("accel auto: %s\n", booted.kvm_probe->c_str());
    if (booted.qemu_trace_log) std::printf("QEMU trace log: %s\n", booted.qemu_trace_log->c_str());
    std::printf("console log: %s\nconsole socket: %s\n", booted.console_log.c_str(),
                booted.console_socket.c_str());
    return kExitOk;
  }

 private:
  BootRequest request_;
  bool harvest_ = true;
  DaemonFlags flags_;
};

std::string ShellQuote(const std::string& a) {
  if (a.find_first_of(" $'\"\\,;&|<>()") == std::string::npos) return a;
  std::string q = "'";
  for (char c : a) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

class QemuArgsCommand final : public Command {
 public:
  void Define(CLI::App& app) override {
    AddBootFlags(app, request_);
    app.add_option("--run-dir", run_dir_,
                   "where the QMP and console sockets go (default /run/hvtrace)")
        ->type_name("DIR");
    app.add_flag("--json", json_, "print {argv, boot_region} as JSON");
  }
  Status Check() const override { return CheckBootRequest(request_); }
  int Run() override {
    const hostd::Accel accel = *hostd::ParseAccel(request_.accel);  // Checked while parsing.
    hostd::BootPaths paths = hostd::DefaultBootPaths(
        request_.name, run_dir_, std::filesystem::path(run_dir_) / request_.name);
    auto config = hostd::MakeBootVmConfig(request_, paths);
    if (!config.ok()) {
      std::fprintf(stderr, "hvtrace qemu-args: %s\n", config.error().message.c_str());
      return kExitUsage;
    }
    config->console_log.clear();  // People running QEMU pick their own console.
    config->console_socket.clear();
    config->qemu_log.clear();
    // The QEMU that would run it: $HVTRACE_QEMU as for the e2e tests and the
    // KVM probe, else qemu-system-x86_64 from PATH; its spellings decide.
    if (const char* qemu = std::getenv("HVTRACE_QEMU"); qemu != nullptr && *qemu != '\0') {
      config->qemu_binary = qemu;
    }
    auto caps = hostd::QemuCapsFor(config->qemu_binary);
    if (!caps.ok()) {
      std::fprintf(stderr, "hvtrace qemu-args: %s\n", caps.error().message.c_str());
      return kExitUsage;
    }
    auto plan = hostd::BuildQemuPlan(*config, hostd::ResolveKvm(accel, config->kernel), **caps);
    if (!plan.ok()) {
      std::fprintf(stderr, "hvtrace qemu-args: %s\n", plan.error().message.c_str());
      return kExitUsage;
    }
    const auto& l = *plan->boot_range;
    if (json_) {
      PrintJson({{"argv", plan->argv},
                 {"boot_region", paths.backing_file + "@" + std::to_string(l.range_gpa) + ":" +
                                     std::to_string(l.range_bytes)}});
      return kExitOk;
    }
    std::string line;
    for (const std::string& a : plan->argv) line += (line.empty() ? "" : " ") + ShellQuote(a);
    std::printf("%s\n", line.c_str());
    for (size_t i = 0; i + 1 < plan->argv.size(); ++i) {
      if (plan->argv[i] == "-append")
        std::printf("# kernel parameters: %s\n", plan->argv[i + 1].c_str());
    }
    // Guest RAM goes in a directory nobody else can enter (not /dev/shm,
    // where another user could create the name first).
    std::printf("# before: mkdir -p -m 0700 %s\n",
                std::filesystem::path(paths.backing_file).parent_path().c_str());
    std::printf("# then: hvtrace adopt %s --qmp %s --boot-region %s@0x%llx:%llu\n",
                request_.name.c_str(), paths.qmp_socket.c_str(), paths.backing_file.c_str(),
                static_cast<unsigned long long>(l.range_gpa),
                static_cast<unsigned long long>(l.range_bytes));
    return kExitOk;
  }

 private:
  BootRequest request_;
  std::string run_dir_ = "/run/hvtrace";
  bool json_ = false;
};

// adopt NAME --qmp SOCK [--boot-region F@GPA:SIZE]: a QEMU someone started.
// adopt NAME [--domain DOMAIN]: a libvirt domain (running, or with a boot-range cell).
// A libvirt domain adopt adopted: its region, and its boot range as the
// NUMA cell places it, with what the guest must still do.
void PrintAdoptedDomain(const hostd::AdoptReply& adopted) {
  const json& region = adopted.region.is_object() ? adopted.region : json::object();
  std::printf("adopted %s: libvirt domain %s (%s), %s region %s (offset %llu, %llu bytes)\n",
              adopted.name.c_str(), adopted.domain.value_or("").c_str(),
              adopted.uuid.value_or("").c_str(), region.value("kind", std::string()).c_str(),
              region.value("path", std::string()).c_str(),
              static_cast<unsigned long long>(region.value("offset", uint64_t{0})),
              static_cast<unsigned long long>(region.value("size", uint64_t{0})));
  const json& boot = adopted.boot_range;
  if (!boot.is_object() || boot.empty()) return;
  const json meta = boot.value("guest_meta", json::object());
  std::printf("boot range: GPA %s, %llu bytes (from the NUMA cell); guest meta: %s\n",
              boot.value("gpa", std::string()).c_str(),
              static_cast<unsigned long long>(boot.value("size", uint64_t{0})),
              meta.value("state", std::string()).c_str());
  for (const char* key : {"cmdline_note", "note"}) {
    if (boot.contains(key)) std::printf("note: %s\n", boot[key].get<std::string>().c_str());
  }
}

class AdoptCommand final : public Command {
 public:
  void Define(CLI::App& app) override {
    AddVmName(app, name_);
    auto* qmp =
        app.add_option("--qmp", qmp_,
                       "the QEMU's QMP socket (a monitor of its own: QEMU serves one client)")
            ->type_name("SOCK");
    app.add_option(
           "--boot-region", region_,
           "its boot range: the file backing it, the GPA and size (`hvtrace qemu-args` prints "
           "it); without it the VM waits for `hvtrace attach`")
        ->type_name("FILE@GPA:SIZE")
        ->needs(qmp);
    app.add_option("--domain", domain_, "the libvirt domain (name or UUID; default NAME)")
        ->type_name("DOMAIN")
        ->excludes(qmp);
    AddDaemonFlags(app, flags_);
    app.footer(
        "Without --qmp, NAME is a libvirt domain that hvtraced serves from now on: its trace\n"
        "region is found from the domain's XML (an hvtrace shmem device, else the boot range in\n"
        "the NUMA cell of `hvtrace domain-xml --numa`; the kernel parameters may be in the\n"
        "guest's own boot loader, the reply says which ones), and a panic is captured before\n"
        "libvirt acts on <on_crash>. A domain with that cell may be adopted before it starts.\n"
        "The daemon's config key libvirt_uri names the libvirt connection.");
  }
  std::optional<DaemonRequest> Request() const override {
    hostd::AdoptRequest r;
    r.name = name_;
    if (!qmp_.empty()) {
      r.qmp = Absolute(qmp_);
      if (!region_.empty()) r.boot_region = region_;
    } else if (!domain_.empty()) {
      r.domain = domain_;
    }
    return ToDaemonRequest(r, kVmReplyTimeout);
  }
  int Run() override {
    json result;
    hostd::AdoptReply adopted;
    if (int rc = CallDaemon(name(), flags_.socket, *Request(), &result, &adopted); rc != kExitOk)
      return rc;
    if (flags_.json) {
      PrintJson(result);
    } else if (adopted.qmp) {
      std::printf("adopted %s (QMP %s)\n", name_.c_str(), adopted.qmp->c_str());
    } else {
      PrintAdoptedDomain(adopted);
    }
    return kExitOk;
  }

 private:
  std::string name_, qmp_, region_, domain_;
  DaemonFlags flags_;
};

// capture NAME / stop NAME: one request about one VM (|Message|: its
// control message, requests.h).
template <class Message, class Reply>
class VmRequestCommand final : public Command {
 public:
  explicit VmRequestCommand(void (*print)(const std::string&, const Reply&)) : print_(print) {}
  void Define(CLI::App& app) override {
    AddVmName(app, name_);
    AddDaemonFlags(app, flags_);
  }
  std::optional<DaemonRequest> Request() const override {
    Message message;
    message.name = name_;
    return ToDaemonRequest(message, kVmReplyTimeout);
  }
  int Run() override {
    json result;
    Reply reply;
    if (int rc = CallDaemon(name(), flags_.socket, *Request(), &result, &reply); rc != kExitOk)
      return rc;
    if (flags_.json) {
      PrintJson(result);
    } else {
      print_(name_, reply);
    }
    return kExitOk;
  }

 private:
  void (*print_)(const std::string&, const Reply&);
  std::string name_;
  DaemonFlags flags_;
};

void PrintCaptured(const std::string& vm, const hostd::ManualCaptureReply& captured) {
  std::printf("captured %s: %s (%.1f ms to disk)\n", vm.c_str(), captured.capture.c_str(),
              captured.trigger_to_disk_ms);
}

void PrintStopped(const std::string& vm, const hostd::StopReply&) {
  std::printf("stopped watching %s (a VM hvtraced booted is shut down)\n", vm.c_str());
}

}  // namespace

void AddVmCommands(CommandTable& table) {
  table.Add("boot", "ask hvtraced to boot a guest with a host-backed boot trace buffer",
            std::make_unique<BootCommand>());
  table.Add("qemu-args",
            "print the QEMU argv + kernel params for a boot buffer (run QEMU yourself)",
            std::make_unique<QemuArgsCommand>());
  table.Add("adopt",
            "let hvtraced watch a QEMU you started (--qmp SOCK) or a running libvirt domain",
            std::make_unique<AdoptCommand>());
  table.Add(
      "capture", "snapshot a VM's trace region now, guest keeps running",
      std::make_unique<VmRequestCommand<hostd::ManualCaptureRequest, hostd::ManualCaptureReply>>(
          PrintCaptured));
  table.Add("stop", "stop watching a VM (and shut it down if hvtraced booted it)",
            std::make_unique<VmRequestCommand<hostd::StopRequest, hostd::StopReply>>(PrintStopped));
}

}  // namespace hvtrace::cli
