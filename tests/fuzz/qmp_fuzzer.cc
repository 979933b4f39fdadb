// Fuzzes the QMP framer: arbitrary bytes, split at fuzzer-chosen points, must
// never crash, never yield a non-object message, and must give the same
// messages however the stream is split.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>
#include <vector>

#include "qmp_framer.h"

namespace {

std::vector<nlohmann::json> FeedAll(std::string_view data, size_t chunk, bool* ok) {
  hvtrace::hostd::QmpFramer framer(/*max_message_bytes=*/4096);
  std::vector<nlohmann::json> out;
  *ok = true;
  for (size_t pos = 0; pos < data.size() && *ok; pos += chunk) {
    *ok = framer.Feed(data.substr(pos, chunk)).ok();
    nlohmann::json m;
    while (framer.Pop(&m)) {
      if (!m.is_object()) std::abort();
      out.push_back(std::move(m));
    }
  }
  (void)framer.Finish();
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  // The first byte picks the chunk size of the second pass.
  const size_t chunk = 1 + data[0] % 17;
  std::string_view stream(reinterpret_cast<const char*>(data + 1), size - 1);
  bool ok_whole = false;
  bool ok_split = false;
  auto whole = FeedAll(stream, stream.size() + 1, &ok_whole);
  auto split = FeedAll(stream, chunk, &ok_split);
  if (ok_whole != ok_split || whole != split) std::abort();
  return 0;
}
