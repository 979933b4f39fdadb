#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <boost/asio/post.hpp>
#include <cerrno>
#include <cstring>
#include <iostream>
#include <mutex>

#include "boot_request.h"
#include "client_files.h"
#include "daemon.h"
#include "daemon_libvirt.h"
#include "daemon_log.h"
#include "formats_cache.h"
#include "kvm_probe.h"
#include "private_path.h"
#include "qemu_user.h"
#include "qmp_vm.h"
#include "vm_process.h"

namespace hvtrace::hostd {

using nlohmann::json;

namespace {

namespace asio = boost::asio;

// The boot range's backing file holds guest RAM (the trace range and 48 MiB
// more), so the daemon creates it itself, empty, mode 0600, O_EXCL and
// O_NOFOLLOW, in a directory only its own user may enter (the run
// directory's mem/), and QEMU opens that very file: no local user can plant
// a file or a symlink under the name first, or read the guest's memory
// later. Something already at the path is refused: it may be another QEMU's
// live memory or a stale ring the new kernel would take for its previous
// boot.
//
// A QEMU that drops root (qemu_user) opens the file before it drops, so the
// file stays 0600 the daemon's; QEMU's group may only traverse the
// directory (0710), for the files it opens by name later (qemu_user.h).
Result<std::unique_ptr<Vm>> PrepareBackingFile(const std::string& name, const std::string& path,
                                               const QemuUser& qemu_user) {
  const std::string what = "VM '" + name + "': the boot range's backing file";
  std::optional<gid_t> qemu_gid;
  if (!qemu_user.run_as.empty()) qemu_gid = qemu_user.gid;
  if (Status s = EnsureGuestMemoryDir(std::filesystem::path(path).parent_path(), qemu_gid,
                                      "VM '" + name + "': guest memory directory");
      !s.ok()) {
    return s.error();
  }
  Result<UniqueFd> fd = CreateExclusiveFile(path, 0600, what);
  if (!fd.ok()) {
    return Error{fd.error().message +
                 "; it may belong to another QEMU: remove it, or `hvtrace stop " + name +
                 "` if it is what this VM left"};
  }
  return std::unique_ptr<Vm>();
}

// The host side of boot (boot_trace.h): a boot never inherits the previous
// boot's QEMU trace log (unlinked, never followed); with --trace-boot the
// daemon creates the new one itself, empty, 0600, O_EXCL and O_NOFOLLOW in
// the VM's directory, and QEMU opens that file (as root, before -runas and
// the sandbox take effect; verified under both).
Status PrepareQemuTraceLog(const std::string& name, const VmConfig& config,
                           const std::string& path) {
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
    return Error{"VM '" + name + "': cannot remove the old QEMU trace log " + path + ": " +
                 std::strerror(errno)};
  }
  if (config.trace_log.empty()) return {};
  Result<UniqueFd> fd = CreateExclusiveFile(path, 0600, "VM '" + name + "': QEMU trace log");
  if (!fd.ok()) return fd.error();
  return {};
}

// Where a QEMU's boot range is, as boot and adopt replies say it.
BootRegionReply BootRegionOf(const QmpVmSpec& spec) {
  return BootRegionReply{
      {}, spec.region_path.string(), spec.region_offset, spec.region_size, spec.region_gpa};
}

// Where a boot's kernel and initrd are copied (client_files.h): a directory
// only root may enter, inside the VM's state dir.
std::filesystem::path BootInputsDir(const std::filesystem::path& vm_dir) {
  return vm_dir / "inputs";
}

}  // namespace

// Runs on the I/O thread; only cheap work happens here. QEMU is spawned on
// the pool (LaunchBoot): it runs in its own session (VmLifetime::
// kIndependent), so the forking thread does not matter, and the KVM probe
// and the kernel hash never block other clients.
void Daemon::HandleBoot(const Request& request, const BootRequest& args,
                        const ResponderPtr& responder) {
  const std::string name = args.name;
  if (!ReadyForNewVm(name, *responder)) return;
  BootRequest req = args;
  if (req.accel == "auto") req.accel = config()->accel;
  // The kernel and initrd come as descriptors the client opened; the daemon
  // boots private copies of them (client_files.h), never the client's paths.
  auto kernel_fd = RequestFile(request, "kernel", kMaxKernelBytes, /*required=*/true);
  auto initrd_fd = kernel_fd.ok() ? RequestFile(request, "initrd", kMaxInitrdBytes, false)
                                  : Result<SharedFd>(SharedFd());
  for (const auto* file : {&kernel_fd, &initrd_fd}) {
    if (!file->ok()) {
      responder->Fail(kErrBadRequest, "VM '" + name + "': " + file->error().message);
      return;
    }
  }
  const std::filesystem::path inputs = BootInputsDir(state_.VmDir(name));
  const std::string kernel_what = "kernel " + req.kernel;
  const std::string initrd_what = "initrd " + req.initrd.value_or("");
  req.kernel = (inputs / "kernel").string();
  req.initrd.reset();  // Named but empty is none.
  if (*initrd_fd) req.initrd = (inputs / "initrd").string();
  BootPaths paths =
      DefaultBootPaths(name, config()->EffectiveSocketPath().parent_path(), state_.VmDir(name));
  auto config = MakeBootVmConfig(req, paths);
  if (!config.ok()) {
    responder->Fail(kErrBadRequest, config.error().message);
    return;
  }
  auto accel = ParseAccel(req.accel);
  booting_.insert(name);
  // A gone/stopped/failed VM of that name still holds its files: stop it
  // first and boot when that is done (its cleanup must not remove the new
  // QEMU's files).
  std::shared_ptr<VmSupervisor> old = registry_.Find(name);
  auto launch = [this, name, boot = req, paths, vm_config = *config, accel_kind = *accel, responder,
                 inputs, kernel = *kernel_fd, initrd = *initrd_fd, kernel_what, initrd_what] {
    Status copied = MakeDirs(inputs, 0700);
    if (copied.ok())
      copied = ::chmod(inputs.c_str(), 0700) == 0
                   ? Status()
                   : Status(Error{"chmod " + inputs.string() + ": " + std::strerror(errno)});
    if (copied.ok())
      copied = CopyClientFile(kernel->get(), kernel_what, boot.kernel, kMaxKernelBytes);
    if (copied.ok() && initrd) {
      copied =
          CopyClientFile(initrd->get(), initrd_what, boot.initrd.value_or(""), kMaxInitrdBytes);
    }
    if (!copied.ok()) {
      asio::post(io_, [this, name, responder, why = copied.error().message] {
        booting_.erase(name);
        responder->Fail(kErrVmFailed, "boot " + name + ": " + why);
      });
      return;
    }
    LaunchBoot(name, boot, paths, vm_config, accel_kind, responder);
  };
  if (old && old->backend()) {
    registry_.Remove(name);
    (void)SetOffline(name);
    old->Stop([this, name, launch] {
      RemoveRemnants(name);
      launch();
    });
    return;
  }
  asio::post(pool_, launch);
}

std::optional<VmKind> Daemon::RecordedKind(const std::string& name) {
  if (auto vm = registry_.Find(name); vm && vm->backend()) {
    return vm->backend()->kind() == "libvirt" ? VmKind::kLibvirt : VmKind::kQmp;
  }
  std::error_code ec;
  if (std::filesystem::exists(LibvirtVmRecordPath(state_.VmDir(name)), ec)) {
    return VmKind::kLibvirt;
  }
  if (std::filesystem::exists(QmpVmSpecPath(state_.VmDir(name)), ec)) return VmKind::kQmp;
  return std::nullopt;
}

Result<VmKind> Daemon::AdoptKind(const std::string& command, const std::string& name,
                                 bool qmp_given) {
  const std::optional<VmKind> recorded = RecordedKind(name);
  const std::string forget = ", or `hvtrace stop " + name + "` first to forget it";
  if (recorded == VmKind::kLibvirt && qmp_given) {
    return Error{command + " " + name + ": VM '" + name +
                 "' is a libvirt domain on record; drop --qmp" + forget};
  }
  if (recorded == VmKind::kQmp && !qmp_given) {
    return Error{command + " " + name + ": VM '" + name +
                 "' is a QEMU watched over QMP on record; give its socket (--qmp SOCK)" + forget};
  }
  if (recorded) return *recorded;
  return qmp_given ? VmKind::kQmp : VmKind::kLibvirt;
}

// adopt NAME --qmp SOCK [--boot-region FILE@GPA:SIZE]: a QEMU someone else
// started. adopt NAME [--domain D]: a libvirt domain. Which of the two, the
// VM's record says once it has one (AdoptKind).
void Daemon::HandleAdopt(const Request& request, const AdoptRequest& args,
                         const ResponderPtr& responder) {
  Result<VmKind> kind = AdoptKind("adopt", args.name, args.qmp.has_value());
  if (!kind.ok()) {
    responder->Fail(kErrBadRequest, kind.error().message);
    return;
  }
  // A libvirt adopt makes the VM's directory once the domain is found.
  if (!ReadyForNewVm(args.name, *responder, /*make_dir=*/*kind == VmKind::kQmp)) return;
  switch (*kind) {
    case VmKind::kQmp:
      return AdoptQmp(request, args, responder);
    case VmKind::kLibvirt:
      return AdoptLibvirt(args, responder);
  }
}

void Daemon::AdoptLibvirt(const AdoptRequest& args, const ResponderPtr& responder) {
  const std::string name = args.name;
  if (!libvirt_) {
    responder->Fail(kErrBadRequest, "adopt " + name +
                                        ": give --qmp SOCK (a QEMU of your own), or set "
                                        "libvirt_uri in hvtraced.conf to adopt libvirt domains");
    return;
  }
  const std::string domain_name = args.domain.value_or(name);
  // libvirt calls block (and must not run on the event loop's thread).
  asio::post(pool_, [this, name, domain_name, responder] {
    Result<AdoptReply> r = libvirt_->Adopt(name, domain_name);
    if (r.ok()) {
      responder->Reply(*r);
    } else {
      responder->Fail(kErrVmFailed, "adopt " + name + ": " + r.error().message);
    }
  });
}

void Daemon::AdoptQmp(const Request& request, const AdoptRequest& args,
                      const ResponderPtr& responder) {
  const std::string name = args.name;
  // Without a boot region the VM is watched for `hvtrace attach`.
  const bool boot_range = args.boot_region.has_value();
  auto parsed = boot_range ? ParseBootRegion(*args.boot_region) : Result<QmpVmSpec>(QmpVmSpec{});
  if (!parsed.ok()) {
    responder->Fail(kErrBadRequest, parsed.error().message);
    return;
  }
  QmpVmSpec spec = *parsed;
  // The file is QEMU's node-1 backing file: the range starts at its offset 0
  // (gpa_layout.h), whatever GPA the guest sees it at.
  spec.qmp_socket = std::filesystem::absolute(args.qmp.value_or("")).string();
  // SIZE sizes the capture copy buffers (allocated at registration): capped
  // before anything is allocated, and checked against the file the client
  // passed (never a path the daemon opens).
  SharedFd region_fd;
  if (boot_range) {
    if (spec.region_size > kMaxAdoptRegionBytes) {
      responder->Fail(kErrBadRequest, "adopt " + name + ": boot region SIZE " +
                                          std::to_string(spec.region_size) + " exceeds " +
                                          std::to_string(kMaxAdoptRegionBytes) + " bytes");
      return;
    }
    auto file = RequestFile(request, "boot_region", UINT64_MAX, /*required=*/true);
    struct stat st;
    if (file.ok() && ::fstat((*file)->get(), &st) == 0 &&
        static_cast<uint64_t>(st.st_size) < spec.region_size) {
      file = Error{"region file " + spec.region_path.string() + " is shorter than " +
                   std::to_string(spec.region_size)};
    } else if (file.ok() && st.st_uid != 0 && request.peer_uid != st.st_uid) {
      file = Error{"region file " + spec.region_path.string() + " belongs to uid " +
                   std::to_string(st.st_uid) + ", not to the requesting user or root"};
    }
    if (!file.ok()) {
      responder->Fail(kErrBadRequest, "adopt " + name + ": " + file.error().message);
      return;
    }
    region_fd = *file;
  }
  if (Status s = CheckQmpPeer(request, spec.qmp_socket); !s.ok()) {
    responder->Fail(kErrBadRequest, "adopt " + name + ": " + s.error().message);
    return;
  }
  if (Status s = RegisterQmpVm(name, spec, nullptr, region_fd ? region_fd->get() : -1); !s.ok()) {
    responder->Fail(kErrInternal, s.error().message);
    return;
  }
  AdoptReply reply;
  reply.name = name;
  reply.region = MessageToJson(BootRegionOf(spec));
  reply.qmp = spec.qmp_socket;
  responder->Reply(reply);
}

void Daemon::LaunchBoot(const std::string& name, const BootRequest& boot, const BootPaths& paths,
                        const VmConfig& vm_config, Accel accel_kind,
                        const std::shared_ptr<Responder>& responder) {
  // Slow: the KVM probe (first time only), QEMU start-up, hashing vmlinuz.
  if (accel_kind == Accel::kAuto)
    LogInfo("boot " + name + ": accel auto: " + KvmVerdict(boot.kernel).reason);
  // The config in force now (a reload changes the VMs booted after it).
  const std::shared_ptr<const Config> config_now = config();
  Result<QemuUser> qemu_user = ResolveQemuUser(config_now->qemu_user, name);
  if (qemu_user.ok() && !qemu_user->warning.empty()) LogWarning(qemu_user->warning);
  Result<std::unique_ptr<Vm>> started =
      qemu_user.ok() ? PrepareBackingFile(name, paths.backing_file, *qemu_user)
                     : Result<std::unique_ptr<Vm>>(qemu_user.error());
  if (started.ok()) {
    if (Status s = PrepareQemuTraceLog(name, vm_config, paths.qemu_trace_log); !s.ok()) {
      ::unlink(paths.backing_file.c_str());
      started = s.error();
    }
  }
  if (started.ok()) {
    VmConfig prepared = vm_config;
    prepared.boot_range->prepared = true;
    prepared.sandbox = config_now->qemu_sandbox;
    prepared.run_as = qemu_user->run_as;
    prepared.qemu_binary = config_now->qemu_binary;
    // Under systemd QEMU gets its own scope, outside hvtraced.service's
    // cgroup: stopping the service leaves it to vm_on_shutdown.
    if (SystemdBooted()) prepared.launcher = SystemdScopeLauncher(name);
    started = Vm::Start(prepared, ResolveKvm(accel_kind, boot.kernel), std::chrono::seconds(15),
                        VmLifetime::kIndependent);
    // A QEMU that never ran leaves nothing behind (the directory is ours).
    if (!started.ok()) ::unlink(paths.backing_file.c_str());
  }
  std::string kernel_key;
  if (started.ok()) {
    if (auto key = KernelKeyOfFile(boot.kernel); key.ok()) kernel_key = *key;
  }
  // Registering touches the registry and the io_context's QMP objects: back
  // on the I/O thread.
  auto finish = [this, name, boot, paths, kernel_key, responder, accel_kind,
                 started =
                     std::make_shared<Result<std::unique_ptr<Vm>>>(std::move(started))]() mutable {
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
    spec.meta_socket = paths.meta_socket;
    if (boot.trace_boot) spec.qemu_trace_log = paths.qemu_trace_log;
    spec.vmcore = boot.vmcore;
    spec.memory_bytes = boot.memory_mib << 20;
    spec.booted_by_daemon = true;
    spec.kernel_path = std::filesystem::absolute(boot.kernel).string();
    spec.kernel_key = kernel_key;
    if (boot.initrd) spec.initrd_path = std::filesystem::absolute(*boot.initrd).string();
    BootReply reply;
    reply.name = name;
    reply.pid = vm->pid();
    reply.kvm = vm->kvm();
    reply.argv = vm->plan().argv;
    // Why auto chose what it chose (kvm_probe.h), so a TCG guest on a KVM
    // host is never a mystery.
    if (accel_kind == Accel::kAuto) reply.kvm_probe = KvmVerdict(boot.kernel).reason;  // Cached.
    if (stopping_) {
      // The daemon began to exit while QEMU started: treat the new VM as
      // the shutdown policy says (its spec is saved for re-adoption).
      (void)SaveQmpVmSpec(state_.VmDir(name), spec);
      if (config()->vm_on_shutdown == VmOnShutdown::kKeep) vm->Release();
      responder->Fail(kErrVmFailed,
                      "boot " + name + ": hvtraced is shutting down (vm_on_shutdown = " +
                          std::string(VmOnShutdownName(config()->vm_on_shutdown)) + ")");
      return;
    }
    if (Status s = RegisterQmpVm(name, spec, std::move(vm)); !s.ok()) {
      responder->Fail(kErrInternal, s.error().message);
      return;
    }
    reply.region = BootRegionOf(spec);
    reply.qmp = spec.qmp_socket;
    reply.console_log = spec.console_log;
    reply.console_socket = spec.console_socket;
    reply.meta_socket = spec.meta_socket;
    if (!spec.qemu_trace_log.empty()) reply.qemu_trace_log = spec.qemu_trace_log;
    responder->Reply(reply);
  };
  asio::post(io_, std::move(finish));
}

Status Daemon::CheckQmpPeer(const Request& request, const std::string& socket) const {
  auto uid = UnixSocketPeerUid(socket);
  if (!uid.ok()) return Error{"QMP socket: " + uid.error().message};
  if (*uid == 0 || *uid == ::geteuid() || (request.peer_uid && *request.peer_uid == *uid)) {
    return {};
  }
  return Error{"QMP socket " + socket + " is served by uid " + std::to_string(*uid) +
               ", not by the requesting user (uid " +
               (request.peer_uid ? std::to_string(*request.peer_uid) : std::string("?")) +
               ") or root"};
}

void Daemon::RemoveRemnants(const std::string& name) {
  // For an offline VM whose QEMU hvtraced booted and which exited meanwhile:
  // its sockets and /dev/shm file. A live process's files are never touched
  // here (a backend with a Vm removes those after stopping it).
  auto spec = LoadQmpVmSpec(state_.VmDir(name));
  if (!spec.ok() || !spec->booted_by_daemon) return;
  if (spec->pid_start_time != 0 && StillRunning(spec->pid, spec->pid_start_time)) return;
  std::error_code ec;
  for (const std::string& path : spec->owned_paths) std::filesystem::remove(path, ec);
}

Status Daemon::RegisterQmpVm(const std::string& name, QmpVmSpec spec, std::unique_ptr<Vm> vm,
                             int region_fd) {
  const std::filesystem::path vm_dir = state_.VmDir(name);
  // The owner a restarted daemon will require of the file at this path: the
  // client's file it adopted, or the file it made for a VM it booted (in its
  // own private directory).
  struct stat st;
  const bool known = region_fd >= 0 ? ::fstat(region_fd, &st) == 0
                                    : spec.booted_by_daemon && !spec.region_path.empty() &&
                                          ::lstat(spec.region_path.c_str(), &st) == 0;
  if (known) spec.region_owner = st.st_uid;
  if (Status s = SaveQmpVmSpec(vm_dir, spec); !s.ok())
    LogWarning("VM " + name + ": " + s.error().message);
  auto backend = std::make_unique<QmpVmBackend>(io_.get_executor(), spec, std::move(vm), vm_dir);
  if (region_fd >= 0) backend->UseRegionFd(region_fd);
  if (Status s = ReplaceVm(name, std::move(backend)); !s.ok()) return s;
  LogNotice("VM " + name + ": " + (spec.booted_by_daemon ? "booted" : "adopted") + ", pid " +
            std::to_string(spec.pid) + ", region " + spec.region_path.string());
  return {};
}

void Daemon::ReadoptVm(const std::string& name) {
  switch (RecordedKind(name).value_or(VmKind::kQmp)) {
    case VmKind::kQmp:
      ReadoptQmpVm(name);
      return;
    case VmKind::kLibvirt:
      if (libvirt_) {
        libvirt_->QueueReadopt(name);
      } else {
        LogWarning("VM " + name +
                   ": a libvirt domain on record, but libvirt_uri is not set; kept offline "
                   "(its captures stay listed)");
      }
      return;
  }
}

void Daemon::ReadoptQmpVm(const std::string& name) {
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
  if (gone.empty() && !std::filesystem::exists(spec->qmp_socket, ec))
    gone = "QMP socket " + spec->qmp_socket + " is gone";
  if (gone.empty() && spec->region_size != 0 && !std::filesystem::exists(spec->region_path, ec)) {
    gone = "region file " + spec->region_path.string() + " is gone";
  }
  if (!vm && !gone.empty() && spec->booted_by_daemon && !spec->exited && spec->region_size != 0 &&
      std::filesystem::exists(spec->region_path, ec)) {
    // Our QEMU exited while no daemon watched, but its region file is still
    // there: capture it now ("qemu-gone", as if we had seen it go), then let
    // `hvtrace stop` remove the remnants. Nothing the guest wrote is lost.
    auto backend = std::make_unique<QmpVmBackend>(
        io_.get_executor(), *spec, Vm::Remnant(name, spec->owned_paths), state_.VmDir(name));
    if (Status s = ReplaceVm(name, std::move(backend)); !s.ok()) {
      LogWarning("VM " + name +
                 ": cannot capture the region left by its QEMU: " + s.error().message);
      return;
    }
    if (auto vm_supervisor = registry_.Find(name)) {
      vm_supervisor->OnVmGone("QEMU exited while hvtraced was not running (" + gone + ")");
    }
    // Once is enough: a later daemon only lists it (and `stop` cleans up).
    spec->exited = true;
    if (Status s = SaveQmpVmSpec(state_.VmDir(name), *spec); !s.ok())
      LogWarning("VM " + name + ": " + s.error().message);
    LogNotice("VM " + name + ": QEMU is gone (" + gone + "); capturing its region file " +
              spec->region_path.string());
    return;
  }
  if (!gone.empty()) {
    if (vm) vm->Release();  // Not ours to stop on a doubt.
    LogNotice(
        "VM " + name + ": not re-adopted (" + gone + "); keeping it offline" +
        (spec->booted_by_daemon ? "; `hvtrace stop " + name + "` removes what its QEMU left" : ""));
    return;
  }
  auto backend =
      std::make_unique<QmpVmBackend>(io_.get_executor(), *spec, std::move(vm), state_.VmDir(name));
  if (Status s = ReplaceVm(name, std::move(backend)); !s.ok()) {
    LogWarning("VM " + name + ": re-adopt failed: " + s.error().message);
    return;
  }
  LogNotice("VM " + name + ": re-adopted (" +
            (spec->booted_by_daemon ? "booted by hvtraced, pid " : "adopted, pid ") +
            std::to_string(spec->pid) + ", QMP " + spec->qmp_socket + ")");
}

}  // namespace hvtrace::hostd
