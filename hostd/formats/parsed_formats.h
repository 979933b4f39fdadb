// A kernel's event formats parsed on first use, once per load of the formats:
// each step of a capture (the records' fit, the KASLR evidence, the crash
// summary's console field) parsed the formats of the events it reads at
// every panic (~1.3 M instructions at a 6.12 panic, callgrind of hvtraced).
#ifndef HVTRACE_HOSTD_PARSED_FORMATS_H_
#define HVTRACE_HOSTD_PARSED_FORMATS_H_

#include <cstddef>
#include <memory>
#include <mutex>

#include "formats_cache.h"
#include "hvtrace/format.h"
#include "hvtrace/result.h"

namespace hvtrace::hostd {

using ParsedFormat = std::shared_ptr<const Result<EventFormat>>;

class ParsedFormats {
 public:
  // For |formats|' events as they are now: a table is only ever used for
  // the very vector it was made for (ParsedFormatOf).
  explicit ParsedFormats(const KernelFormats& formats);
  ParsedFormats(const ParsedFormats&) = delete;
  ParsedFormats& operator=(const ParsedFormats&) = delete;

 private:
  friend ParsedFormat ParsedFormatOf(const KernelFormats& formats, const CachedEventFormat& ev);
  const CachedEventFormat* events_;  // The vector's elements, as made for.
  size_t size_;
  std::unique_ptr<std::once_flag[]> once_;
  std::unique_ptr<ParsedFormat[]> parsed_;
};

// Parses every event of |formats| now (for the daemon, when it loads them:
// the first panic of a kernel then parses nothing). Returns how many parsed.
size_t ParseAllFormats(const KernelFormats& formats);

// |ev|, an entry of |formats|.events, through ParseEventFormat: once per
// load when Load made the table (thread-safe), else now (formats made
// another way, or a copy whose vector moved).
ParsedFormat ParsedFormatOf(const KernelFormats& formats, const CachedEventFormat& ev);

}  // namespace hvtrace::hostd

#endif  // HVTRACE_HOSTD_PARSED_FORMATS_H_
