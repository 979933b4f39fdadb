// The libvirt half of attach mode (attach_session.h has the state machine):
// the region is a <shmem> device, /dev/shm/<name> owned by QEMU's user,
// hot-plugged with the alias ua-hvtrace-<name>.
//
//   Probe:  the path is a valid name in /dev/shm (libvirt's <shmem> lives
//           there), QEMU runs (its user owns the file), the vCPU count, and
//           nobody but this daemon maps the file (a region of another VM, or
//           one QEMU has not released yet, is never touched).
//   Plug:   virDomainAttachDeviceFlags(AFFECT_LIVE), then DEVICE_ADDED.
//   Unplug: virDomainDetachDeviceAlias, then DEVICE_REMOVED: libvirt reports
//           success after 5 s even when the guest never let go.
//
// Every step blocks on libvirtd, so each runs on |blocking| (never the
// libvirt event loop's thread) and answers from there.
#ifndef HVTRACE_HOSTD_LIBVIRT_REGION_TRANSPORT_H_
#define HVTRACE_HOSTD_LIBVIRT_REGION_TRANSPORT_H_

#include <boost/asio/any_io_executor.hpp>
#include <memory>
#include <string>

#include "attach_session.h"
#include "libvirt_domain.h"

namespace hvtrace::hostd {

class LibvirtRegionTransport : public RegionTransport {
 public:
  // |domain| outlives the transport.
  LibvirtRegionTransport(LibvirtDomain& domain, boost::asio::any_io_executor blocking);

  void Probe(const AttachOptions& options, Then<PlugTarget> done) override;
  void Plug(const LiveRegion& region, const PlugTarget& target, Then<PluggedDevice> done) override;
  void Unplug(const PluggedDevice& device, std::chrono::milliseconds timeout,
              Then<std::string> done) override;

  // The device attach gives the shm file |shm_name|.
  static PluggedDevice DeviceFor(const std::string& shm_name);

 private:
  Result<PlugTarget> DoProbe(const AttachOptions& options);
  template <typename Fn>
  void RunBlocking(Fn fn);

  LibvirtDomain& domain_;
  boost::asio::any_io_executor blocking_;
  std::shared_ptr<int> life_ = std::make_shared<int>(0);
};

}  // namespace hvtrace::hostd

#endif  // HVTRACE_HOSTD_LIBVIRT_REGION_TRANSPORT_H_
