#pragma GCC diagnostic ignored "-Wnull-dereference"  // Asio internals under GCC 12 (see daemon.cc).
#include "boot_vm.h"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <iostream>
#include <mutex>

#include <boost/asio/post.hpp>

#include "daemon.h"
#include "daemon_log.h"
#include "formats_cache.h"
#include "kvm_probe.h"
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

bool ResolveKvm(Accel accel, const std::string& kernel) {
  switch (accel) {
    case Accel::kKvm: return true;
    case Accel::kTcg: return false;
    case Accel::kAuto: return KvmUsable(kernel);
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

namespace asio = boost::asio;

// The boot range's backing file is created by QEMU. Something already at
// that path is refused: QEMU would put its memory into a temporary file
// inside a directory (and the daemon would read the wrong thing), and an
// existing file may be another QEMU's live memory or a stale ring the new
// kernel would mistake for its previous boot.
Result<std::unique_ptr<Vm>> CheckBackingPath(const std::string& name, const std::string& path) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) return std::unique_ptr<Vm>();
  const std::string what = S_ISDIR(st.st_mode) ? "a directory" : S_ISREG(st.st_mode) ? "a file" : "not a regular file";
  return Error{"VM '" + name + "': the boot range's backing path " + path + " already exists (" + what +
               "); it may belong to another QEMU: remove it, or `hvtrace stop " + name +
               "` if it is what this VM left"};
}

std::string ArgName(const Request& request) {
  auto it = request.args.find("name");
  return it != request.args.end() && it->is_string() ? it->get<std::string>() : std::string();
}

}  // namespace

// Runs on the I/O thread; only cheap work happens here. `boot` spawns QEMU
// on the pool (StartBoot): QEMU runs in its own session (VmLifetime::
// kIndependent), so the forking thread does not matter, and the KVM probe and
// the kernel hash never block other clients.
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
    const std::string name = vm->name();
    if (booting_.count(name) != 0 || stopping_vms_.count(name) != 0) {
      responder->Fail(kErrBusy, "VM '" + name + "' is being booted or stopped by an earlier request");
      return true;
    }
    registry_.Remove(name);
    // The VM stays listed, offline, so its captures remain reachable.
    (void)registry_.Add(std::make_shared<VmSupervisor>(name, nullptr, pool_.get_executor(),
                                                       CaptureStore(state_.CapturesDir(name)),
                                                       supervisor_options()));
    // A VM hvtraced booted (or re-attached to) is shut down and its files
    // removed; an adopted one is only let go. The reply waits for that, so a
    // `boot` of the same name right after never races the cleanup.
    stopping_vms_.insert(name);
    vm->Stop([this, name, responder] {
      RemoveRemnants(name);
      std::error_code ec;
      std::filesystem::remove(QmpVmSpecPath(state_.VmDir(name)), ec);
      asio::post(io_, [this, name, responder] {
        stopping_vms_.erase(name);
        responder->Reply({{"stopped", name}});
      });
    });
    return true;
  }

  const std::string name = ArgName(request);
  if (Status s = ValidateVmName(name); !s.ok()) {
    responder->Fail(kErrBadRequest, cmd + ": " + s.error().message);
    return true;
  }
  if (booting_.count(name) != 0 || stopping_vms_.count(name) != 0) {
    responder->Fail(kErrBusy, "VM '" + name + "' is being booted or stopped by an earlier request");
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

  if (cmd == "boot") {
    StartBoot(name, request, responder);
    return true;
  }

  // adopt
  auto qmp = request.args.find("qmp");
  auto region = request.args.find("boot_region");
  if (qmp == request.args.end() || !qmp->is_string() ||
      (region != request.args.end() && !region->is_null() && !region->is_string())) {
    responder->Fail(kErrBadRequest, "adopt needs args.qmp (socket) and optionally args.boot_region (FILE@GPA:SIZE)");
    return true;
  }
  // Without a boot region the VM is watched for `hvtrace attach` (attach_vm.cc).
  const bool boot_range = region != request.args.end() && region->is_string();
  auto parsed = boot_range ? ParseBootRegion(region->get<std::string>()) : Result<QmpVmSpec>(QmpVmSpec{});
  if (!parsed.ok()) {
    responder->Fail(kErrBadRequest, parsed.error().message);
    return true;
  }
  QmpVmSpec spec = *parsed;
  // The file is QEMU's node-1 backing file: the range starts at its offset 0
  // (gpa_layout.h), whatever GPA the guest sees it at.
  spec.qmp_socket = std::filesystem::absolute(qmp->get<std::string>()).string();
  struct stat st;
  if (boot_range &&
      (::stat(spec.region_path.c_str(), &st) != 0 || static_cast<uint64_t>(st.st_size) < spec.region_size)) {
    responder->Fail(kErrBadRequest, "region file " + spec.region_path.string() + " is missing or shorter than " +
                                        std::to_string(spec.region_size));
    return true;
  }
  if (Status s = RegisterQmpVm(name, spec, nullptr); !s.ok()) {
    responder->Fail(kErrInternal, s.error().message);
    return true;
  }
  responder->Reply({{"name", name},
                    {"region",
                     {{"file", spec.region_path.string()},
                      {"offset", spec.region_offset},
                      {"size", spec.region_size},
                      {"gpa", spec.region_gpa}}},
                    {"qmp", spec.qmp_socket}});
  return true;
}

void Daemon::StartBoot(const std::string& name, const Request& request,
                       const std::shared_ptr<Responder>& responder) {
  auto req = BootRequest::FromJson(request.args);
  if (!req.ok()) {
    responder->Fail(kErrBadRequest, req.error().message);
    return;
  }
  if (req->accel == "auto") req->accel = config_.accel;
  const std::filesystem::path vm_dir = state_.VmDir(name);
  BootPaths paths = DefaultBootPaths(name, config_.EffectiveSocketPath().parent_path(), vm_dir);
  auto config = MakeBootVmConfig(*req, paths);
  if (!config.ok()) {
    responder->Fail(kErrBadRequest, config.error().message);
    return;
  }
  auto accel = ParseAccel(req->accel);
  booting_.insert(name);
  // A gone/stopped/failed VM of that name still holds its files: stop it
  // first and boot when that is done (its cleanup must not remove the new
  // QEMU's files).
  std::shared_ptr<VmSupervisor> old = registry_.Find(name);
  if (old && old->state() != VmState::kOffline) {
    registry_.Remove(name);
    old->Stop([this, name, boot = *req, paths, vm_config = *config, accel_kind = *accel, responder] {
      RemoveRemnants(name);
      LaunchBoot(name, boot, paths, vm_config, accel_kind, responder);
    });
    return;
  }
  asio::post(pool_, [this, name, boot = *req, paths, vm_config = *config, accel_kind = *accel, responder] {
    LaunchBoot(name, boot, paths, vm_config, accel_kind, responder);
  });
}

void Daemon::LaunchBoot(const std::string& name, const BootRequest& boot, const BootPaths& paths,
                        const VmConfig& vm_config, Accel accel_kind, const std::shared_ptr<Responder>& responder) {
  // Slow: the KVM probe (first time only), QEMU start-up, hashing vmlinuz.
  if (accel_kind == Accel::kAuto) Log("boot " + name + ": accel auto: " + KvmVerdict(boot.kernel).reason);
  Result<std::unique_ptr<Vm>> started = CheckBackingPath(name, paths.backing_file);
  if (started.ok()) {
    started = Vm::Start(vm_config, ResolveKvm(accel_kind, boot.kernel), std::chrono::seconds(15), VmLifetime::kIndependent);
  }
  std::string kernel_key;
  if (started.ok()) {
    if (auto key = KernelKeyOfFile(boot.kernel); key.ok()) kernel_key = *key;
  }
  // Registering touches the registry and the io_context's QMP objects: back
  // on the I/O thread.
  auto finish = [this, name, boot, paths, kernel_key, responder, accel_kind,
                 started = std::make_shared<Result<std::unique_ptr<Vm>>>(std::move(started))]() mutable {
    booting_.erase(name);
    if (!started->ok()) {
      responder->Fail(kErrVmFailed, "boot " + name + ": " + started->error().message);
      return;
    }
    std::unique_ptr<Vm> vm = std::move(started->value());
    const BootRangeLayout& layout = *vm->plan().boot_range;
    const VmIdentity identity = vm->Identity();
    QmpVmSpec spec;
    spec.qmp_socket = paths.qmp_socket;
    spec.region_path = paths.backing_file;
    spec.region_offset = layout.file_offset;
    spec.region_size = layout.range_bytes;
    spec.region_gpa = layout.range_gpa;
    spec.pid = vm->pid();
    spec.pid_start_time = identity.start_time;
    spec.owned_paths = identity.owned_paths;
    spec.console_log = paths.console_log;
    spec.console_socket = paths.console_socket;
    spec.booted_by_daemon = true;
    spec.kernel_path = std::filesystem::absolute(boot.kernel).string();
    spec.kernel_key = kernel_key;
    if (!boot.initrd.empty()) spec.initrd_path = std::filesystem::absolute(boot.initrd).string();
    json reply = {{"name", name}, {"pid", vm->pid()}, {"kvm", vm->kvm()}, {"argv", vm->plan().argv}};
    // Why auto chose what it chose (kvm_probe.h), so a TCG guest on a KVM
    // host is never a mystery.
    if (accel_kind == Accel::kAuto) reply["kvm_probe"] = KvmVerdict(boot.kernel).reason;  // Cached.
    if (stopping_) {
      // The daemon began to exit while QEMU started: treat the new VM as
      // the shutdown policy says (its spec is saved for re-adoption).
      (void)SaveQmpVmSpec(state_.VmDir(name), spec);
      if (config_.vm_on_shutdown == VmOnShutdown::kKeep) vm->Release();
      responder->Fail(kErrVmFailed, "boot " + name + ": hvtraced is shutting down (vm_on_shutdown = " +
                                        std::string(VmOnShutdownName(config_.vm_on_shutdown)) + ")");
      return;
    }
    if (Status s = RegisterQmpVm(name, spec, std::move(vm)); !s.ok()) {
      responder->Fail(kErrInternal, s.error().message);
      return;
    }
    reply["region"] = {{"file", spec.region_path.string()},
                       {"offset", spec.region_offset},
                       {"size", spec.region_size},
                       {"gpa", spec.region_gpa}};
    reply["qmp"] = spec.qmp_socket;
    reply["console_log"] = spec.console_log;
    reply["console_socket"] = spec.console_socket;
    responder->Reply(reply);
  };
  asio::post(io_, std::move(finish));
}

void Daemon::RemoveRemnants(const std::string& name) {
  // For an offline VM whose QEMU hvtraced booted and which exited meanwhile:
  // its sockets and /dev/shm file. A live process's files are never touched
  // here (a backend with a Vm removes those after stopping it).
  auto spec = LoadQmpVmSpec(state_.VmDir(name));
  if (!spec.ok() || !spec->booted_by_daemon) return;
  if (spec->pid > 0 && spec->pid_start_time != 0 &&
      ProcessStartTime(spec->pid).value_or(0) == spec->pid_start_time) {
    return;
  }
  std::error_code ec;
  for (const std::string& path : spec->owned_paths) std::filesystem::remove(path, ec);
}

Status Daemon::RegisterQmpVm(const std::string& name, const QmpVmSpec& spec, std::unique_ptr<Vm> vm) {
  const std::filesystem::path vm_dir = state_.VmDir(name);
  if (Status s = SaveQmpVmSpec(vm_dir, spec); !s.ok()) Log("warning: VM " + name + ": " + s.error().message);
  if (auto old = registry_.Remove(name)) old->Stop();
  auto backend = std::make_unique<QmpVmBackend>(io_.get_executor(), spec, std::move(vm));
  if (Status s = AddVm(name, std::move(backend)); !s.ok()) return s;
  Log("VM " + name + ": " + (spec.booted_by_daemon ? "booted" : "adopted") + ", pid " + std::to_string(spec.pid) +
      ", region " + spec.region_path.string());
  return {};
}

void Daemon::ReadoptVm(const std::string& name) {
  auto spec = LoadQmpVmSpec(state_.VmDir(name));
  if (!spec.ok()) return;  // Not a QMP VM (or never one).
  std::unique_ptr<Vm> vm;
  std::string gone;
  if (spec->booted_by_daemon) {
    // Ours: take the process back, but only the very QEMU we started.
    VmIdentity identity;
    identity.pid = spec->pid;
    identity.start_time = spec->pid_start_time;
    identity.cmdline_mentions = spec->qmp_socket;
    identity.owned_paths = spec->owned_paths;
    auto reattached = Vm::Reattach(name, identity);
    if (reattached.ok()) {
      vm = std::move(*reattached);
    } else {
      gone = reattached.error().message;
    }
  } else if (spec->pid > 0 && ::kill(spec->pid, 0) != 0) {
    gone = "QEMU pid " + std::to_string(spec->pid) + " is gone";
  } else if (spec->pid > 0 && spec->pid_start_time != 0 &&
             ProcessStartTime(spec->pid).value_or(0) != spec->pid_start_time) {
    gone = "pid " + std::to_string(spec->pid) + " now belongs to another process";
  }
  std::error_code ec;
  if (gone.empty() && !std::filesystem::exists(spec->qmp_socket, ec)) gone = "QMP socket " + spec->qmp_socket + " is gone";
  if (gone.empty() && spec->region_size != 0 && !std::filesystem::exists(spec->region_path, ec)) {
    gone = "region file " + spec->region_path.string() + " is gone";
  }
  if (!vm && !gone.empty() && spec->booted_by_daemon && !spec->exited && spec->region_size != 0 &&
      std::filesystem::exists(spec->region_path, ec)) {
    // Our QEMU exited while no daemon watched, but its region file is still
    // there: capture it now ("qemu-gone", as if we had seen it go), then let
    // `hvtrace stop` remove the remnants. Nothing the guest wrote is lost.
    if (auto old = registry_.Remove(name)) old->Stop();
    auto backend = std::make_unique<QmpVmBackend>(io_.get_executor(), *spec, Vm::Remnant(name, spec->owned_paths));
    if (Status s = AddVm(name, std::move(backend)); !s.ok()) {
      Log("VM " + name + ": cannot capture the region left by its QEMU: " + s.error().message);
      return;
    }
    if (auto vm_supervisor = registry_.Find(name)) {
      vm_supervisor->OnVmGone("QEMU exited while hvtraced was not running (" + gone + ")");
    }
    // Once is enough: a later daemon only lists it (and `stop` cleans up).
    spec->exited = true;
    if (Status s = SaveQmpVmSpec(state_.VmDir(name), *spec); !s.ok()) Log("warning: VM " + name + ": " + s.error().message);
    Log("VM " + name + ": QEMU is gone (" + gone + "); capturing its region file " + spec->region_path.string());
    return;
  }
  if (!gone.empty()) {
    if (vm) vm->Release();  // Not ours to stop on a doubt.
    Log("VM " + name + ": not re-adopted (" + gone + "); keeping it offline" +
        (spec->booted_by_daemon ? "; `hvtrace stop " + name + "` removes what its QEMU left" : ""));
    return;
  }
  if (auto old = registry_.Remove(name)) old->Stop();
  auto backend = std::make_unique<QmpVmBackend>(io_.get_executor(), *spec, std::move(vm));
  if (Status s = AddVm(name, std::move(backend)); !s.ok()) {
    Log("VM " + name + ": re-adopt failed: " + s.error().message);
    return;
  }
  Log("VM " + name + ": re-adopted (" + (spec->booted_by_daemon ? "booted by hvtraced, pid " : "adopted, pid ") +
      std::to_string(spec->pid) + ", QMP " + spec->qmp_socket + ")");
}

}  // namespace hvtrace::hostd
