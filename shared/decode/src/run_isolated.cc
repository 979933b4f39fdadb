#include "hvtrace/run_isolated.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace hvtrace {

std::string RunIsolated(const std::function<void()>& body, unsigned timeout_s) {
  const pid_t pid = ::fork();
  if (pid < 0) return std::string("cannot fork: ") + std::strerror(errno);
  if (pid == 0) {
    // Default actions: a crash ends the child quietly, whatever handlers the
    // parent installed (sanitizers, fuzzers) to report its own; SIGALRM ends
    // a child that loops.
    for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT, SIGALRM}) ::signal(sig, SIG_DFL);
    ::alarm(timeout_s);
    body();
    ::_exit(0);  // No atexit handlers or leak checks: they belong to the parent.
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return std::string("waitpid: ") + std::strerror(errno);
  }
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    return "killed by signal " + std::to_string(sig) + " (" + ::strsignal(sig) + ")" +
           (sig == SIGALRM ? ", timed out after " + std::to_string(timeout_s) + " s" : "");
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) != 0) {
    return "exited with status " + std::to_string(WEXITSTATUS(status));
  }
  return {};
}

}  // namespace hvtrace
