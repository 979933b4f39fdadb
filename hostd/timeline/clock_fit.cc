#include "clock_fit.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>

#include "hvtrace/consensus_line.h"

namespace hvtrace::hostd {
namespace {

using nlohmann::json;

// The offset vote: anchors proposing offsets, writes checking them, and how
// far from a proposal a write's QEMU line may be (guest clock drift over a
// boot included).
constexpr size_t kMaxVoteAnchors = 64;
constexpr size_t kMaxVoteSample = 256;
constexpr int64_t kVoteWindowNs = 20'000'000;
constexpr size_t kMaxHostLinesPerAnchor = 4096;
// Lines through pairs closer than this in guest time are noise.
constexpr int64_t kMinSlopeBaseNs = 10'000'000;
// The consensus line is tried through at most this many pairs (every two of
// them; the pairs near each line are still counted over all).
constexpr size_t kMaxLineAnchors = 32;
// A pair further than this from the consensus line is an outlier: QEMU
// handles a status write 1 to 60 us after the guest's record of it under
// TCG, so an honest pair is far nearer than this to the line through two
// others; a pair of the wrong handshake is milliseconds off.
constexpr LineTolerance kOnLine{500'000, 0};

// A line in (x = guest - x0, y = host - guest - y0): y = c + d * x.
struct Line {
  double c = 0, d = 0;
  double At(double x) const { return c + d * x; }
};

struct Points {
  int64_t x0 = 0, y0 = 0;
  std::vector<double> x, y;
};

template <typename T>
T Median(std::vector<T> v) {
  if (v.empty()) return T{};
  const size_t mid = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + static_cast<ptrdiff_t>(mid), v.end());
  return v[mid];
}

Points ToPoints(std::span<const GuestStatusWrite> guest, std::span<const HostStatusSet> host,
                const std::vector<ClockPair>& pairs) {
  Points p;
  if (pairs.empty()) return p;
  p.x0 = static_cast<int64_t>(guest[pairs.front().guest].guest_ns);
  p.y0 = static_cast<int64_t>(host[pairs.front().host].host_ns) - p.x0;
  for (const ClockPair& pr : pairs) {
    const int64_t g = static_cast<int64_t>(guest[pr.guest].guest_ns);
    const int64_t h = static_cast<int64_t>(host[pr.host].host_ns);
    p.x.push_back(static_cast<double>(g - p.x0));
    p.y.push_back(static_cast<double>(h - g - p.y0));
  }
  return p;
}

// The host-minus-guest offset most guest writes agree on: every pairing of
// an anchor write with a QEMU line of the same status proposes one, and the
// proposal under which most writes find a same-status line within
// kVoteWindowNs wins (ties: the later offset, since QEMU's log starts with
// the firmware's handshakes, which the guest kernel never saw). A wrong
// pairing of one device's handshake with another's agrees only with that
// one burst, so it loses to the offset all of them agree on.
std::optional<int64_t> VoteOffset(std::span<const GuestStatusWrite> guest,
                                  const std::vector<size_t>& g_order,
                                  const std::map<uint32_t, std::vector<int64_t>>& host_times) {
  if (g_order.empty()) return std::nullopt;
  std::vector<size_t> sample;
  const size_t ns = std::min(g_order.size(), kMaxVoteSample);
  for (size_t k = 0; k < ns; ++k) sample.push_back(g_order[k * g_order.size() / ns]);
  auto agree = [&](int64_t offset) {
    size_t n = 0;
    for (size_t gi : sample) {
      auto it = host_times.find(guest[gi].status);
      if (it == host_times.end()) continue;
      const int64_t want = static_cast<int64_t>(guest[gi].guest_ns) + offset;
      auto lo = std::lower_bound(it->second.begin(), it->second.end(), want - kVoteWindowNs);
      if (lo != it->second.end() && *lo <= want + kVoteWindowNs) ++n;
    }
    return n;
  };
  std::optional<int64_t> best;
  size_t best_n = 0;
  const size_t na = std::min(g_order.size(), kMaxVoteAnchors);
  for (size_t k = 0; k < na; ++k) {
    const GuestStatusWrite& g = guest[g_order[k * g_order.size() / na]];
    auto it = host_times.find(g.status);
    if (it == host_times.end()) continue;
    for (int64_t h : it->second) {
      const int64_t offset = h - static_cast<int64_t>(g.guest_ns);
      const size_t n = agree(offset);
      if (n > best_n || (n == best_n && best && offset > *best)) {
        best_n = n;
        best = offset;
      }
    }
  }
  return best;
}

// The consensus line of the pairs (consensus_line.h: the rule the region's
// TSC conversion uses too), guest time against host time, or nothing when
// no two pairs far enough apart make a line within kMaxDrift.
std::optional<ConsensusLine> PairsLine(std::span<const GuestStatusWrite> guest,
                                       std::span<const HostStatusSet> host,
                                       const std::vector<ClockPair>& pairs) {
  std::vector<ClockPoint> points;
  for (const ClockPair& pr : pairs)
    points.push_back({guest[pr.guest].guest_ns, host[pr.host].host_ns});
  return FindConsensusLine(
      points, kOnLine,
      [](const ClockPoint& a, const ClockPoint& b) {
        if (b.x - a.x < static_cast<uint64_t>(kMinSlopeBaseNs)) return false;
        const double rate = static_cast<double>(b.y - a.y) / static_cast<double>(b.x - a.x);
        return std::fabs(rate - 1.0) <= kMaxDrift;
      },
      kMaxLineAnchors);
}

// The consensus line in |p|'s coordinates (p from the same pairs).
Line LineThrough(const Points& p, const ConsensusLine& consensus) {
  const size_t a = consensus.a, b = consensus.b;
  Line line;
  line.d = (p.y[b] - p.y[a]) / (p.x[b] - p.x[a]);
  line.c = p.y[a] - line.d * p.x[a];
  return line;
}

// Each guest write (in time order) takes the host line with its status
// closest to where |line| puts it, within |window|, after the line the
// write before it took. A device index seen with one vdev keeps it.
std::vector<ClockPair> PairNearLine(std::span<const GuestStatusWrite> guest,
                                    const std::vector<size_t>& g_order,
                                    std::span<const HostStatusSet> host,
                                    const std::vector<size_t>& h_order, const Points& p,
                                    const Line& line, int64_t window,
                                    std::map<int64_t, std::string>* vdev_of) {
  std::vector<ClockPair> pairs;
  size_t next = 0;  // First usable position in h_order.
  for (size_t gi : g_order) {
    const GuestStatusWrite& g = guest[gi];
    const double x = static_cast<double>(static_cast<int64_t>(g.guest_ns) - p.x0);
    const double predicted =
        static_cast<double>(g.guest_ns) + static_cast<double>(p.y0) + line.At(x);
    size_t best = h_order.size();
    double best_gap = static_cast<double>(window);
    const double from = predicted - static_cast<double>(window);
    const size_t start = static_cast<size_t>(
        std::partition_point(
            h_order.begin() + static_cast<ptrdiff_t>(next), h_order.end(),
            [&](size_t hi) { return static_cast<double>(host[hi].host_ns) < from; }) -
        h_order.begin());
    for (size_t k = start; k < h_order.size(); ++k) {
      const HostStatusSet& h = host[h_order[k]];
      const double gap = static_cast<double>(h.host_ns) - predicted;
      if (gap > static_cast<double>(window)) break;
      if (gap < -static_cast<double>(window) || h.status != g.status) continue;
      if (g.index >= 0 && !h.vdev.empty()) {
        auto it = vdev_of->find(g.index);
        if (it != vdev_of->end() && it->second != h.vdev) continue;
      }
      if (std::fabs(gap) < best_gap) {
        best_gap = std::fabs(gap);
        best = k;
      }
    }
    if (best == h_order.size()) continue;
    const HostStatusSet& h = host[h_order[best]];
    if (g.index >= 0 && !h.vdev.empty()) vdev_of->emplace(g.index, h.vdev);
    pairs.push_back({gi, h_order[best], 0});
    next = best + 1;
  }
  return pairs;
}

// Drops the pairs off the consensus line, and those on it that QEMU handled
// more than kOnLine after the promptest of them (the line may run through
// two late pairs, and its band reaches 2 x kOnLine above the promptest;
// the error bound is measured from there); returns how many.
size_t DropOutliers(const std::optional<ConsensusLine>& consensus, const Points& p,
                    const Line& line, std::vector<ClockPair>* pairs) {
  if (pairs->size() < 3 || !consensus) return 0;
  double promptest = std::numeric_limits<double>::infinity();
  for (size_t k : consensus->members) promptest = std::min(promptest, p.y[k] - line.At(p.x[k]));
  std::vector<ClockPair> kept;
  for (size_t k : consensus->members) {
    if (p.y[k] - line.At(p.x[k]) - promptest <= static_cast<double>(kOnLine.ns)) {
      kept.push_back((*pairs)[k]);
    }
  }
  const size_t dropped = pairs->size() - kept.size();
  *pairs = std::move(kept);
  return dropped;
}

// The line below every point that is highest at the points' mean x: an
// edge of their lower convex hull (x sorted ascending).
std::optional<Line> LowerEnvelope(const Points& p) {
  std::vector<size_t> hull;
  auto cross = [&](size_t o, size_t a, size_t b) {
    return (p.x[a] - p.x[o]) * (p.y[b] - p.y[o]) - (p.y[a] - p.y[o]) * (p.x[b] - p.x[o]);
  };
  for (size_t k = 0; k < p.x.size(); ++k) {
    if (!hull.empty() && p.x[hull.back()] == p.x[k]) {
      if (p.y[k] < p.y[hull.back()])
        hull.pop_back();  // Same x: keep the lower.
      else
        continue;
    }
    while (hull.size() >= 2 && cross(hull[hull.size() - 2], hull.back(), k) <= 0) hull.pop_back();
    hull.push_back(k);
  }
  if (hull.size() < 2) return std::nullopt;
  const double mean =
      std::accumulate(p.x.begin(), p.x.end(), 0.0) / static_cast<double>(p.x.size());
  size_t e = 0;
  while (e + 2 < hull.size() && p.x[hull[e + 1]] < mean) ++e;
  const size_t a = hull[e], b = hull[e + 1];
  Line line;
  line.d = (p.y[b] - p.y[a]) / (p.x[b] - p.x[a]);
  line.c = p.y[a] - line.d * p.x[a];
  if (std::fabs(line.d) > kMaxDrift) return std::nullopt;
  return line;
}

// Sets |fit|'s offset and drift from |line| over |p|, makes every pair's
// residual at least 1 ns (the guest's write comes first) and fills the
// residual figures.
void Finish(std::span<const GuestStatusWrite> guest, std::span<const HostStatusSet> host,
            const Points& p, const Line& line, ClockFit* fit) {
  fit->drift = line.d;
  fit->offset_ns =
      p.y0 + static_cast<int64_t>(std::llround(line.c - line.d * static_cast<double>(p.x0)));
  fit->aligned = true;
  int64_t min_r = std::numeric_limits<int64_t>::max();
  for (ClockPair& pr : fit->pairs) {
    const std::optional<uint64_t> mapped = fit->ToHost(guest[pr.guest].guest_ns);
    pr.residual_ns = mapped ? static_cast<int64_t>(host[pr.host].host_ns - *mapped) : 0;
    min_r = std::min(min_r, pr.residual_ns);
  }
  fit->offset_ns += min_r - 1;
  std::vector<uint64_t> r;
  for (ClockPair& pr : fit->pairs) {
    pr.residual_ns -= min_r - 1;
    r.push_back(static_cast<uint64_t>(pr.residual_ns));
  }
  fit->error_bound_ns = r.empty() ? 0 : *std::max_element(r.begin(), r.end());
  fit->median_residual_ns = Median(r);
}

// Times past this (year 2116 on the realtime clock, 146 years of guest
// uptime) are not trusted: all arithmetic below stays in int64.
constexpr uint64_t kMaxTimeNs = uint64_t{1} << 62;

std::vector<size_t> TimeOrder(size_t n, size_t cap, const auto& time_of) {
  std::vector<size_t> order;
  for (size_t i = 0; i < n; ++i) {
    if (time_of(i) <= kMaxTimeNs) order.push_back(i);
  }
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return time_of(a) < time_of(b); });
  if (order.size() > cap) order.resize(cap);
  return order;
}

void Fit(std::span<const GuestStatusWrite> guest, std::span<const HostStatusSet> host,
         ClockFit* fit) {
  const Points p = ToPoints(guest, host, fit->pairs);
  fit->span_ns = static_cast<uint64_t>(p.x.empty() ? 0 : p.x.back() - p.x.front());
  std::optional<Line> line;
  if (fit->pairs.size() < kMinDriftPairs) {
    fit->thin = true;
    fit->why = std::to_string(fit->pairs.size()) + " handshake pair(s), fewer than " +
               std::to_string(kMinDriftPairs) + ": offset only, drift not fitted";
  } else if (fit->span_ns < kMinDriftSpanNs) {
    fit->thin = true;
    fit->why = "the pairs span " + std::to_string(fit->span_ns / 1'000'000) +
               " ms of guest time, less than " + std::to_string(kMinDriftSpanNs / 1'000'000) +
               " ms: offset only, drift not fitted";
  } else {
    line = LowerEnvelope(p);
    if (!line) {
      fit->thin = true;
      fit->why = "the pairs give no drift within 5%: offset only";
    }
  }
  if (line) {
    fit->method = "lower envelope of virtio status handshakes: offset and drift";
  } else {
    line = Line{*std::min_element(p.y.begin(), p.y.end()), 0.0};
    fit->method = "lower envelope of virtio status handshakes: offset only";
  }
  Finish(guest, host, p, *line, fit);
  if (!fit->thin && fit->pairs.size() * 2 < fit->guest_writes - fit->resets_ignored) {
    fit->thin = true;
    fit->why = "only " + std::to_string(fit->pairs.size()) + " of " +
               std::to_string(fit->guest_writes - fit->resets_ignored) +
               " guest status writes found QEMU's handling";
  }
}

}  // namespace

std::optional<uint64_t> ClockFit::ToHost(uint64_t guest_ns) const {
  if (!aligned || guest_ns > kMaxTimeNs) return std::nullopt;
  const int64_t extra = static_cast<int64_t>(std::llround(drift * static_cast<double>(guest_ns)));
  int64_t v = 0;
  if (__builtin_add_overflow(offset_ns, static_cast<int64_t>(guest_ns), &v) ||
      __builtin_add_overflow(v, extra, &v) || v < 0) {
    return std::nullopt;
  }
  return static_cast<uint64_t>(v);
}

json ClockFit::ToJson() const {
  json j = {{"clock", "host CLOCK_REALTIME"},
            {"aligned", aligned},
            {"method", method},
            {"pairs", pairs.size()},
            {"guest_writes", guest_writes},
            {"host_status_lines", host_lines},
            {"unpaired_guest", unpaired_guest},
            {"unpaired_host", unpaired_host},
            {"outliers", outliers},
            {"resets_ignored", resets_ignored},
            {"thin", thin},
            {"why", why}};
  if (aligned) {
    j["offset_ns"] = offset_ns;
    j["drift_ppm"] = drift_ppm();
    j["error_bound_ns"] = error_bound_ns;
    j["median_residual_ns"] = median_residual_ns;
    j["span_ns"] = span_ns;
    j["mapping"] = "host_ns = offset_ns + guest_ns * (1 + drift_ppm / 1e6)";
  }
  return j;
}

ClockFit FitGuestToHost(std::span<const GuestStatusWrite> guest,
                        std::span<const HostStatusSet> host) {
  ClockFit fit;
  fit.guest_writes = guest.size();
  fit.host_lines = host.size();
  fit.method = "none";
  // Resets (status 0) are not evidence: QEMU logs virtio_set_status for
  // one after resetting the device (queues, backends), measured 0.3 to
  // 3.4 ms after the guest's write under TCG against 1 to 60 µs for the
  // other values.
  auto g_order =
      TimeOrder(guest.size(), kMaxFitGuestWrites * 4, [&](size_t i) { return guest[i].guest_ns; });
  std::erase_if(g_order, [&](size_t i) {
    if (guest[i].status != 0) return false;
    ++fit.resets_ignored;
    return true;
  });
  const bool truncated = g_order.size() > kMaxFitGuestWrites || host.size() > kMaxFitHostLines;
  if (g_order.size() > kMaxFitGuestWrites) g_order.resize(kMaxFitGuestWrites);
  const auto h_order =
      TimeOrder(host.size(), kMaxFitHostLines, [&](size_t i) { return host[i].host_ns; });
  auto unpaired = [&] {
    fit.unpaired_guest = guest.size() - fit.resets_ignored - fit.pairs.size();
    fit.unpaired_host = host.size() - fit.pairs.size();
  };
  std::map<uint32_t, std::vector<int64_t>> host_times;
  for (size_t hi : h_order) {
    auto& v = host_times[host[hi].status];
    if (v.size() < kMaxHostLinesPerAnchor) v.push_back(static_cast<int64_t>(host[hi].host_ns));
  }
  const std::optional<int64_t> offset = VoteOffset(guest, g_order, host_times);
  if (!offset) {
    fit.thin = true;
    fit.why = g_order.empty() ? "the guest recorded no virtio status write (other than resets)"
              : host.empty()  ? "QEMU logged no virtio_set_status"
                              : "no guest status write has a QEMU line with the same value";
    unpaired();
    return fit;
  }
  // Pairs near the voted offset, the robust line through them, and the
  // pairs near that line (twice: a drifting clock leaves the offset's
  // window on a long boot).
  std::map<int64_t, std::string> vdev_of;
  Points p;
  p.x0 = static_cast<int64_t>(guest[g_order.front()].guest_ns);
  p.y0 = *offset;
  Line line{0.0, 0.0};
  std::optional<ConsensusLine> consensus;  // Of fit.pairs, in p.
  for (int round = 0; round < 3; ++round) {
    vdev_of.clear();
    consensus.reset();
    fit.pairs = PairNearLine(guest, g_order, host, h_order, p, line,
                             round == 0 ? kVoteWindowNs : kPairWindowNs, &vdev_of);
    if (fit.pairs.empty()) break;
    p = ToPoints(guest, host, fit.pairs);
    // No line: offset only, at the median pair.
    consensus = PairsLine(guest, host, fit.pairs);
    line = consensus ? LineThrough(p, *consensus) : Line{Median(p.y), 0.0};
  }
  // The last round's line, not a second search over the same pairs.
  fit.outliers = DropOutliers(consensus, p, line, &fit.pairs);
  unpaired();
  if (fit.pairs.empty()) {
    fit.thin = true;
    fit.why = "the aligned handshakes do not lie on one line: nothing is put on the host clock";
    return fit;
  }
  Fit(guest, host, &fit);
  if (truncated) {
    fit.why += std::string(fit.why.empty() ? "" : "; ") + "only the first " +
               std::to_string(g_order.size()) + " guest writes and " +
               std::to_string(h_order.size()) + " QEMU lines were used";
  }
  return fit;
}

}  // namespace hvtrace::hostd
