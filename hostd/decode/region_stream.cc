#include "region_stream.h"

#include <algorithm>
#include <map>
#include <span>

#include "hvtrace/page.h"
#include "hvtrace/region.h"
#include "hvtrace/region_clock.h"

namespace hvtrace::hostd {
namespace {

size_t FormatsOf(const RegionSnapshot& s, uint32_t generation) {
  size_t n = 0;
  for (const RegionFormat& f : s.formats) n += f.boot_generation == generation;
  return n;
}

// The CPU page layout of |generation|: its published header_page, else the
// 64-bit default the region reader assumes too.
PageLayout CpuLayout(const RegionSnapshot& s, uint32_t generation) {
  for (const RegionFormat& f : s.formats) {
    if (f.kind == region::kFormatHeaderPage && f.boot_generation == generation) {
      if (auto l = PageLayout::FromHeaderPage(f.text, s.geometry.slot_size); l.ok()) return *l;
    }
  }
  return PageLayout::Default(s.geometry.slot_size);
}

}  // namespace

RegionStreamer::RegionStreamer(const RegionGeometry& geometry, RegionStreamOptions options)
    : geometry_(geometry), options_(options), tracker_(geometry) {}

RegionStreamer::~RegionStreamer() = default;

std::string RegionStreamer::CommsOf(uint32_t generation) const {
  // The kernel's list first: its line wins over a ring's claim for a pid.
  return texts_.Text(TextAreaKind::kComms, generation) + dw_comms_;
}

EventDecoder* RegionStreamer::DecoderFor(const RegionSnapshot& s, uint32_t generation,
                                         Output* out) {
  const size_t formats = FormatsOf(s, generation);
  GenerationDecoder& d = decoders_[generation];
  const std::string& symbols = texts_.Text(TextAreaKind::kSymbols, generation);
  // A program may register a new direct-write event at any time, and the
  // agent publishes the symbols seconds after it attached: rebuild then.
  if (d.decoder && d.formats == formats && (d.symbols || symbols.empty())) {
    if (std::string comms = CommsOf(generation); comms != d.comms) {
      d.decoder->UpdateComms(comms);
      d.comms = std::move(comms);
    }
    return d.decoder.get();
  }
  TraceMetadata m;
  m.source =
      "region " + std::to_string(geometry_.region_id) + " generation " + std::to_string(generation);
  m.page_size = geometry_.slot_size;
  m.trace_clock = TraceClockName(trace_clock_);
  m.cmdlines = CommsOf(generation);
  m.kallsyms = symbols;
  for (const RegionFormat& f : s.formats) {
    if (f.boot_generation != generation) continue;
    if (f.kind == region::kFormatHeaderPage) m.header_page = f.text;
    if ((f.kind == region::kFormatKernelEvent || f.kind == region::kFormatDwEvent) && f.parsed) {
      m.formats.push_back({f.system, f.text});
    }
  }
  auto decoder = EventDecoder::Create(m);
  if (!decoder.ok()) {
    out->notes.push_back("cannot decode generation " + std::to_string(generation) + ": " +
                         decoder.error().message);
    d.decoder.reset();
    d.formats = formats;
    return nullptr;
  }
  for (const std::string& w : (*decoder)->warnings()) out->notes.push_back(w);
  d.decoder = std::move(*decoder);
  d.formats = formats;
  d.symbols = !symbols.empty();
  d.comms = std::move(m.cmdlines);
  return d.decoder.get();
}

void RegionStreamer::EmitAll(const RegionSnapshot& s, const std::vector<Held>& events,
                             Output* out) {
  // DecoderFor compares the generation's formats and task names with the
  // decoder's: once per generation and Feed, not per event.
  std::map<uint32_t, EventDecoder*> decoders;
  for (const Held& h : events) {
    auto [it, added] = decoders.try_emplace(h.generation, nullptr);
    if (added) it->second = DecoderFor(s, h.generation, out);
    if (it->second != nullptr) Emit(it->second, h, out);
  }
}

void RegionStreamer::Emit(EventDecoder* decoder, const Held& e, Output* out) {
  DecodedRecord r;
  r.cpu = e.trace_cpu;
  r.timestamp = e.timestamp;
  r.payload = std::span<const std::byte>(payloads_.data() + e.payload_at, e.payload_size);
  r.missed_events = e.missed;
  if (options_.json) {
    decoder->AppendJson(r, &out->text);
  } else {
    decoder->AppendText(r, &out->text);
  }
  ++out->events;
  ++events_out_;
}

void RegionStreamer::CompactPayloads() {
  // Amortized: only once the printed payloads outweigh the held ones, so a
  // guest whose events wait (no agent push, unplaced TSC stamps) does not
  // have its held bytes copied on every Feed.
  uint64_t live = 0;
  for (const Held& h : held_) live += h.payload_size;
  if (payloads_.size() < 2 * live + kCompactSlack) return;
  spare_payloads_.clear();
  for (Held& h : held_) {
    const auto from = payloads_.begin() + h.payload_at;
    h.payload_at = spare_payloads_.size();
    spare_payloads_.insert(spare_payloads_.end(), from, from + h.payload_size);
  }
  payloads_.swap(spare_payloads_);
}

void RegionStreamer::NoteGuest(RegionSnapshot* s, Output* out) {
  if (s->guest.present) {
    if (generation_ != 0 && s->guest.boot_generation != generation_) {
      out->notes.push_back("guest boot generation " + std::to_string(generation_) + " -> " +
                           std::to_string(s->guest.boot_generation) + " (boot id " +
                           s->guest.boot_id + ")");
    }
    if (s->guest.boot_generation != generation_) previous_generation_ = generation_;
    generation_ = s->guest.boot_generation;
    trace_clock_ = s->guest.trace_clock;
  }
  dw_comms_.clear();
  for (const RegionRing& ring : s->dw_rings) {
    if (ring.tid != 0 && !ring.comm.empty())
      dw_comms_ += std::to_string(ring.tid) + " " + ring.comm + "\n";
  }
  for (std::string& note : texts_.Update(s)) out->notes.push_back(std::move(note));
}

void RegionStreamer::NoteSyncDropped(const RegionSnapshot& s, const RegionTimeline& timeline,
                                     Output* out) {
  if (timeline.tsc().dropped() <= sync_dropped_noted_) return;
  sync_dropped_noted_ = timeline.tsc().dropped();
  out->notes.push_back(
      std::to_string(sync_dropped_noted_) + " of " + std::to_string(s.clock_sync.size()) +
      " clock-sync samples in the region are inconsistent and were dropped; TSC stamps are "
      "converted with the " +
      std::to_string(timeline.tsc().used()) + " sound ones");
}

void RegionStreamer::HoldNewRecords(const RegionSnapshot& s, const RegionTracker::Delta& delta,
                                    const RegionTimeline& timeline,
                                    std::chrono::steady_clock::time_point now) {
  const uint32_t ncpu = static_cast<uint32_t>(s.cpus.size());
  std::map<uint32_t, PageLayout> layouts;
  for (const RegionTracker::NewData& nd : delta.pages) {
    const RegionPage& p = *nd.page;
    auto lit = layouts.find(p.boot_generation);
    if (lit == layouts.end())
      lit = layouts.emplace(p.boot_generation, CpuLayout(s, p.boot_generation)).first;
    const PageLayout layout = nd.direct_write ? s.dw_layout : lit->second;
    PageCursor cursor(p.page, layout);
    int64_t missed =
        cursor.header().missed_events
            ? (cursor.missed_count() > 0 ? static_cast<int64_t>(cursor.missed_count()) : -1)
            : 0;
    const uint32_t ring_clock = nd.direct_write ? p.clock : trace_clock_;
    RawRecord rec;
    while (cursor.Next(&rec)) {
      if (rec.offset < nd.from_offset) continue;
      Held h;
      const std::optional<uint64_t> placed = timeline.ToTraceClock(ring_clock, rec.timestamp);
      h.timestamp = placed.value_or(rec.timestamp);
      h.ring_clock = ring_clock;
      h.placed = placed.has_value();
      h.trace_cpu = nd.direct_write ? ncpu + p.ring : p.ring;
      h.generation = p.boot_generation;
      h.missed = missed;
      missed = 0;
      h.seen = now;
      h.payload_at = payloads_.size();
      h.payload_size = static_cast<uint32_t>(rec.payload.size());
      payloads_.insert(payloads_.end(), rec.payload.begin(), rec.payload.end());
      held_.push_back(h);
    }
  }
}

void RegionStreamer::SortHeld(const RegionSnapshot& s, const RegionTimeline& timeline,
                              std::chrono::steady_clock::time_point now, bool flush) {
  // Release what the agent's push before its last one has passed, or what
  // waited too long: the last push brought kernel events whose tasks the
  // kernel names only at their next switch, and the agent republishes the
  // names before each push, so one more push names them as the guest's own
  // trace file does (one pump interval of latency). All events wait for the
  // same mark, so they still print in time order.
  const bool mono = trace_clock_ == region::kClockMono;
  if (const uint64_t push = s.guest.status.last_push_mono_ns; push != push_seen_) {
    push_before_ = push_seen_;
    push_seen_ = push;
  }
  const uint64_t watermark = mono ? push_before_ : 0;
  ready_.clear();
  keep_.clear();
  unplaced_.clear();
  for (Held& h : held_) {
    if (!h.placed) {
      // TSC stamps that had no usable clock-sync samples: maybe now.
      if (const std::optional<uint64_t> t = timeline.ToTraceClock(h.ring_clock, h.timestamp)) {
        h.timestamp = *t;
        h.placed = true;
      }
    }
    if (!h.placed) {
      (flush || now - h.seen >= options_.max_hold ? unplaced_ : keep_).push_back(h);
    } else if (flush || (mono && h.timestamp <= watermark) || now - h.seen >= options_.max_hold) {
      ready_.push_back(h);
    } else {
      keep_.push_back(h);
    }
  }
  held_.swap(keep_);
  std::stable_sort(ready_.begin(), ready_.end(), [](const Held& a, const Held& b) {
    return a.timestamp != b.timestamp ? a.timestamp < b.timestamp : a.trace_cpu < b.trace_cpu;
  });
  // Not on the trace clock: after the rest, each ring's in its own order.
  std::stable_sort(unplaced_.begin(), unplaced_.end(), [](const Held& a, const Held& b) {
    return a.trace_cpu != b.trace_cpu ? a.trace_cpu < b.trace_cpu : a.timestamp < b.timestamp;
  });
}

void RegionStreamer::NoteUnplaced(const RegionSnapshot& s, const RegionTimeline& timeline,
                                  Output* out) {
  const uint32_t ncpu = static_cast<uint32_t>(s.cpus.size());
  for (const Held& h : unplaced_) {
    if (!unplaced_noted_.insert(h.trace_cpu).second) continue;
    const uint32_t ring = h.trace_cpu - ncpu;
    const RegionRing* r = ring < s.dw_rings.size() ? &s.dw_rings[ring] : nullptr;
    out->notes.push_back(
        "direct-write ring " + std::to_string(ring) +
        (r != nullptr ? " (tid " + std::to_string(r->tid) + " " + r->comm + ")" : std::string()) +
        " stamps TSC ticks that cannot be put on the kernel's clock (" +
        std::to_string(timeline.tsc().used()) + " of " + std::to_string(s.clock_sync.size()) +
        " clock-sync samples sound, 2 needed, or a stamp out of range): its events are printed "
        "with raw TSC time stamps on trace CPU " +
        std::to_string(h.trace_cpu) + ", after the others, not on the kernel's timeline");
  }
}

RegionStreamer::Output RegionStreamer::Feed(RegionSnapshot* s,
                                            std::chrono::steady_clock::time_point now, bool flush) {
  Output out;
  NoteGuest(s, &out);
  RegionTracker::Delta delta = tracker_.Update(s);
  const bool skip = first_ && !options_.from_start;
  first_ = false;
  if (!skip && delta.pages_missed != 0) {
    pages_missed_ += delta.pages_missed;
    out.notes.push_back(std::to_string(delta.pages_missed) +
                        " page(s) overwritten in the region before the stream read them");
  }
  const RegionTimeline timeline(trace_clock_, s->clock_sync);
  NoteSyncDropped(*s, timeline, &out);
  if (!skip) HoldNewRecords(*s, delta, timeline, now);
  SortHeld(*s, timeline, now, flush);
  EmitAll(*s, ready_, &out);
  NoteUnplaced(*s, timeline, &out);
  EmitAll(*s, unplaced_, &out);
  CompactPayloads();
  // Decoders of older generations go; an event of one still held gets a new
  // decoder when it is printed.
  if (decoders_.size() > kDecoderGenerationsKept) {
    std::erase_if(decoders_, [&](const auto& entry) {
      return entry.first != generation_ && entry.first != previous_generation_;
    });
  }
  return out;
}

}  // namespace hvtrace::hostd
