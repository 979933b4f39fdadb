#include "daemon_libvirt.h"

#include <unistd.h>

#include <boost/asio/post.hpp>

#include "daemon.h"
#include "daemon_log.h"
#include "libvirt_event_loop.h"
#include "vm_record.h"

namespace hvtrace::hostd {

namespace asio = boost::asio;
using nlohmann::json;

namespace {

constexpr auto kRetryMax = std::chrono::seconds(5);

}  // namespace

json LibvirtVmRecord::ToJson() const { return {{"domain", domain}, {"uuid", uuid}, {"uri", uri}}; }

Result<LibvirtVmRecord> LibvirtVmRecord::FromJson(const json& j) {
  if (!j.is_object() || !j.contains("uuid") || !j["uuid"].is_string() || !j.contains("domain") ||
      !j["domain"].is_string()) {
    return Error{"libvirt VM record needs string fields domain and uuid"};
  }
  LibvirtVmRecord r;
  r.domain = j["domain"].get<std::string>();
  r.uuid = j["uuid"].get<std::string>();
  r.uri = j.value("uri", std::string());
  return r;
}

std::filesystem::path LibvirtVmRecordPath(const std::filesystem::path& vm_dir) {
  return vm_dir / "libvirt_vm.json";
}

Status SaveLibvirtVmRecord(const std::filesystem::path& vm_dir, const LibvirtVmRecord& record) {
  return SaveVmRecord(LibvirtVmRecordPath(vm_dir), record);
}

Result<LibvirtVmRecord> LoadLibvirtVmRecord(const std::filesystem::path& vm_dir) {
  return LoadVmRecord<LibvirtVmRecord>(LibvirtVmRecordPath(vm_dir));
}

DaemonLibvirt::DaemonLibvirt(Daemon& daemon, StateDir state)
    : daemon_(daemon),
      state_(std::move(state)),
      uri_(daemon.config()->libvirt_uri),
      retry_timer_(daemon.io()) {}

DaemonLibvirt::~DaemonLibvirt() { Stop(); }

Status DaemonLibvirt::Start() {
  // libvirt takes one event loop per process and needs it before the first
  // connection; ours is the daemon's io_context, not a spinning thread.
  if (Status s = LibvirtEventLoop::Install(daemon_.io().get_executor()); !s.ok()) return s;
  asio::post(daemon_.pool(), [this] { TryConnect(); });
  return {};
}

void DaemonLibvirt::QueueReadopt(const std::string& name) {
  {
    std::lock_guard lock(mu_);
    if (stopping_) return;
    if (client_ == nullptr) {
      pending_readopt_.push_back(name);
      return;
    }
  }
  asio::post(daemon_.pool(), [this, name] { Readopt(name); });
}

void DaemonLibvirt::Stop() {
  std::shared_ptr<LibvirtClient> client;
  {
    std::lock_guard lock(mu_);
    if (stopping_) return;
    stopping_ = true;
    client = client_;
  }
  boost::system::error_code ignored;
  retry_timer_.cancel();
  (void)ignored;
  if (client) client->Close();
}

std::shared_ptr<LibvirtClient> DaemonLibvirt::client() const {
  std::lock_guard lock(mu_);
  return client_;
}

Result<std::shared_ptr<LibvirtClient>> DaemonLibvirt::Connected() const {
  std::lock_guard lock(mu_);
  if (client_ != nullptr) return client_;
  return Error{"libvirt at '" + uri_ + "' is not connected (" +
               (last_error_.empty() ? std::string("connecting") : last_error_) +
               "); hvtraced keeps retrying"};
}

LibvirtBackendOptions DaemonLibvirt::backend_options() const {
  LibvirtBackendOptions o;
  o.blocking = daemon_.pool().get_executor();
  o.qemu_log_dir = daemon_.config()->libvirt_qemu_log_dir;
  return o;
}

// On the pool: virConnectOpen blocks until libvirtd answers or refuses.
void DaemonLibvirt::TryConnect() {
  {
    std::lock_guard lock(mu_);
    if (stopping_) return;
    ++connect_attempts_;
  }
  LibvirtClient::Options options;
  options.uri = uri_;
  Result<std::shared_ptr<LibvirtClient>> client = LibvirtClient::Connect(options);
  if (client.ok()) {
    OnConnected(std::move(*client));
    return;
  }
  bool first;
  {
    std::lock_guard lock(mu_);
    first = last_error_ != client.error().message;
    last_error_ = client.error().message;
  }
  if (first) LogWarning(client.error().message + "; retrying in the background");
  asio::post(daemon_.io(), [this] { ScheduleRetry(); });
}

// On the I/O thread.
void DaemonLibvirt::ScheduleRetry() {
  {
    std::lock_guard lock(mu_);
    if (stopping_) return;
  }
  retry_timer_.expires_after(retry_delay_);
  retry_delay_ = std::min<std::chrono::milliseconds>(retry_delay_ * 2, kRetryMax);
  retry_timer_.async_wait([this](const boost::system::error_code& ec) {
    if (!ec) asio::post(daemon_.pool(), [this] { TryConnect(); });
  });
}

void DaemonLibvirt::OnConnected(std::shared_ptr<LibvirtClient> client) {
  std::vector<std::string> readopt;
  {
    std::lock_guard lock(mu_);
    if (stopping_) {
      client->Close();
      return;
    }
    client_ = std::move(client);
    last_error_.clear();
    readopt.swap(pending_readopt_);
  }
  LogNotice("libvirt: connected to " + uri_);
  for (const std::string& name : readopt) Readopt(name);
}

void DaemonLibvirt::Readopt(const std::string& name) {
  Result<LibvirtVmRecord> record = LoadLibvirtVmRecord(state_.VmDir(name));
  if (!record.ok()) return;
  Result<AdoptReply> adopted = Adopt(name, record->uuid);
  if (!adopted.ok()) {
    LogNotice("VM " + name + ": libvirt domain " + record->domain + " not re-adopted: " +
              adopted.error().message + " (kept offline; its captures stay listed)");
    return;
  }
  LogNotice("VM " + name + ": re-adopted libvirt domain " + record->domain);
}

json DaemonLibvirt::StatusJson() const {
  std::lock_guard lock(mu_);
  json j = {{"uri", uri_},
            {"connected", client_ != nullptr && client_->connected()},
            {"connect_attempts", connect_attempts_}};
  j["error"] = last_error_.empty() ? json(nullptr) : json(last_error_);
  if (client_) j["reconnects"] = client_->reconnects();
  return j;
}

Result<AdoptReply> DaemonLibvirt::Adopt(const std::string& name, const std::string& domain,
                                        bool allow_no_region) {
  std::shared_ptr<LibvirtClient> lv = client();
  if (!lv) {
    std::lock_guard lock(mu_);
    return Error{"libvirt at '" + uri_ + "' is not connected (" +
                 (last_error_.empty() ? std::string("connecting") : last_error_) +
                 "); hvtraced keeps retrying"};
  }
  if (auto existing = daemon_.registry().Find(name); existing && existing->live()) {
    return Error{"VM '" + name + "' is " + std::string(VmStateName(existing->state())) +
                 "; `hvtrace stop " + name + "` first"};
  }
  Result<std::unique_ptr<LibvirtDomainBackend>> backend =
      AdoptLibvirtDomain(lv, domain, backend_options(), allow_no_region);
  if (!backend.ok()) return backend.error();
  json describe = (*backend)->Describe();
  const std::filesystem::path vm_dir = state_.VmDir(name);
  if (Status s = MakeDirs(vm_dir, 0750); !s.ok()) return s.error();
  LibvirtVmRecord record{(*backend)->domain_name(), (*backend)->domain_uuid(), uri_};
  if (Status s = SaveLibvirtVmRecord(vm_dir, record); !s.ok()) {
    LogWarning("VM " + name + ": " + s.error().message +
               " (a restarted hvtraced will not re-adopt it)");
  }
  if (Status s = daemon_.ReplaceVm(name, std::move(*backend)); !s.ok()) return s.error();
  LogNotice("VM " + name + ": adopted libvirt domain " + record.domain + " (" +
            describe["region"].value("kind", std::string()) + " region " +
            describe["region"].value("path", std::string()) + ")");
  AdoptReply reply;
  reply.name = name;
  reply.domain = record.domain;
  reply.uuid = record.uuid;
  reply.uri = uri_;
  reply.region = describe["region"];
  reply.kernel = describe["kernel"];
  reply.formats_key = describe["formats_key"];
  // The metadata channel decodes a disk-booted guest's captures; without it
  // only a kernel file the host has can.
  const std::string meta = describe.value("meta_socket", std::string());
  reply.meta_channel = !describe.value("meta_channel", false)
                           ? "none; add it with hvtrace setup " + record.domain
                       : meta.empty() ? std::string("waiting for the domain to start")
                                      : "connecting to " + meta;
  if (describe.contains("boot_range")) {
    const json& boot = describe["boot_range"];
    // What the operator must know: a <cmdline> naming another range, and
    // what the guest still has to do.
    for (const char* key : {"cmdline_note", "note"}) {
      if (boot.contains(key)) LogInfo("VM " + name + ": " + boot[key].get<std::string>());
    }
    reply.boot_range = boot;
  }
  return reply;
}

}  // namespace hvtrace::hostd
