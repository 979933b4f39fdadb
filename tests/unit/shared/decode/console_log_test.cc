#include "hvtrace/console_log.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "console_event_fixture.h"
#include "hvtrace/format.h"

namespace hvtrace {
namespace {

using Bytes = std::vector<std::byte>;

using test_support::ConsoleRecord;
constexpr uint16_t kPrintId = 6;

ConsoleMsgField Field() {
  Result<EventFormat> f = ParseEventFormat("printk", test_support::ConsoleFormatText());
  EXPECT_TRUE(f.ok());
  auto field = FindConsoleMsgField(*f);
  EXPECT_TRUE(field.has_value());
  return field.value_or(ConsoleMsgField{});
}

KernelLog Build(const std::vector<Bytes>& payloads) {
  std::vector<ConsoleEventRecord> records;
  uint64_t ts = 1000;
  for (const Bytes& p : payloads) records.push_back({ts += 1000, 1, p});
  return KernelLogFromConsoleEvents(Field(), records);
}

TEST(ConsoleLog, OneRecordPerLineWithTimeCpuAndPid) {
  const KernelLog log =
      Build({ConsoleRecord("sysrq: Trigger a crash"),
             ConsoleRecord("Kernel panic - not syncing: sysrq triggered crash"),
             ConsoleRecord("CPU: 1 UID: 0 PID: 209 Comm: sh Not tainted 6.12.48+deb12-amd64 #1")});
  EXPECT_EQ(log.source, "console-events");
  ASSERT_EQ(log.records.size(), 3u);
  EXPECT_EQ(log.records[1].text, "Kernel panic - not syncing: sysrq triggered crash");
  EXPECT_EQ(log.records[1].ts_ns, 3000u);
  EXPECT_EQ(log.records[1].cpu, 1);
  EXPECT_EQ(log.records[1].pid, 209);
  EXPECT_EQ(log.malformed, 0u);
  EXPECT_EQ(DmesgText(log).substr(0, 38), "[    0.000002] sysrq: Trigger a crash\n");
}

TEST(ConsoleLog, MultiLineTextSplitsKeepingTheRecordsTime) {
  const KernelLog log = Build({ConsoleRecord("first\nsecond\n"), ConsoleRecord("")});
  ASSERT_EQ(log.records.size(), 3u);
  EXPECT_EQ(log.records[0].text, "first");
  EXPECT_EQ(log.records[1].text, "second");
  EXPECT_EQ(log.records[1].ts_ns, log.records[0].ts_ns);
  EXPECT_EQ(log.records[2].text, "");  // printk("\n"): dmesg shows an empty line too.
}

// print_modules() and dump_pagetable() print one line in pieces
// (pr_cont), each an event, ended by pr_cont("\n"): joined as dmesg shows it.
TEST(ConsoleLog, ContinuationPiecesJoinUpToTheirEmptyEnd) {
  const KernelLog log =
      Build({ConsoleRecord("PGD 0 "), ConsoleRecord("P4D 0 "), ConsoleRecord(""),
             ConsoleRecord("Modules linked in:"), ConsoleRecord(" hvt_beta(O)"),
             ConsoleRecord(" pvpanic_mmio"), ConsoleRecord(" pvpanic"), ConsoleRecord(""),
             ConsoleRecord("CR2: 0000000000000000"), ConsoleRecord("Modules linked in:"),
             ConsoleRecord(" other_task", 1), ConsoleRecord("")});
  ASSERT_EQ(log.records.size(), 6u);
  EXPECT_EQ(log.records[0].text, "PGD 0 P4D 0 ");
  EXPECT_EQ(log.records[1].text, "Modules linked in: hvt_beta(O) pvpanic_mmio pvpanic");
  EXPECT_EQ(log.records[2].text, "CR2: 0000000000000000");
  // Another task's line is never a piece of this one.
  EXPECT_EQ(log.records[3].text, "Modules linked in:");
  EXPECT_EQ(log.records[4].text, " other_task");
  EXPECT_EQ(log.records[5].text, "");
}

// A user's trace_marker write is a print event, not printk: whatever it
// says, it never enters the kernel log.
TEST(ConsoleLog, Malicious_ForgedPanicInAMarkerIsNotTheLog) {
  const KernelLog log = Build({ConsoleRecord("Kernel panic - not syncing: forged", 300, kPrintId),
                               ConsoleRecord("real line")});
  ASSERT_EQ(log.records.size(), 1u);
  EXPECT_EQ(log.records[0].text, "real line");
}

TEST(ConsoleLog, Malicious_BadReferencesAreCountedAndSkipped) {
  Bytes past_end = ConsoleRecord("abc");
  const uint32_t ref = (200u << 16) | 12u;  // 200 bytes where 4 are.
  std::memcpy(past_end.data() + 8, &ref, 4);
  Bytes into_header = ConsoleRecord("abc");
  const uint32_t hdr = (4u << 16) | 2u;  // Points into trace_entry.
  std::memcpy(into_header.data() + 8, &hdr, 4);
  Bytes truncated = ConsoleRecord("abc");
  truncated.resize(10);
  const KernelLog log = Build({past_end, into_header, truncated, Bytes(1), ConsoleRecord("ok")});
  EXPECT_EQ(log.malformed, 3u);
  ASSERT_EQ(log.records.size(), 1u);
  EXPECT_EQ(log.records[0].text, "ok");
}

TEST(ConsoleLog, Malicious_NulEscapesLongLinesAndInvalidUtf8) {
  const std::string nul("before\0after", 12);
  const std::string escape = "\x1b]0;owned\x07\x1b[2Jtext\xff\xfe";
  const std::string big(60000, 'x');
  const KernelLog log = Build(
      {ConsoleRecord(nul), ConsoleRecord(escape), ConsoleRecord(big), ConsoleRecord("no newline")});
  ASSERT_EQ(log.records.size(), 4u);
  EXPECT_EQ(log.records[0].text, "before");
  EXPECT_EQ(log.records[2].text.size(), kMaxKernelLogLine);
  EXPECT_EQ(log.truncated, 1u);
  const std::string shown = DmesgText(log);
  EXPECT_EQ(shown.find('\x1b'), std::string::npos);
  EXPECT_EQ(shown.find('\x07'), std::string::npos);
  EXPECT_EQ(shown.find('\xff'), std::string::npos);
  EXPECT_NE(shown.find("\\x1b]0;owned\\x07\\x1b[2Jtext\\xff\\xfe"), std::string::npos);
}

TEST(ConsoleLog, OtherFormatsAreNotTheConsole) {
  Result<EventFormat> f = ParseEventFormat("ftrace", test_support::ConsoleFormatText());
  ASSERT_TRUE(f.ok());
  EXPECT_FALSE(FindConsoleMsgField(*f).has_value());
  std::string no_loc = test_support::ConsoleFormatText();
  no_loc.replace(no_loc.find("__data_loc char[] msg"), 21, "int msg");
  Result<EventFormat> g = ParseEventFormat("printk", no_loc);
  ASSERT_TRUE(g.ok());
  EXPECT_FALSE(FindConsoleMsgField(*g).has_value());
}

}  // namespace
}  // namespace hvtrace
