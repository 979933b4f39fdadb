#!/usr/bin/env bash
# What uploading real captures to a real S3 store costs hvtraced (issue 17):
# starts a single-node Ceph with radosgw (tests/e2e/ceph_fixture.h), boots a
# 6.12 guest under TCG behind an hvtraced with the upload on, takes N manual
# captures and prints, per capture, the bytes on disk and in the store, the
# time from capture to confirmed upload and the upload thread's CPU; then the
# peer in the same run: curl --aws-sigv4 -T of the same stored bytes, and
# memcpy of them (the limit). Prints the Ceph start time too.
#   bench/upload.sh [build dir] [captures]        (root, like the e2e tests)
set -euo pipefail
BUILD=${1:-build}
echo "== $(date -u '+%Y-%m-%d %H:%M:%S UTC'); $(uptime)"
HVTRACE_BENCH_UPLOAD=1 HVTRACE_BENCH_CAPTURES=${2:-5} \
  "$BUILD/bin/hvtrace_fleet_e2e_tests" --gtest_filter='FleetUploadBench.*' 2>&1 |
  grep -E '^\[(upload-bench|fleet e2e)\]|FAILED|SKIPPED|error'
echo "== $(date -u '+%Y-%m-%d %H:%M:%S UTC'); $(uptime)"
