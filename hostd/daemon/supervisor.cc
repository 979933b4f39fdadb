#include "supervisor.h"

#include <boost/asio/post.hpp>
#include <exception>
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
      options_(options),
      state_(backend_ ? VmState::kStarting : VmState::kOffline) {}

VmSupervisor::~VmSupervisor() = default;

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

void VmSupervisor::Stop(std::function<void()> then) {
  Post([this, then = std::move(then)] {
    // |then| runs even if Stop throws: the caller's reply must not get lost.
    struct Finally {
      const std::function<void()>& fn;
      ~Finally() {
        if (fn) fn();
      }
    } finally{then};
    if (backend_) backend_->Stop();
  });
}

void VmSupervisor::Release() {
  if (!backend_) return;
  Post([this] { backend_->Release(); });
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
    if (!captured_since_run_) DoCapture("qemu-gone", when, nullptr);
    SetState(VmState::kGone);
  });
}

void VmSupervisor::OnVmFailure(std::string reason) {
  Post([this, reason = std::move(reason)] { Fail(reason); });
}

void VmSupervisor::Fail(const std::string& reason) {
  std::lock_guard lock(mu_);
  state_ = VmState::kFailed;
  last_error_ = reason;
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
  // handshake completes after Start): refresh what `status` shows.
  json info = event.name == "HVTRACE_QMP_CONNECTED" && backend_ ? backend_->Describe() : json();
  {
    std::lock_guard lock(mu_);
    ++events_seen_;
    last_event_ = event.name;
    if (!info.is_null()) backend_info_ = std::move(info);
  }
  const std::string& name = event.name;
  if (name == "GUEST_PANICKED") {
    SetState(VmState::kPanicked);
    DoCapture("panic", event.time, nullptr);
    if (backend_) backend_->ApplyPanicPolicy(options_.panic_policy);
  } else if (name == "HVTRACE_FOUND_PANICKED") {
    // Panicked while nobody watched: still captured, once per watch.
    SetState(VmState::kPanicked);
    DoCapture("panic-while-away", event.time, nullptr);
    if (backend_) backend_->ApplyPanicPolicy(options_.panic_policy);
  } else if (name == "HVTRACE_FOUND_PAUSED") {
    SetState(VmState::kPaused);
    DoCapture("paused-while-away", event.time, nullptr);
  } else if (name == "GUEST_CRASHLOADED") {
    // The VM keeps running into its kdump kernel: the copy races the guest.
    DoCapture("crashloaded", event.time, nullptr);
  } else if (name == "RESET") {
    if (!captured_since_run_) DoCapture("reset", event.time, nullptr);
    captured_since_run_ = false;  // A new boot starts.
    SetState(VmState::kRunning);
  } else if (name == "SHUTDOWN") {
    if (!captured_since_run_) DoCapture("shutdown", event.time, nullptr);
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
  Post([this, trigger = std::move(trigger), when, done = std::move(done)] {
    DoCapture(trigger, when, done);
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

}  // namespace

void VmSupervisor::DoCapture(const std::string& trigger, const HostTime& triggered,
                             const CaptureDone& done) {
  auto finish = [&](Result<CaptureSummary> result) {
    if (!result.ok()) {
      std::lock_guard lock(mu_);
      ++captures_failed_;
      last_error_ = "capture '" + trigger + "' failed: " + result.error().message;
    }
    if (done) done(std::move(result));
  };
  if (!backend_) {
    finish(Error{"VM '" + name_ + "' has no backend to capture from"});
    return;
  }
  CaptureRequest request;
  request.vm = name_;
  request.trigger = trigger;
  request.triggered = triggered;
  request.events.assign(events_.begin(), events_.end());
  request.retention = options_.capture_retention;
  request.dedupe_same_panic = trigger == "panic-while-away";
  try {
    Result<CaptureInputs> inputs = backend_->PrepareCapture();
    if (!inputs.ok()) {
      finish(inputs.error());
      return;
    }
    request.inputs = std::move(*inputs);
  } catch (const std::exception& e) {
    finish(Error{std::string("backend threw: ") + e.what()});
    return;
  }
  request.inputs.vcpus_stopped = VcpusStopped(trigger);
  Result<CaptureOutcome> outcome = captures_->Take(store_, request);
  if (!outcome.ok()) {
    finish(outcome.error());
    return;
  }
  captured_since_run_ = true;
  CaptureSummary summary{outcome->id, outcome->trigger, outcome->trigger_to_disk_ms};
  if (outcome->deduplicated) {
    Log("VM " + name_ + ": found panicked, in the panic capture " + outcome->id +
        " holds (its region.bin is byte-identical): no second capture");
  }
  {
    std::lock_guard lock(mu_);
    if (!outcome->deduplicated) ++captures_taken_;
    last_capture_ = summary;  // `status` names the capture that holds it.
    if (!outcome->retention_error.empty()) last_error_ = "retention: " + outcome->retention_error;
    if (!outcome->incomplete.empty())
      last_error_ = "capture " + outcome->id + " is incomplete: " + outcome->incomplete;
  }
  finish(summary);
}

json VmSupervisor::StatusJson() const {
  std::lock_guard lock(mu_);
  json status = {{"name", name_},
                 {"kind", backend_ ? std::string(backend_->kind()) : std::string("none")},
                 {"state", VmStateName(state_)},
                 {"events_seen", events_seen_},
                 {"captures_taken", captures_taken_},
                 {"captures_failed", captures_failed_},
                 {"captures_dir", store_.dir().string()},
                 {"backend", backend_info_}};
  if (backend_) {
    if (json attach = backend_->AttachStatus(); !attach.is_null())
      status["attach"] = std::move(attach);
  }
  status["last_error"] = last_error_.empty() ? json(nullptr) : json(last_error_);
  status["last_event"] = last_event_.empty() ? json(nullptr) : json(last_event_);
  if (last_capture_) {
    status["last_capture"] = {{"id", last_capture_->id},
                              {"trigger", last_capture_->trigger},
                              {"trigger_to_disk_ms", last_capture_->trigger_to_disk_ms}};
  } else {
    status["last_capture"] = nullptr;
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

void SupervisorRegistry::StopAll() {
  for (const auto& s : All()) s->Stop();
}

void SupervisorRegistry::ReleaseAll() {
  for (const auto& s : All()) s->Release();
}

}  // namespace hvtrace::hostd
