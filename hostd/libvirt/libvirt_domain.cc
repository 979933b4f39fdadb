#include "libvirt_domain.h"

#include <fcntl.h>
#include <unistd.h>

#include <filesystem>

namespace hvtrace::hostd {
namespace {

std::string StateText(int state, int reason) {
  switch (state) {
    case VIR_DOMAIN_RUNNING:
      return "running";
    case VIR_DOMAIN_BLOCKED:
      return "blocked";
    case VIR_DOMAIN_PAUSED:
      return reason == VIR_DOMAIN_PAUSED_CRASHED ? "paused (crashed)"
                                                 : "paused (reason " + std::to_string(reason) + ")";
    case VIR_DOMAIN_SHUTDOWN:
      return "shutting down";
    case VIR_DOMAIN_SHUTOFF:
      return reason == VIR_DOMAIN_SHUTOFF_CRASHED ? "shut off (crashed)"
             : reason == VIR_DOMAIN_SHUTOFF_DESTROYED
                 ? "shut off (destroyed)"
                 : "shut off (reason " + std::to_string(reason) + ")";
    case VIR_DOMAIN_CRASHED:
      return reason == VIR_DOMAIN_CRASHED_PANICKED
                 ? "crashed (panicked)"
                 : "crashed (reason " + std::to_string(reason) + ")";
    case VIR_DOMAIN_PMSUSPENDED:
      return "pmsuspended";
    default:
      return "state " + std::to_string(state);
  }
}

std::vector<std::string> ReadCmdline(const std::string& pid) {
  std::string all;
  int fd = open(("/proc/" + pid + "/cmdline").c_str(), O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    char buf[4096];
    ssize_t n;
    // QEMU command lines are long but bounded; cap what we hold anyway.
    while (all.size() < (1u << 20) && (n = read(fd, buf, sizeof buf)) > 0) {
      all.append(buf, static_cast<size_t>(n));
    }
    close(fd);
  }
  std::vector<std::string> args;
  size_t start = 0;
  for (size_t i = 0; i < all.size(); ++i) {
    if (all[i] == '\0') {
      args.push_back(all.substr(start, i - start));
      start = i + 1;
    }
  }
  return args;
}

// QEMU started by libvirt for domain |name|: "-name guest=NAME,...".
bool IsDomainQemu(const std::vector<std::string>& args, const std::string& name) {
  const std::string guest_arg = "guest=" + name;
  for (size_t i = 0; i + 1 < args.size(); ++i) {
    if (args[i] == "-name" &&
        (args[i + 1] == guest_arg || args[i + 1].rfind(guest_arg + ",", 0) == 0)) {
      return true;
    }
  }
  return false;
}

class RealDomain final : public LibvirtDomain {
 public:
  RealDomain(std::shared_ptr<LibvirtClient> client, std::string name, std::string uuid)
      : client_(std::move(client)), name_(std::move(name)), uuid_(std::move(uuid)) {}

  const std::string& name() const override { return name_; }
  const std::string& uuid() const override { return uuid_; }
  std::string uri() const override { return client_->uri(); }
  nlohmann::json Connection() const override {
    return {{"uri", client_->uri()},
            {"connected", client_->connected()},
            {"reconnects", client_->reconnects()}};
  }

  Result<LibvirtDomainState> State() const override {
    Result<LibvirtDomainPtr> dom = client_->FindDomain(uuid_);
    if (!dom.ok()) return dom.error();
    int state = 0, reason = 0;
    if (virDomainGetState(dom->get(), &state, &reason, 0) != 0) {
      return Error{"domain '" + name_ + "': cannot read its state: " + LibvirtLastError()};
    }
    return DescribeLibvirtState(state, reason);
  }

  Result<uint32_t> VcpuCount() const override {
    Result<LibvirtDomainPtr> dom = client_->FindDomain(uuid_);
    if (!dom.ok()) return dom.error();
    virDomainInfo info{};
    if (virDomainGetInfo(dom->get(), &info) != 0) {
      return Error{"domain '" + name_ + "': cannot read its vCPU count: " + LibvirtLastError()};
    }
    return info.nrVirtCpu;
  }

  Result<pid_t> QemuPid() const override {
    Result<DomainQemu> qemu = FindDomainQemu(name_);
    if (!qemu.ok()) return qemu.error();
    return qemu->pid;
  }

  Status Resume() override { return Act("resume", virDomainResume); }
  Status Destroy() override { return Act("destroy", virDomainDestroy); }

  Result<ShmemAttachment> AttachShmem(ShmemAttachRequest request) override {
    request.domain = uuid_;
    return hostd::AttachShmem(client_, request);
  }
  Status DetachShmem(const std::string& shm_name, std::chrono::milliseconds timeout) override {
    return hostd::DetachShmem(client_, uuid_, shm_name, timeout);
  }

  int Subscribe(LibvirtClient::Listener listener) override {
    return client_->Subscribe(uuid_, std::move(listener));
  }
  void Unsubscribe(int id) override { client_->Unsubscribe(id); }

 private:
  Status Act(const char* what, int (*call)(virDomainPtr)) {
    Result<LibvirtDomainPtr> dom = client_->FindDomain(uuid_);
    if (!dom.ok()) return dom.error();
    if (call(dom->get()) != 0) {
      return Error{"domain '" + name_ + "': " + what + ": " + LibvirtLastError()};
    }
    return {};
  }

  std::shared_ptr<LibvirtClient> client_;
  const std::string name_;
  const std::string uuid_;
};

}  // namespace

LibvirtDomainState DescribeLibvirtState(int state, int reason) {
  LibvirtDomainState s;
  s.text = StateText(state, reason);
  s.active = state != VIR_DOMAIN_SHUTOFF;
  s.crashed = (state == VIR_DOMAIN_PAUSED && reason == VIR_DOMAIN_PAUSED_CRASHED) ||
              state == VIR_DOMAIN_CRASHED;
  return s;
}

std::unique_ptr<LibvirtDomain> OpenLibvirtDomain(std::shared_ptr<LibvirtClient> client,
                                                 std::string name, std::string uuid) {
  return std::make_unique<RealDomain>(std::move(client), std::move(name), std::move(uuid));
}

Result<DomainQemu> FindDomainQemu(const std::string& name) {
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/proc", ec)) {
    const std::string pid = entry.path().filename().string();
    if (pid.find_first_not_of("0123456789") != std::string::npos) continue;
    std::vector<std::string> args = ReadCmdline(pid);
    if (IsDomainQemu(args, name)) return DomainQemu{static_cast<pid_t>(std::stol(pid)), args};
  }
  return Error{"no QEMU runs for domain '" + name + "' on this host (-name guest=" + name + ")"};
}

}  // namespace hvtrace::hostd
