// Entry point of the persistent ring buffer reader (boot_map.h): checks the
// caller's options, tells the layout from what the range says of itself,
// finds the CPUs' chunks (boot_map_612.cc, boot_map_split.cc) and reads them
// (boot_map_cpu.cc). Sizes and positions come from the range size and the
// page layout the host knows; values read from the range are only compared
// against them.
#include "hvtrace/boot_map.h"

#include <algorithm>
#include <bit>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "boot_map_internal.h"

namespace hvtrace {
namespace boot_map {

static_assert(std::endian::native == std::endian::little,
              "the reader assumes a little-endian host, as the x86 guest");

std::string Hex(uint64_t value) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "0x%llx", static_cast<unsigned long long>(value));
  return buf;
}

namespace {

// 6.15 replaced struct_size by struct_sizes = cpu meta size | global size << 16.
constexpr uint32_t kStructSizesShift = 16;

// Why no 6.12 meta was found, for the caller's error.
Error No612Meta(std::span<const std::byte> range, const BootMapOptions& options) {
  const uint32_t magic = Load<uint32_t>(range, 0);
  const uint32_t size = Load<uint32_t>(range, 4);
  if (magic == kBootMapMagic) {
    return Error{"boot_map: offset 0 has the magic but struct_size " + std::to_string(size) +
                 " and nr_subbufs match no known layout for a range of " +
                 std::to_string(range.size()) + " bytes" +
                 (options.cpus > 0 ? " and " + std::to_string(options.cpus) + " CPUs" : "")};
  }
  return Error{"boot_map: no ring_buffer_meta (magic " + Hex(kBootMapMagic) +
               ") at any chunk start of the " + std::to_string(range.size()) +
               "-byte range: not a persistent ring buffer, or never initialized"};
}

// The scratch area's problems as issues of the whole range.
void ScratchIssues(BootMap& map) {
  for (const std::string& problem : map.scratch.problems) {
    map.issues.push_back({-1, BootMapCheck::kScratch, map.scratch.offset, "scratch: " + problem});
  }
}

}  // namespace
}  // namespace boot_map

using boot_map::Geometry;
using boot_map::Hex;

const char* BootMapCheckName(BootMapCheck check) {
  switch (check) {
    case BootMapCheck::kChunkOutsideRange:
      return "chunk_outside_range";
    case BootMapCheck::kMagic:
      return "magic";
    case BootMapCheck::kStructSize:
      return "struct_size";
    case BootMapCheck::kSubbufSize:
      return "subbuf_size";
    case BootMapCheck::kNrSubbufs:
      return "nr_subbufs";
    case BootMapCheck::kFirstBuffer:
      return "first_buffer";
    case BootMapCheck::kHeadOutOfRange:
      return "head_out_of_range";
    case BootMapCheck::kCommitOutOfRange:
      return "commit_out_of_range";
    case BootMapCheck::kIndexOutOfRange:
      return "index_out_of_range";
    case BootMapCheck::kDuplicateIndex:
      return "duplicate_index";
    case BootMapCheck::kHeadIsReader:
      return "head_is_reader";
    case BootMapCheck::kHeadNotInRing:
      return "head_not_in_ring";
    case BootMapCheck::kCommitNotFound:
      return "commit_not_found";
    case BootMapCheck::kBadPage:
      return "bad_page";
    case BootMapCheck::kTimeWentBackwards:
      return "time_went_backwards";
    case BootMapCheck::kEmpty:
      return "empty";
    case BootMapCheck::kTotalSize:
      return "total_size";
    case BootMapCheck::kScratch:
      return "scratch";
    case BootMapCheck::kCount:
      break;
  }
  return "unknown";
}

uint64_t BootMap::total_records() const {
  uint64_t n = 0;
  for (const BootMapCpu& c : cpu) n += c.records.size();
  return n;
}

Result<BootMap> ReadBootMap(std::span<const std::byte> range, const BootMapOptions& options) {
  const PageLayout& layout = options.layout;
  if (layout.page_size < layout.data_offset + 8 || !std::has_single_bit(layout.page_size)) {
    return Error{"boot_map: page layout size " + std::to_string(layout.page_size) +
                 " is not a usable sub-buffer size"};
  }
  if (range.size() < 2 * uint64_t{layout.page_size}) {
    return Error{"boot_map: range of " + std::to_string(range.size()) +
                 " bytes is too small to hold a persistent ring buffer"};
  }
  if (options.cpus < 0 || options.cpus > kBootMapMaxCpus) {
    return Error{"boot_map: CPU count " + std::to_string(options.cpus) + " out of range"};
  }

  BootMap map;
  Geometry best;
  bool from_meta = false;
  const uint32_t sizes = boot_map::Load<uint32_t>(range, 4);
  if (boot_map::Load<uint32_t>(range, 0) == kBootMapMagic &&
      (sizes >> boot_map::kStructSizesShift) != 0) {
    Result<Geometry> g = boot_map::FindSplitGeometry(range, options, &map);
    if (!g.ok()) return g.error();
    best = *g;
    boot_map::ScratchIssues(map);
  } else if (boot_map::Find612Geometry(range, options, &best, &from_meta)) {
    map.layout = best.meta.size == boot_map::kMeta612.size ? "linux-6.12" : "linux-6.12-kaslr";
    map.geometry_from = from_meta ? "meta" : "range_size";
    map.range_size =
        from_meta ? uint64_t{best.stride} * static_cast<uint64_t>(best.cpus) : range.size();
  } else {
    return boot_map::No612Meta(range, options);
  }
  map.cpus = best.cpus;
  map.cpus_derived = options.cpus == 0;
  map.nr_subbufs = best.nr_subbufs;
  map.chunk_stride = best.stride;
  map.cpu.resize(best.cpus);
  for (int c = 0; c < best.cpus; ++c) {
    map.cpu[c].cpu = c;
    map.cpu[c].offset = best.MetaOffset(c);
  }
  boot_map::ReadCpus(range, best, layout, options.threads, map.cpu);

  // Boots are numbered over the range: the newest boot is the last segment
  // of every CPU that has data (a CPU that wrote nothing in an older boot has
  // fewer segments), so segments are aligned to the newest.
  for (const BootMapCpu& cpu : map.cpu) map.boots = std::max(map.boots, cpu.boots);
  for (BootMapCpu& cpu : map.cpu) {
    const uint32_t shift = map.boots - cpu.boots;
    if (shift == 0) continue;
    for (BootMapPage& page : cpu.pages) page.boot += shift;
    for (BootMapRecord& record : cpu.records) record.boot += shift;
  }
  for (const BootMapCpu& cpu : map.cpu) {
    map.issues.insert(map.issues.end(), cpu.issues.begin(), cpu.issues.end());
  }
  return map;
}

}  // namespace hvtrace
