// Reading a live region again and again at the cost of what changed, for
// `hvtrace stream` (a read every 50 ms) and whatever else polls a region.
//
// A full read (CopyLiveRegion + ReadRegion) copies and validates the whole
// region, 16 MiB by default, on every look. IncrementalRegionReader keeps its
// own private copy across reads. Each Read copies the small parts every time
// (the control area, the format table's entries, the text areas' headers,
// each ring's header and slot descriptors), and then only
//   - the page of a slot whose descriptor changed since the page was last
//     copied (a new |seq|, or a longer |length| of an open direct-write page),
//   - the format text when an entry changed, a text area when its header did,
// with the same seqlock re-checks as the full copy: a part rewritten during
// its copy is marked torn and copied again by the next Read. Validation is
// the full read's own (one code path), run on the private copy; a page walked
// before is not walked again while its copy, length and layout are the same,
// and a ring whose header and descriptors did not change (and that read
// clean, with the same formats and generation) is kept as last read.
//
// What it returns equals a full read of the region for everything the guest
// published by the rules (region.h). A guest that rewrites a page without
// moving its descriptor gets its old page shown: a lie either way, and every
// bound still comes from the host's geometry.
#ifndef HVTRACE_REGION_INCREMENTAL_H_
#define HVTRACE_REGION_INCREMENTAL_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "hvtrace/region.h"
#include "hvtrace/region_reader.h"
#include "hvtrace/result.h"

namespace hvtrace {

namespace region_read {
struct ReadMemo;
}

class IncrementalRegionReader {
 public:
  // Fails only for a geometry ValidateGeometry rejects.
  static Result<std::unique_ptr<IncrementalRegionReader>> Create(const RegionGeometry& geometry);
  ~IncrementalRegionReader();
  IncrementalRegionReader(const IncrementalRegionReader&) = delete;
  IncrementalRegionReader& operator=(const IncrementalRegionReader&) = delete;

  // Copies what changed in |live| (geometry.region_size bytes the guest may
  // be writing) and validates the copy. The snapshot is this reader's: its
  // pages point into the private copy and its |copy| is empty; it stays
  // valid, and may be changed (RegionTracker counts into it), until the next
  // Read.
  RegionSnapshot* Read(const std::byte* live) {
    Refresh(live);
    return Validate();
  }
  // Read's two steps. Refresh is the only one that touches |live|, so a
  // caller whose mapping may shrink (hostd's bus guard) guards just it: it
  // allocates nothing and holds nothing while touching |live|. After a
  // Refresh that was abandoned part way, the reader must not be used again.
  void Refresh(const std::byte* live);
  RegionSnapshot* Validate();

  // Bytes copied out of |live| by the last Read, and how many of them were
  // pages: what the read cost, measured without a clock.
  uint64_t bytes_copied() const { return bytes_copied_; }
  uint64_t pages_copied() const { return pages_copied_; }

 private:
  explicit IncrementalRegionReader(const RegionGeometry& geometry);
  void CopyFormats(const std::byte* live);
  void CopyTextArea(const std::byte* live, uint64_t offset, uint32_t size,
                    region::TextAreaHeader* seen);
  void CopyRing(const std::byte* live, bool direct_write, uint32_t ring);
  void Copy(const std::byte* live, uint64_t from, uint64_t to);

  RegionGeometry geometry_;
  // The private copy: calloc'd, so pages the guest never published take no
  // memory.
  struct FreeDeleter {
    void operator()(std::byte* p) const;
  };
  std::unique_ptr<std::byte, FreeDeleter> copy_;
  std::unique_ptr<region_read::ReadMemo> memo_;
  RegionSnapshot snapshot_;
  // What the last Read saw, to tell what changed: the format table and
  // entries as copied (after torn marks), the text area headers, and per
  // slot the descriptor whose page the copy holds (seq 0: none).
  std::vector<std::byte> formats_seen_;
  region::TextAreaHeader symbols_seen_{}, comms_seen_{};
  std::vector<region::SlotDesc> cpu_seen_, dw_seen_;
  // Per ring (CPU rings first), its header and descriptors as last copied.
  std::vector<std::vector<std::byte>> ring_seen_;
  bool first_ = true;
  uint64_t bytes_copied_ = 0;
  uint64_t pages_copied_ = 0;
};

// The guest's identity, from a copy of the control area alone (4 KiB),
// validated as ReadRegion does: for `hvtrace status` and the attach wait,
// which need nothing else. Problems (a torn or impossible identity) leave
// |present| false.
RegionGuestInfo ReadLiveGuest(const std::byte* live, const RegionGeometry& geometry);
// Its two steps: the copy (region::kControlAreaSize bytes into |control|,
// with the seqlock re-checks; touches |live| and nothing else) and the
// validation of that copy.
void CopyLiveControl(const std::byte* live, std::byte* control);
RegionGuestInfo GuestFromControl(std::span<const std::byte> control,
                                 const RegionGeometry& geometry);

}  // namespace hvtrace

#endif  // HVTRACE_REGION_INCREMENTAL_H_
