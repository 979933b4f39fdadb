#include "hvtrace/run_isolated.h"

#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace hvtrace {
namespace {

// The child: one request (4 bytes) in, one byte out once |serve| returned;
// ends when the caller closes its end.
[[noreturn]] void ServeInChild(int fd, const std::function<void(uint32_t)>& serve,
                               unsigned timeout_s) {
  // Default actions: a crash ends the child quietly, whatever handlers the
  // parent installed (sanitizers, fuzzers) to report its own; SIGALRM ends
  // a child that loops.
  for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT, SIGALRM}) ::signal(sig, SIG_DFL);
  for (;;) {
    uint32_t request = 0;
    size_t got = 0;
    while (got < sizeof(request)) {
      ssize_t n = ::recv(fd, reinterpret_cast<char*>(&request) + got, sizeof(request) - got, 0);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) ::_exit(0);  // No atexit handlers or leak checks: they belong to the parent.
      got += static_cast<size_t>(n);
    }
    ::alarm(timeout_s);
    serve(request);
    ::alarm(0);
    const char done = 1;
    while (::send(fd, &done, 1, MSG_NOSIGNAL) < 0) {
      if (errno != EINTR) ::_exit(0);
    }
  }
}

}  // namespace

IsolatedWorker::IsolatedWorker(std::function<void(uint32_t)> serve, unsigned timeout_s)
    : serve_(std::move(serve)), timeout_s_(timeout_s) {}

IsolatedWorker::~IsolatedWorker() { End(); }

std::string IsolatedWorker::Start() {
  int fds[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) {
    return std::string("cannot make a socket pair: ") + std::strerror(errno);
  }
  const pid_t pid = ::fork();
  if (pid < 0) {
    const int err = errno;
    ::close(fds[0]);
    ::close(fds[1]);
    return std::string("cannot fork: ") + std::strerror(err);
  }
  if (pid == 0) {
    ::close(fds[0]);
    ServeInChild(fds[1], serve_, timeout_s_);
  }
  ::close(fds[1]);
  pid_ = pid;
  fd_ = fds[0];
  return {};
}

std::string IsolatedWorker::Run(uint32_t request) {
  if (pid_ < 0) {
    if (std::string error = Start(); !error.empty()) return error;
  }
  ssize_t n;
  do {
    n = ::send(fd_, &request, sizeof(request), MSG_NOSIGNAL);
  } while (n < 0 && errno == EINTR);
  char done = 0;
  if (n == static_cast<ssize_t>(sizeof(request))) {
    do {
      n = ::recv(fd_, &done, 1, 0);
    } while (n < 0 && errno == EINTR);
    if (n == 1) return {};
  }
  // The child died (or the socket failed): say why, and start afresh next time.
  ::close(fd_);
  fd_ = -1;
  std::string why = Reap();
  return why.empty() ? "ended without an answer" : why;
}

void IsolatedWorker::End() {
  if (pid_ < 0) return;
  ::close(fd_);
  fd_ = -1;
  (void)Reap();
}

std::string IsolatedWorker::Reap() {
  int status = 0;
  const pid_t pid = pid_;
  pid_ = -1;
  while (::waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return std::string("waitpid: ") + std::strerror(errno);
  }
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    return "killed by signal " + std::to_string(sig) + " (" + ::strsignal(sig) + ")" +
           (sig == SIGALRM ? ", timed out after " + std::to_string(timeout_s_) + " s" : "");
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) != 0) {
    return "exited with status " + std::to_string(WEXITSTATUS(status));
  }
  return {};
}

std::string RunIsolated(const std::function<void()>& body, unsigned timeout_s) {
  IsolatedWorker worker([&](uint32_t) { body(); }, timeout_s);
  return worker.Run(0);
}

}  // namespace hvtrace
