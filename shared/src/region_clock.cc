// TSC -> guest CLOCK_MONOTONIC from the region's clock-sync samples.
#include "hvtrace/region_clock.h"

#include <algorithm>

namespace hvtrace {
namespace {

// A TSC faster than 100 GHz or slower than 1 MHz is not a TSC.
constexpr double kMinHz = 1e6;
constexpr double kMaxHz = 1e11;

// 64 x 64-bit products of tick and nanosecond spans need 128 bits.
__extension__ typedef __int128 Int128;

}  // namespace

TscToMono::TscToMono(std::span<const region::ClockSync> samples) {
  for (const region::ClockSync& s : samples) {
    if (s.tsc == 0 || s.mono_ns == 0) {
      ++dropped_;
      continue;
    }
    if (!points_.empty()) {
      const Point& last = points_.back();
      // Both clocks must move forward, at a rate a TSC can have.
      if (s.tsc <= last.tsc || s.mono_ns <= last.mono_ns) {
        ++dropped_;
        continue;
      }
      const double hz = static_cast<double>(s.tsc - last.tsc) * 1e9 / static_cast<double>(s.mono_ns - last.mono_ns);
      if (hz < kMinHz || hz > kMaxHz) {
        ++dropped_;
        continue;
      }
    }
    points_.push_back({s.tsc, s.mono_ns});
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
  // The pair around |tsc|, or the nearest pair at either end.
  auto upper = std::upper_bound(points_.begin(), points_.end(), tsc,
                                [](uint64_t t, const Point& p) { return t < p.tsc; });
  size_t i = static_cast<size_t>(upper - points_.begin());
  i = std::clamp<size_t>(i, 1, points_.size() - 1);
  const Point& a = points_[i - 1];
  const Point& b = points_[i];
  const Int128 dt = static_cast<Int128>(tsc) - a.tsc;
  const Int128 mono = static_cast<Int128>(a.mono_ns) +
                        dt * static_cast<Int128>(b.mono_ns - a.mono_ns) / static_cast<Int128>(b.tsc - a.tsc);
  if (mono < 0 || mono > static_cast<Int128>(UINT64_MAX)) return std::nullopt;
  return static_cast<uint64_t>(mono);
}

}  // namespace hvtrace
