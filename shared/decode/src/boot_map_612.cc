// The Linux 6.12 persistent-buffer geometry: one meta per CPU at the start
// of each chunk, no global meta. The range size and the CPU count give the
// chunks as the kernel lays them out; when the count is not given, the count
// whose predicted chunk starts hold the most agreeing metas wins (boot_map.h).
#include <bit>
#include <cstdint>
#include <span>
#include <vector>

#include "boot_map_internal.h"

namespace hvtrace::boot_map {
namespace {

// The page starts of the range that hold the meta magic. The geometry
// search tries every CPU count with both meta sizes, ~262k chunk starts for
// 512 CPUs; loading each from a 16 MiB copy missed the TLB on nearly every
// one (ReadBootMap 1.35 ms warm, 39% of it in the search, perf of a loop over
// the kexec fixture, 2026-11-28). Chunk strides are whole pages, so one pass
// over the page starts finds the few candidates every geometry then checks.
class MagicPages {
 public:
  MagicPages(std::span<const std::byte> range, uint32_t page_size)
      : page_size_(page_size), bits_((range.size() + page_size - 1) / page_size) {
    for (uint64_t p = 0; p < bits_.size(); ++p) {
      const uint64_t off = p * page_size;
      bits_[p] = off + 4 <= range.size() && Load<uint32_t>(range, off) == kBootMapMagic;
      if (bits_[p]) pages_.push_back(p);
    }
  }
  uint32_t page_size() const { return page_size_; }
  // Page indices holding the magic, ascending.
  const std::vector<uint64_t>& pages() const { return pages_; }
  bool At(uint64_t page) const { return page < bits_.size() && bits_[page] != 0; }

 private:
  uint32_t page_size_;
  std::vector<uint8_t> bits_;
  std::vector<uint64_t> pages_;
};

Geometry Make612(const CpuMetaFormat& meta, int cpus, uint32_t nr_subbufs, uint64_t stride) {
  Geometry g;
  g.meta = meta;
  g.cpus = cpus;
  g.nr_subbufs = nr_subbufs;
  g.stride = stride;
  g.first_meta = 0;
  g.first_chunk_end = stride;
  return g;
}

// Whether the meta at |off| (magic already seen) agrees with |g|.
bool MetaAgrees(std::span<const std::byte> range, const Geometry& g, uint64_t off) {
  return off + g.meta.size <= range.size() && Load<uint32_t>(range, off + 4) == g.meta.size &&
         Load<uint32_t>(range, off + g.meta.size - 4) == g.nr_subbufs;
}

// How many chunk starts of |g| hold a meta that agrees with it: by walking
// the magic pages or the chunk starts, whichever are fewer (a hostile range
// may put the magic on every page).
int ScoreGeometry(std::span<const std::byte> range, const MagicPages& magic, const Geometry& g) {
  const uint64_t page = magic.page_size();
  if (g.stride == 0 || g.stride % page != 0) return 0;  // Chunks start on pages.
  const uint64_t stride_pages = g.stride / page;
  const uint64_t cpus = static_cast<uint64_t>(g.cpus);
  int score = 0;
  if (magic.pages().size() < cpus) {
    for (uint64_t p : magic.pages()) {
      if (p % stride_pages == 0 && p / stride_pages < cpus && MetaAgrees(range, g, p * page)) {
        ++score;
      }
    }
    return score;
  }
  for (uint64_t c = 0; c < cpus; ++c) {
    if (magic.At(c * stride_pages) && MetaAgrees(range, g, c * g.stride)) ++score;
  }
  return score;
}

// Whether chunks |from|.. of |g| start with a zeroed meta (padding, not a CPU).
bool ZeroChunkStarts(std::span<const std::byte> range, const Geometry& g, int from) {
  for (int c = from; c < g.cpus; ++c) {
    const uint64_t off = static_cast<uint64_t>(c) * g.stride;
    if (off + g.meta.size > range.size()) return false;
    for (uint32_t i = 0; i < g.meta.size; ++i) {
      if (range[off + i] != std::byte{0}) return false;
    }
  }
  return true;
}

// The geometry meta 0 describes: its struct_size, subbuf_size and
// nr_subbufs give the chunk stride as the kernel lays it out; the CPU count
// is |cpus| when given, else the number of consecutive chunk starts whose
// meta agrees (possible CPUs that never came online have one too). The
// kernel derives nr_subbufs from the range size, so the range this implies
// (cpus * stride) must predict the same nr_subbufs again.
bool GeometryFromMeta(std::span<const std::byte> range, const PageLayout& layout, int cpus,
                      Geometry* out) {
  if (range.size() < kMeta612.size || Load<uint32_t>(range, 0) != kBootMapMagic) return false;
  const uint32_t meta_size = Load<uint32_t>(range, 4);
  const CpuMetaFormat meta = meta_size == kMeta612.size        ? kMeta612
                             : meta_size == kMeta612Kaslr.size ? kMeta612Kaslr
                                                               : CpuMetaFormat{};
  if (meta.size == 0) return false;
  const uint32_t subbuf_size = Load<uint32_t>(range, meta.size - 8);
  const uint32_t nr_subbufs = Load<uint32_t>(range, meta.size - 4);
  if (subbuf_size != layout.page_size || nr_subbufs < 3 ||
      nr_subbufs > range.size() / layout.page_size) {
    return false;
  }
  const uint64_t stride = AlignUp(meta.size + 4 * uint64_t{nr_subbufs}, layout.page_size) +
                          uint64_t{nr_subbufs} * layout.page_size;
  Geometry g = Make612(meta, cpus, nr_subbufs, stride);
  if (cpus <= 0) {
    g.cpus = 0;
    for (int c = 0; c < kBootMapMaxCpus; ++c) {
      const uint64_t off = static_cast<uint64_t>(c) * g.stride;
      if (off + g.meta.size > range.size() || Load<uint32_t>(range, off) != kBootMapMagic ||
          !MetaAgrees(range, g, off)) {
        break;
      }
      // A CPU's chunk cut off by the end: the copy is smaller than the
      // range, not larger; the size's own geometry decides.
      if (off + g.stride > range.size()) return false;
      g.cpus = c + 1;
    }
  }
  if (g.cpus <= 0) return false;
  uint32_t nr = 0;
  uint64_t predicted_stride = 0;
  if (!BootMapGeometry(g.stride * static_cast<uint64_t>(g.cpus), g.cpus, layout.page_size,
                       g.meta.size, &nr, &predicted_stride) ||
      nr != g.nr_subbufs || predicted_stride != g.stride) {
    return false;
  }
  *out = g;
  return true;
}

}  // namespace

bool Find612Geometry(std::span<const std::byte> range, const BootMapOptions& options, Geometry* out,
                     bool* from_meta) {
  const PageLayout& layout = options.layout;
  const MagicPages magic_pages(range, layout.page_size);
  Geometry best;
  int best_score = 0;
  for (const CpuMetaFormat& meta : {kMeta612, kMeta612Kaslr}) {
    const int lo = options.cpus > 0 ? options.cpus : 1;
    const int hi = options.cpus > 0 ? options.cpus : kBootMapMaxCpus;
    for (int n = lo; n <= hi; ++n) {
      uint32_t nr = 0;
      uint64_t stride = 0;
      if (!BootMapGeometry(range.size(), n, layout.page_size, meta.size, &nr, &stride)) {
        break;  // More CPUs only make chunks smaller.
      }
      const Geometry g = Make612(meta, n, nr, stride);
      const int score = ScoreGeometry(range, magic_pages, g);
      if (score > best_score) {
        best_score = score;
        best = g;
      }
    }
  }

  // A file larger than the range (the whole backing file, padding after
  // it) predicts no chunk layout from its size; meta 0 says the chunk itself.
  *from_meta = false;
  if (Geometry g; GeometryFromMeta(range, layout, options.cpus, &g)) {
    // On a tie (a copy an exact multiple of the range) the size's guess
    // has more CPUs; it loses only when its extra chunks are all zero.
    const int score = ScoreGeometry(range, magic_pages, g);
    if (score > best_score ||
        (score == best_score && best.cpus > g.cpus && ZeroChunkStarts(range, best, g.cpus))) {
      best_score = score;
      best = g;
      *from_meta = true;
    }
  }
  if (best_score == 0) return false;
  *out = best;
  return true;
}

}  // namespace hvtrace::boot_map

namespace hvtrace {

bool BootMapGeometry(uint64_t range_size, int cpus, uint32_t subbuf_size, uint32_t meta_size,
                     uint32_t* nr_subbufs, uint64_t* stride) {
  using boot_map::AlignUp;
  if (cpus <= 0 || subbuf_size == 0 || !std::has_single_bit(subbuf_size)) return false;
  const uint64_t per_cpu = range_size / static_cast<uint64_t>(cpus);
  if (per_cpu <= meta_size) return false;
  uint64_t nr = (per_cpu - meta_size) / (uint64_t{subbuf_size} + 4);
  if (nr < 3) return false;
  // The kernel shrinks the count until every chunk, with its sub-buffers
  // aligned, fits; the range start is page aligned (memmap=).
  for (;;) {
    const uint64_t chunk = AlignUp(meta_size + 4 * nr, subbuf_size) + nr * subbuf_size;
    if (chunk * static_cast<uint64_t>(cpus) <= range_size) {
      if (nr > UINT32_MAX) return false;
      *nr_subbufs = static_cast<uint32_t>(nr);
      *stride = chunk;
      return true;
    }
    if (nr <= 3) return false;
    --nr;
  }
}

}  // namespace hvtrace
