// Per-VM supervision inside hvtraced.
//
// One VmSupervisor per VM owns that VM's backend (a QMP session, a libvirt
// domain) and its capture store, and does all of its work on its own strand
// over the daemon's worker pool: events are handled in arrival order, captures
// of one VM never overlap, and VMs run in parallel. Every call into a backend
// is wrapped so an exception or a lost connection marks that VM failed/gone,
// is reported by `status`/`list`, and never reaches another VM or the daemon.
//
// A backend plugs in by implementing VmBackend and reporting what it sees
// through VmEventSink (from any thread). Events that trigger a capture:
//   GUEST_PANICKED → "panic", GUEST_CRASHLOADED → "crashloaded" (always);
//   RESET → "reset", SHUTDOWN → "shutdown", backend gone → "qemu-gone"
//   (only if nothing was captured since the VM last ran, so one incident —
//   panic, then QEMU quitting — yields one capture);
//   HVTRACE_FOUND_PANICKED (a backend found the guest already panicked when
//   its watch began) → "panic-while-away" (unless the region is
//   byte-identical to the newest panic capture's: the same panic, which an
//   earlier run captured), HVTRACE_FOUND_PAUSED → "paused-while-away".
#ifndef HVTRACE_HOSTD_SUPERVISOR_H_
#define HVTRACE_HOSTD_SUPERVISOR_H_

#include <cstdint>
#include <deque>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <chrono>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/strand.hpp>
#include <nlohmann/json.hpp>

#include "capture_store.h"
#include "config.h"
#include "hvtrace/result.h"
#include "live_region.h"

namespace hvtrace::hostd {

class FormatsService;

enum class VmState {
  kOffline,    // Known from the state dir only (no backend): captures are listable.
  kStarting,
  kRunning,
  kPaused,
  kPanicked,
  kStopped,    // Shut down or quit cleanly.
  kGone,       // QEMU disappeared.
  kFailed,     // The backend threw or reported an error; see last_error.
};
std::string_view VmStateName(VmState state);

struct VmEvent {
  std::string name;  // QMP event name, e.g. "GUEST_PANICKED".
  nlohmann::json data = nlohmann::json::object();
  HostTime time;     // When the daemon received it.
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

// Attach mode (issue #5): what `hvtrace attach` asks of a backend.
struct AttachOptions {
  std::filesystem::path region_path;  // The file to create (the daemon names it).
  uint64_t size_bytes = 16ull << 20;  // Region size, a power of two.
  std::string events;                 // Kernel events for the agent ("" = markers only).
  uint32_t pump_interval_ms = 50;
  std::chrono::milliseconds wait{30000};  // For the agent's announcement.
};
// Gets the reply JSON of attach/detach (fields in /work/notes/attach.md and
// attach_vm.h) or the error; may run on any thread.
using AttachDone = std::function<void(Result<nlohmann::json>)>;

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
  // Copies the trace region into |capture| and fills |manifest| (kernel,
  // region, cpus, validation). Runs on the worker pool. May throw.
  virtual Status Capture(PendingCapture& capture, CaptureManifest& manifest) = 0;
  // Lets the VM go after a panic capture (resume or quit; pause = nothing).
  virtual void ApplyPanicPolicy(PanicPolicy policy) = 0;
  // Shown in `status`; called on the VM's strand after Start.
  virtual nlohmann::json Describe() const { return nlohmann::json::object(); }

  // Attach mode. Hot-plugs a new region and waits (bounded) for the guest
  // agent to announce itself. Asynchronous: |done| runs exactly once.
  virtual void Attach(const AttachOptions& /*options*/, AttachDone done) {
    done(Error{std::string(kind()) + " VMs do not support attach"});
  }
  // Unplugs the region; the region stays mapped so captures still read it.
  virtual void Detach(std::chrono::milliseconds /*timeout*/, AttachDone done) {
    done(Error{std::string(kind()) + " VMs do not support detach"});
  }
  // The attached (or detached but kept) region, for stream and capture;
  // null when the VM never had one. Any thread.
  virtual std::shared_ptr<LiveRegion> live_region() const { return nullptr; }
  // Attach state for `status` (null: never attached). Any thread, cheap.
  virtual nlohmann::json AttachStatus() const { return nullptr; }
  // The daemon's kernel formats, for backends whose captures decode; called
  // before Start.
  virtual void UseFormats(std::shared_ptr<FormatsService> /*formats*/) {}
};

struct SupervisorOptions {
  size_t capture_retention = 20;
  PanicPolicy panic_policy = PanicPolicy::kPause;
  size_t max_recorded_events = 256;
};

struct CaptureSummary {
  std::string id;
  std::string trigger;
  double trigger_to_disk_ms = 0;  // From event receipt to the capture committed.
};

class VmSupervisor : public VmEventSink, public std::enable_shared_from_this<VmSupervisor> {
 public:
  using CaptureDone = std::function<void(Result<CaptureSummary>)>;

  // |backend| may be null: an offline VM known only from its captures.
  VmSupervisor(std::string name, std::unique_ptr<VmBackend> backend,
               boost::asio::any_io_executor pool, CaptureStore store, SupervisorOptions options);
  ~VmSupervisor() override;

  const std::string& name() const { return name_; }
  // The backend (null for an offline VM); it lives as long as this
  // supervisor. Its methods are thread-safe by contract (VmBackend).
  VmBackend* backend() const { return backend_.get(); }

  void Start();
  // Stops the backend on the strand, then runs |then| (on the pool) — for
  // callers that must not touch the VM's files before it is really stopped.
  void Stop(std::function<void()> then = {});
  void Release();  // VmBackend::Release on the strand.

  void OnVmEvent(VmEvent event) override;
  void OnVmGone(std::string reason) override;
  void OnVmFailure(std::string reason) override;

  // Captures now (on the VM's strand); |done| runs on the pool.
  void RequestCapture(std::string trigger, CaptureDone done);

  // A consistent snapshot for `status`/`list`; cheap, any thread.
  nlohmann::json StatusJson() const;
  VmState state() const;
  // Reads the store; runs on the caller's thread (call it off the I/O thread).
  Result<std::vector<CaptureEntry>> ListCaptures() const { return store_.List(); }

 private:
  void HandleEvent(const VmEvent& event);
  void DoCapture(const std::string& trigger, const HostTime& triggered, const CaptureDone& done);
  void SetState(VmState state);
  void Fail(const std::string& reason);
  // Runs |fn| on the strand; any exception marks this VM failed.
  void Post(std::function<void()> fn);

  const std::string name_;
  std::unique_ptr<VmBackend> backend_;
  boost::asio::strand<boost::asio::any_io_executor> strand_;
  CaptureStore store_;
  SupervisorOptions options_;

  // Strand-only state.
  std::deque<RecordedEvent> events_;
  bool captured_since_run_ = false;

  mutable std::mutex mu_;  // Guards the fields below (read by status).
  VmState state_;
  std::string last_error_;
  uint64_t events_seen_ = 0;
  uint64_t captures_taken_ = 0;
  uint64_t captures_failed_ = 0;
  std::optional<CaptureSummary> last_capture_;
  std::string last_event_;
  nlohmann::json backend_info_ = nlohmann::json::object();  // Describe() after Start.
};

// All supervisors by name. Thread-safe.
class SupervisorRegistry {
 public:
  Status Add(std::shared_ptr<VmSupervisor> supervisor);
  std::shared_ptr<VmSupervisor> Find(std::string_view name) const;
  std::vector<std::shared_ptr<VmSupervisor>> All() const;  // Sorted by name.
  // Unregisters |name| and returns it (null if absent); the caller stops it.
  std::shared_ptr<VmSupervisor> Remove(std::string_view name);
  void StopAll();
  void ReleaseAll();

 private:
  mutable std::mutex mu_;
  std::map<std::string, std::shared_ptr<VmSupervisor>, std::less<>> vms_;
};

}  // namespace hvtrace::hostd

#endif  // HVTRACE_HOSTD_SUPERVISOR_H_
