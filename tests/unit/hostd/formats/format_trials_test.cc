// RunFormatTrials: a kernel's formats trial-parsed once, in a child; a format
// that crashes libtraceevent does not pass (the daemon lives on), nor one
// whose id an earlier format has (its text was never tried), the rest pass.
#include "format_trials.h"

#include <gtest/gtest.h>

#include <string>

#include "test_support.h"

namespace hvtrace::hostd {
namespace {

std::string Format(const std::string& name, int id) {
  return "name: " + name + "\nID: " + std::to_string(id) +
         "\nformat:\n"
         "\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n"
         "\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;\n\n"
         "\tfield:int value;\toffset:8;\tsize:4;\tsigned:1;\n\n"
         "print fmt: \"value=%d\", REC->value\n";
}

TEST(FormatTrialsTest, Malicious_CrashingFormatFailsSharedIdsAreNotTriedTheRestPass) {
  const std::string crasher = test_support::ReadText(std::string(HVTRACE_FIXTURES_DIR) +
                                                     "/fuzz/format/parser_null_deref.format");
  ASSERT_FALSE(crasher.empty());
  KernelFormats k;
  k.release = "test";
  k.events = {{"sched", "crasher", 372, crasher, ""},
              {"test", "good", 21, Format("good", 21), ""},
              {"test", "twin_a", 30, Format("twin_a", 30), ""},
              {"test", "twin_b", 30, Format("twin_b", 30), ""},
              {"test", "refused", 0, "garbage", "no ID line"}};
  const FormatTrials t = RunFormatTrials(&k);
  EXPECT_EQ(t.passed, 2u);
  EXPECT_EQ(t.not_passed, 3u);
  EXPECT_FALSE(k.events[0].trial_passed);
  EXPECT_TRUE(k.events[1].trial_passed);
  EXPECT_TRUE(k.events[2].trial_passed);
  EXPECT_FALSE(k.events[3].trial_passed);
  EXPECT_FALSE(k.events[4].trial_passed);
}

}  // namespace
}  // namespace hvtrace::hostd
