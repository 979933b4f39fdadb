#include "control_protocol.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace hvtrace::hostd {
namespace {

using nlohmann::json;

std::vector<Frame> FeedAll(LineFramer& framer, std::string_view data) {
  std::vector<Frame> out;
  framer.Feed(data, out);
  return out;
}

TEST(LineFramerTest, SplitsSeveralLinesInOneRead) {
  LineFramer framer(100);
  auto frames = FeedAll(framer, "a\nbb\r\nccc\n");
  ASSERT_EQ(frames.size(), 3u);
  EXPECT_EQ(frames[0].text, "a");
  EXPECT_EQ(frames[1].text, "bb");
  EXPECT_EQ(frames[2].text, "ccc");
  EXPECT_EQ(frames[2].stream_offset, 6u);
  EXPECT_EQ(framer.buffered(), 0u);
}

TEST(LineFramerTest, ReassemblesByteByByte) {
  LineFramer framer(100);
  std::string input = R"({"id":1,"cmd":"ping"})"
                      "\n"
                      R"({"id":2,"cmd":"list"})"
                      "\n";
  std::vector<Frame> frames;
  for (char c : input) framer.Feed(std::string_view(&c, 1), frames);
  ASSERT_EQ(frames.size(), 2u);
  EXPECT_EQ(frames[0].text, R"({"id":1,"cmd":"ping"})");
  EXPECT_EQ(frames[1].text, R"({"id":2,"cmd":"list"})");
}

TEST(LineFramerTest, LineExactlyAtCapIsAccepted) {
  LineFramer framer(8);
  auto frames = FeedAll(framer, "12345678\n");
  ASSERT_EQ(frames.size(), 1u);
  EXPECT_TRUE(frames[0].within_limit);
}

TEST(LineFramerTest, Malicious_OversizedLineReportedOnceThenResyncs) {
  LineFramer framer(8);
  std::vector<Frame> frames;
  framer.Feed(std::string_view("123456789"), frames);  // Cap passed, no newline yet.
  ASSERT_EQ(frames.size(), 1u);
  EXPECT_FALSE(frames[0].within_limit);
  EXPECT_EQ(frames[0].stream_offset, 0u);
  // The rest of the long line is dropped without being buffered.
  framer.Feed(std::string(100000, 'x'), frames);
  EXPECT_EQ(frames.size(), 1u);
  EXPECT_EQ(framer.buffered(), 0u);
  framer.Feed(std::string_view("tail\nok\n"), frames);
  ASSERT_EQ(frames.size(), 2u);
  EXPECT_TRUE(frames[1].within_limit);
  EXPECT_EQ(frames[1].text, "ok");
  EXPECT_EQ(frames[1].stream_offset, 9u + 100000u + 5u);
}

TEST(LineFramerTest, Malicious_OversizedLineCompleteInOneRead) {
  LineFramer framer(4);
  auto frames = FeedAll(framer, "abcdef\nxy\n");
  ASSERT_EQ(frames.size(), 2u);
  EXPECT_FALSE(frames[0].within_limit);
  EXPECT_EQ(frames[1].text, "xy");
}

TEST(ParseRequestTest, ParsesFullRequest) {
  auto parsed = ParseRequest(R"({"id":7,"cmd":"status","args":{"name":"vm1"}})");
  ASSERT_TRUE(std::holds_alternative<Request>(parsed));
  const Request& r = std::get<Request>(parsed);
  EXPECT_EQ(r.id, 7);
  EXPECT_EQ(r.cmd, "status");
  EXPECT_EQ(r.args["name"], "vm1");
}

TEST(ParseRequestTest, ArgsDefaultToEmptyObject) {
  auto parsed = ParseRequest(R"({"id":-3,"cmd":"ping"})");
  ASSERT_TRUE(std::holds_alternative<Request>(parsed));
  EXPECT_TRUE(std::get<Request>(parsed).args.is_object());
  EXPECT_EQ(std::get<Request>(parsed).id, -3);
}

struct BadCase {
  const char* line;
  bool has_id;
  const char* fragment;  // Must appear in the error message.
};

class ParseRequestBadTest : public ::testing::TestWithParam<BadCase> {};

TEST_P(ParseRequestBadTest, Malicious_RejectedWithClearError) {
  const BadCase& c = GetParam();
  auto parsed = ParseRequest(c.line);
  ASSERT_TRUE(std::holds_alternative<RequestError>(parsed)) << c.line;
  const RequestError& e = std::get<RequestError>(parsed);
  EXPECT_EQ(e.id.has_value(), c.has_id) << c.line;
  EXPECT_EQ(e.code, kErrBadRequest);
  EXPECT_NE(e.message.find(c.fragment), std::string::npos) << e.message;
}

INSTANTIATE_TEST_SUITE_P(
    All, ParseRequestBadTest,
    ::testing::Values(BadCase{"{", false, "malformed JSON"},
                      BadCase{"not json", false, "malformed JSON"},
                      BadCase{"[1,2]", false, "must be a JSON object"},
                      BadCase{R"({"cmd":"ping"})", false, "no \"id\""},
                      BadCase{R"({"id":"1","cmd":"ping"})", false, "integer"},
                      BadCase{R"({"id":1.5,"cmd":"ping"})", false, "integer"},
                      BadCase{R"({"id":18446744073709551615,"cmd":"ping"})", false, "int64"},
                      BadCase{R"({"id":1})", true, "\"cmd\""},
                      BadCase{R"({"id":1,"cmd":5})", true, "\"cmd\""},
                      BadCase{R"({"id":1,"cmd":""})", true, "1..64"},
                      BadCase{R"({"id":1,"cmd":"ping","args":[1]})", true, "\"args\""},
                      BadCase{"{\"id\":1,\"cmd\":\"p\xff\"}", false, "malformed JSON"}));

TEST(ParseRequestTest, Malicious_DeepNestingIsRefusedBeforeParsing) {
  std::string deep = R"({"id":1,"cmd":"ping","args":{"x":)" + std::string(30000, '[') +
                     std::string(30000, ']') + "}}";
  auto parsed = ParseRequest(deep);
  ASSERT_TRUE(std::holds_alternative<RequestError>(parsed));
  EXPECT_NE(std::get<RequestError>(parsed).message.find("nested deeper than 64"),
            std::string::npos);
  EXPECT_FALSE(ParseReply(R"({"id":1,"ok":true,"result":)" + std::string(5000, '{')).ok());

  // Brackets inside strings do not count; 60 real levels are fine.
  std::string fine = R"({"id":2,"cmd":"ping","args":{"s":"[[[[{{{{\"[[[[","x":)" +
                     std::string(60, '[') + std::string(60, ']') + "}}";
  auto ok = ParseRequest(fine);
  ASSERT_TRUE(std::holds_alternative<Request>(ok)) << std::get<RequestError>(ok).message;
}

TEST(RepliesTest, RoundTrip) {
  std::string ok = OkReply(5, json{{"vms", json::array()}});
  EXPECT_EQ(ok.back(), '\n');
  auto r = ParseReply(ok.substr(0, ok.size() - 1));
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->id, 5);
  EXPECT_TRUE(r->ok);
  EXPECT_TRUE(r->result["vms"].is_array());

  auto err = ParseReply(ErrorReply(std::nullopt, kErrTooLarge, "too big"));
  ASSERT_TRUE(err.ok());
  EXPECT_FALSE(err->id.has_value());
  EXPECT_FALSE(err->ok);
  EXPECT_EQ(err->error, "too big");
  EXPECT_EQ(err->code, kErrTooLarge);

  auto item = ParseReply(StreamItem(9, json{{"n", 1}}));
  ASSERT_TRUE(item.ok());
  EXPECT_TRUE(item->is_stream_item);
  EXPECT_EQ(item->fd_count, 0u);
  auto with_fd = ParseReply(StreamItem(9, json{{"file", "manifest.json"}}, 1));
  ASSERT_TRUE(with_fd.ok()) << with_fd.error().message;
  EXPECT_EQ(with_fd->fd_count, 1u);
  auto end = ParseReply(StreamEnd(9, json{{"count", 1}}));
  ASSERT_TRUE(end.ok());
  EXPECT_FALSE(end->is_stream_item);
  EXPECT_TRUE(end->ok);
  EXPECT_EQ(end->result["count"], 1);
}

TEST(RepliesTest, InvalidUtf8IsReplacedNotThrown) {
  std::string line = ErrorReply(1, kErrUnknownVm, "no VM \xff\xfe");
  auto r = ParseReply(line);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_NE(r->error.find("no VM"), std::string::npos);
}

TEST(RepliesTest, Malicious_BadRepliesRejected) {
  EXPECT_FALSE(ParseReply("garbage").ok());
  // A stream item may claim at most kMaxFdsPerRequest descriptors.
  EXPECT_FALSE(ParseReply(R"({"id":1,"stream":{},"fds":5})").ok());
  EXPECT_FALSE(ParseReply(R"({"id":1,"stream":{},"fds":-1})").ok());
  EXPECT_FALSE(ParseReply(R"({"id":1,"stream":{},"fds":"1"})").ok());
  EXPECT_FALSE(ParseReply("[]").ok());
  EXPECT_FALSE(ParseReply(R"({"ok":true})").ok());
  EXPECT_FALSE(ParseReply(R"({"id":1})").ok());
  EXPECT_FALSE(ParseReply(R"({"id":"x","ok":true})").ok());
}

}  // namespace
}  // namespace hvtrace::hostd
