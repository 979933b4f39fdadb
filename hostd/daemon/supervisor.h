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
//   earlier run captured), HVTRACE_FOUND_PAUSED → "paused-while-away";
//   HVTRACE_GUEST_OOPS / HVTRACE_GUEST_WARN (the daemon's watch of the
//   guest's kernel log, log_watch.h) → "oops" / "warn", the guest running.
//
// Floods. A guest can trigger "crashloaded" and "reset" as often as it likes
// without stopping, so captures are scheduled, not run per event: each VM
// has at most one capture in flight and at most one pending per class
// (urgent: panics, a VM found stopped or gone, an operator's `capture`;
// guest: crashloaded, reset, guest-leaving, oops, warn). A trigger that finds one of its class
// pending is counted into it (manifest extra.coalesced, status captures_coalesced) instead of
// queued; a guest-class capture starts at most once per |guest_capture_interval| (triggers
// meanwhile make one capture at its end); a pending urgent capture absorbs a pending guest one and
// takes the more important trigger's name, so a panic is never dropped or renamed by a flood. The
// captures themselves run on the shared CaptureQueue (capture_queue.h), where another VM's panic
// goes ahead of this VM's guest-triggered ones.
#ifndef HVTRACE_HOSTD_SUPERVISOR_H_
#define HVTRACE_HOSTD_SUPERVISOR_H_

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/steady_timer.hpp>
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

#include "capture_queue.h"
#include "capture_service.h"
#include "capture_store.h"
#include "config.h"
#include "hvtrace/result.h"
#include "meta_receiver.h"
#include "replies.h"
#include "vm_backend.h"

namespace hvtrace::hostd {

enum class VmState {
  kOffline,  // Known from the state dir only (no backend): captures are listable.
  kStarting,
  kRunning,
  kPaused,
  kPanicked,
  kStopped,  // Shut down or quit cleanly.
  kShutOff,  // A libvirt domain found inactive when watching began; RESUME when it starts.
  kGone,     // QEMU disappeared.
  kFailed,   // The backend threw or reported an error; see last_error.
};
std::string_view VmStateName(VmState state);

struct SupervisorOptions {
  size_t capture_retention = 20;
  PanicPolicy panic_policy = PanicPolicy::kPause;
  // vmcore = on-panic: a panic capture also holds a dump of guest memory,
  // unless the VM's own setting (VmBackend::vmcore_on_panic) says otherwise.
  bool vmcore_on_panic = false;
  size_t max_recorded_events = 256;
  // The least time between the starts of two captures a running guest
  // triggers itself (crashloaded, reset); see Floods above.
  std::chrono::milliseconds guest_capture_interval{10000};
  // Shared by every VM of a daemon; null: the supervisor makes its own
  // (tests).
  std::shared_ptr<CaptureQueue> queue;
  // Called (on the supervisor's strand) with each capture committed, not for
  // one found to be a duplicate: the fleet upload queues it (uploader.h).
  // Must not block.
  std::function<void(const std::string& vm, const std::string& id,
                     const std::filesystem::path& dir)>
      on_committed;
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
  // VmBackend::Release on the strand, then |then| (on the pool), as Stop.
  void Release(std::function<void()> then = {});
  // A config reload: the retention, panic policy and guest capture interval
  // the next captures use (set on the strand).
  void SetLiveOptions(size_t capture_retention, PanicPolicy panic_policy,
                      std::chrono::milliseconds guest_capture_interval);

  void OnVmEvent(VmEvent event) override;
  void OnVmGone(std::string reason) override;
  void OnVmFailure(std::string reason) override;

  // Captures now (on the VM's strand); |done| runs on the pool.
  void RequestCapture(std::string trigger, CaptureDone done);
  // The guest's agent says its kernel is about to go (hvtrace/meta_leaving.h:
  // kexec, reboot, poweroff): a "guest-leaving" capture copies the boot
  // range before the next kernel may initialise it afresh. Scheduled as a
  // guest trigger (Floods above). |ack| runs exactly once, on any thread:
  // true once the copies are durable (before decoding), false when the
  // capture was refused or failed.
  void OnGuestLeaving(std::function<void(bool copied)> ack);

  // A consistent snapshot for `status`/`list`; cheap, any thread.
  VmStatusReply Status() const;
  nlohmann::json StatusJson() const { return MessageToJson(Status()); }
  VmState state() const;
  // Watched now: a backend, and a state in which it serves requests.
  bool live() const;
  // The VM's metadata channel receiver (meta_receiver.h): shown in status,
  // stopped with the VM. Set once, after Start.
  void SetMetaReceiver(std::shared_ptr<MetaReceiver> receiver);
  // What `status` shows of the daemon's watch of this VM's kernel log
  // (log_watcher.h). Any thread.
  void SetLogWatchStatus(nlohmann::json status);
  // Reads the store; runs on the caller's thread (call it off the I/O thread).
  Result<std::vector<CaptureEntry>> ListCaptures() const { return store_.List(); }

 private:
  // A capture waiting to start, with everything folded into it.
  struct PendingCapture {
    std::string trigger;
    HostTime triggered;
    std::map<std::string, uint64_t> coalesced;  // Further triggers it stands for.
    std::vector<CaptureDone> done;
    std::vector<std::function<void()>> after;  // On the strand once it ended.
    // On the capture's thread once its copies are durable (CaptureRequest).
    std::vector<std::function<void()>> durable;
  };
  void HandleEvent(const VmEvent& event);
  // Strand: queues a capture (Floods above); |after| runs on the strand once
  // the capture that holds this trigger ended, whatever its result.
  // |durable| runs once the copies of the capture holding it are durable.
  void Schedule(std::string trigger, HostTime triggered, CaptureDone done,
                std::function<void()> after = {}, std::function<void()> durable = {});
  // Strand: counts |from| into |into|, which takes the more important
  // trigger's name and time (a panic stays a panic).
  void Fold(PendingCapture& into, PendingCapture from);
  // Strand: starts the next capture when none is in flight and one may start.
  void Pump();
  // Strand: prepares |p| and hands it to the queue.
  void Dispatch(PendingCapture p, CaptureQueue::Lane lane);
  // Strand: |p| ended with |result|.
  void Complete(PendingCapture p, Result<CaptureOutcome> result);
  // Strand: runs |fn| once no capture is pending or in flight; pending ones
  // start at once, without waiting for the guest interval.
  void WhenIdle(std::function<void()> fn);
  void PublishQueueState();  // Strand: what `status` shows of the above.
  void SetState(VmState state);
  void Fail(const std::string& reason);
  std::shared_ptr<MetaReceiver> MetaReceiverOf() const {
    std::lock_guard lock(mu_);
    return meta_;
  }
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
  bool captured_since_run_ = false;  // Or scheduled.
  std::optional<PendingCapture> urgent_, guest_;
  bool in_flight_ = false;
  std::optional<CaptureQueue::Ticket> in_guest_lane_;  // The in-flight job, still promotable.
  std::chrono::steady_clock::time_point last_start_{};
  bool flush_ = false;  // WhenIdle waits: start pending captures now.
  std::vector<std::function<void()>> when_idle_;
  boost::asio::steady_timer interval_timer_;

  mutable std::mutex mu_;  // Guards the fields below (read by status).
  VmState state_;
  std::string last_error_;
  uint64_t events_seen_ = 0;
  uint64_t captures_taken_ = 0;
  uint64_t captures_failed_ = 0;
  std::optional<CaptureSummary> last_capture_;
  std::string last_event_;
  std::map<std::string, uint64_t> coalesced_;             // Triggers counted into another capture.
  nlohmann::json capture_queue_ = {{"in_flight", false},  // What PublishQueueState shows.
                                   {"pending", nlohmann::json::array()}};
  nlohmann::json backend_info_ = nlohmann::json::object();  // Describe() after Start.
  std::shared_ptr<MetaReceiver> meta_;
  nlohmann::json log_watch_;  // SetLogWatchStatus; guarded by mu_.
};

// All supervisors by name. Thread-safe.
class SupervisorRegistry {
 public:
  Status Add(std::shared_ptr<VmSupervisor> supervisor);
  std::shared_ptr<VmSupervisor> Find(std::string_view name) const;
  std::vector<std::shared_ptr<VmSupervisor>> All() const;  // Sorted by name.
  // Unregisters |name| and returns it (null if absent); the caller stops it.
  std::shared_ptr<VmSupervisor> Remove(std::string_view name);
  // Stop (Release) every VM, after the captures already triggered; |all_done|
  // runs (on the pool) once the last has let its VM go.
  void StopAll(std::function<void()> all_done);
  void ReleaseAll(std::function<void()> all_done);

 private:
  void LetAllGo(void (VmSupervisor::*let_go)(std::function<void()>),
                std::function<void()> all_done);

  mutable std::mutex mu_;
  std::map<std::string, std::shared_ptr<VmSupervisor>, std::less<>> vms_;
};

}  // namespace hvtrace::hostd

#endif  // HVTRACE_HOSTD_SUPERVISOR_H_
