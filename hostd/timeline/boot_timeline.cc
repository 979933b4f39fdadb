#include "boot_timeline.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <deque>
#include <optional>

#include "boot_file_name.h"
#include "boot_trace.h"
#include "capped_file.h"
#include "clock_fit.h"
#include "host_time.h"
#include "host_trace_dat.h"
#include "hvtrace/format.h"
#include "hvtrace/page.h"
#include "hvtrace/tracedat.h"
#include "hvtrace/tracedat_writer.h"
#include "qemu_trace_log.h"
#include "restamp_pages.h"

namespace hvtrace::hostd {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr const char* kAgentSamples =
    "not used: the agent's clock-sync samples relate guest clocks to each other (TSC, "
    "CLOCK_MONOTONIC, CLOCK_BOOTTIME, the guest's CLOCK_REALTIME, which starts from the "
    "emulated RTC at 1 s resolution), none of them to the host's clock";

std::vector<std::pair<uint32_t, fs::path>> BootFiles(const fs::path& dir) {
  std::vector<std::pair<uint32_t, fs::path>> files;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    if (auto boot = BootOfFileName(it->path().filename().string()))
      files.push_back({*boot, it->path()});
  }
  std::sort(files.begin(), files.end());
  return files;
}

// QEMU's virtio_set_status lines ("vdev 0x... val N").
std::vector<HostStatusSet> HostStatusLines(const QemuTraceLog& log) {
  std::vector<HostStatusSet> out;
  for (const QemuTraceEvent& e : log.events) {
    if (e.name != "virtio_set_status") continue;
    HostStatusSet h{e.realtime_ns, 0, {}};
    bool has_val = false;
    for (const auto& [key, value] : e.args) {
      if (key == "vdev") h.vdev = value;
      if (key == "val" && !value.empty() && value.size() <= 3 &&
          std::all_of(value.begin(), value.end(), [](char c) { return c >= '0' && c <= '9'; })) {
        h.status = static_cast<uint32_t>(std::stoul(value));
        has_val = true;
      }
    }
    if (has_val) out.push_back(std::move(h));
  }
  return out;
}

std::optional<uint64_t> FieldValue(const FieldFormat* f, std::span<const std::byte> payload) {
  if (f == nullptr || f->kind != FieldKind::kScalar || f->size == 0 || f->size > 8 ||
      uint64_t{f->offset} + f->size > payload.size()) {
    return std::nullopt;
  }
  uint64_t v = 0;
  std::memcpy(&v, payload.data() + f->offset, f->size);  // Little-endian guests.
  return v;
}

struct GuestSide {
  std::vector<GuestStatusWrite> writes;
  size_t early = 0;     // Of them, from hvtrace-early markers.
  std::string problem;  // Why there are none, when that is known.
};

// "hvtrace-early: hvt_virtio_status ts=3.138111 cpu=0 pid=1 status=0
// index=0": a write by a built-in driver before userspace, recorded by the
// kernel's kprobe_event= in the top-level buffer (same local clock) and
// copied into the boot instance as a marker by the guest's
// hvtrace-boot-probes, with its time as the kernel printed it (µs).
std::optional<GuestStatusWrite> EarlyWrite(std::string_view text) {
  constexpr std::string_view kPrefix = "hvtrace-early: hvt_virtio_status ";
  if (!text.starts_with(kPrefix)) return std::nullopt;
  auto value = [&](std::string_view key) -> std::optional<std::string_view> {
    const size_t at = text.find(key);
    if (at == std::string_view::npos) return std::nullopt;
    std::string_view v = text.substr(at + key.size());
    return v.substr(0, std::min(v.find_first_of(" \n"), v.size()));
  };
  auto number = [](std::string_view v, uint64_t max) -> std::optional<uint64_t> {
    uint64_t n = 0;
    if (v.empty() || v.size() > 12) return std::nullopt;
    for (char c : v) {
      if (c < '0' || c > '9') return std::nullopt;
      n = n * 10 + static_cast<uint64_t>(c - '0');
    }
    return n <= max ? std::optional<uint64_t>(n) : std::nullopt;
  };
  const auto ts = value(" ts="), status = value(" status="), index = value(" index=");
  if (!ts || !status) return std::nullopt;
  const size_t dot = ts->find('.');
  if (dot == std::string_view::npos || ts->size() - dot - 1 != 6) return std::nullopt;
  const auto sec = number(ts->substr(0, dot), 1'000'000'000);
  const auto usec = number(ts->substr(dot + 1), 999'999);
  const auto st = number(*status, 0xff);
  if (!sec || !usec || !st) return std::nullopt;
  const auto idx = index ? number(*index, 4095) : std::nullopt;
  return GuestStatusWrite{*sec * 1'000'000'000 + *usec * 1000, static_cast<uint32_t>(*st),
                          idx ? static_cast<int64_t>(*idx) : -1};
}

std::optional<EventFormat> FindFormat(const TraceDat& dat, std::string_view system,
                                      std::string_view name) {
  for (const FormatText& f : dat.formats()) {
    if (f.system != system) continue;
    Result<EventFormat> parsed = ParseEventFormat(f.system, f.text);
    if (parsed.ok() && parsed->name == name) return std::move(*parsed);
  }
  return std::nullopt;
}

// The boot's kprobes:hvt_virtio_status records, and the early writes its
// markers carry (EarlyWrite).
GuestSide GuestStatusWrites(TraceDat& dat, const PageLayout& layout) {
  GuestSide side;
  const std::optional<EventFormat> format = FindFormat(dat, kGuestStatusSystem, kGuestStatusEvent);
  if (!format) {
    side.problem = std::string("the boot's formats have no ") + kGuestStatusSystem + ":" +
                   kGuestStatusEvent + " (the guest's half of the handshakes was not recorded)";
    return side;
  }
  const std::optional<EventFormat> print = FindFormat(dat, "ftrace", "print");
  const FieldFormat* buf = print ? print->FindField("buf") : nullptr;
  const FieldFormat* status = format->FindField("status");
  const FieldFormat* index = format->FindField("index");
  for (size_t c = 0; c < dat.cpus().size(); ++c) {
    (void)dat.ForEachPage(c, [&](std::span<const std::byte> page, uint64_t) {
      PageCursor cursor(page, layout);
      RawRecord rec;
      while (cursor.Next(&rec) && side.writes.size() < kMaxFitGuestWrites * 4) {
        uint16_t type = 0;
        if (rec.payload.size() < 8) continue;
        std::memcpy(&type, rec.payload.data(), sizeof type);
        if (buf != nullptr && type == print->id && buf->offset < rec.payload.size()) {
          const auto* text = reinterpret_cast<const char*>(rec.payload.data()) + buf->offset;
          const size_t room = rec.payload.size() - buf->offset;
          if (auto early = EarlyWrite(std::string_view(text, strnlen(text, room)))) {
            side.writes.push_back(*early);
            ++side.early;
          }
          continue;
        }
        if (type != format->id) continue;
        const std::optional<uint64_t> s = FieldValue(status, rec.payload);
        if (!s || *s > 0xff) continue;
        const std::optional<uint64_t> i = FieldValue(index, rec.payload);
        side.writes.push_back({rec.timestamp, static_cast<uint32_t>(*s),
                               i && *i < 4096 ? static_cast<int64_t>(*i) : -1});
      }
      return true;
    });
  }
  if (side.writes.empty()) side.problem = "the boot recorded no status write";
  return side;
}

// Writes boot |boot|'s events re-stamped by |fit| to |out|; returns the
// events that could not be placed.
Result<uint64_t> WriteHostClockBoot(TraceDat& dat, const PageLayout& layout, const ClockFit& fit,
                                    const fs::path& out) {
  TraceDatWriterInput in;
  in.page_size = dat.page_size();
  in.long_size = dat.long_size();
  in.header_page = dat.header_page();
  in.header_event = dat.header_event();
  in.formats = dat.formats();
  in.kallsyms = dat.kallsyms();
  in.printk_formats = dat.printk_formats();
  in.cmdlines = dat.cmdlines();
  in.trace_clock = kHostTraceClock;
  std::deque<std::vector<std::byte>> storage;
  uint64_t unplaced = 0;
  const RestampFn to_host = [&](uint64_t ts) { return fit.ToHost(ts); };
  for (size_t c = 0; c < dat.cpus().size(); ++c) {
    in.cpus.emplace_back();
    Status s = dat.ForEachPage(c, [&](std::span<const std::byte> page, uint64_t) {
      RestampPage(page, layout, to_host, &storage, &in.cpus.back(), &unplaced);
      return true;
    });
    if (!s.ok()) return s.error();
  }
  // Into a capture: its Commit syncs every file at once.
  if (Status s = WriteTraceDat(out.string(), in, TraceDatSync::kCallerSyncs); !s.ok()) {
    return s.error();
  }
  return unplaced;
}

// |first_host_ns|: set to the host time of the fit's earliest pair, when it
// has one.
json TimelineBoot(uint32_t boot, const fs::path& path, const std::vector<HostStatusSet>& host,
                  std::optional<uint64_t>* first_host_ns) {
  json j = {{"boot", boot}, {"file", path.filename().string()}};
  Result<TraceDat> dat = TraceDat::Open(path.string());
  if (!dat.ok()) {
    j["error"] = dat.error().message;
    return j;
  }
  Result<PageLayout> layout = PageLayout::FromHeaderPage(dat->header_page(), dat->page_size());
  if (!layout.ok()) {
    j["error"] = path.filename().string() + ": " + layout.error().message;
    return j;
  }
  GuestSide side = GuestStatusWrites(*dat, *layout);
  const ClockFit fit = FitGuestToHost(side.writes, host);
  j["fit"] = fit.ToJson();
  if (!side.problem.empty()) j["fit"]["why"] = side.problem;
  j["fit"]["early_writes"] = side.early;
  if (!fit.aligned) return j;
  for (const ClockPair& p : fit.pairs) {
    const uint64_t at = host[p.host].host_ns;
    if (!*first_host_ns || at < **first_host_ns) *first_host_ns = at;
  }
  const std::string name = HostClockFileName(boot);
  Result<uint64_t> unplaced = WriteHostClockBoot(*dat, *layout, fit, path.parent_path() / name);
  if (!unplaced.ok()) {
    j["error"] = unplaced.error().message;
    return j;
  }
  j["host_clock_file"] = name;
  j["unplaced_events"] = *unplaced;
  return j;
}

}  // namespace

std::string HostClockFileName(uint32_t boot) { return BootFileName(boot, kBootHostClockSuffix); }

BootTimelineOutput BuildBootTimeline(const fs::path& dir, std::string_view qemu_log) {
  const auto start = std::chrono::steady_clock::now();
  BootTimelineOutput out;
  json& t = out.timeline;
  t = {{"clock", "host CLOCK_REALTIME"}, {"agent_clock_sync", kAgentSamples}};
  const QemuTraceLog log = ParseQemuTraceLog(qemu_log);
  HostTraceDat host = BuildHostTraceDat(log);
  json h = {{"log", std::string(kQemuTraceLogName)},
            {"events", host.events},
            {"malformed_lines", log.malformed_lines},
            {"dropped_lines", log.dropped_lines + host.dropped},
            {"first_ns", host.first_ns},
            {"last_ns", host.last_ns}};
  if (!log.first_problem.empty()) h["first_problem"] = log.first_problem;
  if (Status s =
          WriteTraceDat((dir / kHostTraceDatName).string(), host.input, TraceDatSync::kCallerSyncs);
      s.ok()) {
    h["file"] = kHostTraceDatName;
    out.files.push_back(kHostTraceDatName);
  } else {
    h["error"] = s.error().message;
  }
  t["host"] = std::move(h);
  const std::vector<HostStatusSet> status = HostStatusLines(log);
  // Newest boot first. An older boot's handshakes were all handled before
  // the newer boot's first: it is paired only with the host lines before
  // that. Else a boot the range kept two writes of (its ring mostly given
  // to the next boot after kexec) paired them with the next boot's
  // handshakes, 80 s off (debian13 kexec test, clean clone at 1e606c4).
  const auto files = BootFiles(dir);
  std::vector<json> fitted(files.size());
  std::vector<HostStatusSet> before_newer = status;
  for (size_t i = files.size(); i-- > 0;) {
    std::optional<uint64_t> first_host_ns;
    fitted[i] = TimelineBoot(files[i].first, files[i].second, before_newer, &first_host_ns);
    if (!first_host_ns) continue;
    std::erase_if(before_newer,
                  [&](const HostStatusSet& line) { return line.host_ns >= *first_host_ns; });
  }
  json boots = json::array();
  for (json& b : fitted) {
    if (b.contains("host_clock_file")) out.files.push_back(b["host_clock_file"]);
    boots.push_back(std::move(b));
  }
  // The newest boot's fit (the boot the capture is about) at the top.
  if (!boots.empty() && boots.back().contains("fit")) {
    for (const auto& [k, v] : boots.back()["fit"].items()) t[k] = v;
    t["boot"] = boots.back()["boot"];
  } else {
    t["aligned"] = false;
    t["thin"] = true;
    t["why"] = boots.empty() ? "the capture has no decoded boot (boot-<n>.trace.dat)"
                             : boots.back().value("error", std::string("no fit"));
  }
  t["clock"] = "host CLOCK_REALTIME";
  t["boots"] = std::move(boots);
  t["files"] = out.files;
  t["build_ms"] = MsBetween(start, std::chrono::steady_clock::now());
  return out;
}

void BootTimelineStep(PendingCapture& pending, CaptureManifest& manifest) {
  const fs::path log_path = pending.dir() / kQemuTraceLogName;
  std::error_code ec;
  if (!fs::exists(fs::symlink_status(log_path, ec))) return;
  Result<std::string> text = ReadCappedFile(log_path, kMaxQemuTraceLogBytes);
  if (!text.ok()) {
    manifest.extra["timeline"] = {{"aligned", false}, {"error", text.error().message}};
    return;
  }
  manifest.extra["timeline"] = BuildBootTimeline(pending.dir(), *text).timeline;
}

}  // namespace hvtrace::hostd
