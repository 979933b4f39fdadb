#include "timeline_check.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <sstream>
#include <utility>

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

namespace {

// The host-clock files of |t|'s placed boots, oldest first, each with the
// side name `show --timeline` gives its lines.
std::vector<std::pair<std::string, std::string>> PlacedBootFiles(const json& t) {
  std::vector<std::pair<std::string, std::string>> files;
  if (!t.contains("boots") || !t["boots"].is_array()) return files;
  for (const json& b : t["boots"]) {
    if (b.contains("host_clock_file")) {
      files.push_back({b["host_clock_file"].get<std::string>(),
                       "guest" + std::to_string(b.value("boot", uint64_t{0}))});
    }
  }
  if (files.size() == 1) files[0].second = "guest";
  return files;
}

}  // namespace

std::string GuestSide(const json& t, uint64_t boot) {
  const std::string name = "boot-" + std::to_string(boot) + ".host-clock.dat";
  for (const auto& [file, side] : PlacedBootFiles(t)) {
    if (file == name) return side;
  }
  return "";
}

void ExpectPlacedTimeline(const fs::path& dir, const json& t,
                          const std::vector<TimelineLine>& lines, uint64_t min_pairs) {
  ASSERT_TRUE(t.value("aligned", false)) << t.dump(2);
  std::printf(
      "boot timeline: boot %s, %s pairs, offset %s ns, drift %s ppm, error bound %s ns (%s), "
      "thin %s %s, early writes %s\n",
      t["boot"].dump().c_str(), t["pairs"].dump().c_str(), t["offset_ns"].dump().c_str(),
      t["drift_ppm"].dump().c_str(), t["error_bound_ns"].dump().c_str(),
      t.value("method", std::string()).c_str(), t["thin"].dump().c_str(),
      t.value("why", std::string()).c_str(), t["early_writes"].dump().c_str());
  // The fit's accuracy, not a timing: a guest event's true host time is at
  // most this much later than where the timeline shows it (docs/
  // boot-timeline.md, "One clock").
  EXPECT_LT(t["error_bound_ns"].get<uint64_t>(), 1'000'000u) << t.dump(2);
  EXPECT_GE(t["pairs"].get<uint64_t>(), min_pairs) << t.dump(2);
  ASSERT_TRUE(fs::exists(dir / "host.dat"));
  const std::string newest = "boot-" + t["boot"].dump() + ".host-clock.dat";
  ASSERT_TRUE(fs::exists(dir / newest)) << newest;
  ASSERT_FALSE(lines.empty());
  // Every guest status write is followed by QEMU's handling of that value,
  // before the guest writes the same value again.
  auto is_write = [](const TimelineLine& l) {
    return l.side.starts_with("guest") && l.event == "hvt_virtio_status";
  };
  for (size_t i = 0; i < lines.size(); ++i) {
    if (!is_write(lines[i])) continue;
    const std::string v = ValueOf(lines[i].text, "status=");
    bool handled = false;
    for (size_t j = i + 1; j < lines.size() && !handled; ++j) {
      if (is_write(lines[j]) && ValueOf(lines[j].text, "status=") == v) break;
      handled = lines[j].side == "host" && lines[j].event == "virtio_set_status" &&
                ValueOf(lines[j].text, "val=") == v;
    }
    EXPECT_TRUE(handled) << "guest write not handled after it: " << lines[i].text;
  }
  // trace-cmd merges the same files: host.dat first, then the boots oldest
  // first (show_timeline.h).
  std::string inputs = " -i host.dat";
  std::map<std::string, std::string> file_of = {{"host", "host.dat"}};
  for (const auto& [file, side] : PlacedBootFiles(t)) {
    inputs += " -i " + file;
    file_of[side] = file;
  }
  const RunResult report =
      RunArgvStatus({"sh", "-c", "cd '" + dir.string() + "' && trace-cmd report" + inputs});
  ASSERT_EQ(report.status, 0) << report.output;
  std::vector<std::string> from_show;
  for (const TimelineLine& l : lines) {
    const auto file = file_of.find(l.side);
    from_show.push_back((file == file_of.end() ? "?" + l.side : file->second) + " " + l.event);
  }
  std::vector<std::string> raw;
  const std::vector<std::string> from_trace_cmd = TraceCmdOrder(report.output, &raw);
  // Thousands of lines: the first difference with its neighbours says more
  // than both lists (and survives a CI log's truncation).
  size_t at = 0;
  while (at < from_show.size() && at < from_trace_cmd.size() && from_show[at] == from_trace_cmd[at])
    ++at;
  if (at == from_show.size() && at == from_trace_cmd.size()) return;
  // Six lines each side of |at| under |title|, the differing one marked.
  auto around_at = [at](const std::string& title, auto text_of, size_t count) {
    std::string out = title + ":\n";
    for (size_t i = at < 6 ? 0 : at - 6; i < std::min(at + 6, count); ++i)
      out += (i == at ? "> " : "  ") + text_of(i) + "\n";
    return out;
  };
  const std::string around =
      around_at(
          "show --timeline", [&](size_t i) { return lines[i].text; }, lines.size()) +
      around_at(
          "trace-cmd report" + inputs, [&](size_t i) { return raw[i]; }, raw.size());
  ADD_FAILURE() << "show --timeline and trace-cmd's merge differ at event " << at << " of "
                << from_show.size() << " (show) and " << from_trace_cmd.size()
                << " (trace-cmd), in " << dir << ":\n"
                << around;
}

std::vector<std::string> GuestStatusWrites(const std::vector<TimelineLine>& lines, int index,
                                           const std::string& side) {
  std::vector<std::string> out;
  for (const TimelineLine& l : lines) {
    if (l.side == side && l.event == "hvt_virtio_status" &&
        ValueOf(l.text, "index=") == std::to_string(index)) {
      out.push_back(ValueOf(l.text, "status="));
    }
  }
  return out;
}

}  // namespace hvtrace::e2e
