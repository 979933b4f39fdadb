#include "hvtrace/consensus_line.h"

#include <algorithm>

namespace hvtrace {
namespace {

// Products of two 64-bit spans need 128 bits.
__extension__ typedef __int128 Int128;

Int128 Abs(Int128 v) { return v < 0 ? -v : v; }

}  // namespace

bool NearLine(const ClockPoint& a, const ClockPoint& b, const ClockPoint& p, LineTolerance tol) {
  // |p.y - line(p.x)| <= tol, multiplied through by b.x - a.x (> 0) so no
  // division rounds: |(p.y - a.y)(b.x - a.x) - (p.x - a.x)(b.y - a.y)|.
  const Int128 dx = static_cast<Int128>(b.x) - a.x;
  const Int128 dy = static_cast<Int128>(b.y) - a.y;
  if (dx <= 0) return false;
  const Int128 py = static_cast<Int128>(p.y) - a.y;
  const Int128 px = static_cast<Int128>(p.x) - a.x;
  Int128 lhs, rhs, off, allowed;
  if (__builtin_mul_overflow(py, dx, &lhs) || __builtin_mul_overflow(px, dy, &rhs) ||
      __builtin_sub_overflow(lhs, rhs, &off)) {
    return false;  // Not near anything a clock could produce.
  }
  const Int128 within = tol.ns + Abs(py) * tol.ppm / 1'000'000;
  if (__builtin_mul_overflow(within, dx, &allowed)) return true;
  return Abs(off) <= allowed;
}

std::optional<ConsensusLine> FindConsensusLine(
    std::span<const ClockPoint> points, LineTolerance tol,
    const std::function<bool(const ClockPoint& a, const ClockPoint& b)>& admissible,
    size_t max_anchors) {
  std::vector<size_t> anchors(points.size());
  for (size_t k = 0; k < anchors.size(); ++k) anchors[k] = k;
  if (max_anchors > 0 && anchors.size() > max_anchors) {
    for (size_t k = 0; k < max_anchors; ++k) anchors[k] = k * points.size() / max_anchors;
    anchors.resize(max_anchors);
  }
  std::optional<ConsensusLine> best;
  uint64_t best_span = 0;
  std::vector<size_t> set;
  for (size_t i = 0; i < anchors.size(); ++i) {
    for (size_t j = i + 1; j < anchors.size(); ++j) {
      size_t ia = anchors[i], ib = anchors[j];
      if (points[ib].x < points[ia].x) std::swap(ia, ib);
      const ClockPoint& a = points[ia];
      const ClockPoint& b = points[ib];
      if (b.x <= a.x || b.y <= a.y || !admissible(a, b)) continue;
      set.clear();
      for (size_t k = 0; k < points.size(); ++k) {
        if (NearLine(a, b, points[k], tol)) set.push_back(k);
      }
      const uint64_t span = b.x - a.x;
      const bool better = !best                                ? set.size() >= 2
                          : set.size() != best->members.size() ? set.size() > best->members.size()
                          : set != best->members               ? set < best->members
                                                               : span > best_span;
      if (better) {
        best = ConsensusLine{ia, ib, set};
        best_span = span;
      }
    }
  }
  return best;
}

}  // namespace hvtrace
