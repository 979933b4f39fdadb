// Runs code that may crash on hostile input in a forked child, so that a
// crash costs a child process instead of the caller (hvtraced serves every VM
// from one process). Used for libtraceevent's parser, which has no defence
// against hostile formats.
#ifndef HVTRACE_RUN_ISOLATED_H_
#define HVTRACE_RUN_ISOLATED_H_

#include <functional>
#include <string>

namespace hvtrace {

// Runs |body| in a child forked from this process (a copy of its memory) and
// waits for it. Returns an empty string when |body| returned, else what went
// wrong: "killed by signal N" (a crash, or |timeout_s| passed), or why no
// child could run. Nothing |body| does reaches the caller's memory.
std::string RunIsolated(const std::function<void()>& body, unsigned timeout_s);

}  // namespace hvtrace

#endif  // HVTRACE_RUN_ISOLATED_H_
