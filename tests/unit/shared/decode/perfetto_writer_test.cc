#include "hvtrace/perfetto_writer.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "hvtrace/output.h"
#include "shared/decode/perfetto_reader.h"
#include "test_support.h"

namespace hvtrace {
namespace {

const std::string kFixtures = HVTRACE_FIXTURES_DIR;

// Exports |files| (each one boot) into |out| and returns the file's bytes.
std::string Export(const std::vector<std::string>& files, const std::string& out,
                   PerfettoCounts* counts) {
  const int fd = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  EXPECT_GE(fd, 0);
  {
    PerfettoTraceWriter w(fd);
    w.WriteSystemInfo("6.12.9-test", 2, "vm1");
    for (size_t i = 0; i < files.size(); ++i) {
      Result<ReportStats> stats =
          w.WriteGuestFile(files[i], {.name = "guest boot " + std::to_string(i)}, counts);
      EXPECT_TRUE(stats.ok()) << (stats.ok() ? "" : stats.error().message);
    }
    EXPECT_TRUE(w.Finish().ok());
  }
  ::close(fd);
  return test_support::ReadText(out);
}

// What `hvtrace show --json` says of |path|: each event's name, and the
// markers' times and text in time order.
struct JsonView {
  std::map<std::string, uint64_t> counts;
  std::vector<std::pair<uint64_t, std::string>> markers;
  uint64_t events = 0;
};
JsonView JsonOf(const std::string& path) {
  JsonView v;
  ReportOptions options;
  options.format = OutputFormat::kJson;
  options.time_names = true;
  Result<ReportStats> stats = ForEachReportLine(path, options, [&](uint64_t, std::string_view l) {
    const nlohmann::json j = nlohmann::json::parse(l);
    const std::string name = j["event"].is_string() ? j["event"].get<std::string>() : "";
    v.counts[name.empty() ? "hvtrace_unknown_event" : name]++;
    if (name == "print") v.markers.push_back({j["ts_ns"], j["fields"]["buf"].get<std::string>()});
    v.events++;
    return true;
  });
  EXPECT_TRUE(stats.ok());
  return v;
}

// The fixture |name| exported and read back.
test::ReadTrace ExportFixture(const std::string& name) {
  test_support::TempDir dir;
  PerfettoCounts counts;
  return test::ReadPerfettoTrace(
      Export({kFixtures + "/tracedat/" + name}, (dir.path() / "t.pftrace").string(), &counts));
}

class PerfettoRealTrace : public ::testing::TestWithParam<const char*> {};

TEST_P(PerfettoRealTrace, CountsAndMarkersEqualTheReport) {
  test_support::TempDir dir;
  const std::string dat = kFixtures + "/tracedat/" + GetParam();
  PerfettoCounts counts;
  const std::string file = Export({dat}, (dir.path() / "t.pftrace").string(), &counts);
  const test::ReadTrace t = test::ReadPerfettoTrace(file);
  ASSERT_TRUE(t.ok) << t.error;
  const JsonView json = JsonOf(dat);
  ASSERT_GT(json.events, 1000u);
  std::map<std::string, uint64_t> read;
  // Bundles are per CPU: the file's order is not the report's, their times are.
  std::vector<std::pair<uint64_t, std::string>> markers;
  for (const test::ReadEvent& e : t.events) {
    read[e.kind]++;
    if (e.kind == "print") markers.push_back({e.ts, e.strings.at("buf")});
  }
  std::stable_sort(markers.begin(), markers.end());
  EXPECT_EQ(read, json.counts);
  EXPECT_EQ(t.events.size(), json.events);
  EXPECT_EQ(counts.events, json.events);
  EXPECT_EQ(markers, json.markers);
  EXPECT_FALSE(markers.empty());
  // The typed events are typed, not generic.
  for (const test::ReadEvent& e : t.events) {
    if (e.kind == "sched_switch" || e.kind == "sched_waking" || e.kind == "print") {
      EXPECT_FALSE(e.generic) << e.kind;
    }
  }
}

TEST_P(PerfettoRealTrace, PerCpuTimestampsNeverGoBack) {
  const test::ReadTrace t = ExportFixture(GetParam());
  ASSERT_TRUE(t.ok) << t.error;
  std::map<std::pair<uint32_t, uint32_t>, uint64_t> last;  // (sequence, cpu) -> ts
  size_t checked = 0;
  for (const test::ReadEvent& e : t.events) {
    auto [it, fresh] = last.try_emplace({e.sequence, e.cpu}, e.ts);
    if (!fresh) {
      EXPECT_GE(e.ts, it->second) << "cpu " << e.cpu;
      it->second = e.ts;
      checked++;
    }
  }
  EXPECT_GT(checked, 1000u);
  EXPECT_GE(last.size(), 2u);  // Both CPUs of the fixture.
}

TEST_P(PerfettoRealTrace, EverySchedSwitchCarriesBothComms) {
  const test::ReadTrace t = ExportFixture(GetParam());
  ASSERT_TRUE(t.ok) << t.error;
  size_t switches = 0;
  for (const test::ReadEvent& e : t.events) {
    if (e.kind != "sched_switch") continue;
    switches++;
    EXPECT_FALSE(e.strings.count("prev_comm") == 0 || e.strings.at("prev_comm").empty());
    EXPECT_FALSE(e.strings.count("next_comm") == 0 || e.strings.at("next_comm").empty());
  }
  EXPECT_GT(switches, 10u);
}

TEST_P(PerfettoRealTrace, SystemInfoFirstAndProtocAcceptsTheFile) {
  test_support::TempDir dir;
  PerfettoCounts counts;
  const std::string path = (dir.path() / "t.pftrace").string();
  const std::string file = Export({kFixtures + "/tracedat/" + GetParam()}, path, &counts);
  const test::ReadTrace t = test::ReadPerfettoTrace(file);
  ASSERT_TRUE(t.ok) << t.error;
  EXPECT_TRUE(t.system_info_first);
  EXPECT_EQ(t.release, "6.12.9-test");
  EXPECT_EQ(t.num_cpus, 2u);
  EXPECT_EQ(t.track_names, std::vector<std::string>{"guest boot 0"});
  EXPECT_GE(t.clock_snapshots, 1u);
  EXPECT_FALSE(t.thread_names.empty());
  // scripts/install-deps.sh installs protoc (protobuf-compiler).
  const test_support::CommandResult r =
      test_support::RunCommandStatus("protoc --decode_raw < '" + path + "' 2>&1 >/dev/null");
  EXPECT_EQ(r.status, 0) << r.out;
}

INSTANTIATE_TEST_SUITE_P(Fixtures, PerfettoRealTrace,
                         ::testing::Values("real-v6.dat", "real-v7.dat", "real-v7-zstd.dat"));

TEST(PerfettoWriter, EachBootIsItsOwnNamedSequence) {
  test_support::TempDir dir;
  PerfettoCounts counts;
  const std::string dat = kFixtures + "/tracedat/real-v7.dat";
  const std::string file = Export({dat, dat}, (dir.path() / "t.pftrace").string(), &counts);
  const test::ReadTrace t = test::ReadPerfettoTrace(file);
  ASSERT_TRUE(t.ok) << t.error;
  EXPECT_EQ(t.track_names, (std::vector<std::string>{"guest boot 0", "guest boot 1"}));
  std::map<uint32_t, uint64_t> per_sequence;
  for (const test::ReadEvent& e : t.events) per_sequence[e.sequence]++;
  ASSERT_EQ(per_sequence.size(), 2u);
  EXPECT_EQ(per_sequence.begin()->second, per_sequence.rbegin()->second);
}

TEST(PerfettoWriter, Malicious_UnreadableFileFailsWithItsName) {
  test_support::TempDir dir;
  const std::string bad = (dir.path() / "boot-0.trace.dat").string();
  {
    FILE* f = std::fopen(bad.c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fputs("\x17\x08\x44tracing6 garbage that is no trace.dat", f);
    std::fclose(f);
  }
  const int fd = ::open((dir.path() / "out").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  ASSERT_GE(fd, 0);
  PerfettoTraceWriter w(fd);
  PerfettoCounts counts;
  Result<ReportStats> stats = w.WriteGuestFile(bad, {.name = "boot 0"}, &counts);
  ASSERT_FALSE(stats.ok());
  EXPECT_NE(stats.error().message.find("boot-0.trace.dat"), std::string::npos)
      << stats.error().message;
  ::close(fd);
}

}  // namespace
}  // namespace hvtrace
