// The command table and the handlers that do not depend on a VM's kind.
#include <sys/stat.h>
#include <unistd.h>

#include <boost/asio/post.hpp>
#include <map>

#include "daemon.h"
#include "daemon_libvirt.h"
#include "daemon_log.h"

namespace hvtrace::hostd {

namespace asio = boost::asio;
using nlohmann::json;

// Every command names the role it needs: observers look, admins change
// state. A command added without a role is refused to everyone.
const std::map<std::string, Daemon::Command, std::less<>>& Daemon::CommandTable() {
  constexpr Role kObserver = Role::kObserver;
  constexpr Role kAdmin = Role::kAdmin;
  static const std::map<std::string, Daemon::Command, std::less<>> kTable = {
      {"ping", {&Daemon::HandlePing, kObserver}},
      {"version", {&Daemon::HandleVersion, kObserver}},
      {"list", {&Daemon::HandleList, kObserver}},
      {"status", {&Daemon::HandleStatus, kObserver}},
      {"captures", {&Daemon::HandleCaptures, kObserver}},
      {"stream", {&Daemon::HandleStream, kObserver}},
      {"shutdown", {&Daemon::HandleShutdown, kAdmin}},
      {"boot", {&Daemon::HandleBoot, kAdmin}},
      {"adopt", {&Daemon::HandleAdopt, kAdmin}},
      {"capture", {&Daemon::HandleCapture, kAdmin}},
      {"stop", {&Daemon::HandleStop, kAdmin}},
      {"attach", {&Daemon::HandleAttach, kAdmin}},
      {"detach", {&Daemon::HandleDetach, kAdmin}},
      // Edits a libvirt domain's persistent definition (also --dry-run: it
      // shows that definition, which only admins read).
      {"setup", {&Daemon::HandleSetup, kAdmin}},
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
    (this->*command->handler)(request, responder);
  } catch (const std::exception& e) {
    responder->Fail(kErrInternal, std::string("'") + request.cmd + "' failed: " + e.what());
  }
}

std::shared_ptr<VmSupervisor> Daemon::VmFromArgs(const Request& request, Responder& responder) {
  auto it = request.args.find("name");
  if (it == request.args.end() || !it->is_string()) {
    responder.Fail(kErrBadRequest, "'" + request.cmd + "' needs args.name (a VM name)");
    return nullptr;
  }
  const std::string& name = it->get_ref<const std::string&>();
  if (Status s = ValidateVmName(name); !s.ok()) {
    responder.Fail(kErrBadRequest, s.error().message);
    return nullptr;
  }
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

void Daemon::HandlePing(const Request&, const std::shared_ptr<Responder>& responder) {
  json pong = {{"pong", true},
               {"pid", ::getpid()},
               {"uptime_ms", (HostTime::Now().monotonic_ns - started_.monotonic_ns) / 1000000}};
  pong["libvirt"] = libvirt_ ? libvirt_->StatusJson() : json(nullptr);
  // Whether captures are waiting, and in which lane (capture_queue.h).
  pong["capture_queue"] = capture_queue_->StatsJson();
  // What the daemon holds for captures: one set per worker, not one per VM.
  pong["copy_buffers"] = captures_->copy_pool().ToJson();
  // The fleet upload: queued captures, their state and the last error.
  pong["upload"] = uploader_ ? uploader_->StatsJson() : json{{"enabled", false}};
  responder->Reply(pong);
}

void Daemon::HandleList(const Request&, const std::shared_ptr<Responder>& responder) {
  json vms = json::array();
  for (const auto& vm : registry_.All()) vms.push_back(vm->StatusJson());
  responder->Reply({{"vms", std::move(vms)}});
}

void Daemon::HandleStatus(const Request& request, const std::shared_ptr<Responder>& responder) {
  if (auto vm = VmFromArgs(request, *responder)) responder->Reply(vm->StatusJson());
}

void Daemon::HandleCaptures(const Request& request, const std::shared_ptr<Responder>& responder) {
  auto vm = VmFromArgs(request, *responder);
  if (!vm) return;
  // Reading manifests touches the disk: off the I/O thread.
  asio::post(pool_, [vm, responder] {
    auto list = vm->ListCaptures();
    if (!list.ok()) {
      responder->Fail(kErrInternal, list.error().message);
      return;
    }
    json captures = json::array();
    for (const auto& e : *list) captures.push_back(e.summary);
    responder->Reply({{"vm", vm->name()}, {"captures", std::move(captures)}});
  });
}

void Daemon::HandleShutdown(const Request&, const std::shared_ptr<Responder>& responder) {
  responder->Reply({{"stopping", true}});
  RequestShutdown("shutdown command");
}

void Daemon::HandleCapture(const Request& request, const std::shared_ptr<Responder>& responder) {
  auto vm = VmFromArgs(request, *responder);
  if (!vm) return;
  vm->RequestCapture("manual", [responder](Result<CaptureSummary> result) {
    if (!result.ok()) {
      responder->Fail(kErrVmFailed, result.error().message);
      return;
    }
    responder->Reply({{"capture", result->id},
                      {"trigger", result->trigger},
                      {"trigger_to_disk_ms", result->trigger_to_disk_ms}});
  });
}

// Any kind of VM: stop watching it (a QEMU hvtraced booted is shut down and
// its files removed; an adopted QEMU or a libvirt domain is only let go) and
// list it offline, so its captures stay reachable. The reply waits for the
// backend to stop, so a `boot` of the same name right after never races the
// cleanup.
void Daemon::HandleStop(const Request& request, const std::shared_ptr<Responder>& responder) {
  auto vm = VmFromArgs(request, *responder);
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
      json reply = {{"stopped", name}, {"kind", kind}};
      if (kind == "libvirt") reply["libvirt"] = true;
      responder->Reply(reply);
    });
  });
}

}  // namespace hvtrace::hostd
