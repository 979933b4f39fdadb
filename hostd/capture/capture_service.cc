#include "capture_service.h"

#include <future>
#include <mutex>
#include <optional>
#include <system_error>
#include <utility>

#include "boot_timeline.h"
#include "capped_file.h"
#include "capture_steps.h"
#include "host_time.h"
#include "host_trace_capture.h"
#include "kernel_log_step.h"
#include "meta_store.h"
#include "page_buffer.h"
#include "vmcore_step.h"

namespace hvtrace::hostd {
namespace {

using nlohmann::json;

// A guest found panicked by a daemon that (re)starts may still be in the
// panic an earlier run captured (or recovered). A paused guest writes
// nothing, so regions byte-identical to the newest panic capture's (the boot
// range, the attach region, whichever |pending| holds) are that panic; a
// guest that rebooted and panicked again wrote new events.
std::optional<CaptureEntry> SamePanicCaptured(const CaptureStore& store,
                                              const std::filesystem::path& pending) {
  auto entries = store.List();
  if (!entries.ok()) return std::nullopt;
  for (auto it = entries->rbegin(); it != entries->rend(); ++it) {
    const std::string trigger = it->summary.value("trigger", std::string());
    if (trigger != "panic" && trigger != "panic-while-away") continue;
    int compared = 0;
    for (const char* name : {kRegionFileName, kAttachRegionFileName}) {
      std::error_code ec;
      if (!std::filesystem::exists(pending / name, ec)) continue;
      if (!SameContents(it->dir / name, pending / name)) return std::nullopt;
      ++compared;
    }
    if (compared > 0) return *it;
    return std::nullopt;  // Only the newest panic capture can be this one.
  }
  return std::nullopt;
}

}  // namespace

std::filesystem::path MetaDirOfStore(const CaptureStore& store) {
  return MetaDirOfVm(store.dir().parent_path());
}

// One set of private copies: a capture copies the regions here, never into
// memory it allocates then.
struct CaptureService::CopyBuffers {
  PageBuffer region_file;  // Never write-protected by a fork (page_buffer.h).
  std::vector<std::byte> attach;
};

namespace {

// Grows |buffer| to |bytes|; the zero-fill touches every page now, not at
// panic time. A copy may leave a buffer shorter (a smaller region) with its
// capacity: growing it back does not allocate.
void Fit(std::vector<std::byte>& buffer, uint64_t bytes) {
  if (buffer.size() < bytes) buffer.resize(bytes);
}
void Fit(PageBuffer& buffer, uint64_t bytes) {
  if (buffer.size() < bytes) (void)buffer.Resize(bytes);  // On failure: grown at capture.
}

void FitAll(auto& buffers, CopySizes sizes) {
  Fit(buffers.region_file, sizes.region_file);
  Fit(buffers.attach, sizes.attach);
}

// A copy of |bytes| into |buffer| will allocate (the pool was not reserved
// for it): counted, so `hvtrace ping` shows it.
void CountIfTooSmall(const auto& buffer, uint64_t bytes, std::atomic<uint64_t>& grown) {
  if (buffer.capacity() < bytes) grown.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace

json CopyPoolStats::ToJson() const {
  return {{"sets", sets},
          {"bytes", bytes},
          {"reserved", {{"region_file", reserved.region_file}, {"attach", reserved.attach}}},
          {"grown_at_capture", grown_at_capture}};
}

// One set of copy buffers, returned to the pool when the capture is done.
class CaptureService::BufferLease {
 public:
  BufferLease(CaptureService& service, std::unique_ptr<CopyBuffers> buffers)
      : service_(service), buffers_(std::move(buffers)) {}
  BufferLease(BufferLease&&) = default;
  ~BufferLease() {
    if (!buffers_) return;
    std::unique_lock lock(service_.mu_);
    const CopySizes reserved = service_.reserved_;
    lock.unlock();
    // A buffer a failed decode gave away, or a reservation made while this
    // set was out, is made whole here, after the capture, not in the next one.
    FitAll(*buffers_, reserved);
    lock.lock();
    service_.free_buffers_.push_back(std::move(buffers_));
    service_.free_cv_.notify_one();
  }
  CopyBuffers& get() { return *buffers_; }

 private:
  CaptureService& service_;
  std::unique_ptr<CopyBuffers> buffers_;
};

CaptureService::CaptureService(std::shared_ptr<FormatsService> formats, size_t copy_buffers,
                               CaptureFaults faults, std::shared_ptr<CaptureBudget> budget)
    : formats_(std::move(formats)),
      faults_(std::move(faults)),
      budget_(budget ? std::move(budget)
                     : std::make_shared<CaptureBudget>(DiskLimits{}, std::filesystem::path())),
      sets_(std::max<size_t>(copy_buffers, 1)) {
  for (size_t i = 0; i < sets_; ++i) free_buffers_.push_back(std::make_unique<CopyBuffers>());
}

CaptureService::~CaptureService() = default;

namespace {

// The kernel log step's reads (ReadGuestLog) on a thread of their own, beside
// the decode. Through guest RAM they need nothing of it; through QMP memsave
// they wait for the newest boot's KASLR offset, their first candidate, which
// the decode settles before its symbols, trace.dat and crash summary (6.12
// demo panic, 2026-12-03: the memsave reads 17 ms of round trips, the decode
// after its KASLR step about 12 ms). Without a thread the reads run after the
// decode, as before.
class GuestLogBesideDecode {
 public:
  GuestLogBesideDecode(const CaptureInputs& in, FormatsService* formats, PendingCapture& pending,
                       bool enabled)
      : in_(in), formats_(formats), pending_(pending) {
    if (!enabled) return;
    try {
      reading_ = std::async(std::launch::async, [this, hint = hint_.get_future()]() mutable {
        double waited = -1;
        GuestLogRead read = ReadGuestLog(in_, formats_, [&] {
          const HostTime asked = HostTime::Now();
          const std::optional<int64_t> delta = hint.get();
          waited = MsSince(asked);
          return delta;
        });
        if (waited >= 0) read.info["kaslr_wait_ms"] = waited;
        WriteGuestLogFiles(read, pending_);
        return read;
      });
    } catch (const std::system_error&) {
      // No thread to be had: Finish reads.
    }
  }
  // A decode that threw never told the thread: it must not wait forever.
  ~GuestLogBesideDecode() { Tell(std::nullopt); }
  GuestLogBesideDecode(const GuestLogBesideDecode&) = delete;
  GuestLogBesideDecode& operator=(const GuestLogBesideDecode&) = delete;

  // For the decode (BootMapCaptureOptions::newest_kaslr); empty when no
  // thread reads.
  KaslrHook hook() {
    if (!reading_.valid()) return {};
    return [this](std::optional<int64_t> delta) { Tell(delta); };
  }
  // The reads' result; |decoded| (the manifest's verdict) is the hint when
  // the decode never gave one (it failed, or had no formats).
  GuestLogRead Finish(std::optional<int64_t> decoded) {
    if (!reading_.valid()) return ReadGuestLog(in_, formats_, [decoded] { return decoded; });
    Tell(decoded);
    return reading_.get();
  }

 private:
  void Tell(std::optional<int64_t> delta) {
    std::call_once(told_, [&] { hint_.set_value(delta); });
  }

  const CaptureInputs& in_;
  FormatsService* const formats_;
  PendingCapture& pending_;
  std::promise<std::optional<int64_t>> hint_;
  std::once_flag told_;
  std::future<GuestLogRead> reading_;  // Last: joined before the rest goes.
};

}  // namespace

void CaptureService::Reserve(CopySizes sizes) {
  std::lock_guard lock(mu_);
  if (sizes.region_file <= reserved_.region_file && sizes.attach <= reserved_.attach) return;
  reserved_.region_file = std::max(reserved_.region_file, sizes.region_file);
  reserved_.attach = std::max(reserved_.attach, sizes.attach);
  // Sets out on a capture grow when they come back (~BufferLease).
  for (auto& buffers : free_buffers_) FitAll(*buffers, reserved_);
}

CopyPoolStats CaptureService::copy_pool() const {
  std::lock_guard lock(mu_);
  CopyPoolStats stats{sets_, 0, reserved_, grown_at_capture_.load(std::memory_order_relaxed)};
  for (const auto& buffers : free_buffers_) {
    stats.bytes += buffers->region_file.capacity() + buffers->attach.capacity();
  }
  return stats;
}

CaptureService::BufferLease CaptureService::AcquireBuffer(bool* waited) {
  std::unique_lock lock(mu_);
  *waited = free_buffers_.empty();
  free_cv_.wait(lock, [this] { return !free_buffers_.empty(); });
  auto buffers = std::move(free_buffers_.back());
  free_buffers_.pop_back();
  return BufferLease(*this, std::move(buffers));
}

Status CaptureService::Build(const CaptureRequest& request, const std::filesystem::path& meta_dir,
                             CopyBuffers& copies, PendingCapture& pending,
                             CaptureManifest& manifest) {
  const CaptureInputs& in = request.inputs;
  if (!in.region_file && !in.attach) {
    return Error{"VM '" + request.vm + "' has no trace region to capture (`hvtrace attach " +
                 request.vm + "` adds one)"};
  }
  manifest.extra["transport"] = in.transport;
  // Recorded before the copies, so a recovery knows it too; completed below.
  manifest.extra["consistency"] = {{"vcpus_stopped", in.vcpus_stopped}};
  if (in.region_file) {
    CountIfTooSmall(copies.region_file, in.region_file->size, grown_at_capture_);
    if (Status s = CopyRegionFileStep(*in.region_file, copies.region_file, pending, manifest);
        !s.ok())
      return s;
    // From here on the capture survives this daemon (Recover): the record
    // CopyRegionFileStep staged beside the copy, put in place.
    if (Status s = pending.PublishRecoveryRecord(); !s.ok()) return s;
    manifest.extra["timing_ms"]["trigger_to_recoverable"] = MsSince(request.triggered);
  }
  if (in.attach) {
    CountIfTooSmall(copies.attach, in.attach->size(), grown_at_capture_);
    if (Status s = CopyAttachStep(*in.attach, copies.attach, pending, manifest); !s.ok()) return s;
    if (Status s = pending.WriteRecoveryRecord(manifest); !s.ok()) return s;
  }
  if (faults_.after_copies_durable) faults_.after_copies_durable();
  if (request.on_durable) request.on_durable();
  // The host side of boot (--trace-boot), as far as QEMU has written it.
  if (!in.qemu_trace_log.empty()) {
    AttachQemuTraceLogStep(in.qemu_trace_log, pending, manifest, in.qemu_trace_log_is_libvirt);
  }
  const std::span<const std::byte> region_copy =
      in.region_file ? copies.region_file.span() : std::span<const std::byte>();
  // The guest's kernel log, read from guest memory whether or not the decode
  // works: the guest is still held, and is released only after Take returns.
  const bool can_read = in.read_guest_memory || in.guest_ram;
  const bool read_log = can_read || request.trigger == "panic";
  GuestLogBesideDecode log_read(in, formats_.get(), pending, can_read);
  manifest.extra["timing_ms"]["trigger_to_decode_start"] = MsSince(request.triggered);
  const Status decoded =
      DecodeCopiesStep(region_copy, in.attach ? &copies.attach : nullptr,
                       in.attach ? in.attach->geometry() : RegionGeometry{}, in.vcpus_stopped,
                       formats_.get(), meta_dir, pending, manifest, nullptr, log_read.hook());
  // The trace.dat files and the crash summary are ready: what the timing
  // means (capture_store.h), not the guest memory steps after it.
  if (decoded.ok()) manifest.extra["timing_ms"]["trigger_to_decoded"] = MsSince(request.triggered);
  if (read_log) StoreGuestLog(log_read.Finish(DecodedKaslrDelta(manifest)), pending, manifest);
  const bool dump = in.dump_guest_memory || in.dump_unavailable;
  if (dump) VmcoreStep(in, pending, manifest);
  if (read_log || dump) {
    manifest.extra["timing_ms"]["trigger_to_guest_memory_read"] = MsSince(request.triggered);
  }
  return decoded;
}

Result<CaptureOutcome> CaptureService::Take(const CaptureStore& store,
                                            const CaptureRequest& request) {
  const CaptureInputs& in = request.inputs;
  const uint64_t region_bytes = (in.region_file ? in.region_file->size : 0) +
                                (in.attach ? in.attach->geometry().region_size : 0) +
                                (in.qemu_trace_log.empty() ? 0 : kHostTraceCopyCap) +
                                // A vmcore: at most the guest's RAM (Admit doubles it).
                                (in.dump_guest_memory ? in.vmcore_bound / 2 : 0);
  Result<CaptureBudget::Admission> admitted =
      budget_->Admit(store, request.vm, request.trigger, region_bytes);
  if (!admitted.ok()) return admitted.error();
  auto pending = store.Begin(request.trigger, request.triggered);
  if (!pending.ok()) return pending.error();
  const double to_begun = MsSince(request.triggered);
  CaptureManifest manifest;
  manifest.vm = request.vm;
  manifest.trigger = request.trigger;
  manifest.triggered = request.triggered;
  manifest.qmp_events = request.events;
  manifest.extra["disk"] = admitted->ToJson();
  std::string incomplete;
  if (!request.coalesced.empty()) manifest.extra["coalesced"] = request.coalesced;
  {
    // Whether another capture kept this one waiting, from the daemon's queue
    // and here: what lets a panic be captured in its usual time while another
    // VM floods the daemon with captures (capture_queue.h).
    bool waited_for_buffers = false;
    BufferLease buffer = AcquireBuffer(&waited_for_buffers);
    if (!request.queue.is_null()) manifest.extra["queue"] = request.queue;
    manifest.extra["queue"]["waited_for_copy_buffers"] = waited_for_buffers;
    manifest.extra["timing_ms"]["trigger_to_begun"] = to_begun;
    if (Status s = Build(request, MetaDirOfStore(store), buffer.get(), **pending, manifest);
        !s.ok()) {
      const std::string message =
          "VM " + request.vm + ", capture '" + request.trigger + "': " + s.error().message;
      // Nothing durable yet: nothing to keep.
      if (!(*pending)->durable()) return Error{message};
      // The raw copy is durable: it is committed with what there is.
      incomplete = s.error().message;
      manifest.extra["incomplete"] = incomplete;
    }
  }
  if (request.dedupe_same_panic && incomplete.empty()) {
    if (auto same = SamePanicCaptured(store, (*pending)->dir())) {
      (*pending)->Abandon();
      return CaptureOutcome{
          same->id, same->summary.value("trigger", request.trigger), true, 0.0, {}, {}, {}};
    }
  }
  Result<CaptureEntry> entry = (*pending)->Commit(std::move(manifest));
  if (!entry.ok()) return Error{"VM " + request.vm + ": " + entry.error().message};
  CaptureOutcome outcome{entry->id,  request.trigger,   false, MsSince(request.triggered), {},
                         incomplete, admitted->ToJson()};
  auto pruned = budget_->Prune(store, request.vm, request.trigger, entry->id, request.retention);
  if (!pruned.ok()) outcome.retention_error = pruned.error().message;
  return outcome;
}

}  // namespace hvtrace::hostd
