#include "capture_index.h"

#include <deque>
#include <string>

#include "capped_file.h"
#include "hvtrace/output.h"

namespace hvtrace::hostd {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// Whether a report line ("comm-pid [cpu] time: name: ...") is a
// printk:console event: the kernel log, which the capture carries whole
// (boot-N.kernel.log, the crash summary); a panic's last events would
// otherwise be only its own log lines.
bool IsConsoleLine(std::string_view text) {
  const size_t cpu = text.find("] ");
  if (cpu == std::string_view::npos) return false;
  const size_t stamp = text.find(": ", cpu);
  return stamp != std::string_view::npos && text.substr(stamp + 2).starts_with("console:");
}

// The last |n| events of a trace.dat as `hvtrace report` prints them, the
// kernel log's events left out. The file is one this daemon wrote; the
// decoder bounds it all the same.
json LastEvents(const fs::path& path, size_t n) {
  std::deque<std::string> lines;
  ReportOptions options;
  options.header = false;
  options.threads = 0;  // The uploader's one thread; never the capture workers'.
  auto stats = ForEachReportLine(path.string(), options, [&](uint64_t, std::string_view text) {
    if (!text.empty() && text.back() == '\n') text.remove_suffix(1);
    if (IsConsoleLine(text)) return true;
    lines.emplace_back(text.substr(0, 512));
    if (lines.size() > n) lines.pop_front();
    return true;
  });
  if (!stats.ok()) return {{"error", stats.error().message}};
  return json(std::vector<std::string>(lines.begin(), lines.end()));
}

}  // namespace

Result<json> ReadManifest(const fs::path& dir) {
  const fs::path path = dir / "manifest.json";
  Result<std::string> text = ReadCappedFile(path, kMaxManifestBytes);
  if (!text.ok()) return Error{"cannot read manifest: " + text.error().message};
  json doc = json::parse(*text, nullptr, false);
  if (doc.is_discarded() || !doc.is_object()) return Error{path.string() + " is not a JSON object"};
  return doc;
}

Result<json> BuildCaptureIndex(const fs::path& dir, const FleetCaptureRef& ref) {
  auto manifest = ReadManifest(dir);
  if (!manifest.ok()) return manifest.error();
  const json& m = *manifest;
  json index = {{"format", "hvtrace-fleet-index"},
                {"version", 1},
                {"host", ref.host},
                {"vm", ref.vm},
                {"id", ref.id}};
  index["trigger"] = m.value("trigger", "");
  const json triggered =
      m.contains("host_time") ? m["host_time"].value("triggered", json::object()) : json::object();
  const json completed =
      m.contains("host_time") ? m["host_time"].value("completed", json::object()) : json::object();
  index["time"] = {{"triggered_utc", triggered.value("utc", "")},
                   {"triggered_ns", triggered.value("realtime_ns", int64_t{0})},
                   {"completed_utc", completed.value("utc", "")}};
  index["kernel"] = {{"release", m.contains("kernel") && m["kernel"].is_object()
                                     ? m["kernel"].value("release", "")
                                     : ""}};
  index["totals"] = m.value("totals", json::object());
  index["cpus"] = m.contains("cpus") && m["cpus"].is_array() ? m["cpus"].size() : 0;
  if (m.contains("extra") && m["extra"].is_object() && m["extra"].contains("incomplete")) {
    index["incomplete"] = m["extra"]["incomplete"];
  }
  json files = json::array();
  json last = json::object();
  for (const json& f : m.value("files", json::array())) {
    if (!f.is_object() || !f.contains("name") || !f["name"].is_string()) continue;
    const std::string name = f["name"];
    files.push_back({{"name", name},
                     {"bytes", f.value("bytes", uint64_t{0})},
                     {"object", ObjectNameOf(name)},
                     {"compressed", CompressedInStore(name)}});
    // The guest's trace; host.dat and the re-stamped copies say nothing new.
    if (name.ends_with(".trace.dat") && name.find("host-clock") == std::string::npos) {
      last[name] = LastEvents(dir / name, kIndexLastEvents);
    }
  }
  // Why the guest died, for a fleet listing (the whole summary is in the
  // manifest): the crash's kind, reason, panic line, task and the panicking
  // CPU's last events.
  if (m.contains("crash") && m["crash"].is_object()) {
    json brief = json::object();
    for (const char* key : {"kind", "reason", "panic_line", "task"}) {
      if (auto it = m["crash"].find(key); it != m["crash"].end() && it->is_string()) {
        brief[key] = *it;
      }
    }
    // The panicking CPU's last events before it: the trace's last events
    // are often another CPU idling while the panic prints.
    json before = json::array();
    if (auto it = m["crash"].find("events_before"); it != m["crash"].end() && it->is_array()) {
      for (const json& e : *it) {
        if (e.is_object() && e.contains("line") && e["line"].is_string() &&
            before.size() < kIndexLastEvents) {
          before.push_back(e["line"].get<std::string>().substr(0, 512));
        }
      }
    }
    brief["events_before"] = std::move(before);
    index["crash"] = std::move(brief);
  }
  index["files"] = std::move(files);
  index["last_events"] = std::move(last);
  return index;
}

}  // namespace hvtrace::hostd
