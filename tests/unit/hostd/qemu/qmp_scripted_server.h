// A scripted QMP peer on a real unix socket, for tests of QmpClient and of
// the QMP backend: it greets, answers qmp_capabilities, and hands every
// other request to the test.
#ifndef HVTRACE_TESTS_UNIT_QMP_SCRIPTED_SERVER_H_
#define HVTRACE_TESTS_UNIT_QMP_SCRIPTED_SERVER_H_

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <functional>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <thread>

namespace hvtrace::hostd {

inline constexpr std::string_view kGreeting =
    "{\"QMP\": {\"version\": {\"qemu\": {\"micro\": 0, \"minor\": 2, \"major\": 7}, \"package\": "
    "\"\"}, "
    "\"capabilities\": [\"oob\"]}}\r\n";

// A QMP peer: accepts one connection, optionally greets, then hands every
// request line to |on_request|, which writes whatever it likes to |fd|.
class ScriptedServer {
 public:
  using Handler = std::function<void(int fd, const nlohmann::json& request)>;

  explicit ScriptedServer(Handler on_request, bool greet = true)
      : on_request_(std::move(on_request)) {
    static std::atomic<int> counter{0};
    path_ =
        "/tmp/hvt-qmp-test-" + std::to_string(getpid()) + "-" + std::to_string(counter++) + ".sock";
    unlink(path_.c_str());
    listen_fd_ = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, path_.c_str(), path_.size() + 1);
    if (bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
        listen(listen_fd_, 4) != 0) {
      ADD_FAILURE() << "cannot listen on " << path_ << ": " << std::strerror(errno);
    }
    thread_ = std::thread([this, greet] { Serve(greet); });
  }

  ~ScriptedServer() {
    shutdown(listen_fd_, SHUT_RDWR);
    CloseClient();
    if (thread_.joinable()) thread_.join();
    close(listen_fd_);
    unlink(path_.c_str());
  }

  const std::string& path() const { return path_; }
  // Ends the connection as a dying QEMU would. Only shuts the socket down:
  // the serving thread closes it, so the descriptor is never reused under it.
  void CloseClient() {
    std::lock_guard lock(mutex_);
    if (client_fd_ >= 0) shutdown(client_fd_, SHUT_RDWR);
  }

  static void Write(int fd, std::string_view text) {
    while (!text.empty()) {
      const ssize_t n = send(fd, text.data(), text.size(), MSG_NOSIGNAL);
      if (n <= 0) return;
      text.remove_prefix(static_cast<size_t>(n));
    }
  }

 private:
  void Serve(bool greet) {
    const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) return;
    {
      std::lock_guard lock(mutex_);
      client_fd_ = fd;
    }
    if (greet) Write(fd, kGreeting);
    std::string buffer;
    char chunk[4096];
    while (true) {
      const ssize_t n = read(fd, chunk, sizeof(chunk));
      if (n <= 0) break;
      buffer.append(chunk, static_cast<size_t>(n));
      size_t nl;
      while ((nl = buffer.find('\n')) != std::string::npos) {
        auto request = nlohmann::json::parse(buffer.substr(0, nl), nullptr, false);
        buffer.erase(0, nl + 1);
        if (request.is_discarded()) continue;
        if (request.value("execute", "") == "qmp_capabilities") {
          Write(fd, "{\"return\": {}, \"id\": " + request["id"].dump() + "}\r\n");
        } else {
          on_request_(fd, request);
        }
      }
    }
    std::lock_guard lock(mutex_);
    close(fd);
    client_fd_ = -1;
  }

  Handler on_request_;
  std::string path_;
  int listen_fd_ = -1;
  std::mutex mutex_;
  int client_fd_ = -1;
  std::thread thread_;
};

inline std::string Reply(const nlohmann::json& request, const std::string& ret) {
  return "{\"return\": " + ret + ", \"id\": " + request["id"].dump() + "}\r\n";
}

}  // namespace hvtrace::hostd

#endif  // HVTRACE_TESTS_UNIT_QMP_SCRIPTED_SERVER_H_
