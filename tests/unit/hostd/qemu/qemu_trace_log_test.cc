#include "qemu_trace_log.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>

namespace hvtrace::hostd {
namespace {

std::string ReadFixture(const std::string& name) {
  const auto path = std::filesystem::path(HVTRACE_FIXTURES_DIR) / "qemu_trace" / name;
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string Arg(const QemuTraceEvent& e, const std::string& key) {
  for (const auto& [k, v] : e.args) {
    if (k == key) return v;
  }
  return "<none>";
}

TEST(QemuTraceLogTest, ParsesKeyValueLine) {
  QemuTraceLog log =
      ParseQemuTraceLog("12345@1732480000.123456:virtio_set_status vdev 0x55d0c0a8e1f0 val 3\n");
  ASSERT_EQ(log.events.size(), 1u);
  EXPECT_EQ(log.malformed_lines, 0u);
  EXPECT_EQ(log.first_problem, "");
  const QemuTraceEvent& e = log.events[0];
  EXPECT_EQ(e.tid, 12345u);
  EXPECT_EQ(e.realtime_ns, 1732480000123456000ull);
  EXPECT_EQ(e.name, "virtio_set_status");
  ASSERT_EQ(e.args.size(), 2u);
  EXPECT_EQ(e.args[0], (std::pair<std::string, std::string>{"vdev", "0x55d0c0a8e1f0"}));
  EXPECT_EQ(e.args[1], (std::pair<std::string, std::string>{"val", "3"}));
}

TEST(QemuTraceLogTest, TextThatIsNotPairsIsOneArgWithEmptyKey) {
  QemuTraceLog log = ParseQemuTraceLog(
      "8944@1795554574.478888:fw_cfg_select 0x559cc0d11c70 key 0x0000 'signature', ret: 1\n"
      "8949@1795554574.518220:fw_cfg_read 0x559cc0d11c70 = 0x51\n"
      "8949@1795554574.499149:pci_cfg_write i440FX 00:00.0 @0x58 <- 0x33333000\n"
      "1@1.000000:no_args_event\n");
  ASSERT_EQ(log.events.size(), 4u) << log.first_problem;
  EXPECT_EQ(log.events[0].args, (std::vector<std::pair<std::string, std::string>>{
                                    {"", "0x559cc0d11c70 key 0x0000 'signature', ret: 1"}}));
  EXPECT_EQ(log.events[1].args,
            (std::vector<std::pair<std::string, std::string>>{{"", "0x559cc0d11c70 = 0x51"}}));
  EXPECT_EQ(log.events[2].args[0].second, "i440FX 00:00.0 @0x58 <- 0x33333000");
  EXPECT_TRUE(log.events[3].args.empty());
  EXPECT_EQ(log.events[3].realtime_ns, 1'000'000'000ull);
}

// A real log: QEMU 7.2 (Debian) booting the 6.12 guest under TCG with a
// virtio-blk, a virtio-net and a virtio-serial device and hvtrace's event
// list, under the seccomp sandbox, until the guest was ready, then quit.
TEST(QemuTraceLogTest, RealBootLog) {
  const std::string text = ReadFixture("boot-6.12-tcg.log");
  ASSERT_FALSE(text.empty());
  QemuTraceLog log = ParseQemuTraceLog(text);
  EXPECT_EQ(log.malformed_lines, 0u) << log.first_problem;
  EXPECT_EQ(log.dropped_lines, 0u);
  ASSERT_EQ(log.events.size(), 529u);
  std::map<std::string, int> by_name;
  std::map<std::string, std::vector<std::string>> status_by_vdev;
  uint64_t last = 0;
  for (const QemuTraceEvent& e : log.events) {
    ++by_name[e.name];
    EXPECT_GE(e.realtime_ns, last) << e.name;  // One clock, written in order.
    last = e.realtime_ns;
    if (e.name == "virtio_set_status") status_by_vdev[Arg(e, "vdev")].push_back(Arg(e, "val"));
  }
  EXPECT_EQ(by_name["fw_cfg_read"], 63);
  EXPECT_EQ(by_name["fw_cfg_select"], 37);
  EXPECT_EQ(by_name["virtio_set_status"], 61);
  EXPECT_EQ(by_name["pci_cfg_write"], 365);
  // Three virtio devices; the virtio-serial one (driven by the built-in
  // virtio_console) walks 1 -> 3 -> 11 -> 15.
  ASSERT_EQ(status_by_vdev.size(), 3u);
  int reached_driver_ok = 0;
  for (const auto& [vdev, vals] : status_by_vdev) {
    EXPECT_NE(std::find(vals.begin(), vals.end(), "1"), vals.end()) << vdev;
    reached_driver_ok += std::find(vals.begin(), vals.end(), "15") != vals.end();
  }
  EXPECT_GE(reached_driver_ok, 1);
}

TEST(QemuTraceLogTest, Malicious_OverlongLineIsSkipped) {
  std::string text = "1@1.000001:" + std::string(kQemuTraceMaxLine, 'a') + "\n";
  text += "2@1.000002:virtio_set_status vdev 0x1 val 1\n";
  QemuTraceLog log = ParseQemuTraceLog(text);
  ASSERT_EQ(log.events.size(), 1u);
  EXPECT_EQ(log.events[0].tid, 2u);
  EXPECT_EQ(log.malformed_lines, 1u);
  EXPECT_EQ(log.first_problem, "line 1: longer than 4096 bytes");
}

TEST(QemuTraceLogTest, Malicious_BinaryAndControlBytes) {
  std::string text;
  text += std::string("1@1.000001:virtio_set_status vdev 0x1 val ") + '\0' + " 1\n";
  text += "1@1.000002:virtio_set_status vdev 0x1 val \x1b[2J\n";
  text += "1@1.000003:virtio_set_status vdev \xff\xfe val 1\n";
  text += "1@1.000004:virtio_set_status vdev 0x1 val 1\r\n";
  text += "1@1.000005:virtio_set_status vdev 0x1 val 3\n";
  QemuTraceLog log = ParseQemuTraceLog(text);
  ASSERT_EQ(log.events.size(), 1u);
  EXPECT_EQ(log.events[0].realtime_ns, 1'000'005'000ull);
  EXPECT_EQ(log.malformed_lines, 4u);
  EXPECT_EQ(log.first_problem, "line 1: holds a control or non-ASCII byte");
}

TEST(QemuTraceLogTest, Malicious_BadPrefixes) {
  const char* bad[] = {
      "",                                    // Empty line.
      "virtio_set_status vdev 0x1 val 1",    // No TID@time: (timestamps off).
      "x@1.000001:ev",                       // TID not a number.
      "99999999999@1.000001:ev",             // TID beyond 32 bits.
      "-1@1.000001:ev",                      // Signed.
      "1@1.0001:ev",                         // Not 6 digits of µs.
      "1@1.0000011:ev",                      // 7 digits.
      "1@.000001:ev",                        // No seconds.
      "1@1000000000000000000000.000001:ev",  // Beyond 64 bits.
      "1@18446744073.000001:ev",             // Fits u64 s, not u64 ns.
      "1@1.000001",                          // No ':'.
      "1@1.000001:",                         // No name.
      "1@1.000001: ev",                      // No name.
      "1@1.000001:ev(x)",                    // Name then junk.
      "1@1.000001x:ev",                      // Junk in time.
  };
  std::string text;
  for (const char* line : bad) text += std::string(line) + "\n";
  text += "7@2.500000:fw_cfg_read 0x1 = 0x51\n";
  QemuTraceLog log = ParseQemuTraceLog(text);
  ASSERT_EQ(log.events.size(), 1u) << log.first_problem;
  EXPECT_EQ(log.events[0].realtime_ns, 2'500'000'000ull);
  EXPECT_EQ(log.malformed_lines, std::size(bad));
  EXPECT_EQ(log.first_problem.rfind("line 1: ", 0), 0u) << log.first_problem;
}

TEST(QemuTraceLogTest, LargestTimeThatFits) {
  QemuTraceLog log = ParseQemuTraceLog("1@18446744072.999999:ev\n");
  ASSERT_EQ(log.events.size(), 1u) << log.first_problem;
  EXPECT_EQ(log.events[0].realtime_ns, 18446744072999999000ull);
}

TEST(QemuTraceLogTest, Malicious_LastLineWithoutEndIsNotTrusted) {
  // "val 1" may be the start of "val 15" QEMU was still writing.
  QemuTraceLog log = ParseQemuTraceLog(
      "1@1.000001:virtio_set_status vdev 0x1 val 11\n"
      "1@1.000002:virtio_set_status vdev 0x1 val 1");
  ASSERT_EQ(log.events.size(), 1u);
  EXPECT_EQ(log.malformed_lines, 1u);
  EXPECT_EQ(log.first_problem, "line 2: no line end (cut short while QEMU wrote it)");
}

TEST(QemuTraceLogTest, Malicious_TooManyEventsAreDroppedNotParsed) {
  std::string text;
  const std::string line = "1@1.000001:e\n";
  text.reserve(line.size() * (kQemuTraceMaxEvents + 3));
  for (size_t i = 0; i < kQemuTraceMaxEvents + 3; ++i) text += line;
  QemuTraceLog log = ParseQemuTraceLog(text);
  EXPECT_EQ(log.events.size(), kQemuTraceMaxEvents);
  EXPECT_EQ(log.dropped_lines, 3u);
  EXPECT_EQ(log.malformed_lines, 0u);
  EXPECT_NE(log.first_problem.find("dropped (3)"), std::string::npos) << log.first_problem;
}

TEST(QemuTraceLogTest, EmptyInput) {
  QemuTraceLog log = ParseQemuTraceLog("");
  EXPECT_TRUE(log.events.empty());
  EXPECT_EQ(log.malformed_lines, 0u);
  EXPECT_EQ(log.first_problem, "");
}

}  // namespace
}  // namespace hvtrace::hostd
