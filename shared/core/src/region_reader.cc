// Reads a guest-filled region. Everything here works on the caller's private
// copy (CopyLiveRegion makes one from shared memory), checks every guest value
// against the host's geometry before using it, and reports what it skips.
#include "hvtrace/region_reader.h"

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <utility>

#include "hvtrace/fingerprint.h"
#include "hvtrace/region_clock.h"
#include "region_read.h"

namespace hvtrace {
namespace {

using region_read::ReadMemo;

using region::ClockSync;
using region::CpuRingHeader;
using region::DwRingHeader;
using region::FormatEntry;
using region::FormatTableHeader;
using region::GuestIdentity;
using region::SlotDesc;

template <typename T>
T Load(std::span<const std::byte> bytes, uint64_t offset) {
  T value;
  std::memcpy(&value, bytes.data() + offset, sizeof(T));
  return value;
}

uint64_t LoadLive64(const std::byte* live, uint64_t offset) {
  return __atomic_load_n(reinterpret_cast<const uint64_t*>(live + offset), __ATOMIC_ACQUIRE);
}
uint32_t LoadLive32(const std::byte* live, uint64_t offset) {
  return __atomic_load_n(reinterpret_cast<const uint32_t*>(live + offset), __ATOMIC_ACQUIRE);
}

// Text of a fixed-size char array up to its first NUL, printable ASCII only.
bool CleanString(const char* chars, size_t size, std::string* out) {
  size_t n = 0;
  while (n < size && chars[n] != '\0') {
    const unsigned char c = static_cast<unsigned char>(chars[n]);
    if (c < 0x20 || c > 0x7e) return false;
    ++n;
  }
  out->assign(chars, n);
  return true;
}

std::string UuidText(const uint8_t (&id)[16]) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string s;
  for (int i = 0; i < 16; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) s.push_back('-');
    s.push_back(kHex[id[i] >> 4]);
    s.push_back(kHex[id[i] & 15]);
  }
  return s;
}

class Reader {
 public:
  Reader(RegionSnapshot* snap, std::span<std::byte> bytes, ReadMemo* memo,
         std::vector<RegionRing> last_rings = {})
      : s_(snap),
        bytes_(bytes),
        mutable_bytes_(bytes),
        g_(snap->geometry),
        memo_(memo),
        last_rings_(std::move(last_rings)) {}

  void Run() {
    CheckHostHeader();
    region_read::ReadIdentity(bytes_, g_, s_);
    ReadClockSync();
    if (memo_ != nullptr && memo_->formats_unchanged) {
      ReplayFormatProblems();
    } else {
      s_->formats.clear();
      const auto before = s_->issues;
      const size_t problems_before = s_->problems.size();
      ReadFormats();
      if (memo_ != nullptr) RememberFormatProblems(before, problems_before);
    }
    ReadTextArea(g_.symbol_offset, g_.symbol_size, RegionIssue::kSymbolsTorn,
                 RegionIssue::kSymbolsBad, "symbol area", &s_->symbols);
    ReadTextArea(g_.comm_offset, g_.comm_size, RegionIssue::kCommsTorn, RegionIssue::kCommsBad,
                 "comm area", &s_->comms);
    ChooseLayouts();
    const bool keep = memo_ != nullptr && memo_->formats_unchanged &&
                      memo_->rings_generation == s_->guest.boot_generation &&
                      last_rings_.size() == memo_->ring_clean.size();
    for (uint32_t c = 0; c < g_.max_cpus; ++c) ReadOrKeepRing(c, /*direct_write=*/false, keep);
    for (uint32_t r = 0; r < g_.dw_rings; ++r) ReadOrKeepRing(r, /*direct_write=*/true, keep);
    if (memo_ != nullptr) memo_->rings_generation = s_->guest.boot_generation;
    CheckClocks();
  }

 private:
  void Report(RegionIssue issue, std::string where, uint64_t offset, std::string detail) {
    s_->Report(issue, std::move(where), offset, std::move(detail));
  }

  // The problems ReadFormats reported, kept so that a read that keeps the
  // formats reports them again, as a full read of the same bytes would.
  void RememberFormatProblems(const decltype(RegionSnapshot::issues)& before,
                              size_t problems_before) {
    for (size_t i = 0; i < before.size(); ++i) memo_->format_issues[i] = s_->issues[i] - before[i];
    memo_->format_problems.assign(s_->problems.begin() + static_cast<ptrdiff_t>(problems_before),
                                  s_->problems.end());
  }
  void ReplayFormatProblems() {
    for (size_t i = 0; i < s_->issues.size(); ++i) s_->issues[i] += memo_->format_issues[i];
    for (const RegionProblem& p : memo_->format_problems) {
      if (s_->problems.size() >= RegionSnapshot::kMaxProblems) break;
      s_->problems.push_back(p);
    }
  }

  // The header of a text area, bounded by the area the host sized; its
  // content is checked when it is inflated (region_text.h).
  void ReadTextArea(uint64_t offset, uint32_t size, RegionIssue torn, RegionIssue bad,
                    const char* where, RegionTextArea* out) {
    if (size == 0) return;
    const auto h = Load<region::TextAreaHeader>(bytes_, offset);
    if (h.seq == 0) return;  // Nothing published (a 1.0 agent, or not yet).
    if (h.seq & 1) {
      Report(torn, where, offset, "seq " + std::to_string(h.seq) + " is odd");
      return;
    }
    const uint64_t room = size - sizeof(region::TextAreaHeader);
    std::string why;
    if (h.stored_size == 0 || h.stored_size > room) {
      why = "states " + std::to_string(h.stored_size) + " compressed bytes in a " +
            std::to_string(room) + "-byte area";
    } else if (h.boot_generation == 0 ||
               (s_->guest.present && h.boot_generation > s_->guest.boot_generation)) {
      why = "generation " + std::to_string(h.boot_generation) + ", guest at " +
            std::to_string(s_->guest.boot_generation);
    }
    if (!why.empty()) {
      Report(bad, where, offset, why);
      return;
    }
    out->present = true;
    out->offset = offset;
    out->seq = h.seq;
    out->boot_generation = h.boot_generation;
    out->encoding = h.encoding;
    out->raw_size = h.raw_size;
    out->crc32 = h.crc32;
    out->lines = h.lines;
    out->stored = bytes_.subspan(offset + sizeof(region::TextAreaHeader), h.stored_size);
  }

  void CheckHostHeader() {
    auto from_header =
        GeometryFromHeader(bytes_.subspan(0, sizeof(region::HostHeader)), g_.region_size);
    if (!from_header.ok()) {
      Report(RegionIssue::kHeaderMismatch, "host header", 0, from_header.error().message);
    } else if (!(*from_header == g_)) {
      Report(RegionIssue::kHeaderMismatch, "host header", 0,
             "geometry in the region differs from the one hostd created");
    }
  }

  void ReadClockSync() {
    for (uint32_t i = 0; i < region::kClockSyncCount; ++i) {
      const auto c = Load<ClockSync>(bytes_, region::kClockSyncOffset + i * sizeof(ClockSync));
      if (c.seq != 0 && (c.seq & 1) == 0) s_->clock_sync.push_back(c);
    }
    std::sort(s_->clock_sync.begin(), s_->clock_sync.end(),
              [](const ClockSync& a, const ClockSync& b) { return a.seq < b.seq; });
  }

  // Whether the direct-write rings that hold pages can be put on the
  // kernel's trace clock (region_clock.h); the callers convert.
  void CheckClocks() {
    // Per page: a ring's next owner may stamp with another clock.
    bool tsc_pages = false;
    for (const RegionRing& ring : s_->dw_rings) {
      for (const RegionPage& p : ring.pages) {
        if (p.clock == region::kClockMono || p.clock == region::kClockTsc) {
          tsc_pages |= p.clock == region::kClockTsc;
          continue;
        }
        Report(RegionIssue::kDwClockUnknown,
               "dw ring " + std::to_string(ring.index) + " slot " + std::to_string(p.slot),
               g_.DwDescOffset(ring.index, p.slot) + offsetof(SlotDesc, clock),
               "clock " + std::to_string(p.clock) + ": time stamps taken as the trace clock's");
        break;  // Once per ring.
      }
    }
    if (s_->clock_sync.empty() && !tsc_pages) return;
    const RegionTimeline timeline(s_->guest.trace_clock, s_->clock_sync);
    if (timeline.tsc().dropped() != 0) {
      Report(RegionIssue::kClockSyncDropped, "clock sync", region::kClockSyncOffset,
             std::to_string(timeline.tsc().dropped()) + " of " +
                 std::to_string(s_->clock_sync.size()) +
                 " samples dropped (empty, backwards or off the line the others agree on)");
    }
    for (const RegionRing& ring : s_->dw_rings) {
      const bool unplaceable =
          std::any_of(ring.pages.begin(), ring.pages.end(), [&](const RegionPage& p) {
            return timeline.ModeOf(p.clock) == RegionTimeline::Mode::kUnplaceable;
          });
      if (!unplaceable) continue;
      Report(RegionIssue::kDwClockUnplaceable, "dw ring " + std::to_string(ring.index),
             g_.DwRingOffset(ring.index) + offsetof(DwRingHeader, clock),
             "time stamps are TSC ticks and only " + std::to_string(timeline.tsc().used()) +
                 " of " + std::to_string(s_->clock_sync.size()) +
                 " clock-sync samples are sound: kept apart from the kernel's timeline");
    }
  }

  void ReadFormats() {
    const auto table = Load<FormatTableHeader>(bytes_, g_.format_offset);
    const uint32_t count = std::min(table.entry_count, g_.format_entries);
    const uint64_t text_base = g_.FormatTextOffset();
    std::map<std::pair<uint32_t, uint32_t>, uint64_t> seen;  // (generation, id) -> fingerprint
    for (uint32_t i = 0; i < count; ++i) {
      const uint64_t at = g_.FormatEntryOffset(i);
      const auto e = Load<FormatEntry>(bytes_, at);
      const std::string where = "format entry " + std::to_string(i);
      if (e.seq == 0 || (e.seq & 1)) {
        Report(RegionIssue::kFormatTorn, where, at, "seq " + std::to_string(e.seq));
        continue;
      }
      if (e.kind < region::kFormatKernelEvent || e.kind > region::kFormatHeaderEvent) {
        Report(RegionIssue::kFormatBadKind, where, at, "kind " + std::to_string(e.kind));
        continue;
      }
      if (uint64_t{e.text_offset} + e.text_len > g_.format_text_size || e.system_len == 0 ||
          e.system_len > e.text_len || e.system_len > kMaxNameSize) {
        Report(RegionIssue::kFormatOutOfRange, where, at,
               "text " + std::to_string(e.text_offset) + "+" + std::to_string(e.text_len) +
                   " system " + std::to_string(e.system_len) + " in a " +
                   std::to_string(g_.format_text_size) + "-byte text area");
        continue;
      }
      RegionFormat f;
      f.index = i;
      f.boot_generation = e.boot_generation;
      f.id = e.id;
      f.kind = static_cast<region::FormatKind>(e.kind);
      f.fingerprint = e.fingerprint;
      const char* text = reinterpret_cast<const char*>(bytes_.data() + text_base + e.text_offset);
      f.system.assign(text, e.system_len);
      f.text.assign(text + e.system_len, e.text_len - e.system_len);
      if (f.kind == region::kFormatKernelEvent || f.kind == region::kFormatDwEvent) {
        auto parsed = ParseEventFormat(f.system, f.text);
        if (!parsed.ok()) {
          Report(RegionIssue::kFormatParseError, where, at, parsed.error().message);
          continue;
        }
        const bool dw = f.kind == region::kFormatDwEvent;
        if (parsed->id != e.id || (dw && (e.id < region::kDwFirstEventId || e.id > 0xffff))) {
          Report(RegionIssue::kFormatIdMismatch, where, at,
                 "entry id " + std::to_string(e.id) + ", text ID " + std::to_string(parsed->id));
          continue;
        }
        const uint64_t fp = EventFingerprint(*parsed);
        if (fp != e.fingerprint) {
          Report(RegionIssue::kFormatFingerprintMismatch, where, at,
                 f.system + ":" + parsed->name + " states a fingerprint its text does not have");
          continue;
        }
        auto [it, inserted] = seen.emplace(std::make_pair(e.boot_generation, e.id), fp);
        if (!inserted && it->second != fp) {
          // Two formats for one id in one boot: a module unloaded and
          // another took its ids (the agent publishes again when the set of
          // events changes), or a lie. Which records are whose cannot be
          // told, so neither decodes them: they print raw, never named wrong.
          Report(RegionIssue::kFormatConflict, where, at,
                 "id " + std::to_string(e.id) + " already has another format in generation " +
                     std::to_string(e.boot_generation) + ": its events print raw");
          std::erase_if(s_->formats, [&](const RegionFormat& other) {
            return other.boot_generation == e.boot_generation && other.id == e.id;
          });
          continue;
        }
        if (!inserted) continue;  // Same format registered twice: keep one.
        f.parsed = std::move(*parsed);
      } else if (e.fingerprint != 0) {
        Report(RegionIssue::kFormatFingerprintMismatch, where, at,
               "header file with a fingerprint");
        continue;
      }
      s_->formats.push_back(std::move(f));
    }
  }

  void ChooseLayouts() {
    s_->dw_layout = PageLayout::Default(g_.slot_size);
    s_->cpu_layout = LayoutFor(static_cast<uint32_t>(s_->guest.boot_generation));
  }

  // The CPU page layout of boot |generation|: its header_page if published
  // and sane, else the 64-bit default.
  PageLayout LayoutFor(uint32_t generation) {
    if (last_layout_ && last_layout_->first == generation) return last_layout_->second;
    auto cached = layouts_.find(generation);
    if (cached != layouts_.end()) last_layout_ = *cached;
    if (cached != layouts_.end()) return cached->second;
    PageLayout layout = PageLayout::Default(g_.slot_size);
    for (const RegionFormat& f : s_->formats) {
      if (f.kind != region::kFormatHeaderPage || f.boot_generation != generation) continue;
      auto parsed = PageLayout::FromHeaderPage(f.text, g_.slot_size);
      if (parsed.ok()) layout = *parsed;
    }
    layouts_.emplace(generation, layout);
    return layout;
  }

  // Keeps the last read's ring when |keep_allowed| (formats and generation
  // unchanged) and the memo says its bytes are the same and it read clean;
  // else reads it, into the last read's page list (its capacity kept).
  void ReadOrKeepRing(uint32_t index, bool dw, bool keep_allowed) {
    auto& rings = dw ? s_->dw_rings : s_->cpus;
    if (memo_ == nullptr) {
      rings.push_back(ReadRing(index, dw, {}));
      return;
    }
    const size_t i = memo_->RingIndex(dw, index);
    if (i < last_rings_.size() && keep_allowed && memo_->ring_unchanged[i] &&
        memo_->ring_clean[i]) {
      rings.push_back(std::move(last_rings_[i]));
      return;
    }
    std::vector<RegionPage> pages;
    if (i < last_rings_.size()) pages = std::move(last_rings_[i].pages);
    pages.clear();
    const uint64_t problems_before = s_->issue_total();
    rings.push_back(ReadRing(index, dw, std::move(pages)));
    if (i < memo_->ring_clean.size()) memo_->ring_clean[i] = s_->issue_total() == problems_before;
  }

  RegionRing ReadRing(uint32_t index, bool dw, std::vector<RegionPage> pages) {
    RegionRing ring;
    ring.index = index;
    ring.direct_write = dw;
    ring.pages = std::move(pages);
    uint32_t slots;
    const std::string name = (dw ? "dw ring " : "cpu ") + std::to_string(index);
    if (dw) {
      const auto h = Load<DwRingHeader>(bytes_, g_.DwRingOffset(index));
      ring.published = h.published;
      ring.lost_events = h.lost_events;
      ring.pid = h.pid;
      ring.tid = h.tid;
      ring.clock = h.clock;
      if (!CleanString(h.comm, sizeof(h.comm), &ring.comm)) ring.comm = "?";
      slots = g_.dw_slots;
    } else {
      const auto h = Load<CpuRingHeader>(bytes_, g_.CpuRingOffset(index));
      ring.published = h.published;
      ring.lost_events = h.lost_events;
      ring.overrun = h.overrun;
      slots = g_.slots_per_cpu;
    }
    ring.pages.reserve(slots);
    const uint64_t generation = s_->guest.boot_generation;
    for (uint32_t slot = 0; slot < slots; ++slot) {
      const uint64_t desc_at = dw ? g_.DwDescOffset(index, slot) : g_.CpuDescOffset(index, slot);
      const uint64_t page_at = dw ? g_.DwPageOffset(index, slot) : g_.CpuPageOffset(index, slot);
      const auto d = Load<SlotDesc>(bytes_, desc_at);
      if (d.seq == 0) continue;
      // Built only for a report: a ring can hold thousands of slots, read
      // twenty times a second by a stream.
      const auto where = [&] { return name + " slot " + std::to_string(slot); };
      if (d.seq & 1) {
        Report(RegionIssue::kSlotTorn, where(), desc_at,
               "seq " + std::to_string(d.seq) + " is odd");
        continue;
      }
      if (d.sequence % slots != slot || d.sequence + slots < ring.published) {
        Report(RegionIssue::kSlotMisplaced, where(), desc_at,
               "page " + std::to_string(d.sequence) + " in slot " + std::to_string(slot) + " of " +
                   std::to_string(slots) + ", ring published " + std::to_string(ring.published));
        continue;
      }
      if (d.sequence > ring.published) {
        Report(RegionIssue::kRingCounterBehind, where(), desc_at,
               "page " + std::to_string(d.sequence) + " but published " +
                   std::to_string(ring.published));
        continue;
      }
      if (d.boot_generation == 0 || (generation != 0 && d.boot_generation > generation)) {
        Report(RegionIssue::kSlotBadGeneration, where(), desc_at,
               "generation " + std::to_string(d.boot_generation) + ", guest at " +
                   std::to_string(generation));
        continue;
      }
      const PageLayout layout = dw ? s_->dw_layout : LayoutFor(d.boot_generation);
      if (d.length < layout.data_offset || d.length > g_.slot_size) {
        Report(RegionIssue::kSlotLengthOutOfRange, where(), desc_at,
               "length " + std::to_string(d.length) + " outside [" +
                   std::to_string(layout.data_offset) + ", " + std::to_string(g_.slot_size) + "]");
        continue;
      }
      std::byte* page = mutable_bytes_.data() + page_at;
      // A page walked before with the same length and layout is the same
      // copy (the incremental reader forgets a walk when it copies a page
      // again), so its commit was checked or set then. Not touching it keeps
      // an idle stream's tick off the copy's pages: at 2,600 slots, the page
      // reads alone were half the tick.
      const ReadMemo::PageWalk* walked = WalkMemo(dw, index, slot, d.length, layout);
      if (walked == nullptr && !SettleCommit(dw, layout, d, page, page_at, where)) continue;
      RegionPage p;
      p.ring = index;
      p.slot = slot;
      p.sequence = d.sequence;
      p.boot_generation = d.boot_generation;
      p.flags = d.flags;
      p.clock = dw && d.clock != 0 ? d.clock : ring.clock;
      p.length = d.length;
      p.offset = page_at;
      p.page = std::span<const std::byte>(page, g_.slot_size);
      if (walked != nullptr) {
        p.page_error = walked->error;
        p.records = walked->records;
      } else {
        Walk(dw, index, slot, layout, &p);
      }
      if (p.page_error != PageError::kOk) {
        Report(RegionIssue::kSlotPageError, where(), page_at, PageErrorName(p.page_error));
      }
      ring.pages.push_back(p);
    }
    // Slots hold a ring's pages in order from the oldest one's slot on, so
    // one rotation usually sorts them; sort only what a guest disordered.
    const auto by_sequence = [](const RegionPage& a, const RegionPage& b) {
      return a.sequence < b.sequence;
    };
    auto oldest = std::min_element(ring.pages.begin(), ring.pages.end(), by_sequence);
    std::rotate(ring.pages.begin(), oldest, ring.pages.end());
    if (!std::is_sorted(ring.pages.begin(), ring.pages.end(), by_sequence))
      std::sort(ring.pages.begin(), ring.pages.end(), by_sequence);
    return ring;
  }

  // Direct-write: |length| is the publish point; the page's own commit may
  // already count an event whose length store we did not see, so the commit
  // is set from |length| and bytes past it are never trusted. CPU pages: the
  // commit (and a stored missed count) must fit in |length|.
  template <typename Where>
  bool SettleCommit(bool dw, const PageLayout& layout, const SlotDesc& d, std::byte* page,
                    uint64_t page_at, const Where& where) {
    if (dw) {
      const uint64_t commit = d.length - layout.data_offset;
      std::memcpy(page + layout.commit_offset, &commit, layout.commit_size);
      return true;
    }
    uint64_t raw = 0;
    std::memcpy(&raw, page + layout.commit_offset, layout.commit_size);
    const uint64_t commit = raw & kPageCommitMask;
    const uint64_t stored = (raw & kPageMissedStored) ? layout.commit_size : 0;
    if (layout.data_offset + commit + stored > d.length) {
      Report(RegionIssue::kSlotCommitPastLength, where(), page_at,
             "commit " + std::to_string(commit) + " past length " + std::to_string(d.length));
      return false;
    }
    return true;
  }

  // |memo_|'s walk of this slot's copy if it was walked with |length| and
  // |layout|, else null: the walk is the costly part of reading a page, and a
  // stream reads the same pages twenty times a second.
  ReadMemo::PageWalk* WalkMemo(bool dw, uint32_t ring, uint32_t slot, uint32_t length,
                               const PageLayout& layout) {
    ReadMemo::PageWalk* memo = MemoSlot(dw, ring, slot);
    if (memo == nullptr || !memo->valid || memo->length != length || !(memo->layout == layout))
      return nullptr;
    return memo;
  }

  ReadMemo::PageWalk* MemoSlot(bool dw, uint32_t ring, uint32_t slot) {
    if (memo_ == nullptr) return nullptr;
    auto& walks = dw ? memo_->dw_walks : memo_->cpu_walks;
    const uint64_t i = uint64_t{ring} * (dw ? g_.dw_slots : g_.slots_per_cpu) + slot;
    return i < walks.size() ? &walks[i] : nullptr;
  }

  // Walks the page's records and remembers the walk in |memo_|.
  void Walk(bool dw, uint32_t ring, uint32_t slot, const PageLayout& layout, RegionPage* p) {
    PageStats stats;
    p->page_error = WalkPage(p->page, layout, &stats, [](const RawRecord&) {});
    p->records = stats.records;
    if (ReadMemo::PageWalk* memo = MemoSlot(dw, ring, slot))
      *memo = {true, p->length, layout, p->page_error, p->records};
  }

  RegionSnapshot* s_;
  std::span<const std::byte> bytes_;
  std::span<std::byte> mutable_bytes_;  // The same copy: open pages get their commit set.
  const RegionGeometry& g_;
  ReadMemo* memo_;
  std::vector<RegionRing> last_rings_;  // The memo's last read, CPU rings first.
  std::map<uint32_t, PageLayout> layouts_;
  std::optional<std::pair<uint32_t, PageLayout>> last_layout_;  // Every slot asks; most the same.
};

}  // namespace

const char* RegionIssueName(RegionIssue issue) {
  switch (issue) {
    case RegionIssue::kHeaderMismatch:
      return "header_mismatch";
    case RegionIssue::kIdentityTorn:
      return "identity_torn";
    case RegionIssue::kIdentityBad:
      return "identity_bad";
    case RegionIssue::kFormatTorn:
      return "format_torn";
    case RegionIssue::kFormatOutOfRange:
      return "format_out_of_range";
    case RegionIssue::kFormatBadKind:
      return "format_bad_kind";
    case RegionIssue::kFormatParseError:
      return "format_parse_error";
    case RegionIssue::kFormatIdMismatch:
      return "format_id_mismatch";
    case RegionIssue::kFormatFingerprintMismatch:
      return "format_fingerprint_mismatch";
    case RegionIssue::kFormatConflict:
      return "format_conflict";
    case RegionIssue::kSlotTorn:
      return "slot_torn";
    case RegionIssue::kSlotMisplaced:
      return "slot_misplaced";
    case RegionIssue::kSlotLengthOutOfRange:
      return "slot_length_out_of_range";
    case RegionIssue::kSlotCommitPastLength:
      return "slot_commit_past_length";
    case RegionIssue::kSlotBadGeneration:
      return "slot_bad_generation";
    case RegionIssue::kSlotPageError:
      return "slot_page_error";
    case RegionIssue::kRingCounterBehind:
      return "ring_counter_behind";
    case RegionIssue::kCounterBackwards:
      return "counter_backwards";
    case RegionIssue::kClockSyncDropped:
      return "clock_sync_dropped";
    case RegionIssue::kDwClockUnplaceable:
      return "dw_clock_unplaceable";
    case RegionIssue::kDwClockUnknown:
      return "dw_clock_unknown";
    case RegionIssue::kSymbolsTorn:
      return "symbols_torn";
    case RegionIssue::kSymbolsBad:
      return "symbols_bad";
    case RegionIssue::kCommsTorn:
      return "comms_torn";
    case RegionIssue::kCommsBad:
      return "comms_bad";
    case RegionIssue::kCount:
      break;
  }
  return "unknown";
}

void RegionSnapshot::Report(RegionIssue issue, std::string where, uint64_t offset,
                            std::string detail) {
  issues[static_cast<size_t>(issue)]++;
  if (problems.size() < kMaxProblems)
    problems.push_back({issue, std::move(where), offset, std::move(detail)});
}

uint64_t RegionSnapshot::issue_total() const {
  uint64_t total = 0;
  for (uint64_t n : issues) total += n;
  return total;
}

const RegionFormat* RegionSnapshot::FindFormat(uint32_t generation, uint32_t id) const {
  for (const RegionFormat& f : formats) {
    if (f.boot_generation == generation && f.id == id && f.parsed) return &f;
  }
  return nullptr;
}

namespace region_read {

void ReadMemo::Reset(const RegionGeometry& g) {
  cpu_slots = g.slots_per_cpu;
  dw_slots = g.dw_slots;
  cpu_walks.assign(uint64_t{g.max_cpus} * g.slots_per_cpu, PageWalk{});
  dw_walks.assign(uint64_t{g.dw_rings} * g.dw_slots, PageWalk{});
  formats_unchanged = false;
  format_problems.clear();
  format_issues = {};
  cpu_rings = g.max_cpus;
  ring_unchanged.assign(size_t{g.max_cpus} + g.dw_rings, 0);
  ring_clean.assign(size_t{g.max_cpus} + g.dw_rings, 0);
  rings_generation = 0;
}

void ReadMemo::ForgetWalk(bool direct_write, uint32_t ring, uint32_t slot) {
  auto& walks = direct_write ? dw_walks : cpu_walks;
  const uint64_t i = uint64_t{ring} * (direct_write ? dw_slots : cpu_slots) + slot;
  if (i < walks.size()) walks[i].valid = false;
}

void ReadCopy(RegionSnapshot* snap, std::span<std::byte> bytes, ReadMemo* memo) {
  // Everything but the formats (Reader::Run decides about those) is read anew.
  snap->guest = {};
  snap->clock_sync.clear();
  // The rings' page lists are reused, not freed: a stream reads thousands
  // of slots twenty times a second, and growing fresh lists each time cost
  // more than reading them (page faults of new allocations). With a memo,
  // the last read's rings go to the reader, which keeps those unchanged.
  std::vector<RegionRing> last;
  for (auto* rings : {&snap->cpus, &snap->dw_rings}) {
    for (RegionRing& ring : *rings) last.push_back(std::move(ring));
    rings->clear();
  }
  snap->symbols = {};
  snap->comms = {};
  snap->issues = {};
  snap->problems.clear();
  Reader(snap, bytes, memo, std::move(last)).Run();
}

void ReadIdentity(std::span<const std::byte> control, const RegionGeometry& g_,
                  RegionSnapshot* s_) {
  const auto id = Load<GuestIdentity>(control, region::kGuestIdentityOffset);
  s_->guest.status = Load<region::GuestStatus>(control, region::kGuestStatusOffset);
  if (id.seq == 0) return;  // No agent yet.
  if (id.seq & 1) {
    s_->Report(RegionIssue::kIdentityTorn, "guest identity", region::kGuestIdentityOffset,
               "seq " + std::to_string(id.seq) + " is odd");
    return;
  }
  RegionGuestInfo& info = s_->guest;
  std::string why;
  if (id.boot_generation == 0 || id.boot_generation > UINT32_MAX) {
    why = "boot generation " + std::to_string(id.boot_generation);
  } else if (id.nr_cpus == 0 || id.nr_cpus > g_.max_cpus) {
    why = "nr_cpus " + std::to_string(id.nr_cpus) + " (region has " + std::to_string(g_.max_cpus) +
          ")";
  } else if (!CleanString(id.kernel_release, sizeof(id.kernel_release), &info.kernel_release)) {
    why = "kernel release is not printable text";
  } else if (id.page_size != 0 && id.page_size != g_.slot_size) {
    why = "page size " + std::to_string(id.page_size) + " differs from slot size";
  }
  if (!why.empty()) {
    info.kernel_release.clear();
    s_->Report(RegionIssue::kIdentityBad, "guest identity", region::kGuestIdentityOffset, why);
    return;
  }
  info.present = true;
  info.boot_generation = id.boot_generation;
  info.boot_id = UuidText(id.boot_id);
  info.nr_cpus = id.nr_cpus;
  info.trace_clock = id.trace_clock;
  info.page_size = id.page_size;
  info.agent_pid = id.agent_pid;
  info.attach_mono_ns = id.attach_mono_ns;
}

bool RecheckSeq64(const std::byte* live, std::byte* out, uint64_t offset) {
  uint64_t copied;
  std::memcpy(&copied, out + offset, sizeof(copied));
  if (LoadLive64(live, offset) == copied) return true;
  if ((copied & 1) == 0) {
    copied |= 1;
    std::memcpy(out + offset, &copied, sizeof(copied));
  }
  return false;
}

void CopyRange(const std::byte* live, std::byte* out, uint64_t from, uint64_t to) {
  std::memcpy(out + from, live + from, to - from);
  __atomic_thread_fence(__ATOMIC_ACQUIRE);
}

void CopyControlArea(const std::byte* live, std::byte* out) {
  // The whole area, then the identity's and the clock samples' seqs again.
  CopyRange(live, out, 0, region::kControlAreaSize);
  RecheckSeq64(live, out, region::kGuestIdentityOffset + offsetof(GuestIdentity, seq));
  for (uint32_t i = 0; i < region::kClockSyncCount; ++i) {
    RecheckSeq64(live, out, region::kClockSyncOffset + i * sizeof(ClockSync));
  }
}

void CopyFormatArea(const std::byte* live, const RegionGeometry& g, std::byte* out) {
  // Entries before the text they point at, then their seqs again.
  const uint64_t text = g.FormatTextOffset();
  CopyRange(live, out, g.format_offset, text);
  CopyRange(live, out, text, text + g.format_text_size);
  for (uint32_t i = 0; i < g.format_entries; ++i) {
    const uint64_t at = g.FormatEntryOffset(i) + offsetof(FormatEntry, seq);
    uint32_t copied;
    std::memcpy(&copied, out + at, sizeof(copied));
    if (LoadLive32(live, at) != copied && (copied & 1) == 0) {
      copied |= 1;
      std::memcpy(out + at, &copied, sizeof(copied));
    }
  }
}

void CopyTextArea(const std::byte* live, uint64_t offset, uint32_t size, std::byte* out) {
  // The whole area, then the header's seq again.
  if (size == 0) return;
  CopyRange(live, out, offset, offset + size);
  RecheckSeq64(live, out, offset + offsetof(region::TextAreaHeader, seq));
}

}  // namespace region_read

void CopyLiveRegion(const std::byte* live, const RegionGeometry& g, std::vector<std::byte>* out) {
  using namespace region_read;
  out->resize(g.region_size);
  std::byte* copy = out->data();
  CopyControlArea(live, copy);
  CopyFormatArea(live, g, copy);
  CopyTextArea(live, g.symbol_offset, g.symbol_size, copy);
  CopyTextArea(live, g.comm_offset, g.comm_size, copy);
  // Each ring: header and descriptors, then pages, then the seqs again.
  auto copy_ring = [&](uint64_t ring_at, uint64_t pages_at, uint64_t end, uint64_t desc_at,
                       uint32_t slots) {
    CopyRange(live, copy, ring_at, pages_at);
    CopyRange(live, copy, pages_at, end);
    for (uint32_t s = 0; s < slots; ++s) RecheckSeq64(live, copy, desc_at + s * sizeof(SlotDesc));
  };
  for (uint32_t c = 0; c < g.max_cpus; ++c) {
    copy_ring(g.CpuRingOffset(c), g.CpuPageOffset(c, 0), g.CpuRingOffset(c) + g.cpu_stride,
              g.CpuDescOffset(c, 0), g.slots_per_cpu);
  }
  for (uint32_t r = 0; r < g.dw_rings; ++r) {
    copy_ring(g.DwRingOffset(r), g.DwPageOffset(r, 0), g.DwRingOffset(r) + g.dw_stride,
              g.DwDescOffset(r, 0), g.dw_slots);
  }
}

Result<RegionSnapshot> ReadRegion(std::vector<std::byte> copy, const RegionGeometry& geometry) {
  if (Status s = ValidateGeometry(geometry); !s.ok()) return s.error();
  if (copy.size() != geometry.region_size) {
    return Error{"region copy is " + std::to_string(copy.size()) + " bytes, geometry says " +
                 std::to_string(geometry.region_size)};
  }
  RegionSnapshot snap;
  snap.geometry = geometry;
  snap.copy = std::move(copy);
  region_read::ReadCopy(&snap, snap.copy, nullptr);
  return snap;
}

}  // namespace hvtrace
