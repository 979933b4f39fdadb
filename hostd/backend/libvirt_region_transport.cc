#include "libvirt_region_transport.h"

#include <sys/stat.h>
#include <unistd.h>

#include <boost/asio/post.hpp>
#include <optional>

#include "domain_xml.h"

namespace hvtrace::hostd {
namespace {

using nlohmann::json;

constexpr const char* kShmemPrefix = "shmem ";

}  // namespace

LibvirtRegionTransport::LibvirtRegionTransport(LibvirtDomain& domain,
                                               boost::asio::any_io_executor blocking)
    : domain_(domain), blocking_(std::move(blocking)) {}

template <typename Fn>
void LibvirtRegionTransport::RunBlocking(Fn fn) {
  std::weak_ptr<int> life = life_;
  boost::asio::post(blocking_, [life, fn = std::move(fn)]() mutable {
    if (!life.expired()) fn();
  });
}

PluggedDevice LibvirtRegionTransport::DeviceFor(const std::string& shm_name) {
  return PluggedDevice{ShmemAlias(shm_name), kShmemPrefix + shm_name, {}, json::object()};
}

void LibvirtRegionTransport::Probe(const AttachOptions& options, Then<PlugTarget> done) {
  if (!blocking_) {
    done(Error{"domain '" + domain_.name() + "': attach needs the daemon's worker pool"});
    return;
  }
  RunBlocking([this, options, done = std::move(done)] { done(DoProbe(options)); });
}

Result<PlugTarget> LibvirtRegionTransport::DoProbe(const AttachOptions& options) {
  const std::string shm = options.region_path.filename().string();
  if (options.region_path.parent_path() != "/dev/shm" || !ValidateShmName(shm).ok()) {
    return Error{"region " + options.region_path.string() +
                 " must be a valid name in /dev/shm (libvirt's <shmem> lives there)"};
  }
  // QEMU may run as another user (libvirt-qemu): the file must be its.
  // Its identity comes from libvirt's pid file, never from a process that
  // merely calls itself the domain's QEMU (FindDomainQemu).
  Result<DomainQemu> qemu = domain_.Qemu();
  if (!qemu.ok()) return qemu.error();
  Result<uint32_t> cpus = domain_.VcpuCount();
  if (!cpus.ok()) return cpus.error();
  // Our own mapping of an earlier (detached) region at this path is fine:
  // the new region replaces it. Anyone else's is not.
  const std::string self = "pid " + std::to_string(getpid()) + " ";
  if (std::optional<std::string> user = FindMapper(options.region_path);
      user && user->rfind(self, 0) != 0) {
    return Error{options.region_path.string() + " is in use by " + *user +
                 " (a region of another VM, or one QEMU has not released yet)"};
  }
  PlugTarget target;
  target.cpus = *cpus > 0 ? *cpus : 1;
  if (qemu->uid != geteuid()) target.owner_uid = qemu->uid;
  if (qemu->gid != getegid()) target.owner_gid = qemu->gid;
  target.transport = {{"kind", "libvirt"},
                      {"domain", domain_.name()},
                      {"uuid", domain_.uuid()},
                      {"uri", domain_.uri()}};
  return target;
}

void LibvirtRegionTransport::Plug(const LiveRegion& region, const PlugTarget&,
                                  Then<PluggedDevice> done) {
  ShmemAttachRequest req;
  req.shm_name = region.path().filename().string();
  req.size_bytes = region.size();
  req.prepared_file = true;
  RunBlocking([this, req, done = std::move(done)] {
    Result<ShmemAttachment> plugged = domain_.AttachShmem(req);
    if (!plugged.ok()) return done(plugged.error());
    PluggedDevice device = DeviceFor(req.shm_name);
    device.id = plugged->alias;
    device.transport = {{"device_added_ms", plugged->attach_ms}, {"owner_uid", plugged->owner_uid}};
    done(std::move(device));
  });
}

void LibvirtRegionTransport::Unplug(const PluggedDevice& device, std::chrono::milliseconds timeout,
                                    Then<std::string> done) {
  if (device.memdev.rfind(kShmemPrefix, 0) != 0) {
    done(Error{"device " + device.id + " is not a <shmem> this daemon plugged"});
    return;
  }
  const std::string shm = device.memdev.substr(std::string_view(kShmemPrefix).size());
  RunBlocking([this, shm, timeout, done = std::move(done)] {
    if (Status s = domain_.DetachShmem(shm, timeout); !s.ok()) return done(s.error());
    done(std::string());
  });
}

}  // namespace hvtrace::hostd
