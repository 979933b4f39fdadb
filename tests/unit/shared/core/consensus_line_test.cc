#include "hvtrace/consensus_line.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

namespace hvtrace {
namespace {

const auto kAny = [](const ClockPoint&, const ClockPoint&) { return true; };

TEST(ConsensusLine, TheLineMostPointsAgreeWithDropsTheOnesOffIt) {
  // y = 2x + 5 with jitter under the tolerance; points 2 and 5 are off.
  std::vector<ClockPoint> p;
  for (uint64_t i = 0; i < 8; ++i) p.push_back({1000 * i + 1, 2000 * i + 7 + (i % 3)});
  p[2].y += 500;
  p[5].y -= 400;
  auto line = FindConsensusLine(p, {10, 0}, kAny);
  ASSERT_TRUE(line.has_value());
  EXPECT_EQ(line->members, (std::vector<size_t>{0, 1, 3, 4, 6, 7}));
  EXPECT_LT(p[line->a].x, p[line->b].x);
}

TEST(ConsensusLine, Malicious_BetweenEqualSetsTheEarliestWins) {
  // Points 0-2 on one line, 3-5 on another with the same count: nothing
  // tells them apart but their age.
  std::vector<ClockPoint> honest = {{10, 100}, {20, 200}, {30, 300}};
  std::vector<ClockPoint> liar = {{15, 1150}, {25, 1250}, {35, 1350}};
  std::vector<ClockPoint> p = honest;
  p.insert(p.end(), liar.begin(), liar.end());
  auto line = FindConsensusLine(p, {1, 0}, kAny);
  ASSERT_TRUE(line.has_value());
  EXPECT_EQ(line->members, (std::vector<size_t>{0, 1, 2}));
  // Written the other way round, the liar's set is the earliest.
  std::vector<ClockPoint> q = liar;
  q.insert(q.end(), honest.begin(), honest.end());
  line = FindConsensusLine(q, {1, 0}, kAny);
  ASSERT_TRUE(line.has_value());
  EXPECT_EQ(line->members, (std::vector<size_t>{0, 1, 2}));
  // Between lines of one set, the longest: its ends.
  EXPECT_EQ(line->a, 0u);
  EXPECT_EQ(line->b, 2u);
}

TEST(ConsensusLine, OnlyAdmissibleLinesAndClocksGoingForward) {
  std::vector<ClockPoint> p = {{10, 100}, {20, 90}, {30, 80}};  // y falls: no clock.
  EXPECT_FALSE(FindConsensusLine(p, {1, 0}, kAny).has_value());
  p = {{10, 100}, {20, 200}, {30, 300}};
  EXPECT_FALSE(FindConsensusLine(p, {1, 0}, [](const ClockPoint& a, const ClockPoint& b) {
                 return b.y - a.y < b.x - a.x;  // Rate below 1 only.
               }).has_value());
  EXPECT_FALSE(FindConsensusLine({}, {1, 0}, kAny).has_value());
  EXPECT_FALSE(FindConsensusLine(std::vector<ClockPoint>{{1, 1}}, {1, 0}, kAny).has_value());
}

TEST(ConsensusLine, ToleranceGrowsByPpmOfTheDistance) {
  const ClockPoint a{0, 0}, b{1'000'000'000, 1'000'000'000};
  // 1000 ppm of 2e9 is 2e6: 1.5e6 off is near, 2.5e6 is not.
  EXPECT_TRUE(NearLine(a, b, {2'000'000'000, 2'001'500'000}, {0, 1000}));
  EXPECT_FALSE(NearLine(a, b, {2'000'000'000, 2'002'500'000}, {0, 1000}));
  EXPECT_TRUE(NearLine(a, b, {2'000'000'000, 2'000'000'010}, {10, 0}));
  EXPECT_FALSE(NearLine(a, b, {2'000'000'000, 2'000'000'011}, {10, 0}));
}

TEST(ConsensusLine, Malicious_HugeValuesNeitherOverflowNorMatchByAccident) {
  const uint64_t max = UINT64_MAX;
  std::vector<ClockPoint> p = {{1, 1}, {max, max}, {max / 2, 3}, {2, max - 1}};
  auto line = FindConsensusLine(p, {2'000'000, 1000}, kAny);
  ASSERT_TRUE(line.has_value());  // {1,1}-{2,max-1} makes one.
  for (size_t k : line->members) EXPECT_LT(k, p.size());
  EXPECT_FALSE(NearLine({0, 0}, {0, 5}, {0, 5}, {1, 0}));  // a.x == b.x: no line.
}

TEST(ConsensusLine, FewAnchorsStillCountEveryPoint) {
  // 2000 points of y = x + 1e9 with 1 us of jitter, every tenth 5 ms off.
  std::mt19937_64 rng(7);
  std::vector<ClockPoint> p;
  size_t off = 0;
  for (uint64_t i = 0; i < 2000; ++i) {
    const uint64_t x = i * 10'000'000 + 1;
    uint64_t y = x + 1'000'000'000 + rng() % 1000;
    if (i % 10 == 3) {
      y += 5'000'000;
      ++off;
    }
    p.push_back({x, y});
  }
  auto line = FindConsensusLine(p, {500'000, 0}, kAny, 32);
  ASSERT_TRUE(line.has_value());
  EXPECT_EQ(line->members.size(), p.size() - off);
}

}  // namespace
}  // namespace hvtrace
