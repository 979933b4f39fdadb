// Linux 6.12 persistent ring buffer reader; the format is described in
// boot_map.h. Sizes and positions come from the range size and the page layout
// the host knows; values read from the range are only compared against them.
#include "hvtrace/boot_map.h"

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

namespace hvtrace {
namespace {

static_assert(std::endian::native == std::endian::little,
              "the reader assumes a little-endian host, as the x86 guest");

// Field offsets of struct ring_buffer_meta in the two 6.12 variants.
constexpr uint32_t kMetaSize612 = 56;       // text_addr, data_addr
constexpr uint32_t kMetaSize612Kaslr = 48;  // kaslr_addr
// 6.15 replaced struct_size by struct_sizes = global size | cpu meta size << 16.
constexpr uint32_t kStructSizesShift = 16;

template <typename T>
T Load(std::span<const std::byte> range, uint64_t offset) {
  T value{};
  std::memcpy(&value, range.data() + offset, sizeof(T));
  return value;
}

uint64_t AlignUp(uint64_t value, uint64_t align) { return (value + align - 1) / align * align; }

std::string Hex(uint64_t value) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "0x%llx", static_cast<unsigned long long>(value));
  return buf;
}

struct Geometry {
  uint32_t meta_size = 0;
  int cpus = 0;
  uint32_t nr_subbufs = 0;
  uint64_t stride = 0;
  uint64_t subbufs_offset = 0;  // From the chunk start.
};

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

// Whether the meta at |off| (magic already seen) agrees with |g|.
bool MetaAgrees(std::span<const std::byte> range, const Geometry& g, uint64_t off) {
  return off + g.meta_size <= range.size() && Load<uint32_t>(range, off + 4) == g.meta_size &&
         Load<uint32_t>(range, off + g.meta_size - 4) == g.nr_subbufs;
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
    if (off + g.meta_size > range.size()) return false;
    for (uint32_t i = 0; i < g.meta_size; ++i) {
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
  if (range.size() < kMetaSize612 || Load<uint32_t>(range, 0) != kBootMapMagic) return false;
  Geometry g;
  g.meta_size = Load<uint32_t>(range, 4);
  if (g.meta_size != kMetaSize612 && g.meta_size != kMetaSize612Kaslr) return false;
  const uint32_t subbuf_size = Load<uint32_t>(range, g.meta_size - 8);
  g.nr_subbufs = Load<uint32_t>(range, g.meta_size - 4);
  if (subbuf_size != layout.page_size || g.nr_subbufs < 3 ||
      g.nr_subbufs > range.size() / layout.page_size) {
    return false;
  }
  g.subbufs_offset = AlignUp(g.meta_size + 4 * uint64_t{g.nr_subbufs}, layout.page_size);
  g.stride = g.subbufs_offset + uint64_t{g.nr_subbufs} * layout.page_size;
  if (cpus > 0) {
    g.cpus = cpus;
  } else {
    g.cpus = 0;
    for (int c = 0; c < kBootMapMaxCpus; ++c) {
      const uint64_t off = static_cast<uint64_t>(c) * g.stride;
      if (off + g.meta_size > range.size() || Load<uint32_t>(range, off) != kBootMapMagic ||
          Load<uint32_t>(range, off + 4) != g.meta_size ||
          Load<uint32_t>(range, off + g.meta_size - 4) != g.nr_subbufs) {
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
  uint64_t stride = 0;
  if (!BootMapGeometry(g.stride * static_cast<uint64_t>(g.cpus), g.cpus, layout.page_size,
                       g.meta_size, &nr, &stride) ||
      nr != g.nr_subbufs || stride != g.stride) {
    return false;
  }
  *out = g;
  return true;
}

class CpuReader {
 public:
  CpuReader(std::span<const std::byte> range, const Geometry& g, const PageLayout& layout,
            BootMapCpu* out)
      : range_(range), g_(g), layout_(layout), out_(out) {}

  void Run();

 private:
  void Issue(BootMapCheck check, uint64_t offset, std::string message, bool meta = true) {
    if (meta) out_->meta_valid = false;
    out_->issues.push_back(
        {out_->cpu, check, offset, "cpu " + std::to_string(out_->cpu) + ": " + std::move(message)});
  }
  // Physical slot of a guest address of this CPU's sub-buffers, or -1.
  int64_t SlotOf(uint64_t va) const;
  bool ReadMeta();
  void OrderPages();
  void AddPage(uint32_t logical, int64_t slot);
  void WalkPages();
  void SplitBoots();

  std::span<const std::byte> range_;
  const Geometry& g_;
  const PageLayout& layout_;
  BootMapCpu* out_;
  std::vector<uint8_t> seen_;  // Per physical slot: already in |pages|.
};

int64_t CpuReader::SlotOf(uint64_t va) const {
  const uint64_t page = layout_.page_size;
  if (va < out_->first_buffer) return -1;
  const uint64_t delta = va - out_->first_buffer;
  if (delta % page != 0) return -1;
  const uint64_t slot = delta / page;
  if (slot >= g_.nr_subbufs) return -1;
  return static_cast<int64_t>(slot);
}

bool CpuReader::ReadMeta() {
  BootMapCpu& c = *out_;
  const uint64_t off = c.offset;
  const uint64_t chunk_end = off + g_.subbufs_offset + uint64_t{g_.nr_subbufs} * layout_.page_size;
  if (chunk_end > range_.size()) {
    Issue(BootMapCheck::kChunkOutsideRange, off,
          "chunk at " + Hex(off) + ".." + Hex(chunk_end) + " does not fit in the range of " +
              Hex(range_.size()) + " bytes");
    return false;
  }
  const uint32_t magic = Load<uint32_t>(range_, off);
  c.struct_size = Load<int32_t>(range_, off + 4);
  if (magic != kBootMapMagic) {
    Issue(BootMapCheck::kMagic, off,
          "magic " + Hex(magic) + " at " + Hex(off) + ", want " + Hex(kBootMapMagic) +
              "; CPU not decoded");
    return false;
  }
  c.meta_found = true;
  if (static_cast<uint32_t>(c.struct_size) != g_.meta_size) {
    Issue(BootMapCheck::kStructSize, off + 4,
          "struct_size " + std::to_string(c.struct_size) + ", want " +
              std::to_string(g_.meta_size) + "; fields read with the range's layout");
  }
  uint64_t p = off + 8;
  c.text_addr = Load<uint64_t>(range_, p);
  p += 8;
  if (g_.meta_size == kMetaSize612) {
    c.data_addr = Load<uint64_t>(range_, p);
    p += 8;
  }
  c.first_buffer = Load<uint64_t>(range_, p);
  c.head_buffer = Load<uint64_t>(range_, p + 8);
  c.commit_buffer = Load<uint64_t>(range_, p + 16);
  c.subbuf_size = Load<uint32_t>(range_, p + 24);
  c.nr_subbufs = Load<uint32_t>(range_, p + 28);
  if (c.subbuf_size != layout_.page_size) {
    Issue(BootMapCheck::kSubbufSize, p + 24,
          "subbuf_size " + std::to_string(c.subbuf_size) + ", want " +
              std::to_string(layout_.page_size) + " (the page layout's)");
  }
  if (c.nr_subbufs != g_.nr_subbufs) {
    Issue(BootMapCheck::kNrSubbufs, p + 28,
          "nr_subbufs " + std::to_string(c.nr_subbufs) + ", the range implies " +
              std::to_string(g_.nr_subbufs) + "; using " + std::to_string(g_.nr_subbufs));
  }
  // buffers[] as the range implies it, whatever nr_subbufs claims: it lies
  // between the meta and the sub-buffers of this chunk.
  c.buffers.resize(g_.nr_subbufs);
  std::memcpy(c.buffers.data(), range_.data() + off + g_.meta_size,
              sizeof(int32_t) * g_.nr_subbufs);

  if (c.first_buffer == 0 || c.first_buffer % layout_.page_size != 0) {
    Issue(BootMapCheck::kFirstBuffer, p,
          "first_buffer " + Hex(c.first_buffer) + " is not a sub-buffer address; CPU not decoded");
    return false;
  }
  if (c.head_buffer == 0) {
    Issue(BootMapCheck::kEmpty, p + 8,
          "head_buffer is 0: never written, or reset by a kernel that found it invalid");
    return false;
  }
  c.head_slot = SlotOf(c.head_buffer);
  if (c.head_slot < 0) {
    Issue(BootMapCheck::kHeadOutOfRange, p + 8,
          "head_buffer " + Hex(c.head_buffer) + " is not one of the " +
              std::to_string(g_.nr_subbufs) + " sub-buffers from first_buffer " +
              Hex(c.first_buffer));
  }
  c.commit_slot = SlotOf(c.commit_buffer);
  if (c.commit_slot < 0) {
    Issue(BootMapCheck::kCommitOutOfRange, p + 16,
          "commit_buffer " + Hex(c.commit_buffer) + " is not one of the " +
              std::to_string(g_.nr_subbufs) + " sub-buffers from first_buffer " +
              Hex(c.first_buffer));
  }

  // The kernel rejects the whole CPU on a bad or repeated index; we report the
  // first of each and the count, and place the pages that can still be placed.
  uint32_t out_of_range = 0, duplicates = 0;
  int64_t first_bad = -1, first_dup = -1;
  std::vector<uint8_t> used(g_.nr_subbufs, 0);
  for (uint32_t i = 0; i < g_.nr_subbufs; ++i) {
    const int32_t slot = c.buffers[i];
    if (slot < 0 || static_cast<uint32_t>(slot) >= g_.nr_subbufs) {
      if (out_of_range++ == 0) first_bad = i;
      continue;
    }
    if (used[slot]++ != 0 && duplicates++ == 0) first_dup = i;
  }
  const uint64_t buffers_off = off + g_.meta_size;
  if (out_of_range != 0) {
    Issue(BootMapCheck::kIndexOutOfRange, buffers_off + 4 * first_bad,
          std::to_string(out_of_range) + " buffers[] entries out of range, first buffers[" +
              std::to_string(first_bad) + "] = " + std::to_string(c.buffers[first_bad]));
  }
  if (duplicates != 0) {
    Issue(BootMapCheck::kDuplicateIndex, buffers_off + 4 * first_dup,
          std::to_string(duplicates) + " repeated buffers[] entries, first buffers[" +
              std::to_string(first_dup) + "] = " + std::to_string(c.buffers[first_dup]) +
              " (the 6.12 consuming-read bug does this); repeats are skipped");
  }
  return true;
}

void CpuReader::AddPage(uint32_t logical, int64_t slot) {
  BootMapPage page;
  page.logical = logical;
  page.physical = static_cast<uint32_t>(slot);
  page.offset = out_->offset + g_.subbufs_offset + static_cast<uint64_t>(slot) * layout_.page_size;
  if (seen_[slot]++ != 0) page.skipped = true;
  out_->pages.push_back(page);
}

void CpuReader::OrderPages() {
  BootMapCpu& c = *out_;
  const uint32_t n = g_.nr_subbufs;
  auto valid = [&](int32_t slot) { return slot >= 0 && static_cast<uint32_t>(slot) < n; };
  seen_.assign(n, 0);

  if (valid(c.buffers[0])) {
    c.reader_slot = c.buffers[0];
    AddPage(0, c.reader_slot);
  }
  // Writer still on the reader page: nothing in the ring is newer.
  if (c.commit_slot >= 0 && c.commit_slot == c.reader_slot) return;

  // Logical ring positions 1..n-1 of the head and commit slots.
  int64_t head_pos = -1, commit_pos = -1;
  for (uint32_t i = 1; i < n; ++i) {
    if (head_pos < 0 && c.buffers[i] == c.head_slot) head_pos = i;
    if (commit_pos < 0 && c.buffers[i] == c.commit_slot) commit_pos = i;
  }
  uint32_t start = 1;
  if (c.head_slot >= 0 && c.head_slot == c.reader_slot) {
    Issue(BootMapCheck::kHeadIsReader, c.offset,
          "head_buffer is the reader page (slot " + std::to_string(c.head_slot) + ")");
  } else if (c.head_slot >= 0 && head_pos < 0) {
    Issue(BootMapCheck::kHeadNotInRing, c.offset,
          "head slot " + std::to_string(c.head_slot) + " is not in buffers[1.." +
              std::to_string(n - 1) + "]");
  }
  if (head_pos > 0) {
    start = static_cast<uint32_t>(head_pos);
  } else if (commit_pos > 0) {
    // Without a head, the page after the commit page is the oldest of a
    // full ring; time-order checks below catch what does not fit.
    start = static_cast<uint32_t>(commit_pos) % (n - 1) + 1;
  }
  bool reached_commit = false;
  uint32_t pos = start;
  for (uint32_t k = 0; k + 1 < n; ++k) {
    const int32_t slot = c.buffers[pos];
    if (valid(slot)) AddPage(pos, slot);
    if (slot == c.commit_slot && c.commit_slot >= 0) {
      reached_commit = true;
      break;
    }
    pos = pos % (n - 1) + 1;
  }
  if (!reached_commit && c.commit_slot >= 0) {
    Issue(BootMapCheck::kCommitNotFound, c.offset,
          "commit slot " + std::to_string(c.commit_slot) +
              " not reached from the head; the whole ring was read");
  }
}

void CpuReader::WalkPages() {
  BootMapCpu& c = *out_;
  for (size_t i = 0; i < c.pages.size(); ++i) {
    BootMapPage& page = c.pages[i];
    if (page.skipped) continue;
    const auto copy = range_.subspan(page.offset, layout_.page_size);
    PageCursor header_reader(copy, layout_);
    page.first_timestamp = page.last_timestamp = header_reader.header().time_stamp;
    bool first = true;
    page.error = WalkPage(copy, layout_, &c.stats, [&](const RawRecord& r) {
      if (first) page.first_timestamp = r.timestamp;
      first = false;
      page.last_timestamp = r.timestamp;
      page.records++;
    });
    if (page.error != PageError::kOk) {
      Issue(BootMapCheck::kBadPage, page.offset,
            "page logical " + std::to_string(page.logical) + " slot " +
                std::to_string(page.physical) + ": " + PageErrorName(page.error) + "; " +
                std::to_string(page.records) + " records before it kept",
            /*meta=*/false);
    }
  }
}

void CpuReader::SplitBoots() {
  BootMapCpu& c = *out_;
  // Pages that hold records, in read order.
  std::vector<size_t> data;
  for (size_t i = 0; i < c.pages.size(); ++i) {
    if (!c.pages[i].skipped && c.pages[i].records > 0) data.push_back(i);
  }
  uint32_t boot = 0;
  bool have_prev = false;
  uint64_t prev_last = 0;
  for (size_t k = 0; k < data.size(); ++k) {
    BootMapPage& page = c.pages[data[k]];
    if (have_prev && page.first_timestamp < prev_last) {
      // A new boot restarts the clock near zero and the pages after it
      // follow the new time. A page that restarts near zero while the next
      // page continues the old time is corrupt. A smaller step back is the
      // clock itself, and the kernel's own trace file shows it too: in early
      // boot sched_clock counts jiffies (4 ms steps) until the TSC takes over
      // behind them; the writer then logs "Ring buffer clock went backwards:
      // 56000000 -> 2354458", writes a zero time extend and keeps adding
      // deltas to the old time, and the next page starts at the true time
      // (seen on CPU 0, pages 1 -> 2, in every 6.12 TCG boot here): kept,
      // and reported.
      const bool restarts = page.first_timestamp < prev_last / 2;
      const bool isolated =
          k + 1 < data.size() && c.pages[data[k + 1]].first_timestamp >= prev_last;
      if (restarts && !isolated) {
        ++boot;
      } else {
        page.time_went_backwards = true;
        page.skipped = restarts;
        Issue(BootMapCheck::kTimeWentBackwards, page.offset,
              "page logical " + std::to_string(page.logical) + " slot " +
                  std::to_string(page.physical) + " starts at " +
                  std::to_string(page.first_timestamp) + " ns, before the previous page's " +
                  std::to_string(prev_last) + " ns; " +
                  (restarts ? "the next page continues the old time: skipped"
                            : "a step back of the clock: kept"),
              /*meta=*/false);
        if (page.skipped) continue;
      }
    }
    page.boot = boot;
    prev_last = page.last_timestamp;
    have_prev = true;
  }
  c.boots = data.empty() ? 0 : boot + 1;
  // Empty pages take the boot of the data page before them.
  uint32_t current = 0;
  for (BootMapPage& page : c.pages) {
    if (!page.skipped && page.records > 0) current = page.boot;
    page.boot = current;
  }
}

void CpuReader::Run() {
  out_->meta_valid = true;
  if (!ReadMeta()) {
    out_->meta_valid = false;
    return;
  }
  OrderPages();
  WalkPages();
  SplitBoots();
  for (uint32_t i = 0; i < out_->pages.size(); ++i) {
    const BootMapPage& page = out_->pages[i];
    if (page.skipped || page.records == 0) continue;
    const auto copy = range_.subspan(page.offset, layout_.page_size);
    PageCursor cursor(copy, layout_);
    RawRecord r;
    while (cursor.Next(&r)) out_->records.push_back({r.timestamp, page.boot, i, r.payload});
  }
}

// Runs CpuReader over |cpus| on up to |threads| threads (the caller's among
// them). A panic capture waits on this: with 2 guest CPUs, two threads take
// about half the time. An exception on a helper reaches the caller.
void ReadCpus(std::span<const std::byte> range, const Geometry& g, const PageLayout& layout,
              int threads, std::vector<BootMapCpu>& cpus) {
  std::atomic<size_t> next{0};
  std::exception_ptr failed;
  std::atomic<bool> has_failed{false};
  auto work = [&] {
    try {
      for (size_t c; (c = next.fetch_add(1)) < cpus.size();) {
        CpuReader(range, g, layout, &cpus[c]).Run();
      }
    } catch (...) {
      if (!has_failed.exchange(true)) failed = std::current_exception();
    }
  };
  std::vector<std::thread> helpers;
  const size_t wanted = std::min<size_t>(static_cast<size_t>(std::max(threads, 1)), cpus.size());
  for (size_t i = 1; i < wanted; ++i) {
    try {
      helpers.emplace_back(work);
    } catch (const std::system_error&) {
      break;  // No thread to be had: the others (and the caller) read them all.
    }
  }
  work();
  for (std::thread& t : helpers) t.join();
  if (failed) std::rethrow_exception(failed);
}

}  // namespace

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

bool BootMapGeometry(uint64_t range_size, int cpus, uint32_t subbuf_size, uint32_t meta_size,
                     uint32_t* nr_subbufs, uint64_t* stride) {
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

  const MagicPages magic_pages(range, layout.page_size);
  Geometry best;
  int best_score = 0;
  for (uint32_t meta_size : {kMetaSize612, kMetaSize612Kaslr}) {
    const int lo = options.cpus > 0 ? options.cpus : 1;
    const int hi = options.cpus > 0 ? options.cpus : kBootMapMaxCpus;
    for (int n = lo; n <= hi; ++n) {
      Geometry g;
      g.meta_size = meta_size;
      g.cpus = n;
      if (!BootMapGeometry(range.size(), n, layout.page_size, meta_size, &g.nr_subbufs,
                           &g.stride)) {
        break;  // More CPUs only make chunks smaller.
      }
      g.subbufs_offset = AlignUp(meta_size + 4 * uint64_t{g.nr_subbufs}, layout.page_size);
      const int score = ScoreGeometry(range, magic_pages, g);
      if (score > best_score) {
        best_score = score;
        best = g;
      }
    }
  }

  // A file larger than the range (the whole backing file, padding after
  // it) predicts no chunk layout from its size; meta 0 says the chunk itself.
  bool from_meta = false;
  if (Geometry g; GeometryFromMeta(range, layout, options.cpus, &g)) {
    // On a tie (a copy an exact multiple of the range) the size's guess
    // has more CPUs; it loses only when its extra chunks are all zero.
    const int score = ScoreGeometry(range, magic_pages, g);
    if (score > best_score ||
        (score == best_score && best.cpus > g.cpus && ZeroChunkStarts(range, best, g.cpus))) {
      best_score = score;
      best = g;
      from_meta = true;
    }
  }

  if (best_score == 0) {
    const uint32_t magic = Load<uint32_t>(range, 0);
    const uint32_t size = Load<uint32_t>(range, 4);
    if (magic == kBootMapMagic && (size >> kStructSizesShift) != 0) {
      return Error{"boot_map: offset 0 has a Linux 6.15+ global meta (struct_sizes " + Hex(size) +
                   ": global " + std::to_string(size & 0xffff) + " bytes, per-CPU " +
                   std::to_string(size >> kStructSizesShift) +
                   " bytes); only the 6.12 layout is supported"};
    }
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

  BootMap map;
  map.layout = best.meta_size == kMetaSize612 ? "linux-6.12" : "linux-6.12-kaslr";
  map.cpus = best.cpus;
  map.cpus_derived = options.cpus == 0;
  map.nr_subbufs = best.nr_subbufs;
  map.chunk_stride = best.stride;
  map.geometry_from = from_meta ? "meta" : "range_size";
  map.range_size =
      from_meta ? uint64_t{best.stride} * static_cast<uint64_t>(best.cpus) : range.size();
  map.cpu.resize(best.cpus);
  for (int c = 0; c < best.cpus; ++c) {
    map.cpu[c].cpu = c;
    map.cpu[c].offset = static_cast<uint64_t>(c) * best.stride;
  }
  ReadCpus(range, best, layout, options.threads, map.cpu);

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
