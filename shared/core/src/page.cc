// Kernel sub-buffer codec: header_page parsing, the page cursor's setup and
// the page writer. The format is described in hvtrace/page.h.
#include "hvtrace/page.h"

#include <algorithm>
#include <charconv>
#include <string>

namespace hvtrace {
namespace {

uint64_t LoadLe(std::span<const std::byte> page, uint32_t offset, uint32_t size) {
  uint64_t v = 0;
  std::memcpy(&v, page.data() + offset, size);  // Little-endian host.
  return v;
}

void StoreLe(std::span<std::byte> page, uint32_t offset, uint32_t size, uint64_t v) {
  std::memcpy(page.data() + offset, &v, size);
}

void Store32(std::span<std::byte> page, uint32_t offset, uint32_t v) {
  std::memcpy(page.data() + offset, &v, sizeof(v));
}

// Finds "key:NUMBER;" in |line| and parses the number.
bool FindNumber(std::string_view line, std::string_view key, uint64_t* out) {
  size_t at = line.find(key);
  if (at == std::string_view::npos) return false;
  const char* begin = line.data() + at + key.size();
  const char* end = line.data() + line.size();
  auto [ptr, ec] = std::from_chars(begin, end, *out);
  return ec == std::errc() && ptr != begin;
}

// The field name of "field: u64 timestamp;" or "field: char data[4080];".
std::string_view FieldName(std::string_view line) {
  size_t at = line.find("field:");
  if (at == std::string_view::npos) return {};
  std::string_view decl = line.substr(at + 6);
  decl = decl.substr(0, decl.find(';'));
  size_t bracket = decl.find('[');
  if (bracket != std::string_view::npos) decl = decl.substr(0, bracket);
  while (!decl.empty() && (decl.back() == ' ' || decl.back() == '\t')) decl.remove_suffix(1);
  size_t space = decl.find_last_of(" \t*");
  return space == std::string_view::npos ? decl : decl.substr(space + 1);
}

}  // namespace

void SetPageCommit(std::span<std::byte> page, const PageLayout& layout, uint64_t commit) {
  StoreLe(page, layout.commit_offset, layout.commit_size, commit);
}

const char* PageErrorName(PageError error) {
  switch (error) {
    case PageError::kOk:
      return "ok";
    case PageError::kShortPage:
      return "short_page";
    case PageError::kCommitPastEnd:
      return "commit_past_end";
    case PageError::kTruncatedHeader:
      return "truncated_header";
    case PageError::kZeroLength:
      return "zero_length";
    case PageError::kRecordPastCommit:
      return "record_past_commit";
    case PageError::kBadPadding:
      return "bad_padding";
    case PageError::kTimeWentBackwards:
      return "time_went_backwards";
    case PageError::kMissedCountPastEnd:
      return "missed_count_past_end";
    case PageError::kCount:
      break;
  }
  return "unknown";
}

uint64_t PageStats::rejected_total() const {
  uint64_t total = 0;
  for (uint64_t n : rejected) total += n;
  return total;
}

PageLayout PageLayout::Default(uint32_t page_size) {
  PageLayout layout;
  layout.page_size = page_size;
  return layout;
}

Result<PageLayout> PageLayout::FromHeaderPage(std::string_view header_page, uint32_t page_size) {
  if (page_size > kMaxPageSize) {
    return Error{"header_page: page size " + std::to_string(page_size) + " exceeds " +
                 std::to_string(kMaxPageSize)};
  }
  bool have_ts = false, have_commit = false, have_data = false;
  PageLayout layout;
  layout.page_size = page_size;
  size_t line_no = 0;
  while (!header_page.empty()) {
    size_t nl = header_page.find('\n');
    std::string_view line = header_page.substr(0, nl);
    header_page.remove_prefix(nl == std::string_view::npos ? header_page.size() : nl + 1);
    ++line_no;
    std::string_view name = FieldName(line);
    if (name.empty()) continue;
    uint64_t offset = 0, size = 0;
    if (!FindNumber(line, "offset:", &offset) || !FindNumber(line, "size:", &size)) {
      return Error{"header_page line " + std::to_string(line_no) + ": field '" + std::string(name) +
                   "' has no offset/size"};
    }
    if (offset > page_size || size > page_size) {
      return Error{"header_page line " + std::to_string(line_no) + ": field '" + std::string(name) +
                   "' offset " + std::to_string(offset) + " size " + std::to_string(size) +
                   " outside a " + std::to_string(page_size) + "-byte page"};
    }
    if (name == "timestamp") {
      layout.timestamp_offset = static_cast<uint32_t>(offset);
      layout.timestamp_size = static_cast<uint32_t>(size);
      have_ts = true;
    } else if (name == "commit") {
      layout.commit_offset = static_cast<uint32_t>(offset);
      layout.commit_size = static_cast<uint32_t>(size);
      have_commit = true;
    } else if (name == "data") {
      layout.data_offset = static_cast<uint32_t>(offset);
      have_data = true;
    }
  }
  if (!have_ts || !have_commit || !have_data) {
    return Error{std::string("header_page: missing field '") +
                 (!have_ts       ? "timestamp"
                  : !have_commit ? "commit"
                                 : "data") +
                 "'"};
  }
  if (layout.timestamp_size != 8) {
    return Error{"header_page: timestamp size " + std::to_string(layout.timestamp_size) +
                 " (expected 8)"};
  }
  if (layout.commit_size != 4 && layout.commit_size != 8) {
    return Error{"header_page: commit size " + std::to_string(layout.commit_size) +
                 " (expected 4 or 8)"};
  }
  const uint64_t header_end =
      std::max<uint64_t>(uint64_t{layout.timestamp_offset} + layout.timestamp_size,
                         uint64_t{layout.commit_offset} + layout.commit_size);
  if (layout.data_offset < header_end || layout.data_offset >= page_size) {
    return Error{"header_page: data offset " + std::to_string(layout.data_offset) +
                 " overlaps the header or leaves no room in a " + std::to_string(page_size) +
                 "-byte page"};
  }
  return layout;
}

bool PageCursor::Fail(PageError error, uint32_t offset) {
  error_ = error;
  error_offset_ = offset;
  return false;
}

PageCursor::PageCursor(std::span<const std::byte> page_copy, const PageLayout& layout)
    : page_(page_copy) {
  // The layout may come from a guest too: check it against the copy before
  // reading anything.
  const uint64_t limit = std::min<uint64_t>(page_copy.size(), layout.page_size);
  const bool sizes_ok =
      layout.timestamp_size == 8 && (layout.commit_size == 4 || layout.commit_size == 8);
  if (!sizes_ok || uint64_t{layout.timestamp_offset} + layout.timestamp_size > limit ||
      uint64_t{layout.commit_offset} + layout.commit_size > limit || layout.data_offset > limit) {
    Fail(PageError::kShortPage, 0);
    return;
  }
  data_offset_ = layout.data_offset;
  header_.time_stamp = LoadLe(page_, layout.timestamp_offset, 8);
  const uint32_t raw =
      static_cast<uint32_t>(LoadLe(page_, layout.commit_offset, layout.commit_size));
  header_.missed_events = (raw & kPageMissedEvents) != 0;
  header_.missed_stored = (raw & kPageMissedStored) != 0;
  const uint32_t commit = raw & kPageCommitMask;
  time_ = header_.time_stamp;
  if (commit > limit - data_offset_) {
    Fail(PageError::kCommitPastEnd, layout.commit_offset);
    return;
  }
  header_.commit = commit;
  if (header_.missed_stored) {
    const uint64_t count_at = uint64_t{data_offset_} + commit;
    if (count_at + layout.commit_size > limit) {
      header_.commit = 0;
      Fail(PageError::kMissedCountPastEnd, static_cast<uint32_t>(count_at));
      return;
    }
    missed_count_ = LoadLe(page_, static_cast<uint32_t>(count_at), layout.commit_size);
  }
}

PageWriter::PageWriter(std::span<std::byte> page, const PageLayout& layout,
                       uint64_t page_time_stamp)
    : page_(page), layout_(layout), last_time_(page_time_stamp) {
  const uint64_t limit = std::min<uint64_t>(page.size(), layout.page_size);
  const bool fits = uint64_t{layout.timestamp_offset} + layout.timestamp_size <= limit &&
                    uint64_t{layout.commit_offset} + layout.commit_size <= limit &&
                    layout.data_offset <= limit && layout.timestamp_size == 8 &&
                    (layout.commit_size == 4 || layout.commit_size == 8);
  if (!fits) {
    capacity_ = 0;
    page_ = {};
    return;
  }
  capacity_ =
      static_cast<uint32_t>(std::min<uint64_t>(limit - layout.data_offset, kPageCommitMask));
  StoreLe(page_, layout.timestamp_offset, 8, page_time_stamp);
  StoreLe(page_, layout.commit_offset, layout.commit_size, 0);
}

bool PageWriter::Append(uint64_t timestamp, std::span<const std::byte> payload) {
  if (page_.empty() || payload.empty() || timestamp < last_time_) return false;
  const uint64_t aligned = (uint64_t{payload.size()} + 3) & ~uint64_t{3};
  const bool small = aligned <= 4u * kRecordTypeMaxData;
  const uint64_t record_size = (small ? 4 : 8) + aligned;
  uint64_t delta = timestamp - last_time_;
  // A TIME_EXTEND carries 59 bits of delta; larger gaps take several.
  constexpr uint64_t kExtendMax = (1ull << 59) - 1;
  // Rounded up without adding first: a delta near 2^64 would wrap.
  const uint64_t extends =
      delta > kTimeDeltaMax ? delta / kExtendMax + (delta % kExtendMax != 0 ? 1 : 0) : 0;
  if (uint64_t{used_} + 8 * extends + record_size + reserve_ > capacity_) return false;
  for (uint64_t i = 0; i < extends; ++i) {
    const uint64_t part = std::min(delta, kExtendMax);
    const uint32_t at = layout_.data_offset + used_;
    Store32(page_, at, kRecordTypeTimeExtend | static_cast<uint32_t>((part & kTimeDeltaMax) << 5));
    Store32(page_, at + 4, static_cast<uint32_t>(part >> kTimeDeltaBits));
    used_ += 8;
    delta -= part;
  }
  const uint32_t at = layout_.data_offset + used_;
  uint32_t payload_at;
  if (small) {
    Store32(page_, at, static_cast<uint32_t>(aligned / 4) | static_cast<uint32_t>(delta << 5));
    payload_at = at + 4;
  } else {
    Store32(page_, at, static_cast<uint32_t>(delta << 5));
    Store32(page_, at + 4, static_cast<uint32_t>(aligned + 4));
    payload_at = at + 8;
  }
  std::memcpy(page_.data() + payload_at, payload.data(), payload.size());
  std::memset(page_.data() + payload_at + payload.size(), 0, aligned - payload.size());
  used_ += static_cast<uint32_t>(record_size);
  last_time_ = timestamp;
  return true;
}

bool PageWriter::AppendAbsoluteTime(uint64_t timestamp) {
  if (page_.empty() || timestamp < last_time_ || uint64_t{used_} + 8 + reserve_ > capacity_) {
    return false;
  }
  // The record holds 59 bits; a reader restores the top bits from the time
  // before it (rb_fix_abs_ts). Refuse what a reader could not restore.
  const uint64_t low = timestamp & ((1ull << 59) - 1);
  uint64_t restored = low;
  if (last_time_ & kAbsTimeMsb) {
    restored |= last_time_ & kAbsTimeMsb;
    if (restored < last_time_) restored += 1ull << 59;
  }
  if (restored != timestamp) return false;
  const uint32_t at = layout_.data_offset + used_;
  Store32(page_, at, kRecordTypeTimeStamp | static_cast<uint32_t>((low & kTimeDeltaMax) << 5));
  Store32(page_, at + 4, static_cast<uint32_t>(low >> kTimeDeltaBits));
  used_ += 8;
  last_time_ = timestamp;
  return true;
}

bool PageWriter::SetMissedEvents(uint64_t count) {
  if (page_.empty()) return false;
  if (count > 0) {
    if (uint64_t{used_} + layout_.commit_size > capacity_) return false;
    reserve_ = layout_.commit_size;
    flags_ |= kPageMissedStored;
    missed_count_ = count;
  }
  flags_ |= kPageMissedEvents;
  return true;
}

void PageWriter::Finish() {
  if (page_.empty()) return;
  // The kernel stores commit as a signed long, so the flag bits sign-extend.
  const uint64_t commit =
      static_cast<uint64_t>(static_cast<int64_t>(static_cast<int32_t>(used_ | flags_)));
  StoreLe(page_, layout_.commit_offset, layout_.commit_size, commit);
  if (flags_ & kPageMissedStored) {
    StoreLe(page_, layout_.data_offset + used_, layout_.commit_size, missed_count_);
  }
}

}  // namespace hvtrace
