// Host timestamps on two clocks: realtime for people and file names,
// monotonic to line up events and measure durations.
#ifndef HVTRACE_HOSTD_HOST_TIME_H_
#define HVTRACE_HOSTD_HOST_TIME_H_

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

}  // namespace hvtrace::hostd

#endif  // HVTRACE_HOSTD_HOST_TIME_H_
