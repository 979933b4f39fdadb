// Region geometry: planning (host), validation (both sides) and the host
// header. The layout itself is documented in hvtrace/region.h.
#include <algorithm>
#include <cstring>
#include <string>
#include <tuple>

#include "hvtrace/region.h"
#include "hvtrace/region_reader.h"

namespace hvtrace {
namespace {

using region::CpuRingHeader;
using region::DwRingHeader;
using region::FormatEntry;
using region::FormatTableHeader;
using region::HostHeader;
using region::HostRequests;
using region::SlotDesc;

constexpr uint32_t kMaxFormatEntries = 1 << 20;
constexpr uint32_t kMaxDwSlots = 4096;
constexpr uint64_t kMaxSymbolArea = 4ull << 20;
constexpr uint64_t kAutoCommArea = 32 << 10;

bool IsPowerOfTwo(uint64_t v) { return v != 0 && (v & (v - 1)) == 0; }
uint64_t AlignUp(uint64_t v, uint64_t align) { return (v + align - 1) / align * align; }

uint64_t PagesStart(uint64_t header_size, uint64_t slots, uint64_t slot_size) {
  return AlignUp(header_size + slots * sizeof(SlotDesc), slot_size);
}
uint64_t RingStride(uint64_t header_size, uint64_t slots, uint64_t slot_size) {
  return PagesStart(header_size, slots, slot_size) + slots * slot_size;
}

// Reads the xor key through a volatile so the compiler cannot fold the real
// magic into an immediate of our own code (see region.h).
uint64_t MagicWord(int i) {
  volatile uint64_t key = region::kRegionMagicXor[i];
  return region::kRegionMagicXored[i] ^ key;
}

Error GeometryError(const RegionGeometry& g, const std::string& what) {
  return Error{"region geometry (size " + std::to_string(g.region_size) + "): " + what};
}

}  // namespace

uint64_t RegionGeometry::FormatEntryOffset(uint32_t index) const {
  return format_offset + sizeof(FormatTableHeader) + uint64_t{index} * sizeof(FormatEntry);
}
uint64_t RegionGeometry::FormatTextOffset() const { return FormatEntryOffset(format_entries); }
uint64_t RegionGeometry::CpuRingOffset(uint32_t cpu) const {
  return cpu_offset + uint64_t{cpu} * cpu_stride;
}
uint64_t RegionGeometry::CpuDescOffset(uint32_t cpu, uint32_t slot) const {
  return CpuRingOffset(cpu) + sizeof(CpuRingHeader) + uint64_t{slot} * sizeof(SlotDesc);
}
uint64_t RegionGeometry::CpuPageOffset(uint32_t cpu, uint32_t slot) const {
  return CpuRingOffset(cpu) + PagesStart(sizeof(CpuRingHeader), slots_per_cpu, slot_size) +
         uint64_t{slot} * slot_size;
}
uint64_t RegionGeometry::DwRingOffset(uint32_t ring) const {
  return dw_offset + uint64_t{ring} * dw_stride;
}
uint64_t RegionGeometry::DwDescOffset(uint32_t ring, uint32_t slot) const {
  return DwRingOffset(ring) + sizeof(DwRingHeader) + uint64_t{slot} * sizeof(SlotDesc);
}
uint64_t RegionGeometry::DwPageOffset(uint32_t ring, uint32_t slot) const {
  return DwRingOffset(ring) + PagesStart(sizeof(DwRingHeader), dw_slots, slot_size) +
         uint64_t{slot} * slot_size;
}

Status ValidateGeometry(const RegionGeometry& g) {
  if (!IsPowerOfTwo(g.region_size) || g.region_size < region::kMinRegionSize ||
      g.region_size > region::kMaxRegionSize) {
    return GeometryError(g, "size is not a power of two in [1 MiB, 16 GiB]");
  }
  if (!IsPowerOfTwo(g.slot_size) || g.slot_size < region::kMinSlotSize ||
      g.slot_size > region::kMaxSlotSize) {
    return GeometryError(g, "slot size " + std::to_string(g.slot_size) + " invalid");
  }
  if (g.max_cpus == 0 || g.max_cpus > region::kMaxCpus) {
    return GeometryError(g, "max_cpus " + std::to_string(g.max_cpus) + " out of range");
  }
  const uint64_t max_slots = g.region_size / g.slot_size;
  if (g.slots_per_cpu == 0 || g.slots_per_cpu > max_slots) {
    return GeometryError(g, "slots_per_cpu " + std::to_string(g.slots_per_cpu) + " out of range");
  }
  if (g.format_entries == 0 || g.format_entries > kMaxFormatEntries ||
      g.format_text_size > g.region_size) {
    return GeometryError(g, "format table sizes out of range");
  }
  if (g.dw_rings > region::kMaxDwRings ||
      (g.dw_rings > 0 && (g.dw_slots == 0 || g.dw_slots > kMaxDwSlots))) {
    return GeometryError(g, "direct-write ring counts out of range");
  }
  // All values are now small enough (< 2^35 each, counts < 2^22) that the
  // sums and products below cannot overflow 64 bits.
  if (g.format_offset < region::kControlAreaSize || g.format_offset % region::kCacheLine != 0 ||
      g.format_offset > g.region_size) {
    return GeometryError(g, "format area offset " + std::to_string(g.format_offset) + " invalid");
  }
  uint64_t area_end = g.FormatTextOffset() + g.format_text_size;
  // Text areas follow the format area in this order; size 0 means absent
  // (a 1.0 header: all zero).
  for (auto [name, offset, size] : {std::tuple{"symbol", g.symbol_offset, g.symbol_size},
                                    std::tuple{"comm", g.comm_offset, g.comm_size}}) {
    if (size == 0) {
      if (offset != 0)
        return GeometryError(g, std::string(name) + " area has an offset but no size");
      continue;
    }
    if (offset % g.slot_size != 0 || offset < area_end ||
        size < 2 * sizeof(region::TextAreaHeader) || size > g.region_size / 2 ||
        offset > g.region_size - size) {
      return GeometryError(g, std::string(name) + " area " + std::to_string(offset) + "+" +
                                  std::to_string(size) + " overlaps, is unaligned or does not fit");
    }
    area_end = offset + size;
  }
  const uint64_t format_end = area_end;
  if (g.cpu_offset % g.slot_size != 0 || g.cpu_offset < format_end ||
      g.cpu_offset > g.region_size) {
    return GeometryError(g, "cpu area offset " + std::to_string(g.cpu_offset) +
                                " overlaps the format or text areas or is unaligned");
  }
  if (g.cpu_stride % g.slot_size != 0 || g.cpu_stride > g.region_size ||
      g.cpu_stride < RingStride(sizeof(CpuRingHeader), g.slots_per_cpu, g.slot_size)) {
    return GeometryError(g,
                         "cpu stride " + std::to_string(g.cpu_stride) + " too small or unaligned");
  }
  const uint64_t cpu_end = g.cpu_offset + uint64_t{g.max_cpus} * g.cpu_stride;
  if (cpu_end > g.region_size) return GeometryError(g, "cpu rings run past the region");
  if (g.dw_rings > 0) {
    if (g.dw_offset % g.slot_size != 0 || g.dw_offset < cpu_end || g.dw_offset > g.region_size) {
      return GeometryError(g, "direct-write offset " + std::to_string(g.dw_offset) +
                                  " overlaps the cpu rings or is unaligned");
    }
    if (g.dw_stride % g.slot_size != 0 || g.dw_stride > g.region_size ||
        g.dw_stride < RingStride(sizeof(DwRingHeader), g.dw_slots, g.slot_size)) {
      return GeometryError(g, "direct-write stride too small or unaligned");
    }
    if (g.dw_offset + uint64_t{g.dw_rings} * g.dw_stride > g.region_size) {
      return GeometryError(g, "direct-write rings run past the region");
    }
  }
  return Status();
}

Result<RegionGeometry> PlanRegion(uint64_t region_size, const RegionPlanOptions& options) {
  RegionGeometry g;
  g.region_size = region_size;
  g.region_id = options.region_id;
  g.slot_size = options.slot_size;
  g.max_cpus = options.max_cpus;
  if (!IsPowerOfTwo(region_size) || region_size < region::kMinRegionSize ||
      region_size > region::kMaxRegionSize) {
    return GeometryError(g,
                         "size must be a power of two in [1 MiB, 16 GiB] (QEMU aborts otherwise)");
  }
  if (!IsPowerOfTwo(g.slot_size) || g.slot_size < region::kMinSlotSize ||
      g.slot_size > region::kMaxSlotSize || g.max_cpus == 0 || g.max_cpus > region::kMaxCpus) {
    return GeometryError(g, "slot size or CPU count out of range");
  }
  g.format_text_size =
      options.format_text_size != 0
          ? options.format_text_size
          : static_cast<uint32_t>(std::clamp<uint64_t>(region_size / 32, 32 << 10, 1 << 20));
  g.format_text_size = static_cast<uint32_t>(AlignUp(g.format_text_size, region::kCacheLine));
  g.format_entries = options.format_entries != 0
                         ? options.format_entries
                         : std::clamp<uint32_t>(g.format_text_size / 512, 64, 4096);
  g.format_offset = region::kControlAreaSize;
  if (g.format_entries > kMaxFormatEntries || g.format_text_size > region_size / 2) {
    return GeometryError(g, "format table does not fit");
  }
  uint64_t next = AlignUp(g.FormatTextOffset() + g.format_text_size, g.slot_size);
  const uint64_t symbols =
      options.symbol_area_size != RegionPlanOptions::kAutoArea ? options.symbol_area_size
      : region_size < (8ull << 20)                             ? 0
                                   : std::min(region_size / 16, kMaxSymbolArea);
  const uint64_t comms = options.comm_area_size != RegionPlanOptions::kAutoArea
                             ? options.comm_area_size
                         : region_size < (4ull << 20) ? 0
                                                      : kAutoCommArea;
  if (symbols != 0) {
    g.symbol_offset = next;
    g.symbol_size = static_cast<uint32_t>(AlignUp(symbols, g.slot_size));
    next += g.symbol_size;
  }
  if (comms != 0) {
    g.comm_offset = next;
    g.comm_size = static_cast<uint32_t>(AlignUp(comms, g.slot_size));
    next += g.comm_size;
  }
  if (next >= region_size) return GeometryError(g, "no room after the format and text areas");
  g.cpu_offset = next;
  const uint64_t remaining = region_size - g.cpu_offset;

  g.dw_slots = options.dw_slots;
  if (g.dw_slots == 0 || g.dw_slots > kMaxDwSlots) return GeometryError(g, "dw_slots out of range");
  g.dw_stride = RingStride(sizeof(DwRingHeader), g.dw_slots, g.slot_size);
  if (options.dw_rings != 0) {
    g.dw_rings = options.dw_rings;
    if (g.dw_rings > region::kMaxDwRings || uint64_t{g.dw_rings} * g.dw_stride >= remaining) {
      return GeometryError(g, std::to_string(options.dw_rings) + " direct-write rings do not fit");
    }
  } else {
    g.dw_rings = std::max<uint32_t>(4, 2 * g.max_cpus);
    while (g.dw_rings > 0 && uint64_t{g.dw_rings} * g.dw_stride > remaining / 4) --g.dw_rings;
  }
  if (g.dw_rings == 0) g.dw_stride = 0;

  const uint64_t per_cpu = (remaining - uint64_t{g.dw_rings} * g.dw_stride) / g.max_cpus;
  uint64_t slots = per_cpu / (uint64_t{g.slot_size} + sizeof(SlotDesc));
  while (slots > 0 && RingStride(sizeof(CpuRingHeader), slots, g.slot_size) > per_cpu) --slots;
  if (slots < 2) return GeometryError(g, "fewer than 2 page slots per CPU");
  g.slots_per_cpu = static_cast<uint32_t>(slots);
  g.cpu_stride = RingStride(sizeof(CpuRingHeader), slots, g.slot_size);
  g.dw_offset = g.cpu_offset + uint64_t{g.max_cpus} * g.cpu_stride;
  if (g.dw_rings == 0) g.dw_offset = 0;
  if (Status s = ValidateGeometry(g); !s.ok()) return s.error();
  return g;
}

Status InitRegionHeader(std::span<std::byte> region, const RegionGeometry& g,
                        uint64_t created_unix_ns) {
  if (Status s = ValidateGeometry(g); !s.ok()) return s;
  if (region.size() != g.region_size) {
    return Error{"region mapping is " + std::to_string(region.size()) + " bytes, geometry says " +
                 std::to_string(g.region_size)};
  }
  HostHeader h{};
  h.magic[0] = MagicWord(0);
  h.magic[1] = MagicWord(1);
  h.version_major = region::kVersionMajor;
  h.version_minor = region::kVersionMinor;
  h.header_size = sizeof(HostHeader);
  h.region_size = g.region_size;
  h.region_id = g.region_id;
  h.created_unix_ns = created_unix_ns;
  h.slot_size = g.slot_size;
  h.max_cpus = g.max_cpus;
  h.slots_per_cpu = g.slots_per_cpu;
  h.format_entries = g.format_entries;
  h.format_offset = g.format_offset;
  h.format_text_size = g.format_text_size;
  h.dw_rings = g.dw_rings;
  h.cpu_offset = g.cpu_offset;
  h.cpu_stride = g.cpu_stride;
  h.dw_offset = g.dw_offset;
  h.dw_stride = g.dw_stride;
  h.dw_slots = g.dw_slots;
  h.symbol_offset = g.symbol_offset;
  h.symbol_size = g.symbol_size;
  h.comm_offset = g.comm_offset;
  h.comm_size = g.comm_size;
  std::memcpy(region.data() + region::kHostHeaderOffset, &h, sizeof(h));

  HostRequests r{};
  r.pump_interval_ms = 100;
  r.request_seq = 1;
  std::memcpy(region.data() + region::kHostRequestsOffset, &r, sizeof(r));
  return Status();
}

bool HasRegionMagic(std::span<const std::byte> header_copy) {
  if (header_copy.size() < sizeof(HostHeader)) return false;
  uint64_t magic[2];
  std::memcpy(magic, header_copy.data(), sizeof(magic));
  return magic[0] == MagicWord(0) && magic[1] == MagicWord(1);
}

Result<RegionGeometry> GeometryFromHeader(std::span<const std::byte> header_copy,
                                          uint64_t region_size) {
  if (header_copy.size() < sizeof(HostHeader)) {
    return Error{"region header: " + std::to_string(header_copy.size()) + " bytes, need " +
                 std::to_string(sizeof(HostHeader))};
  }
  if (!HasRegionMagic(header_copy)) return Error{"region header: bad magic"};
  HostHeader h;
  std::memcpy(&h, header_copy.data(), sizeof(h));
  if (h.version_major != region::kVersionMajor) {
    return Error{"region header: version " + std::to_string(h.version_major) + "." +
                 std::to_string(h.version_minor) + ", this build reads " +
                 std::to_string(region::kVersionMajor) + ".x"};
  }
  if (h.header_size < sizeof(HostHeader)) {
    return Error{"region header: header_size " + std::to_string(h.header_size) + " too small"};
  }
  if (h.region_size != region_size) {
    return Error{"region header: states size " + std::to_string(h.region_size) +
                 " but the region is " + std::to_string(region_size) + " bytes"};
  }
  RegionGeometry g;
  g.region_size = region_size;
  g.region_id = h.region_id;
  g.slot_size = h.slot_size;
  g.max_cpus = h.max_cpus;
  g.slots_per_cpu = h.slots_per_cpu;
  g.format_entries = h.format_entries;
  g.format_text_size = h.format_text_size;
  g.dw_rings = h.dw_rings;
  g.dw_slots = h.dw_slots;
  g.format_offset = h.format_offset;
  g.cpu_offset = h.cpu_offset;
  g.cpu_stride = h.cpu_stride;
  g.dw_offset = h.dw_offset;
  g.dw_stride = h.dw_stride;
  g.symbol_offset = h.symbol_offset;
  g.symbol_size = h.symbol_size;
  g.comm_offset = h.comm_offset;
  g.comm_size = h.comm_size;
  if (Status s = ValidateGeometry(g); !s.ok()) return Error{"region header: " + s.error().message};
  return g;
}

}  // namespace hvtrace
