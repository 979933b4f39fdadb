// The one robust line hvtrace fits between two clocks: the line through two
// of the points that the most points lie near.
//
// Both clock fits use it: a direct-write ring's TSC against the guest's
// CLOCK_MONOTONIC (region_clock.h, from the agent's clock-sync samples) and
// the guest's trace clock against the host's CLOCK_REALTIME (hostd's boot
// timeline, from virtio status handshakes). In both, the points come from a
// guest that may lie, so the rule is a vote, not a least-squares or median
// estimate that a minority of lies still moves: a line is only as good as
// the set of points on it, the largest set wins, between equal sets the one
// with the earliest points (nothing tells an honest set from a liar's then,
// and the first written came before any lie could be planned against it),
// and between lines of the same set the longest one (its rate is the most
// precise). Exact: 128-bit integer arithmetic, values up to 2^64 each.
#ifndef HVTRACE_CONSENSUS_LINE_H_
#define HVTRACE_CONSENSUS_LINE_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <vector>

namespace hvtrace {

// One instant read on two clocks: |x| on the clock being mapped, |y| on the
// clock it is mapped to.
struct ClockPoint {
  uint64_t x = 0;
  uint64_t y = 0;
};

// How far off the line a point may sit and still be on it: |ns| plus |ppm|
// of its y distance from the line's first point (a clock slewed by NTP).
struct LineTolerance {
  int64_t ns = 0;
  int64_t ppm = 0;
};

struct ConsensusLine {
  size_t a = 0, b = 0;          // The two points through which it runs; x[a] < x[b].
  std::vector<size_t> members;  // The points near it, ascending (a and b among them).
};

// Whether |p| lies within |tol| of the line through |a| and |b| (a.x != b.x).
bool NearLine(const ClockPoint& a, const ClockPoint& b, const ClockPoint& p, LineTolerance tol);

// The consensus line of |points|, whose index order is their age (oldest
// first). Lines through two points with a.x < b.x, a.y < b.y and
// |admissible|(a, b) are candidates; with |max_anchors| > 0 only that many
// points, evenly spread, are tried as a and b (the sets are still counted
// over every point). Nothing when no candidate has two members.
std::optional<ConsensusLine> FindConsensusLine(
    std::span<const ClockPoint> points, LineTolerance tol,
    const std::function<bool(const ClockPoint& a, const ClockPoint& b)>& admissible,
    size_t max_anchors = 0);

}  // namespace hvtrace

#endif  // HVTRACE_CONSENSUS_LINE_H_
