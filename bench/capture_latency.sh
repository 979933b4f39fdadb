#!/bin/sh
# Panic -> capture latency with real TCG guests through hvtraced (see
# bench/capture_latency.cc for what each figure measures). Usage:
#   bench/capture_latency.sh [RUNS [DAEMON [KERNEL]]]   (default 5 runs of build/bin/hvtraced
#   with the 6.12 guest; DAEMON: another binary in build/bin, e.g. hvtraced built from
#   main, to compare; KERNEL: 6.12 or 7.3)
#   VMCORE=1 bench/capture_latency.sh ...: vmcore = on-panic, each panic also
#   dumps the 1 GiB guest (its time and size per run and their median)
set -eu
here=$(cd "$(dirname "$0")/.." && pwd)
bin="$here/build/bin"
[ -x "$bin/capture_latency" ] || { echo "build first: cmake --build build" >&2; exit 1; }
echo "# $(date -u '+%Y-%m-%d %H:%M:%S UTC'); load: $(uptime | sed 's/.*load average: //')"
"$bin/capture_latency" "${1:-5}" "${2:-hvtraced}" "${3:-6.12}" ${VMCORE:+vmcore}
echo "# after: load $(uptime | sed 's/.*load average: //')"
