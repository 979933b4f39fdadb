#include "daemon_log.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

namespace hvtrace::hostd {
namespace {

TEST(DaemonLogTest, JournalLinesCarryTheSdDaemonPriority) {
  EXPECT_EQ(FormatLogLine(LogStyle::kJournal, LogLevel::kErr, "x", 1), "<3>x\n");
  EXPECT_EQ(FormatLogLine(LogStyle::kJournal, LogLevel::kWarning, "VM a: refused", 1),
            "<4>VM a: refused\n");
  EXPECT_EQ(FormatLogLine(LogStyle::kJournal, LogLevel::kNotice, "m", 1), "<5>m\n");
  EXPECT_EQ(FormatLogLine(LogStyle::kJournal, LogLevel::kInfo, "m", 1), "<6>m\n");
  EXPECT_EQ(FormatLogLine(LogStyle::kJournal, LogLevel::kDebug, "m", 1), "<7>m\n");
}

TEST(DaemonLogTest, TerminalLinesAreSyslogStyleWithTheLevelWord) {
  EXPECT_EQ(FormatLogLine(LogStyle::kTerminal, LogLevel::kWarning, "VM a: bad frame", 42),
            "hvtraced[42]: warning: VM a: bad frame\n");
  EXPECT_EQ(FormatLogLine(LogStyle::kTerminal, LogLevel::kErr, "x", 7), "hvtraced[7]: err: x\n");
  EXPECT_EQ(FormatLogLine(LogStyle::kTerminal, LogLevel::kNotice, "stopped", 7),
            "hvtraced[7]: notice: stopped\n");
}

// A guest's text in a message cannot start a line of its own (a forged
// "<3>" or "hvtraced[1]: err:" entry).
TEST(DaemonLogTest, ControlCharactersAreEscapedSoOneCallIsOneLine) {
  const std::string line = FormatLogLine(LogStyle::kJournal, LogLevel::kInfo,
                                         std::string("a\nb\r<3>c\td\x1b[0m\0e", 16), 1);
  EXPECT_EQ(line, "<6>a\\nb\\x0d<3>c\\td\\x1b[0m\\x00e\n");
  EXPECT_EQ(line.find('\n'), line.size() - 1);
}

TEST(DaemonLogTest, ParsesLevelNames) {
  EXPECT_EQ(ParseLogLevel("err").value(), LogLevel::kErr);
  EXPECT_EQ(ParseLogLevel("error").value(), LogLevel::kErr);
  EXPECT_EQ(ParseLogLevel("warning").value(), LogLevel::kWarning);
  EXPECT_EQ(ParseLogLevel("notice").value(), LogLevel::kNotice);
  EXPECT_EQ(ParseLogLevel("info").value(), LogLevel::kInfo);
  EXPECT_EQ(ParseLogLevel("debug").value(), LogLevel::kDebug);
  auto bad = ParseLogLevel("loud");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("'loud' is not one of err, warning"), std::string::npos);
  for (LogLevel l :
       {LogLevel::kErr, LogLevel::kWarning, LogLevel::kNotice, LogLevel::kInfo, LogLevel::kDebug}) {
    EXPECT_EQ(ParseLogLevel(LogLevelName(l)).value(), l);
  }
}

// Runs |fn| with stderr sent to a file; returns what it wrote.
template <typename Fn>
std::string CaptureStderr(Fn fn) {
  char path[] = "/tmp/daemon_log_test.XXXXXX";
  const int fd = ::mkstemp(path);
  EXPECT_GE(fd, 0);
  const int saved = ::dup(STDERR_FILENO);
  ::dup2(fd, STDERR_FILENO);
  fn();
  ::dup2(saved, STDERR_FILENO);
  ::close(saved);
  ::close(fd);
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  ::unlink(path);
  return text.str();
}

TEST(DaemonLogTest, MessagesBelowTheLevelAreDropped) {
  const LogLevel before = CurrentLogLevel();
  EXPECT_EQ(before, LogLevel::kInfo);  // The default.
  SetLogLevel(LogLevel::kWarning);
  EXPECT_TRUE(LogEnabled(LogLevel::kErr));
  EXPECT_TRUE(LogEnabled(LogLevel::kWarning));
  EXPECT_FALSE(LogEnabled(LogLevel::kNotice));
  const std::string out = CaptureStderr([] {
    LogErr("one");
    LogWarning("two");
    LogNotice("three");
    LogInfo("four");
    LogDebug("five");
  });
  EXPECT_NE(out.find("one\n"), std::string::npos) << out;
  EXPECT_NE(out.find("two\n"), std::string::npos) << out;
  EXPECT_EQ(out.find("three"), std::string::npos) << out;
  EXPECT_EQ(out.find("four"), std::string::npos) << out;
  EXPECT_EQ(out.find("five"), std::string::npos) << out;
  SetLogLevel(LogLevel::kDebug);
  EXPECT_NE(CaptureStderr([] { LogDebug("five"); }).find("five\n"), std::string::npos);
  SetLogLevel(before);
}

TEST(DaemonLogTest, JournalIsDetectedOnlyWhenJournalStreamNamesStderr) {
  struct stat st {};
  ASSERT_EQ(::fstat(STDERR_FILENO, &st), 0);
  const std::string mine = std::to_string(st.st_dev) + ":" + std::to_string(st.st_ino);
  ::unsetenv("JOURNAL_STREAM");
  EXPECT_FALSE(StderrIsJournal());
  ::setenv("JOURNAL_STREAM", mine.c_str(), 1);
  EXPECT_TRUE(StderrIsJournal());
  // A daemon whose stderr was redirected (a child of a journald service):
  // the variable is inherited but names another file.
  ::setenv("JOURNAL_STREAM",
           (std::to_string(st.st_dev) + ":" + std::to_string(st.st_ino + 1)).c_str(), 1);
  EXPECT_FALSE(StderrIsJournal());
  ::setenv("JOURNAL_STREAM", "garbage", 1);
  EXPECT_FALSE(StderrIsJournal());
  ::unsetenv("JOURNAL_STREAM");
}

}  // namespace
}  // namespace hvtrace::hostd
