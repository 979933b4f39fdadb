#include "host_time.h"

#include <cstdio>
#include <ctime>

namespace hvtrace::hostd {

HostTime HostTime::Now() {
  struct timespec rt, mono;
  clock_gettime(CLOCK_REALTIME, &rt);
  clock_gettime(CLOCK_MONOTONIC, &mono);
  return HostTime{rt.tv_sec * 1000000000LL + rt.tv_nsec, mono.tv_sec * 1000000000LL + mono.tv_nsec};
}

std::string UtcStamp(int64_t realtime_ns) {
  time_t secs = static_cast<time_t>(realtime_ns / 1000000000LL);
  int millis = static_cast<int>((realtime_ns % 1000000000LL) / 1000000LL);
  if (millis < 0) millis = 0;
  struct tm tm;
  gmtime_r(&secs, &tm);
  char buf[48];
  size_t n = strftime(buf, sizeof buf, "%Y%m%dT%H%M%S", &tm);
  snprintf(buf + n, sizeof buf - n, ".%03dZ", millis);
  return buf;
}

double MsSince(const HostTime& since) {
  return static_cast<double>(HostTime::Now().monotonic_ns - since.monotonic_ns) / 1e6;
}

double MsBetween(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

}  // namespace hvtrace::hostd
