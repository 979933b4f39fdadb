// Reads one CPU's chunk of a persistent ring buffer, whatever layout found
// it: the meta's fields are checked like the kernel's rb_cpu_meta_valid()
// (and more), the ring is ordered from the head page to the commit page, the
// pages are walked and split into boots. A failed check is reported by name
// and whatever can still be placed is decoded.
#include <algorithm>
#include <atomic>
#include <exception>
#include <string>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "boot_map_internal.h"

namespace hvtrace::boot_map {
namespace {

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
  const uint64_t chunk_end =
      g_.SubbufsOffset(c.cpu, layout_.page_size) + uint64_t{g_.nr_subbufs} * layout_.page_size;
  if (chunk_end > range_.size()) {
    Issue(BootMapCheck::kChunkOutsideRange, off,
          "chunk at " + Hex(off) + ".." + Hex(chunk_end) + " does not fit in the range of " +
              Hex(range_.size()) + " bytes");
    return false;
  }
  const CpuMetaFormat& meta = g_.meta;
  if (meta.has_magic) {
    const uint32_t magic = Load<uint32_t>(range_, off);
    c.struct_size = Load<int32_t>(range_, off + 4);
    if (magic != kBootMapMagic) {
      Issue(BootMapCheck::kMagic, off,
            "magic " + Hex(magic) + " at " + Hex(off) + ", want " + Hex(kBootMapMagic) +
                "; CPU not decoded");
      return false;
    }
    if (static_cast<uint32_t>(c.struct_size) != meta.size) {
      Issue(BootMapCheck::kStructSize, off + 4,
            "struct_size " + std::to_string(c.struct_size) + ", want " + std::to_string(meta.size) +
                "; fields read with the range's layout");
    }
  } else {
    c.struct_size = static_cast<int32_t>(meta.size);  // Checked once, in the global meta.
  }
  c.meta_found = true;
  if (meta.text_at >= 0) c.text_addr = Load<uint64_t>(range_, off + meta.text_at);
  if (meta.data_at >= 0) c.data_addr = Load<uint64_t>(range_, off + meta.data_at);
  if (meta.invalid_at >= 0) {
    c.nr_invalid = Load<uint32_t>(range_, off + meta.invalid_at);
    c.entry_bytes = Load<uint32_t>(range_, off + meta.invalid_at + 4);
  }
  const uint64_t p = off + meta.first_at;
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
  std::memcpy(c.buffers.data(), range_.data() + off + meta.size, sizeof(int32_t) * g_.nr_subbufs);

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
  const uint64_t buffers_off = off + meta.size;
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
  page.offset = g_.SubbufsOffset(out_->cpu, layout_.page_size) +
                static_cast<uint64_t>(slot) * layout_.page_size;
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

}  // namespace

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

}  // namespace hvtrace::boot_map
