// `systemctl reload hvtraced` is SIGHUP: the daemon re-reads its config file
// and keeps serving. Live keys change what it does (here: max_connections,
// log_level, capture_retention in `version`), keys that need a restart are
// reported at warning and keep their value, and a broken file is reported at
// err and changes nothing. A real hvtraced, signalled as systemd would.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "hvtraced_harness.h"

namespace hvtrace::e2e {
namespace {

using nlohmann::json;
using namespace std::chrono_literals;

// Appends |lines| to the daemon's config file (as an admin editing it).
void RewriteConfig(const HvtracedProcess& daemon, const std::string& base,
                   const std::string& lines) {
  std::ofstream conf(daemon.dir() + "/hvtraced.conf", std::ios::trunc);
  conf << base << lines;
}

// A connection that only holds a slot of max_connections.
int HoldConnection(const std::string& socket_path) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, socket_path.c_str(), sizeof addr.sun_path - 1);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

json ConfigOf(const HvtracedProcess& daemon) {
  auto v = daemon.Call("version", json::object());
  EXPECT_TRUE(v.ok()) << (v.ok() ? "" : v.error().message) << daemon.LogTail();
  return v.ok() ? (*v)["config"] : json();
}

TEST(DaemonReloadE2e, SighupReReadsTheConfigAndKeepsServing) {
  HvtracedProcess daemon({.tag = "reload"});
  // What the harness wrote, kept so each rewrite is the whole file.
  std::string base;
  {
    std::ifstream in(daemon.dir() + "/hvtraced.conf");
    base.assign(std::istreambuf_iterator<char>(in), {});
  }
  ASSERT_TRUE(daemon.Start().ok()) << daemon.LogTail();
  const json before = ConfigOf(daemon);
  EXPECT_EQ(before["capture_retention"], 20);
  EXPECT_EQ(before["log_level"], "info");
  EXPECT_EQ(before["qemu_sandbox"], "on");

  // Two connections at once are fine with the default limit.
  const int held = HoldConnection(daemon.socket());
  ASSERT_GE(held, 0);
  ASSERT_TRUE(daemon.Call("ping", json::object()).ok()) << daemon.LogTail();

  // 1. Live keys change; worker_threads needs a restart and is kept.
  RewriteConfig(daemon, base,
                "capture_retention = 3\nmax_connections = 1\nworker_threads = 7\n"
                "panic_policy = resume\n");
  ASSERT_EQ(::kill(daemon.pid(), SIGHUP), 0);
  ASSERT_TRUE(daemon.WaitForLog("reloaded the configuration: changed", 20s)) << daemon.LogTail();
  EXPECT_NE(daemon.log().find("warning: reload: worker_threads needs a restart; keeping 2"),
            std::string::npos)
      << daemon.LogTail();
  // The held connection now fills max_connections = 1: a second is turned away.
  auto refused = daemon.Call("ping", json::object(), 10s);
  ASSERT_FALSE(refused.ok()) << "a second connection was served with max_connections = 1";
  EXPECT_NE(refused.error().message.find("already serves 1 connections"), std::string::npos)
      << refused.error().message;
  ::close(held);
  // Once the slot is free the daemon answers again, with the new values.
  json after;
  for (int i = 0; i < 100; ++i) {
    auto v = daemon.Call("version", json::object(), 10s);
    if (v.ok()) {
      after = (*v)["config"];
      break;
    }
    std::this_thread::sleep_for(50ms);
  }
  ASSERT_FALSE(after.is_null()) << daemon.LogTail();
  EXPECT_EQ(after["capture_retention"], 3);
  EXPECT_EQ(after["max_connections"], 1);
  EXPECT_EQ(after["panic_policy"], "resume");
  EXPECT_EQ(after["worker_threads"], 2);
  EXPECT_FALSE(daemon.WaitExit(200ms).ok()) << daemon.LogTail();

  // 2. A broken file: logged at err, nothing changes, the daemon serves on.
  RewriteConfig(daemon, base, "capture_retention = lots\n");
  ASSERT_EQ(::kill(daemon.pid(), SIGHUP), 0);
  ASSERT_TRUE(daemon.WaitForLog("; the configuration is unchanged", 20s)) << daemon.LogTail();
  EXPECT_NE(daemon.log().find("err: reload: "), std::string::npos) << daemon.LogTail();
  EXPECT_NE(daemon.log().find("capture_retention: 'lots' is not an integer"), std::string::npos)
      << daemon.LogTail();
  const json unchanged = ConfigOf(daemon);
  EXPECT_EQ(unchanged["capture_retention"], 3);
  EXPECT_EQ(unchanged["max_connections"], 1);

  // 3. log_level = warning: notices are no longer written, warnings are.
  RewriteConfig(daemon, base, "log_level = warning\nadmin_group = 0\n");
  ASSERT_EQ(::kill(daemon.pid(), SIGHUP), 0);
  ASSERT_TRUE(daemon.WaitForLog("reload: admin_group needs a restart", 20s)) << daemon.LogTail();
  EXPECT_EQ(ConfigOf(daemon)["log_level"], "warning");
  EXPECT_EQ(ConfigOf(daemon)["admin_group"], before["admin_group"]);
  EXPECT_EQ(ConfigOf(daemon)["capture_retention"], 20);  // Back to the default.
  const size_t reloads_logged = [&] {
    size_t n = 0;
    const std::string log = daemon.log();
    for (size_t at = log.find("reloaded the configuration"); at != std::string::npos;
         at = log.find("reloaded the configuration", at + 1))
      ++n;
    return n;
  }();
  EXPECT_EQ(reloads_logged, 1u) << "the notice of the last reload is below log_level = warning\n"
                                << daemon.LogTail();

  // SIGHUP never ends the daemon; SIGTERM still stops it cleanly.
  EXPECT_FALSE(daemon.WaitExit(200ms).ok()) << "SIGHUP ended hvtraced\n" << daemon.LogTail();
  EXPECT_GE(daemon.Stop(SIGTERM), 0) << daemon.LogTail();
}

}  // namespace
}  // namespace hvtrace::e2e
