/* SPDX-License-Identifier: GPL-2.0 */
/*
 * hvt_beta's trace events: a dynamic string and a one-byte event, layouts
 * that differ from hvt_alpha's.
 */
#undef TRACE_SYSTEM
#define TRACE_SYSTEM hvt_beta

#if !defined(_HVT_BETA_TRACE_H) || defined(TRACE_HEADER_MULTI_READ)
#define _HVT_BETA_TRACE_H

#include <linux/tracepoint.h>

TRACE_EVENT(beta_named,
	TP_PROTO(u64 x, u32 y, const char *name),
	TP_ARGS(x, y, name),
	TP_STRUCT__entry(
		__field(u64, x)
		__field(u32, y)
		__string(name, name)
	),
	TP_fast_assign(
		__entry->x = x;
		__entry->y = y;
		__assign_str(name);
	),
	TP_printk("x=%llu y=%u name=%s", (unsigned long long)__entry->x, __entry->y,
		  __get_str(name))
);

TRACE_EVENT(beta_flag,
	TP_PROTO(u8 flag),
	TP_ARGS(flag),
	TP_STRUCT__entry(
		__field(u8, flag)
	),
	TP_fast_assign(
		__entry->flag = flag;
	),
	TP_printk("flag=%u", (unsigned int)__entry->flag)
);

#endif /* _HVT_BETA_TRACE_H */

#undef TRACE_INCLUDE_PATH
#define TRACE_INCLUDE_PATH .
#undef TRACE_INCLUDE_FILE
#define TRACE_INCLUDE_FILE hvt_beta_trace
#include <trace/define_trace.h>
