// What a newer boot bundle of the same boot changed, per event.
#include "meta_bundle_diff.h"

#include <gtest/gtest.h>

namespace hvtrace::hostd {
namespace {

using nlohmann::json;

TEST(MetaBundleDiffTest, AddedRemovedMovedChangedKept) {
  const std::string before =
      "sched/sched_switch 316 00000000000000aa\n"
      "hvt_alpha/alpha_seq 1496 00000000000000bb\n"
      "hvt_alpha/alpha_pair 1497 00000000000000cc\n"
      "old/gone 1500 00000000000000dd\n";
  const std::string after =
      "sched/sched_switch 316 00000000000000aa\n"
      "hvt_alpha/alpha_seq 1498 00000000000000bb\n"
      "hvt_alpha/alpha_pair 1497 00000000000000ce\n"
      "hvt_beta/beta_flag 1499 00000000000000ee\n"
      "not a line\n";
  const json d = DiffBundleFingerprints(before, after);
  EXPECT_EQ(d["added"], json::array({"hvt_beta/beta_flag"}));
  EXPECT_EQ(d["removed"], json::array({"old/gone"}));
  EXPECT_EQ(d["moved"],
            json::array({{{"event", "hvt_alpha/alpha_seq"}, {"from", 1496}, {"to", 1498}}}));
  EXPECT_EQ(d["changed"], json::array({{{"event", "hvt_alpha/alpha_pair"}, {"id", 1497}}}));
  EXPECT_EQ(d["kept"], 1);
  EXPECT_EQ(d["added_count"], 1);
}

TEST(MetaBundleDiffTest, ListsAreCappedCountsAreNot) {
  std::string after;
  for (int i = 0; i < 10; ++i)
    after += "s/e" + std::to_string(i) + " " + std::to_string(i) + " 0\n";
  const json d = DiffBundleFingerprints("", after, 3);
  EXPECT_EQ(d["added"].size(), 3u);
  EXPECT_EQ(d["added_count"], 10);
  EXPECT_EQ(d["kept"], 0);
}

}  // namespace
}  // namespace hvtrace::hostd
