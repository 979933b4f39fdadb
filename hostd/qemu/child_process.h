// Starting a short-lived helper process (a probe QEMU) from a threaded
// process, and reading what it prints within a deadline. Used by the KVM
// probe (kvm_probe.h) and the capability probe (qemu_caps.h); QEMUs that run
// guests start in vm_process.h, which owns their whole lifetime.
#ifndef HVTRACE_HOSTD_CHILD_PROCESS_H_
#define HVTRACE_HOSTD_CHILD_PROCESS_H_

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <string>
#include <vector>

namespace hvtrace::hostd {

// fork + exec of |args| (args[0] looked up in PATH) with stdin, stdout and
// stderr on the given descriptors and every other descriptor closed on exec;
// the child dies with this process (PR_SET_PDEATHSIG). Returns the pid, or
// -1 with errno when fork failed; a failed exec exits the child with 127.
pid_t SpawnChild(const std::vector<std::string>& args, int stdin_fd, int stdout_fd, int stderr_fd);

struct ChildOutput {
  std::string out;  // stdout and stderr as they came, at most the cap.
  bool truncated = false;
  bool timed_out = false;  // Killed at the deadline.
  int wait_status = 0;     // waitpid's status when it ended by itself.
  bool spawned = false;    // false: fork or pipe failed (|error| says why).
  std::string error;
};

// Runs |args| with stdin on /dev/null, collecting stdout+stderr up to
// |max_bytes| (the rest is drained and dropped); a child still running at
// |deadline| is killed with SIGKILL. Always reaps it.
ChildOutput RunChildCapture(const std::vector<std::string>& args, size_t max_bytes,
                            std::chrono::milliseconds deadline);

}  // namespace hvtrace::hostd

#endif  // HVTRACE_HOSTD_CHILD_PROCESS_H_
