#include "show_timeline.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "boot_file_name.h"
#include "hvtrace/output.h"

namespace hvtrace::cli {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

struct Line {
  uint64_t ts;
  size_t source;
  size_t seq;
  std::string text;
};

}  // namespace

std::vector<TimelineSource> TimelineSources(const fs::path& dir) {
  std::vector<TimelineSource> out;
  std::error_code ec;
  if (fs::is_regular_file(dir / "host.dat", ec)) out.push_back({dir / "host.dat", "host", 0});
  std::vector<std::pair<uint32_t, fs::path>> boots;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    if (auto b =
            hostd::BootOfFileName(it->path().filename().string(), hostd::kBootHostClockSuffix)) {
      boots.push_back({*b, it->path()});
    }
  }
  std::sort(boots.begin(), boots.end());
  for (const auto& [b, path] : boots) {
    out.push_back({path, boots.size() == 1 ? "guest" : "guest" + std::to_string(b), b});
  }
  return out;
}

namespace {

// trace-cmd 3.3's latency column ("d.h2.": irqs off, need-resched, hard or
// soft irq, preempt depth, migrate-disable), which runs into the time stamp.
constexpr size_t kLatencyWidth = 5;

bool IsTimeStamp(std::string_view t) {
  return !t.empty() &&
         std::all_of(t.begin(), t.end(), [](char c) { return (c >= '0' && c <= '9') || c == '.'; });
}

bool IsLatencyColumn(std::string_view t) {
  return t.size() == kLatencyWidth && std::all_of(t.begin(), t.end(), [](char c) {
           return std::string_view(".dDXNnpHhsSbB0123456789abcdef").find(c) !=
                  std::string_view::npos;
         });
}

}  // namespace

std::string TimelineEventText(std::string_view line) {
  for (size_t open = line.find('['); open != std::string_view::npos;
       open = line.find('[', open + 1)) {
    size_t i = open + 1;
    while (i < line.size() && line[i] >= '0' && line[i] <= '9') ++i;
    if (i == open + 1 || i >= line.size() || line[i] != ']') continue;
    size_t j = i + 1;
    while (j < line.size() && line[j] == ' ') ++j;
    const size_t colon = line.find(':', j);
    if (colon == std::string_view::npos) continue;
    const std::string_view field = line.substr(j, colon - j);
    // 3.1: "TS"; 3.3: "LLLLLTS" (ns, six digits at least).
    const bool stamp = IsTimeStamp(field) || (field.size() >= kLatencyWidth + 6 &&
                                              IsLatencyColumn(field.substr(0, kLatencyWidth)) &&
                                              IsTimeStamp(field.substr(kLatencyWidth)));
    if (!stamp) continue;
    std::string out(line.substr(0, i + 1));
    out += line.substr(colon + 1);
    const size_t first = out.find_first_not_of(' ');
    return first == std::string::npos ? out : out.substr(first);
  }
  const size_t first = line.find_first_not_of(' ');
  return std::string(first == std::string_view::npos ? line : line.substr(first));
}

namespace {

std::string Header(const fs::path& dir, const json& manifest) {
  std::error_code ec;
  const std::string name = fs::weakly_canonical(dir, ec).filename().string();
  std::string h = "# timeline of capture " + manifest.value("id", name) +
                  ": host CLOCK_REALTIME (host = QEMU's trace log, guest = the boot range)\n";
  const json t = manifest.contains("extra") && manifest["extra"].is_object()
                     ? manifest["extra"].value("timeline", json())
                     : json();
  if (!t.is_object() || !t.contains("boots") || !t["boots"].is_array()) return h;
  for (const json& b : t["boots"]) {
    if (!b.is_object() || !b.contains("fit") || !b["fit"].is_object()) continue;
    const json& f = b["fit"];
    h += "# boot " + b.value("boot", json(0)).dump() + ": ";
    if (f.value("aligned", false)) {
      char buf[256];
      std::snprintf(buf, sizeof buf,
                    "offset %lld ns, drift %.3f ppm, %llu handshake pairs, error bound %.3f us",
                    static_cast<long long>(f.value("offset_ns", int64_t{0})),
                    f.value("drift_ppm", 0.0),
                    static_cast<unsigned long long>(f.value("pairs", uint64_t{0})),
                    static_cast<double>(f.value("error_bound_ns", uint64_t{0})) / 1000.0);
      h += buf;
    } else {
      h += "not on the host clock";
    }
    if (f.value("thin", false)) h += " (thin: " + f.value("why", std::string()) + ")";
    h += "\n";
  }
  return h;
}

bool WriteAll(int fd, const std::string& text) {
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return false;
    done += static_cast<size_t>(n);
  }
  return true;
}

}  // namespace

std::string SecondsText(uint64_t ns) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%llu.%06llu", static_cast<unsigned long long>(ns / 1000000000),
                static_cast<unsigned long long>(ns % 1000000000 / 1000));
  return buf;
}

int ShowTimeline(const fs::path& dir, const json& manifest, int fd) {
  const std::vector<TimelineSource> sources = TimelineSources(dir);
  if (sources.size() < 2) {
    std::string why;
    if (manifest.contains("extra") && manifest["extra"].is_object() &&
        manifest["extra"].contains("timeline") && manifest["extra"]["timeline"].is_object()) {
      why = manifest["extra"]["timeline"].value("why", std::string());
    }
    std::fprintf(stderr,
                 "hvtrace show: %s has no timeline (host.dat and boot-<n>.host-clock.dat): %s\n",
                 dir.c_str(),
                 why.empty() ? "the VM was not booted with --trace-boot, or its capture holds "
                               "no qemu-trace.log"
                             : why.c_str());
    return 1;
  }
  // Each file's events in its own report order, then merged the way
  // trace-cmd merges its inputs: the smallest head first, ties to the file
  // named first. (Not a sort: a boot's CPU stream may step back in time in
  // early boot, and trace-cmd keeps each stream's order.)
  std::vector<std::vector<Line>> per_source(sources.size());
  ReportOptions options;
  options.time_names = true;
  for (size_t s = 0; s < sources.size(); ++s) {
    size_t seq = 0;
    Result<ReportStats> stats = ForEachReportLine(
        sources[s].path.string(), options, [&](uint64_t ts, std::string_view text) {
          while (!text.empty()) {
            const size_t nl = text.find('\n');
            per_source[s].push_back({ts, s, seq++, TimelineEventText(text.substr(0, nl))});
            text.remove_prefix(nl == std::string_view::npos ? text.size() : nl + 1);
          }
          return true;
        });
    if (!stats.ok()) {
      std::fprintf(stderr, "hvtrace show: %s\n", stats.error().message.c_str());
      return 1;
    }
    for (const std::string& issue : stats->issues)
      std::fprintf(stderr, "hvtrace show: %s\n", issue.c_str());
  }
  std::vector<Line> lines;
  std::vector<size_t> next(sources.size(), 0);
  for (;;) {
    size_t pick = sources.size();
    for (size_t s = 0; s < sources.size(); ++s) {
      if (next[s] >= per_source[s].size()) continue;
      if (pick == sources.size() || per_source[s][next[s]].ts < per_source[pick][next[pick]].ts)
        pick = s;
    }
    if (pick == sources.size()) break;
    lines.push_back(std::move(per_source[pick][next[pick]++]));
  }
  std::string out = Header(dir, manifest);
  const uint64_t first = lines.empty() ? 0 : lines.front().ts;
  for (const Line& l : lines) {
    char prefix[96];
    std::snprintf(prefix, sizeof prefix, "%s +%s %-6s ", SecondsText(l.ts).c_str(),
                  SecondsText(l.ts - first).c_str(), sources[l.source].side.c_str());
    out += prefix + l.text + "\n";
    if (out.size() > (1u << 20)) {
      if (!WriteAll(fd, out)) return 1;
      out.clear();
    }
  }
  return WriteAll(fd, out) ? 0 : 1;
}

}  // namespace hvtrace::cli
