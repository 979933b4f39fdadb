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
  SetPageCommit(fixed, layout, good | flags);
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

// One capture's trace.dat files in the making: the snapshot's pages sorted
// into one plan per boot generation and clock (AddRing), the files written
// (WriteFiles), then the totals and the manifest's account of the region
// (Finish). Pages that need no repair point into the snapshot; repaired or
// restamped ones into |repaired_|, which lives until the files are written.
class RegionTraceDatBuilder {
 public:
  RegionTraceDatBuilder(const RegionSnapshot& s, const RegionTextCache* texts);
  // Adds |ring|'s pages, as trace CPU |slot_index|, to their plans.
  void AddRing(const RegionRing& ring, uint32_t slot_index);
  Status WriteFiles(const fs::path& dir);
  RegionCaptureResult Finish();

 private:
  // What a direct-write ring's pages became, for its line in the manifest.
  struct RingTally {
    uint64_t off_clock = 0, converted = 0, unplaced = 0;
  };
  const std::string& TextOf(TextAreaKind kind, uint64_t gen) const;
  GenerationPlan& Plan(uint32_t gen, bool unplaced);
  json RingJson(const RegionRing& ring, uint32_t slot_index) const;
  void AddPage(const RegionRing& ring, const RegionPage& p, uint32_t slot_index, RingTally& tally);
  void CountRecord(GenerationPlan& g, const RegionRing& ring, const RawRecord& rec,
                   CpuCaptureCounts& counts);
  json AttachJson() const;

  const RegionSnapshot& s_;
  const RegionTextCache* texts_;
  const uint32_t ncpu_, nrings_;
  const RegionTimeline timeline_;
  // Per generation: the file on the trace clock, and (only when needed) the
  // one for TSC rings that could not be put on it.
  std::map<std::pair<uint32_t, bool>, GenerationPlan> plans_;
  std::deque<std::vector<std::byte>> repaired_;
  json rings_ = json::array();
  json names_ = json::object();
  RegionCaptureResult r_;
};

RegionTraceDatBuilder::RegionTraceDatBuilder(const RegionSnapshot& s, const RegionTextCache* texts)
    : s_(s),
      texts_(texts),
      ncpu_(static_cast<uint32_t>(s.cpus.size())),
      nrings_(ncpu_ + static_cast<uint32_t>(s.dw_rings.size())),
      timeline_(s.guest.trace_clock, s.clock_sync) {
  // Every generation that has pages gets its file, oldest first, even when
  // none of its records survive.
  std::set<uint32_t> generations;
  for (const auto* rings : {&s.cpus, &s.dw_rings}) {
    for (const RegionRing& ring : *rings) {
      for (const RegionPage& p : ring.pages) generations.insert(p.boot_generation);
    }
  }
  for (uint32_t gen : generations) Plan(gen, false);
  r_.cpu_counts.resize(nrings_);
}

const std::string& RegionTraceDatBuilder::TextOf(TextAreaKind kind, uint64_t gen) const {
  static const std::string kNone;
  return texts_ != nullptr ? texts_->Text(kind, gen) : kNone;
}

GenerationPlan& RegionTraceDatBuilder::Plan(uint32_t gen, bool unplaced) {
  auto it = plans_.find({gen, unplaced});
  if (it == plans_.end()) {
    it = plans_.emplace(std::pair{gen, unplaced}, PlanGeneration(s_, gen, unplaced)).first;
    it->second.pages.assign(nrings_, {});
    // The TSC file holds direct-write rings only: no kernel pointers.
    if (const std::string& text = TextOf(TextAreaKind::kSymbols, gen); !unplaced && !text.empty()) {
      it->second.symbols = std::make_unique<KallsymsSubset>(text, 0);
    }
  }
  return it->second;
}

json RegionTraceDatBuilder::RingJson(const RegionRing& ring, uint32_t slot_index) const {
  json rj = {{"trace_cpu", slot_index},
             {"kind", ring.direct_write ? "direct-write" : "cpu"},
             {"index", ring.index},
             {"published", ring.published},
             {"lost_events", ring.lost_events},
             {"pages_present", ring.pages.size()}};
  if (!ring.direct_write) {
    rj["overrun"] = ring.overrun;
    return rj;
  }
  const RegionTimeline::Mode mode = timeline_.ModeOf(ring.clock);
  rj["pid"] = ring.pid;
  rj["tid"] = ring.tid;
  rj["comm"] = ring.comm;
  rj["clock"] = ring.clock == region::kClockMono || ring.clock == region::kClockTsc
                    ? TraceClockName(ring.clock)
                    : "unknown " + std::to_string(ring.clock);
  rj["time_stamps"] = mode == RegionTimeline::Mode::kConvert
                          ? std::string("converted to ") + TraceClockName(s_.guest.trace_clock)
                      : mode == RegionTimeline::Mode::kUnplaceable
                          ? std::string(
                                "raw TSC ticks, in region-gen-<N>-tsc.trace.dat: the region has "
                                "no usable clock-sync samples")
                          : std::string("as written");
  return rj;
}

void RegionTraceDatBuilder::AddRing(const RegionRing& ring, uint32_t slot_index) {
  CpuCaptureCounts& counts = r_.cpu_counts[slot_index];
  counts.cpu = static_cast<int>(slot_index);
  counts.lost_events = ring.lost_events;
  json rj = RingJson(ring, slot_index);
  RingTally tally;
  for (const RegionPage& p : ring.pages) AddPage(ring, p, slot_index, tally);
  if (ring.direct_write) {
    rj["pages_converted"] = tally.converted;
    rj["pages_unplaced"] = tally.unplaced;
  }
  if (tally.off_clock != 0) {
    // Stamps the conversion cannot represent (absurd ticks): left out of
    // the file, still in attach-region.bin.
    rj["events_off_clock"] = tally.off_clock;
    r_.dw_events_off_clock += tally.off_clock;
  }
  rings_.push_back(std::move(rj));
}

void RegionTraceDatBuilder::AddPage(const RegionRing& ring, const RegionPage& p,
                                    uint32_t slot_index, RingTally& tally) {
  CpuCaptureCounts& counts = r_.cpu_counts[slot_index];
  // Per page: pages a ring's earlier owner left may use another clock.
  const RegionTimeline::Mode page_mode =
      ring.direct_write ? timeline_.ModeOf(p.clock) : RegionTimeline::Mode::kAsIs;
  GenerationPlan& g = Plan(p.boot_generation, page_mode == RegionTimeline::Mode::kUnplaceable);
  if (ring.direct_write && !g.dw_included) {
    counts.bad_pages["dw_layout_differs"]++;
    return;
  }
  const PageLayout layout = ring.direct_write ? s_.dw_layout : g.cpu_layout;
  if (p.page_error != PageError::kOk) counts.bad_pages[PageErrorName(p.page_error)]++;
  counts.pages++;
  if (p.records == 0) return;
  // What goes into the file: the page itself (cut at its first bad
  // record), or its good records restamped onto the trace clock.
  std::vector<std::span<const std::byte>> out;
  if (page_mode == RegionTimeline::Mode::kConvert) {
    RestampPage(
        p.page, layout, [&](uint64_t ts) { return timeline_.ToTraceClock(p.clock, ts); },
        &repaired_, &out, &tally.off_clock);
    ++tally.converted;
  } else {
    tally.unplaced += page_mode == RegionTimeline::Mode::kUnplaceable;
    out.push_back(WritablePage(p, layout, &repaired_));
  }
  for (std::span<const std::byte> page : out) {
    PageStats stats;
    WalkPage(page, layout, &stats,
             [&](const RawRecord& rec) { CountRecord(g, ring, rec, counts); });
    if (stats.records == 0) continue;
    g.pages[slot_index].push_back(page);
    g.file.pages++;
  }
}

void RegionTraceDatBuilder::CountRecord(GenerationPlan& g, const RegionRing& ring,
                                        const RawRecord& rec, CpuCaptureCounts& counts) {
  uint16_t type = 0;
  if (rec.payload.size() >= sizeof type) std::memcpy(&type, rec.payload.data(), sizeof type);
  RegionGenerationFile& f = g.file;
  if (!g.known_ids.contains(type)) {
    f.unknown_id++;
    r_.unknown_id++;
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
}

Status RegionTraceDatBuilder::WriteFiles(const fs::path& dir) {
  // Direct-write threads name themselves; the kernel's list comes first
  // (trace-cmd keeps a pid's first line).
  std::string dw_cmdlines;
  for (const RegionRing& ring : s_.dw_rings) {
    if (ring.tid != 0 && !ring.comm.empty())
      dw_cmdlines += std::to_string(ring.tid) + " " + ring.comm + "\n";
  }
  auto lines = [](const std::string& t) {
    return static_cast<uint64_t>(std::count(t.begin(), t.end(), '\n'));
  };
  for (auto& [key, g] : plans_) {
    const uint32_t gen = key.first;
    TraceDatWriterInput in;
    in.page_size = s_.geometry.slot_size;
    in.long_size = 8;
    in.header_page = g.header_page;
    in.header_event = g.header_event;
    in.formats = g.formats;
    in.cmdlines = TextOf(TextAreaKind::kComms, gen) + dw_cmdlines;
    // Only the symbols the events name (KallsymsSubset): trace-cmd prints
    // the same, and the file does not carry the kernel's whole table.
    if (g.symbols) in.kallsyms = g.symbols->Text();
    if (!key.second) {
      names_[std::to_string(gen)] = {{"symbols", lines(TextOf(TextAreaKind::kSymbols, gen))},
                                     {"symbols_in_file", lines(in.kallsyms)},
                                     {"guest_tasks", lines(TextOf(TextAreaKind::kComms, gen))},
                                     {"dw_threads", lines(dw_cmdlines)}};
    }
    in.trace_clock =
        g.unplaced ? TraceClockName(region::kClockTsc) : TraceClockName(s_.guest.trace_clock);
    in.cpus = std::move(g.pages);
    const fs::path path = dir / g.file.file;
    // Into a capture: its Commit syncs every file at once.
    if (Status st = WriteTraceDat(path.string(), in, TraceDatSync::kCallerSyncs); !st.ok()) {
      return Error{"boot generation " + std::to_string(gen) + ": " + st.error().message};
    }
    g.file.trace_clock = in.trace_clock;
    r_.files.push_back(g.file.file);
    r_.events += g.file.events;
    r_.pages += g.file.pages;
    r_.generations.push_back(g.file);
  }
  return {};
}

json GenerationsJson(const std::vector<RegionGenerationFile>& generations) {
  json gens = json::array();
  for (const RegionGenerationFile& f : generations) {
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
  return gens;
}

json RegionTraceDatBuilder::AttachJson() const {
  const uint64_t skipped_slots = s_.issue_total() - s_.issue_count(RegionIssue::kSlotPageError);
  const region::GuestStatus& st = s_.guest.status;
  const RegionGeometry& geo = s_.geometry;
  return {{"events_across_generations", EventsAcrossGenerations(s_)},
          {"guest", GuestJson(s_.guest)},
          {"geometry",
           {{"region_size", geo.region_size},
            {"region_id", geo.region_id},
            {"slot_size", geo.slot_size},
            {"max_cpus", geo.max_cpus},
            {"slots_per_cpu", geo.slots_per_cpu},
            {"dw_rings", geo.dw_rings},
            {"dw_slots", geo.dw_slots}}},
          {"loss_window",
           {{"agent_max_push_gap_ns", st.max_push_gap_ns},
            {"agent_last_push_mono_ns", st.last_push_mono_ns},
            {"note",
             "kernel events written after the agent's last push were still in guest memory; "
             "direct-write events are in the region as soon as their write returns"}}},
          {"generations", GenerationsJson(r_.generations)},
          {"rings", rings_},
          {"trace_cpus", {{"kernel", ncpu_}, {"direct_write_first", ncpu_}}},
          {"issues", IssuesJson(s_)},
          {"slots_skipped", skipped_slots},
          {"unknown_id_events", r_.unknown_id},
          {"dw_events_off_clock", r_.dw_events_off_clock},
          {"clock_sync",
           {{"samples", s_.clock_sync.size()},
            {"sound", timeline_.tsc().used()},
            {"dropped", timeline_.tsc().dropped()},
            {"tsc_hz", timeline_.tsc().tsc_hz()}}},
          {"names",
           {{"per_generation", names_},
            {"guest_symbols_state", st.symbols_state},
            {"note",
             "symbols and task names from the guest agent's text areas; without them "
             "pointers print as addresses and kernel tasks as <...>"}}}};
}

RegionCaptureResult RegionTraceDatBuilder::Finish() {
  for (const CpuCaptureCounts& c : r_.cpu_counts) {
    r_.lost_events += c.lost_events;
    for (const auto& [reason, n] : c.bad_pages) r_.bad_slots += n;
  }
  r_.attach = AttachJson();
  return std::move(r_);
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
  RegionTraceDatBuilder files(s, texts);
  const uint32_t ncpu = static_cast<uint32_t>(s.cpus.size());
  for (uint32_t i = 0; i < ncpu; ++i) files.AddRing(s.cpus[i], i);
  for (uint32_t i = 0; i < s.dw_rings.size(); ++i) files.AddRing(s.dw_rings[i], ncpu + i);
  if (Status st = files.WriteFiles(dir); !st.ok()) return st.error();
  return files.Finish();
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
