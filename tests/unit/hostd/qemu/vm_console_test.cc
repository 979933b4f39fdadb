// GuestConsole::Run's framing against a unix socket that answers as a guest's
// serial console does, including printk text sharing the status's line (CI,
// stop 52: "__HVT_DONE_3_0[   16.846943] RIP: ..." was never matched). The
// real guest: the e2e tests' TestGuest::Run.
#include "vm_console.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <functional>
#include <string>
#include <thread>

namespace hvtrace::hostd {
namespace {

using namespace std::chrono_literals;

// Listens on a unix socket; for each line typed it sends |reply(n, typed)|.
class FakeSerial {
 public:
  explicit FakeSerial(std::function<std::string(const std::string&)> reply)
      : path_("/tmp/hvt-console-test-" + std::to_string(::getpid()) + ".sock"),
        reply_(std::move(reply)) {
    ::unlink(path_.c_str());
    listen_fd_ = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, path_.c_str(), path_.size() + 1);
    EXPECT_EQ(bind(listen_fd_, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)), 0);
    EXPECT_EQ(listen(listen_fd_, 1), 0);
    server_ = std::thread([this] { Serve(); });
  }
  ~FakeSerial() {
    shutdown(listen_fd_, SHUT_RDWR);
    if (conn_fd_ >= 0) shutdown(conn_fd_, SHUT_RDWR);
    server_.join();
    close(listen_fd_);
    if (conn_fd_ >= 0) close(conn_fd_);
    ::unlink(path_.c_str());
  }
  const std::string& path() const { return path_; }

 private:
  void Serve() {
    conn_fd_ = accept(listen_fd_, nullptr, nullptr);
    if (conn_fd_ < 0) return;
    std::string typed;
    char c;
    while (read(conn_fd_, &c, 1) == 1) {
      if (c != '\n') {
        typed.push_back(c);
        continue;
      }
      const std::string out = reply_(typed);
      if (write(conn_fd_, out.data(), out.size()) != static_cast<ssize_t>(out.size())) return;
      typed.clear();
    }
  }

  std::string path_;
  std::function<std::string(const std::string&)> reply_;
  int listen_fd_ = -1;
  int conn_fd_ = -1;
  std::thread server_;
};

// The typed line "echo __HVT_BEG''IN_<n>__; CMD; echo __HVT_DONE_<n>_$?" has
// its echo first; |body| is what the guest prints between the markers.
std::string Answer(const std::string& typed, const std::string& body) {
  const size_t at = typed.find("__HVT_BEG''IN_");
  const std::string id = typed.substr(at + 14, typed.find("__;", at) - at - 14);
  return "# " + typed + "\r\n__HVT_BEGIN_" + id + "__\r\n" + body + "__HVT_DONE_" + id + "_";
}

// Runs |command| on a console whose guest prints |after| right after the
// status marker's "_" (the status digits and what follows them).
Result<GuestConsole::CommandResult> RunWith(const std::string& body, const std::string& after,
                                            const std::string& command,
                                            std::chrono::milliseconds timeout) {
  FakeSerial serial([&](const std::string& typed) { return Answer(typed, body) + after; });
  auto console = GuestConsole::Connect(serial.path(), 5s);
  if (!console.ok()) return console.error();
  return (*console)->Run(command, timeout);
}

TEST(GuestConsoleTest, StatusFollowedByAKernelMessageOnItsLine) {
  auto run = RunWith("Killed\r\nsurvived\r\n",
                     "0[   16.846943] RIP: 0010:hvt_beta_oops+0xc/0x20 [hvt_beta]\r\n# ",
                     "sh -c 'echo 1 > /x'; echo survived", 5s);
  ASSERT_TRUE(run.ok()) << run.error().message;
  EXPECT_EQ(run->status, 0);
  EXPECT_EQ(run->output, "Killed\nsurvived\n");
}

TEST(GuestConsoleTest, StatusAtTheLineEndAndOutputWithoutANewline) {
  auto run = RunWith("no newline", "17\r\n# ", "printf 'no newline'; false", 5s);
  ASSERT_TRUE(run.ok()) << run.error().message;
  EXPECT_EQ(run->status, 17);
  EXPECT_EQ(run->output, "no newline");
}

TEST(GuestConsoleTest, StatusRunningIntoOtherTextIsNotTakenAsTheStatus) {
  // "1x" is neither a line end nor a printk stamp after the digits: the run
  // waits for a real status and times out, naming the marker.
  auto run = RunWith("", "1x\r\n# ", "true", 300ms);
  ASSERT_FALSE(run.ok());
  EXPECT_NE(run.error().message.find("__HVT_DONE_1_<status>"), std::string::npos)
      << run.error().message;
}

}  // namespace
}  // namespace hvtrace::hostd
