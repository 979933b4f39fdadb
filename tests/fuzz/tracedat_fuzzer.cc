// Gives the trace.dat reader any bytes, then walks every page of every CPU it
// finds with the layout the file's own header_page states, as
// `hvtrace report` does.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "hvtrace/page.h"
#include "hvtrace/tracedat.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<std::byte> bytes(size);
  if (size != 0) std::memcpy(bytes.data(), data, size);
  auto dat = hvtrace::TraceDat::OpenBuffer(std::move(bytes), "fuzz.dat");
  if (!dat.ok()) return 0;
  auto layout = hvtrace::PageLayout::FromHeaderPage(dat->header_page(), dat->page_size());
  hvtrace::PageStats stats;
  for (size_t i = 0; i < dat->cpus().size(); ++i) {
    hvtrace::Status s = dat->ForEachPage(i, [&](std::span<const std::byte> page, uint64_t) {
      if (page.size() != dat->page_size()) __builtin_trap();
      if (layout.ok()) {
        hvtrace::WalkPage(page, *layout, &stats, [&](const hvtrace::RawRecord& rec) {
          if (rec.payload.data() < page.data() ||
              rec.payload.data() + rec.payload.size() > page.data() + page.size()) {
            __builtin_trap();
          }
        });
      }
      return true;
    });
    if (!s.ok()) __builtin_trap();  // Every index below cpus().size() is valid.
  }
  if (dat->issues().size() > 1000) __builtin_trap();  // The list is bounded.
  return 0;
}
