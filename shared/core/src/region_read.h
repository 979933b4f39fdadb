// The steps of reading a region that the full read (CopyLiveRegion +
// ReadRegion) and the incremental one (hvtrace/region_incremental.h) share:
// copying the parts of a live region with their seqlock re-checks, and
// validating a private copy. One copy of each rule, two callers.
#ifndef HVTRACE_CORE_REGION_READ_H_
#define HVTRACE_CORE_REGION_READ_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "hvtrace/page.h"
#include "hvtrace/region_reader.h"

namespace hvtrace::region_read {

// What a reader that keeps its copy across reads remembers, so the next
// validation redoes only what changed. The caller sets |formats_unchanged|
// when the format area of the copy is byte for byte the one of the last read
// (the formats and their problems are then taken from this memo), and calls
// ForgetWalk for every page it copied again.
struct ReadMemo {
  struct PageWalk {
    bool valid = false;
    uint32_t length = 0;  // The slot length and layout the page was walked with.
    PageLayout layout;
    PageError error = PageError::kOk;
    uint64_t records = 0;
  };
  uint32_t cpu_slots = 0, dw_slots = 0;  // Of the geometry given to Reset.
  std::vector<PageWalk> cpu_walks;       // cpu * cpu_slots + slot
  std::vector<PageWalk> dw_walks;        // ring * dw_slots + slot
  bool formats_unchanged = false;
  std::vector<RegionProblem> format_problems;  // Reported by the last ReadFormats.
  std::array<uint64_t, static_cast<size_t>(RegionIssue::kCount)> format_issues{};
  // Per ring, CPU rings first: |ring_unchanged| is set by the caller when the
  // ring's header, descriptors and pages in the copy are those of the last
  // read; |ring_clean| by ReadCopy when that read of the ring reported no
  // problem, under guest generation |rings_generation|. A ring that is both,
  // with the formats and the generation unchanged, is kept as it was read:
  // the same bytes give the same result, and an idle stream then reads none
  // of its thousands of slots.
  std::vector<uint8_t> ring_unchanged, ring_clean;
  uint64_t rings_generation = 0;

  void Reset(const RegionGeometry& geometry);
  void ForgetWalk(bool direct_write, uint32_t ring, uint32_t slot);
  size_t RingIndex(bool direct_write, uint32_t ring) const {
    return direct_write ? cpu_rings + ring : ring;
  }
  uint32_t cpu_rings = 0;
};

// Validates and slices |bytes| (geometry.region_size bytes, the caller's
// private copy) into |snapshot|, whose geometry is set. Pages point into
// |bytes|. With a |memo| the formats of |snapshot| are kept when
// memo->formats_unchanged, unchanged clean rings are kept, and pages walked
// before are not walked again.
void ReadCopy(RegionSnapshot* snapshot, std::span<std::byte> bytes, ReadMemo* memo);

// The guest identity in a copy of the control area (at least
// kControlAreaSize bytes), validated; problems go to |snapshot|.
void ReadIdentity(std::span<const std::byte> control, const RegionGeometry& geometry,
                  RegionSnapshot* snapshot);

// Copy steps. |out| is geometry.region_size bytes; each copies the part from
// |live| into the same offsets of |out| and marks whatever the guest
// rewrote meanwhile torn in |out| (its seq made odd).
void CopyControlArea(const std::byte* live, std::byte* out);
void CopyFormatArea(const std::byte* live, const RegionGeometry& geometry, std::byte* out);
void CopyTextArea(const std::byte* live, uint64_t offset, uint32_t size, std::byte* out);
void CopyRange(const std::byte* live, std::byte* out, uint64_t from, uint64_t to);
// Re-reads the seqlocked u64 at |offset| of |live|; marks it torn in |out|
// unless it still holds the copied value. Returns false if torn.
bool RecheckSeq64(const std::byte* live, std::byte* out, uint64_t offset);

}  // namespace hvtrace::region_read

#endif  // HVTRACE_CORE_REGION_READ_H_
