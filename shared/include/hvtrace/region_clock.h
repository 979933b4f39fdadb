// Converting direct-write time stamps taken with the TSC (DwRingHeader::clock
// == region::kClockTsc, what hvtrace/dwtrace.hpp uses by default on CPUs with
// an invariant TSC) to the guest's CLOCK_MONOTONIC, the clock of the kernel
// events the agent pumps, so both merge on one timeline.
//
// The agent writes clock-sync samples into the region (region::ClockSync:
// the same instant read as CLOCK_MONOTONIC and as TSC) at attach and every
// second after. The conversion is piecewise linear between consecutive
// samples and extends the nearest pair's rate outside them. The samples come
// from the guest: pairs that do not move both clocks forward are dropped,
// and with fewer than two sound samples nothing is converted.
#ifndef HVTRACE_REGION_CLOCK_H_
#define HVTRACE_REGION_CLOCK_H_

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "hvtrace/region.h"

namespace hvtrace {

class TscToMono {
 public:
  // |samples| oldest first (as RegionSnapshot::clock_sync holds them).
  explicit TscToMono(std::span<const region::ClockSync> samples);

  // At least two sound samples.
  bool usable() const { return points_.size() >= 2; }
  // Guest CLOCK_MONOTONIC ns of |tsc|; nullopt when not usable() or the
  // result would not fit.
  std::optional<uint64_t> ToMonoNs(uint64_t tsc) const;
  // TSC ticks per second over all samples (0 when not usable()).
  double tsc_hz() const;
  // Samples dropped as inconsistent.
  uint32_t dropped() const { return dropped_; }

 private:
  struct Point {
    uint64_t tsc;
    uint64_t mono_ns;
  };
  std::vector<Point> points_;
  uint32_t dropped_ = 0;
};

}  // namespace hvtrace

#endif  // HVTRACE_REGION_CLOCK_H_
