// Host timestamps on two clocks: realtime for people and file names,
// monotonic to line up events and measure durations.
#ifndef HVTRACE_HOSTD_HOST_TIME_H_
#define HVTRACE_HOSTD_HOST_TIME_H_

#include <chrono>
#include <cstdint>
#include <string>

namespace hvtrace::hostd {

struct HostTime {
  int64_t realtime_ns = 0;
  int64_t monotonic_ns = 0;
  static HostTime Now();
};

// "20250612T101530.123Z"
std::string UtcStamp(int64_t realtime_ns);

// Milliseconds on the monotonic clock from |since| to now.
double MsSince(const HostTime& since);

// Milliseconds from |a| to |b| on the steady clock.
double MsBetween(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b);

}  // namespace hvtrace::hostd

#endif  // HVTRACE_HOSTD_HOST_TIME_H_
