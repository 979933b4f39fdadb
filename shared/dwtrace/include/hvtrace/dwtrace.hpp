// Direct-write tracing for guest programs (C++ API; C API in dwtrace.h).
//
// A program writes events straight into the hvtrace region, which is host
// memory: no system call, no lock, no agent on the path, and every event
// whose Write() returned is visible to the host at once, so events written
// just before a guest crash are in the capture.
//
// Rings are per thread, not per CPU. A thread claims a free ring of the
// region's direct-write area once (a compare-and-swap on the ring's owner)
// and is then its only writer, so appending is plain stores plus one release
// store of the slot's length: no atomic read-modify-write, no rseq restart
// sequences, and no half-reserved records a per-CPU ring shared by preempted
// threads would leave behind. The cost is that rings are a finite pool: a
// thread that finds none drops its events and counts them
// (GuestStatus::dw_rings_exhausted); a thread's ring is freed when it exits
// (and by the agent when the thread is gone).
//
// Events are kernel ring-buffer records (hvtrace/page.h) in kernel-format
// pages, with struct trace_entry {u16 type; u8 flags; u8 preempt_count;
// s32 pid} in front of the fields and |type| = the event id. Each event is
// registered once with its fields; its format text, in the syntax of
// tracefs' events/*/format, goes into the region's format table with a
// fingerprint (hvtrace/fingerprint.h), so the host decodes it by name.
//
// Time stamps: Clock::kMonotonic is CLOCK_MONOTONIC nanoseconds, the clock
// hvtrace-agent sets for kernel events ("mono"). Clock::kTsc reads the TSC (a
// few ns where the vDSO's clock_gettime costs tens) and says so in the ring
// (DwRingHeader::clock = kClockTsc); hvtraced converts such ticks to the
// kernel's clock with the agent's clock-sync samples (region_clock.h) in its
// stream and captures. Clock::kAuto (the default) picks the TSC when it is
// invariant (constant_tsc and nonstop_tsc), the kernel still trusts it (it is
// in available_clocksource) and the region holds clock-sync samples (the
// agent writes them before it announces the guest); else CLOCK_MONOTONIC.
//
// Finding the region: Open("") uses $HVTRACE_REGION, else the path in
// /run/hvtrace/region that hvtrace-agent writes when it attaches, else the
// first ivshmem BAR (PCI 1af4:1110, resource2) carrying the region magic.
// The agent must have announced the guest (the boot generation) first.
//
// The host may go away and come back: when the device is unplugged, the
// mapping is guarded (hvtrace/region_writer.h), so writes land in zero pages
// instead of killing the program; Write() sees that the region is gone (one
// load of the host header per event), drops the event and counts it
// (dropped_detached()). A tracer from Open() then looks for a new region at
// most every 50 ms, re-registers its events there and carries on; the ids
// Register() returned stay valid.
#ifndef HVTRACE_DWTRACE_HPP_
#define HVTRACE_DWTRACE_HPP_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "hvtrace/region_writer.h"
#include "hvtrace/result.h"

namespace hvtrace::dw {

enum class Clock : uint32_t {
  kAuto = 0,
  kMonotonic = region::kClockMono,
  kTsc = region::kClockTsc
};

// Whether this CPU's TSC is invariant, and whether the kernel still lists it
// as a clocksource (what Clock::kAuto checks, once each).
bool HasInvariantTsc();
bool KernelTrustsTsc();

// One field of an event's payload, as laid out in the struct the program
// passes to Write(): |offset| is offsetof() in that struct. |type| is a C
// type, arrays as "char[16]".
struct Field {
  std::string name;
  std::string type;
  uint32_t offset = 0;
  uint32_t size = 0;
  bool is_signed = false;
};

class Tracer {
 public:
  // Maps the region (see the file comment for |path| = "").
  static Result<std::unique_ptr<Tracer>> Open(const std::string& path, Clock clock = Clock::kAuto);
  // Uses memory the caller mapped and keeps mapped (tests, benchmarks).
  // Such a tracer never looks for another region.
  static Result<std::unique_ptr<Tracer>> FromMemory(std::byte* base, uint64_t size,
                                                    Clock clock = Clock::kAuto);
  ~Tracer();
  Tracer(const Tracer&) = delete;
  Tracer& operator=(const Tracer&) = delete;

  // Registers |system|:|name| (or finds it registered already in this boot)
  // and returns its event id. |print_fmt| is the kernel-style print format
  // ("\"x=%d\", REC->x"); empty generates one from the fields.
  Result<uint16_t> Register(std::string_view system, std::string_view name,
                            const std::vector<Field>& fields, std::string_view print_fmt = {});

  // Appends one event with |size| payload bytes. Returns false when the
  // event was dropped (no ring free, larger than a page, or no region);
  // never blocks.
  bool Write(uint16_t id, const void* payload, uint32_t size);

  // The format text Register() publishes (exposed for tests).
  static std::string FormatText(std::string_view name, uint32_t id,
                                const std::vector<Field>& fields, std::string_view print_fmt);

  // Of the region written to now.
  uint32_t boot_generation() const;
  const RegionGeometry& geometry() const;
  uint32_t max_payload() const;
  // kMonotonic or kTsc (what kAuto chose).
  Clock clock() const { return clock_; }
  // Whether the region this tracer writes to is still there.
  bool attached() const;
  // Events dropped because the region was gone, and regions followed since.
  uint64_t dropped_detached() const { return dropped_detached_.load(std::memory_order_relaxed); }
  uint64_t reattaches() const { return reattaches_.load(std::memory_order_relaxed); }

  struct ThreadState;  // Per-thread ring binding; private to dwtrace.cc.

 private:
  // One mapped region. Kept until the tracer dies (threads may still point
  // into an old one); |id_map| (for every region after the first) turns the
  // ids Register() returned into this region's ids.
  struct Attachment;
  struct Registration {
    std::string system, name;
    std::vector<Field> fields;
    std::string print_fmt;
    uint16_t app_id;
  };

  Tracer(std::unique_ptr<Attachment> first, Clock clock);
  static Result<std::unique_ptr<Attachment>> MapRegion(const std::string& path);
  static Result<std::unique_ptr<Attachment>> AttachMemory(std::byte* base, uint64_t size);
  Result<uint16_t> RegisterIn(Attachment* a, const Registration& r);
  bool Bind(ThreadState* ts);
  bool StartPage(ThreadState* ts, uint64_t now);
  void Release(ThreadState* ts);
  bool DropDetached();
  bool ReopenLocked();
  uint64_t Now() const;

  // Constant-initialized, so the hot path reads it without a TLS init
  // check; the state is created by Bind() and freed at thread exit.
  static thread_local ThreadState* tls_;

  Clock clock_;
  bool can_reopen_ = false;
  std::string open_path_;
  std::atomic<Attachment*> current_{nullptr};
  std::atomic<uint64_t> serial_{0};  // Changes with every region: threads rebind.
  std::atomic<uint64_t> dropped_detached_{0};
  std::atomic<uint64_t> reattaches_{0};
  std::atomic<uint64_t> next_reopen_ns_{0};
  std::mutex mutex_;  // Registrations and region changes.
  std::vector<std::unique_ptr<Attachment>> attachments_;
  std::vector<Registration> registrations_;
};

}  // namespace hvtrace::dw

#endif  // HVTRACE_DWTRACE_HPP_
