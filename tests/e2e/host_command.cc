#include "host_command.h"

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>

namespace hvtrace::e2e {

std::string BinPath(const std::string& tool) { return std::string(HVTRACE_BIN_DIR) + "/" + tool; }

std::string ReadWhole(const std::string& path) {
  std::string all;
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return all;
  char buf[65536];
  ssize_t n;
  while ((n = read(fd, buf, sizeof buf)) > 0) all.append(buf, static_cast<size_t>(n));
  close(fd);
  return all;
}

std::string FileTail(const std::string& path, size_t max_bytes) {
  std::string all = ReadWhole(path);
  return all.size() > max_bytes ? all.substr(all.size() - max_bytes) : all;
}

RunResult RunArgvStatus(const std::vector<std::string>& argv) {
  RunResult r;
  int pipefd[2];
  if (pipe2(pipefd, O_CLOEXEC) != 0) {
    r.output = "pipe failed";
    return r;
  }
  pid_t pid = fork();
  if (pid < 0) {
    close(pipefd[0]);
    close(pipefd[1]);
    r.output = "fork failed";
    return r;
  }
  if (pid == 0) {
    dup2(pipefd[1], 1);
    dup2(pipefd[1], 2);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execvp(args[0], args.data());
    _exit(127);
  }
  close(pipefd[1]);
  char buf[4096];
  ssize_t n;
  while ((n = read(pipefd[0], buf, sizeof buf)) > 0) r.output.append(buf, static_cast<size_t>(n));
  close(pipefd[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  r.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

Result<std::string> RunArgv(const std::vector<std::string>& argv) {
  RunResult r = RunArgvStatus(argv);
  if (r.status != 0) {
    std::string cmd;
    for (const auto& a : argv) cmd += (cmd.empty() ? "" : " ") + a;
    return Error{"'" + cmd + "' failed (" +
                 (r.status < 0 ? std::string("killed by a signal")
                               : "exit status " + std::to_string(r.status)) +
                 "): " + r.output};
  }
  return std::move(r.output);
}

std::string OtherUserUnavailableReason() {
  if (::geteuid() != 0) return "needs root to run hvtraced and act as uid 65534";
  if (RunArgvStatus({"setpriv", "--version"}).status != 0) return "no setpriv";
  return "";
}

std::string Describe(const RunResult& r) {
  return "exit " + std::to_string(r.status) + ": " + r.output;
}

std::string PublicCopy(const std::string& from, const std::string& dir) {
  namespace fs = std::filesystem;
  const fs::path to = fs::path(dir) / fs::path(from).filename();
  fs::copy_file(from, to, fs::copy_options::overwrite_existing);
  fs::permissions(to, fs::perms::owner_read | fs::perms::owner_write | fs::perms::group_read |
                          fs::perms::others_read);
  return to.string();
}

}  // namespace hvtrace::e2e
