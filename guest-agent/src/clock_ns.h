// The guest's clocks in nanoseconds, as the agent stamps and paces with them.
#ifndef HVTRACE_AGENT_CLOCK_NS_H_
#define HVTRACE_AGENT_CLOCK_NS_H_

#include <time.h>

#include <cstdint>

namespace hvtrace::agent {

inline uint64_t ClockNs(clockid_t id) {
  timespec ts;
  clock_gettime(id, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

inline uint64_t MonotonicNs() { return ClockNs(CLOCK_MONOTONIC); }
// With the fraction: step timings the agent reports.
inline double MonotonicMs() { return static_cast<double>(MonotonicNs()) / 1e6; }

}  // namespace hvtrace::agent

#endif  // HVTRACE_AGENT_CLOCK_NS_H_
