#include "log_watch.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "console_event_fixture.h"
#include "hvtrace/boot_map.h"
#include "hvtrace/page.h"

namespace hvtrace::hostd {
namespace {

namespace fs = std::filesystem;

KernelFormats Formats(bool with_console = true) {
  std::ifstream in(fs::path(HVTRACE_FIXTURES_DIR) / "pages" / "header_page.txt");
  std::stringstream ss;
  ss << in.rdbuf();
  KernelFormats f;
  f.key = "test";
  f.header_page = ss.str();
  if (with_console) {
    f.events.push_back({"printk", "console", test_support::kConsoleEventId,
                        test_support::ConsoleFormatText(), ""});
  }
  return f;
}

// A 6.12 range of one CPU whose ring slot 1 holds |lines| as printk:console
// records, one per 10 ns from |t0|: the guest's log so far.
class Range {
 public:
  Range() : bytes_(1 << 20) {
    uint64_t stride = 0;
    EXPECT_TRUE(BootMapGeometry(bytes_.size(), 1, 4096, 56, &nr_, &stride));
    pages_ = (56 + 4 * uint64_t{nr_} + 4095) / 4096 * 4096;
    const uint64_t first_va = 0xffff888000000000ull + pages_;
    Put32(0, kBootMapMagic);
    Put32(4, 56);
    Put64(24, first_va);
    Put64(32, first_va + 4096);  // head: slot 1
    Put64(40, first_va + 4096);  // commit: slot 1
    Put32(48, 4096);
    Put32(52, nr_);
    for (uint32_t i = 0; i < nr_; ++i) Put32(56 + 4 * i, i);
  }
  // Rewrites the page with every line logged so far plus |more|.
  void Log(const std::vector<std::string>& more) {
    for (const std::string& l : more) lines_.push_back(l);
    std::span<std::byte> page(bytes_.data() + pages_ + 4096, 4096);
    std::fill(page.begin(), page.end(), std::byte{0});
    PageWriter writer(page, PageLayout{}, 1000);
    for (size_t k = 0; k < lines_.size(); ++k) {
      EXPECT_TRUE(writer.Append(1000 + 10 * k, test_support::ConsoleRecord(lines_[k])));
    }
    writer.Finish();
  }
  std::span<const std::byte> bytes() const { return bytes_; }

 private:
  void Put32(uint64_t off, uint32_t v) { std::memcpy(bytes_.data() + off, &v, 4); }
  void Put64(uint64_t off, uint64_t v) { std::memcpy(bytes_.data() + off, &v, 8); }
  std::vector<std::byte> bytes_;
  uint32_t nr_ = 0;
  uint64_t pages_ = 0;
  std::vector<std::string> lines_;
};

TEST(KernelLogWatchTest, ReportsEachNewWarnAndOopsOnce) {
  Range range;
  const KernelFormats formats = Formats();
  KernelLogWatch watch;
  range.Log({"Linux version 6.12.48+deb12-amd64",
             "WARNING: CPU: 0 PID: 209 at drivers/x.c:12 f+0x1/0x2 [hvt_beta]",
             "Call Trace:", "WARNING: CPU: 0 PID: 209 at drivers/x.c:12 f+0x1/0x2 [hvt_beta]"});
  LogLook look = watch.Look(range.bytes(), formats, 0);
  ASSERT_TRUE(look.error.empty()) << look.error;
  EXPECT_EQ(look.new_lines, 4u);
  EXPECT_EQ(look.trouble_lines, 2u);
  ASSERT_EQ(look.troubles.size(), 1u);  // One per kind per look.
  EXPECT_EQ(look.troubles[0].trigger, "warn");
  EXPECT_EQ(look.troubles[0].line,
            "WARNING: CPU: 0 PID: 209 at drivers/x.c:12 f+0x1/0x2 [hvt_beta]");
  EXPECT_EQ(look.troubles[0].ts_ns, 1010u);
  EXPECT_EQ(look.troubles[0].cpu, 0);

  // Nothing new: nothing reported again.
  look = watch.Look(range.bytes(), formats, 0);
  EXPECT_EQ(look.new_lines, 0u);
  EXPECT_TRUE(look.troubles.empty());

  range.Log({"BUG: kernel NULL pointer dereference, address: 0000000000000000",
             "Oops: 0002 [#1] PREEMPT SMP NOPTI", "RIP: 0010:hvt_beta_oops+0x5/0x10 [hvt_beta]",
             "Call Trace:", " oops_set+0x1b/0x30 [hvt_beta]",
             "---[ end trace 0000000000000000 ]---"});
  look = watch.Look(range.bytes(), formats, 0);
  EXPECT_EQ(look.new_lines, 6u);
  ASSERT_EQ(look.troubles.size(), 1u);
  EXPECT_EQ(look.troubles[0].trigger, "oops");
  EXPECT_EQ(look.troubles[0].line,
            "BUG: kernel NULL pointer dereference, address: 0000000000000000");
}

// An oops is reported when its report has ended, so that its capture holds
// the call trace: a look between its BUG line and its end reports nothing
// yet; the look that sees the end reports it with the BUG line's time.
TEST(KernelLogWatchTest, AnOopsIsReportedOnceItsReportHasEnded) {
  Range range;
  const KernelFormats formats = Formats();
  KernelLogWatch watch;
  range.Log({"Linux version 7.3.4+deb13-amd64",
             "BUG: kernel NULL pointer dereference, address: 0000000000000000",
             "Oops: Oops: 0002 [#1] SMP NOPTI"});
  LogLook look = watch.Look(range.bytes(), formats, 0);
  EXPECT_EQ(look.trouble_lines, 2u);
  EXPECT_TRUE(look.troubles.empty());
  range.Log({"WARNING: CPU: 1 PID: 7 at x.c:1 f", "Call Trace:", " <TASK>",
             " oops_set+0x1b/0x30 [hvt_beta]", "---[ end trace 0000000000000000 ]---"});
  look = watch.Look(range.bytes(), formats, 0);
  ASSERT_EQ(look.troubles.size(), 2u);  // Oldest first.
  EXPECT_EQ(look.troubles[0].trigger, "oops");
  EXPECT_EQ(look.troubles[0].line,
            "BUG: kernel NULL pointer dereference, address: 0000000000000000");
  EXPECT_EQ(look.troubles[0].ts_ns, 1010u);
  EXPECT_EQ(look.troubles[1].trigger, "warn");
  EXPECT_TRUE(watch.Look(range.bytes(), formats, 0).troubles.empty());
}

// A report that never ends (the guest stopped in it, or its end marker was
// lost) is still reported, kOopsWaitLooks looks after the one that saw it.
TEST(KernelLogWatchTest, AnOopsWhoseReportNeverEndsIsReportedLooksLater) {
  Range range;
  const KernelFormats formats = Formats();
  KernelLogWatch watch;
  range.Log({"general protection fault, probably for non-canonical address 0xdead: 0000 [#1]"});
  EXPECT_TRUE(watch.Look(range.bytes(), formats, 0).troubles.empty());
  for (int i = 1; i < KernelLogWatch::kOopsWaitLooks; ++i) {
    EXPECT_TRUE(watch.Look(range.bytes(), formats, 0).troubles.empty()) << i;
  }
  const LogLook look = watch.Look(range.bytes(), formats, 0);
  ASSERT_EQ(look.troubles.size(), 1u);
  EXPECT_EQ(look.troubles[0].trigger, "oops");
  EXPECT_TRUE(watch.Look(range.bytes(), formats, 0).troubles.empty());
}

// The VM booted again on the same range file (or a reset wiped it): one
// boot again, its clock behind what the last look saw.
TEST(KernelLogWatchTest, ARangeThatStartedOverIsReadFromItsStart) {
  const KernelFormats formats = Formats();
  KernelLogWatch watch;
  Range before;
  before.Log({"Linux version 6.12.48+deb12-amd64", "a", "b", "c", "d", "e",
              "WARNING: CPU: 0 PID: 1 at x.c:1 f"});
  ASSERT_EQ(watch.Look(before.bytes(), formats, 0).troubles.size(), 1u);
  Range again;  // Its records start at the same time, fewer of them.
  again.Log({"Linux version 6.12.48+deb12-amd64", "WARNING: CPU: 0 PID: 9 at y.c:2 g"});
  const LogLook look = watch.Look(again.bytes(), formats, 0);
  EXPECT_EQ(look.new_lines, 2u);
  ASSERT_EQ(look.troubles.size(), 1u);
  EXPECT_EQ(look.troubles[0].line, "WARNING: CPU: 0 PID: 9 at y.c:2 g");
}

TEST(KernelLogWatchTest, APanicInTheLookIsLeftToThePanicTrigger) {
  Range range;
  const KernelFormats formats = Formats();
  KernelLogWatch watch;
  range.Log({"Oops: 0002 [#1] PREEMPT SMP NOPTI", "Kernel panic - not syncing: Fatal exception"});
  const LogLook look = watch.Look(range.bytes(), formats, 0);
  EXPECT_TRUE(look.panic_seen);
  EXPECT_TRUE(look.troubles.empty());
}

TEST(KernelLogWatchTest, TerminalEscapesInTheLineArePrintable) {
  Range range;
  KernelLogWatch watch;
  range.Log({"WARNING: CPU: 0 PID: 1 at x.c:1 f\x1b]0;owned\x07"});
  const LogLook look = watch.Look(range.bytes(), Formats(), 0);
  ASSERT_EQ(look.troubles.size(), 1u);
  EXPECT_EQ(look.troubles[0].line.find('\x1b'), std::string::npos) << look.troubles[0].line;
  EXPECT_NE(look.troubles[0].line.find("\\x1b"), std::string::npos) << look.troubles[0].line;
}

TEST(KernelLogWatchTest, Malicious_UnreadableRangeOrKernelWithoutTheEventSaysWhy) {
  KernelLogWatch watch;
  std::vector<std::byte> garbage(1 << 20, std::byte{0x5a});
  LogLook look = watch.Look(garbage, Formats(), 0);
  EXPECT_NE(look.error.find("boot range of 1048576 bytes"), std::string::npos) << look.error;
  EXPECT_TRUE(look.troubles.empty());

  Range range;
  range.Log({"WARNING: CPU: 0 PID: 1 at x.c:1 f"});
  look = watch.Look(range.bytes(), Formats(false), 0);
  EXPECT_NE(look.error.find("no printk:console event"), std::string::npos) << look.error;
  EXPECT_TRUE(look.troubles.empty());
}

}  // namespace
}  // namespace hvtrace::hostd
