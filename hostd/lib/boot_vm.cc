#pragma GCC diagnostic ignored "-Wnull-dereference"  // Asio internals under GCC 12 (see daemon.cc).
#include "boot_vm.h"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <iostream>

#include <boost/asio/post.hpp>

#include "daemon.h"
#include "formats_cache.h"
#include "qmp_vm.h"
#include "vm_process.h"

namespace hvtrace::hostd {

using nlohmann::json;

json BootRequest::ToJson() const {
  return {{"name", name},         {"kernel", kernel},         {"initrd", initrd},
          {"append", append},     {"cpus", cpus},             {"memory_mib", memory_mib},
          {"trace_size_mib", trace_size_mib}, {"events", events}, {"accel", accel}};
}

Result<BootRequest> BootRequest::FromJson(const json& args) {
  BootRequest r;
  if (!args.is_object()) return Error{"boot: args must be an object"};
  auto str = [&](const char* key, std::string& out, bool required) -> Status {
    auto it = args.find(key);
    if (it == args.end() || it->is_null()) {
      if (required) return Error{std::string("boot: args.") + key + " is required"};
      return {};
    }
    if (!it->is_string()) return Error{std::string("boot: args.") + key + " must be a string"};
    out = it->get<std::string>();
    return {};
  };
  auto num = [&](const char* key, uint64_t lo, uint64_t hi, uint64_t& out) -> Status {
    auto it = args.find(key);
    if (it == args.end() || it->is_null()) return {};
    if (!it->is_number_unsigned()) return Error{std::string("boot: args.") + key + " must be a positive integer"};
    uint64_t v = it->get<uint64_t>();
    if (v < lo || v > hi) {
      return Error{std::string("boot: args.") + key + " = " + std::to_string(v) + " is outside " +
                   std::to_string(lo) + ".." + std::to_string(hi)};
    }
    out = v;
    return {};
  };
  for (Status s : {str("name", r.name, true), str("kernel", r.kernel, true),
                   str("initrd", r.initrd, false), str("append", r.append, false),
                   str("events", r.events, false), str("accel", r.accel, false)}) {
    if (!s.ok()) return s.error();
  }
  uint64_t cpus = static_cast<uint64_t>(r.cpus);
  for (Status s : {num("cpus", 1, 64, cpus), num("memory_mib", 256, 65536, r.memory_mib),
                   num("trace_size_mib", 1, 1024, r.trace_size_mib)}) {
    if (!s.ok()) return s.error();
  }
  r.cpus = static_cast<int>(cpus);
  if (auto a = ParseAccel(r.accel); !a.ok()) return a.error();
  return r;
}

BootPaths DefaultBootPaths(const std::string& name, const std::filesystem::path& run_dir,
                           const std::filesystem::path& vm_dir) {
  BootPaths p;
  p.qmp_socket = (run_dir / (name + ".qmp")).string();
  p.console_log = (vm_dir / "console.log").string();
  p.console_socket = (run_dir / (name + ".console")).string();
  p.qemu_log = (vm_dir / "qemu.log").string();
  p.backing_file = "/dev/shm/hvtrace-" + name;
  return p;
}

Result<Accel> ParseAccel(std::string_view text) {
  if (text == "auto") return Accel::kAuto;
  if (text == "tcg") return Accel::kTcg;
  if (text == "kvm") return Accel::kKvm;
  return Error{"accel '" + std::string(text) + "' is not one of auto, tcg, kvm"};
}

bool ResolveKvm(Accel accel) {
  switch (accel) {
    case Accel::kKvm: return true;
    case Accel::kTcg: return false;
    case Accel::kAuto: return KvmUsable();
  }
  return false;
}

Result<VmConfig> MakeBootVmConfig(const BootRequest& r, const BootPaths& paths) {
  auto accel = ParseAccel(r.accel);
  if (!accel.ok()) return accel.error();
  VmConfig c;
  c.name = r.name;
  c.accel = *accel;
  c.vcpus = r.cpus;
  c.memory_bytes = r.memory_mib * kMiB;
  c.kernel = r.kernel;
  c.initrd = r.initrd;
  c.cmdline = r.append;
  c.qmp_socket = paths.qmp_socket;
  c.console_log = paths.console_log;
  c.console_socket = paths.console_socket;
  c.qemu_log = paths.qemu_log;
  c.panic_device = PanicDevice::kIsa;
  c.pause_on_panic = true;
  BootRangeConfig br;
  br.backing_path = paths.backing_file;
  br.range_bytes = r.trace_size_mib * kMiB;
  br.events = r.events;
  c.boot_range = br;
  return c;
}

namespace {

void Log(const std::string& message) {
  std::string line = "hvtraced: " + message + "\n";
  ssize_t ignored = ::write(STDERR_FILENO, line.data(), line.size());
  (void)ignored;
}

std::string ArgName(const Request& request) {
  auto it = request.args.find("name");
  return it != request.args.end() && it->is_string() ? it->get<std::string>() : std::string();
}

}  // namespace

// Runs on the I/O thread. QEMU is spawned here on purpose: vm_process.h ties
// the child's PDEATHSIG to the forking thread, and the I/O thread lives as
// long as the daemon.
bool Daemon::HandleVmCommand(const Request& request, const std::shared_ptr<Responder>& responder) {
  const std::string& cmd = request.cmd;
  if (cmd != "boot" && cmd != "adopt" && cmd != "capture" && cmd != "stop") return false;

  if (cmd == "capture") {
    auto vm = VmFromArgs(request, *responder);
    if (!vm) return true;
    vm->RequestCapture("manual", [responder](Result<CaptureSummary> result) {
      if (!result.ok()) {
        responder->Fail(kErrVmFailed, result.error().message);
        return;
      }
      responder->Reply({{"capture", result->id},
                        {"trigger", result->trigger},
                        {"trigger_to_disk_ms", result->trigger_to_disk_ms}});
    });
    return true;
  }

  if (cmd == "stop") {
    auto vm = VmFromArgs(request, *responder);
    if (!vm) return true;
    registry_.Remove(vm->name());
    vm->Stop();
    std::error_code ec;
    std::filesystem::remove(QmpVmSpecPath(state_.VmDir(vm->name())), ec);
    // The VM stays listed, offline, so its captures remain reachable.
    auto offline = std::make_shared<VmSupervisor>(vm->name(), nullptr, pool_.get_executor(),
                                                  CaptureStore(state_.CapturesDir(vm->name())),
                                                  supervisor_options());
    (void)registry_.Add(offline);
    responder->Reply({{"stopped", vm->name()}});
    return true;
  }

  const std::string name = ArgName(request);
  if (Status s = ValidateVmName(name); !s.ok()) {
    responder->Fail(kErrBadRequest, cmd + ": " + s.error().message);
    return true;
  }
  if (auto existing = registry_.Find(name)) {
    VmState st = existing->state();
    if (st != VmState::kOffline && st != VmState::kGone && st != VmState::kStopped &&
        st != VmState::kFailed) {
      responder->Fail(kErrBusy, "VM '" + name + "' is " + std::string(VmStateName(st)) +
                                    "; `hvtrace stop " + name + "` first");
      return true;
    }
  }
  const std::filesystem::path vm_dir = state_.VmDir(name);
  if (Status s = MakeDirs(vm_dir, 0750); !s.ok()) {
    responder->Fail(kErrInternal, s.error().message);
    return true;
  }

  QmpVmSpec spec;
  std::unique_ptr<Vm> vm;
  json reply;
  if (cmd == "boot") {
    auto req = BootRequest::FromJson(request.args);
    if (!req.ok()) {
      responder->Fail(kErrBadRequest, req.error().message);
      return true;
    }
    if (req->accel == "auto") req->accel = config_.accel;
    BootPaths paths = DefaultBootPaths(name, config_.EffectiveSocketPath().parent_path(), vm_dir);
    auto config = MakeBootVmConfig(*req, paths);
    if (!config.ok()) {
      responder->Fail(kErrBadRequest, config.error().message);
      return true;
    }
    auto accel = ParseAccel(req->accel);
    auto started = Vm::Start(*config, ResolveKvm(*accel));
    if (!started.ok()) {
      responder->Fail(kErrVmFailed, "boot " + name + ": " + started.error().message);
      return true;
    }
    vm = std::move(*started);
    const BootRangeLayout& layout = *vm->plan().boot_range;
    spec.qmp_socket = paths.qmp_socket;
    spec.region_path = paths.backing_file;
    spec.region_offset = layout.file_offset;
    spec.region_size = layout.range_bytes;
    spec.region_gpa = layout.range_gpa;
    spec.pid = vm->pid();
    spec.console_log = paths.console_log;
    spec.booted_by_daemon = true;
    spec.kernel_path = std::filesystem::absolute(req->kernel).string();
    if (auto key = KernelKeyOfFile(req->kernel); key.ok()) spec.kernel_key = *key;
    reply = {{"name", name}, {"pid", vm->pid()}, {"kvm", vm->kvm()}, {"argv", vm->plan().argv}};
  } else {  // adopt
    auto qmp = request.args.find("qmp");
    auto region = request.args.find("boot_region");
    if (qmp == request.args.end() || !qmp->is_string() || region == request.args.end() ||
        !region->is_string()) {
      responder->Fail(kErrBadRequest, "adopt needs args.qmp (socket) and args.boot_region (FILE@GPA:SIZE)");
      return true;
    }
    auto parsed = ParseBootRegion(region->get<std::string>());
    if (!parsed.ok()) {
      responder->Fail(kErrBadRequest, parsed.error().message);
      return true;
    }
    spec = *parsed;
    // The file is QEMU's node-1 backing file: the range starts at its offset 0
    // (gpa_layout.h), whatever GPA the guest sees it at.
    spec.qmp_socket = std::filesystem::absolute(qmp->get<std::string>()).string();
    struct stat st;
    if (::stat(spec.region_path.c_str(), &st) != 0 ||
        static_cast<uint64_t>(st.st_size) < spec.region_size) {
      responder->Fail(kErrBadRequest, "region file " + spec.region_path.string() +
                                          " is missing or shorter than " + std::to_string(spec.region_size));
      return true;
    }
    reply = {{"name", name}};
  }
  if (Status s = SaveQmpVmSpec(vm_dir, spec); !s.ok()) Log("warning: VM " + name + ": " + s.error().message);
  if (auto old = registry_.Remove(name)) old->Stop();
  auto backend = std::make_unique<QmpVmBackend>(io_.get_executor(), spec, std::move(vm));
  if (Status s = AddVm(name, std::move(backend)); !s.ok()) {
    responder->Fail(kErrInternal, s.error().message);
    return true;
  }
  reply["region"] = {{"file", spec.region_path.string()},
                     {"offset", spec.region_offset},
                     {"size", spec.region_size},
                     {"gpa", spec.region_gpa}};
  reply["qmp"] = spec.qmp_socket;
  if (!spec.console_log.empty()) {
    reply["console_log"] = spec.console_log;
    reply["console_socket"] =
        DefaultBootPaths(name, config_.EffectiveSocketPath().parent_path(), vm_dir).console_socket;
  }
  Log("VM " + name + ": " + cmd + " ok, region " + spec.region_path.string());
  responder->Reply(reply);
  return true;
}

void Daemon::ReadoptVm(const std::string& name) {
  auto spec = LoadQmpVmSpec(state_.VmDir(name));
  if (!spec.ok()) return;  // Not a QMP VM (or never one).
  bool alive = spec->pid <= 0 || ::kill(spec->pid, 0) == 0;
  std::error_code ec;
  if (!alive || !std::filesystem::exists(spec->qmp_socket, ec) ||
      !std::filesystem::exists(spec->region_path, ec)) {
    Log("VM " + name + ": QEMU from an earlier run is gone; keeping it offline");
    return;
  }
  if (auto old = registry_.Remove(name)) old->Stop();
  auto backend = std::make_unique<QmpVmBackend>(io_.get_executor(), *spec, nullptr);
  if (Status s = AddVm(name, std::move(backend)); !s.ok()) {
    Log("VM " + name + ": re-adopt failed: " + s.error().message);
    return;
  }
  Log("VM " + name + ": re-adopted (QMP " + spec->qmp_socket + ")");
}

}  // namespace hvtrace::hostd
