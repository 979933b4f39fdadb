/* LTTng-UST tracepoint provider for dwtrace_bench: the peer the direct-write
 * path is measured against, with the same payload (int, long, 11-char
 * string) as dwtrace_bench's event. */
#undef LTTNG_UST_TRACEPOINT_PROVIDER
#define LTTNG_UST_TRACEPOINT_PROVIDER hvtrace_bench

#undef LTTNG_UST_TRACEPOINT_INCLUDE
#define LTTNG_UST_TRACEPOINT_INCLUDE "./lttng_tp.h"

#if !defined(HVTRACE_BENCH_LTTNG_TP_H_) || defined(LTTNG_UST_TRACEPOINT_HEADER_MULTI_READ)
#define HVTRACE_BENCH_LTTNG_TP_H_

#include <lttng/tracepoint.h>

LTTNG_UST_TRACEPOINT_EVENT(hvtrace_bench, event,
                           LTTNG_UST_TP_ARGS(int, step, long, value, const char*, text),
                           LTTNG_UST_TP_FIELDS(lttng_ust_field_integer(int, step, step)
                                                   lttng_ust_field_integer(long, value, value)
                                                       lttng_ust_field_string(text, text)))

#endif

#include <lttng/tracepoint-event.h>
