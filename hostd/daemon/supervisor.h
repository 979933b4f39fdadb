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

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/strand.hpp>
#include <chrono>
#include <cstdint>
#include <deque>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "capture_service.h"
#include "capture_store.h"
#include "config.h"
#include "hvtrace/result.h"
#include "vm_backend.h"

namespace hvtrace::hostd {

enum class VmState {
  kOffline,  // Known from the state dir only (no backend): captures are listable.
  kStarting,
  kRunning,
  kPaused,
  kPanicked,
  kStopped,  // Shut down or quit cleanly.
  kGone,     // QEMU disappeared.
  kFailed,   // The backend threw or reported an error; see last_error.
};
std::string_view VmStateName(VmState state);

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
               boost::asio::any_io_executor pool, CaptureStore store,
               std::shared_ptr<CaptureService> captures, SupervisorOptions options);
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
  // Watched now: a backend, and a state in which it serves requests.
  bool live() const;
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
  std::shared_ptr<CaptureService> captures_;
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
