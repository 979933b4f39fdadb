#include "restamp_pages.h"

namespace hvtrace::hostd {

void RestampPage(std::span<const std::byte> page, const PageLayout& layout,
                 const RestampFn& to_time, std::deque<std::vector<std::byte>>* storage,
                 std::vector<std::span<const std::byte>>* out, uint64_t* off_clock) {
  PageCursor cursor(page, layout);
  RawRecord rec;
  std::vector<std::byte>* current = nullptr;
  std::optional<PageWriter> writer;
  bool missed = cursor.header().missed_events;
  auto close = [&] {
    if (!writer) return;
    writer->Finish();
    out->push_back(*current);
    writer.reset();
  };
  while (cursor.Next(&rec)) {
    const std::optional<uint64_t> t = to_time(rec.timestamp);
    if (!t) {
      ++*off_clock;
      continue;
    }
    for (int attempt = 0; attempt < 2; ++attempt) {
      if (!writer) {
        current = &storage->emplace_back(page.size(), std::byte{0});
        writer.emplace(*current, layout, *t);
        if (missed) writer->SetMissedEvents(cursor.missed_count());
        missed = false;
      }
      if (writer->Append(*t, rec.payload)) break;
      if (writer->used() == 0) {  // Cannot fit even an empty page: keep nothing of it.
        ++*off_clock;
        writer.reset();
        storage->pop_back();
        break;
      }
      close();
    }
  }
  close();
}

}  // namespace hvtrace::hostd
