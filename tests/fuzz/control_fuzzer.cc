// Fuzzes the control-socket framer and request/reply parsers with arbitrary
// byte streams, split into reads at positions taken from the input itself, as
// a hostile local client would send them.
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <variant>
#include <vector>

#include "control_protocol.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace hvtrace::hostd;
  if (size == 0) return 0;
  // The first byte picks the read size so fragmentation is explored too; a
  // small cap makes the oversized-line path reachable.
  size_t chunk = 1 + data[0] % 64;
  std::string_view input(reinterpret_cast<const char*>(data + 1), size - 1);
  LineFramer framer(data[0] & 0x80 ? 256 : kMaxRequestBytes);
  std::vector<Frame> frames;
  for (size_t pos = 0; pos < input.size(); pos += chunk) {
    framer.Feed(input.substr(pos, chunk), frames);
  }
  size_t total = 0;
  for (const Frame& f : frames) {
    total += f.text.size();
    if (!f.within_limit || IsBlankLine(f.text)) continue;
    auto parsed = ParseRequest(f.text);
    if (auto* r = std::get_if<Request>(&parsed)) {
      // Echo only the command: dumping |args| would recurse as deep as the input.
      std::string reply = OkReply(r->id, nlohmann::json{{"cmd", r->cmd}});
      auto back = ParseReply(std::string_view(reply).substr(0, reply.size() - 1));
      if (!back.ok() || back->id != r->id) __builtin_trap();
    } else {
      const auto& e = std::get<RequestError>(parsed);
      std::string reply = ErrorReply(e.id, e.code, e.message);
      if (!ParseReply(reply).ok()) __builtin_trap();
    }
    (void)ParseReply(f.text);
  }
  if (total > input.size()) __builtin_trap();
  return 0;
}
