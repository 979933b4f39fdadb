// Fuzzes the tracefs format parsers (event format, header_page,
// header_event) and the fingerprint over what they accept. Formats that our
// parser accepts are then handed to libtraceevent, exactly as the decoder
// does, so a format that passes our checks but breaks libtraceevent's parser
// shows up here.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include <traceevent/event-parse.h>

#include "hvtrace/fingerprint.h"
#include "hvtrace/format.h"

// libtraceevent 1.7 leaks a few bytes when it gives up on a malformed print
// format (found by this fuzzer; bounded: once per format per file load).
// That is third-party and not a memory-safety bug, so only leaks whose stack
// is inside libtraceevent are suppressed; our own code stays leak-checked.
extern "C" const char* __lsan_default_suppressions() { return "leak:libtraceevent.so\n"; }

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  auto ev = hvtrace::ParseEventFormat("fuzz", text);
  if (ev.ok()) {
    (void)hvtrace::EventFingerprint(*ev);
    for (const hvtrace::FieldFormat& f : ev->fields) {
      if (static_cast<uint64_t>(f.offset) + f.size > hvtrace::kMaxFieldEnd) __builtin_trap();
    }
    tep_handle* tep = tep_alloc();
    if (tep != nullptr) {
      tep_set_long_size(tep, 8);
      tep_parse_event(tep, text.data(), text.size(), "fuzz");
      tep_free(tep);
    }
  }
  (void)hvtrace::ParseHeaderPage(text);
  (void)hvtrace::ParseHeaderEvent(text);
  return 0;
}
