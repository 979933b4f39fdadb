#include "hvtrace/crash_summary.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <charconv>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace hvtrace {
namespace {

// A dmesg-style text ("[    1.234567] text" lines, as boot-N.kernel.log
// holds them) back into a KernelLog.
KernelLog FromDmesg(const std::string& text, int32_t cpu = 1, int32_t pid = 209) {
  KernelLog log;
  log.source = "console-events";
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    KernelLogRecord r;
    r.cpu = cpu;
    r.pid = pid;
    if (line.starts_with("[") && line.find("] ") != std::string::npos) {
      const size_t close = line.find("] ");
      std::string stamp = line.substr(1, close - 1);
      stamp.erase(0, stamp.find_first_not_of(' '));
      const size_t dot = stamp.find('.');
      uint64_t s = 0, us = 0;
      std::from_chars(stamp.data(), stamp.data() + dot, s);
      std::from_chars(stamp.data() + dot + 1, stamp.data() + stamp.size(), us);
      r.ts_ns = s * 1000000000 + us * 1000;
      line = line.substr(close + 2);
    }
    r.text = line;
    log.records.push_back(std::move(r));
  }
  return log;
}

std::string ReadFixture(const std::string& name) {
  std::ifstream in(std::string(HVTRACE_FIXTURES_DIR) + "/kernel-log/" + name, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

bool HasFrame(const CrashSummary& s, const std::string& function, const std::string& module = "") {
  return std::any_of(s.frames.begin(), s.frames.end(), [&](const CrashFrame& f) {
    return f.function.starts_with(function + "+0x") && f.module == module;
  });
}

// The crash summary of a kernel-log fixture (a missing one fails here).
CrashSummary SummaryOfFixture(const std::string& name) {
  const std::string text = ReadFixture(name);
  EXPECT_FALSE(text.empty()) << "fixture missing: " << name;
  return SummarizeCrash(FromDmesg(text, -1, -1));
}

// Real panics of the project's guests (`echo c > /proc/sysrq-trigger` from
// the console's sh): the 6.12 guest's serial console, its kernel lines
// (sysrq-panic-6.12.log; hvtraced_boot_e2e writes a capture's own
// boot-N.kernel.log there with HVTRACE_KERNEL_LOG_FIXTURE_DIR set). Its
// call trace ends in the syscall's user registers (RIP: 0033:...), which
// are not the crash's RIP: a sysrq panic has no exception.
class RealSysrqPanic : public ::testing::TestWithParam<std::string> {};

TEST_P(RealSysrqPanic, NamesReasonTaskCpuAndFrames) {
  const CrashSummary s = SummaryOfFixture("sysrq-panic-" + GetParam() + ".log");
  ASSERT_TRUE(s.found);
  EXPECT_EQ(s.kind, "panic");
  EXPECT_EQ(s.reason, "sysrq triggered crash");
  EXPECT_EQ(s.panic_line, "Kernel panic - not syncing: sysrq triggered crash");
  EXPECT_EQ(s.task, "sh");
  EXPECT_GT(s.pid, 0);
  EXPECT_GE(s.cpu, 0);
  EXPECT_EQ(s.taint, "not tainted") << s.cpu_line;
  EXPECT_TRUE(HasFrame(s, "sysrq_handle_crash")) << s.frames.size();
  EXPECT_TRUE(HasFrame(s, "panic"));
  EXPECT_FALSE(s.kernel_offset.empty());
  EXPECT_TRUE(s.rip.empty()) << s.rip;
  ASSERT_FALSE(s.frames.empty());
  EXPECT_EQ(s.frames.back().function.substr(0, 30), "entry_SYSCALL_64_after_hwframe");
  EXPECT_TRUE(std::any_of(s.frames.begin(), s.frames.end(),
                          [](const CrashFrame& f) { return f.unreliable; }));
  EXPECT_TRUE(s.bug_line.empty() && s.oops_line.empty());
  for (const CrashFrame& f : s.frames) EXPECT_EQ(f.context, "TASK") << f.function;
}

INSTANTIATE_TEST_SUITE_P(Guests, RealSysrqPanic, ::testing::Values("6.12"));

// Real oopses in a module's own function, each guest's (hvt_beta's oops=1: a
// NULL write in hvt_beta_oops, panic_on_oops=1; the kernel log of the
// capture hvtraced_boot_e2e's ModuleOopsPanicNamesTheModuleFrame made,
// written here with HVTRACE_KERNEL_LOG_FIXTURE_DIR set, 2026-12-02: 6.12.95
// with bookworm's gcc-12, 7.3.4 with trixie's gcc-14). 7.3 prints
// "PREEMPT(lazy)" and the Debian version on the CPU line; both print
// "Oops: Oops: 0002" and the taint in words. The faulting function is the
// RIP, with its [module]; the call trace starts at its caller, the module's
// parameter setter, and ends at the syscall entry (the user RIP: 0033:...
// after it is no frame).
class RealModuleOops : public ::testing::TestWithParam<std::string> {};

TEST_P(RealModuleOops, NamesPanicBugOopsTaskRipAndTheModuleFrame) {
  const CrashSummary s = SummaryOfFixture("module-oops-" + GetParam() + ".log");
  ASSERT_TRUE(s.found);
  EXPECT_EQ(s.kind, "panic");
  EXPECT_EQ(s.panic_line, "Kernel panic - not syncing: Fatal exception");
  EXPECT_EQ(s.reason, "Fatal exception");
  EXPECT_EQ(s.bug_line, "BUG: kernel NULL pointer dereference, address: 0000000000000000");
  EXPECT_TRUE(s.oops_line.starts_with("Oops: Oops: 0002 [#1] ")) << s.oops_line;
  EXPECT_EQ(s.task, "sh");
  EXPECT_GT(s.pid, 0);
  EXPECT_GE(s.cpu, 0);
  EXPECT_TRUE(s.cpu_line.find(" Comm: sh Tainted: ") != std::string::npos) << s.cpu_line;
  // The CPU line's flags ("G           OE"), then the Tainted: line after it
  // in words, which both kernels print and which is kept.
  EXPECT_EQ(s.taint, "[O]=OOT_MODULE, [E]=UNSIGNED_MODULE") << s.cpu_line;
  EXPECT_TRUE(s.rip.starts_with("0010:hvt_beta_oops+0x")) << s.rip;
  EXPECT_TRUE(s.rip.ends_with(" [hvt_beta]")) << s.rip;
  ASSERT_GE(s.frames.size(), 3u);
  EXPECT_TRUE(s.frames[0].function.starts_with("oops_set+0x")) << s.frames[0].function;
  EXPECT_EQ(s.frames[0].module, "hvt_beta");
  EXPECT_FALSE(s.frames[0].unreliable);
  EXPECT_TRUE(HasFrame(s, "param_attr_store"));
  EXPECT_EQ(s.frames.back().function.substr(0, 30), "entry_SYSCALL_64_after_hwframe");
  for (const CrashFrame& f : s.frames) {
    EXPECT_EQ(f.context, "TASK") << f.function;
    EXPECT_TRUE(f.module.empty() || f.module == "hvt_beta") << f.function << " " << f.module;
  }
}

INSTANTIATE_TEST_SUITE_P(Guests, RealModuleOops, ::testing::Values("6.12", "7.3"));

// A module's NULL dereference with panic_on_oops=1, in 6.12's words.
constexpr const char* kModuleOops =
    "[   20.100000] BUG: kernel NULL pointer dereference, address: 0000000000000000\n"
    "[   20.100001] #PF: supervisor write access in kernel mode\n"
    "[   20.100002] #PF: error_code(0x0002) - not-present page\n"
    "[   20.100003] PGD 0 P4D 0 \n"
    "[   20.100004] Oops: Oops: 0002 [#1] PREEMPT SMP NOPTI\n"
    "[   20.100005] CPU: 0 UID: 0 PID: 215 Comm: my shell Tainted: G           O       "
    "6.12.48+deb12-amd64 #1  Debian 6.12.48-1~bpo12+1\n"
    "[   20.100006] Hardware name: QEMU Standard PC (i440FX + PIIX, 1996)\n"
    "[   20.100007] RIP: 0010:oops_set+0x15/0x30 [hvt_beta]\n"
    "[   20.100008] Code: 00 00 00 <c7> 04 25 00 00 00 00 01 00 00 00\n"
    "[   20.100009] Call Trace:\n"
    "[   20.100010]  <TASK>\n"
    "[   20.100011]  ? __die+0x23/0x70\n"
    "[   20.100012]  ? page_fault_oops+0x173/0x5b0\n"
    "[   20.100013]  oops_set+0x15/0x30 [hvt_beta]\n"
    "[   20.100014]  param_attr_store+0x93/0x100\n"
    "[   20.100015]  0xffffffff9a001234\n"
    "[   20.100016]  </TASK>\n"
    "[   20.100017] Modules linked in: hvt_beta(O) pvpanic_mmio pvpanic\n"
    "[   20.100018] CR2: 0000000000000000\n"
    "[   20.100019] ---[ end trace 0000000000000000 ]---\n"
    "[   20.100020] RIP: 0010:oops_set+0x15/0x30 [hvt_beta]\n"
    "[   20.100021] Kernel panic - not syncing: Fatal exception\n"
    "[   20.100022] Kernel Offset: 0x19000000 from 0xffffffff81000000 (relocation range)\n"
    "[   20.100023] ---[ end Kernel panic - not syncing: Fatal exception ]---\n";

TEST(CrashSummary, ModuleOopsThenPanic) {
  // The boot's kallsyms names the raw frame (KASLR moved the image by 0x19000000).
  const std::string kallsyms =
      "ffffffff81001000 T _text\nffffffff81001200 T do_the_thing\n"
      "ffffffff81002000 T after\nffffffffc0001000 t oops_set\t[hvt_beta]\n";
  const auto table = KallsymsTable::Parse(kallsyms);
  const CrashSummary s =
      SummarizeCrash(FromDmesg(kModuleOops), {table.get(), kallsyms, 0x19000000});
  ASSERT_TRUE(s.found);
  EXPECT_EQ(s.kind, "panic");
  EXPECT_EQ(s.reason, "Fatal exception");
  EXPECT_EQ(s.bug_line, "BUG: kernel NULL pointer dereference, address: 0000000000000000");
  EXPECT_EQ(s.oops_line, "Oops: Oops: 0002 [#1] PREEMPT SMP NOPTI");
  EXPECT_EQ(s.task, "my shell");
  EXPECT_EQ(s.pid, 215);
  EXPECT_EQ(s.cpu, 0);
  EXPECT_EQ(s.taint, "G           O");
  EXPECT_EQ(s.rip, "0010:oops_set+0x15/0x30 [hvt_beta]");
  EXPECT_EQ(s.kernel_offset, "0x19000000");
  EXPECT_EQ(s.ts_ns, 20100000000u);  // Where the BUG line began it.
  ASSERT_EQ(s.frames.size(), 5u);
  EXPECT_TRUE(s.frames[0].unreliable);
  EXPECT_EQ(s.frames[2].function, "oops_set+0x15/0x30");
  EXPECT_EQ(s.frames[2].module, "hvt_beta");
  EXPECT_FALSE(s.frames[2].unreliable);
  EXPECT_EQ(s.frames[4].function, "do_the_thing+0x34");
  EXPECT_TRUE(s.frames[4].symbolized);
}

TEST(CrashSummary, OopsWithoutPanicAndWarn) {
  std::string oops = kModuleOops;
  oops = oops.substr(0, oops.find("[   20.100021] Kernel panic"));
  CrashSummary s = SummarizeCrash(FromDmesg(oops));
  EXPECT_EQ(s.kind, "oops");
  EXPECT_EQ(s.reason, "BUG: kernel NULL pointer dereference, address: 0000000000000000");

  const std::string warn =
      "[    5.000000] WARNING: CPU: 1 PID: 77 at drivers/x.c:12 f+0x1/0x2 [m]\n"
      "[    5.000001] Modules linked in: m\n"
      "[    5.000002] CPU: 1 UID: 0 PID: 77 Comm: kworker/1:1 Not tainted 7.3.0 #1\n"
      "[    5.000003] Tainted: [W]=WARN\n"
      "[    5.000004] RIP: 0010:f+0x1/0x2 [m]\n"
      "[    5.000005] Call Trace:\n"
      "[    5.000006]  <IRQ>\n"
      "[    5.000007]  g+0x10/0x20\n"
      "[    5.000008]  </IRQ>\n"
      "[    5.000009]  <TASK>\n"
      "[    5.000010]  h+0x10/0x20\n"
      "[    5.000011]  </TASK>\n"
      "[    5.000012] ---[ end trace 0000000000000000 ]---\n";
  s = SummarizeCrash(FromDmesg(warn));
  EXPECT_EQ(s.kind, "warn");
  EXPECT_EQ(s.reason, "WARNING: CPU: 1 PID: 77 at drivers/x.c:12 f+0x1/0x2 [m]");
  EXPECT_EQ(s.task, "kworker/1:1");
  EXPECT_EQ(s.taint, "[W]=WARN");
  ASSERT_EQ(s.frames.size(), 2u);
  EXPECT_EQ(s.frames[0].context, "IRQ");
  EXPECT_EQ(s.frames[1].context, "TASK");
}

// 6.19+ (Debian's 7.x) prints __warn()'s first line another way; the rest
// of the dump is as before. The line is the one a 7.3.4 guest printed for
// hvt_beta's warn=4 (LogWatchE2e/Linux7_3).
TEST(CrashSummary, WarnLineOfSevenX) {
  const std::string warn =
      "[    9.481148] hvt_beta: warning 4 of 4\n"
      "[    9.481155] WARNING: hvt_beta.c:109 at warn_set+0x52/0x90 [hvt_beta], CPU#0: sh/174\n"
      "[    9.482356] Modules linked in: hvt_beta(OE) qemu_fw_cfg\n"
      "[    9.483766] CPU: 0 UID: 0 PID: 174 Comm: sh Tainted: G        W  OE       "
      "7.3.4+deb13-amd64 #1 PREEMPT(lazy)  Debian 7.3.4-1~bpo13+1\n"
      "[    9.484796] Tainted: [W]=WARN, [O]=OOT_MODULE, [E]=UNSIGNED_MODULE\n"
      "[    9.486247] RIP: 0010:warn_set+0x54/0x90 [hvt_beta]\n"
      "[    9.493363] Call Trace:\n"
      "[    9.493554]  <TASK>\n"
      "[    9.493721]  param_attr_store+0x98/0xf0\n"
      "[    9.506151]  </TASK>\n"
      "[    9.506366] ---[ end trace 0000000000000000 ]---\n";
  const CrashSummary s = SummarizeCrash(FromDmesg(warn));
  EXPECT_EQ(s.kind, "warn");
  EXPECT_EQ(s.reason, "WARNING: hvt_beta.c:109 at warn_set+0x52/0x90 [hvt_beta], CPU#0: sh/174");
  EXPECT_EQ(s.warning_line, s.reason);
  EXPECT_EQ(s.task, "sh");
  EXPECT_EQ(s.pid, 174);
  EXPECT_EQ(s.cpu, 0);
  ASSERT_EQ(s.frames.size(), 1u);
  EXPECT_EQ(s.frames[0].function, "param_attr_store+0x98/0xf0");

  // Without a file, and with a task name that holds spaces and a slash.
  EXPECT_EQ(
      SummarizeCrash(FromDmesg("[ 1.0] WARNING: at f+0x1/0x2, CPU#3: kworker/3:1 x/9\n")).kind,
      "warn");
}

// Notices that start like a warning are not one: only __warn()'s own line
// is (its "CPU: " or its ", CPU#N: COMM/PID" tail).
TEST(CrashSummary, WarningNoticesAreNotWarns) {
  for (const char* line : {
           "[ 1.0] WARNING: Spectre v2 mitigation leaves CPU vulnerable to RETBleed attacks\n",
           "[ 1.0] WARNING: at f, CPU#x: sh/1\n",
           "[ 1.0] WARNING: f at g, CPU#1: sh/\n",
           "[ 1.0] WARNING: foo, CPU#1: sh/1\n",
           "[ 1.0] WARNING: at f, CPU#1 sh/1\n",
       }) {
    EXPECT_FALSE(SummarizeCrash(FromDmesg(line)).found) << line;
  }
}

TEST(CrashSummary, NoCrashInAnOrdinaryLog) {
  const CrashSummary s = SummarizeCrash(FromDmesg(
      "[    0.000000] Linux version 6.12.48+deb12-amd64\n[    1.0] Run /init as init process\n"));
  EXPECT_FALSE(s.found);
  EXPECT_TRUE(SummarizeCrash(KernelLog{}).kind.empty());
}

// A panic line written earlier to /dev/kmsg is a printk too; the crash is
// the last panic, the one the kernel's own dump follows.
TEST(CrashSummary, Malicious_EarlierForgedPanicLosesToTheLastOne) {
  const std::string text =
      "[    3.000000] Kernel panic - not syncing: \x1b[31mforged\n"
      "[    3.000001] CPU: 9 UID: 0 PID: 1 Comm: liar Not tainted 6.12 #1\n"
      "[    9.000000] Kernel panic - not syncing: sysrq triggered crash\n"
      "[    9.000001] CPU: 1 UID: 0 PID: 209 Comm: sh Not tainted 6.12.48+deb12-amd64 #1\n";
  CrashSummary s = SummarizeCrash(FromDmesg(text));
  EXPECT_EQ(s.reason, "sysrq triggered crash");
  EXPECT_EQ(s.task, "sh");
  // Alone, the forged one is reported, escaped.
  s = SummarizeCrash(FromDmesg(text.substr(0, text.find("[    9"))));
  EXPECT_EQ(s.reason, "\\x1b[31mforged");
  EXPECT_EQ(s.panic_line.find('\x1b'), std::string::npos);
}

TEST(CrashSummary, Malicious_EndlessTraceAndHostileText) {
  std::string text = "[    1.0] Kernel panic - not syncing: x\n";
  text += "[    1.0] CPU: 4294967296 UID: 0 PID: -5 Comm: \x1b]0;t\x07 Not tainted\n";
  text += "[    1.0] RIP: 0010:\xff\xfe\n[    1.0] Call Trace:\n";
  for (int i = 0; i < 5000; ++i) text += "[    1.0]  f" + std::to_string(i) + "+0x1/0x2\n";
  const CrashSummary s = SummarizeCrash(FromDmesg(text, 2, 3));
  EXPECT_EQ(s.frames.size(), kMaxCrashFrames);
  EXPECT_GT(s.frames_dropped, 0u);
  EXPECT_EQ(s.cpu, 2);  // The bad CPU line is not used; the record's CPU is.
  EXPECT_EQ(s.pid, 3);
  EXPECT_EQ(s.rip.find('\xff'), std::string::npos);
  // Garbage after "Call Trace:" ends the trace.
  const CrashSummary t = SummarizeCrash(FromDmesg(
      "[ 1.0] Kernel panic - not syncing: y\n[ 1.0] Call Trace:\n[ 1.0]  not a frame at all\n"
      "[ 1.0]  f+0x1/0x2\n"));
  EXPECT_TRUE(t.frames.empty());
}

TEST(CrashSummary, PanicReason) {
  EXPECT_EQ(PanicReason("Kernel panic - not syncing: Fatal exception"), "Fatal exception");
  EXPECT_EQ(PanicReason("  Kernel panic - not syncing: x "), "x");
  EXPECT_EQ(PanicReason("Kernel panic"), "");
}

}  // namespace
}  // namespace hvtrace
