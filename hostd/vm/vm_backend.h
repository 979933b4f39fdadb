// What the daemon needs of a VM, whatever runs it: the VmBackend interface.
//
// A backend (QMP for QEMUs hvtraced launched or adopted, libvirt for
// domains, whatever comes later) watches one VM and reports what happens to
// it through VmEventSink, supplies the bytes and facts a capture needs
// (PrepareCapture: the CaptureService does the rest), and plugs and unplugs
// attach regions. It never writes captures itself.
//
// Threads: Start/Stop/Release/PrepareCapture/ApplyPanicPolicy run on the
// VM's strand; the other methods may be called from any thread.
#ifndef HVTRACE_HOSTD_VM_BACKEND_H_
#define HVTRACE_HOSTD_VM_BACKEND_H_

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "attach_reply.h"
#include "capture_inputs.h"
#include "config.h"
#include "host_time.h"
#include "hvtrace/result.h"
#include "live_region.h"
#include "meta_receiver.h"

namespace hvtrace::hostd {

struct VmEvent {
  std::string name;  // QMP event name, e.g. "GUEST_PANICKED".
  nlohmann::json data = nlohmann::json::object();
  HostTime time;  // When the daemon received it.
};

// How a backend reports to its supervisor. Thread-safe.
class VmEventSink {
 public:
  virtual ~VmEventSink() = default;
  virtual void OnVmEvent(VmEvent event) = 0;
  // The backend lost its VM (QMP EOF, process exit); |reason| says how.
  virtual void OnVmGone(std::string reason) = 0;
  // The backend cannot continue; the VM is marked failed.
  virtual void OnVmFailure(std::string reason) = 0;
};

// What `hvtrace attach` asks of a backend.
struct AttachOptions {
  std::filesystem::path region_path;  // The file to create (the daemon names it).
  uint64_t size_bytes = 16ull << 20;  // Region size, a power of two.
  std::string events;                 // Kernel events for the agent ("" = markers only).
  uint32_t pump_interval_ms = 50;
  std::chrono::milliseconds wait{30000};  // For the agent's announcement.
};
// Get the reply of attach/detach (attach_reply.h) or the error; may run on
// any thread.
using AttachDone = std::function<void(Result<AttachReply>)>;
using DetachDone = std::function<void(Result<DetachReply>)>;

// The guest kernel's files, when the backend knows them: the daemon loads
// (or harvests) their formats ahead of a capture.
struct KernelFiles {
  std::string key;  // formats_cache.h key; empty = unknown.
  std::string path;
  std::string initrd;
};

// Reads |size| bytes of the guest's memory at kernel virtual address |addr|;
// blocking, call it on the pool.
using GuestMemoryReader = std::function<Result<std::vector<std::byte>>(uint64_t addr, size_t size)>;

class VmBackend {
 public:
  virtual ~VmBackend() = default;
  virtual std::string_view kind() const = 0;  // "qmp", "libvirt", …
  // Starts watching; reports through |sink| until Stop. May throw.
  virtual void Start(VmEventSink& sink) = 0;
  virtual void Stop() = 0;
  // Stops watching but leaves the VM running, for a daemon that exits with
  // vm_on_shutdown = keep. Backends that never own the VM just Stop.
  virtual void Release() { Stop(); }
  // Shuts the VM down when hvtraced owns it (`hvtrace stop --kill`);
  // otherwise nothing: a libvirt domain or adopted QEMU is not ours to stop.
  virtual void Quit() {}

  // The regions to copy now and what the backend knows (CaptureInputs).
  // Cheap: it copies nothing. May throw.
  virtual Result<CaptureInputs> PrepareCapture() = 0;
  // Size of the region file a capture copies (0: none), for preallocation.
  virtual uint64_t region_file_bytes() const { return 0; }
  // The region file the next capture copies (null: none), for the daemon to
  // keep its page tables filled (RegionFile::Warm). Any thread.
  virtual std::shared_ptr<const RegionFile> region_file() const { return nullptr; }
  virtual KernelFiles kernel_files() const { return {}; }
  // The boot range as the next capture would copy it (PrepareCapture's
  // region_file, nothing else taken or changed), for the daemon's watch of
  // the guest's kernel log (log_watch.h); nullopt when the VM has none.
  // Any thread.
  virtual std::optional<RegionFileSource> boot_range() const { return std::nullopt; }
  // Where the unix socket of the VM's metadata channel is
  // (hvtrace/meta_channel.h, QEMU listening), asked at each (re)connect: a
  // libvirt domain's changes with each run and is "" while it is down. Null
  // when the VM has no channel. Any thread; it never holds the backend (the
  // daemon's MetaReceiver may call it after the backend is gone).
  virtual std::function<MetaSocketTarget()> meta_socket() const { return nullptr; }
  // How to read guest memory to check a channel's build id (meta_receiver.h);
  // null when the backend cannot.
  virtual GuestMemoryReader guest_memory_reader() { return nullptr; }
  // The guest's RAM as QEMU's process holds it, when the backend could map
  // it (guest_ram.h); null otherwise. Any thread.
  virtual std::shared_ptr<const GuestRam> guest_ram() const { return nullptr; }
  // How to dump guest memory (kdump-zlib) while the guest is paused, into a
  // file the capture then takes (capture_inputs.h); null when it cannot.
  virtual CaptureInputs::GuestMemoryDumper guest_memory_dumper() { return nullptr; }
  // The VM's own vmcore setting (`hvtrace boot --vmcore`); nullopt: the
  // daemon's.
  virtual std::optional<bool> vmcore_on_panic() const { return std::nullopt; }
  // Lets the VM go after a panic capture (resume or quit; pause = nothing).
  virtual void ApplyPanicPolicy(PanicPolicy policy) = 0;
  // Shown in `status`; called on the VM's strand after Start.
  virtual nlohmann::json Describe() const { return nlohmann::json::object(); }

  // Where the attach region file must be created; empty = the daemon's own
  // guest-memory directory (only its user may enter). A backend whose
  // hypervisor can map only certain names says so here (libvirt: /dev/shm).
  virtual std::filesystem::path attach_region_dir() const { return {}; }
  // Attach mode. Hot-plugs a new region and waits (bounded) for the guest
  // agent to announce itself. Asynchronous: |done| runs exactly once.
  virtual void Attach(const AttachOptions& /*options*/, AttachDone done) {
    done(Error{std::string(kind()) + " VMs do not support attach"});
  }
  // Unplugs the region; the region stays mapped so captures still read it.
  virtual void Detach(std::chrono::milliseconds /*timeout*/, DetachDone done) {
    done(Error{std::string(kind()) + " VMs do not support detach"});
  }
  // The attached (or detached but kept) region, for stream and capture;
  // null when the VM never had one. Any thread.
  virtual std::shared_ptr<LiveRegion> live_region() const { return nullptr; }
  // Attach state for `status` (null: never attached). Any thread, cheap.
  virtual nlohmann::json AttachStatus() const { return nullptr; }
};

}  // namespace hvtrace::hostd

#endif  // HVTRACE_HOSTD_VM_BACKEND_H_
