// Incremental reads of a live region (hvtrace/region_incremental.h). The
// copy steps and the validation are region_read.h's, shared with the full
// read; what is here decides which parts need copying again.
#include "hvtrace/region_incremental.h"

#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>

#include "region_read.h"

namespace hvtrace {

using region::FormatEntry;
using region::FormatTableHeader;
using region::SlotDesc;
using region::TextAreaHeader;

void IncrementalRegionReader::FreeDeleter::operator()(std::byte* p) const { std::free(p); }

IncrementalRegionReader::IncrementalRegionReader(const RegionGeometry& geometry)
    : geometry_(geometry),
      memo_(std::make_unique<region_read::ReadMemo>()),
      cpu_seen_(uint64_t{geometry.max_cpus} * geometry.slots_per_cpu, SlotDesc{}),
      dw_seen_(uint64_t{geometry.dw_rings} * geometry.dw_slots, SlotDesc{}),
      ring_seen_(size_t{geometry.max_cpus} + geometry.dw_rings) {
  memo_->Reset(geometry);
  snapshot_.geometry = geometry;
}

IncrementalRegionReader::~IncrementalRegionReader() = default;

Result<std::unique_ptr<IncrementalRegionReader>> IncrementalRegionReader::Create(
    const RegionGeometry& geometry) {
  if (Status s = ValidateGeometry(geometry); !s.ok()) return s.error();
  std::unique_ptr<IncrementalRegionReader> reader(new IncrementalRegionReader(geometry));
  // Zeroed without touching: the kernel hands out zero pages on demand, so
  // the copy costs memory only for what the guest published.
  reader->copy_.reset(static_cast<std::byte*>(std::calloc(geometry.region_size, 1)));
  if (!reader->copy_) {
    return Error{"no memory for a " + std::to_string(geometry.region_size) + "-byte region copy"};
  }
  return reader;
}

void IncrementalRegionReader::Copy(const std::byte* live, uint64_t from, uint64_t to) {
  region_read::CopyRange(live, copy_.get(), from, to);
  bytes_copied_ += to - from;
}

void IncrementalRegionReader::Refresh(const std::byte* live) {
  bytes_copied_ = 0;
  pages_copied_ = 0;
  region_read::CopyControlArea(live, copy_.get());
  bytes_copied_ += region::kControlAreaSize;
  CopyFormats(live);
  CopyTextArea(live, geometry_.symbol_offset, geometry_.symbol_size, &symbols_seen_);
  CopyTextArea(live, geometry_.comm_offset, geometry_.comm_size, &comms_seen_);
  for (uint32_t c = 0; c < geometry_.max_cpus; ++c) CopyRing(live, false, c);
  for (uint32_t r = 0; r < geometry_.dw_rings; ++r) CopyRing(live, true, r);
  first_ = false;
}

RegionSnapshot* IncrementalRegionReader::Validate() {
  region_read::ReadCopy(&snapshot_, {copy_.get(), geometry_.region_size}, memo_.get());
  return &snapshot_;
}

void IncrementalRegionReader::CopyFormats(const std::byte* live) {
  // The table header and the entries it claims (what ReadFormats looks at);
  // the text only when those changed.
  const RegionGeometry& g = geometry_;
  auto claimed_end = [&] {
    FormatTableHeader table;
    std::memcpy(&table, copy_.get() + g.format_offset, sizeof(table));
    return g.FormatEntryOffset(std::min(table.entry_count, g.format_entries));
  };
  Copy(live, g.format_offset, g.format_offset + sizeof(FormatTableHeader));
  uint64_t end = claimed_end();
  Copy(live, g.format_offset + sizeof(FormatTableHeader), end);
  const std::byte* now = copy_.get() + g.format_offset;
  const uint64_t size = end - g.format_offset;
  memo_->formats_unchanged =
      !first_ && formats_seen_.size() == size && std::memcmp(formats_seen_.data(), now, size) == 0;
  if (memo_->formats_unchanged) return;
  region_read::CopyFormatArea(live, g, copy_.get());
  bytes_copied_ += g.FormatTextOffset() + g.format_text_size - g.format_offset;
  // As copied, torn marks included: an entry torn now differs from the live
  // one at the next Read, which then copies again.
  end = claimed_end();
  formats_seen_.assign(now, now + (end - g.format_offset));
}

void IncrementalRegionReader::CopyTextArea(const std::byte* live, uint64_t offset, uint32_t size,
                                           TextAreaHeader* seen) {
  if (size == 0) return;
  Copy(live, offset, offset + sizeof(TextAreaHeader));
  TextAreaHeader now;
  std::memcpy(&now, copy_.get() + offset, sizeof(now));
  if (!first_ && std::memcmp(&now, seen, sizeof(now)) == 0) return;
  // Nothing published: the reader looks no further than the header.
  if (now.seq != 0) {
    region_read::CopyTextArea(live, offset, size, copy_.get());
    bytes_copied_ += size;
  }
  std::memcpy(seen, copy_.get() + offset, sizeof(*seen));
}

void IncrementalRegionReader::CopyRing(const std::byte* live, bool dw, uint32_t ring) {
  const RegionGeometry& g = geometry_;
  const uint32_t slots = dw ? g.dw_slots : g.slots_per_cpu;
  const uint64_t ring_at = dw ? g.DwRingOffset(ring) : g.CpuRingOffset(ring);
  const uint64_t desc_at = dw ? g.DwDescOffset(ring, 0) : g.CpuDescOffset(ring, 0);
  // Header and descriptors first, as the full copy does: a page is copied
  // after the descriptor that describes it, and its seq re-read after it.
  const uint64_t ring_end = desc_at + uint64_t{slots} * sizeof(SlotDesc);
  Copy(live, ring_at, ring_end);
  // Header and descriptors byte for byte those of the last read (torn marks
  // included): no page needs copying, and the reader may keep the ring.
  const size_t index = memo_->RingIndex(dw, ring);
  std::vector<std::byte>& last = ring_seen_[index];
  const std::byte* now = copy_.get() + ring_at;
  const uint64_t size = ring_end - ring_at;
  const bool unchanged = !first_ && last.size() == size && std::memcmp(last.data(), now, size) == 0;
  memo_->ring_unchanged[index] = unchanged;
  if (unchanged) return;
  SlotDesc* seen = (dw ? dw_seen_ : cpu_seen_).data() + uint64_t{ring} * slots;
  for (uint32_t slot = 0; slot < slots; ++slot) {
    const uint64_t at = desc_at + uint64_t{slot} * sizeof(SlotDesc);
    SlotDesc d;
    std::memcpy(&d, copy_.get() + at, sizeof(d));
    // Never written or being written: the reader skips the page either way.
    if (d.seq == 0 || (d.seq & 1)) continue;
    // The copy holds the page this descriptor describes. Any change (a new
    // seq, a longer open page, or a guest playing with the fields) copies.
    if (std::memcmp(&d, &seen[slot], sizeof(d)) == 0) continue;
    const uint64_t page_at = dw ? g.DwPageOffset(ring, slot) : g.CpuPageOffset(ring, slot);
    Copy(live, page_at, page_at + g.slot_size);
    ++pages_copied_;
    memo_->ForgetWalk(dw, ring, slot);
    // Torn (marked so in the copy): remember no page, so the next Read
    // copies it again.
    seen[slot] = region_read::RecheckSeq64(live, copy_.get(), at) ? d : SlotDesc{};
  }
  last.assign(now, now + size);
}

void CopyLiveControl(const std::byte* live, std::byte* control) {
  region_read::CopyControlArea(live, control);
}

RegionGuestInfo GuestFromControl(std::span<const std::byte> control,
                                 const RegionGeometry& geometry) {
  RegionSnapshot scratch;
  scratch.geometry = geometry;
  if (control.size() < region::kControlAreaSize) return scratch.guest;
  region_read::ReadIdentity(control, geometry, &scratch);
  return scratch.guest;
}

RegionGuestInfo ReadLiveGuest(const std::byte* live, const RegionGeometry& geometry) {
  std::array<std::byte, region::kControlAreaSize> control;
  CopyLiveControl(live, control.data());
  return GuestFromControl(control, geometry);
}

}  // namespace hvtrace
