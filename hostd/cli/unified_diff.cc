// The diff comes from diffutils' `diff -u` (Essential on Debian), run
// without a shell on two private temporary files: the plumbing is the real
// tool, and the domain name in the labels never meets a shell.
#include "unified_diff.h"

#include <fcntl.h>
#include <spawn.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <vector>

extern char** environ;

namespace hvtrace::cli {
namespace {

// Reads all of |fd| (closing it).
std::string Drain(int fd) {
  std::string out;
  char buf[8192];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n > 0) {
      out.append(buf, static_cast<size_t>(n));
    } else if (n == 0 || errno != EINTR) {
      break;
    }
  }
  ::close(fd);
  return out;
}

Result<std::string> RunDiff(const std::vector<std::string>& argv) {
  int pipe_fds[2];
  if (::pipe2(pipe_fds, O_CLOEXEC) != 0) return Error{std::string("pipe: ") + std::strerror(errno)};
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, pipe_fds[1], STDOUT_FILENO);
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = -1;
  const int rc = ::posix_spawnp(&pid, "diff", &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  ::close(pipe_fds[1]);
  if (rc != 0) {
    ::close(pipe_fds[0]);
    return Error{std::string("cannot run diff (diffutils): ") + std::strerror(rc)};
  }
  std::string out = Drain(pipe_fds[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  // diff exits 0 (same), 1 (different), 2 (trouble).
  if (!WIFEXITED(status) || WEXITSTATUS(status) > 1) return Error{"diff failed"};
  return out;
}

}  // namespace

Result<std::string> UnifiedDiff(std::string_view old_text, std::string_view new_text,
                                std::string_view old_name, std::string_view new_name) {
  char tmpl[] = "/tmp/hvtrace-diff-XXXXXX";
  if (::mkdtemp(tmpl) == nullptr) return Error{std::string("mkdtemp: ") + std::strerror(errno)};
  const std::filesystem::path dir(tmpl);
  std::ofstream(dir / "old", std::ios::binary) << old_text;
  std::ofstream(dir / "new", std::ios::binary) << new_text;
  Result<std::string> out =
      RunDiff({"diff", "-u", "--label", std::string(old_name), "--label", std::string(new_name),
               (dir / "old").string(), (dir / "new").string()});
  std::error_code ignored;
  std::filesystem::remove_all(dir, ignored);
  return out;
}

}  // namespace hvtrace::cli
