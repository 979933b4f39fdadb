#include "boot_timeline.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <deque>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "host_trace_dat.h"
#include "hvtrace/page.h"
#include "hvtrace/tracedat_writer.h"
#include "test_support.h"

namespace hvtrace::hostd {
namespace {

namespace fs = std::filesystem;
using test_support::RunCommand;
using test_support::RunCommandStatus;
using test_support::TempDir;

constexpr uint64_t kRealtimeAtGuestZero = 1'795'554'620'000'000'000ull;
constexpr double kDriftPpm = 120.0;

const char kStatusFormat[] =
    "name: hvt_virtio_status\n"
    "ID: 1500\n"
    "format:\n"
    "\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n"
    "\tfield:unsigned char common_flags;\toffset:2;\tsize:1;\tsigned:0;\n"
    "\tfield:unsigned char common_preempt_count;\toffset:3;\tsize:1;\tsigned:0;\n"
    "\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;\n"
    "\n"
    "\tfield:unsigned long __probe_ip;\toffset:8;\tsize:8;\tsigned:0;\n"
    "\tfield:u8 status;\toffset:16;\tsize:1;\tsigned:0;\n"
    "\n"
    "print fmt: \"(%lx) status=%u\", REC->__probe_ip, REC->status\n";

struct Write {
  uint64_t guest_ns;
  uint32_t status;
  int device;
  uint32_t cpu;
};

// Three devices probed 1.3 s apart, each writing 1, 3, 11, 15; device 1's
// writes happen on CPU 1.
std::vector<Write> Writes() {
  std::vector<Write> w;
  for (int d = 0; d < 3; ++d) {
    uint64_t t = 2'000'000'000ull + 1'300'000'000ull * d;
    for (uint32_t v : {1u, 3u, 11u, 15u}) {
      t += 150'000;
      w.push_back({t, v, d, d == 1 ? 1u : 0u});
    }
  }
  return w;
}

uint64_t HostOf(uint64_t guest_ns) {
  return kRealtimeAtGuestZero + guest_ns + static_cast<uint64_t>(kDriftPpm * 1e-6 * guest_ns);
}

std::string Usec(uint64_t ns) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%llu.%06llu", static_cast<unsigned long long>(ns / 1000000000),
                static_cast<unsigned long long>(ns % 1000000000 / 1000));
  return buf;
}

// QEMU's log: resets and the firmware's handshake before the guest's
// (none for a kernel kexec started: |firmware| false), fw_cfg reads (not
// key/value text), then each guest write logged 5..60 µs later (rounded to
// µs as QEMU prints).
std::string QemuLog(const std::vector<Write>& writes, bool firmware = true) {
  std::ostringstream log;
  const uint64_t start = kRealtimeAtGuestZero - 800'000'000;
  log << "9793@" << Usec(start) << ":virtio_set_status vdev 0x5600000000a0 val 0\n";
  log << "9798@" << Usec(start + 1000) << ":fw_cfg_read 0x56473f29fa00 = 0x51\n";
  for (uint32_t v : {3u, 11u, 15u}) {
    if (!firmware) break;
    log << "9798@" << Usec(start + 300'000'000 + v * 1000)
        << ":virtio_set_status vdev 0x5600000000a0 val " << v << "\n";
  }
  std::mt19937_64 rng(7);
  std::uniform_int_distribution<uint64_t> lag(5'000, 60'000);
  for (const Write& w : writes) {
    log << "9798@" << Usec(HostOf(w.guest_ns) + lag(rng)) << ":virtio_set_status vdev 0x56000000"
        << w.device << "0a0 val " << w.status << "\n";
  }
  log << "9798@" << Usec(HostOf(9'000'000'000ull)) << ":pvpanic_ioport_write";
  return log.str();  // The last line is cut short (no line end): not an event.
}

const char kPrintFormat[] =
    "name: print\n"
    "ID: 5\n"
    "format:\n"
    "\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n"
    "\tfield:unsigned char common_flags;\toffset:2;\tsize:1;\tsigned:0;\n"
    "\tfield:unsigned char common_preempt_count;\toffset:3;\tsize:1;\tsigned:0;\n"
    "\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;\n"
    "\n"
    "\tfield:unsigned long ip;\toffset:8;\tsize:8;\tsigned:0;\n"
    "\tfield:char buf[];\toffset:16;\tsize:0;\tsigned:0;\n"
    "\n"
    "print fmt: \"%ps: %s\", (void *)REC->ip, REC->buf\n";

// The guest's boot file: the status writes as kprobe records; those of
// |early_device| as the hvtrace-early markers the guest writes later (at
// 9 s) for the writes of built-in drivers.
void WriteGuestBoot(const fs::path& path, const std::vector<Write>& writes, int early_device = -1) {
  TraceDatWriterInput in;
  in.header_page = kHostHeaderPage;
  in.header_event = kHostHeaderEvent;
  in.formats.push_back({"kprobes", kStatusFormat});
  in.formats.push_back({"ftrace", kPrintFormat});
  in.cmdlines = "85 modprobe\n";
  in.trace_clock = "local";
  std::deque<std::vector<std::byte>> pages;
  const PageLayout layout = PageLayout::Default();
  in.cpus.resize(2);
  for (uint32_t cpu = 0; cpu < 2; ++cpu) {
    std::optional<PageWriter> writer;
    for (const Write& w : writes) {
      if (w.cpu != cpu || w.device == early_device) continue;
      std::vector<std::byte> rec(24, std::byte{0});
      const uint16_t id = 1500;
      const int32_t pid = 85;
      const uint64_t ip = 0xffffffff81234560ull;
      std::memcpy(rec.data(), &id, 2);
      std::memcpy(rec.data() + 4, &pid, 4);
      std::memcpy(rec.data() + 8, &ip, 8);
      rec[16] = static_cast<std::byte>(w.status);
      if (!writer) {
        writer.emplace(pages.emplace_back(4096, std::byte{0}), layout, w.guest_ns);
        in.cpus[cpu].push_back(pages.back());
      }
      ASSERT_TRUE(writer->Append(w.guest_ns, rec));
    }
    for (const Write& w : writes) {
      if (cpu != 0 || w.device != early_device) continue;
      char text[160];
      std::snprintf(text, sizeof text,
                    "hvtrace-early: hvt_virtio_status ts=%llu.%06llu cpu=0 pid=1 status=%u "
                    "index=%d\n",
                    static_cast<unsigned long long>(w.guest_ns / 1000000000),
                    static_cast<unsigned long long>(w.guest_ns % 1000000000 / 1000), w.status,
                    w.device);
      std::vector<std::byte> rec(16 + std::strlen(text) + 1, std::byte{0});
      const uint16_t id = 5;
      std::memcpy(rec.data(), &id, 2);
      std::memcpy(rec.data() + 16, text, std::strlen(text));
      if (!writer) {
        writer.emplace(pages.emplace_back(4096, std::byte{0}), layout, 9'000'000'000ull);
        in.cpus[cpu].push_back(pages.back());
      }
      ASSERT_TRUE(writer->Append(9'000'000'000ull, rec));
    }
    if (writer) writer->Finish();
  }
  ASSERT_TRUE(WriteTraceDat(path.string(), in).ok());
}

// (side, status) of the handshake lines of trace-cmd's merged report.
std::vector<std::string> HandshakeOrder(const std::string& report) {
  std::vector<std::string> out;
  std::istringstream in(report);
  for (std::string line; std::getline(in, line);) {
    line.erase(0, line.find_first_not_of(' '));
    const bool host = line.starts_with("host.dat:");
    size_t at = line.find(host ? " val=" : " status=");
    if (at == std::string::npos) continue;
    out.push_back((host ? "host " : "guest ") + line.substr(line.find('=', at) + 1));
  }
  return out;
}

class BootTimelineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_FALSE(dir_.path().empty());
    WriteGuestBoot(dir_.path() / "boot-0.trace.dat", Writes());
    out_ = BuildBootTimeline(dir_.path(), QemuLog(Writes()));
  }
  TempDir dir_{"boot_timeline_test"};
  BootTimelineOutput out_;
};

TEST_F(BootTimelineTest, FitsTheClockAndRecordsIt) {
  const nlohmann::json& t = out_.timeline;
  ASSERT_TRUE(t.value("aligned", false)) << t.dump(2);
  EXPECT_EQ(t["clock"], "host CLOCK_REALTIME");
  EXPECT_EQ(t["pairs"], 12);
  EXPECT_EQ(t["unpaired_guest"], 0);
  EXPECT_EQ(t["unpaired_host"], 4);  // The reset and the firmware's handshake.
  EXPECT_FALSE(t["thin"].get<bool>()) << t["why"];
  EXPECT_NEAR(t["drift_ppm"].get<double>(), kDriftPpm, 25.0);
  // Lags were 5..60 µs, rounded to µs by QEMU's log.
  // QEMU rounds to µs and the fitted drift is off by a few ppm.
  EXPECT_LT(t["error_bound_ns"].get<uint64_t>(), 70'000u);
  EXPECT_EQ(t["host"]["events"], 17);
  EXPECT_EQ(t["host"]["malformed_lines"], 1);
  EXPECT_NE(t["agent_clock_sync"].get<std::string>().find("not used"), std::string::npos);
  EXPECT_EQ(out_.files, (std::vector<std::string>{"host.dat", "boot-0.host-clock.dat"}));
  std::printf("timeline: %s\n", t.dump().c_str());
}

// The real trace-cmd merges the two files with every guest write right
// before QEMU's handling of it.
TEST_F(BootTimelineTest, TraceCmdMergesGuestWriteBeforeHostHandling) {
  const test_support::CommandResult r =
      RunCommandStatus("cd " + dir_.path().string() +
                       " && trace-cmd report -i host.dat -i boot-0.host-clock.dat 2>&1");
  ASSERT_EQ(r.status, 0) << r.out;
  const std::vector<std::string> order = HandshakeOrder(r.out);
  std::vector<std::string> want = {"host 0", "host 3", "host 11", "host 15"};
  for (const Write& w : Writes()) {
    want.push_back("guest " + std::to_string(w.status));
    want.push_back("host " + std::to_string(w.status));
  }
  EXPECT_EQ(order, want) << r.out;
  // QEMU's text arguments stay text; numbers print as QEMU wrote them.
  EXPECT_NE(r.out.find("fw_cfg_read:"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("0x56473f29fa00 = 0x51"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("vdev=0x5600000000a0 val=3"), std::string::npos) << r.out;
}

// `hvtrace show --timeline` prints the same events in the same order as
// trace-cmd's merge, each with its side.
TEST_F(BootTimelineTest, ShowTimelineMatchesTraceCmdOrder) {
  std::ofstream(dir_.path() / "manifest.json")
      << nlohmann::json{{"id", "t"}, {"extra", {{"timeline", out_.timeline}}}}.dump();
  const test_support::CommandResult show = RunCommandStatus(
      std::string(HVTRACE_BIN_DIR) + "/hvtrace show " + dir_.path().string() + " --timeline");
  ASSERT_EQ(show.status, 0) << show.out;
  const std::string report = RunCommand(
      "cd " + dir_.path().string() + " && trace-cmd report -i host.dat -i boot-0.host-clock.dat");
  std::vector<std::string> from_show;
  std::istringstream s(show.out);
  for (std::string line; std::getline(s, line);) {
    if (line.starts_with("#")) continue;
    std::istringstream f(line);
    std::string secs, rel, side;
    f >> secs >> rel >> side;
    const size_t colon = line.find(": ", line.find('['));
    const std::string event = line.substr(line.find(']') + 2, colon - line.find(']') - 2);
    from_show.push_back((side == "host" ? "host.dat " : "boot-0.host-clock.dat ") + event);
  }
  const std::vector<std::string> from_trace_cmd = test_support::TraceCmdOrder(report);
  EXPECT_EQ(from_show.size(), 17u + 12u) << show.out;
  EXPECT_EQ(from_show, from_trace_cmd) << show.out << "\n---\n" << report;
  EXPECT_NE(show.out.find("# boot 0: offset"), std::string::npos) << show.out;
  std::printf("%s", show.out.c_str());
}

// The writes of a built-in driver reach the boot instance as markers with
// their original time in the text: they pair like the kprobe records.
TEST(BootTimeline, EarlyMarkersArePaired) {
  TempDir dir("boot_timeline_test");
  WriteGuestBoot(dir.path() / "boot-0.trace.dat", Writes(), /*early_device=*/0);
  const BootTimelineOutput out = BuildBootTimeline(dir.path(), QemuLog(Writes()));
  ASSERT_TRUE(out.timeline.value("aligned", false)) << out.timeline.dump(2);
  EXPECT_EQ(out.timeline["pairs"], 12);
  EXPECT_EQ(out.timeline["boots"][0]["fit"]["early_writes"], 4);
  EXPECT_LT(out.timeline["error_bound_ns"].get<uint64_t>(), 70'000u);
}

// After kexec the range keeps little of the boot before: here two of its
// writes (11, 15 of one device). Their spacing matches each device of the
// kexec'ed boot as well as their own handling; an older boot's handshakes
// were all handled before the newer boot's first, so they pair with their
// own (the debian13 kexec e2e test placed such a boot 80 s late).
TEST(BootTimeline, AnOlderBootPairsOnlyWithHandlingsBeforeTheNewerOnes) {
  TempDir dir("boot_timeline_test");
  constexpr uint64_t kOlderHostAtZero = kRealtimeAtGuestZero - 90'000'000'000ull;
  const std::vector<Write> older = {{5'000'000'000ull, 11, 0, 0}, {5'000'150'000ull, 15, 0, 0}};
  WriteGuestBoot(dir.path() / "boot-0.trace.dat", older);
  WriteGuestBoot(dir.path() / "boot-1.trace.dat", Writes());
  std::ostringstream log;
  for (const Write& w : older) {
    log << "9798@" << Usec(kOlderHostAtZero + w.guest_ns + 20'000)
        << ":virtio_set_status vdev 0x5600000000a0 val " << w.status << "\n";
  }
  const BootTimelineOutput out =
      BuildBootTimeline(dir.path(), log.str() + QemuLog(Writes(), /*firmware=*/false));
  const nlohmann::json& boots = out.timeline["boots"];
  ASSERT_EQ(boots.size(), 2u) << out.timeline.dump(2);
  const nlohmann::json& fit = boots[0]["fit"];
  ASSERT_TRUE(fit.value("aligned", false)) << fit.dump(2);
  EXPECT_EQ(fit["pairs"], 2) << fit.dump(2);
  // Placed where its own handlings are, not 90 s later among the next boot's.
  const int64_t want = static_cast<int64_t>(kOlderHostAtZero);
  EXPECT_LT(std::llabs(fit["offset_ns"].get<int64_t>() - want), 1'000'000) << fit.dump(2);
  EXPECT_EQ(out.timeline["boot"], 1);
  EXPECT_EQ(out.timeline["pairs"], 12);
  EXPECT_EQ(out.files, (std::vector<std::string>{"host.dat", "boot-0.host-clock.dat",
                                                 "boot-1.host-clock.dat"}));
}

TEST(BootTimeline, NoGuestProbeMeansNothingAligned) {
  TempDir dir("boot_timeline_test");
  TraceDatWriterInput in;
  in.header_page = kHostHeaderPage;
  in.header_event = kHostHeaderEvent;
  in.cpus.resize(1);
  ASSERT_TRUE(WriteTraceDat((dir.path() / "boot-0.trace.dat").string(), in).ok());
  const BootTimelineOutput out = BuildBootTimeline(dir.path(), QemuLog(Writes()));
  EXPECT_FALSE(out.timeline.value("aligned", true));
  EXPECT_NE(out.timeline["why"].get<std::string>().find("hvt_virtio_status"), std::string::npos)
      << out.timeline.dump(2);
  EXPECT_EQ(out.files, std::vector<std::string>{"host.dat"});
  EXPECT_FALSE(fs::exists(dir.path() / "boot-0.host-clock.dat"));
}

TEST(BootTimeline, Malicious_GarbageLogStillWritesWhatItCan) {
  TempDir dir("boot_timeline_test");
  WriteGuestBoot(dir.path() / "boot-0.trace.dat", Writes());
  std::string garbage = "\x01\x02zz@@::\n" + std::string(10000, 'x') + "\n1@1.000001:a" +
                        std::string(5000, ' ') + "b c d\n1@99999999999999999999.000000:x\n";
  const BootTimelineOutput out = BuildBootTimeline(dir.path(), garbage);
  EXPECT_FALSE(out.timeline.value("aligned", true));
  EXPECT_GE(out.timeline["host"]["malformed_lines"].get<uint64_t>(), 3u);
  EXPECT_EQ(RunCommandStatus("trace-cmd report -i " + (dir.path() / "host.dat").string() +
                             " >/dev/null 2>&1")
                .status,
            0);
}

}  // namespace
}  // namespace hvtrace::hostd
