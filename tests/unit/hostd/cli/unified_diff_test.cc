#include "unified_diff.h"

#include <gtest/gtest.h>

#include <string>

#include "test_support.h"

namespace hvtrace::cli {
namespace {

TEST(UnifiedDiff, EqualTextsGiveNothing) {
  Result<std::string> d = UnifiedDiff("a\nb\n", "a\nb\n", "x", "y");
  ASSERT_TRUE(d.ok()) << d.error().message;
  EXPECT_EQ(*d, "");
}

TEST(UnifiedDiff, LabelsReachDiffVerbatimWithoutAShell) {
  // A domain name may hold anything libvirt allows; no shell ever sees it.
  const std::string name = "web1; touch /tmp/hvtrace-diff-pwned $(id)";
  Result<std::string> d = UnifiedDiff("a\n", "b\n", name + ".xml (before)", "after");
  ASSERT_TRUE(d.ok()) << d.error().message;
  EXPECT_EQ(*d, "--- " + name + ".xml (before)\n+++ after\n@@ -1 +1 @@\n-a\n+b\n");
}

TEST(UnifiedDiff, SetupOfADomainShowsTheAddedCell) {
  const std::string before =
      test_support::ReadText(std::string(HVTRACE_FIXTURES_DIR) + "/libvirt/setup-pc.xml");
  const std::string after =
      test_support::ReadText(std::string(HVTRACE_FIXTURES_DIR) + "/libvirt/setup-pc-defined.xml");
  Result<std::string> d = UnifiedDiff(before, after, "before", "after");
  ASSERT_TRUE(d.ok()) << d.error().message;
  EXPECT_NE(d->find("+      <cell id='1'"), std::string::npos) << *d;
  EXPECT_NE(d->find("org.hvtrace.agent.0"), std::string::npos) << *d;
}

}  // namespace
}  // namespace hvtrace::cli
