// TSC -> guest CLOCK_MONOTONIC from the region's clock-sync samples, and the
// choice of conversion per direct-write ring.
#include "hvtrace/region_clock.h"

#include <algorithm>

#include "hvtrace/consensus_line.h"

namespace hvtrace {
namespace {

// A TSC faster than 100 GHz or slower than 1 MHz is not a TSC.
constexpr double kMinHz = 1e6;
constexpr double kMaxHz = 1e11;

// How far an honest sample may sit off the line through two others: the
// guest reads its TSC and clock a few ns apart but may be preempted in
// between (2 ms), and NTP slews CLOCK_MONOTONIC by up to 500 ppm (1000 ppm of
// the distance covers it). Lies smaller than this shift events by no more.
constexpr int64_t kToleranceNs = 2'000'000;
constexpr int64_t kTolerancePpm = 1000;

// 64 x 64-bit products of tick and nanosecond spans need 128 bits.
__extension__ typedef __int128 Int128;

// m0 + dt * dm / dtt without overflow (guest values reach 2^64 each, their
// product 2^128); nullopt when it does not fit.
std::optional<Int128> Extend(uint64_t m0, Int128 dt, Int128 dm, Int128 dtt) {
  Int128 product, sum;
  if (__builtin_mul_overflow(dt, dm, &product)) return std::nullopt;
  if (__builtin_add_overflow(static_cast<Int128>(m0), product / dtt, &sum)) return std::nullopt;
  return sum;
}

// Mono ns at |tsc| on the line through (t0, m0) and (t1, m1), t1 != t0.
std::optional<Int128> OnLine(uint64_t t0, uint64_t m0, uint64_t t1, uint64_t m1, uint64_t tsc) {
  return Extend(m0, static_cast<Int128>(tsc) - t0, static_cast<Int128>(m1) - m0,
                static_cast<Int128>(t1) - t0);
}

}  // namespace

TscToMono::TscToMono(std::span<const region::ClockSync> samples) {
  std::vector<ClockPoint> all;  // The region's order, oldest first.
  for (const region::ClockSync& s : samples) {
    if (s.tsc == 0 || s.mono_ns == 0) {
      ++dropped_;
      continue;
    }
    all.push_back({s.tsc, s.mono_ns});
  }
  const std::optional<ConsensusLine> line = FindConsensusLine(
      all, {kToleranceNs, kTolerancePpm}, [](const ClockPoint& a, const ClockPoint& b) {
        const double hz = static_cast<double>(b.x - a.x) * 1e9 / static_cast<double>(b.y - a.y);
        return hz >= kMinHz && hz <= kMaxHz;
      });
  if (!line) {
    // No two samples make a TSC: all are suspect (one alone proves nothing).
    if (all.size() >= 2) dropped_ += static_cast<uint32_t>(all.size());
    return;
  }
  dropped_ += static_cast<uint32_t>(all.size() - line->members.size());
  std::vector<Point> on_line;
  for (size_t k : line->members) on_line.push_back({all[k].x, all[k].y});
  std::sort(on_line.begin(), on_line.end(), [](const Point& a, const Point& b) {
    return a.tsc != b.tsc ? a.tsc < b.tsc : a.mono_ns < b.mono_ns;
  });
  for (const Point& p : on_line) {
    // Both clocks strictly forward from the previous kept sample, so the
    // conversion keeps the order of the stamps.
    if (points_.empty() || (p.tsc > points_.back().tsc && p.mono_ns > points_.back().mono_ns)) {
      points_.push_back(p);
    } else {
      ++dropped_;
    }
  }
  if (points_.size() < 2) {
    dropped_ += static_cast<uint32_t>(points_.size());
    points_.clear();
  }
}

double TscToMono::tsc_hz() const {
  if (!usable()) return 0;
  const Point& a = points_.front();
  const Point& b = points_.back();
  return static_cast<double>(b.tsc - a.tsc) * 1e9 / static_cast<double>(b.mono_ns - a.mono_ns);
}

std::optional<uint64_t> TscToMono::ToMonoNs(uint64_t tsc) const {
  if (!usable()) return std::nullopt;
  const Point& front = points_.front();
  const Point& back = points_.back();
  std::optional<Int128> mono;
  if (tsc <= front.tsc || tsc >= back.tsc) {
    // Outside the samples: the rate over all of them, from the nearest end
    // (continuous with the inside, and the most precise rate there is).
    const Point& anchor = tsc <= front.tsc ? front : back;
    mono = Extend(anchor.mono_ns, static_cast<Int128>(tsc) - anchor.tsc,
                  static_cast<Int128>(back.mono_ns) - front.mono_ns,
                  static_cast<Int128>(back.tsc) - front.tsc);
  } else {
    auto upper = std::upper_bound(points_.begin(), points_.end(), tsc,
                                  [](uint64_t t, const Point& p) { return t < p.tsc; });
    const Point& b = *upper;
    const Point& a = *(upper - 1);
    mono = OnLine(a.tsc, a.mono_ns, b.tsc, b.mono_ns, tsc);
  }
  if (!mono || *mono < 0 || *mono > static_cast<Int128>(UINT64_MAX)) return std::nullopt;
  return static_cast<uint64_t>(*mono);
}

namespace {

// The samples with |mono_ns| replaced by the clock the trace uses.
std::vector<region::ClockSync> SamplesFor(uint32_t trace_clock,
                                          std::span<const region::ClockSync> samples) {
  std::vector<region::ClockSync> out(samples.begin(), samples.end());
  if (trace_clock == region::kClockBoot) {
    for (region::ClockSync& s : out) s.mono_ns = s.boottime_ns;
  }
  return out;
}

}  // namespace

RegionTimeline::RegionTimeline(uint32_t trace_clock, std::span<const region::ClockSync> samples)
    : trace_clock_(trace_clock), tsc_(SamplesFor(trace_clock, samples)) {}

RegionTimeline::Mode RegionTimeline::ModeOf(uint32_t ring_clock) const {
  // Only TSC rings are converted: a MONOTONIC ring is on the kernel's clock
  // when the agent set the trace clock to "mono" (its default).
  if (ring_clock != region::kClockTsc || trace_clock_ == region::kClockTsc) return Mode::kAsIs;
  return tsc_.usable() ? Mode::kConvert : Mode::kUnplaceable;
}

std::optional<uint64_t> RegionTimeline::ToTraceClock(uint32_t ring_clock, uint64_t ts) const {
  switch (ModeOf(ring_clock)) {
    case Mode::kAsIs:
      return ts;
    case Mode::kConvert:
      return tsc_.ToMonoNs(ts);
    case Mode::kUnplaceable:
      break;
  }
  return std::nullopt;
}

const char* TraceClockName(uint32_t clock) {
  switch (clock) {
    case region::kClockLocal:
      return "local";
    case region::kClockMono:
      return "mono";
    case region::kClockTsc:
      return "x86-tsc";
    case region::kClockBoot:
      return "boot";
    case region::kClockGlobal:
      return "global";
    default:
      return "local";
  }
}

}  // namespace hvtrace
