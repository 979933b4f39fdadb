// TraceMetadataFrom (hvtrace/decoder.h): a decoder's metadata from a
// trace.dat (out of decoder.cc, which is at the size limit of
// source_shape_test).
#include <string>
#include <utility>
#include <vector>

#include "hvtrace/decoder.h"

namespace hvtrace {

TraceMetadata TraceMetadataFrom(const TraceDat& dat) {
  TraceMetadata m;
  m.source = dat.path();
  m.header_page = dat.header_page();
  m.formats = dat.formats();
  m.kallsyms = dat.kallsyms();
  m.printk_formats = dat.printk_formats();
  m.cmdlines = dat.cmdlines();
  m.trace_clock = dat.trace_clock();
  m.long_size = dat.long_size();
  m.page_size = dat.page_size();
  m.big_endian = dat.big_endian();
  return m;
}

TraceMetadata TraceMetadataFrom(TraceDat* dat) {
  std::string kallsyms = dat->ReleaseKallsyms();
  std::vector<FormatText> formats = dat->ReleaseFormats();
  TraceMetadata m = TraceMetadataFrom(*dat);  // Copies neither now.
  m.kallsyms = std::move(kallsyms);
  m.formats = std::move(formats);
  return m;
}

}  // namespace hvtrace
