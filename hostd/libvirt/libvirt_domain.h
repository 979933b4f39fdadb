// One libvirt domain as hvtraced uses it: the seam in front of libvirt's
// calls. LibvirtDomainBackend talks only to this interface, so its logic
// (events → VM events, panics, attach) is tested against a fake, and the
// real one (OpenLibvirtDomain) is tested against a real libvirtd.
//
// Every call may block on libvirtd: never call one on the libvirt event
// loop's thread (libvirt_event_loop.h).
#ifndef HVTRACE_HOSTD_LIBVIRT_DOMAIN_H_
#define HVTRACE_HOSTD_LIBVIRT_DOMAIN_H_

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "hvtrace/result.h"
#include "libvirt_attach.h"
#include "libvirt_client.h"

namespace hvtrace::hostd {

// virDomainGetState, read.
struct LibvirtDomainState {
  std::string text;      // "running", "paused (crashed)", "shut off (destroyed)", …
  bool active = false;   // Not shut off: QEMU is there.
  bool crashed = false;  // Paused after a panic, or crashed.
};
LibvirtDomainState DescribeLibvirtState(int state, int reason);

class LibvirtDomain {
 public:
  virtual ~LibvirtDomain() = default;
  virtual const std::string& name() const = 0;
  virtual const std::string& uuid() const = 0;
  // {uri, connected, reconnects} of the connection, for status.
  virtual nlohmann::json Connection() const = 0;
  virtual std::string uri() const = 0;

  virtual Result<LibvirtDomainState> State() const = 0;
  virtual Result<uint32_t> VcpuCount() const = 0;
  // QEMU's pid and owner, from /proc (the region file must be its user's).
  virtual Result<pid_t> QemuPid() const = 0;
  virtual Status Resume() = 0;
  virtual Status Destroy() = 0;
  // libvirt_attach.h, for this domain.
  virtual Result<ShmemAttachment> AttachShmem(ShmemAttachRequest request) = 0;
  virtual Status DetachShmem(const std::string& shm_name, std::chrono::milliseconds timeout) = 0;

  // This domain's events plus kDisconnected/kReconnected, on the event
  // loop's thread (LibvirtClient::Subscribe).
  virtual int Subscribe(LibvirtClient::Listener listener) = 0;
  virtual void Unsubscribe(int id) = 0;
};

// The real domain |uuid| (named |name|) over |client|.
std::unique_ptr<LibvirtDomain> OpenLibvirtDomain(std::shared_ptr<LibvirtClient> client,
                                                 std::string name, std::string uuid);

// The QEMU running domain |name| (from /proc/*/cmdline "-name guest=NAME"):
// its pid and command line, or an error saying none runs here.
struct DomainQemu {
  pid_t pid = -1;
  std::vector<std::string> args;
};
Result<DomainQemu> FindDomainQemu(const std::string& name);

}  // namespace hvtrace::hostd

#endif  // HVTRACE_HOSTD_LIBVIRT_DOMAIN_H_
