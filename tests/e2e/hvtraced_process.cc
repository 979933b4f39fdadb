#include "hvtraced_process.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "control_client.h"
#include "qmp_vm.h"
#include "test_support.h"
#include "vm_process.h"

namespace hvtrace::e2e {

using nlohmann::json;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

std::string ReadWholeFile(const std::string& path) { return test_support::ReadText(path); }

HvtracedProcess::HvtracedProcess(const std::string& tag, const std::string& extra_config) {
  static int counter = 0;
  // Unix socket paths are limited to 107 bytes: keep the directory short.
  dir_ = "/tmp/hvt-" + tag + "-" + std::to_string(::getpid()) + "-" + std::to_string(counter++);
  fs::remove_all(dir_);
  fs::create_directories(dir_);
  std::ofstream(dir_ + "/hvtraced.conf") << "socket_group =\naccel = tcg\n" << extra_config;
  // QEMUs whose daemon died are re-parented to us, not to a PID 1 that may
  // never reap them, so a killed QEMU really disappears (and can be waited for).
  ::prctl(PR_SET_CHILD_SUBREAPER, 1);
}

HvtracedProcess::~HvtracedProcess() {
  Stop(SIGTERM);
  KillRecordedVms();
  std::error_code ec;
  fs::remove_all(dir_, ec);
}

std::string HvtracedProcess::log() const { return ReadWholeFile(dir_ + "/hvtraced.log"); }

Status HvtracedProcess::Start() {
  if (pid_ > 0) return Error{"hvtraced already running as pid " + std::to_string(pid_)};
  pid_ = ::fork();
  if (pid_ < 0) return Error{"fork failed"};
  if (pid_ == 0) {
    // If the test process dies (a ctest timeout SIGKILLs it), the daemon gets
    // SIGTERM and applies vm_on_shutdown; with "stop" its QEMUs go too.
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    for (const auto& [name, value] : env_) ::setenv(name.c_str(), value.c_str(), 1);
    const std::string log_path = dir_ + "/hvtraced.log";
    if (std::freopen(log_path.c_str(), "a", stderr) == nullptr) ::_exit(126);
    const std::string bin = std::string(HVTRACE_BIN_DIR) + "/" + binary_;
    const std::string conf = dir_ + "/hvtraced.conf", state = state_dir(), run = dir_ + "/run";
    ::execl(bin.c_str(), bin.c_str(), "--config", conf.c_str(), "--state-dir", state.c_str(),
            "--run-dir", run.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  for (int i = 0; i < 150; ++i) {
    if (auto c = hostd::ControlClient::Connect(socket(), 1s); c.ok()) return {};
    if (::waitpid(pid_, nullptr, WNOHANG) == pid_) {
      pid_ = -1;
      return Error{"hvtraced exited during start-up:\n" + log()};
    }
    std::this_thread::sleep_for(100ms);
  }
  return Error{"hvtraced did not answer on " + socket() + " within 15 s:\n" + log()};
}

void HvtracedProcess::SetEnv(const std::string& name, const std::string& value) {
  if (value.empty()) {
    env_.erase(name);
  } else {
    env_[name] = value;
  }
}

Result<int> HvtracedProcess::WaitExit(std::chrono::milliseconds timeout) {
  if (pid_ <= 0) return Error{"hvtraced is not running"};
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  int status = 0;
  while (std::chrono::steady_clock::now() < deadline) {
    if (::waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      return status;
    }
    std::this_thread::sleep_for(20ms);
  }
  return Error{"hvtraced (pid " + std::to_string(pid_) + ") still running after " +
               std::to_string(timeout.count()) + " ms"};
}

void HvtracedProcess::Stop(int signo, std::chrono::milliseconds grace) {
  if (pid_ <= 0) return;
  ::kill(pid_, signo);
  const auto deadline = std::chrono::steady_clock::now() + grace;
  while (::waitpid(pid_, nullptr, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() >= deadline) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
      break;
    }
    std::this_thread::sleep_for(20ms);
  }
  pid_ = -1;
}

Result<json> HvtracedProcess::Call(const std::string& cmd, const json& args,
                                   std::chrono::milliseconds timeout) {
  auto c = hostd::ControlClient::Connect(socket(), 5s);
  if (!c.ok()) return c.error();
  auto r = c->Call(cmd, args, timeout);
  if (!r.ok()) return r.error();
  if (!r->ok) return Error{cmd + ": " + r->error};
  return r->result;
}

Result<json> HvtracedProcess::WaitForCapture(const std::string& name, const std::string& trigger,
                                             std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::string last;
  while (std::chrono::steady_clock::now() < deadline) {
    auto list = Call("captures", {{"name", name}});
    if (list.ok()) {
      for (const json& c : (*list)["captures"]) {
        if (c.value("trigger", "") == trigger) return c;
      }
      last = list->dump();
    } else {
      last = list.error().message;
    }
    std::this_thread::sleep_for(200ms);
  }
  return Error{"no '" + trigger + "' capture of " + name + " within " +
               std::to_string(timeout.count()) + " ms; last answer: " + last};
}

void HvtracedProcess::KillRecordedVms() {
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(state_dir() + "/vms", ec)) {
    auto spec = hostd::LoadQmpVmSpec(entry.path());
    if (!spec.ok() || !spec->booted_by_daemon) continue;
    if (spec->pid > 0 && spec->pid_start_time != 0 &&
        hostd::ProcessStartTime(spec->pid).value_or(0) == spec->pid_start_time) {
      std::fprintf(stderr, "[hvtraced fixture] killing QEMU pid %d left by the test\n", spec->pid);
      ::kill(spec->pid, SIGKILL);
      for (int i = 0;
           i < 250 && hostd::ProcessStartTime(spec->pid).value_or(0) == spec->pid_start_time; ++i) {
        ::waitpid(spec->pid, nullptr, WNOHANG);  // Ours once its daemon died (subreaper).
        std::this_thread::sleep_for(20ms);
      }
    } else if (spec->pid > 0) {
      ::waitpid(spec->pid, nullptr, WNOHANG);  // A zombie the new daemon killed.
    }
    for (const std::string& path : spec->owned_paths) fs::remove(path, ec);
  }
}

}  // namespace hvtrace::e2e
