// The fixture the capture pipeline tests share: the real boot_map fixtures
// (a 6.12.95 guest's 16 MiB persistent ring buffer, and one holding two boots
// after a kexec), their formats, and the trace-cmd and `hvtrace show` runners.
#ifndef HVTRACE_TESTS_UNIT_CAPTURE_PIPELINE_FIXTURE_H_
#define HVTRACE_TESTS_UNIT_CAPTURE_PIPELINE_FIXTURE_H_

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zstd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "capture_pipeline.h"
#include "capture_store.h"
#include "hvtrace/page.h"
#include "hvtrace/tracedat.h"

namespace hvtrace::hostd {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const std::string kDir = std::string(HVTRACE_FIXTURES_DIR) + "/boot_map/";

[[maybe_unused]] std::string ReadText(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

[[maybe_unused]] std::vector<std::byte> Unzstd(const std::string& path) {
  const std::string packed = ReadText(path);
  const unsigned long long size = ZSTD_getFrameContentSize(packed.data(), packed.size());
  if (size == ZSTD_CONTENTSIZE_ERROR || size == ZSTD_CONTENTSIZE_UNKNOWN) return {};
  std::vector<std::byte> out(size);
  const size_t n = ZSTD_decompress(out.data(), out.size(), packed.data(), packed.size());
  if (ZSTD_isError(n) || n != size) return {};
  return out;
}

[[maybe_unused]] std::string UnzstdText(const std::string& path) {
  std::vector<std::byte> b = Unzstd(path);
  return std::string(reinterpret_cast<const char*>(b.data()), b.size());
}

struct CmdRun {
  int status = -1;
  std::string out;
};
[[maybe_unused]] CmdRun RunCommand(const std::string& cmd) {
  CmdRun r;
  FILE* p = popen((cmd + " 2>/dev/null").c_str(), "r");
  if (p == nullptr) return r;
  char buf[65536];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) r.out.append(buf, n);
  const int status = pclose(p);
  r.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

[[maybe_unused]] std::vector<std::string> Lines(const std::string& text,
                                                bool drop_comments = false) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (drop_comments && !line.empty() && line[0] == '#') continue;
    lines.push_back(line);
  }
  return lines;
}

[[maybe_unused]] std::string Hvtrace() { return std::string(HVTRACE_BIN_DIR) + "/hvtrace"; }

// One event, as the guest's trace file or trace-cmd's report shows it.
struct Event {
  int cpu = 0;
  int pid = 0;
  std::string usecs;  // "12.345678"
  std::string name;   // "sched_switch"
  std::string text;   // What follows "name: ", spaces collapsed.
  bool operator==(const Event&) const = default;
};
[[maybe_unused]] std::ostream& operator<<(std::ostream& os, const Event& e) {
  return os << "[" << e.cpu << "] pid " << e.pid << " " << e.usecs << " " << e.name << ": "
            << e.text;
}

[[maybe_unused]] std::string Collapse(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == ' ' && (out.empty() || out.back() == ' ')) continue;
    out += c;
  }
  while (!out.empty() && out.back() == ' ') out.pop_back();
  return out;
}

// A sched_switch prev_state letter as compared: R, S and D mean the same in
// the kernel and in libtraceevent's plugin; other letters do not.
[[maybe_unused]] std::string PluginState(const std::string& state) {
  return state == "R" || state == "S" || state == "D" ? state : "?";
}

// The guest's instances/boot_map/trace:
//   "          <idle>-0       [000] d.h2.     0.000000: irq_handler_entry: irq=0 name=timer"
[[maybe_unused]] std::map<int, std::vector<Event>> GuestEvents(const std::string& text) {
  static const std::regex kLine(
      R"(^\s*.+-(\d+)\s+\[(\d+)\]\s+\S+\s+(\d+\.\d{6}): ([a-z_0-9]+): ?(.*)$)");
  std::map<int, std::vector<Event>> out;
  for (const std::string& line : Lines(text)) {
    if (line.empty() || line[0] == '#') continue;
    std::smatch m;
    if (!std::regex_match(line, m, kLine)) {
      ADD_FAILURE() << "unparsed guest line: " << line;
      continue;
    }
    Event e{std::stoi(m[2]), std::stoi(m[1]), m[3], m[4], Collapse(m[5])};
    // Allowed difference: trace-cmd prints sched_switch through
    // libtraceevent's sched_switch plugin, "A:1 [120] S ==> B:2 [120]",
    // where the kernel prints its print fmt ("prev_comm=A prev_pid=1 ...").
    // The plugin's state letter has no "+" (preempted), and past R, S and D
    // its letters follow an older kernel's task-state bits (the guest's P,
    // X, I come out as x, Z, W): those states are compared as "?" (the
    // raw prev_state bits are checked through the JSON output elsewhere).
    static const std::regex kSwitch(
        R"(^prev_comm=(.*) prev_pid=(\d+) prev_prio=(\d+) prev_state=(\S+) ==> )"
        R"(next_comm=(.*) next_pid=(\d+) next_prio=(\d+)$)");
    std::smatch sw;
    if (e.name == "sched_switch" && std::regex_match(e.text, sw, kSwitch)) {
      std::string state = sw[4];
      if (state.ends_with("+")) state.pop_back();
      state = PluginState(state);
      e.text = std::string(sw[1]) + ":" + std::string(sw[2]) + " [" + std::string(sw[3]) + "] " +
               state + " ==> " + std::string(sw[5]) + ":" + std::string(sw[6]) + " [" +
               std::string(sw[7]) + "]";
    }
    // Allowed difference (kexec fixture): the kernel prints a previous
    // boot's print events with the raw ip ("0xffff...: text").
    if (e.name.starts_with("0x")) e.name = "tracing_mark_write";
    out[e.cpu].push_back(e);
  }
  return out;
}

// The same event, comparing only cpu, pid, time and name.
[[maybe_unused]] bool SameKey(const Event& a, const Event& b) {
  return a.cpu == b.cpu && a.pid == b.pid && a.usecs == b.usecs && a.name == b.name;
}

// trace-cmd report, with the latency column from trace-cmd 3.3 (Debian 13) on
// ("[000] d.h2.     0.000000:"), without it in 3.1 (Debian 12):
//   "          <idle>-0     [000]     0.000000: irq_handler_entry:    irq=0 name=timer"
//   "           <...>-215   [001]    12.000000: print:                tracing_mark_write: m"
[[maybe_unused]] std::map<int, std::vector<Event>> ReportEvents(const std::string& text,
                                                                std::set<std::string>* comms) {
  static const std::regex kLine(
      R"(^\s*(.+)-(\d+)\s+\[(\d+)\]\s+(?:\S{5,6}\s+)?(\d+\.\d{6}): ([a-z_0-9]+): ?(.*)$)");
  std::map<int, std::vector<Event>> out;
  for (const std::string& line : Lines(text)) {
    if (line.empty() || line[0] == '#' || line.starts_with("cpus=")) continue;
    // "CPU:0 [EVENTS DROPPED]": a page after lost events (a bad page, or the
    // kernel's own missed flag); not an event.
    static const std::regex kDropped(R"(^CPU:\d+ \[(\d+ )?EVENTS DROPPED\]$)");
    if (std::regex_match(line, kDropped)) continue;
    std::smatch m;
    if (!std::regex_match(line, m, kLine)) {
      ADD_FAILURE() << "unparsed report line: " << line;
      continue;
    }
    if (comms) comms->insert(m[1]);
    Event e{std::stoi(m[3]), std::stoi(m[2]), m[4], m[5], Collapse(m[6])};
    static const std::regex kSwitch(R"(^(.*:\d+ \[\d+\]) (\S+) ==> (.*)$)");
    std::smatch sw;
    if (e.name == "sched_switch" && std::regex_match(e.text, sw, kSwitch)) {
      e.text = std::string(sw[1]) + " " + PluginState(sw[2]) + " ==> " + std::string(sw[3]);
    }
    // Allowed difference: the guest's trace file names the ftrace print
    // event by its function ("tracing_mark_write: text"); trace-cmd prints
    // the event name first ("print: tracing_mark_write: text").
    if (e.name == "print") {
      const size_t colon = e.text.find(": ");
      if (colon != std::string::npos) {
        e.name = e.text.substr(0, colon);
        e.text = e.text.substr(colon + 2);
        // Allowed difference (kexec fixture, boot 0): the kallsyms are the
        // last boot's; the first kernel ran at another KASLR offset, so its
        // print ip has no symbol and trace-cmd prints the address.
        if (e.name.starts_with("0x")) e.name = "tracing_mark_write";
      }
    }
    out[e.cpu].push_back(e);
  }
  return out;
}

class CapturePipelineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    tmp_ = fs::temp_directory_path() /
           ("hvtrace-cpipe-" + std::to_string(getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(tmp_);
    fs::create_directories(tmp_);
    range_ = Unzstd(kDir + "region.bin.zst");
    ASSERT_EQ(range_.size(), 16u << 20);
    auto formats = KernelFormatsFromDirectory(kDir);
    ASSERT_TRUE(formats.ok()) << formats.error().message;
    formats_ = std::move(*formats);
  }
  void TearDown() override {
    if (std::getenv("HVTRACE_KEEP_TMP") == nullptr) fs::remove_all(tmp_);
  }

  // Runs the pipeline on |range| into a committed capture.
  struct Captured {
    CaptureResult result;
    fs::path dir;
    json manifest;
  };
  Captured Capture(std::span<const std::byte> range, const KernelFormats& formats) {
    Captured c;
    CaptureStore store(tmp_ / "captures");
    auto pending = store.Begin("panic", HostTime::Now());
    EXPECT_TRUE(pending.ok()) << pending.error().message;
    if (!pending.ok()) return c;
    CaptureManifest manifest;
    manifest.vm = "fixture";
    manifest.trigger = "panic";
    auto result = BuildBootMapCapture(range, formats, {}, **pending, manifest);
    EXPECT_TRUE(result.ok()) << result.error().message;
    if (!result.ok()) return c;
    c.result = std::move(*result);
    auto entry = (*pending)->Commit(std::move(manifest));
    EXPECT_TRUE(entry.ok()) << entry.error().message;
    if (!entry.ok()) return c;
    c.dir = entry->dir;
    c.manifest = json::parse(ReadText(c.dir / "manifest.json"));
    return c;
  }

  static size_t CountEvents(const std::map<int, std::vector<Event>>& events) {
    size_t n = 0;
    for (const auto& [cpu, list] : events) n += list.size();
    return n;
  }

  // Offsets in the fixture (2 CPUs, 16 MiB: 8 MiB chunks).
  static constexpr uint64_t kCpu1 = 0x800000;
  static constexpr uint64_t kBuffers = 56;
  void Put32(uint64_t off, uint32_t v) { std::memcpy(range_.data() + off, &v, 4); }
  void Put64(uint64_t off, uint64_t v) { std::memcpy(range_.data() + off, &v, 8); }

  static bool HasIssue(const json& manifest, int cpu, const std::string& check) {
    for (const json& i : manifest["validation"]["issues"]) {
      if (i["cpu"] == cpu && i["check"] == check) return true;
    }
    return false;
  }
  static uint64_t BadPages(const json& manifest, int cpu, const std::string& reason) {
    for (const json& c : manifest["cpus"]) {
      if (c["cpu"] == cpu && c["bad_pages"].contains(reason)) return c["bad_pages"][reason];
    }
    return 0;
  }

  // trace-cmd's event count per CPU for a file.
  static std::map<int, size_t> TraceCmdCounts(const fs::path& file) {
    CmdRun r = RunCommand("trace-cmd report -i '" + file.string() + "'");
    EXPECT_EQ(r.status, 0) << file;
    std::map<int, size_t> counts;
    for (const auto& [cpu, list] : ReportEvents(r.out, nullptr)) counts[cpu] = list.size();
    return counts;
  }
  static std::map<int, size_t> ResultCounts(const CaptureResult& r, uint32_t boot = 0) {
    std::map<int, size_t> counts;
    for (size_t i = 0; i < r.boots[boot].events_per_cpu.size(); ++i) {
      if (r.boots[boot].events_per_cpu[i] != 0)
        counts[static_cast<int>(i)] = r.boots[boot].events_per_cpu[i];
    }
    return counts;
  }

  fs::path tmp_;
  std::vector<std::byte> range_;
  KernelFormats formats_;
};

}  // namespace
}  // namespace hvtrace::hostd

#endif  // HVTRACE_TESTS_UNIT_CAPTURE_PIPELINE_FIXTURE_H_
