#!/usr/bin/env bash
# Writes a large trace.dat (>= 1.2 M events by default) recorded from this
# machine's own kernel, for the decode benchmark:
#
#   bench/make-large-trace.sh OUT.dat [MIN_EVENTS]
#
# Same recipe as tests/fixtures/make-fixtures.sh (events enabled through
# tracefs on the top instance, `trace-cmd extract`, version 7 with trace-cmd's
# default compression), with a big buffer and a load that runs until the
# buffer holds enough events. Needs root and tracefs. Tracing state is reset
# at the end. The output is never committed; put it in a build directory.
set -euo pipefail

OUT=${1:?usage: $0 OUT.dat [MIN_EVENTS]}
MIN_EVENTS=${2:-1200000}
T=/sys/kernel/tracing
[ -e "$T/trace" ] || mount -t tracefs nodev "$T"
command -v trace-cmd >/dev/null
mkdir -p "$(dirname "$OUT")"

OLD_BUFFER_KB=$(sed -e 's/.*expanded: \([0-9]*\).*/\1/' -e 's/ .*//' "$T/buffer_size_kb")
reset_tracing() {
  echo 0 > "$T/tracing_on"
  echo 0 > "$T/events/enable"
  echo > "$T/set_event_pid"
  echo 0 > "$T/options/event-fork"
  echo > "$T/trace"
  echo "$OLD_BUFFER_KB" > "$T/buffer_size_kb"
  echo 1 > "$T/tracing_on"
}
trap reset_tracing EXIT

EVENTS="sched/sched_switch sched/sched_wakeup sched/sched_waking
        sched/sched_process_fork sched/sched_process_exec sched/sched_process_exit
        irq/irq_handler_entry irq/irq_handler_exit irq/softirq_entry irq/softirq_exit
        irq/softirq_raise
        timer/timer_start timer/timer_expire_entry timer/timer_expire_exit
        timer/hrtimer_start timer/hrtimer_expire_entry timer/hrtimer_expire_exit
        kmem/kmalloc kmem/kfree kmem/kmem_cache_alloc kmem/kmem_cache_free
        kmem/mm_page_alloc kmem/mm_page_free
        syscalls/sys_enter_openat syscalls/sys_exit_openat
        syscalls/sys_enter_read syscalls/sys_exit_read
        syscalls/sys_enter_write syscalls/sys_exit_write
        syscalls/sys_enter_close syscalls/sys_exit_close"

# About 45 bytes per event in the ring buffer. The load may run on one CPU
# only, so each CPU gets room for all of it and the buffer does not wrap.
BUFFER_KB=$(( MIN_EVENTS * 64 / 1024 + 4096 ))

echo 0 > "$T/tracing_on"
echo 0 > "$T/events/enable"
echo "$BUFFER_KB" > "$T/buffer_size_kb"
echo local > "$T/trace_clock"
echo > "$T/trace"
# Only this script and its children: the machine is shared.
echo 1 > "$T/options/event-fork"
echo $$ > "$T/set_event_pid"
for e in $EVENTS; do echo 1 > "$T/events/$e/enable"; done
echo 1 > "$T/tracing_on"

entries() {
  local sum=0 n
  for f in "$T"/per_cpu/cpu*/stats; do
    n=$(sed -n 's/^entries: //p' "$f")
    sum=$((sum + n))
  done
  echo "$sum"
}

# Load: byte-sized reads and writes (4 syscall events per byte), processes,
# compression (allocations) and trace_marker prints, until there are enough
# events (with 10% to spare) or 5 minutes pass.
deadline=$((SECONDS + 300))
round=0
while [ "$(entries)" -lt $((MIN_EVENTS + MIN_EVENTS / 10)) ]; do
  if [ $SECONDS -ge $deadline ]; then
    echo "make-large-trace: only $(entries) events after 5 minutes" >&2
    exit 1
  fi
  echo "hvtrace bench round $round" > "$T/trace_marker"
  dd if=/dev/zero of=/dev/null bs=1 count=20000 status=none
  head -c 262144 /dev/urandom | gzip -c > /dev/null
  ls /usr/bin > /dev/null
  round=$((round + 1))
done
echo 0 > "$T/tracing_on"
echo "make-large-trace: $(entries) events in the buffer after $round rounds" >&2

trace-cmd extract -o "$OUT" > /dev/null 2>&1
rm -f "$OUT".cpu*
n=$(trace-cmd report "$OUT" 2>/dev/null | grep -vc '^cpus=')
echo "make-large-trace: $OUT: $n events ($(stat -c %s "$OUT") bytes)" >&2
if [ "$n" -lt "$MIN_EVENTS" ]; then
  echo "make-large-trace: fewer than $MIN_EVENTS events" >&2
  exit 1
fi
