// The command table and the handlers that do not depend on a VM's kind.
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <boost/asio/post.hpp>
#include <cerrno>
#include <cstring>
#include <map>
#include <vector>

#include "daemon.h"
#include "daemon_libvirt.h"
#include "daemon_log.h"

namespace hvtrace::hostd {

namespace asio = boost::asio;
using nlohmann::json;

namespace {

// More files than any capture holds (manifest, region, a trace.dat and a
// host-clock file per boot, host.dat): the reply's descriptors stay bounded.
constexpr size_t kMaxCaptureFiles = 128;

struct OpenedCaptureFile {
  std::string name;
  uint64_t bytes = 0;
  SharedFd fd;
};

// Opens every regular file of the capture directory |dir| read-only. |dir|
// comes from the daemon's own listing of a VM's captures, never from a
// client; O_NOFOLLOW and openat keep a symlink in the state dir from
// redirecting root's opens elsewhere.
Result<std::vector<OpenedCaptureFile>> OpenCaptureFiles(const std::filesystem::path& dir) {
  UniqueFd dir_fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (dir_fd.get() < 0) return Error{"cannot open " + dir.string() + ": " + std::strerror(errno)};
  const int list_fd = ::dup(dir_fd.get());
  DIR* listing = list_fd < 0 ? nullptr : ::fdopendir(list_fd);
  if (listing == nullptr) {
    if (list_fd >= 0) ::close(list_fd);
    return Error{"cannot list " + dir.string() + ": " + std::strerror(errno)};
  }
  std::vector<OpenedCaptureFile> files;
  Status status;
  while (struct dirent* entry = ::readdir(listing)) {
    const std::string name = entry->d_name;
    if (name.empty() || name[0] == '.') continue;  // ., .., and writers' hidden part files
    const int fd = ::openat(dir_fd.get(), name.c_str(),
                            O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    if (fd < 0) continue;  // A subdirectory or a symlink: not a capture file.
    auto shared = std::make_shared<UniqueFd>(fd);
    struct stat st;
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) continue;
    if (files.size() == kMaxCaptureFiles) {
      status = Error{dir.string() + " holds more than " + std::to_string(kMaxCaptureFiles) +
                     " files; read it as root"};
      break;
    }
    files.push_back({name, static_cast<uint64_t>(st.st_size), std::move(shared)});
  }
  ::closedir(listing);
  if (!status.ok()) return status.error();
  std::sort(files.begin(), files.end(),
            [](const auto& a, const auto& b) { return a.name < b.name; });
  return files;
}

}  // namespace

// Parses |request|'s args into |Message| (its one JSON mapping,
// control/requests.h) and calls |Handler| with it; a request that does not
// parse is refused here, so no handler reads raw args.
template <class Message, void (Daemon::*Handler)(const Request&, const Message&,
                                                 const std::shared_ptr<Responder>&)>
void Daemon::Dispatch(Daemon& daemon, const Request& request,
                      const std::shared_ptr<Responder>& responder) {
  Result<Message> message = ParseMessage<Message>(request.args);
  if (!message.ok()) {
    responder->Fail(kErrBadRequest, message.error().message);
    return;
  }
  (daemon.*Handler)(request, *message, responder);
}

// Every command names its message and the role it needs: observers look,
// admins change state. A command added without a role is refused to
// everyone.
const std::map<std::string, Daemon::Command, std::less<>>& Daemon::CommandTable() {
  constexpr Role kObserver = Role::kObserver;
  constexpr Role kAdmin = Role::kAdmin;
  using D = Daemon;
  static const std::map<std::string, Daemon::Command, std::less<>> kTable = {
      {PingRequest::kCommand, {&Dispatch<PingRequest, &D::HandlePing>, kObserver}},
      {VersionRequest::kCommand, {&Dispatch<VersionRequest, &D::HandleVersion>, kObserver}},
      {ListRequest::kCommand, {&Dispatch<ListRequest, &D::HandleList>, kObserver}},
      {StatusRequest::kCommand, {&Dispatch<StatusRequest, &D::HandleStatus>, kObserver}},
      {CapturesRequest::kCommand, {&Dispatch<CapturesRequest, &D::HandleCaptures>, kObserver}},
      // Read-only descriptors of one capture's files: reading a capture is
      // an observer's right, whatever the state dir's group says.
      {CaptureFilesRequest::kCommand,
       {&Dispatch<CaptureFilesRequest, &D::HandleCaptureFiles>, kObserver}},
      {StreamRequest::kCommand, {&Dispatch<StreamRequest, &D::HandleStream>, kObserver}},
      // The daemon's formats cache (formats_commands.cc): anyone may see what
      // it holds; filling it boots a guest and writes what every VM decodes
      // with.
      {FormatsListRequest::kCommand,
       {&Dispatch<FormatsListRequest, &D::HandleFormatsList>, kObserver}},
      {FormatsHarvestRequest::kCommand,
       {&Dispatch<FormatsHarvestRequest, &D::HandleFormatsHarvest>, kAdmin}},
      {ShutdownRequest::kCommand, {&Dispatch<ShutdownRequest, &D::HandleShutdown>, kAdmin}},
      {BootRequest::kCommand, {&Dispatch<BootRequest, &D::HandleBoot>, kAdmin}},
      {AdoptRequest::kCommand, {&Dispatch<AdoptRequest, &D::HandleAdopt>, kAdmin}},
      {ManualCaptureRequest::kCommand,
       {&Dispatch<ManualCaptureRequest, &D::HandleCapture>, kAdmin}},
      {StopRequest::kCommand, {&Dispatch<StopRequest, &D::HandleStop>, kAdmin}},
      {AttachRequest::kCommand, {&Dispatch<AttachRequest, &D::HandleAttach>, kAdmin}},
      {DetachRequest::kCommand, {&Dispatch<DetachRequest, &D::HandleDetach>, kAdmin}},
      // Edits a libvirt domain's persistent definition (also --dry-run: it
      // shows that definition, which only admins read).
      {SetupRequest::kCommand, {&Dispatch<SetupRequest, &D::HandleSetup>, kAdmin}},
  };
  return kTable;
}

const Daemon::Command* Daemon::FindCommand(std::string_view cmd) {
  auto it = CommandTable().find(cmd);
  return it == CommandTable().end() ? nullptr : &it->second;
}

std::string Daemon::CommandNames() {
  std::string names;
  for (const auto& [name, handler] : CommandTable()) names += (names.empty() ? "" : ", ") + name;
  return names;
}

void Daemon::HandleRequest(const Request& request, const PeerCredentials& peer,
                           const std::shared_ptr<Responder>& responder) {
  try {
    const Command* command = FindCommand(request.cmd);
    if (command == nullptr) {
      responder->Fail(kErrUnknownCommand,
                      "unknown command '" + request.cmd + "'; known: " + CommandNames());
      return;
    }
    if (!Allows(PeerRole(access_, peer), command->role)) {
      LogWarning("refused: " + RefusalMessage(request.cmd, access_, peer, command->role));
      responder->Fail(kErrDenied, RefusalMessage(request.cmd, access_, peer, command->role));
      return;
    }
    command->dispatch(*this, request, responder);
  } catch (const std::exception& e) {
    responder->Fail(kErrInternal, std::string("'") + request.cmd + "' failed: " + e.what());
  }
}

std::shared_ptr<VmSupervisor> Daemon::VmNamed(const std::string& name, Responder& responder) {
  auto vm = registry_.Find(name);
  if (!vm) {
    std::string known;
    for (const auto& s : registry_.All()) known += (known.empty() ? "" : ", ") + s->name();
    responder.Fail(kErrUnknownVm,
                   "no VM named '" + name + "' (known: " + (known.empty() ? "none" : known) + ")");
  }
  return vm;
}

bool Daemon::ReadyForNewVm(const std::string& name, Responder& responder, bool make_dir) {
  if (Status s = ValidateVmName(name); !s.ok()) {
    responder.Fail(kErrBadRequest, s.error().message);
    return false;
  }
  if (booting_.count(name) != 0 || stopping_vms_.count(name) != 0) {
    responder.Fail(kErrBusy, "VM '" + name + "' is being booted or stopped by an earlier request");
    return false;
  }
  if (auto existing = registry_.Find(name); existing && existing->live()) {
    responder.Fail(kErrBusy, "VM '" + name + "' is " + std::string(VmStateName(existing->state())) +
                                 "; `hvtrace stop " + name + "` first");
    return false;
  }
  if (!make_dir) return true;
  if (Status s = MakeDirs(state_.VmDir(name), 0750); !s.ok()) {
    responder.Fail(kErrInternal, s.error().message);
    return false;
  }
  return true;
}

void Daemon::HandlePing(const Request&, const PingRequest&, const ResponderPtr& responder) {
  PingReply pong;
  pong.pid = ::getpid();
  pong.uptime_ms = (HostTime::Now().monotonic_ns - started_.monotonic_ns) / 1000000;
  if (libvirt_) pong.libvirt = libvirt_->StatusJson();
  // Whether captures are waiting, and in which lane (capture_queue.h).
  pong.capture_queue = capture_queue_->StatsJson();
  // What the daemon holds for captures: one set per worker, not one per VM.
  pong.copy_buffers = captures_->copy_pool().ToJson();
  // The fleet upload: queued captures, their state and the last error.
  pong.upload = MessageToJson(uploader_ ? uploader_->Stats() : UploadStats{});
  responder->Reply(pong);
}

void Daemon::HandleList(const Request&, const ListRequest&, const ResponderPtr& responder) {
  ListReply list;
  for (const auto& vm : registry_.All()) list.vms.push_back(vm->Status());
  responder->Reply(list);
}

void Daemon::HandleStatus(const Request&, const StatusRequest& args,
                          const ResponderPtr& responder) {
  auto vm = VmNamed(args.name, *responder);
  if (!vm) return;
  // Whether a panic now decodes by name: the kernel's formats are loaded or
  // cached, or still being harvested (a kernel's first boot). Looking in the
  // cache reads a file: off the I/O thread.
  asio::post(pool_, [vm, formats = formats_, responder] {
    VmStatusReply status = vm->Status();
    if (vm->backend()) {
      const std::string key = vm->backend()->kernel_files().key;
      if (!key.empty()) status.formats = formats->StateOf(key);
    }
    responder->Reply(status);
  });
}

void Daemon::HandleCaptures(const Request&, const CapturesRequest& args,
                            const ResponderPtr& responder) {
  auto vm = VmNamed(args.name, *responder);
  if (!vm) return;
  // Reading manifests touches the disk: off the I/O thread.
  asio::post(pool_, [vm, responder] {
    auto list = vm->ListCaptures();
    if (!list.ok()) {
      responder->Fail(kErrInternal, list.error().message);
      return;
    }
    CapturesReply reply;
    reply.vm = vm->name();
    for (const auto& e : *list) reply.captures.push_back(e.summary);
    responder->Reply(reply);
  });
}

// capture-files {capture: ID, name?: VM}: the capture's files as read-only
// descriptors, one per stream item {file, bytes}, then {vm, capture, dir,
// files}. Without a name, the one VM that has a capture ID.
//
// Descriptors, not the bytes in the stream: a capture is megabytes to
// gigabytes (region.bin), which the JSON-line replies would have to carry
// encoded through the I/O thread and its per-client unsent-bytes cap, and
// the client would read every byte even of files it does not need. A
// read-only descriptor gives the client exactly what the observer role
// allows (reading this capture) and nothing else: no write, no directory to
// walk, no path of its choosing opened by root.
void Daemon::HandleCaptureFiles(const Request& request, const CaptureFilesRequest& args,
                                const ResponderPtr& responder) {
  const std::string id = args.capture;
  std::vector<std::shared_ptr<VmSupervisor>> vms;
  if (args.name) {
    auto vm = VmNamed(*args.name, *responder);
    if (!vm) return;
    vms.push_back(std::move(vm));
  } else {
    vms = registry_.All();
  }
  const std::string who = "uid " + std::to_string(request.peer_uid.value_or(0));
  // Listing and opening touch the disk: off the I/O thread.
  asio::post(pool_, [vms, id, who, responder] {
    std::vector<std::pair<std::string, std::filesystem::path>> found;  // VM, dir
    for (const auto& vm : vms) {
      auto list = vm->ListCaptures();
      if (!list.ok()) continue;
      for (const CaptureEntry& e : *list) {
        if (e.id == id) found.push_back({vm->name(), e.dir});
      }
    }
    if (found.size() != 1) {
      std::string where;
      for (const auto& [vm, dir] : found) where += (where.empty() ? "" : ", ") + vm + "/" + id;
      std::string scope = vms.size() == 1 ? "VM '" + vms[0]->name() + "'" : "any VM";
      responder->Fail(kErrUnknownCapture, found.empty()
                                              ? scope + " has no capture '" + id +
                                                    "' (`hvtrace captures VM` lists them)"
                                              : "capture '" + id + "' exists for several VMs (" +
                                                    where + "): name one as VM/" + id);
      return;
    }
    const auto& [vm_name, dir] = found[0];
    auto files = OpenCaptureFiles(dir);
    if (!files.ok()) {
      responder->Fail(kErrInternal, "capture " + vm_name + "/" + id + " for " + who + ": " +
                                        files.error().message);
      return;
    }
    for (OpenedCaptureFile& f : *files) {
      responder->Stream(CaptureFileItem{{}, f.name, f.bytes}, {std::move(f.fd)});
    }
    LogDebug(who + " read capture " + vm_name + "/" + id + " (" + std::to_string(files->size()) +
             " files)");
    responder->End(CaptureFilesReply{{}, vm_name, id, dir.string(), files->size()});
  });
}

void Daemon::HandleShutdown(const Request&, const ShutdownRequest&, const ResponderPtr& responder) {
  responder->Reply(ShutdownReply{});
  RequestShutdown("shutdown command");
}

void Daemon::HandleCapture(const Request&, const ManualCaptureRequest& args,
                           const ResponderPtr& responder) {
  auto vm = VmNamed(args.name, *responder);
  if (!vm) return;
  vm->RequestCapture("manual", [responder](Result<CaptureSummary> result) {
    if (!result.ok()) {
      responder->Fail(kErrVmFailed, result.error().message);
      return;
    }
    responder->Reply(
        ManualCaptureReply{{}, result->id, result->trigger, result->trigger_to_disk_ms});
  });
}

// Any kind of VM: stop watching it (a QEMU hvtraced booted is shut down and
// its files removed; an adopted QEMU or a libvirt domain is only let go) and
// list it offline, so its captures stay reachable. The reply waits for the
// backend to stop, so a `boot` of the same name right after never races the
// cleanup.
void Daemon::HandleStop(const Request&, const StopRequest& args, const ResponderPtr& responder) {
  auto vm = VmNamed(args.name, *responder);
  if (!vm) return;
  const std::string name = vm->name();
  if (booting_.count(name) != 0 || stopping_vms_.count(name) != 0) {
    responder->Fail(kErrBusy, "VM '" + name + "' is being booted or stopped by an earlier request");
    return;
  }
  const std::string kind = vm->backend() ? std::string(vm->backend()->kind()) : std::string("none");
  registry_.Remove(name);
  (void)SetOffline(name);
  stopping_vms_.insert(name);
  vm->Stop([this, name, kind, responder] {
    RemoveRemnants(name);
    // Forgotten: a restarted daemon does not re-adopt it.
    std::error_code ec;
    std::filesystem::remove(QmpVmSpecPath(state_.VmDir(name)), ec);
    std::filesystem::remove(LibvirtVmRecordPath(state_.VmDir(name)), ec);
    asio::post(io_, [this, name, kind, responder] {
      stopping_vms_.erase(name);
      responder->Reply(StopReply{{}, name, kind, kind == "libvirt"});
    });
  });
}

}  // namespace hvtrace::hostd
