// Putting a guest's trace clock on the host's CLOCK_REALTIME from the
// virtio status handshakes both sides saw.
//
// The guest's boot instance stamps with its "local" clock (sched_clock: ns
// since the guest booted); QEMU's log backend stamps with the host's
// CLOCK_REALTIME (µs). A guest's write of a virtio device status traps
// synchronously into QEMU, so the guest's record of the write (a kprobe on
// the status write) and QEMU's virtio_set_status for it are microseconds
// apart, in the same order, and the guest's comes first. That is the
// evidence:
//
//   1. Pairing: the guest's writes and QEMU's virtio_set_status lines are
//      aligned in order (same status values in the same order, extra or
//      missing lines on either side tolerated: QEMU also logs the firmware's
//      handshakes and the resets the guest writes by another path), a
//      device index and QEMU's vdev must agree wherever both are known.
//      Resets (status 0) are left out: QEMU logs them only after resetting
//      the device, milliseconds after the guest's write.
//      Which host line goes with which write is decided by time, not by
//      value alone (every device's handshake writes the same 1, 3, 11, 15):
//      the offset most writes agree on (a vote) places each write, and it
//      takes the nearest QEMU line with its value.
//   2. The consensus line through the pairs (hvtrace/consensus_line.h, the
//      one robust line rule, which the region's TSC conversion uses too),
//      the writes paired again near it, and the pairs off it dropped as
//      outliers.
//   3. The final line host = offset + guest + drift * guest is the lower
//      envelope of the pairs: every paired guest write maps before QEMU's
//      handling of it, and the largest gap left is the alignment error
//      bound (how much later than the mapped time a guest event may really
//      have happened on the host clock).
//
// With fewer than kMinDriftPairs pairs, or pairs spanning less than
// kMinDriftSpanNs, the drift is not fitted (offset only) and the result
// says so (thin); with no pair nothing is aligned. Both inputs are hostile
// (the guest's records, and QEMU's log of guest-driven emulation): counts
// are capped, nothing here trusts an order or a value it did not check.
#ifndef HVTRACE_HOSTD_CAPTURE_CLOCK_FIT_H_
#define HVTRACE_HOSTD_CAPTURE_CLOCK_FIT_H_

#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace hvtrace::hostd {

// The guest's record of one status write (guest trace clock, ns).
struct GuestStatusWrite {
  uint64_t guest_ns = 0;
  uint32_t status = 0;
  int64_t index = -1;  // The virtio device's index when the probe records it; -1 unknown.
};

// QEMU's virtio_set_status (host CLOCK_REALTIME, ns).
struct HostStatusSet {
  uint64_t host_ns = 0;
  uint32_t status = 0;
  std::string vdev;  // QEMU's device pointer as logged; empty when absent.
};

struct ClockPair {
  size_t guest = 0;         // Index into the guest writes as passed.
  size_t host = 0;          // Index into the host lines as passed.
  int64_t residual_ns = 0;  // host time - mapped guest time (> 0 for inliers).
};

inline constexpr size_t kMinDriftPairs = 3;
inline constexpr uint64_t kMinDriftSpanNs = 1'000'000'000;  // 1 s of guest time.
// Caps on what one fit looks at (a boot has tens of handshakes).
inline constexpr size_t kMaxFitGuestWrites = 4096;
inline constexpr size_t kMaxFitHostLines = 16384;
// How far from the robust line a pair may be and still be re-paired.
inline constexpr int64_t kPairWindowNs = 5'000'000;
// |drift| above this is not a clock (a 5% wrong guest TSC calibration
// would be): the fit falls back to offset only.
inline constexpr double kMaxDrift = 0.05;

struct ClockFit {
  bool aligned = false;   // A mapping exists (at least one pair).
  int64_t offset_ns = 0;  // host ns at guest time 0.
  double drift = 0;       // host = offset + guest * (1 + drift).
  std::vector<ClockPair> pairs;
  size_t guest_writes = 0, host_lines = 0;
  size_t unpaired_guest = 0, unpaired_host = 0;
  size_t outliers = 0;          // Pairs the robust line could not explain (dropped).
  size_t resets_ignored = 0;    // Guest writes of 0 (resets): not used, see clock_fit.cc.
  uint64_t error_bound_ns = 0;  // Largest residual of a kept pair.
  uint64_t median_residual_ns = 0;
  uint64_t span_ns = 0;  // Guest time between the first and last pair.
  std::string method;    // "lower envelope, offset and drift" / "... offset only" / "none".
  bool thin = false;
  std::string why;  // Why thin / not aligned; empty otherwise.

  double drift_ppm() const { return drift * 1e6; }
  // |guest_ns| on the host clock; nullopt when not aligned or out of range.
  std::optional<uint64_t> ToHost(uint64_t guest_ns) const;
  // extra.timeline's fit members.
  nlohmann::json ToJson() const;
};

// Pairs |guest| with |host| and fits the line (see above). Neither list
// needs to be sorted.
ClockFit FitGuestToHost(std::span<const GuestStatusWrite> guest,
                        std::span<const HostStatusSet> host);

}  // namespace hvtrace::hostd

#endif  // HVTRACE_HOSTD_CAPTURE_CLOCK_FIT_H_
