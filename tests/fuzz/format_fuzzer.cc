// Fuzzes the tracefs format parsers (event format, header_page,
// header_event) and the fingerprint over what they accept. A format our
// parser accepts then goes through the decoder exactly as a guest's would:
// libtraceevent parses it and prints two records of it (the input's own
// bytes, and all zeros, which is what divides by zero), as text and JSON,
// through the compiled printers and through libtraceevent alone. A
// format that passes our checks but breaks libtraceevent shows up here.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "hvtrace/decoder.h"
#include "hvtrace/fingerprint.h"
#include "hvtrace/format.h"

// libtraceevent 1.7 leaks a few bytes when it gives up on a malformed print
// format (found by this fuzzer; bounded: once per format per file load).
// That is third-party and not a memory-safety bug, so only leaks whose stack
// is inside libtraceevent are suppressed; our own code stays leak-checked.
extern "C" const char* __lsan_default_suppressions() { return "leak:libtraceevent.so\n"; }

namespace {

void PrintRecords(const hvtrace::EventFormat& ev, std::string_view text) {
  hvtrace::TraceMetadata meta;
  meta.source = "fuzz";
  meta.formats.push_back({"fuzz", std::string(text)});
  auto dec = hvtrace::EventDecoder::Create(meta);
  if (!dec.ok()) return;
  std::vector<std::byte> payload(256);
  for (int pass = 0; pass < 4; ++pass) {
    // Own bytes and zeros, each through the compiled printers and through
    // libtraceevent alone.
    const bool zeros = pass & 1;
    (*dec)->SetFastPathsEnabled(pass < 2);
    for (size_t i = 0; i < payload.size(); ++i) {
      payload[i] = zeros || text.empty() ? std::byte{0} : std::byte(text[i % text.size()]);
    }
    payload[0] = std::byte(ev.id & 0xff);
    payload[1] = std::byte(ev.id >> 8);
    std::string out;
    (*dec)->AppendText(hvtrace::DecodedRecord{0, 1, payload, 0}, &out);
    (*dec)->AppendJson(hvtrace::DecodedRecord{0, 1, payload, 0}, &out);
    if (out.empty() || out.back() != '\n') __builtin_trap();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  auto ev = hvtrace::ParseEventFormat("fuzz", text);
  if (ev.ok()) {
    (void)hvtrace::EventFingerprint(*ev);
    for (const hvtrace::FieldFormat& f : ev->fields) {
      if (static_cast<uint64_t>(f.offset) + f.size > hvtrace::kMaxFieldEnd) __builtin_trap();
    }
    if (ev->id < 0x10000) PrintRecords(*ev, text);
  }
  (void)hvtrace::ParseHeaderPage(text);
  (void)hvtrace::ParseHeaderEvent(text);
  return 0;
}
