// The e2e tests' check of `hvtrace show CAPTURE --format perfetto`: export
// a real capture, read the file back with the tests' own reader
// (tests/unit/shared/decode/perfetto_reader.h) and compare it with what
// `hvtrace show --format json` printed for the same capture.
#ifndef HVTRACE_TESTS_E2E_PERFETTO_CHECK_H_
#define HVTRACE_TESTS_E2E_PERFETTO_CHECK_H_

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "shared/decode/perfetto_reader.h"
#include "test_support.h"

namespace hvtrace::e2e {

struct PerfettoCheck {
  test::ReadTrace trace;
  size_t sched_switches = 0;
  size_t markers = 0;
};

// Exports |capture| (plus |extra_flags|) and checks, against |json_lines|
// (`hvtrace show --format json` of the same capture and flags): the count
// of each event kind, the markers' text in order, per-CPU timestamps that
// never go back, both comms on every sched_switch, SystemInfo first, and
// that `protoc --decode_raw` accepts the file.
inline PerfettoCheck CheckPerfettoExport(const std::string& hvtrace,
                                         const std::filesystem::path& capture,
                                         const std::string& json_lines,
                                         const std::string& extra_flags = "") {
  PerfettoCheck out;
  test_support::TempDir tmp("hvtrace-perfetto");
  const std::filesystem::path file = tmp.path() / "capture.pftrace";
  const test_support::CommandResult r =
      test_support::RunCommandStatus(hvtrace + " show '" + capture.string() + "' " + extra_flags +
                                     " --format perfetto -o '" + file.string() + "' 2>&1");
  EXPECT_EQ(r.status, 0) << r.out;
  if (r.status != 0) return out;
  const test_support::CommandResult protoc = test_support::RunCommandStatus(
      "protoc --decode_raw < '" + file.string() + "' 2>&1 >/dev/null");
  EXPECT_EQ(protoc.status, 0) << "protoc --decode_raw: " << protoc.out;
  out.trace = test::ReadPerfettoTrace(test_support::ReadText(file.string()));
  const test::ReadTrace& t = out.trace;
  EXPECT_TRUE(t.ok) << t.error;
  EXPECT_TRUE(t.system_info_first);

  std::map<std::string, uint64_t> want, got;
  // (time, text): bundles are per CPU, so the file's order is not the report's.
  std::vector<std::pair<uint64_t, std::string>> want_markers, got_markers;
  // Steps back in time per (boot, CPU) as the report prints them: a
  // capture keeps a page whose clock stepped back (its validation's
  // time_went_backwards), and the file must show exactly those.
  std::map<std::pair<uint32_t, uint32_t>, uint64_t> json_last;
  size_t want_back = 0;
  uint32_t boot = 0;
  std::istringstream lines(json_lines);
  for (std::string line; std::getline(lines, line);) {
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded()) continue;
    if (!j.contains("event")) {  // A boot header: the next boot's sequence.
      boot = j.value("boot", 0u) + 1;
      continue;
    }
    const uint64_t ts = j.value("ts_ns", uint64_t{0});
    auto [jt, jfresh] = json_last.try_emplace({boot, j.value("cpu", 0u)}, ts);
    want_back += !jfresh && ts < jt->second;
    jt->second = ts;
    const std::string name = j["event"].is_string() ? j["event"].get<std::string>() : "";
    want[name.empty() ? "hvtrace_unknown_event" : name]++;
    if (name == "print")
      want_markers.push_back({j.value("ts_ns", uint64_t{0}), j["fields"].value("buf", "")});
  }
  std::map<std::pair<uint32_t, uint32_t>, uint64_t> last;  // (sequence, cpu) -> ts
  size_t back = 0;
  for (const test::ReadEvent& e : t.events) {
    if (e.machine != 0) continue;  // The host machine (--timeline): not in show --json.
    got[e.kind]++;
    if (e.kind == "print")
      got_markers.push_back({e.ts, e.strings.count("buf") ? e.strings.at("buf") : ""});
    auto [it, fresh] = last.try_emplace({e.sequence, e.cpu}, e.ts);
    if (!fresh && e.ts < it->second && back++ < 5)
      std::printf("perfetto: cpu %u steps back from %llu to %llu ns (as the report)\n", e.cpu,
                  static_cast<unsigned long long>(it->second),
                  static_cast<unsigned long long>(e.ts));
    it->second = e.ts;
    if (e.kind == "sched_switch") {
      out.sched_switches++;
      EXPECT_TRUE(e.strings.count("prev_comm") && !e.strings.at("prev_comm").empty() &&
                  e.strings.count("next_comm") && !e.strings.at("next_comm").empty())
          << "a sched_switch at " << e.ts << " lacks a comm";
    }
  }
  EXPECT_EQ(back, want_back) << "per-CPU time goes back where the report's does not";
  std::stable_sort(want_markers.begin(), want_markers.end());
  std::stable_sort(got_markers.begin(), got_markers.end());
  EXPECT_EQ(got, want);
  EXPECT_EQ(got_markers, want_markers);
  out.markers = got_markers.size();
  return out;
}

// `--timeline`: the file's events are the text timeline's lines (|lines|
// of `hvtrace show --timeline`, "SECONDS +REL SIDE ... EVENT: ..."): the
// host's on machine 1, the guest's on machine 0, each at the host-clock
// time the text prints (µs), so the guest's handshakes fall after the
// host's matching lines exactly as in the text. Returns the host events.
inline size_t CheckPerfettoTimeline(const std::string& hvtrace,
                                    const std::filesystem::path& capture,
                                    const std::vector<std::string>& lines) {
  test_support::TempDir tmp("hvtrace-perfetto");
  const std::filesystem::path file = tmp.path() / "timeline.pftrace";
  const test_support::CommandResult r = test_support::RunCommandStatus(
      hvtrace + " show '" + capture.string() + "' --timeline --format perfetto -o '" +
      file.string() + "' 2>&1");
  EXPECT_EQ(r.status, 0) << r.out;
  if (r.status != 0) return 0;
  const test_support::CommandResult protoc = test_support::RunCommandStatus(
      "protoc --decode_raw < '" + file.string() + "' 2>&1 >/dev/null");
  EXPECT_EQ(protoc.status, 0) << "protoc --decode_raw: " << protoc.out;
  const test::ReadTrace t = test::ReadPerfettoTrace(test_support::ReadText(file.string()));
  EXPECT_TRUE(t.ok) << t.error;
  EXPECT_EQ(t.remote_clock_syncs, 1u);
  EXPECT_NE(std::find(t.machine_names.begin(), t.machine_names.end(), "host (QEMU)"),
            t.machine_names.end());
  // (machine, event, µs) of both, sorted: the same multiset.
  std::multiset<std::tuple<int, std::string, uint64_t>> want, got;
  for (const std::string& line : lines) {
    std::istringstream f(line);
    std::string secs, rel, side;
    f >> secs >> rel >> side;
    const size_t dot = secs.find('.');
    const size_t cpu = line.find(']');
    const size_t colon = cpu == std::string::npos ? cpu : line.find(": ", cpu);
    if (dot == std::string::npos || colon == std::string::npos) continue;
    const uint64_t us =
        std::stoull(secs.substr(0, dot)) * 1000000 + std::stoull(secs.substr(dot + 1));
    want.insert({side == "host" ? 1 : 0, line.substr(cpu + 2, colon - cpu - 2), us});
  }
  size_t host = 0;
  for (const test::ReadEvent& e : t.events) {
    got.insert({static_cast<int>(e.machine), e.kind, e.ts / 1000});
    host += e.machine == 1;
  }
  EXPECT_EQ(got.size(), want.size());
  size_t missing = 0;
  for (const auto& w : want) {
    if (got.count(w) == 0 && missing++ < 5)
      ADD_FAILURE() << "not in the Perfetto file: machine " << std::get<0>(w) << " "
                    << std::get<1>(w) << " at " << std::get<2>(w) << " us";
  }
  EXPECT_EQ(missing, 0u);
  return host;
}

}  // namespace hvtrace::e2e

#endif  // HVTRACE_TESTS_E2E_PERFETTO_CHECK_H_
