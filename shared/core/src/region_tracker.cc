// RegionTracker (hvtrace/region_reader.h): what successive snapshots of a
// live region brought that the ones before did not.
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "hvtrace/region.h"
#include "hvtrace/region_reader.h"

namespace hvtrace {

RegionTracker::RegionTracker(const RegionGeometry& geometry)
    : geometry_(geometry), cpu_state_(geometry.max_cpus), dw_state_(geometry.dw_rings) {}

RegionTracker::Delta RegionTracker::Update(RegionSnapshot* snap) {
  Delta delta;
  auto backwards = [&](const std::string& what, uint64_t was, uint64_t now) {
    snap->issues[static_cast<size_t>(RegionIssue::kCounterBackwards)]++;
    if (snap->problems.size() < RegionSnapshot::kMaxProblems) {
      snap->problems.push_back({RegionIssue::kCounterBackwards, what, 0,
                                "went from " + std::to_string(was) + " to " + std::to_string(now)});
    }
  };
  if (snap->guest.present) {
    const uint64_t gen = snap->guest.boot_generation;
    if (gen < generation_) backwards("boot generation", generation_, gen);
    if (gen == generation_ && snap->guest.status.heartbeat < heartbeat_) {
      backwards("heartbeat", heartbeat_, snap->guest.status.heartbeat);
    }
    generation_ = gen;
    heartbeat_ = snap->guest.status.heartbeat;
  }
  auto follow = [&](std::vector<RegionRing>& rings, std::vector<RingState>& states, bool dw) {
    for (RegionRing& ring : rings) {
      if (ring.index >= states.size()) continue;
      RingState& st = states[ring.index];
      const bool first = st.published == 0 && st.next_sequence == 0;
      if (ring.published < st.published) {
        backwards((dw ? "dw ring " : "cpu ") + std::to_string(ring.index) + " published",
                  st.published, ring.published);
        // Start over from what the ring holds now.
        st = RingState{};
      }
      st.published = ring.published;
      bool started = !first;
      // Pages are in sequence order: those below both the next sequence
      // and an open page were delivered, and an idle ring holds thousands.
      const uint64_t from = std::min(st.next_sequence, st.open_sequence);
      auto it = std::lower_bound(
          ring.pages.begin(), ring.pages.end(), from,
          [](const RegionPage& page, uint64_t sequence) { return page.sequence < sequence; });
      for (; it != ring.pages.end(); ++it) {
        const RegionPage& page = *it;
        if (page.sequence == st.open_sequence) {
          // A direct-write page we delivered a prefix of.
          if (page.length > st.open_length) delta.pages.push_back({&page, dw, st.open_length});
          st.open_length = page.length;
          if (!(page.flags & region::kSlotOpen)) st.open_sequence = UINT64_MAX;
          continue;
        }
        if (page.sequence < st.next_sequence) continue;
        if (started && page.sequence > st.next_sequence)
          delta.pages_missed += page.sequence - st.next_sequence;
        started = true;
        delta.pages.push_back({&page, dw, 0});
        st.next_sequence = page.sequence + 1;
        if (dw && (page.flags & region::kSlotOpen)) {
          st.open_sequence = page.sequence;
          st.open_length = page.length;
        }
      }
    }
  };
  follow(snap->cpus, cpu_state_, false);
  follow(snap->dw_rings, dw_state_, true);
  return delta;
}

}  // namespace hvtrace
