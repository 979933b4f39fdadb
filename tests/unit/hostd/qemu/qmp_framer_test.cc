#include "qmp_framer.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace hvtrace::hostd {
namespace {

// A greeting exactly as QEMU 7.2 sends it, then a reply and an event.
constexpr std::string_view kGreeting =
    "{\"QMP\": {\"version\": {\"qemu\": {\"micro\": 22, \"minor\": 2, \"major\": 7}, "
    "\"package\": \"Debian 1:7.2+dfsg-7+deb12u18+b3\"}, \"capabilities\": [\"oob\"]}}\r\n";
constexpr std::string_view kReply = "{\"return\": {}, \"id\": 1}\r\n";
constexpr std::string_view kEvent =
    "{\"timestamp\": {\"seconds\": 1700000000, \"microseconds\": 12}, \"event\": "
    "\"GUEST_PANICKED\", \"data\": {\"action\": \"pause\", \"info\": {\"type\": \"hyper-v\"}}}\r\n";

std::vector<nlohmann::json> Drain(QmpFramer& framer) {
  std::vector<nlohmann::json> out;
  nlohmann::json m;
  while (framer.Pop(&m)) out.push_back(m);
  return out;
}

TEST(QmpFramerTest, ParsesGreeting) {
  QmpFramer framer;
  ASSERT_TRUE(framer.Feed(kGreeting).ok());
  auto messages = Drain(framer);
  ASSERT_EQ(messages.size(), 1u);
  EXPECT_EQ(messages[0]["QMP"]["version"]["qemu"]["major"], 7);
  EXPECT_TRUE(framer.Finish().ok());
}

TEST(QmpFramerTest, ByteAtATimeFragmentation) {
  const std::string stream = std::string(kGreeting) + std::string(kReply) + std::string(kEvent);
  QmpFramer framer;
  std::vector<nlohmann::json> messages;
  for (char c : stream) {
    ASSERT_TRUE(framer.Feed(std::string_view(&c, 1)).ok());
    for (auto& m : Drain(framer)) messages.push_back(m);
  }
  ASSERT_EQ(messages.size(), 3u);
  EXPECT_TRUE(messages[0].contains("QMP"));
  EXPECT_EQ(messages[1]["id"], 1);
  EXPECT_EQ(messages[2]["event"], "GUEST_PANICKED");
  EXPECT_EQ(messages[2]["data"]["action"], "pause");
  EXPECT_TRUE(framer.Finish().ok());
}

TEST(QmpFramerTest, SeveralMessagesInOneRead) {
  std::string stream;
  for (int i = 0; i < 50; ++i) stream += "{\"return\": {}, \"id\": " + std::to_string(i) + "}\r\n";
  QmpFramer framer;
  ASSERT_TRUE(framer.Feed(stream).ok());
  auto messages = Drain(framer);
  ASSERT_EQ(messages.size(), 50u);
  for (int i = 0; i < 50; ++i) EXPECT_EQ(messages[i]["id"], i);
}

TEST(QmpFramerTest, NoLineEndingNeeded) {
  QmpFramer framer;
  ASSERT_TRUE(framer.Feed("{\"a\":1}{\"b\":[1,{\"c\":2}]}").ok());
  auto messages = Drain(framer);
  ASSERT_EQ(messages.size(), 2u);
  EXPECT_EQ(messages[1]["b"][1]["c"], 2);
}

TEST(QmpFramerTest, BracesAndQuotesInsideStringsDoNotEndTheMessage) {
  QmpFramer framer;
  const std::string_view tricky =
      "{\"return\": \"}}}]]] \\\" {{ \\\\\", \"id\": \"x}\"}\r\n{\"return\": 2}";
  // Split in the middle of an escape sequence.
  ASSERT_TRUE(framer.Feed(tricky.substr(0, 18)).ok());
  ASSERT_TRUE(framer.Feed(tricky.substr(18)).ok());
  auto messages = Drain(framer);
  ASSERT_EQ(messages.size(), 2u);
  EXPECT_EQ(messages[0]["return"], "}}}]]] \" {{ \\");
  EXPECT_EQ(messages[0]["id"], "x}");
  EXPECT_EQ(messages[1]["return"], 2);
}

TEST(QmpFramerTest, EofMidMessageIsReported) {
  QmpFramer framer;
  ASSERT_TRUE(framer.Feed(std::string(kReply) + "{\"return\": {}, \"i").ok());
  EXPECT_EQ(Drain(framer).size(), 1u);
  Status status = framer.Finish();
  ASSERT_FALSE(status.ok());
  EXPECT_NE(status.error().message.find("middle of a message"), std::string::npos);
}

TEST(QmpFramerTest, Malicious_OversizedMessage) {
  QmpFramer framer(/*max_message_bytes=*/1024);
  std::string big = "{\"return\": \"" + std::string(2000, 'a') + "\"}";
  Status status = framer.Feed(big);
  ASSERT_FALSE(status.ok());
  EXPECT_NE(status.error().message.find("1024-byte limit"), std::string::npos);
  EXPECT_TRUE(framer.failed());
  // Sticky: nothing more is accepted, even a valid message.
  EXPECT_FALSE(framer.Feed(kReply).ok());
  EXPECT_EQ(framer.queued(), 0u);
}

TEST(QmpFramerTest, MessageExactlyAtTheLimitIsAccepted) {
  const std::string msg = "{\"a\":\"" + std::string(100 - 8, 'x') + "\"}";
  ASSERT_EQ(msg.size(), 100u);
  QmpFramer framer(100);
  ASSERT_TRUE(framer.Feed(msg).ok());
  EXPECT_EQ(framer.queued(), 1u);
}

TEST(QmpFramerTest, Malicious_GarbageBetweenMessages) {
  QmpFramer framer;
  Status status = framer.Feed(std::string(kReply) + "HELLO");
  ASSERT_FALSE(status.ok());
  EXPECT_NE(status.error().message.find("0x48"), std::string::npos);
  // The message before the garbage is still delivered.
  EXPECT_EQ(Drain(framer).size(), 1u);
}

TEST(QmpFramerTest, Malicious_TopLevelArrayOrScalar) {
  for (std::string_view bad : {"[1,2]", "42", "\"str\"", "null"}) {
    QmpFramer framer;
    EXPECT_FALSE(framer.Feed(bad).ok()) << bad;
  }
}

TEST(QmpFramerTest, Malicious_BalancedButInvalidJson) {
  for (std::string_view bad :
       {"{]", "{\"a\" 1}", "{\"a\":tru}", "{\"a\":1,}", "{\"a\":\"\x01\"}"}) {
    QmpFramer framer;
    Status status = framer.Feed(bad);
    EXPECT_FALSE(status.ok()) << bad;
    EXPECT_EQ(framer.queued(), 0u);
  }
}

TEST(QmpFramerTest, Malicious_DeepNesting) {
  QmpFramer framer;
  std::string deep = "{\"a\":";
  for (int i = 0; i < 10000; ++i) deep += "[";
  Status status = framer.Feed(deep);
  ASSERT_FALSE(status.ok());
  EXPECT_NE(status.error().message.find("nests deeper"), std::string::npos);
}

TEST(QmpFramerTest, Malicious_BinaryNoise) {
  std::string noise;
  for (int i = 0; i < 4096; ++i) noise.push_back(static_cast<char>((i * 7919) & 0xff));
  QmpFramer framer;
  EXPECT_FALSE(framer.Feed(noise).ok());
  EXPECT_FALSE(framer.Finish().ok());
}

}  // namespace
}  // namespace hvtrace::hostd
