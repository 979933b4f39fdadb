// Kernel ring-buffer sub-buffer ("page") codec.
//
// A sub-buffer is what the kernel's ring buffer hands out and what
// trace_pipe_raw, trace.dat and the 6.12 persistent buffer hold:
//
//   +0                 u64 time_stamp      (offset/size from events/header_page)
//   +8                 local_t commit      bytes of data used (low 27 bits),
//                                          bit 31 RB_MISSED_EVENTS,
//                                          bit 30 RB_MISSED_STORED
//   +data_offset       events: u32 header {type_len:5, time_delta:27}, then
//                        type_len 1..28 : 4*type_len bytes of payload
//                        type_len 0     : u32 length (incl. itself), payload
//                        29 PADDING     : delta 0 -> rest unused, else skip
//                        30 TIME_EXTEND : delta += array[0] << 27
//                        31 TIME_STAMP  : absolute time stamp
//   +data_offset+commit  (if MISSED_STORED) the count of missed events
//
// Pages may come from an untrusted guest. The walker only ever reads a private
// copy that the caller owns, checks every length against the page size the
// host chose (never against a size the page claims), and reports a rejected
// page by reason instead of trusting it.
#ifndef HVTRACE_PAGE_H_
#define HVTRACE_PAGE_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string_view>

#include "hvtrace/result.h"

namespace hvtrace {

// Ring-buffer constants from the kernel (kernel/trace/ring_buffer.c).
inline constexpr uint32_t kPageCommitMask = (1u << 27) - 1;
inline constexpr uint32_t kPageMissedEvents = 1u << 31;
inline constexpr uint32_t kPageMissedStored = 1u << 30;
inline constexpr uint32_t kRecordTypeMaxData = 28;
inline constexpr uint32_t kRecordTypePadding = 29;
inline constexpr uint32_t kRecordTypeTimeExtend = 30;
inline constexpr uint32_t kRecordTypeTimeStamp = 31;
inline constexpr uint32_t kTimeDeltaBits = 27;
inline constexpr uint64_t kTimeDeltaMax = (1u << kTimeDeltaBits) - 1;
// An absolute TIME_STAMP holds 59 bits; the kernel takes the top 5 from the
// time stamp before it (rb_fix_abs_ts).
inline constexpr uint64_t kAbsTimeMsb = 0xf8ull << 56;

// Where the page header fields are, as stated by events/header_page.
struct PageLayout {
  uint32_t timestamp_offset = 0;
  uint32_t timestamp_size = 8;
  uint32_t commit_offset = 8;
  uint32_t commit_size = 8;
  uint32_t data_offset = 16;
  uint32_t page_size = 4096;  // Whole sub-buffer, header included.

  // Parses the text of events/header_page. |page_size| is the sub-buffer size
  // of the source (trace.dat header, region slot size), not the "data" size.
  static Result<PageLayout> FromHeaderPage(std::string_view header_page, uint32_t page_size);

  // The layout of this host (x86-64): 8-byte time stamp and commit, data at
  // 16, for a sub-buffer of |page_size| bytes.
  static PageLayout Default(uint32_t page_size = 4096);
  // The largest sub-buffer size we accept (commit is 27 bits).
  static constexpr uint32_t kMaxPageSize = 1u << 27;

  bool operator==(const PageLayout&) const = default;
};

// Why a page (or the rest of it) was rejected. Stable names: see PageErrorName.
enum class PageError : uint8_t {
  kOk = 0,
  kShortPage,           // Fewer bytes than the layout's header.
  kCommitPastEnd,       // commit > page_size - data_offset.
  kTruncatedHeader,     // A record header or length word crosses commit.
  kZeroLength,          // A type_len 0 record whose length is < 8.
  kRecordPastCommit,    // A record's payload crosses commit.
  kBadPadding,          // A discarded-event padding with an impossible length.
  kTimeWentBackwards,   // An absolute time stamp before the running time.
  kMissedCountPastEnd,  // MISSED_STORED but no room for the count.
  kCount,
};
const char* PageErrorName(PageError error);

// Stores |commit| (its flag bits included) in the commit field of a page
// copy, |layout.commit_size| bytes at |layout.commit_offset|: a page the host
// cut after its last good record. |page| holds at least the layout's header.
void SetPageCommit(std::span<std::byte> page, const PageLayout& layout, uint64_t commit);

// Counters of pages and records, per reason for rejected pages.
struct PageStats {
  uint64_t pages = 0;
  uint64_t records = 0;
  uint64_t pages_with_missed_events = 0;
  uint64_t missed_events = 0;  // Sum of stored missed counts.
  std::array<uint64_t, static_cast<size_t>(PageError::kCount)> rejected{};
  uint64_t rejected_total() const;
};

// One data record of a page. |payload| points into the caller's page copy and
// starts with struct trace_entry (u16 type, u8 flags, u8 preempt_count, s32 pid).
struct RawRecord {
  uint64_t timestamp = 0;
  std::span<const std::byte> payload;
  uint32_t offset = 0;  // Offset of the record header within the page.
};

// Header values of one page, as read from the copy.
struct PageHeader {
  uint64_t time_stamp = 0;
  uint32_t commit = 0;  // Data bytes, flags masked off.
  bool missed_events = false;
  bool missed_stored = false;
};

// Iterates the records of one page copy. Usage:
//   PageCursor cursor(page_copy, layout);
//   RawRecord rec;
//   while (cursor.Next(&rec)) { ... }
//   if (cursor.error() != PageError::kOk) { ... the rest of the page is bad ... }
// Records returned before an error are valid and bounded.
class PageCursor {
 public:
  PageCursor(std::span<const std::byte> page_copy, const PageLayout& layout);

  const PageHeader& header() const { return header_; }
  // Missed events stored after the data (0 when not stored).
  uint64_t missed_count() const { return missed_count_; }
  PageError error() const { return error_; }
  uint32_t error_offset() const { return error_offset_; }

  // Returns the next data record, or false at the end of the data or on the
  // first bad record (then error() says why). Inline: this is the hot path.
  inline bool Next(RawRecord* record);

 private:
  bool Fail(PageError error, uint32_t offset);
  uint32_t Load32(uint32_t offset) const {
    uint32_t v;
    std::memcpy(&v, page_.data() + offset, sizeof(v));
    return v;  // Little-endian host; the kernels we read are little-endian.
  }

  std::span<const std::byte> page_;
  PageHeader header_;
  uint32_t data_offset_ = 0;
  uint32_t pos_ = 0;  // Relative to the data start.
  uint64_t time_ = 0;
  uint64_t missed_count_ = 0;
  PageError error_ = PageError::kOk;
  uint32_t error_offset_ = 0;
};

// Walks a whole page copy, calling |on_record(const RawRecord&)| for every good
// record, and updates |stats|. Returns the first error (kOk for a clean page).
template <typename F>
PageError WalkPage(std::span<const std::byte> page_copy, const PageLayout& layout, PageStats* stats,
                   F&& on_record) {
  PageCursor cursor(page_copy, layout);
  RawRecord record;
  uint64_t n = 0;
  while (cursor.Next(&record)) {
    on_record(record);
    ++n;
  }
  stats->pages++;
  stats->records += n;
  if (cursor.header().missed_events) {
    stats->pages_with_missed_events++;
    stats->missed_events += cursor.missed_count();
  }
  if (cursor.error() != PageError::kOk) {
    stats->rejected[static_cast<size_t>(cursor.error())]++;
  }
  return cursor.error();
}

// Builds sub-buffer pages in the kernel format. Used by the guest's
// direct-write path and by tests. Writes only within |page|.
class PageWriter {
 public:
  PageWriter(std::span<std::byte> page, const PageLayout& layout, uint64_t page_time_stamp);

  // Appends one event with |payload| (starting with struct trace_entry) at
  // absolute time |timestamp|, adding a TIME_EXTEND when the delta needs it.
  // Returns false, writing nothing, when the page has no room.
  bool Append(uint64_t timestamp, std::span<const std::byte> payload);
  // Appends an absolute TIME_STAMP record.
  bool AppendAbsoluteTime(uint64_t timestamp);
  // Marks missed events in commit; |count| > 0 stores the count after the data.
  bool SetMissedEvents(uint64_t count);
  // Stores commit into the page header. Call after the last append.
  void Finish();

  uint32_t used() const { return used_; }  // Data bytes written.
  uint32_t capacity() const { return capacity_; }

 private:
  std::span<std::byte> page_;
  PageLayout layout_;
  uint32_t capacity_ = 0;
  uint32_t used_ = 0;
  uint64_t last_time_ = 0;
  uint32_t flags_ = 0;
  uint64_t missed_count_ = 0;
  uint32_t reserve_ = 0;  // Bytes kept free at the end for the missed count.
};

inline bool PageCursor::Next(RawRecord* record) {
  const uint32_t commit = header_.commit;
  while (error_ == PageError::kOk && pos_ < commit) {
    const uint32_t at = data_offset_ + pos_;
    const uint32_t remaining = commit - pos_;
    if (remaining < 4) return Fail(PageError::kTruncatedHeader, at);
    const uint32_t word = Load32(at);
    const uint32_t type_len = word & 31u;
    const uint32_t delta = word >> 5;
    if (type_len <= kRecordTypeMaxData) {
      uint32_t payload_at;
      uint64_t payload_len;
      if (type_len != 0) {
        payload_at = at + 4;
        payload_len = 4u * type_len;
      } else {
        if (remaining < 8) return Fail(PageError::kTruncatedHeader, at);
        const uint32_t length = Load32(at + 4);  // Includes the length word.
        if (length < 8) return Fail(PageError::kZeroLength, at);
        payload_at = at + 8;
        payload_len = (static_cast<uint64_t>(length) - 4 + 3) & ~uint64_t{3};
      }
      const uint64_t total = (payload_at - at) + payload_len;
      if (total > remaining) return Fail(PageError::kRecordPastCommit, at);
      time_ += delta;
      pos_ += static_cast<uint32_t>(total);
      record->timestamp = time_;
      record->payload = page_.subspan(payload_at, static_cast<size_t>(payload_len));
      record->offset = at;
      return true;
    }
    if (type_len == kRecordTypePadding && delta == 0) {
      pos_ = commit;  // The rest of the page is unused.
      return false;
    }
    if (remaining < 8) return Fail(PageError::kTruncatedHeader, at);
    const uint32_t array0 = Load32(at + 4);
    if (type_len == kRecordTypePadding) {
      // A discarded event: array[0] is its length after the header. Its delta
      // still counts (the next event's delta is relative to it), except the
      // marker value 1 that the kernel stores for a discarded zero delta.
      if (array0 < 4 || (array0 & 3u) != 0 || array0 > remaining - 4) {
        return Fail(PageError::kBadPadding, at);
      }
      if (delta != 1) time_ += delta;
      pos_ += 4 + array0;
    } else if (type_len == kRecordTypeTimeExtend) {
      time_ += (static_cast<uint64_t>(array0) << kTimeDeltaBits) | delta;
      pos_ += 8;
    } else {  // kRecordTypeTimeStamp
      uint64_t abs = (static_cast<uint64_t>(array0) << kTimeDeltaBits) | delta;
      if (time_ & kAbsTimeMsb) {
        abs |= time_ & kAbsTimeMsb;
        if (abs < time_) abs += 1ull << 59;
      }
      if (abs < time_) return Fail(PageError::kTimeWentBackwards, at);
      time_ = abs;
      pos_ += 8;
    }
  }
  return false;
}

}  // namespace hvtrace

#endif  // HVTRACE_PAGE_H_
