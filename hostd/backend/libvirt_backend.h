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
#include "region_file.h"
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
  uint64_t gpa = 0;  // Guest-physical address of the range (boot-range).
};

// A boot range as the domain's NUMA cells place it (FindDomainBootCell), its
// file not yet known: kind "boot-range", offset, size and gpa set, no path.
LibvirtRegionSpec BootRangeSpec(const DomainBootCell& cell);

// |range| (from BootRangeSpec) with its file: node 1's memory-backend-file in
// the command line of |qemu| (the domain's QEMU as libvirt recorded it;
// libvirt names the file, a new one each time the domain starts), checked to
// be shared and large enough, with QEMU's pid and user for OpenRegionFile.
Result<LibvirtRegionSpec> LocateBootRangeFile(const std::string& domain, LibvirtRegionSpec range,
                                              const Result<DomainQemu>& qemu);

// Both steps for a running domain: the cells of |info|, the file of |qemu|.
// Never <os><cmdline> (a disk-booted guest keeps its parameters in its own
// boot loader).
Result<LibvirtRegionSpec> FindBootRangeRegion(const DomainXmlInfo& info,
                                              const Result<DomainQemu>& qemu);

// What the guest has written at the start of |region| (open as |fd|): the
// range is copied, then read with the boot_map reader (hvtrace/boot_map.h).
// {"state": "present"|"absent"|"mismatch"|"unreadable", "message", and for
// a meta found "cpus", "layout", "events"}. "mismatch": metas are there but
// none fits a range of region.size bytes (the guest's trace_instance= size
// is not the cell's).
nlohmann::json ProbeGuestBootMeta(int fd, const LibvirtRegionSpec& region);

// The adopt reply's "boot_range": the range's GPA and size, the kernel
// parameters the guest must boot with, a note when <cmdline> disagrees, and
// "guest_meta" (ProbeGuestBootMeta through |fd|, or why not: not |running|,
// fd -1) with a "note" saying what is missing until the guest has set it up.
nlohmann::json BootRangeFacts(const DomainBootCell& cell, const LibvirtRegionSpec& region, int fd,
                              bool running);

// Opens |region|'s file as hvtraced keeps it (region_file_open.h: owned by
// |region.owner_uid| or root, mapped by |region.qemu_pid| when set).
Result<int> OpenRegionFile(const std::string& domain, const LibvirtRegionSpec& region);

// Where attach/detach and the look after a reconnect do their blocking
// libvirt work; never the libvirt event loop's executor. Attach needs it.
struct LibvirtBackendOptions {
  boost::asio::any_io_executor blocking;
  // libvirt's QEMU log directory (config libvirt_qemu_log_dir): a domain
  // with QEMU trace events on its command line (`hvtrace setup`) has them in
  // DIR/NAME.log, which a capture copies as its host trace.
  std::filesystem::path qemu_log_dir;
};

// What the domain's XML says that the backend keeps.
struct LibvirtDomainFacts {
  std::string on_crash;  // <on_crash>: what libvirt does after a panic.
  std::string kernel;    // <os><kernel>, when the domain boots one directly.
  std::string initrd;    // <os><initrd>: a harvest boots the kernel with it.
  // The metadata channel's socket from the XML read at adopt (the live XML
  // of a running domain names the path libvirt chose); empty: none known.
  std::string meta_socket;
  bool meta_channel = false;  // The domain has the channel (path known or not).
  bool qemu_trace = false;    // QEMU's boot-handshake events go to its libvirt log.
};

class LibvirtDomainBackend : public VmBackend {
 public:
  // Resolves |domain| (name or UUID) and opens |region|.
  static Result<std::unique_ptr<LibvirtDomainBackend>> Create(std::shared_ptr<LibvirtClient> client,
                                                              const std::string& domain,
                                                              LibvirtRegionSpec region,
                                                              LibvirtBackendOptions options = {});
  // For |domain| as given (tests pass a fake); |region_fd| is |region|'s
  // file, opened read-only, or -1 for kind "none" and for a boot range whose
  // domain is not running yet (opened when it starts); the backend closes it.
  LibvirtDomainBackend(std::unique_ptr<LibvirtDomain> domain, LibvirtRegionSpec region,
                       int region_fd, LibvirtDomainFacts facts, LibvirtBackendOptions options);
  ~LibvirtDomainBackend() override;

  std::string_view kind() const override { return "libvirt"; }
  // libvirt's <shmem> maps only /dev/shm/NAME (LiveRegion refuses a name
  // there that is not ours).
  std::filesystem::path attach_region_dir() const override { return "/dev/shm"; }
  void Start(VmEventSink& sink) override;
  void Stop() override;
  Result<CaptureInputs> PrepareCapture() override;
  uint64_t region_file_bytes() const override {
    std::lock_guard lock(mu_);
    return region_.kind == "none" ? 0 : region_.size;
  }
  std::shared_ptr<const RegionFile> region_file() const override {
    std::lock_guard lock(mu_);
    return fd_;
  }
  KernelFiles kernel_files() const override { return {kernel_key_, facts_.kernel, facts_.initrd}; }
  std::optional<RegionFileSource> boot_range() const override;
  // The channel's socket: from the XML read at adopt, refreshed from the live
  // XML each time the domain starts (libvirt names a new one per run).
  std::function<MetaSocketTarget()> meta_socket() const override;
  // virDomainMemoryPeek of the domain (the build-id check).
  GuestMemoryReader guest_memory_reader() override;
  CaptureInputs::GuestMemoryDumper guest_memory_dumper() override;
  void ApplyPanicPolicy(PanicPolicy policy) override;
  nlohmann::json Describe() const override;
  // Attach mode (attach_session.h; the libvirt steps in
  // libvirt_region_transport.h).
  void Attach(const AttachOptions& options, AttachDone done) override {
    attach_.Attach(options, std::move(done));
  }
  void Detach(std::chrono::milliseconds timeout, DetachDone done) override {
    attach_.Detach(timeout, std::move(done));
  }
  std::shared_ptr<LiveRegion> live_region() const override { return attach_.region(); }
  nlohmann::json AttachStatus() const override { return attach_.Status(); }
  // A region hvtrace attached earlier (found by AdoptLibvirtDomain).
  void AdoptAttachedRegion(std::shared_ptr<LiveRegion> region, const std::string& shm_name);
  // The boot range's cell, for Describe()'s "boot_range" (BootRangeFacts,
  // with the guest's meta probed through the open file when |running|).
  void SetBootRangeCell(const DomainBootCell& cell, bool running);

  const std::string& domain_name() const { return domain_->name(); }
  const std::string& domain_uuid() const { return domain_->uuid(); }

 private:
  // What a capture copies of |region| through |fd|; nullopt: nothing.
  std::optional<RegionFileSource> RangeSource(const LibvirtRegionSpec& region,
                                              std::shared_ptr<const RegionFile> fd) const;
  void OnEvent(const LibvirtDomainEvent& event);
  void OnLifecycle(const LibvirtDomainEvent& event, VmEventSink& sink);
  void OnCrash(const LibvirtDomainEvent& event, const std::string& name);
  // After a reconnect: events during the gap are lost, so look (off the
  // event loop's thread).
  void LookAfterReconnect(const LibvirtDomainEvent& event);
  std::string StateText(bool* active) const;
  // A boot range lives in a file libvirt makes anew each time the domain
  // starts: find and open this run's (blocking: /proc, libvirt's pid file).
  void OpenBootRangeOfThisRun();

  std::shared_ptr<LibvirtDomain> domain_;  // Shared with guest_memory_reader().
  struct MetaLink {
    std::mutex mu;
    MetaSocketTarget target;
  };
  std::shared_ptr<MetaLink> meta_link_;  // Null: no metadata channel.
  void RefreshMetaSocket();
  const LibvirtDomainFacts facts_;
  std::string kernel_key_;  // formats_cache.h key of facts_.kernel.
  std::string kernel_key_error_;
  LibvirtBackendOptions options_;
  int subscription_ = -1;
  std::shared_ptr<int> life_ = std::make_shared<int>(0);

  mutable std::mutex mu_;  // Guards the fields below.
  LibvirtRegionSpec region_;
  std::shared_ptr<const RegionFile> fd_;  // region_'s file; closed when the last user lets go.
  std::string region_error_;              // Why this run's boot range file is not open.
  nlohmann::json boot_range_facts_;
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

// For `adopt DOMAIN`: a backend for a domain, with the region found from its
// XML — a boot range in the NUMA cell `hvtrace domain-xml --numa` makes
// (whether the kernel parameters are in <cmdline> or in the guest's own boot
// loader), and/or a shmem device hvtrace attached (alias ua-hvtrace-*,
// /dev/shm/<name>): with a region header it is the attach-mode region
// (live_region()), without one a raw region. With neither, an error saying
// what was looked for, unless |allow_no_region| (`attach` adopts first, then
// plugs a region). A domain that is not running is adopted only for a boot
// range, whose file is opened each time the domain starts.
Result<std::unique_ptr<LibvirtDomainBackend>> AdoptLibvirtDomain(
    std::shared_ptr<LibvirtClient> client, const std::string& domain,
    LibvirtBackendOptions options = {}, bool allow_no_region = false);

}  // namespace hvtrace::hostd

#endif  // HVTRACE_HOSTD_LIBVIRT_BACKEND_H_
