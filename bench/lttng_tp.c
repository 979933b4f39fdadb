/* Instantiates the LTTng-UST provider of lttng_tp.h inside dwtrace_bench. */
#define LTTNG_UST_TRACEPOINT_CREATE_PROBES
#define LTTNG_UST_TRACEPOINT_DEFINE
#include "lttng_tp.h"
