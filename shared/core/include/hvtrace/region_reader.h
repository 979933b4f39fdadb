// Host side of the hvtrace region (ABI in hvtrace/region.h): planning the
// geometry of a new region, and reading a region the guest filled.
//
// The guest is untrusted. Reading is two steps: copy the region out of shared
// memory (CopyLiveRegion, which also catches slots rewritten during the copy),
// then validate and slice the private copy (ReadRegion). Every bound comes
// from the RegionGeometry hostd chose for the file it created; nothing the
// guest wrote sizes anything. What is bad is counted per reason, described in
// |problems| and skipped; the rest is returned. Nothing here crashes on any
// input (fuzzed by tests/fuzz/region_fuzzer.cc).
#ifndef HVTRACE_REGION_READER_H_
#define HVTRACE_REGION_READER_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "hvtrace/format.h"
#include "hvtrace/page.h"
#include "hvtrace/region.h"
#include "hvtrace/result.h"

namespace hvtrace {

// Where everything lives in a region. Chosen by hostd (PlanRegion), written
// into HostHeader, remembered by hostd and handed to ReadRegion.
struct RegionGeometry {
  uint64_t region_size = 0;
  uint64_t region_id = 0;
  uint32_t slot_size = 4096;
  uint32_t max_cpus = 0;
  uint32_t slots_per_cpu = 0;
  uint32_t format_entries = 0;
  uint32_t format_text_size = 0;
  uint32_t dw_rings = 0;
  uint32_t dw_slots = 0;
  uint64_t format_offset = 0;
  uint64_t cpu_offset = 0;
  uint64_t cpu_stride = 0;
  uint64_t dw_offset = 0;
  uint64_t dw_stride = 0;
  // Text areas (region.h, minor version 1); size 0 = absent.
  uint64_t symbol_offset = 0;
  uint32_t symbol_size = 0;
  uint32_t comm_size = 0;
  uint64_t comm_offset = 0;

  // Offsets of the parts below. Valid for a geometry ValidateGeometry accepts
  // and indexes below the counts.
  uint64_t FormatEntryOffset(uint32_t index) const;
  uint64_t FormatTextOffset() const;  // Start of the text area.
  uint64_t CpuRingOffset(uint32_t cpu) const;
  uint64_t CpuDescOffset(uint32_t cpu, uint32_t slot) const;
  uint64_t CpuPageOffset(uint32_t cpu, uint32_t slot) const;
  uint64_t DwRingOffset(uint32_t ring) const;
  uint64_t DwDescOffset(uint32_t ring, uint32_t slot) const;
  uint64_t DwPageOffset(uint32_t ring, uint32_t slot) const;

  bool operator==(const RegionGeometry&) const = default;
};

struct RegionPlanOptions {
  uint32_t max_cpus = 1;
  uint32_t slot_size = 4096;
  uint32_t dw_rings = 0;          // 0: 2 per CPU, at least 4, within a quarter of the region.
  uint32_t dw_slots = 8;          // Pages per direct-write ring.
  uint32_t format_entries = 0;    // 0: from the text size.
  uint32_t format_text_size = 0;  // 0: region/32, within [32 KiB, 1 MiB].
  // Text areas, header included. kAutoArea: the symbol area is region/16, at
  // most 4 MiB, and none below an 8 MiB region (a kernel's symbols need
  // ~0.7 MB compressed); the comm area is 32 KiB from a 4 MiB region on.
  static constexpr uint32_t kAutoArea = UINT32_MAX;
  uint32_t symbol_area_size = kAutoArea;
  uint32_t comm_area_size = kAutoArea;
  uint64_t region_id = 0;
};

// Lays out a region of |region_size| bytes (a power of two, as QEMU requires).
Result<RegionGeometry> PlanRegion(uint64_t region_size, const RegionPlanOptions& options);

// Checks that every area lies inside the region, is aligned and does not
// overlap another. Used on plans and on geometries read back from a header.
Status ValidateGeometry(const RegionGeometry& geometry);

// Writes HostHeader and initial HostRequests into |region| (zeroed by the
// caller, |geometry.region_size| bytes). Host side, at creation.
Status InitRegionHeader(std::span<std::byte> region, const RegionGeometry& geometry,
                        uint64_t created_unix_ns);

// Rebuilds the geometry from a HostHeader copy and validates it against
// |region_size|, the size of the mapping or file (not a size the header
// states). For the guest, and for reading a region file whose geometry was
// not remembered.
Result<RegionGeometry> GeometryFromHeader(std::span<const std::byte> header_copy,
                                          uint64_t region_size);

// True if |header_copy| starts with the region magic.
bool HasRegionMagic(std::span<const std::byte> header_copy);

// Why something in a region was not used. Stable names: RegionIssueName.
enum class RegionIssue : uint8_t {
  kHeaderMismatch,    // HostHeader no longer matches the host's geometry.
  kIdentityTorn,      // GuestIdentity seq odd or changed during the copy.
  kIdentityBad,       // Impossible identity values (CPUs, generation).
  kFormatTorn,        // Entry being written.
  kFormatOutOfRange,  // Text offset/length outside the text area.
  kFormatBadKind,
  kFormatParseError,  // Text is not a format.
  kFormatIdMismatch,  // Entry id differs from the text's ID (or dw id rule).
  kFormatFingerprintMismatch,
  kFormatConflict,        // Same generation and id, different fingerprint.
  kSlotTorn,              // seq odd or changed during the copy.
  kSlotMisplaced,         // sequence % slots != slot, or older than the ring allows.
  kSlotLengthOutOfRange,  // length < data offset or > slot size.
  kSlotCommitPastLength,  // Page commit reaches past the slot's length.
  kSlotBadGeneration,     // 0 or newer than the guest's generation.
  kSlotPageError,         // The page walker rejected the page (see detail).
  kRingCounterBehind,     // A slot's sequence is past the ring's published count.
  kCounterBackwards,      // A counter went down since the previous read.
  kClockSyncDropped,      // Clock-sync samples off the line the others agree on (region_clock.h).
  kDwClockUnplaceable,    // A TSC-stamped ring with too few sound samples to convert.
  kDwClockUnknown,        // A ring's clock is neither CLOCK_MONOTONIC nor the TSC.
  kSymbolsTorn,           // Symbol area seq odd or changed during the copy.
  kSymbolsBad,            // Symbol area: sizes, CRC, compression or text that lie.
  kCommsTorn,             // Comm area likewise.
  kCommsBad,
  kCount,
};
const char* RegionIssueName(RegionIssue issue);

struct RegionProblem {
  RegionIssue issue;
  std::string where;    // "cpu 1 slot 17", "format entry 3", "dw ring 2 slot 0".
  uint64_t offset = 0;  // In the region.
  std::string detail;
};

struct RegionGuestInfo {
  bool present = false;  // Identity complete and sane.
  uint64_t boot_generation = 0;
  std::string boot_id;  // 36-char UUID text.
  std::string kernel_release;
  uint32_t nr_cpus = 0;
  uint32_t trace_clock = 0;
  uint32_t page_size = 0;
  uint32_t agent_pid = 0;
  uint64_t attach_mono_ns = 0;
  region::GuestStatus status{};  // Copied as is: informational only.
};

// A text area's header as copied, once its bounds were checked against the
// geometry (region_text.h inflates and checks the content).
struct RegionTextArea {
  bool present = false;  // Published, not torn, sizes inside the area.
  uint64_t offset = 0;   // Of the area in the region.
  uint64_t seq = 0;
  uint64_t boot_generation = 0;
  uint32_t encoding = 0;
  uint32_t raw_size = 0;
  uint32_t crc32 = 0;
  uint64_t lines = 0;
  std::span<const std::byte> stored;  // Into RegionSnapshot::copy.
};

struct RegionFormat {
  uint32_t index = 0;
  uint32_t boot_generation = 0;
  uint32_t id = 0;
  region::FormatKind kind = region::kFormatNone;
  uint64_t fingerprint = 0;
  std::string system;
  std::string text;
  std::optional<EventFormat> parsed;  // For event kinds.
};

// A complete page of one ring. |page| points into RegionSnapshot::copy and is
// slot_size bytes long; its commit never reaches past the slot's length (for
// an open direct-write page the copy's commit is set from |length|).
struct RegionPage {
  uint32_t ring = 0;  // CPU number or direct-write ring index.
  uint32_t slot = 0;
  uint64_t sequence = 0;
  uint32_t boot_generation = 0;
  uint32_t flags = 0;
  uint32_t length = 0;
  uint32_t clock = 0;  // Direct-write: TraceClock of its stamps (SlotDesc::clock, else the ring's).
  uint64_t offset = 0;                    // Of the page in the region.
  uint64_t records = 0;                   // Good records (before any error).
  PageError page_error = PageError::kOk;  // Records after the error are unusable.
  std::span<const std::byte> page;
};

struct RegionRing {
  uint32_t index = 0;
  bool direct_write = false;
  uint64_t published = 0;
  uint64_t lost_events = 0;
  uint64_t overrun = 0;       // CPU rings.
  uint32_t pid = 0, tid = 0;  // Direct-write rings.
  uint32_t clock = 0;
  std::string comm;
  std::vector<RegionPage> pages;  // Complete pages, by sequence.
};

struct RegionSnapshot {
  RegionGeometry geometry;
  RegionGuestInfo guest;
  std::vector<region::ClockSync> clock_sync;  // Complete samples, oldest first.
  std::vector<RegionFormat> formats;
  PageLayout cpu_layout;  // From the current generation's header_page.
  PageLayout dw_layout;   // 64-bit default, slot_size pages.
  std::vector<RegionRing> cpus;
  std::vector<RegionRing> dw_rings;
  RegionTextArea symbols;  // Guest kernel symbols (region_text.h).
  RegionTextArea comms;    // Guest saved_cmdlines.
  std::array<uint64_t, static_cast<size_t>(RegionIssue::kCount)> issues{};
  std::vector<RegionProblem> problems;  // The first kMaxProblems.
  std::vector<std::byte> copy;          // Owns the bytes the pages point at.

  static constexpr size_t kMaxProblems = 256;
  uint64_t issue_total() const;
  uint64_t issue_count(RegionIssue issue) const { return issues[static_cast<size_t>(issue)]; }
  // Counts |issue| and keeps its description among the first kMaxProblems.
  void Report(RegionIssue issue, std::string where, uint64_t offset, std::string detail);
  // The format of event |id| written in boot |generation|, or nullptr.
  const RegionFormat* FindFormat(uint32_t generation, uint32_t id) const;
};

// Copies a region that the guest may be writing. Slot descriptors and format
// entries are copied before the content they describe and re-read after it;
// whatever changed in between is marked torn in the copy (its seq made odd),
// so ReadRegion skips it. |live| must be geometry.region_size bytes.
void CopyLiveRegion(const std::byte* live, const RegionGeometry& geometry,
                    std::vector<std::byte>* out);

// Validates and slices a private copy. Fails only when the copy is not
// geometry.region_size bytes or the geometry itself is invalid.
Result<RegionSnapshot> ReadRegion(std::vector<std::byte> copy, const RegionGeometry& geometry);

// Follows a live region across successive snapshots: which pages and which
// bytes of still-open direct-write pages are new, and which counters went
// backwards (counted as kCounterBackwards in the snapshot passed in).
class RegionTracker {
 public:
  struct NewData {
    const RegionPage* page;  // Into the snapshot given to Update.
    bool direct_write;
    // Records at page offsets below this were delivered by an earlier Update
    // (a direct-write page that was still open); 0 for a whole new page.
    uint32_t from_offset;
  };
  struct Delta {
    std::vector<NewData> pages;  // Per ring in sequence order; CPUs first.
    uint64_t pages_missed = 0;   // Overwritten before we saw them.
  };

  explicit RegionTracker(const RegionGeometry& geometry);
  Delta Update(RegionSnapshot* snapshot);

 private:
  struct RingState {
    uint64_t next_sequence = 0;
    uint64_t published = 0;
    uint64_t open_sequence = UINT64_MAX;
    uint32_t open_length = 0;
  };
  RegionGeometry geometry_;
  std::vector<RingState> cpu_state_;
  std::vector<RingState> dw_state_;
  uint64_t generation_ = 0;
  uint64_t heartbeat_ = 0;
};

}  // namespace hvtrace

#endif  // HVTRACE_REGION_READER_H_
