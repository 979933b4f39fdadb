#include "libvirt_domain.h"

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

  Result<DomainQemu> Qemu() const override { return FindDomainQemu(client_->uri(), name_); }

  Result<std::string> LiveXml() const override {
    Result<LibvirtDomainPtr> dom = client_->FindDomain(uuid_);
    if (!dom.ok()) return dom.error();
    return LibvirtDomainXml(dom->get());
  }

  Result<std::vector<std::byte>> PeekVirtual(uint64_t addr, size_t size) const override {
    Result<LibvirtDomainPtr> dom = client_->FindDomain(uuid_);
    if (!dom.ok()) return dom.error();
    std::vector<std::byte> out(size);
    if (virDomainMemoryPeek(dom->get(), addr, size, out.data(), VIR_MEMORY_VIRTUAL) != 0) {
      return Error{"domain '" + name_ + "': memory peek: " + LibvirtLastError()};
    }
    return out;
  }

  Status DumpMemory(const std::filesystem::path& path) override {
    Result<LibvirtDomainPtr> dom = client_->FindDomain(uuid_);
    if (!dom.ok()) return dom.error();
    if (virDomainCoreDumpWithFormat(dom->get(), path.c_str(),
                                    VIR_DOMAIN_CORE_DUMP_FORMAT_KDUMP_ZLIB,
                                    VIR_DUMP_MEMORY_ONLY) != 0) {
      return Error{"domain '" + name_ + "': core dump: " + LibvirtLastError()};
    }
    return {};
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

}  // namespace hvtrace::hostd
