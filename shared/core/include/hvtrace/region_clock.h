// Putting direct-write time stamps on the guest's trace clock, so that
// direct-write and kernel events merge on one timeline.
//
// A direct-write ring says which clock stamped it (DwRingHeader::clock):
// CLOCK_MONOTONIC, or the raw TSC (region::kClockTsc, what hvtrace/dwtrace.hpp
// picks on CPUs with an invariant TSC). The agent writes clock-sync samples
// into the region (region::ClockSync: the same instant read as TSC, as
// CLOCK_MONOTONIC and as CLOCK_BOOTTIME) at attach and every second after.
// TSC ticks are converted piecewise linearly between consecutive samples;
// outside them the rate over all samples is extended from the nearest one.
//
// The samples come from the guest and may lie. Samples that do not lie on
// one line with most of the others (consensus_line.h: a TSC runs at one
// rate; NTP slews CLOCK_MONOTONIC by at most 500 ppm) are dropped, and so are samples that do
// not move both clocks forward. With fewer than two sound samples nothing is
// converted: such a ring cannot be placed on the trace clock, and the callers
// (region_stream, region_capture) say so and keep its events apart.
#ifndef HVTRACE_REGION_CLOCK_H_
#define HVTRACE_REGION_CLOCK_H_

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "hvtrace/region.h"

namespace hvtrace {

class TscToMono {
 public:
  // |samples| in any order. Converts to each sample's |mono_ns|.
  explicit TscToMono(std::span<const region::ClockSync> samples);

  // At least two sound samples.
  bool usable() const { return points_.size() >= 2; }
  // Guest CLOCK_MONOTONIC ns of |tsc|; nullopt when not usable() or the
  // result would not fit.
  std::optional<uint64_t> ToMonoNs(uint64_t tsc) const;
  // TSC ticks per second over all sound samples (0 when not usable()).
  double tsc_hz() const;
  // Samples dropped as inconsistent (empty, backwards, off the line).
  uint32_t dropped() const { return dropped_; }
  uint32_t used() const { return static_cast<uint32_t>(points_.size()); }

 private:
  struct Point {
    uint64_t tsc;
    uint64_t mono_ns;
  };
  std::vector<Point> points_;  // By TSC, both clocks strictly increasing.
  uint32_t dropped_ = 0;
};

// Maps the time stamps of direct-write rings onto the trace clock of the
// guest's kernel pages (GuestIdentity::trace_clock).
class RegionTimeline {
 public:
  enum class Mode : uint8_t {
    kAsIs,         // Already on the trace clock (or a clock we cannot convert).
    kConvert,      // TSC ticks, converted with the clock-sync samples.
    kUnplaceable,  // TSC ticks and no usable samples: not on the trace clock.
  };

  RegionTimeline(uint32_t trace_clock, std::span<const region::ClockSync> samples);

  Mode ModeOf(uint32_t ring_clock) const;
  // |ts| of a ring stamped with |ring_clock|, on the trace clock; nullopt
  // when the ring is kUnplaceable or the converted value does not fit.
  std::optional<uint64_t> ToTraceClock(uint32_t ring_clock, uint64_t ts) const;
  // The conversion TSC rings use (to boottime when the trace clock is
  // "boot", else to CLOCK_MONOTONIC).
  const TscToMono& tsc() const { return tsc_; }

 private:
  uint32_t trace_clock_;
  TscToMono tsc_;
};

// The kernel's name of a region::TraceClock ("mono", "x86-tsc", ...), as
// trace.dat stores it; "local" for unknown values.
const char* TraceClockName(uint32_t clock);

}  // namespace hvtrace

#endif  // HVTRACE_REGION_CLOCK_H_
