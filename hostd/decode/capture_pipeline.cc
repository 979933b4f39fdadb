#include "capture_pipeline.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <deque>
#include <future>
#include <optional>
#include <system_error>
#include <tuple>

#include "boot_file_name.h"
#include "capped_file.h"
#include "crash_step.h"
#include "host_time.h"
#include "hvtrace/format.h"
#include "hvtrace/page.h"
#include "hvtrace/task_names.h"
#include "kallsyms_subset.h"
#include "kaslr_evidence.h"
#include "module_symbols.h"

namespace hvtrace::hostd {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// A hostile region can fail a check on every page; the manifest keeps the
// first ones and the count.
constexpr size_t kMaxIssuesInManifest = 1000;
constexpr size_t kMaxHeaderBytes = 64u << 10;
constexpr size_t kMaxSymbolBytes = 64u << 20;
constexpr size_t kMaxDirectoryFormats = 20000;
// Event ids are the records' 16-bit type field.
constexpr uint32_t kEventIds = 1u << 16;

void Progress(const BootMapCaptureOptions& opts, std::string_view stage, uint64_t done,
              uint64_t total) {
  if (opts.progress) opts.progress(CaptureProgress{stage, done, total});
}

// Everything decoded, before any file is written.
struct Decoded {
  // The caller's map (BootMapCaptureOptions::map) or |own_map|, read here
  // (on the heap: a Decoded moves).
  const BootMap* map = nullptr;
  std::unique_ptr<BootMap> own_map;
  PageLayout layout;
  CaptureResult result;
  // Per boot, per CPU: pages to write. Pages that need no repair point into
  // the caller's region copy; repaired ones into |repaired|.
  std::vector<std::vector<std::vector<std::span<const std::byte>>>> boot_pages;
  std::deque<std::vector<std::byte>> repaired;
  std::vector<BootFormats> per_boot;  // What each boot decodes with (empty: counts only).
};

json IssueJson(const BootMapIssue& issue) {
  return {{"cpu", issue.cpu},
          {"check", BootMapCheckName(issue.check)},
          {"offset", issue.offset},
          {"message", issue.message}};
}

// The 6.15+ scratch area: the previous (newest) boot's _text and modules,
// as the guest's instances/NAME/last_boot_info prints them.
json ScratchJson(const BootMapScratch& s) {
  json modules = json::array();
  for (const BootMapModule& m : s.modules) modules.push_back({{"name", m.name}, {"addr", m.addr}});
  json j = {
      {"layout", s.layout},           {"offset", s.offset},         {"size", s.size},
      {"text_addr", s.text_addr},     {"nr_entries", s.nr_entries}, {"modules", std::move(modules)},
      {"bad_entries", s.bad_entries}, {"problems", s.problems}};
  if (s.layout == "clock_id") j["clock_id"] = s.clock_id;
  return j;
}

json ValidationJson(const BootMap& map) {
  json cpus = json::array();
  for (const BootMapCpu& c : map.cpu) {
    uint64_t skipped = 0;
    for (const BootMapPage& p : c.pages) skipped += p.skipped;
    cpus.push_back({{"cpu", c.cpu},
                    {"offset", c.offset},
                    {"meta_found", c.meta_found},
                    {"meta_valid", c.meta_valid},
                    {"struct_size", c.struct_size},
                    {"subbuf_size", c.subbuf_size},
                    {"nr_subbufs", c.nr_subbufs},
                    {"reader_slot", c.reader_slot},
                    {"head_slot", c.head_slot},
                    {"commit_slot", c.commit_slot},
                    {"pages_in_read_order", c.pages.size()},
                    {"pages_skipped", skipped},
                    {"records", c.records.size()},
                    {"boots", c.boots},
                    {"issues", c.issues.size()}});
    if (map.layout == "linux-6.15-nr-invalid") {
      cpus.back()["kernel_nr_invalid"] = c.nr_invalid;
      cpus.back()["kernel_entry_bytes"] = c.entry_bytes;
    }
  }
  json issues = json::array();
  for (size_t i = 0; i < map.issues.size() && i < kMaxIssuesInManifest; ++i) {
    issues.push_back(IssueJson(map.issues[i]));
  }
  json out = {{"reader", "boot_map"},
              {"layout", map.layout},
              {"cpus", map.cpus},
              {"cpus_derived", map.cpus_derived},
              {"nr_subbufs", map.nr_subbufs},
              {"chunk_stride", map.chunk_stride},
              {"geometry_from", map.geometry_from},
              {"range_size", map.range_size},
              {"boots", map.boots},
              {"per_cpu", std::move(cpus)},
              {"issues", std::move(issues)},
              {"issues_total", map.issues.size()},
              {"issues_truncated", map.issues.size() > kMaxIssuesInManifest}};
  if (map.scratch.present) {
    out["global_meta"] = {{"struct_sizes", map.struct_sizes},
                          {"total_size", map.total_size},
                          {"buffers_offset", map.buffers_offset}};
    out["scratch"] = ScratchJson(map.scratch);
  }
  return out;
}

// Adds CPU |ci|'s good pages to their boots' lists in |d|. Events lost to a
// bad or skipped page are marked on the next page written, as the kernel
// marks a page after events it dropped (7.2 does the same for a sub-buffer
// it found invalid): trace-cmd and show print "CPU:N [EVENTS DROPPED]" where
// they went missing. A bad page is cut at its first bad record so trace-cmd
// reads exactly the records we kept; the stored missed count would sit past
// the new commit, so only the "events were missed" flag is kept.
void AddCpuPages(std::span<const std::byte> region, const BootMapCpu& c, size_t ci, Decoded& d,
                 CpuCaptureCounts& counts) {
  const uint32_t psize = d.layout.page_size;
  const size_t nboots = d.boot_pages.size();
  bool lost = false;
  for (const BootMapPage& p : c.pages) {
    if (p.skipped && p.time_went_backwards) lost = true;
    if (p.skipped || p.records == 0) {
      lost |= p.error != PageError::kOk;
      continue;
    }
    if (p.boot >= nboots || p.offset > region.size() || region.size() - p.offset < psize) continue;
    std::span<const std::byte> page = region.subspan(p.offset, psize);
    if (p.error != PageError::kOk || lost) {
      PageCursor cursor(page, d.layout);
      RawRecord rec;
      while (cursor.Next(&rec)) {
      }
      const uint32_t end = p.error != PageError::kOk
                               ? cursor.error_offset()
                               : d.layout.data_offset + cursor.header().commit;
      const uint32_t good = end > d.layout.data_offset ? end - d.layout.data_offset : 0;
      std::vector<std::byte>& fixed = d.repaired.emplace_back(page.begin(), page.end());
      const bool missed = cursor.header().missed_events || lost;
      counts.lost_marked += lost;
      const uint64_t stored =
          p.error == PageError::kOk && cursor.header().missed_stored ? kPageMissedStored : 0;
      SetPageCommit(fixed, d.layout, good | (missed ? kPageMissedEvents : 0) | stored);
      page = fixed;
    }
    lost = p.error != PageError::kOk;
    d.boot_pages[p.boot][ci].push_back(page);
    d.result.boots[p.boot].pages++;
  }
}

// Reads the region and sorts its good pages into boots. Without |formats|
// the 6.12 default page layout is assumed and no event id is checked.
// |per_boot| (may be empty when |formats| is null) names each boot's formats.
Result<Decoded> Decode(std::span<const std::byte> region, const KernelFormats* formats,
                       const BootFormatsFor& per_boot, const BootMapCaptureOptions& opts) {
  Decoded d;
  if (formats != nullptr) {
    Result<PageLayout> layout = PageLayout::FromHeaderPage(formats->header_page, opts.subbuf_size);
    if (!layout.ok()) {
      return Error{"formats " + formats->key + ": header_page: " + layout.error().message};
    }
    d.layout = *layout;
  } else {
    d.layout = PageLayout::Default();
  }
  BootMapOptions map_options;
  map_options.cpus = opts.cpus;
  map_options.layout = d.layout;
  map_options.threads = kDecodeThreads;
  Progress(opts, "decode", 0, 1);
  if (opts.map != nullptr && opts.map_read_with.cpus == map_options.cpus &&
      opts.map_read_with.layout == map_options.layout) {
    d.map = opts.map;
  } else {
    Result<BootMap> map = ReadBootMap(region, map_options);
    if (!map.ok())
      return Error{"region of " + std::to_string(region.size()) + " bytes: " + map.error().message};
    d.own_map = std::make_unique<BootMap>(std::move(*map));
    d.map = d.own_map.get();
  }
  const BootMap& m = *d.map;

  CaptureResult& r = d.result;
  r.layout = m.layout;
  r.cpus = m.cpus;
  r.validation = ValidationJson(m);
  const uint32_t nboots = std::max<uint32_t>(m.boots, 1);
  // Per boot: the ids its formats know (a bit per 16-bit id: looked up once per event).
  std::vector<std::vector<bool>> known_ids(nboots, std::vector<bool>(kEventIds, false));
  if (formats != nullptr) {
    std::vector<uint64_t> last(nboots, 0);
    for (const BootMapCpu& c : m.cpu) {
      for (const BootMapRecord& rec : c.records) {
        if (rec.boot < nboots) last[rec.boot] = std::max(last[rec.boot], rec.timestamp);
      }
    }
    for (uint32_t b = 0; b < nboots; ++b) {
      d.per_boot.push_back(per_boot(b, last));
      const KernelFormats* f = d.per_boot.back().formats ? d.per_boot.back().formats : formats;
      d.per_boot.back().formats = f;
      for (const CachedEventFormat& ev : f->events) {
        if (ev.parse_error.empty() && ev.id < kEventIds) known_ids[b][ev.id] = true;
      }
    }
  }
  d.boot_pages.assign(nboots, std::vector<std::vector<std::span<const std::byte>>>(m.cpu.size()));
  r.boots.resize(nboots);
  for (uint32_t b = 0; b < nboots; ++b) {
    r.boots[b].boot = b;
    r.boots[b].file = BootFileName(b);
    r.boots[b].events_per_cpu.assign(m.cpu.size(), 0);
  }
  r.unknown_id_events.assign(m.cpu.size(), 0);

  for (size_t ci = 0; ci < m.cpu.size(); ++ci) {
    const BootMapCpu& c = m.cpu[ci];
    CpuCaptureCounts counts;
    counts.cpu = c.cpu;
    counts.events = c.records.size();
    counts.pages = c.stats.pages;
    counts.lost_events = c.stats.missed_events;
    for (size_t e = 1; e < c.stats.rejected.size(); ++e) {
      if (c.stats.rejected[e] != 0) {
        counts.bad_pages[PageErrorName(static_cast<PageError>(e))] += c.stats.rejected[e];
      }
    }
    for (const BootMapPage& p : c.pages) {
      if (p.skipped) {
        counts.bad_pages[p.time_went_backwards ? "time_went_backwards" : "duplicate_slot"]++;
      }
    }
    AddCpuPages(region, c, ci, d, counts);

    for (const BootMapRecord& rec : c.records) {
      uint16_t type = 0;
      if (rec.payload.size() >= sizeof(type)) std::memcpy(&type, rec.payload.data(), sizeof(type));
      if (formats != nullptr && !known_ids[std::min(rec.boot, nboots - 1)][type]) {
        r.unknown_id_events[ci]++;
      }
      if (rec.boot >= nboots) continue;
      CaptureBoot& boot = r.boots[rec.boot];
      if (boot.events == 0 || rec.timestamp < boot.first_timestamp) {
        boot.first_timestamp = rec.timestamp;
      }
      boot.last_timestamp = std::max(boot.last_timestamp, rec.timestamp);
      boot.events++;
      boot.events_per_cpu[ci]++;
    }

    uint64_t bad = 0;
    for (const auto& [reason, n] : counts.bad_pages) bad += n;
    r.events += counts.events;
    r.bad_pages += bad;
    r.lost_events += counts.lost_events;
    r.unknown_id += r.unknown_id_events[ci];
    r.cpu_counts.push_back(std::move(counts));
  }
  r.validation["unknown_id_events"] = r.unknown_id_events;
  r.validation["saved_cmdlines"] =
      "none: the boot buffer holds no task names; trace-cmd names tasks seen in sched_switch "
      "events and prints <...> for the others";
  Progress(opts, "decode", 1, 1);
  return d;
}

// The kallsyms trace-cmd needs for the events of |map| (KallsymsSubset:
// kilobytes instead of the kernel's ~7 MB, printing the same).
// The newest boot of a 6.15+ range also gets its modules' text symbols where
// the scratch area says that boot had them (module_symbols.h); |modules|
// (may be null) says what was moved, for the manifest. The harvest's own
// module symbols are never used as they are: they are where the harvest
// guest loaded its modules, and a module of the captured boot loaded at
// another random address would print as one of them, or as the last core
// symbol plus hundreds of MiB, instead of a raw address (a 6.12 capture
// named softdog's timer `__init_scratch_end/0xffffffffe7cb1ec0`).
// |moved_out| gets the moved module symbols, for the boot's other subsets
// (the crash summary's events, crash_step.h).
std::string KallsymsForEvents(const BootMap& map, const KernelFormats& formats, int64_t delta,
                              uint32_t boot, json* modules, ModuleKallsyms* moved_out) {
  const std::shared_ptr<const KernelSymbols> symbols = SymbolsOf(formats);
  const bool newest = boot + 1 >= std::max(map.boots, 1u);
  std::optional<ModuleSymbols> moved;
  ModuleKallsyms moved_symbols;
  if (newest && !map.scratch.modules.empty()) {
    moved = MoveModuleSymbols(formats.kallsyms, *symbols, map.scratch.modules);
    if (!moved->kallsyms.empty()) {
      // Indexed once for this subset and the crash summary's.
      moved_symbols.symbols = KernelSymbols::Build(moved->kallsyms, {});
      moved_symbols.text = std::move(moved->kallsyms);
    }
  }
  std::string text;
  {
    BootKallsyms subset(formats.kallsyms, delta, symbols, &moved_symbols);
    if (subset.empty()) return text;
    for (const BootMapCpu& cpu : map.cpu) {
      for (const BootMapRecord& rec : cpu.records) {
        if (rec.boot == boot) subset.AddPayload(rec.payload);
      }
    }
    text = subset.Text();
  }
  if (moved && modules != nullptr) {
    *modules = {{"source", "scratch area"},
                {"modules_moved", moved->modules_moved},
                {"symbols", moved->symbols},
                {"not_harvested", moved->not_harvested},
                {"superseded", moved->superseded}};
  }
  *moved_out = std::move(moved_symbols);
  return text;
}

// The newest boot's last_boot_info as the guest kernel prints it
// (instances/NAME/last_boot_info: "<_text>\t[kernel]", then "<addr>\t<module>"
// lines), for trace-cmd's LAST_BOOT_INFO option; empty without a scratch
// area a boot wrote. The instance is hvtrace's boot instance, "boot_map".
std::string LastBootInfo(const BootMapScratch& scratch) {
  if (scratch.text_addr == 0) return std::string();
  std::string out = "boot_map:";
  char line[96];
  std::snprintf(line, sizeof line, "%llx\t[kernel]\n",
                static_cast<unsigned long long>(scratch.text_addr));
  out += line;
  for (const BootMapModule& m : scratch.modules) {
    std::snprintf(line, sizeof line, "%llx\t%s\n", static_cast<unsigned long long>(m.addr),
                  m.name.c_str());
    out += line;
  }
  return out;
}

// printk_formats lines are "0x<addr> : \"fmt\"": addresses in the kernel image.
std::string RelocatePrintkFormats(std::string_view text, int64_t delta) {
  std::string out;
  out.reserve(text.size());
  while (!text.empty()) {
    size_t nl = text.find('\n');
    std::string_view line = text.substr(0, nl == std::string_view::npos ? text.size() : nl + 1);
    text.remove_prefix(line.size());
    uint64_t addr = 0;
    if (line.starts_with("0x")) {
      const auto [end, ec] = std::from_chars(line.data() + 2, line.data() + line.size(), addr, 16);
      if (ec == std::errc() && addr != 0) {
        char hex[24];
        std::snprintf(hex, sizeof hex, "0x%llx",
                      static_cast<unsigned long long>(addr + static_cast<uint64_t>(delta)));
        out.append(hex);
        out.append(line.substr(static_cast<size_t>(end - line.data())));
        continue;
      }
    }
    out.append(line);
  }
  return out;
}

TraceDatWriterInput WriterInput(const KernelFormats& formats, const BootMapCaptureOptions& opts,
                                uint32_t page_size) {
  TraceDatWriterInput in;
  in.page_size = page_size;
  in.long_size = opts.long_size;
  in.header_page = formats.header_page;
  in.header_event = formats.header_event;
  for (const CachedEventFormat& ev : formats.events) {
    // A format our parser refused may also trip libtraceevent in trace-cmd;
    // its events count as unknown ids instead.
    if (ev.parse_error.empty()) in.formats.push_back({ev.system, ev.text});
  }
  // kallsyms: only the symbols the events need (KallsymsForEvents, in WriteBoots).
  in.printk_formats = formats.printk_formats;
  in.trace_clock = opts.trace_clock;
  return in;
}

struct NamesFound {
  std::string text;  // saved_cmdlines.
  double ms = 0;     // On its own thread.
  TaskNameStats stats;
};

// trace-cmd keeps one name per pid: the one covering most of its events
// (MostUsedNames). It needs neither the KASLR offset nor the symbols, so it
// runs on a thread of its own while the caller finds those; inline when no
// thread can be had. The arguments must outlive the future.
// |work| on a thread of its own; inline (at get()) when no thread can be had.
template <class Work>
auto RunBeside(Work work) -> std::future<decltype(work())> {
  try {
    return std::async(std::launch::async, std::move(work));
  } catch (const std::system_error&) {
    return std::async(std::launch::deferred, std::move(work));
  }
}

std::future<NamesFound> FindNamesBeside(
    const std::vector<FormatText>& formats, const PageLayout& layout,
    const std::vector<std::vector<std::span<const std::byte>>>& pages, std::string_view fallback) {
  auto find = [&formats, layout, &pages, fallback] {
    const auto start = std::chrono::steady_clock::now();
    NamesFound found;
    found.text = MostUsedNames(formats, layout, pages, fallback, &found.stats);
    found.ms = MsBetween(start, std::chrono::steady_clock::now());
    return found;
  };
  return RunBeside(find);
}

}  // namespace

std::optional<int64_t> KaslrDeltaOf(const json& kaslr) {
  if (!kaslr.is_object()) return std::nullopt;
  const auto it = kaslr.find("delta");
  if (it == kaslr.end() || !it->is_number_integer()) return std::nullopt;
  return it->get<int64_t>();
}

namespace {

// Writes one trace.dat per boot into |dir|, each with the formats its
// BootFormats names and symbols only at the KASLR offset that boot's own
// events prove (EstablishKaslr): raw addresses otherwise. |sync|: kCallerSyncs
// into a capture (its Commit syncs every file at once).
Status WriteBoots(Decoded& d, const BootMapCaptureOptions& opts, const fs::path& dir,
                  TraceDatSync sync) {
  const auto start = std::chrono::steady_clock::now();
  const bool per_boot = std::any_of(d.per_boot.begin(), d.per_boot.end(),
                                    [](const BootFormats& b) { return b.own_symbols; });
  uint64_t total = 0, done = 0;
  for (const CaptureBoot& b : d.result.boots) total += b.pages;
  Progress(opts, "write", 0, total);
  for (CaptureBoot& boot : d.result.boots) {
    const BootFormats& bf = d.per_boot.at(boot.boot);
    const KernelFormats& formats = *bf.formats;
    auto lap = std::chrono::steady_clock::now();
    // Adds the time since the last lap to |ms|.
    auto split = [&lap](double& ms) {
      const auto now = std::chrono::steady_clock::now();
      ms += MsBetween(lap, now);
      lap = now;
    };
    TraceDatWriterInput in = WriterInput(formats, opts, d.layout.page_size);
    if (boot.boot + 1 == d.result.boots.size()) in.last_boot_info = LastBootInfo(d.map->scratch);
    std::future<NamesFound> names =
        FindNamesBeside(in.formats, d.layout, d.boot_pages[boot.boot], bf.cmdlines);
    KaslrVerdict kaslr = EstablishKaslr(
        *d.map, boot.boot, formats, MetaTextDelta(*d.map, SymbolsOf(formats)->image(), boot.boot),
        bf.own_symbols);
    const bool newest = boot.boot + 1 == d.result.boots.size();
    if (newest && opts.newest_kaslr) opts.newest_kaslr(KaslrDeltaOf(kaslr.manifest));
    split(d.result.kaslr_ms);
    in.printk_formats.clear();
    ModuleKallsyms moved_modules;  // Read by the crash summary's thread below.
    if (kaslr.use_symbols) {
      json modules;
      in.kallsyms =
          KallsymsForEvents(*d.map, formats, kaslr.delta, boot.boot, &modules, &moved_modules);
      if (!modules.is_null()) kaslr.manifest["module_symbols"] = std::move(modules);
      in.printk_formats = kaslr.delta == 0
                              ? formats.printk_formats
                              : RelocatePrintkFormats(formats.printk_formats, kaslr.delta);
    }
    split(d.result.symbols_ms);
    NamesFound found = names.get();
    in.cmdlines = std::move(found.text);
    d.result.names_ms += found.ms;
    split(d.result.names_wait_ms);
    boot.decoded_with = per_boot ? bf.source : json::object();
    boot.decoded_with["kaslr"] = std::move(kaslr.manifest);
    boot.decoded_with["task_names"] = {{"named", found.stats.named},
                                       {"inferred", found.stats.inferred}};
    in.cpus = std::move(d.boot_pages[boot.boot]);
    const fs::path path = dir / boot.file;
    // The kernel log and crash summary beside the trace.dat file: both only
    // read |in| and the map (a 6.12 panic: 2-3 ms each, one after the other
    // before).
    std::future<Result<BootLogResult>> log_beside =
        RunBeside([&, newest, use = kaslr.use_symbols, delta = kaslr.delta] {
          return WriteBootKernelLog({d.map, boot.boot, &formats, &in, use, delta,
                                     newest ? opts.ring_log : nullptr, &moved_modules},
                                    dir);
        });
    lap = std::chrono::steady_clock::now();
    Status s = WriteTraceDat(path.string(), in, sync);
    split(d.result.files_ms);
    Result<BootLogResult> log = log_beside.get();
    split(d.result.kernel_log_wait_ms);
    d.boot_pages[boot.boot] = std::move(in.cpus);
    if (!s.ok()) return Error{"boot " + std::to_string(boot.boot) + ": " + s.error().message};
    d.result.files.push_back(boot.file);
    if (log.ok()) d.result.kernel_log_ms += log->ms;
    if (!log.ok()) return Error{"boot " + std::to_string(boot.boot) + ": " + log.error().message};
    if (!log->file.empty()) d.result.files.push_back(log->file);
    boot.kernel_log = std::move(log->kernel_log);
    boot.crash = std::move(log->crash);
    done += boot.pages;
    Progress(opts, "write", done, total);
  }
  d.result.validation["kaslr"] = {
      {"per_boot", true},
      {"see", "extra.boots[n].decoded_with.kaslr: each boot's offset from its own evidence"}};
  if (per_boot) {
    d.result.validation["saved_cmdlines"] =
        "per boot from the metadata channel (kComms) when it sent them; see extra.boots";
  }
  d.result.write_ms += MsBetween(start, std::chrono::steady_clock::now());
  return {};
}

}  // namespace

BootFormatsFor SameFormats(const KernelFormats& formats) {
  return [&formats](uint32_t, std::span<const uint64_t>) {
    return BootFormats{&formats, {}, false, nullptr};
  };
}

Result<CaptureResult> BuildBootMapCapture(std::span<const std::byte> region_copy,
                                          const KernelFormats& formats,
                                          const BootMapCaptureOptions& opts, PendingCapture& out,
                                          CaptureManifest& manifest) {
  return BuildBootMapCapture(region_copy, formats, SameFormats(formats), opts, out, manifest);
}

Result<CaptureResult> BuildBootMapCapture(std::span<const std::byte> region_copy,
                                          const KernelFormats& formats,
                                          const BootFormatsFor& per_boot,
                                          const BootMapCaptureOptions& opts, PendingCapture& out,
                                          CaptureManifest& manifest) {
  double region_ms = 0;
  if (opts.write_region) {
    const auto region_start = std::chrono::steady_clock::now();
    Progress(opts, "region", 0, region_copy.size());
    Status s = out.WriteFile("region.bin", region_copy);
    if (!s.ok()) return s.error();
    Progress(opts, "region", region_copy.size(), region_copy.size());
    region_ms = MsBetween(region_start, std::chrono::steady_clock::now());
  }
  Result<CaptureResult> r =
      BuildBootMapCapture(region_copy, formats, per_boot, opts, out.dir(), manifest);
  if (r.ok() && opts.write_region) {
    r->files.insert(r->files.begin(), "region.bin");
    r->write_ms += region_ms;
  }
  return r;
}

Result<CaptureResult> BuildBootMapCapture(std::span<const std::byte> region_copy,
                                          const KernelFormats& formats,
                                          const BootFormatsFor& per_boot,
                                          const BootMapCaptureOptions& opts, const fs::path& dir,
                                          CaptureManifest& manifest) {
  const auto start = std::chrono::steady_clock::now();
  Result<Decoded> d = Decode(region_copy, &formats, per_boot, opts);
  if (!d.ok()) return d.error();
  d->result.decode_ms = MsBetween(start, std::chrono::steady_clock::now());
  Status s = WriteBoots(*d, opts, dir, TraceDatSync::kCallerSyncs);
  if (!s.ok()) return s.error();

  CaptureResult& r = d->result;
  if (!manifest.kernel.is_object()) manifest.kernel = json::object();
  manifest.kernel["formats_key"] = formats.key;
  if (!formats.release.empty()) manifest.kernel["release"] = formats.release;
  if (!formats.proc_version.empty()) manifest.kernel["proc_version"] = formats.proc_version;
  manifest.cpus = r.cpu_counts;
  manifest.validation = r.validation;
  if (!manifest.extra.is_object()) manifest.extra = json::object();
  manifest.extra["boots"] = BootsToJson(r);
  manifest.extra["trace_clock"] = opts.trace_clock;
  manifest.extra["pipeline_ms"] = {{"decode", r.decode_ms},
                                   {"write", r.write_ms},
                                   {"write_kaslr", r.kaslr_ms},
                                   {"write_symbols", r.symbols_ms},
                                   {"write_names", r.names_ms},
                                   {"write_names_wait", r.names_wait_ms},
                                   {"write_files", r.files_ms},
                                   {"write_kernel_log", r.kernel_log_ms},
                                   {"write_kernel_log_wait", r.kernel_log_wait_ms}};
  // The crash the capture is about: the newest boot's that has one.
  for (const CaptureBoot& b : r.boots) {
    if (!b.crash.is_null()) manifest.crash = b.crash;
  }
  return std::move(r);
}

Result<CaptureResult> CountBootMapCapture(std::span<const std::byte> region_copy,
                                          const BootMapCaptureOptions& opts,
                                          CaptureManifest& manifest) {
  const auto start = std::chrono::steady_clock::now();
  Result<Decoded> d = Decode(region_copy, nullptr, {}, opts);
  if (!d.ok()) return d.error();
  CaptureResult& r = d->result;
  r.decode_ms = MsBetween(start, std::chrono::steady_clock::now());
  manifest.cpus = r.cpu_counts;
  manifest.validation = r.validation;
  manifest.validation["unknown_id_events"] = "not checked: no formats";
  if (!manifest.extra.is_object()) manifest.extra = json::object();
  manifest.extra["boots"] = BootsToJson(r);
  return std::move(r);
}

json BootsToJson(const CaptureResult& result) {
  json boots = json::array();
  for (const CaptureBoot& b : result.boots) {
    boots.push_back({{"boot", b.boot},
                     {"file", b.file},
                     {"events", b.events},
                     {"pages", b.pages},
                     {"first_timestamp_ns", b.first_timestamp},
                     {"last_timestamp_ns", b.last_timestamp},
                     {"events_per_cpu", b.events_per_cpu}});
    if (!b.decoded_with.is_null()) boots.back()["decoded_with"] = b.decoded_with;
    if (!b.kernel_log.is_null()) boots.back()["kernel_log"] = b.kernel_log;
  }
  return boots;
}

Result<KernelFormats> KernelFormatsFromDirectory(const fs::path& dir) {
  KernelFormats out;
  out.key = dir.string();
  struct {
    const char* name;
    size_t cap;
    bool optional;
    std::string* into;
  } files[] = {{"header_page", kMaxHeaderBytes, false, &out.header_page},
               {"header_event", kMaxHeaderBytes, false, &out.header_event},
               {"kallsyms", kMaxSymbolBytes, true, &out.kallsyms},
               {"printk_formats", kMaxSymbolBytes, true, &out.printk_formats}};
  for (auto& f : files) {
    Result<std::string> text = ReadCappedFile(dir / f.name, f.cap, f.optional);
    if (!text.ok()) return Error{"formats directory " + dir.string() + ": " + text.error().message};
    *f.into = std::move(*text);
  }
  // events/<system>/<event>/format (tracefs, `trace-cmd` dumps) or
  // formats/<system>/<event>/format (the boot_map fixtures).
  fs::path root;
  for (const char* sub : {"events", "formats"}) {
    std::error_code ec;
    if (fs::is_directory(dir / sub, ec)) root = dir / sub;
  }
  if (root.empty()) {
    return Error{"formats directory " + dir.string() + " has no events/ or formats/ subdirectory"};
  }
  std::error_code ec;
  for (fs::directory_iterator sys(root, ec), end; !ec && sys != end; sys.increment(ec)) {
    if (!sys->is_directory(ec) || sys->is_symlink(ec)) continue;
    for (fs::directory_iterator ev(sys->path(), ec); !ec && ev != end; ev.increment(ec)) {
      if (!ev->is_directory(ec) || ev->is_symlink(ec)) continue;
      const fs::path path = ev->path() / "format";
      if (!fs::is_regular_file(fs::symlink_status(path, ec))) continue;
      if (out.events.size() >= kMaxDirectoryFormats) {
        return Error{"formats directory " + dir.string() + " holds more than " +
                     std::to_string(kMaxDirectoryFormats) + " formats"};
      }
      Result<std::string> text = ReadCappedFile(path, kMaxFormatTextSize);
      if (!text.ok())
        return Error{"formats directory " + dir.string() + ": " + text.error().message};
      CachedEventFormat f;
      f.system = sys->path().filename().string();
      f.name = ev->path().filename().string();
      Result<EventFormat> parsed = ParseEventFormat(f.system, *text);
      if (parsed.ok()) {
        f.id = parsed->id;
      } else {
        f.parse_error = parsed.error().message;
      }
      f.text = std::move(*text);
      out.events.push_back(std::move(f));
    }
  }
  if (ec) return Error{"listing " + root.string() + ": " + ec.message()};
  std::sort(out.events.begin(), out.events.end(), [](const auto& a, const auto& b) {
    return std::tie(a.system, a.name) < std::tie(b.system, b.name);
  });
  return out;
}

}  // namespace hvtrace::hostd
