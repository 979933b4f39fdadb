#!/usr/bin/env bash
# Runs dwtrace_bench with an active LTTng-UST session, so that its LTTng peer
# pays what a traced program pays: starts lttng-sessiond if none runs (and
# stops the one it started), creates a session with hvtrace_bench:* enabled,
# runs the benchmark, destroys the session.
#   bench/dwtrace_bench.sh [path/to/dwtrace_bench]
set -euo pipefail
BIN=${1:-build/bin/dwtrace_bench}
tmp=$(mktemp -d /tmp/hvtrace-lttng-bench.XXXXXX)
started_pid=""
cleanup() {
  lttng destroy "hvtbench-$$" >/dev/null 2>&1 || true
  if [ -n "$started_pid" ]; then kill "$started_pid" 2>/dev/null || true; fi
  rm -rf "$tmp"
}
trap cleanup EXIT
if ! lttng list >/dev/null 2>&1; then
  lttng-sessiond --daemonize --pidfile="$tmp/sessiond.pid" >/dev/null 2>&1
  for _ in $(seq 50); do [ -s "$tmp/sessiond.pid" ] && break; sleep 0.1; done
  started_pid=$(cat "$tmp/sessiond.pid")
fi
lttng create "hvtbench-$$" --output="$tmp/trace" >/dev/null
lttng enable-event -u 'hvtrace_bench:*' -s "hvtbench-$$" >/dev/null
lttng start "hvtbench-$$" >/dev/null
"$BIN"
lttng stop "hvtbench-$$" >/dev/null
