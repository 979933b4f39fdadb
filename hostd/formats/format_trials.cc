#include "format_trials.h"

#include <chrono>
#include <vector>

#include "host_time.h"
#include "hvtrace/decoder.h"

namespace hvtrace::hostd {

FormatTrials RunFormatTrials(KernelFormats* formats) {
  const auto start = std::chrono::steady_clock::now();
  FormatTrials out;
  TraceMetadata m;
  m.source = "kernel " + formats->release + " formats";
  m.header_page = formats->header_page;
  m.printk_formats = formats->printk_formats;
  std::vector<CachedEventFormat*> tried;  // Indexed like m.formats.
  for (CachedEventFormat& f : formats->events) {
    f.trial_passed = false;
    if (!f.parse_error.empty()) continue;
    m.formats.push_back({f.system, f.text});
    tried.push_back(&f);
  }
  std::vector<bool> verdicts;
  if (auto decoder = EventDecoder::Create(m); decoder.ok()) {
    (*decoder)->KeepTrialChild(true);
    verdicts = (*decoder)->TrialParseAll();
  }
  // Create's warnings name what it skipped (an id two formats share, text
  // ParseEventFormat refuses now): not tried, so not passed.
  for (size_t i = 0; i < verdicts.size(); ++i) tried[i]->trial_passed = verdicts[i];
  for (const CachedEventFormat& f : formats->events)
    ++(f.trial_passed ? out.passed : out.not_passed);
  out.ms = MsBetween(start, std::chrono::steady_clock::now());
  return out;
}

}  // namespace hvtrace::hostd
