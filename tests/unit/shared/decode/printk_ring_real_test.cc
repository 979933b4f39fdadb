// The printk ring reader over real guests' memory: what hvtraced read from
// Debian's 6.12 and 7.3 guests at a sysrq panic (tests/fixtures/printk_ring/
// linux-*/: VMCOREINFO, the memory record, and the kernel lines the guest's
// serial console printed, recorded by HVTRACE_RECORD_PRINTK_FIXTURES with
// tests/e2e/postmortem_memory_e2e.cc). The console is the oracle: every line
// it printed is in the log, in order, at the same time.
#include <gtest/gtest.h>

#include <cinttypes>
#include <cstdio>
#include <string>
#include <vector>

#include "hvtrace/memory_record.h"
#include "hvtrace/printk_ring.h"
#include "test_support.h"

namespace hvtrace {
namespace {

using test_support::ReadText;

class PrintkRingRealTest : public ::testing::TestWithParam<std::string> {};

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> out;
  size_t at = 0;
  while (at < text.size()) {
    size_t nl = text.find('\n', at);
    if (nl == std::string::npos) nl = text.size();
    out.push_back(text.substr(at, nl - at));
    at = nl + 1;
  }
  return out;
}

std::string Time(uint64_t ns) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%5" PRIu64 ".%06" PRIu64, ns / 1000000000,
                (ns % 1000000000) / 1000);
  return buf;
}

TEST_P(PrintkRingRealTest, EveryConsoleLineIsInTheLogInOrder) {
  const std::string dir = std::string(HVTRACE_FIXTURES_DIR) + "/printk_ring/linux-" + GetParam();
  const Vmcoreinfo info = Vmcoreinfo::Parse(ReadText(dir + "/vmcoreinfo.txt"));
  ASSERT_TRUE(info.Value("OSRELEASE").has_value());
  EXPECT_TRUE(info.Value("OSRELEASE")->starts_with(GetParam())) << *info.Value("OSRELEASE");
  const std::vector<std::byte> packed = test_support::Bytes(ReadText(dir + "/printk-memory.zst"));
  auto memory = MemoryRecord::Decompress(packed);
  ASSERT_TRUE(memory.ok()) << memory.error().message;
  PrintkRingInfo found;
  auto log = ReadPrintkRing(
      info, [&](uint64_t addr, size_t size) { return memory->Read(addr, size); }, &found);
  ASSERT_TRUE(log.ok()) << log.error().message;
  EXPECT_EQ(log->malformed, 0u);
  EXPECT_EQ(log->lost, 0u);
  ASSERT_FALSE(log->records.empty());
  EXPECT_TRUE(log->records.front().text.starts_with("Linux version " + GetParam()))
      << log->records.front().text;
  // The ring's geometry as Debian's kernels build it.
  EXPECT_GE(found.count_bits, 10u);
  EXPECT_GE(found.size_bits, 15u);

  // The TCG serial console garbles a few lines (characters doubled or
  // dropped): such a line must still have a record at its time, next in
  // order; every other line is a record's exact text.
  size_t next = 0, lines = 0, missing = 0, garbled = 0;
  bool panic = false;
  for (const std::string& line : Lines(ReadText(dir + "/console.txt"))) {
    if (line.size() < 15) continue;
    const std::string time = line.substr(1, 12), text = line.substr(15);
    ++lines;
    panic |= text == "Kernel panic - not syncing: sysrq triggered crash";
    auto at = [&](bool exact) {
      size_t i = next;
      while (i < log->records.size() &&
             !(Time(log->records[i].ts_ns) == time &&
               (!exact || PrintableLogText(log->records[i].text) == text))) {
        ++i;
      }
      return i;
    };
    size_t i = at(true);
    if (i == log->records.size()) {
      i = at(false);
      ++garbled;
    }
    if (i == log->records.size()) {
      if (missing++ < 5) ADD_FAILURE() << "no record at its time, in order: " << line;
      continue;
    }
    next = i + 1;
  }
  EXPECT_LT(garbled * 4, lines);
  EXPECT_GT(lines, 100u);
  EXPECT_TRUE(panic);
  EXPECT_EQ(missing, 0u);
}

INSTANTIATE_TEST_SUITE_P(Kernels, PrintkRingRealTest, ::testing::Values("6.12", "7.3"),
                         [](const ::testing::TestParamInfo<std::string>& p) {
                           std::string name = "Linux" + p.param;
                           for (char& c : name) c = c == '.' ? '_' : c;
                           return name;
                         });

}  // namespace
}  // namespace hvtrace
