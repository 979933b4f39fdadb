// The LTTng-UST side of dwtrace_bench, compiled as C so the tracepoint macros
// are used exactly as a C program would.
#ifndef HVTRACE_BENCH_LTTNG_PEER_H_
#define HVTRACE_BENCH_LTTNG_PEER_H_

#ifdef __cplusplus
extern "C" {
#endif

// Fires |n| hvtrace_bench:event tracepoints.
void LttngFire(long n);
// Whether a session has hvtrace_bench:event enabled (the tracepoint is live).
int LttngEnabled(void);

#ifdef __cplusplus
}
#endif

#endif  // HVTRACE_BENCH_LTTNG_PEER_H_
