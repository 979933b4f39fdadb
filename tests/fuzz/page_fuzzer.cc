// Walks any bytes as a kernel sub-buffer, as hostd does with a guest's page.
// Checks that every record the cursor returns lies inside the copy, and that
// what the cursor accepts survives a round trip through PageWriter.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "hvtrace/page.h"

namespace {

struct Record {
  uint64_t timestamp;
  std::vector<std::byte> payload;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // The caller's private copy, as the walker's contract requires.
  std::vector<std::byte> page(size);
  if (size != 0) std::memcpy(page.data(), data, size);

  for (uint32_t page_size : {4096u, static_cast<uint32_t>(size)}) {
    const hvtrace::PageLayout layout = hvtrace::PageLayout::Default(page_size);
    hvtrace::PageCursor cursor(page, layout);
    std::vector<Record> records;
    hvtrace::RawRecord rec;
    while (cursor.Next(&rec)) {
      if (rec.payload.data() < page.data() + layout.data_offset ||
          rec.payload.data() + rec.payload.size() > page.data() + page.size() ||
          rec.offset < layout.data_offset || rec.payload.size() % 4 != 0) {
        __builtin_trap();
      }
      records.push_back({rec.timestamp, {rec.payload.begin(), rec.payload.end()}});
    }
    if (cursor.error() != hvtrace::PageError::kOk && cursor.error() >= hvtrace::PageError::kCount) {
      __builtin_trap();
    }
    if (cursor.error() == hvtrace::PageError::kShortPage) continue;

    // Rewrite what was read and read it back: same times, same payloads, as
    // long as the writer takes every record (it refuses time going backwards
    // after a 64-bit wrap, or a rewrite that needs more room).
    std::vector<std::byte> out(4096);
    const hvtrace::PageLayout out_layout = hvtrace::PageLayout::Default(4096);
    hvtrace::PageWriter writer(out, out_layout, cursor.header().time_stamp);
    size_t written = 0;
    for (const Record& r : records) {
      if (r.payload.empty() || !writer.Append(r.timestamp, r.payload)) break;
      ++written;
    }
    writer.Finish();
    hvtrace::PageCursor again(out, out_layout);
    for (size_t i = 0; i < written; ++i) {
      if (!again.Next(&rec) || rec.timestamp != records[i].timestamp ||
          rec.payload.size() != records[i].payload.size() ||
          std::memcmp(rec.payload.data(), records[i].payload.data(), rec.payload.size()) != 0) {
        __builtin_trap();
      }
    }
    if (again.Next(&rec) || again.error() != hvtrace::PageError::kOk) __builtin_trap();
  }
  return 0;
}
