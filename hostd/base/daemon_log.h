// hvtraced's log: one "hvtraced: ..." line on stderr per call, which systemd's
// journal (or the test harness) collects.
#ifndef HVTRACE_HOSTD_DAEMON_LOG_H_
#define HVTRACE_HOSTD_DAEMON_LOG_H_

#include <string>

namespace hvtrace::hostd {

// Writes "hvtraced: |message|\n" with a single write(2), so lines from
// concurrent callers never interleave. Never fails (a closed stderr drops it).
void Log(const std::string& message);

}  // namespace hvtrace::hostd

#endif  // HVTRACE_HOSTD_DAEMON_LOG_H_
