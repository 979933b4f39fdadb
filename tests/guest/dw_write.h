// "hvtrace-guest-test dw-write": a small direct-write client, so that test
// guests exercise hvtrace/dwtrace.hpp without a program of their own.
#ifndef HVTRACE_TESTS_GUEST_DW_WRITE_H_
#define HVTRACE_TESTS_GUEST_DW_WRITE_H_

namespace hvtrace::guest_test {

// Registers hvtrace_dw:marker {u32 seq; char text[64]} and writes --count
// events (default 1) with TEXT, the n-th as "TEXT n"; with --for-ms MS it
// writes one every --every-ms (default 10) for that long (or until the
// --stop-file exists), through detaches
// and re-attaches. --mono/--tsc pick the clock (default: TSC when
// invariant). Prints one summary line (written, dropped while detached,
// re-attaches); exit status 0 when every event was written (always for
// --for-ms).
int DwWriteMain(int argc, char** argv);

}  // namespace hvtrace::guest_test

#endif  // HVTRACE_TESTS_GUEST_DW_WRITE_H_
