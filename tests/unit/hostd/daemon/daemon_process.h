// The real hvtraced binary on a temporary state dir and socket, for the
// daemon's unit tests (daemon_test.cc, daemon_roles_test.cc): started,
// called the way clients (and hostile clients) call it, killed at the end.
#ifndef HVTRACE_TESTS_UNIT_HOSTD_DAEMON_DAEMON_PROCESS_H_
#define HVTRACE_TESTS_UNIT_HOSTD_DAEMON_DAEMON_PROCESS_H_

#include <fcntl.h>
#include <grp.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "capture_store.h"
#include "control_client.h"
#include "control_protocol.h"

namespace hvtrace::hostd::testing_daemon {

namespace fs = std::filesystem;
using nlohmann::json;
using namespace std::chrono_literals;

const fs::path kBinDir = HVTRACE_BIN_DIR;

inline std::string ReadFile(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

class DaemonProcess {
 public:
  DaemonProcess() {
    std::string tmpl = (fs::temp_directory_path() / "hvtraced-test-XXXXXX").string();
    dir_ = ::mkdtemp(tmpl.data());
    socket_ = dir_ / "run/hvtraced.sock";
    state_ = dir_ / "state";
  }
  ~DaemonProcess() {
    Kill();
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  // Starts hvtraced and waits until it answers; |extra| are more flags.
  void Start(std::vector<std::string> extra = {}) {
    std::vector<std::string> args = {(kBinDir / "hvtraced").string(),
                                     "--config",
                                     WriteConfig().string(),
                                     "--state-dir",
                                     state_.string(),
                                     "--socket",
                                     socket_.string()};
    args.insert(args.end(), extra.begin(), extra.end());
    pid_ = Spawn(args, dir_ / "daemon.log");
    auto deadline = std::chrono::steady_clock::now() + 10s;
    while (std::chrono::steady_clock::now() < deadline) {
      auto c = ControlClient::Connect(socket_, 1s);
      if (c.ok()) {
        auto r = c->Call("ping", json::object(), 5s);
        if (r.ok() && r->ok) return;
      }
      int status;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        FAIL() << "hvtraced exited during start: " << Log();
      }
      std::this_thread::sleep_for(20ms);
    }
    FAIL() << "hvtraced did not answer within 10 s: " << Log();
  }

  // Runs a program to completion, capturing output; returns the exit status.
  static int Run(const std::vector<std::string>& args, std::string* output,
                 const fs::path& out_file) {
    pid_t pid = Spawn(args, out_file);
    int status = 0;
    ::waitpid(pid, &status, 0);
    if (output) *output = ReadFile(out_file);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }

  // Sends |signo| and waits up to |timeout| for exit; returns the exit status
  // or -1 on timeout.
  int Signal(int signo, std::chrono::milliseconds timeout) {
    if (pid_ < 0) return -1;
    ::kill(pid_, signo);
    auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      int status;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
      std::this_thread::sleep_for(10ms);
    }
    return -1;
  }

  // Waits for the daemon to exit by itself.
  int WaitExit(std::chrono::milliseconds timeout) { return Signal(0, timeout); }

  bool Alive() const { return pid_ > 0 && ::kill(pid_, 0) == 0; }

  ControlClient Client() {
    auto c = ControlClient::Connect(socket_, 2s);
    EXPECT_TRUE(c.ok()) << c.error().message;
    return std::move(*c);
  }

  std::string Log() const { return ReadFile(dir_ / "daemon.log"); }

  const fs::path& dir() const { return dir_; }
  const fs::path& socket() const { return socket_; }
  const fs::path& state() const { return state_; }
  std::string config_text = "socket_group =\n";

 private:
  fs::path WriteConfig() {
    fs::path p = dir_ / "hvtraced.conf";
    std::ofstream(p) << config_text;
    return p;
  }

  static pid_t Spawn(const std::vector<std::string>& args, const fs::path& log) {
    pid_t pid = ::fork();
    if (pid == 0) {
      int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      ::dup2(fd, 1);
      ::dup2(fd, 2);
      std::vector<char*> argv;
      for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      ::execv(argv[0], argv.data());
      _exit(127);
    }
    return pid;
  }

  void Kill() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
      pid_ = -1;
    }
  }

  fs::path dir_, socket_, state_;
  pid_t pid_ = -1;
};

inline Reply Call(ControlClient& c, std::string_view cmd, const json& args = json::object()) {
  auto r = c.Call(cmd, args, 5s);
  EXPECT_TRUE(r.ok()) << r.error().message;
  return r.ok() ? *r : Reply{};
}

inline void ExpectPing(DaemonProcess& d) {
  auto c = d.Client();
  Reply r = Call(c, "ping");
  EXPECT_TRUE(r.ok) << r.error;
  EXPECT_EQ(r.result["pong"], true);
}

// Runs |body| in a child process with uid/gid 65534 and the supplementary
// groups |groups| (numeric gids: no /etc/group entry is needed, the daemon
// reads SO_PEERGROUPS); returns what |body| returned.
inline std::string AsNobody(const std::vector<gid_t>& groups,
                            const std::function<std::string()>& body) {
  int pipefd[2];
  if (::pipe(pipefd) != 0) return "pipe failed";
  pid_t pid = ::fork();
  if (pid == 0) {
    ::close(pipefd[0]);
    if (::setgroups(groups.size(), groups.data()) != 0 || ::setgid(65534) != 0 ||
        ::setuid(65534) != 0) {
      _exit(10);
    }
    std::string report = body();
    ssize_t ignored = ::write(pipefd[1], report.data(), report.size());
    (void)ignored;
    _exit(0);
  }
  ::close(pipefd[1]);
  std::string report;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(pipefd[0], buf, sizeof buf)) > 0) report.append(buf, static_cast<size_t>(n));
  ::close(pipefd[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) return "child setup failed";
  return report;
}

}  // namespace hvtrace::hostd::testing_daemon

#endif  // HVTRACE_TESTS_UNIT_HOSTD_DAEMON_DAEMON_PROCESS_H_
