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
// Time stamps are CLOCK_MONOTONIC nanoseconds (vDSO) by default, the clock
// hvtrace-agent sets for kernel events ("mono"), so both interleave on the
// host. Clock::kTsc reads the TSC instead (cheaper); the agent's clock-sync
// samples relate it.
//
// Finding the region: Open("") uses $HVTRACE_REGION, else the path in
// /run/hvtrace/region that hvtrace-agent writes when it attaches, else the
// first ivshmem BAR (PCI 1af4:1110, resource2) carrying the region magic.
// The agent must have announced the guest (the boot generation) first.
#ifndef HVTRACE_DWTRACE_HPP_
#define HVTRACE_DWTRACE_HPP_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "hvtrace/region_writer.h"
#include "hvtrace/result.h"

namespace hvtrace::dw {

enum class Clock : uint32_t { kMonotonic = region::kClockMono, kTsc = region::kClockTsc };

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
  static Result<std::unique_ptr<Tracer>> Open(const std::string& path, Clock clock = Clock::kMonotonic);
  // Uses memory the caller mapped and keeps mapped (tests, benchmarks).
  static Result<std::unique_ptr<Tracer>> FromMemory(std::byte* base, uint64_t size,
                                                    Clock clock = Clock::kMonotonic);
  ~Tracer();
  Tracer(const Tracer&) = delete;
  Tracer& operator=(const Tracer&) = delete;

  // Registers |system|:|name| (or finds it registered already in this boot)
  // and returns its event id. |print_fmt| is the kernel-style print format
  // ("\"x=%d\", REC->x"); empty generates one from the fields.
  Result<uint16_t> Register(std::string_view system, std::string_view name,
                            const std::vector<Field>& fields, std::string_view print_fmt = {});

  // Appends one event with |size| payload bytes. Returns false when the
  // event was dropped (no ring free, or larger than a page); never blocks.
  bool Write(uint16_t id, const void* payload, uint32_t size);

  // The format text Register() publishes (exposed for tests).
  static std::string FormatText(std::string_view name, uint32_t id, const std::vector<Field>& fields,
                                std::string_view print_fmt);

  uint32_t boot_generation() const { return generation_; }
  const RegionGeometry& geometry() const { return region_.geometry(); }
  uint32_t max_payload() const { return max_payload_; }

  struct ThreadState;  // Per-thread ring binding; private to dwtrace.cc.

 private:
  Tracer(GuestRegion region, RegionMapping mapping, Clock clock, uint32_t generation);
  bool Bind(ThreadState* ts);
  bool StartPage(ThreadState* ts, uint64_t now);
  void Release(ThreadState* ts);
  uint64_t Now() const;

  // Constant-initialized, so the hot path reads it without a TLS init
  // check; the state is created by Bind() and freed at thread exit.
  static thread_local ThreadState* tls_;

  GuestRegion region_;
  RegionMapping mapping_;
  Clock clock_;
  uint32_t generation_;
  uint32_t max_payload_;
  uint64_t serial_;
};

}  // namespace hvtrace::dw

#endif  // HVTRACE_DWTRACE_HPP_
