// Compiled printers: an event's print format turned, once, into a list of
// steps (literal text, field reads with printf conversions, symbolic and flag
// tables, symbol lookups) that reproduce libtraceevent's text for that event
// byte for byte without re-parsing the format on every record.
//
// Compile() accepts only the shapes it reproduces exactly and returns null
// for everything else (the caller then uses libtraceevent). It also
// reproduces the sched_switch / sched_wakeup plugin handlers, including
// their side effect of registering comms.
#ifndef HVTRACE_SHARED_DECODE_SRC_EVENT_PRINTER_H_
#define HVTRACE_SHARED_DECODE_SRC_EVENT_PRINTER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "hvtrace/format.h"
#include "num_expr.h"

struct tep_handle;
struct tep_event;

namespace hvtrace {

// Kernel symbol lookups (tep_find_function / tep_find_function_address)
// behind a direct-mapped cache: call sites repeat heavily and each lookup is
// a binary search over every kernel symbol. libtraceevent's symbol table does
// not change after the file's kallsyms is loaded, so cached entries stay valid.
class SymbolCache {
 public:
  explicit SymbolCache(tep_handle* tep) : tep_(tep) {}
  // Returns the function containing |addr| (nullptr if none) and its start.
  const char* Find(uint64_t addr, uint64_t* start);

 private:
  struct Entry {
    uint64_t addr = 0;
    const char* name = nullptr;
    uint64_t start = 0;
    bool valid = false;
  };
  static constexpr size_t kEntries = 4096;
  tep_handle* tep_;
  Entry entries_[kEntries];
};

// True for the events whose plugin handler is kmem's call-site handler: it
// prints a symbol and keeps no state (EventDecoder::PrepareText).
bool IsKmemCallSiteEvent(std::string_view system, std::string_view name);

class EventPrinter {
 public:
  virtual ~EventPrinter() = default;
  // Returns a printer for |event| or null when the event needs libtraceevent.
  // |symbols| must outlive the printer; |atoms| (may be null) is read only
  // here.
  static std::unique_ptr<EventPrinter> Compile(
      tep_handle* tep, tep_event* event, const EventFormat& format, SymbolCache* symbols,
      const event_printer_internal::AtomValues* atoms = nullptr);
  // Appends the event's text. |data| is the zero-padded scratch copy of a
  // little-endian record of |size| bytes (see decoder.cc).
  virtual void Print(const unsigned char* data, uint32_t size, std::string* out) = 0;
  // Whether Print's text is only printable ASCII, tabs and newlines for any
  // record (numbers and the format's own plain literals): the report then
  // need not scan it for bytes to escape (MakePrintableFrom).
  virtual bool plain() const { return false; }
};

}  // namespace hvtrace

#endif  // HVTRACE_SHARED_DECODE_SRC_EVENT_PRINTER_H_
