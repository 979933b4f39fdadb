#include "show_perfetto.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "hvtrace/perfetto_writer.h"
#include "show_timeline.h"

namespace hvtrace::cli {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string StringOf(const json& doc, const char* key) {
  if (!doc.is_object()) return {};
  auto it = doc.find(key);
  return it != doc.end() && it->is_string() ? it->get<std::string>() : std::string();
}

// The release boot |boot| ran: the formats that decoded it (a kexec chain's
// boots may differ), else the capture's kernel.
std::string BootRelease(const json& manifest, uint32_t boot) {
  if (manifest.is_object() && manifest.contains("extra") && manifest["extra"].is_object()) {
    const json& extra = manifest["extra"];
    if (extra.contains("boots") && extra["boots"].is_array()) {
      for (const json& b : extra["boots"]) {
        if (!b.is_object() || b.value("boot", json()) != json(boot)) continue;
        const std::string r = StringOf(b.value("decoded_with", json()), "release");
        if (!r.empty()) return r;
      }
    }
  }
  return manifest.is_object() ? StringOf(manifest.value("kernel", json()), "release") : "";
}

uint32_t CpuCount(const json& manifest) {
  if (!manifest.is_object()) return 0;
  auto it = manifest.find("cpus");
  return it != manifest.end() && it->is_array() ? static_cast<uint32_t>(it->size()) : 0;
}

// Reports |stats|' problems; false when the file gave nothing.
bool Reported(const Result<ReportStats>& stats, const fs::path& path, const PerfettoCounts& before,
              const PerfettoCounts& after) {
  if (!stats.ok()) {
    std::fprintf(stderr, "hvtrace show: %s\n", stats.error().message.c_str());
    return false;
  }
  for (const std::string& issue : stats->issues)
    std::fprintf(stderr, "hvtrace show: %s\n", issue.c_str());
  if (!stats->issues.empty() && after.events == before.events) {
    std::fprintf(stderr, "hvtrace show: %s: no event could be read\n", path.c_str());
    return false;
  }
  return true;
}

// Writes the selected files into |writer|; false on the first that fails.
bool WriteFiles(const PerfettoExport& r, PerfettoTraceWriter& writer, PerfettoCounts* counts) {
  const std::string vm = StringOf(r.manifest, "vm");
  const std::string prefix = vm.empty() ? "guest" : "guest " + vm;
  bool any = false;
  if (!r.timeline) {
    for (const auto& [boot, path] : r.boots) {
      if (r.boot && *r.boot != boot) continue;
      any = true;
      const std::string release = BootRelease(r.manifest, boot);
      PerfettoTraceWriter::Sequence seq{.name = prefix + " boot " + std::to_string(boot) +
                                                (release.empty() ? "" : " (" + release + ")"),
                                        .host_clock = false};
      const PerfettoCounts before = *counts;
      if (!Reported(writer.WriteGuestFile(path.string(), seq, counts), path, before, *counts))
        return false;
      AddCrashInstant(r.manifest, boot, writer);
    }
    if (!any) {
      std::fprintf(stderr, "hvtrace show: %s has no boot %u\n", r.dir.c_str(), r.boot.value_or(0));
    }
    return any;
  }
  const std::vector<TimelineSource> sources = TimelineSources(r.dir);
  const TimelineSource* host = nullptr;
  for (const TimelineSource& s : sources) {
    if (s.side == "host") {
      host = &s;
      continue;
    }
    if (r.boot && *r.boot != s.boot) continue;
    any = true;
    const std::string release = BootRelease(r.manifest, s.boot);
    PerfettoTraceWriter::Sequence seq{.name = prefix + " boot " + std::to_string(s.boot) +
                                              (release.empty() ? "" : " (" + release + ")") +
                                              " on the host clock",
                                      .host_clock = true};
    const PerfettoCounts before = *counts;
    if (!Reported(writer.WriteGuestFile(s.path.string(), seq, counts), s.path, before, *counts))
      return false;
  }
  if (host == nullptr || !any) {
    std::fprintf(stderr,
                 "hvtrace show: %s has no timeline (host.dat and boot-<n>.host-clock.dat%s): "
                 "the VM was not booted with --trace-boot, or its capture holds no "
                 "qemu-trace.log\n",
                 r.dir.c_str(), r.boot ? " of that boot" : "");
    return false;
  }
  const PerfettoCounts before = *counts;
  return Reported(writer.WriteHostMachine(host->path.string(), "host (QEMU)", counts), host->path,
                  before, *counts);
}

}  // namespace

bool AddCrashInstant(const json& manifest, uint32_t boot, PerfettoTraceWriter& writer) {
  if (!manifest.is_object()) return false;
  auto it = manifest.find("crash");
  if (it == manifest.end() || !it->is_object()) return false;
  const json& c = *it;
  if (c.value("boot", json()) != json(boot) || !c.contains("ts_ns") ||
      !c["ts_ns"].is_number_integer() || c["ts_ns"].get<int64_t>() < 0) {
    return false;
  }
  const std::string kind = StringOf(c, "kind");
  const std::string line = kind == "panic" ? StringOf(c, "panic_line") : StringOf(c, "reason");
  std::string detail = "task " + StringOf(c, "task");
  for (const char* key : {"pid", "cpu"}) {
    if (c.contains(key) && c[key].is_number_integer())
      detail += std::string(", ") + key + " " + std::to_string(c[key].get<int64_t>());
  }
  writer.WriteInstant(c["ts_ns"].get<uint64_t>(),
                      "crash (" + (kind.empty() ? std::string("?") : kind) + "): " + line, detail);
  return true;
}

int ShowPerfetto(const PerfettoExport& r) {
  const std::string tmp = r.output + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    std::fprintf(stderr, "hvtrace show: cannot open %s: %s\n", tmp.c_str(), std::strerror(errno));
    return 1;
  }
  bool ok;
  PerfettoCounts counts;
  {
    PerfettoTraceWriter writer(fd);
    writer.WriteSystemInfo(BootRelease(r.manifest, r.boot.value_or(0)), CpuCount(r.manifest),
                           StringOf(r.manifest, "vm"));
    ok = WriteFiles(r, writer, &counts);
    if (Status s = writer.Finish(); ok && !s.ok()) {
      std::fprintf(stderr, "hvtrace show: %s: %s\n", tmp.c_str(), s.error().message.c_str());
      ok = false;
    }
  }
  if (ok && ::fsync(fd) != 0) {
    std::fprintf(stderr, "hvtrace show: %s: %s\n", tmp.c_str(), std::strerror(errno));
    ok = false;
  }
  if (::close(fd) != 0 && ok) {
    std::fprintf(stderr, "hvtrace show: %s: %s\n", tmp.c_str(), std::strerror(errno));
    ok = false;
  }
  if (ok && ::rename(tmp.c_str(), r.output.c_str()) != 0) {
    std::fprintf(stderr, "hvtrace show: renaming %s to %s: %s\n", tmp.c_str(), r.output.c_str(),
                 std::strerror(errno));
    ok = false;
  }
  if (!ok) {
    ::unlink(tmp.c_str());
    std::fprintf(stderr, "hvtrace show: %s not written\n", r.output.c_str());
    return 1;
  }
  std::fprintf(stderr, "hvtrace show: wrote %s: %llu events in %llu bundles (%llu generic)\n",
               r.output.c_str(), static_cast<unsigned long long>(counts.events),
               static_cast<unsigned long long>(counts.bundles),
               static_cast<unsigned long long>(counts.generic));
  return 0;
}

}  // namespace hvtrace::cli
