// libtraceevent's trial parse of a kernel's event formats, run once when the
// daemon loads them (FormatsService::Get) instead of at each panic.
//
// libtraceevent has no defence against hostile format text, so every
// decoder parses a format in a forked child before it parses it itself
// (EventDecoder, KeepTrialChild). A panic's crash summary prints a few
// events and paid for that fork of hvtraced on its path: `events_print`
// took 6.8-12.6 ms of the capture's `crash` step (bench/README.md,
// capture_latency, 2026-12-03), nearly all of it the fork and the child's
// copy-on-write faults. Run here, one child trial-parses every format of the
// kernel while no panic waits, and the verdicts stay with the exact text
// (CachedEventFormat::trial_passed) for the crash summary's decoder.
#ifndef HVTRACE_HOSTD_FORMAT_TRIALS_H_
#define HVTRACE_HOSTD_FORMAT_TRIALS_H_

#include <cstddef>

#include "formats_cache.h"

namespace hvtrace::hostd {

struct FormatTrials {
  size_t passed = 0;
  // libtraceevent crashed or hung on them in the child, or they were not
  // tried (refused by ParseEventFormat, or an id an earlier format has).
  size_t not_passed = 0;
  double ms = 0;
};

// Trial-parses every format of |formats| and sets trial_passed on those
// libtraceevent survived.
FormatTrials RunFormatTrials(KernelFormats* formats);

}  // namespace hvtrace::hostd

#endif  // HVTRACE_HOSTD_FORMAT_TRIALS_H_
