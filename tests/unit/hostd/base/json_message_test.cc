#include "json_message.h"

#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <vector>

namespace hvtrace::hostd {
namespace {

using nlohmann::json;

struct Sample {
  static constexpr const char* kCommand = "sample";
  std::string id;
  uint64_t count = 3;
  bool flag = false;
  std::optional<std::string> note;
  std::vector<std::string> tags;
  template <class Self, class Map>
  static void Fields(Self& r, Map& m) {
    m.Required("id", r.id);
    m.Field("count", r.count, 1, 10);
    m.Field("flag", r.flag);
    m.Field("note", r.note);
    m.List("tags", r.tags, 2);
  }
  Status Check() const { return id == "bad" ? Status(Error{"sample: id 'bad'"}) : Status(); }
};

TEST(JsonMessage, WritesRequiredAndChangedFieldsOnly) {
  Sample s;
  s.id = "a";
  EXPECT_EQ(MessageToJson(s), (json{{"id", "a"}}));
  s.count = 4;
  s.note = "n";
  s.tags = {"x"};
  EXPECT_EQ(MessageToJson(s), (json{{"id", "a"}, {"count", 4}, {"note", "n"}, {"tags", {"x"}}}));
}

TEST(JsonMessage, ReadsBackWhatItWrote) {
  Sample s;
  s.id = "a";
  s.flag = true;
  s.tags = {"x", "y"};
  auto back = ParseMessage<Sample>(json::parse(MessageToJson(s).dump()));
  ASSERT_TRUE(back.ok()) << back.error().message;
  EXPECT_EQ(back->id, "a");
  EXPECT_EQ(back->count, 3u);
  EXPECT_TRUE(back->flag);
  EXPECT_FALSE(back->note);
  EXPECT_EQ(back->tags, (std::vector<std::string>{"x", "y"}));
}

TEST(JsonMessage, Malicious_RefusesWithCommandAndKey) {
  auto err = [](const json& args) {
    auto r = ParseMessage<Sample>(args);
    return r.ok() ? std::string("(parsed)") : r.error().message;
  };
  EXPECT_EQ(err(json::array()), "sample: args must be an object");
  EXPECT_EQ(err(json::object()), "sample: args.id is required");
  EXPECT_EQ(err({{"id", "a"}, {"extra", true}}),
            "sample: unknown argument args.extra (sample takes: count, flag, id, note, tags)");
  EXPECT_EQ(err({{"id", 1}}), "sample: args.id must be a string");
  EXPECT_EQ(err({{"id", "a"}, {"count", 11}}), "sample: args.count = 11 is outside 1..10");
  EXPECT_EQ(err({{"id", "a"}, {"count", true}}),
            "sample: args.count must be a non-negative integer");
  EXPECT_EQ(err({{"id", "a"}, {"flag", 1}}), "sample: args.flag must be true or false");
  EXPECT_EQ(err({{"id", "a"}, {"note", 2}}), "sample: args.note must be a string");
  EXPECT_EQ(err({{"id", "a"}, {"tags", {"a", "b", "c"}}}),
            "sample: args.tags must be a list of at most 2 strings");
  EXPECT_EQ(err({{"id", "a"}, {"tags", {1}}}), "sample: args.tags must hold strings");
  EXPECT_EQ(err({{"id", "bad"}}), "sample: id 'bad'");
  // The first error wins, even over an unknown key.
  EXPECT_EQ(err({{"id", 1}, {"extra", true}}), "sample: args.id must be a string");
}

}  // namespace
}  // namespace hvtrace::hostd
