/* SPDX-License-Identifier: GPL-2.0 */
/*
 * hvt_alpha's trace events: two layouts that differ from hvt_beta's, so a
 * decoder that mixes up the two modules' ids prints garbage or fails.
 */
#undef TRACE_SYSTEM
#define TRACE_SYSTEM hvt_alpha

#if !defined(_HVT_ALPHA_TRACE_H) || defined(TRACE_HEADER_MULTI_READ)
#define _HVT_ALPHA_TRACE_H

#include <linux/tracepoint.h>

TRACE_EVENT(alpha_seq,
	TP_PROTO(u32 seq, const char *tag),
	TP_ARGS(seq, tag),
	TP_STRUCT__entry(
		__field(u32, seq)
		__array(char, tag, 8)
	),
	TP_fast_assign(
		__entry->seq = seq;
		strscpy(__entry->tag, tag, sizeof(__entry->tag));
	),
	TP_printk("seq=%u tag=%s", __entry->seq, __entry->tag)
);

TRACE_EVENT(alpha_pair,
	TP_PROTO(u64 a, s16 b),
	TP_ARGS(a, b),
	TP_STRUCT__entry(
		__field(u64, a)
		__field(s16, b)
	),
	TP_fast_assign(
		__entry->a = a;
		__entry->b = b;
	),
	TP_printk("a=%llu b=%d", (unsigned long long)__entry->a, (int)__entry->b)
);

#endif /* _HVT_ALPHA_TRACE_H */

#undef TRACE_INCLUDE_PATH
#define TRACE_INCLUDE_PATH .
#undef TRACE_INCLUDE_FILE
#define TRACE_INCLUDE_FILE hvt_alpha_trace
#include <trace/define_trace.h>
