// Live decoding of an attach-mode region for `hvtrace stream`: successive
// snapshots in, `trace-cmd report` text (or JSON lines) out. Sans-I/O: the
// caller refreshes its copy (LiveRegion::Refresh) on its own schedule.
//
// Ordering. Direct-write events are in the region the moment their write
// returns; kernel events arrive when the agent next pushes the CPU's pages
// (its pump interval). To print both in time order, events are held until
// the agent's push before its last one (GuestStatus::last_push_mono_ns, on
// the guest clock the events carry when the trace clock is "mono") has
// passed them: everything the kernel wrote before that push is then in the
// region, and the task names published with the last push name them. Events
// are never held longer than |max_hold| of host time, so a guest whose agent
// stopped pushing still streams its direct-write events.
//
// Names. The guest's text symbols and saved_cmdlines come from the region's
// text areas (RegionTextCache): a generation's decoder is built once with
// its symbols (again only when the symbols arrive after it was built, or a
// program registers a new direct-write event) and is told about task names
// whenever the guest's list changes.
//
// Memory. The guest chooses its boot generation and may raise it on every
// look: a streamer keeps decoders for the current generation and the one
// before it only (kDecoderGenerationsKept; an event of an older generation
// gets a decoder built for it and dropped after the snapshot), and its text
// cache keeps two generations' texts, within the process-wide limit
// (hvtrace/region_text.h, kTextGenerationsKept, kMaxTextHeld). Held events'
// payloads share one buffer of at most twice their size plus kCompactSlack.
//
// Trace CPUs are numbered as in captures (region_capture.h): the guest's
// CPUs, then one per direct-write ring.
//
// Clocks. Direct-write rings stamped with the TSC are put on the kernel's
// trace clock with the region's clock-sync samples (RegionTimeline). While
// the region has too few sound samples such events wait; after |max_hold|
// they are printed with their raw TSC stamps, after the others, and a note
// says so (once per ring).
#ifndef HVTRACE_HOSTD_REGION_STREAM_H_
#define HVTRACE_HOSTD_REGION_STREAM_H_

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "hvtrace/decoder.h"
#include "hvtrace/region_clock.h"
#include "hvtrace/region_reader.h"
#include "hvtrace/region_text.h"

namespace hvtrace::hostd {

struct RegionStreamOptions {
  bool json = false;        // JSON lines instead of trace-cmd text.
  bool from_start = false;  // Also print what the region held at the first snapshot.
  std::chrono::milliseconds max_hold{1000};
};

class RegionStreamer {
 public:
  struct Output {
    std::string text;                // Complete lines.
    std::vector<std::string> notes;  // Pages missed, generation changes, decoder warnings.
    uint64_t events = 0;
  };

  RegionStreamer(const RegionGeometry& geometry, RegionStreamOptions options);
  ~RegionStreamer();

  // Takes what is new in |snapshot| and returns the events that are ready.
  // |now| is the host time of the snapshot; |flush| releases everything held
  // (the VM is gone, or the stream ends).
  Output Feed(RegionSnapshot* snapshot, std::chrono::steady_clock::time_point now, bool flush);

  static constexpr size_t kDecoderGenerationsKept = 2;
  // Payload bytes a streamer may hold beyond twice what it still holds.
  static constexpr size_t kCompactSlack = 256 * 1024;

  uint64_t events_out() const { return events_out_; }
  // What the streamer keeps across snapshots (bounded; see Memory above).
  size_t decoders_kept() const { return decoders_.size(); }
  const RegionTextCache& texts() const { return texts_; }
  uint64_t pages_missed() const { return pages_missed_; }

 private:
  struct Held {
    uint64_t timestamp;   // On the trace clock once |placed|; else raw ring ticks.
    uint32_t ring_clock;  // The ring's clock (direct-write), or the trace clock.
    bool placed;
    uint32_t trace_cpu;
    uint32_t generation;
    int64_t missed;
    std::chrono::steady_clock::time_point seen;
    uint64_t payload_at;  // In |payloads_|: one buffer, not an allocation per event.
    uint32_t payload_size;
  };
  struct GenerationDecoder {
    size_t formats = 0;    // Formats of the generation it was built with.
    bool symbols = false;  // Built with the guest's symbols.
    std::string comms;     // Task names it was last given.
    std::unique_ptr<EventDecoder> decoder;
  };
  std::string CommsOf(uint32_t generation) const;

  // Feed's steps, in order. The guest's generation, clock and task names.
  void NoteGuest(RegionSnapshot* snapshot, Output* out);
  // Clock-sync samples dropped as inconsistent, once per new count.
  void NoteSyncDropped(const RegionSnapshot& snapshot, const RegionTimeline& timeline, Output* out);
  // Copies the records that are new since the last snapshot into |held_|.
  void HoldNewRecords(const RegionSnapshot& snapshot, const RegionTracker::Delta& delta,
                      const RegionTimeline& timeline, std::chrono::steady_clock::time_point now);
  // Moves what may print now from |held_| to |ready_| (time order) or to
  // |unplaced_| (raw TSC stamps, per ring); the rest stays held.
  void SortHeld(const RegionSnapshot& snapshot, const RegionTimeline& timeline,
                std::chrono::steady_clock::time_point now, bool flush);
  // Says once per ring why its events in |unplaced_| carry raw TSC stamps.
  void NoteUnplaced(const RegionSnapshot& snapshot, const RegionTimeline& timeline, Output* out);

  EventDecoder* DecoderFor(const RegionSnapshot& snapshot, uint32_t generation, Output* out);
  // Prints |events| with their generations' decoders, each looked up once.
  void EmitAll(const RegionSnapshot& snapshot, const std::vector<Held>& events, Output* out);
  void Emit(EventDecoder* decoder, const Held& event, Output* out);
  // Moves the payloads of |held_| to a fresh buffer once the printed ones
  // outweigh them: the buffer stays within twice what is held.
  void CompactPayloads();

  RegionGeometry geometry_;
  RegionStreamOptions options_;
  RegionTracker tracker_;
  bool first_ = true;
  uint64_t generation_ = 0;
  uint64_t previous_generation_ = 0;  // The guest's generation before |generation_|.
  std::vector<Held> held_;
  std::vector<std::byte> payloads_, spare_payloads_;
  std::vector<Held> ready_, keep_, unplaced_;  // Feed's scratch lists, capacity kept.
  std::map<uint32_t, GenerationDecoder> decoders_;
  RegionTextCache texts_;
  std::string dw_comms_;  // Direct-write threads, "tid comm" lines.
  uint32_t trace_clock_ = 0;
  uint32_t sync_dropped_noted_ = 0;
  std::set<uint32_t> unplaced_noted_;  // Trace CPUs whose raw stamps were noted.
  uint64_t push_seen_ = 0;             // GuestStatus::last_push_mono_ns last seen,
  uint64_t push_before_ = 0;           // and the one before it: the release mark.
  uint64_t events_out_ = 0;
  uint64_t pages_missed_ = 0;
};

}  // namespace hvtrace::hostd

#endif  // HVTRACE_HOSTD_REGION_STREAM_H_
