// QmpClient/QmpSyncClient against a scripted QMP peer on a real unix socket:
// reply matching, events, timeouts, EOF, and hostile server output.
#include "qmp_client.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "hostd/qemu/qmp_scripted_server.h"

namespace hvtrace::hostd {
namespace {

using namespace std::chrono_literals;
using ::testing::HasSubstr;
using Clock = std::chrono::steady_clock;

TEST(QmpClientTest, CommandsEventsAndErrors) {
  ScriptedServer server([](int fd, const nlohmann::json& req) {
    const std::string cmd = req.value("execute", "");
    if (cmd == "query-status") {
      // An event first, split across writes, then the reply.
      ScriptedServer::Write(fd, "{\"timestamp\": {\"seconds\": 5, \"microseconds\": 6}, \"ev");
      ScriptedServer::Write(
          fd, "ent\": \"STOP\"}\r\n" + Reply(req, "{\"status\": \"running\", \"running\": true}"));
    } else if (cmd == "echo-args") {
      ScriptedServer::Write(fd, Reply(req, req["arguments"].dump()));
    } else {
      ScriptedServer::Write(
          fd, "{\"error\": {\"class\": \"CommandNotFound\", \"desc\": \"The command " + cmd +
                  " has not been found\"}, \"id\": " + req["id"].dump() + "}\r\n");
    }
  });
  auto qmp = QmpSyncClient::Connect(server.path(), 5s);
  ASSERT_TRUE(qmp.ok()) << qmp.error().message;
  EXPECT_EQ((*qmp)->greeting()["version"]["qemu"]["major"], 7);
  // The listener, as the kernel says (the scripted peer runs in this process).
  EXPECT_EQ((*qmp)->peer_pid(), ::getpid());

  auto status = (*qmp)->Execute("query-status");
  ASSERT_TRUE(status.ok()) << status.error().message;
  EXPECT_EQ((*status)["status"], "running");
  auto stop = (*qmp)->WaitForEvent("STOP", 1s);
  ASSERT_TRUE(stop.ok()) << stop.error().message;
  EXPECT_EQ(stop->qemu_seconds, 5);
  EXPECT_EQ(stop->qemu_microseconds, 6);
  EXPECT_TRUE(stop->data.is_object());
  // Consumed: a second wait does not return the same event.
  EXPECT_FALSE((*qmp)->WaitForEvent("STOP", 50ms).ok());

  auto echoed = (*qmp)->Execute("echo-args", {{"x", 1}});
  ASSERT_TRUE(echoed.ok());
  EXPECT_EQ((*echoed)["x"], 1);

  auto bad = (*qmp)->Execute("nope");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.error().message, HasSubstr("CommandNotFound"));
  EXPECT_TRUE((*qmp)->connected());
}

TEST(QmpClientTest, RepliesMatchedByIdOutOfOrder) {
  // Holds the first request and answers both when the second arrives.
  std::string held;
  ScriptedServer server([&held](int fd, const nlohmann::json& req) {
    if (held.empty()) {
      held = Reply(req, "\"first\"");
      return;
    }
    ScriptedServer::Write(fd, Reply(req, "\"second\"") + held);
  });
  auto qmp = QmpSyncClient::Connect(server.path(), 5s);
  ASSERT_TRUE(qmp.ok()) << qmp.error().message;
  Result<nlohmann::json> first = Error{"unset"};
  std::thread t([&] { first = (*qmp)->Execute("a"); });
  std::this_thread::sleep_for(50ms);
  auto second = (*qmp)->Execute("b");
  t.join();
  ASSERT_TRUE(first.ok()) << first.error().message;
  ASSERT_TRUE(second.ok()) << second.error().message;
  EXPECT_EQ(*first, "first");
  EXPECT_EQ(*second, "second");
}

TEST(QmpClientTest, CommandTimeoutThenLateReplyIgnored) {
  std::string late;
  ScriptedServer server([&late](int fd, const nlohmann::json& req) {
    if (req.value("execute", "") == "slow") {
      late = Reply(req, "\"late\"");  // Never answered in time.
    } else {
      ScriptedServer::Write(fd, late + Reply(req, "\"fast\""));
    }
  });
  auto qmp = QmpSyncClient::Connect(server.path(), 5s);
  ASSERT_TRUE(qmp.ok());
  const auto t0 = Clock::now();
  auto slow = (*qmp)->Execute("slow", nlohmann::json::object(), 200ms);
  ASSERT_FALSE(slow.ok());
  EXPECT_THAT(slow.error().message, HasSubstr("no reply within 200 ms"));
  EXPECT_LT(Clock::now() - t0, 2s);
  // The late reply to "slow" arrives first; it must not be taken for "fast"'s.
  auto fast = (*qmp)->Execute("fast");
  ASSERT_TRUE(fast.ok()) << fast.error().message;
  EXPECT_EQ(*fast, "fast");
}

TEST(QmpClientTest, EofFailsPendingCommandAndNotifiesPromptly) {
  ScriptedServer* server_ptr = nullptr;
  ScriptedServer server([&server_ptr](int, const nlohmann::json&) { server_ptr->CloseClient(); });
  server_ptr = &server;
  auto qmp = QmpSyncClient::Connect(server.path(), 5s);
  ASSERT_TRUE(qmp.ok());
  const auto t0 = Clock::now();
  auto r = (*qmp)->Execute("query-status", nlohmann::json::object(), 10s);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.error().message, HasSubstr("closed by QEMU"));
  EXPECT_LT(Clock::now() - t0, 1s);
  auto why = (*qmp)->WaitForDisconnect(1s);
  ASSERT_TRUE(why.has_value());
  EXPECT_FALSE((*qmp)->connected());
  EXPECT_FALSE((*qmp)->WaitForEvent("SHUTDOWN", 5s).ok());
  EXPECT_LT(Clock::now() - t0, 2s);
  auto after = (*qmp)->Execute("query-status");
  EXPECT_THAT(after.error().message, HasSubstr("closed"));
}

TEST(QmpClientTest, Malicious_GarbageFromServerDisconnects) {
  ScriptedServer server([](int fd, const nlohmann::json&) {
    ScriptedServer::Write(fd,
                          "\x7f"
                          "ELF garbage");
  });
  auto qmp = QmpSyncClient::Connect(server.path(), 5s);
  ASSERT_TRUE(qmp.ok());
  auto r = (*qmp)->Execute("query-status", nlohmann::json::object(), 5s);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.error().message, HasSubstr("protocol error"));
  auto why = (*qmp)->WaitForDisconnect(1s);
  ASSERT_TRUE(why.has_value());
  EXPECT_THAT(why->message, HasSubstr("0x7f"));
}

TEST(QmpClientTest, Malicious_OversizedMessageDisconnects) {
  ScriptedServer server([](int fd, const nlohmann::json& req) {
    ScriptedServer::Write(fd, Reply(req, "\"" + std::string(64 * 1024, 'A') + "\""));
  });
  auto qmp = QmpSyncClient::Connect(server.path(), 5s, /*max_message_bytes=*/16 * 1024);
  ASSERT_TRUE(qmp.ok());
  auto r = (*qmp)->Execute("x");
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.error().message, HasSubstr("16384-byte limit"));
}

TEST(QmpClientTest, Malicious_RepliesWithForeignIdsAreIgnored) {
  ScriptedServer server([](int fd, const nlohmann::json& req) {
    ScriptedServer::Write(
        fd,
        "{\"return\": 1, \"id\": \"str\"}{\"return\": 2, \"id\": 999999}{\"return\": 3}"
        "{\"event\": 42}{\"event\": \"X\", \"data\": null, \"timestamp\": 7}" +
            Reply(req, "4"));
  });
  auto qmp = QmpSyncClient::Connect(server.path(), 5s);
  ASSERT_TRUE(qmp.ok());
  auto r = (*qmp)->Execute("x");
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(*r, 4);
  auto x = (*qmp)->WaitForEvent("X", 1s);
  ASSERT_TRUE(x.ok());
  EXPECT_TRUE(x->data.is_object());
}

TEST(QmpClientTest, ConnectRetriesUntilSocketAppears) {
  ScriptedServer server(
      [](int fd, const nlohmann::json& req) { ScriptedServer::Write(fd, Reply(req, "0")); });
  // Hide the listening socket, as before QEMU creates it; connect() must
  // retry ENOENT until it appears.
  const std::string hidden = server.path() + ".hidden";
  ASSERT_EQ(rename(server.path().c_str(), hidden.c_str()), 0);
  std::thread appear([&] {
    std::this_thread::sleep_for(300ms);
    rename(hidden.c_str(), server.path().c_str());
  });
  auto qmp = QmpSyncClient::Connect(server.path(), 5s);
  appear.join();
  ASSERT_TRUE(qmp.ok()) << qmp.error().message;
  EXPECT_TRUE((*qmp)->Execute("x").ok());
}

TEST(QmpClientTest, ConnectWithoutGreetingTimesOutAndSaysWhy) {
  ScriptedServer server([](int, const nlohmann::json&) {}, /*greet=*/false);
  const auto t0 = Clock::now();
  auto qmp = QmpSyncClient::Connect(server.path(), 300ms);
  ASSERT_FALSE(qmp.ok());
  EXPECT_THAT(qmp.error().message, HasSubstr("one QMP client at a time"));
  EXPECT_LT(Clock::now() - t0, 2s);
}

TEST(QmpClientTest, ConnectToNothingTimesOut) {
  auto qmp = QmpSyncClient::Connect("/tmp/hvt-qmp-does-not-exist.sock", 200ms);
  ASSERT_FALSE(qmp.ok());
  EXPECT_THAT(qmp.error().message, HasSubstr("not ready within 200 ms"));
}

}  // namespace
}  // namespace hvtrace::hostd
