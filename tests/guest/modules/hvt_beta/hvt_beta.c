// SPDX-License-Identifier: GPL-2.0
/*
 * hvt_beta: a module with two trace events, their layouts unlike hvt_alpha's,
 * for hvtrace's end-to-end tests (tests/e2e/module_events_e2e.cc). It emits
 * events only when asked, with values a test can predict:
 *
 *   base=N      (load) the first sequence number; default 1
 *   instance=S  (load) enable this module's events in tracefs instance S
 *               from the kernel side (trace_array_set_clr_event). A 6.12
 *               persistent buffer that holds an earlier boot's events is
 *               reset by the tracefs "enable" files (tracing_update_buffers),
 *               not by this path: a test that wants both boots kept after a
 *               kexec enables the second boot's events this way.
 *   emit=N      (write /sys/module/hvt_beta/parameters/emit) emits N pairs:
 *               beta_named {x = seq << 33 | seq, y = seq * 7,
 *               name "beta-<seq>"} and beta_flag {flag = seq & 0xff};
 *               reading it gives the number of pairs emitted so far.
 *   oops=1      (write /sys/module/hvt_beta/parameters/oops) writes through
 *               a NULL pointer in hvt_beta_oops(), this module's own
 *               function: an oops whose call trace names it with
 *               [hvt_beta] (tests/e2e/hvtraced_boot_e2e.cc; with
 *               panic_on_oops=1 the guest then panics). The writing task
 *               dies holding this module's parameter lock: write it last.
 *   warn=N      (write /sys/module/hvt_beta/parameters/warn) prints N
 *               WARNINGs (at most 1000) from warn_set(), the guest running
 *               on (tests/e2e/log_watch_e2e.cc: a WARN storm).
 */
#include <linux/kernel.h>
#include <linux/module.h>
#include <linux/moduleparam.h>
#include <linux/mutex.h>
#include <linux/trace.h>

#define CREATE_TRACE_POINTS
#include "hvt_beta_trace.h"

static unsigned int base = 1;
module_param(base, uint, 0444);
MODULE_PARM_DESC(base, "first sequence number");

static char *instance;
module_param(instance, charp, 0444);
MODULE_PARM_DESC(instance, "tracefs instance to enable this module's events in at load");

static DEFINE_MUTEX(emit_lock);
static u32 next_seq;
static unsigned int emitted;

static int emit_set(const char *val, const struct kernel_param *kp)
{
	unsigned int n, i;
	int ret = kstrtouint(val, 0, &n);

	if (ret)
		return ret;
	if (n > 100000)
		return -EINVAL;
	mutex_lock(&emit_lock);
	for (i = 0; i < n; i++) {
		const u32 seq = next_seq++;
		char name[24];

		snprintf(name, sizeof(name), "beta-%u", seq);
		trace_beta_named((u64)seq << 33 | seq, seq * 7, name);
		trace_beta_flag((u8)(seq & 0xff));
	}
	emitted += n;
	mutex_unlock(&emit_lock);
	return 0;
}

static int emit_get(char *buffer, const struct kernel_param *kp)
{
	return sysfs_emit(buffer, "%u\n", emitted);
}

static const struct kernel_param_ops emit_ops = {
	.set = emit_set,
	.get = emit_get,
};
module_param_cb(emit, &emit_ops, NULL, 0644);
MODULE_PARM_DESC(emit, "write N: emit N beta_named/beta_flag pairs");

/* NULL, and the compiler cannot prove it: the store below really faults. */
int *hvt_beta_null_target;
EXPORT_SYMBOL_GPL(hvt_beta_null_target);

static noinline void hvt_beta_oops(void)
{
	WRITE_ONCE(*hvt_beta_null_target, 1);
}

static int oops_set(const char *val, const struct kernel_param *kp)
{
	if (!sysfs_streq(val, "1"))
		return -EINVAL;
	hvt_beta_oops();
	return 0;
}

static int warn_set(const char *val, const struct kernel_param *kp)
{
	unsigned int n, i;
	int ret = kstrtouint(val, 0, &n);

	if (ret)
		return ret;
	for (i = 0; i < n && i < 1000; i++)
		WARN(1, "hvt_beta: warning %u of %u\n", i + 1, n);
	return 0;
}

static const struct kernel_param_ops warn_ops = {
	.set = warn_set,
};
module_param_cb(warn, &warn_ops, NULL, 0200);
MODULE_PARM_DESC(warn, "write N: print N WARNINGs");

static const struct kernel_param_ops oops_ops = {
	.set = oops_set,
};
module_param_cb(oops, &oops_ops, NULL, 0200);
MODULE_PARM_DESC(oops, "write 1: write through a NULL pointer (an oops in this module)");

static int __init hvt_beta_init(void)
{
	struct trace_array *tr;
	int ret;

	next_seq = base;
	if (!instance || !instance[0])
		return 0;
	tr = trace_array_get_by_name(instance, NULL);
	if (!tr)
		return -ENOENT;
	ret = trace_array_set_clr_event(tr, "hvt_beta", NULL, true);
	trace_array_put(tr);
	return ret;
}

static void __exit hvt_beta_exit(void)
{
}

module_init(hvt_beta_init);
module_exit(hvt_beta_exit);
MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("hvtrace test module: trace events beta_named and beta_flag on demand");
