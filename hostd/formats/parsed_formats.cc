#include "parsed_formats.h"

namespace hvtrace::hostd {

ParsedFormats::ParsedFormats(const KernelFormats& formats)
    : events_(formats.events.data()),
      size_(formats.events.size()),
      once_(std::make_unique<std::once_flag[]>(size_)),
      parsed_(std::make_unique<ParsedFormat[]>(size_)) {}

ParsedFormat ParsedFormatOf(const KernelFormats& formats, const CachedEventFormat& ev) {
  auto parse = [&ev] {
    return std::make_shared<const Result<EventFormat>>(ParseEventFormat(ev.system, ev.text));
  };
  const ParsedFormats* table = formats.parsed.get();
  if (table == nullptr || formats.events.data() != table->events_ ||
      formats.events.size() != table->size_ || &ev < table->events_ ||
      &ev >= table->events_ + table->size_) {
    return parse();
  }
  const size_t i = static_cast<size_t>(&ev - table->events_);
  std::call_once(table->once_[i], [&] { table->parsed_[i] = parse(); });
  return table->parsed_[i];
}

size_t ParseAllFormats(const KernelFormats& formats) {
  size_t ok = 0;
  for (const CachedEventFormat& ev : formats.events) ok += ParsedFormatOf(formats, ev)->ok();
  return ok;
}

}  // namespace hvtrace::hostd
