#include "crash_step.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "console_event_fixture.h"

namespace hvtrace::hostd {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;
using Bytes = std::vector<std::byte>;

constexpr uint16_t kTick = 7;
using test_support::kCommonFormatFields;

std::string ReadFile(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

KernelFormats Formats() {
  KernelFormats f;
  f.key = "test";
  f.header_page = ReadFile(fs::path(HVTRACE_FIXTURES_DIR) / "pages" / "header_page.txt");
  f.events.push_back(
      {"printk", "console", test_support::kConsoleEventId, test_support::ConsoleFormatText(), ""});
  f.events.push_back({"test", "tick", kTick,
                      std::string("name: tick\nID: 7\n") + kCommonFormatFields +
                          "\tfield:int n;\toffset:8;\tsize:4;\tsigned:1;\n\n"
                          "print fmt: \"n=%d\", REC->n\n",
                      ""});
  return f;
}

Bytes Console(std::string_view text, int32_t pid) { return test_support::ConsoleRecord(text, pid); }

Bytes Tick(int32_t n, int32_t pid) {
  Bytes p(12, std::byte{0});
  std::memcpy(p.data(), &kTick, 2);
  std::memcpy(p.data() + 4, &pid, 4);
  std::memcpy(p.data() + 8, &n, 4);
  return p;
}

// Two CPUs of one boot: CPU 1 ticks, then panics; CPU 0 ticks too (not
// the panicking CPU's events).
struct Boot {
  std::vector<Bytes> payloads;
  BootMap map;
  Boot() {
    map.boots = 1;
    map.cpu.resize(2);
    map.cpu[0].cpu = 0;
    map.cpu[1].cpu = 1;
    payloads.reserve(64);
    auto add = [&](int cpu, uint64_t ts, Bytes p) {
      payloads.push_back(std::move(p));
      map.cpu[cpu].records.push_back({ts, 0, 0, payloads.back()});
    };
    add(0, 100, Console("Linux version 6.12.48+deb12-amd64", 0));
    for (int i = 0; i < 25; ++i) add(1, 1000 + i, Tick(i, 209));
    add(0, 1010, Tick(99, 7));
    add(1, 2000, Console("sysrq: Trigger a crash", 209));
    add(1, 2001, Console("Kernel panic - not syncing: sysrq triggered crash", 209));
    add(1, 2002,
        Console("CPU: 1 UID: 0 PID: 209 Comm: sh Not tainted 6.12.48+deb12-amd64 #1", 209));
    add(1, 2003, Console("Call Trace:", 209));
    add(1, 2004, Console(" <TASK>", 209));
    add(1, 2005, Console(" sysrq_handle_crash+0x1a/0x20", 209));
    add(1, 2006, Console(" </TASK>", 209));
    add(1, 2007, Tick(1000, 209));  // After the crash began: not "before" it.
  }
};

TEST(CrashStep, WritesTheLogAndTheSummaryWithTheCpusLastEvents) {
  Boot b;
  const KernelFormats formats = Formats();
  TraceDatWriterInput writer;
  writer.header_page = formats.header_page;
  writer.cmdlines = "209 sh\n";
  const fs::path dir = fs::path(::testing::TempDir()) / ("crash-step-" + std::to_string(getpid()));
  fs::create_directories(dir);
  Result<BootLogResult> r = WriteBootKernelLog({&b.map, 0, &formats, &writer}, dir);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->file, "boot-0.kernel.log");
  const std::string log = ReadFile(dir / "boot-0.kernel.log");
  EXPECT_TRUE(log.starts_with("[    0.000000] Linux version 6.12.48+deb12-amd64\n")) << log;
  EXPECT_NE(log.find("[    0.000002] Kernel panic - not syncing: sysrq triggered crash\n"),
            std::string::npos);
  EXPECT_EQ(r->kernel_log["lines"], 8);
  EXPECT_EQ(r->kernel_log["source"], "console-events");
  const json& c = r->crash;
  ASSERT_TRUE(c.is_object());
  EXPECT_EQ(c["reason"], "sysrq triggered crash");
  EXPECT_EQ(c["task"], "sh");
  EXPECT_EQ(c["cpu"], 1);
  ASSERT_EQ(c["frames"].size(), 1u);
  EXPECT_EQ(c["frames"][0]["function"], "sysrq_handle_crash+0x1a/0x20");
  // The last kCrashEventsBefore of CPU 1 up to the panic line (the log's own
  // events left out), printed as trace-cmd prints them.
  const json& before = c["events_before"];
  ASSERT_EQ(before.size(), kCrashEventsBefore);
  EXPECT_EQ(before.back()["ts_ns"], 1024);
  // trace-cmd pads the event name: "tick:                 n=24".
  const std::string last = before.back()["line"];
  EXPECT_NE(last.find(" tick: "), std::string::npos) << last;
  EXPECT_TRUE(last.ends_with(" n=24")) << last;
  EXPECT_NE(before.back()["line"].get<std::string>().find("sh-209"), std::string::npos);
  fs::remove_all(dir);
}

TEST(CrashStep, ARingLogIsPreferredAndNoLogWritesNothing) {
  Boot b;
  const KernelFormats formats = Formats();
  KernelLog ring;
  ring.source = "printk-ring";
  ring.records.push_back({.seq = 1, .ts_ns = 5, .cpu = 0, .pid = 1, .text = "only line"});
  const fs::path dir = fs::path(::testing::TempDir()) / ("crash-ring-" + std::to_string(getpid()));
  fs::create_directories(dir);
  Result<BootLogResult> r =
      WriteBootKernelLog({&b.map, 0, &formats, nullptr, false, 0, &ring}, dir);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(ReadFile(dir / r->file), "[    0.000000] only line\n");
  EXPECT_EQ(r->kernel_log["source"], "printk-ring");
  EXPECT_TRUE(r->crash.is_null());
  BootMap empty;
  empty.cpu.resize(1);
  r = WriteBootKernelLog({&empty, 0, &formats}, dir / "none");
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->file.empty());
  fs::remove_all(dir);
}

}  // namespace
}  // namespace hvtrace::hostd
