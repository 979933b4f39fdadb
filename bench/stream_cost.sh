#!/usr/bin/env bash
# What one `hvtrace stream` costs hvtraced (issue 16): daemon CPU per stream
# when the guest writes nothing, ~100 KB/s and as much as it can, against
# the memcpy limit for the same bytes and the old full-snapshot read.
#   1. in process (build/bin/stream_cost_bench): the daemon's stream tick on a
#      16 MiB region at 0, 100 KB/s and 1 MB/s, incremental vs full read vs
#      memcpy of the written bytes;
#   2. a real TCG guest attached to a real hvtraced with one `hvtrace stream`
#      (StreamCostBench in build/bin/hvtrace_e2e_tests): hvtraced's own
#      utime+stime per second while the guest writes direct-write events.
#   bench/stream_cost.sh [build dir]        (root, like the e2e tests)
set -euo pipefail
BUILD=${1:-build}
echo "== $(date -u '+%Y-%m-%d %H:%M:%S UTC'); $(uptime)"
echo "== in process"
"$BUILD/bin/stream_cost_bench" 5
echo "== real guest (TCG)"
HVTRACE_BENCH_STREAM=1 HVTRACE_ACCEL=${HVTRACE_ACCEL:-tcg} \
  "$BUILD/bin/hvtrace_e2e_tests" --gtest_filter='StreamCostBench.*' 2>&1 | grep -E '^\[stream-cost\]|FAILED|SKIPPED|error'
echo "== $(date -u '+%Y-%m-%d %H:%M:%S UTC'); $(uptime)"
