#!/usr/bin/env bash
# Decode benchmark: `hvtrace report` against `trace-cmd report` on the same
# large trace.dat (>= 1 M events), text output to /dev/null, best of 3 runs
# each, in the same run of this script. Prints events/s for both and the
# ratio. Nothing here asserts a timing.
#
#   bench/decode_bench.sh [BUILD_DIR] [TRACE.dat]
#
# Without TRACE.dat the input is made once by bench/make-large-trace.sh and
# cached as BUILD_DIR/bench/large.dat.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${1:-$ROOT/build}
DAT=${2:-}
HVTRACE=$BUILD/bin/hvtrace
RUNS=${RUNS:-3}

[ -x "$HVTRACE" ] || { echo "decode_bench: $HVTRACE not built" >&2; exit 1; }
command -v trace-cmd >/dev/null || { echo "decode_bench: trace-cmd not installed" >&2; exit 1; }
if [ -z "$DAT" ]; then
  mkdir -p "$BUILD/bench"
  DAT=$BUILD/bench/large.dat
  if [ ! -s "$DAT" ]; then
    echo "decode_bench: generating $DAT (once)" >&2
    "$ROOT/bench/make-large-trace.sh" "$DAT" >&2
  fi
fi

# Events = JSON lines (one per event; no header or dropped-events lines).
EVENTS=$("$HVTRACE" report --format json "$DAT" 2>/dev/null | wc -l)
[ "$EVENTS" -gt 0 ] || { echo "decode_bench: no events in $DAT" >&2; exit 1; }

now_ns() { date +%s%N; }
best_ns() {  # best_ns CMD...: the fastest of $RUNS runs, stdout to /dev/null
  local best=0 t0 t1 d i
  for ((i = 0; i < RUNS; i++)); do
    t0=$(now_ns)
    "$@" >/dev/null 2>&1
    t1=$(now_ns)
    d=$((t1 - t0))
    if [ "$best" -eq 0 ] || [ "$d" -lt "$best" ]; then best=$d; fi
  done
  echo "$best"
}

HV_NS=$(best_ns "$HVTRACE" report "$DAT")
TC_NS=$(best_ns trace-cmd report "$DAT")
HV_JSON_NS=$(best_ns "$HVTRACE" report --format json "$DAT")

python3 - "$DAT" "$EVENTS" "$HV_NS" "$TC_NS" "$HV_JSON_NS" <<'PY'
import os, sys
dat, events, hv, tc, hvj = sys.argv[1], int(sys.argv[2]), *map(int, sys.argv[3:6])
rate = lambda ns: events / (ns / 1e9)
print(f"input: {dat} ({os.path.getsize(dat) / 1e6:.1f} MB, {events} events), best of runs")
print(f"trace-cmd report         : {tc / 1e9:8.3f} s  {rate(tc):12,.0f} events/s")
print(f"hvtrace report (text)    : {hv / 1e9:8.3f} s  {rate(hv):12,.0f} events/s")
print(f"hvtrace report (json)    : {hvj / 1e9:8.3f} s  {rate(hvj):12,.0f} events/s")
print(f"ratio hvtrace/trace-cmd (text): {tc / hv:.1f}x")
PY
