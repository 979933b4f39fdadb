#include "timeline_check.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <sstream>

#include "host_command.h"

namespace hvtrace::e2e {

namespace fs = std::filesystem;
using nlohmann::json;

std::vector<TimelineLine> ParseTimeline(const std::string& out) {
  std::vector<TimelineLine> lines;
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream f(line);
    std::string secs, rel, side;
    f >> secs >> rel >> side;
    const size_t cpu = line.find(']');
    const size_t colon = cpu == std::string::npos ? cpu : line.find(": ", cpu);
    if (colon == std::string::npos) continue;
    lines.push_back({side, line.substr(cpu + 2, colon - cpu - 2), line});
  }
  return lines;
}

std::vector<std::string> TraceCmdOrder(const std::string& report) {
  std::vector<std::string> out;
  std::istringstream in(report);
  for (std::string line; std::getline(in, line);) {
    line.erase(0, line.find_first_not_of(' '));
    const size_t file_end = line.find(':');
    const size_t cpu = line.find(']');
    if (file_end == std::string::npos || cpu == std::string::npos) continue;
    const size_t ts_end = line.find(": ", cpu);
    const size_t ev_end = ts_end == std::string::npos ? ts_end : line.find(": ", ts_end + 2);
    if (ev_end == std::string::npos) continue;
    out.push_back(line.substr(0, file_end) + " " + line.substr(ts_end + 2, ev_end - ts_end - 2));
  }
  return out;
}

std::string ValueOf(const std::string& text, const std::string& key) {
  const size_t at = text.find(key);
  if (at == std::string::npos) return "";
  size_t end = at + key.size();
  while (end < text.size() && text[end] != ' ') ++end;
  return text.substr(at + key.size(), end - at - key.size());
}

std::string ShowTimeline(const fs::path& dir) {
  const RunResult show = RunArgvStatus(
      {std::string(HVTRACE_BIN_DIR) + "/hvtrace", "show", dir.string(), "--timeline"});
  EXPECT_EQ(show.status, 0) << show.output;
  return show.output;
}

void ExpectPlacedTimeline(const fs::path& dir, const json& t,
                          const std::vector<TimelineLine>& lines, uint64_t min_pairs) {
  ASSERT_TRUE(t.value("aligned", false)) << t.dump(2);
  std::printf(
      "boot timeline: %s pairs, offset %s ns, drift %s ppm, error bound %s ns (%s), thin %s %s\n",
      t["pairs"].dump().c_str(), t["offset_ns"].dump().c_str(), t["drift_ppm"].dump().c_str(),
      t["error_bound_ns"].dump().c_str(), t.value("method", std::string()).c_str(),
      t["thin"].dump().c_str(), t.value("why", std::string()).c_str());
  // The fit's accuracy, not a timing: a guest event's true host time is at
  // most this much later than where the timeline shows it (docs/
  // boot-timeline.md, "One clock").
  EXPECT_LT(t["error_bound_ns"].get<uint64_t>(), 1'000'000u) << t.dump(2);
  EXPECT_GE(t["pairs"].get<uint64_t>(), min_pairs) << t.dump(2);
  ASSERT_TRUE(fs::exists(dir / "host.dat"));
  ASSERT_TRUE(fs::exists(dir / "boot-0.host-clock.dat"));
  ASSERT_FALSE(lines.empty());
  // Every guest status write is followed by QEMU's handling of that value,
  // before the guest writes the same value again.
  for (size_t i = 0; i < lines.size(); ++i) {
    if (lines[i].side != "guest" || lines[i].event != "hvt_virtio_status") continue;
    const std::string v = ValueOf(lines[i].text, "status=");
    bool handled = false;
    for (size_t j = i + 1; j < lines.size() && !handled; ++j) {
      if (lines[j].side == "guest" && lines[j].event == "hvt_virtio_status" &&
          ValueOf(lines[j].text, "status=") == v)
        break;
      handled = lines[j].side == "host" && lines[j].event == "virtio_set_status" &&
                ValueOf(lines[j].text, "val=") == v;
    }
    EXPECT_TRUE(handled) << "guest write not handled after it: " << lines[i].text;
  }
  const RunResult report = RunArgvStatus(
      {"sh", "-c",
       "cd '" + dir.string() + "' && trace-cmd report -i host.dat -i boot-0.host-clock.dat"});
  ASSERT_EQ(report.status, 0) << report.output;
  std::vector<std::string> from_show;
  for (const TimelineLine& l : lines) {
    from_show.push_back((l.side == "host" ? "host.dat " : "boot-0.host-clock.dat ") + l.event);
  }
  EXPECT_EQ(from_show, TraceCmdOrder(report.output));
}

std::vector<std::string> GuestStatusWrites(const std::vector<TimelineLine>& lines, int index) {
  std::vector<std::string> out;
  for (const TimelineLine& l : lines) {
    if (l.side == "guest" && l.event == "hvt_virtio_status" &&
        ValueOf(l.text, "index=") == std::to_string(index)) {
      out.push_back(ValueOf(l.text, "status="));
    }
  }
  return out;
}

}  // namespace hvtrace::e2e
