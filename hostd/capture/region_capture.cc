#include "region_capture.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <set>

#include "event_id_table.h"
#include "hvtrace/page.h"
#include "hvtrace/region.h"
#include "hvtrace/region_clock.h"
#include "hvtrace/tracedat_writer.h"
#include "kallsyms_subset.h"
#include "live_region.h"
#include "restamp_pages.h"

namespace hvtrace::hostd {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr size_t kMaxProblemsInManifest = 256;

void StoreLe(std::span<std::byte> page, uint32_t offset, uint32_t size, uint64_t value) {
  for (uint32_t i = 0; i < size; ++i) page[offset + i] = static_cast<std::byte>(value >> (8 * i));
}

// What one boot generation's trace.dat is made of.
struct GenerationPlan {
  RegionGenerationFile file;
  std::string header_page, header_event;
  PageLayout cpu_layout;
  std::vector<FormatText> formats;
  std::set<uint32_t> known_ids;
  // Kernel CPUs first (index = CPU), then direct-write rings.
  std::vector<std::vector<std::span<const std::byte>>> pages;
  bool dw_included = true;
  // Direct-write rings stamped with TSC ticks that could not be put on the
  // trace clock: their own file, on the "x86-tsc" clock.
  bool unplaced = false;
  // The guest's symbols, for the kallsyms the file's events name.
  std::unique_ptr<KallsymsSubset> symbols;
};

GenerationPlan PlanGeneration(const RegionSnapshot& s, uint32_t generation, bool unplaced) {
  GenerationPlan g;
  g.file.generation = generation;
  g.file.file = unplaced ? RegionUnplacedTraceDatName(generation) : RegionTraceDatName(generation);
  g.unplaced = unplaced;
  g.cpu_layout = PageLayout::Default(s.geometry.slot_size);
  for (const RegionFormat& f : s.formats) {
    if (f.boot_generation != generation) continue;
    switch (f.kind) {
      case region::kFormatHeaderPage:
        if (auto l = PageLayout::FromHeaderPage(f.text, s.geometry.slot_size); l.ok()) {
          g.header_page = f.text;
          g.cpu_layout = *l;
        }
        break;
      case region::kFormatHeaderEvent:
        g.header_event = f.text;
        break;
      case region::kFormatKernelEvent:
      case region::kFormatDwEvent:
        if (f.parsed && g.known_ids.insert(f.id).second) g.formats.push_back({f.system, f.text});
        break;
      default:
        break;
    }
  }
  if (g.header_page.empty()) {
    // The guest did not publish it: the 64-bit layout the reader assumed.
    g.header_page =
        "\tfield: u64 timestamp;\toffset:0;\tsize:8;\tsigned:0;\n"
        "\tfield: local_t commit;\toffset:8;\tsize:8;\tsigned:1;\n"
        "\tfield: int overwrite;\toffset:8;\tsize:1;\tsigned:1;\n"
        "\tfield: char data;\toffset:16;\tsize:" +
        std::to_string(s.geometry.slot_size - 16) + ";\tsigned:1;\n";
  }
  // Direct-write pages use the 64-bit layout; one header_page describes every
  // CPU of a trace.dat, so they only go in when the kernel's layout agrees.
  const PageLayout& dw = s.dw_layout;
  g.dw_included = g.cpu_layout.commit_offset == dw.commit_offset &&
                  g.cpu_layout.commit_size == dw.commit_size &&
                  g.cpu_layout.data_offset == dw.data_offset &&
                  g.cpu_layout.timestamp_offset == dw.timestamp_offset;
  return g;
}

// The page as trace-cmd may see it: unchanged when every record walked,
// else cut at the first bad record (the stored missed count would sit past
// the new commit, so only the "events were missed" flag is kept).
std::span<const std::byte> WritablePage(const RegionPage& p, const PageLayout& layout,
                                        std::deque<std::vector<std::byte>>* repaired) {
  if (p.page_error == PageError::kOk) return p.page;
  PageCursor cursor(p.page, layout);
  RawRecord rec;
  while (cursor.Next(&rec)) {
  }
  const uint32_t good =
      cursor.error_offset() > layout.data_offset ? cursor.error_offset() - layout.data_offset : 0;
  std::vector<std::byte>& fixed = repaired->emplace_back(p.page.begin(), p.page.end());
  const uint64_t flags = cursor.header().missed_events ? kPageMissedEvents : 0;
  StoreLe(fixed, layout.commit_offset, layout.commit_size, good | flags);
  std::fill(fixed.begin() + layout.data_offset + good, fixed.end(), std::byte{0});
  return fixed;
}

json GuestJson(const RegionGuestInfo& g) {
  const region::GuestStatus& st = g.status;
  return {{"present", g.present},
          {"boot_generation", g.boot_generation},
          {"boot_id", g.boot_id},
          {"kernel_release", g.kernel_release},
          {"nr_cpus", g.nr_cpus},
          {"trace_clock", TraceClockName(g.trace_clock)},
          {"page_size", g.page_size},
          {"agent_pid", g.agent_pid},
          {"attach_mono_ns", g.attach_mono_ns},
          {"state", st.state},
          {"heartbeat", st.heartbeat},
          {"heartbeat_mono_ns", st.heartbeat_mono_ns},
          {"last_push_mono_ns", st.last_push_mono_ns},
          {"pages_pushed", st.pages_pushed},
          {"events_enabled", st.events_enabled},
          {"dw_rings_exhausted", st.dw_rings_exhausted}};
}

json IssuesJson(const RegionSnapshot& s) {
  json by_reason = json::object();
  for (size_t i = 0; i < s.issues.size(); ++i) {
    if (s.issues[i] != 0) by_reason[RegionIssueName(static_cast<RegionIssue>(i))] = s.issues[i];
  }
  json first = json::array();
  for (const RegionProblem& p : s.problems) {
    if (first.size() >= kMaxProblemsInManifest) break;
    first.push_back({{"issue", RegionIssueName(p.issue)},
                     {"where", p.where},
                     {"offset", p.offset},
                     {"detail", p.detail}});
  }
  return {{"total", s.issue_total()}, {"by_reason", by_reason}, {"first", first}};
}

}  // namespace

std::string RegionTraceDatName(uint64_t generation) {
  return "region-gen-" + std::to_string(generation) + ".trace.dat";
}

std::string RegionUnplacedTraceDatName(uint64_t generation) {
  return "region-gen-" + std::to_string(generation) + "-tsc.trace.dat";
}

Result<RegionCaptureResult> WriteRegionTraceDats(const RegionSnapshot& s, const fs::path& dir,
                                                 const RegionTextCache* texts) {
  RegionCaptureResult r;
  const uint32_t ncpu = static_cast<uint32_t>(s.cpus.size());
  const uint32_t nrings = ncpu + static_cast<uint32_t>(s.dw_rings.size());

  // Generations that have pages, oldest first.
  std::set<uint32_t> generations;
  for (const auto* rings : {&s.cpus, &s.dw_rings}) {
    for (const RegionRing& ring : *rings) {
      for (const RegionPage& p : ring.pages) generations.insert(p.boot_generation);
    }
  }

  static const std::string kNone;
  auto text_of = [&](TextAreaKind kind, uint64_t gen) -> const std::string& {
    return texts != nullptr ? texts->Text(kind, gen) : kNone;
  };

  // Per generation: the file on the trace clock, and (only when needed) the
  // one for TSC rings that could not be put on it.
  std::map<std::pair<uint32_t, bool>, GenerationPlan> plans;
  auto plan = [&](uint32_t gen, bool unplaced) -> GenerationPlan& {
    auto it = plans.find({gen, unplaced});
    if (it == plans.end()) {
      it = plans.emplace(std::pair{gen, unplaced}, PlanGeneration(s, gen, unplaced)).first;
      it->second.pages.assign(nrings, {});
      // The TSC file holds direct-write rings only: no kernel pointers.
      if (const std::string& text = text_of(TextAreaKind::kSymbols, gen);
          !unplaced && !text.empty()) {
        it->second.symbols = std::make_unique<KallsymsSubset>(text, 0);
      }
    }
    return it->second;
  };
  for (uint32_t gen : generations) plan(gen, false);

  const RegionTimeline timeline(s.guest.trace_clock, s.clock_sync);
  r.cpu_counts.resize(nrings);
  std::deque<std::vector<std::byte>> repaired;
  json rings = json::array();
  auto count_ring = [&](const RegionRing& ring, uint32_t slot_index) {
    CpuCaptureCounts& counts = r.cpu_counts[slot_index];
    counts.cpu = static_cast<int>(slot_index);
    counts.lost_events = ring.lost_events;
    json rj = {{"trace_cpu", slot_index},
               {"kind", ring.direct_write ? "direct-write" : "cpu"},
               {"index", ring.index},
               {"published", ring.published},
               {"lost_events", ring.lost_events},
               {"pages_present", ring.pages.size()}};
    const RegionTimeline::Mode mode =
        ring.direct_write ? timeline.ModeOf(ring.clock) : RegionTimeline::Mode::kAsIs;
    uint64_t off_clock = 0, pages_converted = 0, pages_unplaced = 0;
    if (ring.direct_write) {
      rj["pid"] = ring.pid;
      rj["tid"] = ring.tid;
      rj["comm"] = ring.comm;
      rj["clock"] = ring.clock == region::kClockMono || ring.clock == region::kClockTsc
                        ? TraceClockName(ring.clock)
                        : "unknown " + std::to_string(ring.clock);
      rj["time_stamps"] =
          mode == RegionTimeline::Mode::kConvert
              ? std::string("converted to ") + TraceClockName(s.guest.trace_clock)
          : mode == RegionTimeline::Mode::kUnplaceable
              ? std::string(
                    "raw TSC ticks, in region-gen-<N>-tsc.trace.dat: the region has "
                    "no usable clock-sync samples")
              : std::string("as written");
    } else {
      rj["overrun"] = ring.overrun;
    }
    for (const RegionPage& p : ring.pages) {
      // Per page: pages a ring's earlier owner left may use another clock.
      const RegionTimeline::Mode page_mode =
          ring.direct_write ? timeline.ModeOf(p.clock) : RegionTimeline::Mode::kAsIs;
      GenerationPlan& g = plan(p.boot_generation, page_mode == RegionTimeline::Mode::kUnplaceable);
      if (ring.direct_write && !g.dw_included) {
        counts.bad_pages["dw_layout_differs"]++;
        continue;
      }
      const PageLayout layout = ring.direct_write ? s.dw_layout : g.cpu_layout;
      if (p.page_error != PageError::kOk) counts.bad_pages[PageErrorName(p.page_error)]++;
      counts.pages++;
      if (p.records == 0) continue;
      // What goes into the file: the page itself (cut at its first bad
      // record), or its good records restamped onto the trace clock.
      std::vector<std::span<const std::byte>> out;
      if (page_mode == RegionTimeline::Mode::kConvert) {
        RestampPage(
            p.page, layout, [&](uint64_t ts) { return timeline.ToTraceClock(p.clock, ts); },
            &repaired, &out, &off_clock);
        ++pages_converted;
      } else {
        pages_unplaced += page_mode == RegionTimeline::Mode::kUnplaceable;
        out.push_back(WritablePage(p, layout, &repaired));
      }
      for (std::span<const std::byte> page : out) {
        PageStats stats;
        WalkPage(page, layout, &stats, [&](const RawRecord& rec) {
          uint16_t type = 0;
          if (rec.payload.size() >= sizeof type)
            std::memcpy(&type, rec.payload.data(), sizeof type);
          RegionGenerationFile& f = g.file;
          if (!g.known_ids.contains(type)) {
            f.unknown_id++;
            r.unknown_id++;
          }
          if (f.events == 0 || rec.timestamp < f.first_timestamp) f.first_timestamp = rec.timestamp;
          f.last_timestamp = std::max(f.last_timestamp, rec.timestamp);
          if (ring.direct_write) {
            f.dw_events++;
            f.last_dw_timestamp = std::max(f.last_dw_timestamp, rec.timestamp);
          } else {
            f.kernel_events++;
            f.last_kernel_timestamp = std::max(f.last_kernel_timestamp, rec.timestamp);
          }
          f.events++;
          counts.events++;
          if (g.symbols) g.symbols->AddPayload(rec.payload);
        });
        if (stats.records == 0) continue;
        g.pages[slot_index].push_back(page);
        g.file.pages++;
      }
    }
    if (ring.direct_write) {
      rj["pages_converted"] = pages_converted;
      rj["pages_unplaced"] = pages_unplaced;
    }
    if (off_clock != 0) {
      // Stamps the conversion cannot represent (absurd ticks): left out of
      // the file, still in attach-region.bin.
      rj["events_off_clock"] = off_clock;
      r.dw_events_off_clock += off_clock;
    }
    rings.push_back(std::move(rj));
  };
  for (uint32_t i = 0; i < ncpu; ++i) count_ring(s.cpus[i], i);
  for (uint32_t i = 0; i < s.dw_rings.size(); ++i) count_ring(s.dw_rings[i], ncpu + i);

  // Direct-write threads name themselves; the kernel's list comes first
  // (trace-cmd keeps a pid's first line).
  std::string dw_cmdlines;
  for (const RegionRing& ring : s.dw_rings) {
    if (ring.tid != 0 && !ring.comm.empty())
      dw_cmdlines += std::to_string(ring.tid) + " " + ring.comm + "\n";
  }
  json names = json::object();

  for (auto& [key, g] : plans) {
    const uint32_t gen = key.first;
    TraceDatWriterInput in;
    in.page_size = s.geometry.slot_size;
    in.long_size = 8;
    in.header_page = g.header_page;
    in.header_event = g.header_event;
    in.formats = g.formats;
    in.cmdlines = text_of(TextAreaKind::kComms, gen) + dw_cmdlines;
    // Only the symbols the events name (KallsymsSubset): trace-cmd prints
    // the same, and the file does not carry the kernel's whole table.
    if (g.symbols) in.kallsyms = g.symbols->Text();
    if (!key.second) {
      auto lines = [](const std::string& t) {
        return static_cast<uint64_t>(std::count(t.begin(), t.end(), '\n'));
      };
      names[std::to_string(gen)] = {{"symbols", lines(text_of(TextAreaKind::kSymbols, gen))},
                                    {"symbols_in_file", lines(in.kallsyms)},
                                    {"guest_tasks", lines(text_of(TextAreaKind::kComms, gen))},
                                    {"dw_threads", lines(dw_cmdlines)}};
    }
    in.trace_clock =
        g.unplaced ? TraceClockName(region::kClockTsc) : TraceClockName(s.guest.trace_clock);
    in.cpus = std::move(g.pages);
    const fs::path path = dir / g.file.file;
    // Into a capture: its Commit syncs every file at once.
    if (Status st = WriteTraceDat(path.string(), in, TraceDatSync::kCallerSyncs); !st.ok()) {
      return Error{"boot generation " + std::to_string(gen) + ": " + st.error().message};
    }
    g.file.trace_clock = in.trace_clock;
    r.files.push_back(g.file.file);
    r.events += g.file.events;
    r.pages += g.file.pages;
    r.generations.push_back(g.file);
  }
  for (const CpuCaptureCounts& c : r.cpu_counts) {
    r.lost_events += c.lost_events;
    for (const auto& [reason, n] : c.bad_pages) r.bad_slots += n;
  }
  const uint64_t skipped_slots = s.issue_total() - s.issue_count(RegionIssue::kSlotPageError);
  json gens = json::array();
  for (const RegionGenerationFile& f : r.generations) {
    gens.push_back({{"generation", f.generation},
                    {"file", f.file},
                    {"trace_clock", f.trace_clock},
                    {"events", f.events},
                    {"kernel_events", f.kernel_events},
                    {"dw_events", f.dw_events},
                    {"pages", f.pages},
                    {"unknown_id", f.unknown_id},
                    {"first_ts_ns", f.first_timestamp},
                    {"last_ts_ns", f.last_timestamp},
                    {"last_kernel_ts_ns", f.last_kernel_timestamp},
                    {"last_dw_ts_ns", f.last_dw_timestamp}});
  }
  const region::GuestStatus& st = s.guest.status;
  r.attach = {{"events_across_generations", EventsAcrossGenerations(s)},
              {"guest", GuestJson(s.guest)},
              {"geometry",
               {{"region_size", s.geometry.region_size},
                {"region_id", s.geometry.region_id},
                {"slot_size", s.geometry.slot_size},
                {"max_cpus", s.geometry.max_cpus},
                {"slots_per_cpu", s.geometry.slots_per_cpu},
                {"dw_rings", s.geometry.dw_rings},
                {"dw_slots", s.geometry.dw_slots}}},
              {"loss_window",
               {{"agent_max_push_gap_ns", st.max_push_gap_ns},
                {"agent_last_push_mono_ns", st.last_push_mono_ns},
                {"note",
                 "kernel events written after the agent's last push were still in guest memory; "
                 "direct-write events are in the region as soon as their write returns"}}},
              {"generations", gens},
              {"rings", rings},
              {"trace_cpus", {{"kernel", ncpu}, {"direct_write_first", ncpu}}},
              {"issues", IssuesJson(s)},
              {"slots_skipped", skipped_slots},
              {"unknown_id_events", r.unknown_id},
              {"dw_events_off_clock", r.dw_events_off_clock},
              {"clock_sync",
               {{"samples", s.clock_sync.size()},
                {"sound", timeline.tsc().used()},
                {"dropped", timeline.tsc().dropped()},
                {"tsc_hz", timeline.tsc().tsc_hz()}}},
              {"names",
               {{"per_generation", names},
                {"guest_symbols_state", st.symbols_state},
                {"note",
                 "symbols and task names from the guest agent's text areas; without them "
                 "pointers print as addresses and kernel tasks as <...>"}}}};
  return r;
}

Result<RegionCaptureResult> BuildRegionCapture(std::vector<std::byte>& copy,
                                               const RegionGeometry& geometry,
                                               const RegionCaptureOptions& options,
                                               PendingCapture& out, CaptureManifest& manifest) {
  const auto start = std::chrono::steady_clock::now();
  if (options.write_region) {
    if (Status s = out.WriteFile("attach-region.bin", copy); !s.ok()) return s.error();
  }
  const auto written = std::chrono::steady_clock::now();
  auto snapshot = ReadRegion(std::move(copy), geometry);
  if (!snapshot.ok()) return snapshot.error();
  struct HandBack {
    std::vector<std::byte>& to;
    std::vector<std::byte>& from;
    ~HandBack() { to = std::move(from); }
  } hand_back{copy, snapshot->copy};
  RegionTextCache texts;
  texts.Update(&*snapshot);  // A bad area is counted among the snapshot's issues.
  auto r = WriteRegionTraceDats(*snapshot, out.dir(), &texts);
  if (!r.ok()) return r.error();
  const auto decoded = std::chrono::steady_clock::now();
  r->attach["write_fsync_ms"] = MsBetween(start, written);
  r->attach["decode_write_ms"] = MsBetween(written, decoded);
  r->attach["vm_paused"] = options.vm_paused;
  r->attach["consistency"] =
      options.vm_paused
          ? "vCPUs were stopped while copying: the copy is exact"
          : "the guest kept running: slots rewritten during the copy are counted as slot_torn";
  for (const CpuCaptureCounts& c : r->cpu_counts) manifest.cpus.push_back(c);
  if (manifest.validation.empty()) {
    manifest.validation = {{"reader", "region"}, {"issues", r->attach["issues"]["total"]}};
  } else {
    manifest.validation["attach_region_issues"] = r->attach["issues"]["total"];
  }
  const RegionGuestInfo& g = snapshot->guest;
  if (g.present) {
    if (!manifest.kernel.contains("release")) manifest.kernel["release"] = g.kernel_release;
    manifest.kernel["attach_boot_id"] = g.boot_id;
    manifest.kernel["attach_boot_generation"] = g.boot_generation;
  }
  manifest.extra["attach"] = r->attach;
  return r;
}

Result<RegionCaptureResult> CaptureLiveRegion(const LiveRegion& region,
                                              const RegionCaptureOptions& options,
                                              PendingCapture& out, CaptureManifest& manifest) {
  const auto start = std::chrono::steady_clock::now();
  Result<std::vector<std::byte>> copied = region.Copy();
  if (!copied.ok()) return copied.error();
  std::vector<std::byte>& copy = *copied;
  const double copy_ms = MsBetween(start, std::chrono::steady_clock::now());
  auto r = BuildRegionCapture(copy, region.geometry(), options, out, manifest);
  if (!r.ok()) return Error{"region " + region.path().string() + ": " + r.error().message};
  manifest.extra["attach"]["copy_ms"] = copy_ms;
  manifest.extra["attach"]["source"] = region.path().string();
  r->attach = manifest.extra["attach"];
  return r;
}

}  // namespace hvtrace::hostd
