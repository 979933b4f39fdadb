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
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "hvtrace/result.h"
#include "libvirt_attach.h"
#include "libvirt_client.h"

namespace hvtrace::hostd {

// The QEMU libvirt runs for a domain, as libvirt itself recorded it (see
// FindDomainQemu).
struct DomainQemu {
  pid_t pid = -1;
  uid_t uid = 0;  // QEMU's user and group: region files must be theirs.
  gid_t gid = 0;
  std::vector<std::string> args;   // Its command line (trusted: libvirt wrote it).
  std::filesystem::path pid_file;  // Where libvirt recorded the pid, as this host sees it.
};

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
  // QEMU's pid, owner and command line, from libvirt's own pid file
  // (FindDomainQemu).
  virtual Result<DomainQemu> Qemu() const = 0;
  // The live domain XML (the metadata channel's socket path libvirt chose
  // for this run is only there).
  virtual Result<std::string> LiveXml() const { return Error{"no live XML"}; }
  // |size| bytes of guest memory at kernel virtual address |addr|
  // (virDomainMemoryPeek, VIR_MEMORY_VIRTUAL, vCPU 0's page tables).
  virtual Result<std::vector<std::byte>> PeekVirtual(uint64_t /*addr*/, size_t /*size*/) const {
    return Error{"memory peek not supported"};
  }
  // A kdump-compressed dump of the domain's memory into |path|, written by
  // libvirt (virDomainCoreDumpWithFormat, memory only); blocking.
  virtual Status DumpMemory(const std::filesystem::path& /*path*/) {
    return Error{"this domain cannot dump its memory"};
  }
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

// The QEMU running domain |name| under the libvirtd at |uri|, found the way
// libvirt knows it and never by a command line any local process can fake:
//   1. libvirtd: the peer of its socket (the URI's socket=, else
//      /run/libvirt/libvirt-sock), by SO_PEERCRED; it must be root's.
//   2. Its pid file for the domain, <run>/libvirt/qemu/NAME.pid, read through
//      libvirtd's own view of the file system (/proc/PID/root: a private
//      libvirtd in its own mount namespace has its own /run); every
//      component root's, not writable by others, no symlink.
//   3. The process it names: started before libvirt wrote the file (a pid
//      reused later is refused), command line `-name guest=NAME`; its user
//      and group are QEMU's.
// Errors say which step failed and why.
Result<DomainQemu> FindDomainQemu(const std::string& uri, const std::string& name);

// The unix socket of the libvirtd behind |uri| (qemu:///system[?socket=P]);
// an error for URIs that do not name a local system daemon.
Result<std::filesystem::path> LibvirtSocketOfUri(const std::string& uri);

// The pid in a pid file's |text| ("1234\n"); an error for anything else.
Result<pid_t> ParsePidFileText(std::string_view text);

}  // namespace hvtrace::hostd

#endif  // HVTRACE_HOSTD_LIBVIRT_DOMAIN_H_
