// The VmBackend for a libvirt domain (vm_backend.h): what hvtraced runs for
// a domain it serves by name, beside the QMP backend for QEMUs it launched.
//
// Events are translated to the names the supervisor knows from QMP:
//   CRASHED/PANICKED → GUEST_PANICKED, CRASHED/CRASHLOADED → GUEST_CRASHLOADED,
//   SHUTDOWN → SHUTDOWN, REBOOT → RESET, SUSPENDED → STOP, RESUMED and
//   STARTED → RESUME, DEVICE_ADDED/REMOVED → DEVICE_ADDED/DEVICE_DELETED,
//   STOPPED/* → OnVmGone; a lost libvirtd connection is recorded
//   (LIBVIRT_DISCONNECTED/RECONNECTED), and after reconnecting the domain's
//   state is read again so a panic during the gap is still reported.
//
// Panic: libvirt emits CRASHED/PANICKED and then carries out <on_crash> on
// its own; with `destroy` QEMU is gone milliseconds later. The region file
// is opened when the backend is created and kept open, so its contents stay
// readable after QEMU is gone and libvirt deletes the file (it removes
// memory_backing_dir files when a domain stops; /dev/shm shmem files it
// never deletes): the event callback only notes the panic and reports it,
// and the capture copies on a worker. The manifest says whether QEMU was
// still there at capture time ("preserved" or "destroyed").
#ifndef HVTRACE_HOSTD_LIBVIRT_BACKEND_H_
#define HVTRACE_HOSTD_LIBVIRT_BACKEND_H_

#include <boost/asio/any_io_executor.hpp>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "attach_session.h"
#include "domain_xml.h"
#include "hvtrace/result.h"
#include "libvirt_client.h"
#include "libvirt_domain.h"
#include "libvirt_region_transport.h"
#include "live_region.h"
#include "units.h"
#include "vm_backend.h"

namespace hvtrace::hostd {

struct LibvirtRegionSpec {
  // "shmem" (a raw shmem file, no region header), "boot-range", or "none"
  // (attach mode only: the region comes with `attach`, see live_region()).
  std::string kind;
  std::filesystem::path path;
  uint64_t offset = 0;  // Of the trace data in the file.
  uint64_t size = 0;    // What hostd configured; never read from the guest.
  // The file must be QEMU's (its user's or root's), and for a boot range the
  // very file QEMU |qemu_pid| maps; -1 / nullopt: not checked.
  std::optional<uid_t> owner_uid;
  pid_t qemu_pid = -1;
};

// The boot range of a running domain made from `hvtrace domain-xml`: the
// node-1 file from the command line of |qemu| (the domain's QEMU as libvirt
// recorded it, FindDomainQemu; libvirt names the file), and the range from
// the domain's memmap= kernel parameter and NUMA cells.
Result<LibvirtRegionSpec> FindBootRangeRegion(const DomainXmlInfo& info,
                                              const Result<DomainQemu>& qemu);

// Opens |region|'s file for reading as hvtraced keeps it: never through a
// symlink, never blocking (a FIFO is refused, not waited on), a regular file
// of at least offset + size bytes owned by |region.owner_uid| or root, and,
// when |region.qemu_pid| is set, one that QEMU maps (same device and inode
// in /proc/PID/maps). Errors name the domain and the file.
Result<int> OpenRegionFile(const std::string& domain, const LibvirtRegionSpec& region);

// Where attach/detach and the look after a reconnect do their blocking
// libvirt work; never the libvirt event loop's executor. Attach needs it.
struct LibvirtBackendOptions {
  boost::asio::any_io_executor blocking;
};

// What the domain's XML says that the backend keeps.
struct LibvirtDomainFacts {
  std::string on_crash;  // <on_crash>: what libvirt does after a panic.
  std::string kernel;    // <os><kernel>, when the domain boots one directly.
  std::string initrd;    // <os><initrd>: a harvest boots the kernel with it.
};

class LibvirtDomainBackend : public VmBackend {
 public:
  // Resolves |domain| (name or UUID) and opens |region|.
  static Result<std::unique_ptr<LibvirtDomainBackend>> Create(std::shared_ptr<LibvirtClient> client,
                                                              const std::string& domain,
                                                              LibvirtRegionSpec region,
                                                              LibvirtBackendOptions options = {});
  // For |domain| as given (tests pass a fake); |region_fd| is |region|'s
  // file, opened read-only, or -1 for kind "none"; the backend closes it.
  LibvirtDomainBackend(std::unique_ptr<LibvirtDomain> domain, LibvirtRegionSpec region,
                       int region_fd, LibvirtDomainFacts facts, LibvirtBackendOptions options);
  ~LibvirtDomainBackend() override;

  std::string_view kind() const override { return "libvirt"; }
  void Start(VmEventSink& sink) override;
  void Stop() override;
  Result<CaptureInputs> PrepareCapture() override;
  uint64_t region_file_bytes() const override { return region_.kind == "none" ? 0 : region_.size; }
  KernelFiles kernel_files() const override { return {kernel_key_, facts_.kernel, facts_.initrd}; }
  void ApplyPanicPolicy(PanicPolicy policy) override;
  nlohmann::json Describe() const override;
  // Attach mode (attach_session.h; the libvirt steps in
  // libvirt_region_transport.h).
  void Attach(const AttachOptions& options, AttachDone done) override {
    attach_.Attach(options, std::move(done));
  }
  void Detach(std::chrono::milliseconds timeout, AttachDone done) override {
    attach_.Detach(timeout, std::move(done));
  }
  std::shared_ptr<LiveRegion> live_region() const override { return attach_.region(); }
  nlohmann::json AttachStatus() const override { return attach_.Status(); }
  // A region hvtrace attached earlier (found by AdoptLibvirtDomain).
  void AdoptAttachedRegion(std::shared_ptr<LiveRegion> region, const std::string& shm_name);

  const std::string& domain_name() const { return domain_->name(); }
  const std::string& domain_uuid() const { return domain_->uuid(); }

 private:
  void OnEvent(const LibvirtDomainEvent& event);
  void OnLifecycle(const LibvirtDomainEvent& event, VmEventSink& sink);
  void OnCrash(const LibvirtDomainEvent& event, const std::string& name);
  // After a reconnect: events during the gap are lost, so look (off the
  // event loop's thread).
  void LookAfterReconnect(const LibvirtDomainEvent& event);
  std::string StateText(bool* active) const;

  std::unique_ptr<LibvirtDomain> domain_;
  const LibvirtRegionSpec region_;
  int fd_ = -1;
  const LibvirtDomainFacts facts_;
  std::string kernel_key_;  // formats_cache.h key of facts_.kernel.
  std::string kernel_key_error_;
  LibvirtBackendOptions options_;
  int subscription_ = -1;
  std::shared_ptr<int> life_ = std::make_shared<int>(0);

  mutable std::mutex mu_;  // Guards the fields below.
  VmEventSink* sink_ = nullptr;
  struct PanicNote {
    std::string event;      // CRASHED/PANICKED or CRASHED/CRASHLOADED.
    double ms_to_callback;  // libvirt's event → our callback.
  };
  std::optional<PanicNote> pending_panic_;          // Reported, not yet captured.
  std::optional<std::string> stopped_after_panic_;  // STOPPED/* after the last panic.
  uint64_t disconnects_ = 0;

  // Last: they go first, while the fields above still stand.
  LibvirtRegionTransport attach_transport_;
  AttachSession attach_;
};

// Convenience for the daemon and tools: the shmem region of an attachment.
LibvirtRegionSpec ShmemRegion(const std::filesystem::path& path, uint64_t size);

// For `adopt DOMAIN`: a backend for a running domain, with the region found
// from its live XML — a boot range made by `hvtrace domain-xml`, and/or a
// shmem device hvtrace attached (alias ua-hvtrace-*, /dev/shm/<name>): with
// a region header it is the attach-mode region (live_region()), without one
// a raw region. With neither, an error saying what was looked for, unless
// |allow_no_region| (`attach` adopts first, then plugs a region).
Result<std::unique_ptr<LibvirtDomainBackend>> AdoptLibvirtDomain(
    std::shared_ptr<LibvirtClient> client, const std::string& domain,
    LibvirtBackendOptions options = {}, bool allow_no_region = false);

}  // namespace hvtrace::hostd

#endif  // HVTRACE_HOSTD_LIBVIRT_BACKEND_H_
