// QemuTraceGuard against a scripted QMP peer: below the limit nothing is
// sent; past it every hvtrace trace event is turned off, once, and one VM
// event says so.
#include "qemu_trace_guard.h"

#include <gtest/gtest.h>

#include <boost/asio/io_context.hpp>
#include <chrono>
#include <fstream>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "boot_trace.h"
#include "hostd/qemu/qmp_scripted_server.h"
#include "test_support.h"

namespace hvtrace::hostd {
namespace {

using namespace std::chrono_literals;

TEST(QemuTraceGuardTest, TurnsEventsOffOncePastTheLimit) {
  std::mutex mu;
  std::vector<nlohmann::json> requests;
  ScriptedServer server([&](int fd, const nlohmann::json& req) {
    {
      std::lock_guard lock(mu);
      requests.push_back(req);
    }
    ScriptedServer::Write(fd, Reply(req, "{}"));
  });
  test_support::TempDir tmp;
  const auto log = tmp.path() / "qemu-trace.log";
  std::ofstream(log) << std::string(100, 'x');

  boost::asio::io_context io;
  auto qmp = QmpClient::Create(io.get_executor());
  bool connected = false;
  qmp->AsyncConnect(server.path(), 5s, [&](Status s) { connected = s.ok(); });
  std::vector<VmEvent> reported;
  auto guard = std::make_shared<QemuTraceGuard>(io.get_executor(), log, 1000, 20ms, qmp,
                                                [&](const VmEvent& e) { reported.push_back(e); });
  guard->Start();
  // Several periods under the limit: nothing is sent.
  io.run_for(200ms);
  ASSERT_TRUE(connected);
  {
    std::lock_guard lock(mu);
    EXPECT_TRUE(requests.empty());
  }
  EXPECT_TRUE(reported.empty());

  std::ofstream(log, std::ios::app) << std::string(2000, 'y');
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  while (std::chrono::steady_clock::now() < deadline) {
    io.run_for(50ms);
    std::lock_guard lock(mu);
    if (requests.size() >= BootTraceEvents().size()) break;
  }
  io.run_for(200ms);  // More periods: nothing more is sent or reported.
  std::set<std::string> off;
  {
    std::lock_guard lock(mu);
    ASSERT_EQ(requests.size(), BootTraceEvents().size());
    for (const auto& r : requests) {
      EXPECT_EQ(r["execute"], "trace-event-set-state");
      EXPECT_EQ(r["arguments"]["enable"], false);
      off.insert(r["arguments"]["name"].get<std::string>());
    }
  }
  EXPECT_EQ(off, std::set<std::string>(BootTraceEvents().begin(), BootTraceEvents().end()));
  ASSERT_EQ(reported.size(), 1u);
  EXPECT_EQ(reported[0].name, kEventQemuTraceOff);
  EXPECT_EQ(reported[0].data["bytes"], 2100);
  EXPECT_EQ(reported[0].data["limit"], 1000);
  guard->Stop();
  qmp->Close();
}

TEST(QemuTraceGuardTest, StoppedGuardReportsNothing) {
  ScriptedServer server(
      [](int fd, const nlohmann::json& req) { ScriptedServer::Write(fd, Reply(req, "{}")); });
  test_support::TempDir tmp;
  const auto log = tmp.path() / "qemu-trace.log";
  std::ofstream(log) << std::string(5000, 'x');
  boost::asio::io_context io;
  auto qmp = QmpClient::Create(io.get_executor());
  qmp->AsyncConnect(server.path(), 5s, [](Status) {});
  int reported = 0;
  auto guard = std::make_shared<QemuTraceGuard>(io.get_executor(), log, 1000, 20ms, qmp,
                                                [&](const VmEvent&) { ++reported; });
  guard->Start();
  guard->Stop();
  io.run_for(200ms);
  EXPECT_EQ(reported, 0);
  qmp->Close();
}

}  // namespace
}  // namespace hvtrace::hostd
