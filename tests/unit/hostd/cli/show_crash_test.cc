#include "show_crash.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

namespace hvtrace::cli {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

json Manifest() {
  return {
      {"crash",
       {{"boot", 1},
        {"kind", "panic"},
        {"reason", "sysrq triggered crash"},
        {"panic_line", "Kernel panic - not syncing: sysrq triggered crash"},
        {"task", "sh"},
        {"pid", 209},
        {"cpu", 1},
        {"taint", "not tainted"},
        {"frames",
         {{{"function", "dump_stack_lvl+0x5d/0x80"}, {"context", "TASK"}},
          {{"function", "__die+0x23/0x70"}, {"context", "TASK"}, {"unreliable", true}},
          {{"function", "hvt_beta_oops+0x15/0x30"}, {"module", "hvt_beta"}, {"context", "TASK"}}}},
        {"events_before", {{{"ts_ns", 5}, {"line", "sh-209 [001] 9.1: tracing_mark_write: last"}}}},
        {"log", {{"source", "console-events"}, {"lines", 328}, {"lost", 0}, {"malformed", 0}}}}}};
}

TEST(ShowCrash, SummaryTextIsCommentLines) {
  const std::string text = CrashSummaryText(Manifest());
  EXPECT_TRUE(text.starts_with(
      "# crash (boot 1, panic): Kernel panic - not syncing: sysrq triggered crash\n"))
      << text;
  EXPECT_NE(text.find("#   task sh, pid 209, CPU 1; not tainted\n"), std::string::npos) << text;
  EXPECT_NE(text.find("#     ? __die+0x23/0x70\n"), std::string::npos) << text;
  EXPECT_NE(text.find("#     hvt_beta_oops+0x15/0x30 [hvt_beta]\n"), std::string::npos) << text;
  EXPECT_NE(text.find("last 1 events of CPU 1"), std::string::npos) << text;
  EXPECT_NE(text.find("console-events, 328 lines"), std::string::npos) << text;
  for (size_t at = 0; at < text.size(); at = text.find('\n', at) + 1) EXPECT_EQ(text[at], '#');
  EXPECT_EQ(CrashSummaryText(json::object()), "");
  EXPECT_EQ(CrashSummaryJsonLine(json::object()), "");
  const json line = json::parse(CrashSummaryJsonLine(Manifest()));
  EXPECT_EQ(line["crash"]["reason"], "sysrq triggered crash");
  EXPECT_FALSE(line.contains("event"));
}

// A copied capture's manifest is anyone's: wrong types print as "?" or not
// at all, and no byte of it reaches the terminal raw.
TEST(ShowCrash, Malicious_ManifestTypesAndEscapes) {
  json m = Manifest();
  m["crash"]["panic_line"] =
      "Kernel panic - not syncing: \x1b]0;owned\x07\x9b"
      "2J";
  m["crash"]["pid"] = "not a number";
  m["crash"]["frames"] = {42, {{"function", {1, 2}}}, "x"};
  m["crash"]["events_before"] = "nope";
  const std::string text = CrashSummaryText(m);
  EXPECT_EQ(text.find('\x1b'), std::string::npos);
  EXPECT_EQ(text.find('\x07'), std::string::npos);
  EXPECT_NE(text.find("pid ?"), std::string::npos);
  EXPECT_NE(text.find("\\x1b]0;owned\\x07"), std::string::npos) << text;
  m["crash"] = "not an object";
  EXPECT_EQ(CrashSummaryText(m), "");
  EXPECT_EQ(CrashReasonColumn(json{{"crash", {{"kind", 3}}}}, 40), ": ");
}

TEST(ShowCrash, ReasonColumnIsShortAndPrintable) {
  EXPECT_EQ(CrashReasonColumn(json::object(), 40), "-");
  EXPECT_EQ(CrashReasonColumn(Manifest(), 40), "panic: sysrq triggered crash");
  json m = Manifest();
  m["crash"]["reason"] = std::string(100, 'x') + "\x1b";
  const std::string col = CrashReasonColumn(m, 40);
  EXPECT_EQ(col.size(), 40u);
  EXPECT_TRUE(col.ends_with("..."));
}

TEST(ShowCrash, KernelLogsPrintAsWrittenAndEscaped) {
  const fs::path dir = fs::path(::testing::TempDir()) / ("show-crash-" + std::to_string(getpid()));
  fs::create_directories(dir);
  std::ofstream(dir / "boot-0.kernel.log") << "[    0.000000] Linux version 6.12\n";
  std::ofstream(dir / "boot-1.kernel.log") << "[    1.000000] a\x1b[2Jb\n";
  std::ofstream(dir / "boot-x.kernel.log") << "not a boot\n";
  char path[] = "/tmp/show-crash-out-XXXXXX";
  const int fd = ::mkstemp(path);
  ASSERT_GE(fd, 0);
  EXPECT_EQ(ShowKernelLogs(dir, std::nullopt, fd), 0);
  EXPECT_EQ(ShowKernelLogs(dir, 1u, fd), 0);
  EXPECT_EQ(ShowKernelLogs(dir, 7u, fd), 1);
  ::close(fd);
  std::ifstream in(path);
  const std::string out((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(out,
            "# boot 0\n[    0.000000] Linux version 6.12\n# boot 1\n[    1.000000] a\\x1b[2Jb\n"
            "[    1.000000] a\\x1b[2Jb\n");
  ::unlink(path);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace hvtrace::cli
