// Fuzzes what a formats harvest brings back from a guest: the tar archive
// (ParseHarvestArchive, ReadTar), the format listing and kallsyms lookups.
// The harvest guest runs the VM's own kernel, so all of it is hostile.
// Seeds: tests/fixtures/fuzz/harvest/.
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "formats_bundle.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > (4u << 20)) return 0;
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto bundle = hvtrace::hostd::ParseHarvestArchive(bytes);
  if (bundle.ok()) {
    size_t n = bundle->kallsyms.size() + bundle->header_page.size();
    for (const auto& e : bundle->events) n += e.text.size() + e.parse_error.size();
    (void)hvtrace::hostd::FindKallsym(bundle->kallsyms, "_text");
    if (n == 1) return 1;
  }
  (void)hvtrace::hostd::SplitFormatListing(text);
  (void)hvtrace::hostd::FindKallsym(text, "_stext");
  (void)hvtrace::hostd::IsSafeComponent(text);
  return 0;
}
