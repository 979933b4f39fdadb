// The console oracle itself (console_match.h), on lines CI's guests printed:
// what it forgives as the UART's damage, and that a line the log lacks is
// still missing.
#include "console_match.h"

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

TEST(ConsoleMatchTest, AStretchLostAcrossLinesIsGarbledAndMatchingGoesOnAfterIt) {
  // CI, 2026-12-04 (7.3 guest): the start of refined-jiffies' line, then the
  // end of jiffies' line; the lines between never reached the console.
  const auto printed = Lines({"clocksource:  les: 0xffffffff, max_idle_ns: 7645041785100000 ns",
                              "futex hash table entries: 512 (order: 3, 32768 bytes, linear)"});
  const ConsoleMatch r = MatchConsoleInLog(printed, Lines(kLog), false, "console match test");
  EXPECT_EQ(r.missing, 0u);
  EXPECT_EQ(r.garbled, 1u);
  EXPECT_EQ(r.compared, 2u);
}

TEST(ConsoleMatchTest, ALineTheLogLacksIsMissingThoughItStartsAsTheNextLinesDo) {
  EXPECT_NONFATAL_FAILURE(
      {
        const auto printed = Lines({"clocksource: Switched to clocksource tsc-early"});
        const ConsoleMatch r = MatchConsoleInLog(printed, Lines(kLog), false, "console match test");
        EXPECT_EQ(r.missing, 1u);
      },
      "console line not in the capture's log");
}

TEST(ConsoleMatchTest, ALineWithItsMiddleLostIsGarbled) {
  const auto printed =
      Lines({"Dentry cache hash table entries: 65536 (order: 7, 524288 bytes, linear)",
             "clocksource: jiffies:: 0xffffffff, max_idle_ns: 7645041785100000 ns"});
  const ConsoleMatch r = MatchConsoleInLog(printed, Lines(kLog), false, "console match test");
  EXPECT_EQ(r.missing, 0u);
  EXPECT_EQ(r.garbled, 1u);
}

const std::vector<std::string> kE820 = {
    "user: [mem 0x00000000000f0000-0x00000000000fffff]  device reserved",
    "user: [mem 0x0000000000100000-0x000000003fffffff]  System RAM",
    "user: [mem 0x0000000043fe0000-0x0000000043ffffff]  device reserved",
};

TEST(ConsoleMatchTest, TwoLinesRunTogetherWithTheStampPartlyLostAreGarbled) {
  // CI, 2026-12-05 (7.3 guest, printk ring): " reserved", the newline and
  // "[    0.000" lost; " 000] " is what was left of the second line's stamp.
  const auto printed =
      Lines({"user: [mem 0x00000000000f0000-0x00000000000fffff]  device  000] "
             "user: [mem 0x0000000000100000-0x000000003fffffff]  System RAM",
             kE820[2]});
  const ConsoleMatch r = MatchConsoleInLog(printed, Lines(kE820), true, "console match test");
  EXPECT_EQ(r.missing, 0u);
  EXPECT_EQ(r.garbled, 1u);
}

TEST(ConsoleMatchTest, TextBetweenTwoLinesThatNoStampLeftIsMissing) {
  EXPECT_NONFATAL_FAILURE(
      {
        const auto printed =
            Lines({"user: [mem 0x00000000000f0000-0x00000000000fffff]  device  oops "
                   "user: [mem 0x0000000000100000-0x000000003fffffff]  System RAM"});
        const ConsoleMatch r = MatchConsoleInLog(printed, Lines(kE820), true, "console match test");
        EXPECT_EQ(r.missing, 1u);
      },
      "console line not in the capture's log");
}

TEST(ConsoleMatchTest, ARemnantOfAFewCharactersIsGarbledWhenTheNextLinesStartSo) {
  // CI, 2026-12-05 (7.3 guest): "pp" on the console, the 8250's hand-over.
  const auto printed = Lines({"ss",
                              "Dentry cache hash table entries: 65536 (order: 7, 524288 "
                              "bytes, linear)"});
  const ConsoleMatch r = MatchConsoleInLog(printed, Lines(kLog), false, "console match test");
  EXPECT_EQ(r.missing, 0u);
  EXPECT_EQ(r.garbled, 1u);
}

TEST(ConsoleMatchTest, ARemnantNoNextLineStartsWithIsMissing) {
  EXPECT_NONFATAL_FAILURE(
      {
        const ConsoleMatch r =
            MatchConsoleInLog(Lines({"zq"}), Lines(kLog), false, "console match test");
        EXPECT_EQ(r.missing, 1u);
      },
      "console line not in the capture's log");
}

}  // namespace
}  // namespace hvtrace::e2e
