// A private hvtraced for end-to-end tests (own state, run dir and socket;
// killed and reaped however the test ends), a control-socket call helper,
// and a `stream` reader running on its own thread.
#ifndef HVTRACE_TESTS_E2E_ATTACH_DAEMON_HARNESS_H_
#define HVTRACE_TESTS_E2E_ATTACH_DAEMON_HARNESS_H_

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>

#include "control_client.h"
#include "hvtrace/result.h"
#include "test_support.h"

namespace hvtrace::e2e {

class AttachTestDaemon {
 public:
  explicit AttachTestDaemon(const std::string& tag) {
    dir_ = "/tmp/hvt-" + tag + "-" + std::to_string(::getpid());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    std::ofstream(dir_ + "/hvtraced.conf") << "socket_group =\naccel = tcg\n";
  }
  ~AttachTestDaemon() {
    Kill();
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  AttachTestDaemon(const AttachTestDaemon&) = delete;
  AttachTestDaemon& operator=(const AttachTestDaemon&) = delete;

  std::string socket() const { return dir_ + "/run/hvtraced.sock"; }
  std::string state_dir() const { return dir_ + "/state"; }
  std::string dir() const { return dir_; }
  std::string log() const { return test_support::ReadText(dir_ + "/hvtraced.log"); }

  bool Start() {
    pid_ = ::fork();
    if (pid_ == 0) {
      const std::string log_path = dir_ + "/hvtraced.log";
      if (std::freopen(log_path.c_str(), "a", stderr) == nullptr) ::_exit(126);
      const std::string bin = std::string(HVTRACE_BIN_DIR) + "/hvtraced";
      const std::string conf = dir_ + "/hvtraced.conf", state = state_dir(), run = dir_ + "/run";
      ::execl(bin.c_str(), bin.c_str(), "--config", conf.c_str(), "--state-dir", state.c_str(),
              "--run-dir", run.c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
    for (int i = 0; i < 100; ++i) {
      if (auto c = hostd::ControlClient::Connect(socket(), std::chrono::seconds(1)); c.ok())
        return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return false;
  }

  void Kill() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGTERM);
    for (int i = 0; i < 50 && ::waitpid(pid_, nullptr, WNOHANG) == 0; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }

  // The result of a successful command, or its error text.
  Result<nlohmann::json> Call(const std::string& cmd, const nlohmann::json& args,
                              std::chrono::milliseconds timeout = std::chrono::seconds(90)) {
    auto c = hostd::ControlClient::Connect(socket(), std::chrono::seconds(5));
    if (!c.ok()) return c.error();
    auto r = c->Call(cmd, args, timeout);
    if (!r.ok()) return r.error();
    if (!r->ok) return Error{cmd + ": " + r->error + " (" + r->code + ")"};
    return r->result;
  }

 private:
  std::string dir_;
  pid_t pid_ = -1;
};

// Runs `stream` on its own connection and thread, collecting the text and
// notes, until the daemon ends the stream or Stop() closes the connection.
class StreamCollector {
 public:
  StreamCollector(const std::string& socket, nlohmann::json args) {
    auto c = hostd::ControlClient::Connect(socket, std::chrono::seconds(5));
    if (!c.ok()) {
      end_ = "connect: " + c.error().message;
      done_ = true;
      return;
    }
    client_ = std::make_unique<hostd::ControlClient>(std::move(*c));
    thread_ = std::thread([this, args] {
      auto r = client_->Call("stream", args, std::chrono::minutes(30),
                             [this](const nlohmann::json& item) {
                               std::lock_guard lock(mu_);
                               if (item.contains("text") && item["text"].is_string())
                                 text_ += item["text"].get<std::string>();
                               if (item.contains("note") && item["note"].is_string())
                                 notes_ += item["note"].get<std::string>() + "\n";
                             });
      std::lock_guard lock(mu_);
      if (!r.ok()) {
        end_ = "error: " + r.error().message;
      } else if (!r->ok) {
        end_ = "failed: " + r->error;
      } else {
        end_ = r->result.dump();
      }
      done_ = true;
    });
  }
  ~StreamCollector() {
    // Closing the socket ends the daemon's stream and our Call.
    if (client_) client_->Shutdown();
    if (thread_.joinable()) thread_.join();
  }

  std::string text() const {
    std::lock_guard lock(mu_);
    return text_;
  }
  std::string notes() const {
    std::lock_guard lock(mu_);
    return notes_;
  }
  bool done() const { return done_.load(); }
  std::string end() const {
    std::lock_guard lock(mu_);
    return end_;
  }
  // Waits until |pred(text)| or the deadline; true when it held.
  template <typename Pred>
  bool WaitFor(Pred pred, std::chrono::milliseconds timeout) const {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      if (pred(text())) return true;
      if (done()) return pred(text());
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return pred(text());
  }

 private:
  std::unique_ptr<hostd::ControlClient> client_;
  std::thread thread_;
  mutable std::mutex mu_;
  std::string text_, notes_, end_;
  std::atomic<bool> done_{false};
};

}  // namespace hvtrace::e2e

#endif  // HVTRACE_TESTS_E2E_ATTACH_DAEMON_HARNESS_H_
