// Runs code that may crash on hostile input in a forked child, so that a
// crash costs a child process instead of the caller (hvtraced serves every VM
// from one process). Used for libtraceevent's parser, which has no defence
// against hostile formats.
#ifndef HVTRACE_RUN_ISOLATED_H_
#define HVTRACE_RUN_ISOLATED_H_

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <string>

namespace hvtrace {

// A child forked from this process (a copy of its memory) that runs
// |serve(request)| for each Run(request), one at a time. The child is forked
// on the first Run and kept until End(), so a caller with many requests pays
// for one fork (copying a big process's page tables, then its copy-on-write
// faults) instead of one per request; the child keeps what earlier requests
// did to its memory. After a crash or a timeout the next Run forks a new
// child from the caller's memory as it is then. Nothing |serve| does
// reaches the caller's memory.
class IsolatedWorker {
 public:
  IsolatedWorker(std::function<void(uint32_t request)> serve, unsigned timeout_s);
  ~IsolatedWorker();  // End().
  IsolatedWorker(const IsolatedWorker&) = delete;
  IsolatedWorker& operator=(const IsolatedWorker&) = delete;

  // Returns an empty string when |serve(request)| returned in the child, else
  // what went wrong: "killed by signal N" (a crash, or |timeout_s| passed),
  // "exited with status N", or why no child could run.
  std::string Run(uint32_t request);
  // Ends the child (if any) and waits for it.
  void End();

 private:
  std::string Start();
  std::string Reap();  // Waits for the child; what ended it ("" for a clean exit).

  std::function<void(uint32_t)> serve_;
  unsigned timeout_s_;
  pid_t pid_ = -1;
  int fd_ = -1;  // Our end of the socket pair.
};

// Runs |body| once in a child of its own (an IsolatedWorker with one request).
std::string RunIsolated(const std::function<void()>& body, unsigned timeout_s);

}  // namespace hvtrace

#endif  // HVTRACE_RUN_ISOLATED_H_
