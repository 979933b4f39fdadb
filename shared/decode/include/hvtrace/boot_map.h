// Reader for the Linux persistent ring buffer ("boot_map", trace_instance=
// NAME@ADDR:SIZE) as the host sees it: a private copy of the whole reserved
// range. Two families of layout, told apart by what the range says of itself
// (kernel/trace/ring_buffer.c, trace.c):
//
// Linux 6.12: the range is cut into one chunk per possible CPU (nr_cpu_ids),
// each chunk:
//
//   +0       struct ring_buffer_meta {
//              s32 magic            0x0BADFEED
//              s32 struct_size      56 (text_addr + data_addr) or 48 (kaslr_addr)
//              u64 text_addr, data_addr | u64 kaslr_addr
//              u64 first_buffer     guest virtual address of sub-buffer slot 0
//              u64 head_buffer      guest VA of the oldest ring page
//              u64 commit_buffer    guest VA of the page being written
//              u32 subbuf_size      bytes per sub-buffer, header included
//              u32 nr_subbufs       ring pages + the reader page
//              s32 buffers[nr_subbufs]   logical slot -> physical slot
//            }
//   +ALIGN(struct_size + 4 * nr_subbufs, subbuf_size)
//            nr_subbufs sub-buffers (kernel page format, see page.h)
//
// Linux 6.15 and later (verified on Debian's 7.3): one global meta at the
// range start, the tracer's scratch area after it, then the CPU chunks:
//
//   +0       struct ring_buffer_meta { s32 magic 0x0BADFEED;
//              s32 struct_sizes  (sizeof cpu meta | sizeof global meta << 16,
//                                 0x180020 on 7.3: 32 and 24 bytes)
//              u64 total_size    bytes of the range
//              u64 buffers_offset  CPU 0's meta, from the range start }
//   +24      struct trace_scratch (BootMapScratch below), up to buffers_offset
//   +buffers_offset  struct ring_buffer_cpu_meta { u64 first_buffer,
//              head_buffer, commit_buffer; u32 subbuf_size, nr_subbufs;
//              s32 buffers[nr_subbufs] }, its sub-buffers at the next
//              sub-buffer aligned offset; CPU 1's meta where they end, and
//              so on (every chunk after the first the same size).
//   Two 40-byte per-CPU forms are read too: an earlier 6.15 one with a u64
//   kaslr_addr first, and the later one with u32 nr_invalid, entry_bytes
//   after nr_subbufs (the kernel's count of sub-buffers it dropped as
//   invalid); CPU 0's first word tells them apart (an offset, or a kernel
//   virtual address). Any other struct_sizes is refused by name.
//
// In both, buffers[0] is the reader page; buffers[1..n-1] are the ring in
// list order, wrapping. Readable data is: the reader page, then the ring from
// the head page to the commit page inclusive. Only differences of the guest
// addresses are used ((va - first_buffer) / subbuf_size), never the
// addresses themselves.
//
// 6.12 chunk placement follows the kernel's allocator: with S = range /
// nr_cpu_ids, nr_subbufs starts at (S - struct_size) / (subbuf_size + 4) and
// shrinks until nr_cpu_ids chunks of ALIGN(struct_size + 4 * nr_subbufs,
// subbuf_size) + nr_subbufs * subbuf_size fit in the range; CPU c's chunk
// starts at c times that stride. When the CPU count is not given it is
// derived: every count n from 1 to kBootMapMaxCpus is tried, and the one
// whose predicted chunk starts hold the most metas carrying the magic and the
// predicted nr_subbufs wins (the smallest n on a tie). A wrong n predicts a
// different nr_subbufs, so one intact meta is enough to pin the count. 6.15+
// ranges say their size (total_size) and where the CPUs start; the count is
// the run of agreeing per-CPU metas whose nr_subbufs the kernel's allocator
// predicts for that count.
//
// Everything in the range is hostile: each CPU's metadata is checked like the
// kernel's rb_meta_valid() (and more), a failed check is reported by name, and
// whatever can still be placed is decoded. A page that fails its walk keeps
// the records before the bad one and the rest of its CPU is read on (as 7.2's
// kernel keeps a CPU with one bad sub-buffer); what was lost is counted.
//
// A copy larger than the range (the whole host backing file, or padding
// after the range) does not predict the 6.12 layout from its size; then meta
// 0's struct_size, subbuf_size and nr_subbufs give the chunk stride, and the
// count of consecutive agreeing metas the CPU count (GeometryFromMeta in
// boot_map_612.cc; the range cpus * stride must predict the same nr_subbufs).
// Possible CPUs that never came online (-smp 2,maxcpus=8: nr_cpu_ids 8) have
// a meta with the magic and head_buffer 0 (kEmpty).
//
// After kexec into the same kernel the ring holds the pages of several boots;
// time stamps restart at each boot. A new boot starts at a page whose time is
// below half the previous page's last time when the page after it follows
// the new time (see SplitBoots in boot_map_cpu.cc).
#ifndef HVTRACE_BOOT_MAP_H_
#define HVTRACE_BOOT_MAP_H_

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "hvtrace/page.h"
#include "hvtrace/result.h"

namespace hvtrace {

inline constexpr uint32_t kBootMapMagic = 0x0BADFEED;
inline constexpr int kBootMapMaxCpus = 512;

// Named checks; a failed one is reported as a BootMapIssue. Stable names: see
// BootMapCheckName.
enum class BootMapCheck : uint8_t {
  kChunkOutsideRange,  // The CPU's chunk does not fit in the range.
  kMagic,              // magic != 0x0BADFEED.
  kStructSize,         // struct_size differs from the layout's.
  kSubbufSize,         // subbuf_size != the page layout's page size.
  kNrSubbufs,          // nr_subbufs differs from what the range implies.
  kFirstBuffer,        // first_buffer is 0 or not sub-buffer aligned.
  kHeadOutOfRange,     // head_buffer is not a sub-buffer of this CPU.
  kCommitOutOfRange,   // commit_buffer is not a sub-buffer of this CPU.
  kIndexOutOfRange,    // A buffers[] entry is < 0 or >= nr_subbufs.
  kDuplicateIndex,     // A physical slot appears twice in buffers[].
  kHeadIsReader,       // head_buffer is the reader page's slot.
  kHeadNotInRing,      // head_buffer's slot is not referenced by buffers[].
  kCommitNotFound,     // The ring walk from head never reaches commit.
  kBadPage,            // A page failed to walk (reason in PageStats).
  kTimeWentBackwards,  // A page starts before the previous one ended and is
                       // not a new boot: a small step back is kept (the
                       // clock does that in early boot), a restart near zero
                       // that the next page does not follow is skipped.
  kEmpty,              // head_buffer == 0: never written or reset by a kernel.
  kTotalSize,          // 6.15+: total_size is not the range's size.
  kScratch,            // 6.15+: a scratch area field failed its check.
  kCount,
};
const char* BootMapCheckName(BootMapCheck check);

struct BootMapIssue {
  int cpu = -1;  // -1: about the whole range.
  BootMapCheck check = BootMapCheck::kCount;
  uint64_t offset = 0;  // Offset in the range of the bad field or page.
  std::string message;  // Says which CPU, slot, value.
};

// One sub-buffer in read order.
struct BootMapPage {
  uint32_t logical = 0;              // Index into buffers[] (0 = reader page).
  uint32_t physical = 0;             // Slot after the meta.
  uint64_t offset = 0;               // Offset of the page in the range.
  uint32_t boot = 0;                 // Boot index over the whole range (0 = oldest).
  PageError error = PageError::kOk;  // First walk error; records before it count.
  bool skipped = false;              // Not decoded (duplicate slot, or a corrupt time).
  bool time_went_backwards = false;  // Starts before the previous page ended.
  uint32_t records = 0;
  uint64_t first_timestamp = 0;  // Of the first record (page time when empty).
  uint64_t last_timestamp = 0;
};

// One event. |payload| points into the caller's range copy and starts with
// struct trace_entry; it stays valid as long as that copy does.
struct BootMapRecord {
  uint64_t timestamp = 0;
  uint32_t boot = 0;
  uint32_t page = 0;  // Index into BootMapCpu::pages.
  std::span<const std::byte> payload;
};

// A record's event id (struct trace_entry's u16 common_type); 0 when the
// payload is too short to hold one.
inline uint16_t RecordEventId(std::span<const std::byte> payload) {
  uint16_t type = 0;
  if (payload.size() >= sizeof(type)) std::memcpy(&type, payload.data(), sizeof(type));
  return type;
}

struct BootMapCpu {
  int cpu = 0;
  uint64_t offset = 0;      // Chunk (meta) offset in the range.
  bool meta_found = false;  // Magic present.
  bool meta_valid = false;  // Every metadata check passed.

  // Fields as read from the copy (0 when the chunk is outside the range).
  int32_t struct_size = 0;
  uint64_t text_addr = 0;  // kaslr_addr in the 48-byte variant.
  uint64_t data_addr = 0;
  uint64_t first_buffer = 0, head_buffer = 0, commit_buffer = 0;
  uint32_t subbuf_size = 0, nr_subbufs = 0;
  // "linux-6.15-nr-invalid": the sub-buffers the guest kernel found invalid
  // and dropped (zeroed) when it validated the buffer, and its entry bytes.
  uint32_t nr_invalid = 0, entry_bytes = 0;
  std::vector<int32_t> buffers;  // Copy of buffers[] (bounded by the chunk).

  int64_t reader_slot = -1, head_slot = -1, commit_slot = -1;  // Physical.

  std::vector<BootMapPage> pages;      // Read order: reader, head .. commit.
  std::vector<BootMapRecord> records;  // Read order.
  PageStats stats;
  std::vector<BootMapIssue> issues;
  uint32_t boots = 0;  // Boot segments on this CPU.
};

// One module of the scratch area: where its text was loaded in the boot that
// last wrote the scratch area (mod->mem[MOD_TEXT].base).
struct BootMapModule {
  uint64_t addr = 0;
  std::string name;  // Checked: NUL-terminated, [A-Za-z0-9_-], at most 55 bytes.
};

// 6.15+: struct trace_scratch, owned by the tracer and kept beside the ring:
//   6.15:  { u64 text_addr; u64 nr_entries; entries[] }
//   6.16+: { u32 clock_id; u64 text_addr; u64 nr_entries; entries[] }
//   entries[i] = { u64 mod_addr; char mod_name[56]; }
// text_addr is the address of _text in the boot that last wrote the area
// (before 6.15 final: a KASLR offset). Told apart by where a kernel text
// address stands; entries are refreshed as modules load.
struct BootMapScratch {
  bool present = false;
  std::string layout;        // "text_addr" (6.15) or "clock_id" (6.16+); "" unknown.
  uint64_t offset = 0;       // In the range.
  uint64_t size = 0;         // Bytes up to buffers_offset.
  uint32_t clock_id = 0;     // Index into the kernel's trace_clocks[] (6.16+).
  uint64_t text_addr = 0;    // 0: not written.
  uint64_t nr_entries = 0;   // As the range says.
  uint64_t bad_entries = 0;  // Entries that failed their checks (skipped).
  std::vector<BootMapModule> modules;
  std::vector<std::string> problems;  // Why a field was not used.
};

struct BootMapOptions {
  int cpus = 0;       // nr_cpu_ids when known; 0 derives it.
  PageLayout layout;  // From the guest's events/header_page.
  // CPUs read at once, each on its own thread (their chunks share nothing);
  // 1 reads them in turn on the caller's thread.
  int threads = 1;
};

struct BootMap {
  // "linux-6.12" (56-byte meta), "linux-6.12-kaslr" (48), "linux-6.15" (global
  // meta + 32-byte CPU metas, as 7.3 writes), "linux-6.15-kaslr" (40, kaslr
  // first) or "linux-6.15-nr-invalid" (40, nr_invalid and entry_bytes last).
  std::string layout;
  int cpus = 0;
  bool cpus_derived = false;
  uint32_t nr_subbufs = 0;  // Expected per CPU, from the range size.
  uint64_t chunk_stride = 0;
  // "range_size": the geometry the copy's size predicts (the copy is the
  // range); "meta": the copy is larger than the range (a whole backing file,
  // padding), so meta 0's struct_size, subbuf_size and nr_subbufs gave it.
  std::string geometry_from;
  uint64_t range_size = 0;  // Bytes of the copy the chunks span (meta: cpus * stride).
  // 6.15+: the global meta's fields and the scratch area.
  uint32_t struct_sizes = 0;
  uint64_t total_size = 0, buffers_offset = 0;
  BootMapScratch scratch;
  uint32_t boots = 0;  // Boots seen in the range (max over CPUs).
  std::vector<BootMapCpu> cpu;
  std::vector<BootMapIssue> issues;  // Every CPU's issues and global ones.

  uint64_t total_records() const;
};

// Reads the range. Fails only when nothing can be decoded: the range is too
// small, no meta carries the magic, or the layout is one this reader does not
// know; the message says which. Everything else is reported in the
// result and the rest decoded.
Result<BootMap> ReadBootMap(std::span<const std::byte> range, const BootMapOptions& options);

// Per-CPU nr_subbufs and chunk stride as the 6.12 kernel computes them for a
// range of |range_size| bytes split over |cpus|; false when it would not fit.
bool BootMapGeometry(uint64_t range_size, int cpus, uint32_t subbuf_size, uint32_t meta_size,
                     uint32_t* nr_subbufs, uint64_t* stride);

}  // namespace hvtrace

#endif  // HVTRACE_BOOT_MAP_H_
