#include "lttng_peer.h"

#include "lttng_tp.h"

void LttngFire(long n) {
  for (long i = 0; i < n; ++i) {
    lttng_ust_tracepoint(hvtrace_bench, event, (int)i, i * 3, "hello world");
  }
}

int LttngEnabled(void) { return lttng_ust_tracepoint_enabled(hvtrace_bench, event) ? 1 : 0; }
