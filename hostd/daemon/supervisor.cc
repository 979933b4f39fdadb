#include "supervisor.h"

#include <atomic>
#include <boost/asio/post.hpp>
#include <cstdio>
#include <exception>
#include <mutex>
#include <optional>

#include "daemon_log.h"

namespace hvtrace::hostd {

namespace asio = boost::asio;
using nlohmann::json;

std::string_view VmStateName(VmState state) {
  switch (state) {
    case VmState::kOffline:
      return "offline";
    case VmState::kStarting:
      return "starting";
    case VmState::kRunning:
      return "running";
    case VmState::kPaused:
      return "paused";
    case VmState::kPanicked:
      return "panicked";
    case VmState::kStopped:
      return "stopped";
    case VmState::kShutOff:
      return "shut off";
    case VmState::kGone:
      return "gone";
    case VmState::kFailed:
      return "failed";
  }
  return "?";
}

VmSupervisor::VmSupervisor(std::string name, std::unique_ptr<VmBackend> backend,
                           asio::any_io_executor pool, CaptureStore store,
                           std::shared_ptr<CaptureService> captures, SupervisorOptions options)
    : name_(std::move(name)),
      backend_(std::move(backend)),
      strand_(asio::make_strand(pool)),
      store_(std::move(store)),
      captures_(std::move(captures)),
      options_(std::move(options)),
      interval_timer_(strand_),
      state_(backend_ ? VmState::kStarting : VmState::kOffline) {
  if (!options_.queue) options_.queue = std::make_shared<CaptureQueue>(pool, 2);
}

VmSupervisor::~VmSupervisor() {
  if (meta_) meta_->Stop();
}

void VmSupervisor::SetLogWatchStatus(nlohmann::json status) {
  std::lock_guard lock(mu_);
  log_watch_ = std::move(status);
}

void VmSupervisor::SetMetaReceiver(std::shared_ptr<MetaReceiver> receiver) {
  std::lock_guard lock(mu_);
  meta_ = std::move(receiver);
}

void VmSupervisor::Post(std::function<void()> fn) {
  asio::post(strand_, [self = shared_from_this(), fn = std::move(fn)] {
    try {
      fn();
    } catch (const std::exception& e) {
      self->Fail(std::string("unexpected error: ") + e.what());
    } catch (...) {
      self->Fail("unexpected error of unknown type");
    }
  });
}

void VmSupervisor::Start() {
  if (!backend_) return;
  Post([this] {
    backend_->Start(*this);
    json info = backend_->Describe();
    std::lock_guard lock(mu_);
    if (state_ == VmState::kStarting) state_ = VmState::kRunning;
    last_event_ = "started";
    backend_info_ = std::move(info);
  });
}

namespace {

// Runs |fn| when destroyed: a caller's completion must run even if the step
// before it throws.
struct Finally {
  const std::function<void()>& fn;
  ~Finally() {
    if (fn) fn();
  }
};

}  // namespace

void VmSupervisor::Stop(std::function<void()> then) {
  // After the captures already triggered, as when they ran on the strand.
  Post([this, then = std::move(then)]() mutable {
    WhenIdle([this, then = std::move(then)] {
      Finally finally{then};
      if (auto meta = MetaReceiverOf(); meta) meta->Stop();
      if (backend_) backend_->Stop();
    });
  });
}

void VmSupervisor::Release(std::function<void()> then) {
  Post([this, then = std::move(then)]() mutable {
    WhenIdle([this, then = std::move(then)] {
      Finally finally{then};
      if (!backend_) return;
      if (auto meta = MetaReceiverOf(); meta) meta->Stop();
      backend_->Release();
    });
  });
}

void VmSupervisor::OnVmEvent(VmEvent event) {
  Post([this, event = std::move(event)] { HandleEvent(event); });
}

void VmSupervisor::OnVmGone(std::string reason) {
  HostTime when = HostTime::Now();
  Post([this, reason = std::move(reason), when] {
    {
      std::lock_guard lock(mu_);
      last_error_ = "VM gone: " + reason;
    }
    events_.push_back(RecordedEvent{"HVTRACE_VM_GONE", when, json{{"reason", reason}}});
    if (!captured_since_run_) Schedule("qemu-gone", when, nullptr);
    SetState(VmState::kGone);
  });
}

void VmSupervisor::OnVmFailure(std::string reason) {
  Post([this, reason = std::move(reason)] { Fail(reason); });
}

void VmSupervisor::Fail(const std::string& reason) {
  {
    std::lock_guard lock(mu_);
    state_ = VmState::kFailed;
    last_error_ = reason;
  }
  // Said once, here: a capture that fails later names only its own step.
  LogWarning("VM " + name_ + ": failed: " + reason);
}

void VmSupervisor::SetState(VmState state) {
  std::lock_guard lock(mu_);
  // A failed VM stays failed until its backend is replaced: the error is what
  // the operator needs to see.
  if (state_ != VmState::kFailed) state_ = state;
}

bool VmSupervisor::live() const {
  const VmState s = state();
  return backend_ && s != VmState::kOffline && s != VmState::kGone && s != VmState::kStopped &&
         s != VmState::kFailed;
}

VmState VmSupervisor::state() const {
  std::lock_guard lock(mu_);
  return state_;
}

void VmSupervisor::HandleEvent(const VmEvent& event) {
  events_.push_back(RecordedEvent{event.name, event.time, event.data});
  while (events_.size() > options_.max_recorded_events) events_.pop_front();
  // The backend's description changes when its connection comes up (QMP's
  // handshake completes after Start) or its boot range file changes (a
  // libvirt domain started): refresh what `status` shows.
  const bool changed =
      event.name == "HVTRACE_QMP_CONNECTED" || event.name.starts_with("HVTRACE_BOOT_RANGE_");
  json info = changed && backend_ ? backend_->Describe() : json();
  {
    std::lock_guard lock(mu_);
    ++events_seen_;
    last_event_ = event.name;
    if (!info.is_null()) backend_info_ = std::move(info);
  }
  const std::string& name = event.name;
  // The panic policy lets the guest go only once its capture ended.
  auto apply_policy = [this] {
    if (backend_) backend_->ApplyPanicPolicy(options_.panic_policy);
  };
  if (name == "GUEST_PANICKED") {
    SetState(VmState::kPanicked);
    Schedule("panic", event.time, nullptr, apply_policy);
  } else if (name == "HVTRACE_FOUND_PANICKED") {
    // Panicked while nobody watched: still captured, once per watch.
    SetState(VmState::kPanicked);
    Schedule("panic-while-away", event.time, nullptr, apply_policy);
  } else if (name == "HVTRACE_FOUND_SHUTOFF") {
    // A libvirt domain that is not running: nothing to capture, nothing runs.
    SetState(VmState::kShutOff);
  } else if (name == "HVTRACE_FOUND_PAUSED") {
    SetState(VmState::kPaused);
    Schedule("paused-while-away", event.time, nullptr);
  } else if (name == "HVTRACE_GUEST_OOPS" || name == "HVTRACE_GUEST_WARN") {
    // Trouble the guest lives on after, seen in its log (log_watch.h).
    Schedule(name == "HVTRACE_GUEST_OOPS" ? "oops" : "warn", event.time, nullptr);
  } else if (name == "GUEST_CRASHLOADED") {
    // The VM keeps running into its kdump kernel: the copy races the guest.
    Schedule("crashloaded", event.time, nullptr);
  } else if (name == "RESET") {
    if (!captured_since_run_) Schedule("reset", event.time, nullptr);
    captured_since_run_ = false;  // A new boot starts.
    SetState(VmState::kRunning);
  } else if (name == "SHUTDOWN") {
    if (!captured_since_run_) Schedule("shutdown", event.time, nullptr);
    SetState(VmState::kStopped);
  } else if (name == "STOP") {
    if (state() != VmState::kPanicked) SetState(VmState::kPaused);
  } else if (name == "RESUME") {
    captured_since_run_ = false;
    SetState(VmState::kRunning);
  }
}

void VmSupervisor::RequestCapture(std::string trigger, CaptureDone done) {
  HostTime when = HostTime::Now();
  Post([this, trigger = std::move(trigger), when, done = std::move(done)]() mutable {
    Schedule(std::move(trigger), when, std::move(done));
  });
}

void VmSupervisor::OnGuestLeaving(std::function<void(bool copied)> ack) {
  // Whichever comes first answers: the durable copies, or the capture's end
  // (a refusal or a failure before the copies).
  auto once = std::make_shared<std::once_flag>();
  auto answer = [once, ack = std::move(ack)](bool copied) {
    std::call_once(*once, [&] { ack(copied); });
  };
  HostTime when = HostTime::Now();
  Post([this, when, answer] {
    // Not "captured since the VM last ran": a kexec shows QEMU no event, so
    // the next boot's shutdown or QEMU's end must still be captured; a
    // reboot or poweroff after this capture is captured as before.
    const bool captured_before = captured_since_run_;
    Schedule(
        "guest-leaving", when, [answer](Result<CaptureSummary> r) { answer(r.ok()); }, {},
        [answer] { answer(true); });
    captured_since_run_ = captured_before;
  });
}

namespace {

// Triggers for which the vCPUs do not run while the regions are copied: a
// panic pauses them (-action panic=pause), a VM found paused or panicked is
// stopped, and a QEMU that is gone or shut down runs nothing.
bool VcpusStopped(const std::string& trigger) {
  return trigger == "panic" || trigger == "panic-while-away" || trigger == "paused-while-away" ||
         trigger == "qemu-gone" || trigger == "shutdown";
}

// What a running guest triggers by itself, as often as it likes. The
// guest's agent announces "guest-leaving" whenever it is stopped, so it is
// one of these (one capture per interval however often it comes), and it is
// of the cheap retention class (capture_budget.h IsPanicTrigger): a panic
// capture may evict it and it never evicts one, so a guest announcing its
// leaving in a loop cannot push its VM's real panic captures out. The boot
// it saves would otherwise be wiped by the next kernel, which is worth a
// capture, not a panic's protection.
bool GuestTriggered(const std::string& trigger) {
  return trigger == "crashloaded" || trigger == "reset" || trigger == "guest-leaving" ||
         trigger == "oops" || trigger == "warn";
}

// Which name a capture that stands for several triggers takes: the panic's,
// so retention and `status` still see a panic however many cheaper triggers
// were folded into it.
int Rank(const std::string& trigger) {
  if (trigger == "panic" || trigger == "panic-while-away") return 3;
  if (VcpusStopped(trigger)) return 2;
  if (trigger == "oops") return 1;  // An oops folded with WARNs stays an oops.
  return GuestTriggered(trigger) ? 0 : 1;
}

}  // namespace

void VmSupervisor::Schedule(std::string trigger, HostTime triggered, CaptureDone done,
                            std::function<void()> after, std::function<void()> durable) {
  PendingCapture incoming{std::move(trigger), triggered, {}, {}, {}, {}};
  if (done) incoming.done.push_back(std::move(done));
  if (after) incoming.after.push_back(std::move(after));
  if (durable) incoming.durable.push_back(std::move(durable));
  captured_since_run_ = true;
  std::optional<PendingCapture>& slot = GuestTriggered(incoming.trigger) ? guest_ : urgent_;
  if (!slot) {
    slot = std::move(incoming);
  } else {
    Fold(*slot, std::move(incoming));
  }
  // A panic waiting behind this VM's guest-lane capture: that one goes
  // ahead of other VMs' guest captures now, so the panic is next.
  if (urgent_ && in_guest_lane_) options_.queue->Promote(*in_guest_lane_);
  Pump();
}

void VmSupervisor::Fold(PendingCapture& into, PendingCapture from) {
  if (Rank(from.trigger) > Rank(into.trigger)) {
    std::swap(into.trigger, from.trigger);
    std::swap(into.triggered, from.triggered);
  }
  ++into.coalesced[from.trigger];
  for (auto& [t, n] : from.coalesced) into.coalesced[t] += n;
  for (auto& d : from.done) into.done.push_back(std::move(d));
  for (auto& a : from.after) into.after.push_back(std::move(a));
  for (auto& d : from.durable) into.durable.push_back(std::move(d));
  std::lock_guard lock(mu_);
  ++coalesced_[from.trigger];
}

void VmSupervisor::Pump() {
  if (!in_flight_) {
    if (urgent_) {
      PendingCapture p = std::move(*urgent_);
      urgent_.reset();
      if (guest_) {
        // The urgent capture copies the newer state: it holds the guest's.
        Fold(p, std::move(*guest_));
        guest_.reset();
      }
      Dispatch(std::move(p), CaptureQueue::Lane::kUrgent);
    } else if (guest_) {
      const auto now = std::chrono::steady_clock::now();
      const auto next = last_start_ + options_.guest_capture_interval;
      if (flush_ || last_start_ == std::chrono::steady_clock::time_point{} || now >= next) {
        PendingCapture p = std::move(*guest_);
        guest_.reset();
        Dispatch(std::move(p), CaptureQueue::Lane::kGuest);
      } else {
        interval_timer_.expires_at(next);
        interval_timer_.async_wait(
            [self = shared_from_this()](const boost::system::error_code& ec) {
              if (!ec) self->Post([s = self.get()] { s->Pump(); });
            });
      }
    }
  }
  if (!in_flight_ && !urgent_ && !guest_) {
    flush_ = false;
    std::vector<std::function<void()>> idle;
    idle.swap(when_idle_);
    for (auto& fn : idle) fn();
  }
  PublishQueueState();
}

void VmSupervisor::SetLiveOptions(size_t capture_retention, PanicPolicy panic_policy,
                                  std::chrono::milliseconds guest_capture_interval) {
  Post([this, capture_retention, panic_policy, guest_capture_interval] {
    options_.capture_retention = capture_retention;
    options_.panic_policy = panic_policy;
    options_.guest_capture_interval = guest_capture_interval;
  });
}

void VmSupervisor::WhenIdle(std::function<void()> fn) {
  when_idle_.push_back(std::move(fn));
  flush_ = true;
  interval_timer_.cancel();
  Pump();
}

void VmSupervisor::Dispatch(PendingCapture p, CaptureQueue::Lane lane) {
  in_flight_ = true;
  last_start_ = std::chrono::steady_clock::now();
  if (!backend_) {
    Complete(std::move(p), Error{"VM '" + name_ + "' has no backend to capture from"});
    return;
  }
  CaptureRequest request;
  request.vm = name_;
  request.trigger = p.trigger;
  request.triggered = p.triggered;
  request.events.assign(events_.begin(), events_.end());
  request.retention = options_.capture_retention;
  request.dedupe_same_panic = p.trigger == "panic-while-away";
  if (!p.coalesced.empty()) request.coalesced = p.coalesced;
  if (!p.durable.empty()) {
    request.on_durable = [hooks = p.durable] {
      for (const auto& hook : hooks) hook();
    };
  }
  try {
    Result<CaptureInputs> inputs = backend_->PrepareCapture();
    if (!inputs.ok()) {
      Complete(std::move(p), inputs.error());
      return;
    }
    request.inputs = std::move(*inputs);
  } catch (const std::exception& e) {
    Complete(std::move(p), Error{std::string("backend threw: ") + e.what()});
    return;
  }
  request.inputs.vcpus_stopped = VcpusStopped(p.trigger);
  // Guest memory is read (the kernel's log) only while the guest is held
  // and QEMU still answers: not once it is gone or shutting down.
  if (p.trigger == "panic" || p.trigger == "panic-while-away" || p.trigger == "paused-while-away") {
    request.inputs.read_guest_memory = backend_->guest_memory_reader();
    request.inputs.guest_ram = backend_->guest_ram();
    if (backend_->vmcore_on_panic().value_or(options_.vmcore_on_panic)) {
      request.inputs.dump_guest_memory = backend_->guest_memory_dumper();
      if (!request.inputs.dump_guest_memory) request.inputs.dump_unavailable = true;
    }
  }
  // Where the time before the copy goes (the event's hops to this strand and
  // to a worker): kept with the queue's record.
  const double to_dispatch = MsSince(request.triggered);
  auto job = [self = shared_from_this(), request = std::move(request), to_dispatch,
              p = std::make_shared<PendingCapture>(std::move(p))](
                 const CaptureQueue::Start& start) mutable {
    request.queue = {{"lane", start.lane == CaptureQueue::Lane::kUrgent ? "urgent" : "guest"},
                     {"waited_for_a_slot", start.waited},
                     {"trigger_to_dispatch_ms", to_dispatch},
                     {"trigger_to_worker_ms", MsSince(request.triggered)}};
    Result<CaptureOutcome> outcome = Error{"capture did not run"};
    try {
      outcome = self->captures_->Take(self->store_, request);
    } catch (const std::exception& e) {
      outcome = Error{"VM " + self->name_ + ", capture '" + request.trigger + "': " + e.what()};
    }
    self->Post([s = self.get(), p, outcome = std::move(outcome)]() mutable {
      s->Complete(std::move(*p), std::move(outcome));
    });
  };
  const CaptureQueue::Ticket ticket = options_.queue->Submit(lane, std::move(job));
  if (lane == CaptureQueue::Lane::kGuest) in_guest_lane_ = ticket;
  PublishQueueState();
}

void VmSupervisor::Complete(PendingCapture p, Result<CaptureOutcome> outcome) {
  in_flight_ = false;
  in_guest_lane_.reset();
  Result<CaptureSummary> result = Error{""};
  if (!outcome.ok()) {
    std::lock_guard lock(mu_);
    ++captures_failed_;
    last_error_ = "capture '" + p.trigger + "' failed: " + outcome.error().message;
    LogErr("VM " + name_ + ": " + last_error_);
    result = outcome.error();
    captured_since_run_ = false;  // Nothing holds this run yet.
  } else {
    CaptureSummary summary{outcome->id, outcome->trigger, outcome->trigger_to_disk_ms};
    // Every capture is logged once: stored (with what it stands for), or
    // found to be one already stored.
    if (outcome->deduplicated) {
      LogInfo("VM " + name_ + ": found panicked, in the panic capture " + outcome->id +
              " holds (its region.bin is byte-identical): no second capture");
    } else {
      std::string counts;
      for (const auto& [t, n] : p.coalesced)
        counts += (counts.empty() ? "" : ", ") + std::to_string(n) + " " + t;
      char ms[32];
      std::snprintf(ms, sizeof ms, "%.1f", outcome->trigger_to_disk_ms);
      LogNotice("VM " + name_ + ": capture " + outcome->id + " (" + p.trigger + ") stored, " + ms +
                " ms from trigger to disk" +
                (counts.empty()
                     ? std::string()
                     : "; it also stands for " + counts + " trigger(s) coalesced into it"));
    }
    if (!outcome->retention_error.empty()) {
      LogWarning("VM " + name_ + ": retention: " + outcome->retention_error);
    }
    if (!outcome->incomplete.empty()) {
      LogWarning("VM " + name_ + ": capture " + outcome->id +
                 " is incomplete: " + outcome->incomplete);
    }
    if (!outcome->deduplicated && options_.on_committed) {
      options_.on_committed(name_, outcome->id, store_.dir() / outcome->id);
    }
    std::lock_guard lock(mu_);
    if (!outcome->deduplicated) ++captures_taken_;
    last_capture_ = summary;  // `status` names the capture that holds it.
    if (!outcome->retention_error.empty()) last_error_ = "retention: " + outcome->retention_error;
    if (!outcome->incomplete.empty())
      last_error_ = "capture " + outcome->id + " is incomplete: " + outcome->incomplete;
    result = summary;
  }
  for (const CaptureDone& done : p.done) done(result);
  for (const auto& after : p.after) after();
  Pump();
}

void VmSupervisor::PublishQueueState() {
  json pending = json::array();
  for (const auto* p : {&urgent_, &guest_}) {
    if (*p) pending.push_back({{"trigger", (*p)->trigger}, {"coalesced", (*p)->coalesced}});
  }
  std::lock_guard lock(mu_);
  capture_queue_ = {{"in_flight", in_flight_}, {"pending", std::move(pending)}};
}

VmStatusReply VmSupervisor::Status() const {
  std::lock_guard lock(mu_);
  VmStatusReply status;
  status.name = name_;
  if (backend_) status.kind = std::string(backend_->kind());
  status.state = VmStateName(state_);
  status.events_seen = events_seen_;
  status.captures_taken = captures_taken_;
  status.captures_failed = captures_failed_;
  status.captures_coalesced = coalesced_;
  status.capture_queue = capture_queue_;
  status.captures_dir = store_.dir().string();
  status.backend = backend_info_;
  if (backend_) status.attach = backend_->AttachStatus();
  // The metadata channel: connected, boots received, the last refusal.
  if (meta_) status.meta = meta_->Status();
  status.log_watch = log_watch_;
  if (!last_error_.empty()) status.last_error = last_error_;
  if (!last_event_.empty()) status.last_event = last_event_;
  if (last_capture_) {
    status.last_capture = CaptureRef{
        {}, last_capture_->id, last_capture_->trigger, last_capture_->trigger_to_disk_ms};
  }
  return status;
}

Status SupervisorRegistry::Add(std::shared_ptr<VmSupervisor> supervisor) {
  std::lock_guard lock(mu_);
  std::string name = supervisor->name();
  if (!vms_.emplace(name, std::move(supervisor)).second) {
    return Error{"a VM named '" + name + "' is already registered"};
  }
  return {};
}

std::shared_ptr<VmSupervisor> SupervisorRegistry::Find(std::string_view name) const {
  std::lock_guard lock(mu_);
  auto it = vms_.find(name);
  return it == vms_.end() ? nullptr : it->second;
}

std::vector<std::shared_ptr<VmSupervisor>> SupervisorRegistry::All() const {
  std::lock_guard lock(mu_);
  std::vector<std::shared_ptr<VmSupervisor>> all;
  for (const auto& [name, s] : vms_) all.push_back(s);
  return all;
}

std::shared_ptr<VmSupervisor> SupervisorRegistry::Remove(std::string_view name) {
  std::lock_guard lock(mu_);
  auto it = vms_.find(name);
  if (it == vms_.end()) return nullptr;
  auto supervisor = std::move(it->second);
  vms_.erase(it);
  return supervisor;
}

void SupervisorRegistry::LetAllGo(void (VmSupervisor::*let_go)(std::function<void()>),
                                  std::function<void()> all_done) {
  const auto all = All();
  // One count per supervisor and one for this loop: the last to finish
  // calls |all_done|.
  auto left = std::make_shared<std::atomic<size_t>>(all.size() + 1);
  auto done = std::make_shared<std::function<void()>>(std::move(all_done));
  auto one_done = [left, done] {
    if (left->fetch_sub(1) == 1 && *done) (*done)();
  };
  for (const auto& s : all) ((*s).*let_go)(one_done);
  one_done();
}

void SupervisorRegistry::StopAll(std::function<void()> all_done) {
  LetAllGo(&VmSupervisor::Stop, std::move(all_done));
}

void SupervisorRegistry::ReleaseAll(std::function<void()> all_done) {
  LetAllGo(&VmSupervisor::Release, std::move(all_done));
}

}  // namespace hvtrace::hostd
