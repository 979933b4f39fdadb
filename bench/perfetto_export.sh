#!/usr/bin/env bash
# Perfetto export benchmark: `hvtrace show CAPTURE --format perfetto -o FILE`
# against `hvtrace report` (text) on the same large trace.dat (the 1.6 M-event
# file decode_bench.sh uses), best of $RUNS runs each, in the same run of this
# script. Prints wall and CPU seconds, events/s, the peak RSS of each (the
# export streams: its memory should not grow with the file) and the file's
# size. The capture is a directory holding the trace as boot-0.trace.dat.
# Each export run writes a new file: the previous run's is removed before it,
# untimed (replacing it made rename(2) free its ~108 MB, ~30 ms that belong
# to no export; the text goes to /dev/null). Nothing here asserts a timing.
#
#   bench/perfetto_export.sh [BUILD_DIR] [TRACE.dat]
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${1:-$ROOT/build}
DAT=${2:-}
HVTRACE=$BUILD/bin/hvtrace
RUNS=${RUNS:-3}

[ -x "$HVTRACE" ] || { echo "perfetto_export: $HVTRACE not built" >&2; exit 1; }
[ -x /usr/bin/time ] || { echo "perfetto_export: needs /usr/bin/time (package time)" >&2; exit 1; }
if [ -z "$DAT" ]; then
  mkdir -p "$BUILD/bench"
  DAT=$BUILD/bench/large.dat
  if [ ! -s "$DAT" ]; then
    echo "perfetto_export: generating $DAT (once)" >&2
    "$ROOT/bench/make-large-trace.sh" "$DAT" >&2
  fi
fi
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
mkdir "$WORK/capture"
ln -s "$(realpath "$DAT")" "$WORK/capture/boot-0.trace.dat"
EVENTS=$("$HVTRACE" report --format json "$DAT" 2>/dev/null | wc -l)

# best CMD...: "WALL_S CPU_S MAXRSS_KB" of the fastest of $RUNS runs; the
# file $FRESH, when set, is removed before each run.
best() {
  local best_wall="" best_cpu="" rss=0 i t
  t=$(mktemp)
  for ((i = 0; i < RUNS; i++)); do
    [ -n "${FRESH:-}" ] && rm -f "$FRESH"
    /usr/bin/time -f "%e %U %S %M" -o "$t" "$@" >/dev/null 2>/dev/null || true
    read -r wall user sys maxrss < <(tail -n 1 "$t")
    cpu=$(python3 -c "print($user + $sys)")
    if [ -z "$best_wall" ] || python3 -c "import sys; sys.exit(0 if $wall < $best_wall else 1)"; then best_wall=$wall; fi
    if [ -z "$best_cpu" ] || python3 -c "import sys; sys.exit(0 if $cpu < $best_cpu else 1)"; then best_cpu=$cpu; fi
    [ "$maxrss" -gt "$rss" ] && rss=$maxrss
  done
  rm -f "$t"
  echo "$best_wall $best_cpu $rss"
}

TXT=$(best "$HVTRACE" report "$DAT")
PF=$(FRESH=$WORK/out.pftrace best "$HVTRACE" show "$WORK/capture" --format perfetto -o "$WORK/out.pftrace")
SIZE=$(stat -c %s "$WORK/out.pftrace")
if command -v protoc >/dev/null && protoc --decode_raw < "$WORK/out.pftrace" >/dev/null 2>&1; then
  WELL=yes
else
  WELL="NO (or protoc missing)"
fi

python3 - "$DAT" "$EVENTS" "$SIZE" "$WELL" $TXT $PF <<'PY'
import os, sys
dat, events, size, well = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
tw, tc, tr, pw, pc, pr = map(float, sys.argv[5:11])
r = lambda s: events / s if s > 0 else float("inf")
print(f"input: {dat} ({os.path.getsize(dat) / 1e6:.1f} MB, {events} events), best of runs")
print(f"{'':40s} {'wall s':>8s} {'events/s':>12s} {'cpu s':>8s} {'max RSS MB':>11s}")
for name, w, c, m in (("hvtrace report (text)", tw, tc, tr),
                      ("hvtrace show --format perfetto", pw, pc, pr)):
    print(f"{name:40s} {w:8.2f} {r(w):12,.0f} {c:8.2f} {m / 1024:11.1f}")
print(f"perfetto file: {size / 1e6:.1f} MB; protoc --decode_raw accepts it: {well}")
print(f"export vs report text: {tw / pw:.2f}x wall, {tc / pc:.2f}x cpu (goal >= 1x)")
PY
