// Internals of the boot_map reader shared by its files: the geometry a
// layout finder settles on, and the per-CPU reader that walks it. Every
// layout (6.12's per-CPU metas, 6.15+'s global meta) ends in one Geometry;
// the CPU reader does not know which layout it reads.
#ifndef HVTRACE_BOOT_MAP_INTERNAL_H_
#define HVTRACE_BOOT_MAP_INTERNAL_H_

#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "hvtrace/boot_map.h"
#include "hvtrace/page.h"

namespace hvtrace::boot_map {

template <typename T>
T Load(std::span<const std::byte> range, uint64_t offset) {
  T value{};
  std::memcpy(&value, range.data() + offset, sizeof(T));
  return value;
}

inline uint64_t AlignUp(uint64_t value, uint64_t align) {
  return (value + align - 1) / align * align;
}

std::string Hex(uint64_t value);

// Where the fields of one CPU's meta sit. The per-CPU struct differs by
// kernel: 6.12 starts it with magic and struct_size and carries a text
// address, 6.15+ keeps those in the global meta and its scratch area.
struct CpuMetaFormat {
  uint32_t size = 0;        // Bytes before buffers[].
  bool has_magic = false;   // magic, struct_size at +0 (6.12).
  int32_t text_at = -1;     // text_addr / kaslr_addr, or -1.
  int32_t data_at = -1;     // data_addr (6.12, 56-byte meta), or -1.
  uint32_t first_at = 0;    // first_buffer; head, commit, subbuf_size and
                            // nr_subbufs follow it (8, 8, 4, 4 bytes).
  int32_t invalid_at = -1;  // nr_invalid, entry_bytes (u32 each), or -1.
};

// The 6.12 metas: 56 bytes (text_addr, data_addr) and 48 (kaslr_addr).
inline constexpr CpuMetaFormat kMeta612{56, true, 8, 16, 24};
inline constexpr CpuMetaFormat kMeta612Kaslr{48, true, 8, -1, 16};
// 6.15+ per-CPU metas: 32 bytes (7.3); the 40-byte form that still carried
// kaslr_addr first (the split's first version); and the 40-byte form that
// keeps the kernel's count of dropped sub-buffers (nr_invalid, entry_bytes)
// after nr_subbufs, from the kernels that skip invalid sub-buffers.
inline constexpr CpuMetaFormat kCpuMetaSplit{32, false, -1, -1, 0};
inline constexpr CpuMetaFormat kCpuMetaSplitKaslr{40, false, 0, -1, 8};
inline constexpr CpuMetaFormat kCpuMetaSplitInvalid{40, false, -1, -1, 0, 32};

// Where the CPUs' chunks lie. CPU 0's meta is at |first_meta| (6.15+: after
// the global meta and the scratch area, not page aligned); every later
// chunk starts where the one before it ends, |stride| bytes each.
struct Geometry {
  CpuMetaFormat meta;
  int cpus = 0;
  uint32_t nr_subbufs = 0;
  uint64_t stride = 0;
  uint64_t first_meta = 0;
  uint64_t first_chunk_end = 0;  // CPU 1's meta.

  uint64_t MetaOffset(int cpu) const {
    return cpu == 0 ? first_meta : first_chunk_end + static_cast<uint64_t>(cpu - 1) * stride;
  }
  // Sub-buffers follow the meta and buffers[], aligned to a sub-buffer (the
  // range starts page aligned, so offsets align as addresses do).
  uint64_t SubbufsOffset(int cpu, uint32_t page_size) const {
    return AlignUp(MetaOffset(cpu) + meta.size + 4 * uint64_t{nr_subbufs}, page_size);
  }
};

// Finds the 6.12 geometry (boot_map_612.cc). Returns false when no chunk
// start holds a 6.12 meta; |from_meta| says whether meta 0 gave it.
bool Find612Geometry(std::span<const std::byte> range, const BootMapOptions& options, Geometry* out,
                     bool* from_meta);

// Reads the 6.15+ global meta, the scratch area and the CPU geometry
// (boot_map_split.cc). Fails with a message naming the field.
Result<Geometry> FindSplitGeometry(std::span<const std::byte> range, const BootMapOptions& options,
                                   BootMap* map);

// Parses struct trace_scratch from |scratch| (boot_map_scratch.cc).
BootMapScratch ParseScratch(std::span<const std::byte> scratch, uint64_t offset);

// Reads every CPU of |g| into map->cpu, on up to |threads| threads.
void ReadCpus(std::span<const std::byte> range, const Geometry& g, const PageLayout& layout,
              int threads, std::vector<BootMapCpu>& cpus);

}  // namespace hvtrace::boot_map

#endif  // HVTRACE_BOOT_MAP_INTERNAL_H_
