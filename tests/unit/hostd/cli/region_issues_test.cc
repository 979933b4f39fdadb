#include "region_issues.h"

#include <gtest/gtest.h>

namespace hvtrace::cli {
namespace {

using nlohmann::json;

TEST(RegionIssuesTest, CpuListIsShort) {
  EXPECT_EQ(CpuList({}), "");
  EXPECT_EQ(CpuList({3}), "3");
  EXPECT_EQ(CpuList({2, 3, 4, 5, 6, 7}), "2-7");
  EXPECT_EQ(CpuList({1, 3, 5, 6}), "1,3,5-6");
}

TEST(RegionIssuesTest, NeverWrittenCpusGetOneQuietLine) {
  json issues = json::array();
  for (int cpu = 2; cpu < 8; ++cpu) {
    issues.push_back({{"cpu", cpu}, {"check", "empty"}, {"message", "head_buffer is 0"}});
  }
  issues.push_back({{"cpu", 1}, {"check", "bad_page"}, {"message", "cpu 1: page logical 3"}});
  const auto lines = RegionIssueLines(issues);
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[0], "cpu 1 bad_page: cpu 1: page logical 3");
  EXPECT_EQ(lines[1], "cpus 2-7: never written (possible CPUs not online)");
}

TEST(RegionIssuesTest, Malicious_OddJsonIsSkipped) {
  json issues = json::array({1, "x", json::object(), {{"cpu", "two"}, {"check", 5}}});
  EXPECT_NO_THROW(RegionIssueLines(issues));
  EXPECT_TRUE(RegionIssueLines(json::object()).empty());
}

}  // namespace
}  // namespace hvtrace::cli
