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

# best CMD...: "WALL_S CPU_S" of the fastest of $RUNS runs (stdout to
# /dev/null). CPU time (user + sys) is printed too because this machine is
# shared: under load, wall time measures the neighbours as much as the tool.
best() {
  local best_wall="" best_cpu="" i t
  t=$(mktemp)
  for ((i = 0; i < RUNS; i++)); do
    /usr/bin/time -f "%e %U %S" -o "$t" "$@" >/dev/null 2>/dev/null || true
    read -r wall user sys < <(tail -n 1 "$t")
    cpu=$(python3 -c "print($user + $sys)")
    if [ -z "$best_wall" ] || python3 -c "import sys; sys.exit(0 if $wall < $best_wall else 1)"; then best_wall=$wall; fi
    if [ -z "$best_cpu" ] || python3 -c "import sys; sys.exit(0 if $cpu < $best_cpu else 1)"; then best_cpu=$cpu; fi
  done
  rm -f "$t"
  echo "$best_wall $best_cpu"
}
[ -x /usr/bin/time ] || { echo "decode_bench: needs /usr/bin/time (package time)" >&2; exit 1; }

TC=$(best trace-cmd report "$DAT")
HV=$(best "$HVTRACE" report "$DAT")
HVJ=$(best "$HVTRACE" report --format json "$DAT")

python3 - "$DAT" "$EVENTS" $TC $HV $HVJ <<'PY'
import os, sys
dat, events = sys.argv[1], int(sys.argv[2])
tc_w, tc_c, hv_w, hv_c, hj_w, hj_c = map(float, sys.argv[3:9])
r = lambda s: events / s if s > 0 else float("inf")
print(f"input: {dat} ({os.path.getsize(dat) / 1e6:.1f} MB, {events} events), best of runs")
print(f"{'':26s} {'wall s':>8s} {'events/s (wall)':>16s} {'cpu s':>8s} {'events/s (cpu)':>16s}")
for name, w, c in (("trace-cmd report", tc_w, tc_c), ("hvtrace report (text)", hv_w, hv_c),
                   ("hvtrace report (json)", hj_w, hj_c)):
    print(f"{name:26s} {w:8.2f} {r(w):16,.0f} {c:8.2f} {r(c):16,.0f}")
print(f"ratio hvtrace/trace-cmd (text): {tc_w / hv_w:.1f}x wall, {tc_c / hv_c:.1f}x cpu")
PY
