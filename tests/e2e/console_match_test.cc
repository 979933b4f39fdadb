// The console oracle itself (console_match.h), on lines CI's guests printed:
// what it forgives as the UART's damage, and that a line the log lacks is
// still missing.
#include "console_match.h"

#include <gmock/gmock.h>
#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace hvtrace::e2e {
namespace {

std::vector<LogLine> Lines(const std::vector<std::string>& texts) {
  std::vector<LogLine> out;
  for (const std::string& t : texts) out.push_back({"    0.000000", t, 0});
  return out;
}

const std::vector<std::string> kLog = {
    "clocksource: refined-jiffies: mask: 0xffffffff max_cycles: 0xffffffff, max_idle_ns: "
    "7645519600211568 ns",
    "setup_percpu: NR_CPUS:8192 nr_cpumask_bits:2 nr_cpu_ids:2 nr_node_ids:1",
    "Dentry cache hash table entries: 65536 (order: 7, 524288 bytes, linear)",
    "clocksource: jiffies: mask: 0xffffffff max_cycles: 0xffffffff, max_idle_ns: "
    "7645041785100000 ns",
    "futex hash table entries: 512 (order: 3, 32768 bytes, linear)",
};

// Matches |printed| against |log|: every line found, |garbled| of them as
// the UART's damage.
void ExpectAllFound(const std::vector<std::string>& printed, const std::vector<std::string>& log,
                    bool same_time, size_t garbled) {
  const ConsoleMatch r =
      MatchConsoleInLog(Lines(printed), Lines(log), same_time, "console match test");
  EXPECT_EQ(r.missing, 0u);
  EXPECT_EQ(r.garbled, garbled);
  EXPECT_EQ(r.compared, printed.size());
}

// Matches |printed| (one line) against |log|: that line is missing, and the
// match reported it as the e2e tests see it.
void ExpectMissing(const std::string& printed, const std::vector<std::string>& log,
                   bool same_time) {
  testing::TestPartResultArray reported;
  ConsoleMatch r;
  {
    testing::ScopedFakeTestPartResultReporter intercept(
        testing::ScopedFakeTestPartResultReporter::INTERCEPT_ONLY_CURRENT_THREAD, &reported);
    r = MatchConsoleInLog(Lines({printed}), Lines(log), same_time, "console match test");
  }
  EXPECT_EQ(r.missing, 1u);
  ASSERT_EQ(reported.size(), 1);
  EXPECT_TRUE(reported.GetTestPartResult(0).nonfatally_failed());
  EXPECT_THAT(reported.GetTestPartResult(0).message(),
              testing::HasSubstr("console line not in the capture's log"));
}

TEST(ConsoleMatchTest, AStretchLostAcrossLinesIsGarbledAndMatchingGoesOnAfterIt) {
  // CI, 2026-12-04 (7.3 guest): the start of refined-jiffies' line, then the
  // end of jiffies' line; the lines between never reached the console.
  ExpectAllFound({"clocksource:  les: 0xffffffff, max_idle_ns: 7645041785100000 ns",
                  "futex hash table entries: 512 (order: 3, 32768 bytes, linear)"},
                 kLog, false, 1);
}

TEST(ConsoleMatchTest, ALineTheLogLacksIsMissingThoughItStartsAsTheNextLinesDo) {
  ExpectMissing("clocksource: Switched to clocksource tsc-early", kLog, false);
}

TEST(ConsoleMatchTest, ALineWithItsMiddleLostIsGarbled) {
  ExpectAllFound({"Dentry cache hash table entries: 65536 (order: 7, 524288 bytes, linear)",
                  "clocksource: jiffies:: 0xffffffff, max_idle_ns: 7645041785100000 ns"},
                 kLog, false, 1);
}

const std::vector<std::string> kE820 = {
    "user: [mem 0x00000000000f0000-0x00000000000fffff]  device reserved",
    "user: [mem 0x0000000000100000-0x000000003fffffff]  System RAM",
    "user: [mem 0x0000000043fe0000-0x0000000043ffffff]  device reserved",
};

TEST(ConsoleMatchTest, TwoLinesRunTogetherWithTheStampPartlyLostAreGarbled) {
  // CI, 2026-12-05 (7.3 guest, printk ring): " reserved", the newline and
  // "[    0.000" lost; " 000] " is what was left of the second line's stamp.
  ExpectAllFound({"user: [mem 0x00000000000f0000-0x00000000000fffff]  device  000] "
                  "user: [mem 0x0000000000100000-0x000000003fffffff]  System RAM",
                  kE820[2]},
                 kE820, true, 1);
}

TEST(ConsoleMatchTest, TextBetweenTwoLinesThatNoStampLeftIsMissing) {
  ExpectMissing(
      "user: [mem 0x00000000000f0000-0x00000000000fffff]  device  oops "
      "user: [mem 0x0000000000100000-0x000000003fffffff]  System RAM",
      kE820, true);
}

TEST(ConsoleMatchTest, ARemnantOfAFewCharactersIsGarbledWhenTheNextLinesStartSo) {
  // CI, 2026-12-05 (7.3 guest): "pp" on the console, the 8250's hand-over.
  ExpectAllFound({"ss", "Dentry cache hash table entries: 65536 (order: 7, 524288 bytes, linear)"},
                 kLog, false, 1);
}

TEST(ConsoleMatchTest, ARemnantNoNextLineStartsWithIsMissing) { ExpectMissing("zq", kLog, false); }

}  // namespace
}  // namespace hvtrace::e2e
