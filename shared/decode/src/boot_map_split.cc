// The Linux 6.15+ persistent-buffer geometry: a global meta at the range
// start says the range's size and where CPU 0's meta is; the tracer's scratch
// area lies between them; the per-CPU metas carry no magic of their own, so
// they are recognised by agreeing with each other and with the allocator's
// prediction for the CPU count (alloc_buffer() in kernel/trace/ring_buffer.c).
#include <algorithm>
#include <cstdint>
#include <span>
#include <string>

#include "boot_map_internal.h"

namespace hvtrace::boot_map {
namespace {

constexpr uint32_t kGlobalMetaSize = 24;  // magic, struct_sizes, total_size, buffers_offset.
// The kernel sizes the scratch area for 128 modules of 64 bytes; anything far
// beyond that is not a scratch area.
constexpr uint64_t kMaxScratch = 1 << 20;
// x86-64 kernel virtual addresses (the direct map and above) start here.
constexpr uint64_t kKernelVa = 0xffff800000000000;

// nr_subbufs as alloc_buffer() computes it for |cpus| CPUs: the per-CPU share
// of the range after the global meta and the scratch area, less the meta,
// over a sub-buffer plus its buffers[] entry; then shrunk until every chunk,
// aligned, fits. The kernel starts the sum at |start| (7.3's source adds the
// per-CPU meta's size there, not the global one's: both are tried).
uint32_t PredictNrSubbufs(uint64_t total, uint64_t start, int cpus, const CpuMetaFormat& meta,
                          uint32_t page) {
  if (cpus <= 0 || total <= start) return 0;
  const uint64_t share = (total - start) / static_cast<uint64_t>(cpus);
  if (share <= meta.size) return 0;
  uint64_t nr = (share - meta.size) / (uint64_t{page} + 4);
  if (nr < 3) return 0;
  for (;;) {
    uint64_t ptr = start;
    for (int c = 0; c < cpus; ++c) {
      ptr = AlignUp(ptr + meta.size + 4 * nr, page) + nr * page;
    }
    if (ptr <= total) return nr > UINT32_MAX ? 0 : static_cast<uint32_t>(nr);
    if (nr <= 3) return 0;
    --nr;
  }
}

bool Predicts(uint64_t total, uint64_t buffers_offset, int cpus, const CpuMetaFormat& meta,
              uint32_t page, uint32_t nr) {
  const uint64_t scratch = buffers_offset - kGlobalMetaSize;
  return PredictNrSubbufs(total, AlignUp(meta.size, 8) + scratch, cpus, meta, page) == nr ||
         PredictNrSubbufs(total, buffers_offset, cpus, meta, page) == nr;
}

Geometry MakeSplit(const CpuMetaFormat& meta, uint64_t buffers_offset, uint32_t nr, int cpus,
                   uint32_t page) {
  Geometry g;
  g.meta = meta;
  g.cpus = cpus;
  g.nr_subbufs = nr;
  g.first_meta = buffers_offset;
  g.first_chunk_end =
      AlignUp(buffers_offset + meta.size + 4 * uint64_t{nr}, page) + uint64_t{nr} * page;
  g.stride = AlignUp(meta.size + 4 * uint64_t{nr}, page) + uint64_t{nr} * page;
  return g;
}

// Whether CPU |cpu|'s meta of |g| lies within |end| and states |g|'s sizes.
bool CpuMetaAgrees(std::span<const std::byte> range, uint64_t end, const Geometry& g, int cpu,
                   uint32_t page) {
  const uint64_t off = g.MetaOffset(cpu);
  const uint64_t chunk_end = g.SubbufsOffset(cpu, page) + uint64_t{g.nr_subbufs} * page;
  if (chunk_end > end) return false;
  const uint64_t sizes = off + g.meta.first_at + 24;
  return Load<uint32_t>(range, sizes) == page && Load<uint32_t>(range, sizes + 4) == g.nr_subbufs;
}

// The CPU count when not given, from CPU 0's meta: the run of agreeing metas,
// shortened to the largest count the allocator predicts this nr_subbufs for.
// When CPU 0's meta is broken or predicted by no count, every count's
// prediction is tried and the one with the most agreeing metas wins (as the
// 6.12 search does).
Geometry DeriveCpus(std::span<const std::byte> range, uint64_t end, const CpuMetaFormat& meta,
                    uint64_t buffers_offset, uint32_t page) {
  const uint32_t nr0 = Load<uint32_t>(range, buffers_offset + meta.first_at + 28);
  Geometry g = MakeSplit(meta, buffers_offset, nr0, 1, page);
  if (nr0 >= 3 && CpuMetaAgrees(range, end, g, 0, page)) {
    int run = 1;
    g.cpus = kBootMapMaxCpus;
    while (run < kBootMapMaxCpus && CpuMetaAgrees(range, end, g, run, page)) ++run;
    for (int n = run; n >= 1; --n) {
      if (Predicts(end, buffers_offset, n, meta, page, nr0)) {
        return MakeSplit(meta, buffers_offset, nr0, n, page);
      }
    }
    // No count predicts CPU 0's nr_subbufs: CPU 0's meta lies; search.
  }
  Geometry best;
  int best_score = 0;
  const uint64_t scratch = buffers_offset - kGlobalMetaSize;
  for (int n = 1; n <= kBootMapMaxCpus; ++n) {
    const uint32_t nr = PredictNrSubbufs(end, AlignUp(meta.size, 8) + scratch, n, meta, page);
    if (nr == 0) break;
    const Geometry cand = MakeSplit(meta, buffers_offset, nr, n, page);
    int score = 0;
    for (int c = 0; c < n; ++c) score += CpuMetaAgrees(range, end, cand, c, page);
    if (score > best_score) {
      best_score = score;
      best = cand;
    }
  }
  return best;
}

}  // namespace

Result<Geometry> FindSplitGeometry(std::span<const std::byte> range, const BootMapOptions& options,
                                   BootMap* map) {
  const uint32_t page = options.layout.page_size;
  const uint32_t sizes = Load<uint32_t>(range, 4);
  const uint32_t cpu_size = sizes & 0xffff, global_size = sizes >> 16;
  map->total_size = Load<uint64_t>(range, 8);
  map->buffers_offset = Load<uint64_t>(range, 16);
  CpuMetaFormat meta;
  if (global_size == kGlobalMetaSize && cpu_size == kCpuMetaSplit.size) meta = kCpuMetaSplit;
  if (global_size == kGlobalMetaSize && cpu_size == kCpuMetaSplitKaslr.size) {
    // Two 40-byte forms: kaslr_addr (a small offset) or first_buffer (a
    // kernel virtual address) first; CPU 0's meta tells.
    const uint64_t at = map->buffers_offset;
    const bool va_first = at <= range.size() - 8 && Load<uint64_t>(range, at) >= kKernelVa;
    meta = va_first ? kCpuMetaSplitInvalid : kCpuMetaSplitKaslr;
  }
  if (meta.size == 0) {
    return Error{"boot_map: offset 0 has a global meta with struct_sizes " + Hex(sizes) +
                 " (global " + std::to_string(global_size) + " bytes, per-CPU " +
                 std::to_string(cpu_size) +
                 " bytes): a layout this reader does not know (known: 6.15+ global 24 with "
                 "per-CPU 32 or 40)"};
  }
  map->layout = meta.size == kCpuMetaSplit.size ? "linux-6.15"
                : meta.invalid_at >= 0          ? "linux-6.15-nr-invalid"
                                                : "linux-6.15-kaslr";
  map->struct_sizes = sizes;
  // The range ends where the global meta says when that is inside the copy;
  // a copy larger than it is a whole backing file or padding.
  uint64_t end = range.size();
  if (map->total_size != range.size()) {
    const bool inside = map->total_size > map->buffers_offset && map->total_size < range.size();
    if (inside) end = map->total_size;
    map->issues.push_back({-1, BootMapCheck::kTotalSize, 8,
                           "total_size " + Hex(map->total_size) + " is not the copy's " +
                               Hex(range.size()) +
                               (inside ? " bytes; the range is read as total_size long"
                                       : " bytes and not inside it; the copy's size is used")});
  }
  const uint64_t bo = map->buffers_offset;
  if (bo < kGlobalMetaSize || bo % 8 != 0 || bo - kGlobalMetaSize > kMaxScratch ||
      bo + meta.size > end) {
    return Error{"boot_map: " + map->layout + " global meta: buffers_offset " + Hex(bo) +
                 " is not an 8-byte aligned offset after the " + std::to_string(kGlobalMetaSize) +
                 "-byte meta, within " + std::to_string(kMaxScratch) +
                 " bytes of scratch and inside the " + Hex(end) + "-byte range"};
  }
  map->scratch =
      ParseScratch(range.subspan(kGlobalMetaSize, bo - kGlobalMetaSize), kGlobalMetaSize);
  Geometry g;
  if (options.cpus > 0) {
    const uint64_t scratch = bo - kGlobalMetaSize;
    uint32_t nr = PredictNrSubbufs(end, AlignUp(meta.size, 8) + scratch, options.cpus, meta, page);
    // The meta's own count when it fits the prediction's other reading.
    const uint32_t stated = Load<uint32_t>(range, bo + meta.first_at + 28);
    if (stated != nr && Predicts(end, bo, options.cpus, meta, page, stated)) nr = stated;
    if (nr == 0) {
      return Error{"boot_map: " + map->layout + ": a range of " + Hex(end) + " bytes after " +
                   Hex(bo) + " bytes of meta and scratch has no room for " +
                   std::to_string(options.cpus) + " CPUs"};
    }
    g = MakeSplit(meta, bo, nr, options.cpus, page);
  } else {
    g = DeriveCpus(range, end, meta, bo, page);
    if (g.cpus == 0) {
      return Error{"boot_map: " + map->layout + ": no per-CPU meta after buffers_offset " +
                   Hex(bo) + " states subbuf_size " + std::to_string(page) +
                   " and an nr_subbufs the range predicts for any CPU count"};
    }
  }
  map->geometry_from = end == range.size() ? "range_size" : "meta";
  map->range_size = end;
  return g;
}

}  // namespace hvtrace::boot_map
