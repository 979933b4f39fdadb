#!/usr/bin/env bash
# Tests tests/run.sh's counting (tests/tools/summarize-results.py) on made-up
# ctest JUnit and GoogleTest XML reports: each test counts on its own, a skip
# is not a pass, with CI=true a skip not in the allow-list fails, the last
# line is `N passed, N failed, N skipped` and the exit status says whether
# anything failed. Registered with ctest (label unit) as RunSummaryTest.
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
SUMMARIZE="$ROOT/tests/tools/summarize-results.py"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
failures=0
fail() { echo "run_summary_test: FAIL: $*" >&2; failures=$((failures + 1)); }

# junit FILE CASE...: a ctest JUnit report as ctest 3.25 writes it; a CASE is
# NAME:STATUS[:SKIP-MESSAGE[:OUTPUT]] (OUTPUT with \n for newlines).
junit() {
  local file=$1; shift
  {
    echo '<?xml version="1.0" encoding="UTF-8"?>'
    echo "<testsuite name=\"(empty)\" tests=\"$#\" hostname=\"\" time=\"1\" timestamp=\"2026-01-01T00:00:00\">"
    local c name status message output
    for c in "$@"; do
      IFS=: read -r name status message output <<<"$c"
      echo "  <testcase name=\"$name\" classname=\"$name\" time=\"0.1\" status=\"$status\">"
      case "$status" in
        fail) echo '    <failure message=""/>' ;;
        notrun) echo "    <skipped message=\"$message\"/>" ;;
      esac
      printf '    <system-out>%b</system-out>\n  </testcase>\n' "${output:-}"
    done
    echo '</testsuite>'
  } >"$file"
}

# summarize NAME EXPECTED-LAST-LINE EXPECTED-STATUS [ENV...] -- ARGS...: runs
# the summarizer, checks its last line and exit status; output in $WORK/NAME.out.
summarize() {
  local name=$1 want_line=$2 want_status=$3; shift 3
  local envs=()
  while [ "$1" != "--" ]; do envs+=("$1"); shift; done
  shift
  env -u CI "${envs[@]}" python3 "$SUMMARIZE" "$@" >"$WORK/$name.out" 2>&1
  local status=$?
  local last
  last=$(tail -n 1 "$WORK/$name.out")
  [ "$last" = "$want_line" ] || fail "$name: last line '$last', expected '$want_line'"
  [ "$status" -eq "$want_status" ] || fail "$name: exit status $status, expected $want_status"
  grep -qE '^[0-9]+ passed, [0-9]+ failed, [0-9]+ skipped$' <<<"$last" \
    || fail "$name: last line is not 'N passed, N failed, N skipped'"
}
expect_output() {  # expect_output NAME REGEX: a line of NAME's output matches
  grep -qE "$2" "$WORK/$1.out" || { fail "$1: no line matching '$2' in:"; sed 's/^/    /' "$WORK/$1.out" >&2; }
}
no_output() {  # no_output NAME REGEX: no line of NAME's output matches
  ! grep -qE "$2" "$WORK/$1.out" || { fail "$1: a line matches '$2' in:"; sed 's/^/    /' "$WORK/$1.out" >&2; }
}

cat >"$WORK/allow.txt" <<'ALLOW'
# comment lines and blank lines are ignored

^Bench\.Allowed$ # a benchmark: runs only under its own variable
FleetE2e/FleetUploadBench\. # the fleet benchmark, same
ALLOW

# 1. A pass, a fail, an allowed skip (GTEST_SKIP through ctest's skip regex)
# and a skip not in the allow-list.
SKIP_OUT='Running main()\n[ RUN      ] A.Skip\n/src/a_test.cc:4: Skipped\nneeds root to act as another user\n\n[  SKIPPED ] A.Skip (0 ms)\n[  SKIPPED ] 1 test, listed below:'
junit "$WORK/basic.xml" "A.Pass:run" "A.Fail:fail" \
  "Bench.Allowed:notrun:SKIP_REGULAR_EXPRESSION_MATCHED:/src/b.cc:9: Skipped\nbench/x.sh runs it\n" \
  "A.Skip:notrun:SKIP_REGULAR_EXPRESSION_MATCHED:$SKIP_OUT"
printf 'ctest\tunit\t8\t%s\n' "$WORK/basic.xml" >"$WORK/basic.tsv"
summarize basic "1 passed, 1 failed, 2 skipped" 1 -- --allowlist "$WORK/allow.txt" "$WORK/basic.tsv"
expect_output basic '^  SKIPPED: A\.Skip: needs root to act as another user$'
expect_output basic '^  SKIPPED: Bench\.Allowed: bench/x\.sh runs it \[allow-listed: '
expect_output basic '^  FAILED: A\.Fail$'
# A failed script says why in its output only (ctest's message is empty):
# its last "FAIL:" line is the detail, not the log lines after it.
junit "$WORK/why.xml" "S.Fail:fail::svc: booting\nsvc: FAIL: no panic capture listed\nsvc: container journal:\n  hvtraced[1]: ok" \
  "G.Fail:fail::[ RUN      ] G.Fail\n/src/g_test.cc:12: Failure\nExpected equality of these values\n[  FAILED  ] G.Fail"
printf 'ctest\tservice\t8\t%s\n' "$WORK/why.xml" >"$WORK/why.tsv"
summarize why "0 passed, 2 failed, 0 skipped" 1 -- --allowlist "$WORK/allow.txt" "$WORK/why.tsv"
expect_output why '^  FAILED: S\.Fail: svc: FAIL: no panic capture listed$'
expect_output why '^  FAILED: G\.Fail: /src/g_test\.cc:12: Failure Expected equality of these values$'
summarize basic-ci "1 passed, 2 failed, 1 skipped" 1 CI=true -- --allowlist "$WORK/allow.txt" "$WORK/basic.tsv"
expect_output basic-ci '^  FAILED: A\.Skip: skipped on CI and not in the skip allow-list: needs root'
expect_output basic-ci '^  SKIPPED: Bench\.Allowed: '
no_output basic-ci 'SKIPPED: A\.Skip'

# 2. Without a failure: skips alone pass outside CI; on CI only allowed ones.
junit "$WORK/skips.xml" "A.Pass:run" \
  "Bench.Allowed:notrun:SKIP_REGULAR_EXPRESSION_MATCHED" \
  "ServiceTest:notrun:SKIP_RETURN_CODE=77:service_test: skipped: needs root\n"
printf 'ctest\tunit\t0\t%s\n' "$WORK/skips.xml" >"$WORK/skips.tsv"
summarize skips "1 passed, 0 failed, 2 skipped" 0 -- --allowlist "$WORK/allow.txt" "$WORK/skips.tsv"
expect_output skips '^  SKIPPED: ServiceTest: service_test: skipped: needs root$'
summarize skips-ci "1 passed, 1 failed, 1 skipped" 1 CI=true -- --allowlist "$WORK/allow.txt" "$WORK/skips.tsv"
expect_output skips-ci '^  FAILED: ServiceTest: skipped on CI'
junit "$WORK/allowed.xml" "A.Pass:run" "Bench.Allowed:notrun:SKIP_REGULAR_EXPRESSION_MATCHED"
printf 'ctest\tunit\t0\t%s\n' "$WORK/allowed.xml" >"$WORK/allowed.tsv"
summarize allowed-ci "1 passed, 0 failed, 1 skipped" 0 CI=true -- --allowlist "$WORK/allow.txt" "$WORK/allowed.tsv"
summarize ci-one "1 passed, 0 failed, 1 skipped" 0 CI=1 -- --allowlist "$WORK/allow.txt" "$WORK/allowed.tsv"
summarize ci-false "1 passed, 0 failed, 1 skipped" 0 CI=false -- "$WORK/allowed.tsv"
summarize ci-no-list "1 passed, 1 failed, 0 skipped" 1 CI=true -- "$WORK/allowed.tsv"

# 3. What ctest reports as "Not Run" other than a skip fails; disabled is a
# skip; a run that failed with no failed test, or left no report, fails.
junit "$WORK/notrun.xml" "A.Pass:run" "Gone:notrun:Unable to find executable" "A.Off:disabled"
printf 'ctest\tunit\t8\t%s\n' "$WORK/notrun.xml" >"$WORK/notrun.tsv"
summarize notrun "1 passed, 1 failed, 1 skipped" 1 -- "$WORK/notrun.tsv"
expect_output notrun '^  FAILED: Gone: not run: Unable to find executable$'
junit "$WORK/quiet.xml" "A.Pass:run"
printf 'ctest\tunit\t8\t%s\nctest\te2e\t8\t%s\n' "$WORK/quiet.xml" "$WORK/none.xml" >"$WORK/quiet.tsv"
summarize quiet "1 passed, 2 failed, 0 skipped" 1 -- "$WORK/quiet.tsv"
expect_output quiet '^  FAILED: ctest -L unit: ctest exited 8 with no failed test'
expect_output quiet '^  FAILED: ctest -L e2e: exit 8, no JUnit report'

# 4. A one-process gtest binary (FleetE2e): its tests count, not the binary.
mkdir -p "$WORK/gtest"
cat >"$WORK/gtest/FleetE2e.xml" <<'GTEST'
<?xml version="1.0" encoding="UTF-8"?>
<testsuites tests="4" failures="1" disabled="0" errors="0" time="60" name="AllTests">
  <testsuite name="FleetS3Client" tests="2" failures="1" skipped="0">
    <testcase name="PutGet" status="run" result="completed" time="1" classname="FleetS3Client" />
    <testcase name="Errors" status="run" result="completed" time="1" classname="FleetS3Client">
      <failure message="/src/fleet.cc:150&#x0A;Expected equality" type=""><![CDATA[/src/fleet.cc:150
Expected equality]]></failure>
    </testcase>
  </testsuite>
  <testsuite name="FleetUploadBench" tests="1" failures="0" skipped="1">
    <testcase name="RealCaptures" status="run" result="skipped" time="0" classname="FleetUploadBench">
      <skipped message="/src/bench.cc:76&#x0A;bench/upload.sh runs it"><![CDATA[/src/bench.cc:76
bench/upload.sh runs it]]></skipped>
    </testcase>
  </testsuite>
  <testsuite name="FleetUploadE2e" tests="1" failures="0" skipped="1">
    <testcase name="Panic" status="run" result="skipped" time="0" classname="FleetUploadE2e">
      <skipped message="/src/upload.cc:144&#x0A;ceph-mon is not installed"><![CDATA[x]]></skipped>
    </testcase>
  </testsuite>
</testsuites>
GTEST
junit "$WORK/e2e.xml" "FleetE2e:fail" "VmE2e.Boot:run"
printf 'ctest\te2e\t8\t%s\n' "$WORK/e2e.xml" >"$WORK/fleet.tsv"
summarize fleet "2 passed, 1 failed, 2 skipped" 1 -- --gtest-dir "$WORK/gtest" --allowlist "$WORK/allow.txt" "$WORK/fleet.tsv"
expect_output fleet '^  FAILED: FleetE2e/FleetS3Client\.Errors: /src/fleet\.cc:150: Expected equality$'
expect_output fleet '^  SKIPPED: FleetE2e/FleetUploadE2e\.Panic: ceph-mon is not installed$'
no_output fleet 'FAILED: FleetE2e( |:|$)'
summarize fleet-ci "2 passed, 2 failed, 1 skipped" 1 CI=true -- --gtest-dir "$WORK/gtest" --allowlist "$WORK/allow.txt" "$WORK/fleet.tsv"
expect_output fleet-ci '^  SKIPPED: FleetE2e/FleetUploadBench\.RealCaptures: '
# The process failed although none of its tests did (a crash at exit).
sed -i -e '/<failure/,/<\/failure>/d' "$WORK/gtest/FleetE2e.xml"
summarize fleet-exit "3 passed, 1 failed, 2 skipped" 1 -- --gtest-dir "$WORK/gtest" "$WORK/fleet.tsv"
expect_output fleet-exit '^  FAILED: FleetE2e \(process\)'
# A report that lists no test (all filtered out) is a failure, not nothing.
printf '<?xml version="1.0"?>\n<testsuites tests="0" name="AllTests"></testsuites>\n' >"$WORK/gtest/FleetE2e.xml"
summarize fleet-empty "1 passed, 1 failed, 0 skipped" 1 -- --gtest-dir "$WORK/gtest" "$WORK/fleet.tsv"
expect_output fleet-empty '^  FAILED: FleetE2e: its gtest report .* lists no test$'
# No report (killed at its timeout): the binary is one failed test.
rm "$WORK/gtest/FleetE2e.xml"
summarize fleet-killed "1 passed, 1 failed, 0 skipped" 1 -- --gtest-dir "$WORK/gtest" "$WORK/fleet.tsv"
expect_output fleet-killed '^  FAILED: FleetE2e$'

# 4b. A gtest binary run on its own (the sanitizer build's hostile-input
# tests): its tests count as sanitizers/Suite.Test; an exit with no failed
# test (a leak report at exit) and a missing report each fail.
cat >"$WORK/san.xml" <<'GTEST'
<?xml version="1.0" encoding="UTF-8"?>
<testsuites tests="2" name="AllTests">
  <testsuite name="PageCodec" tests="2">
    <testcase name="Torn" status="run" result="completed" classname="PageCodec" />
    <testcase name="Huge" status="run" result="completed" classname="PageCodec" />
  </testsuite>
</testsuites>
GTEST
printf 'gtest\tsanitizers\t0\t%s\n' "$WORK/san.xml" >"$WORK/san.tsv"
summarize san "2 passed, 0 failed, 0 skipped" 0 -- "$WORK/san.tsv"
printf 'gtest\tsanitizers\t1\t%s\ngtest\tother\t1\t%s\n' "$WORK/san.xml" "$WORK/none.xml" >"$WORK/san-exit.tsv"
summarize san-exit "2 passed, 2 failed, 0 skipped" 1 -- "$WORK/san-exit.tsv"
expect_output san-exit '^  FAILED: sanitizers \(process\): exit 1 outside its tests$'
expect_output san-exit '^  FAILED: other: exit 1, no gtest report '

# 5. tests/run.sh's own lines (record, record_skip), the time line, and bytes
# a test printed that are not XML.
junit "$WORK/bytes.xml" "A.Pass:run:::console \x01\x1b[0m \xff"
{
  printf 'pass\tclang-format\n'
  printf 'fail\tpackages build\texit 2\n'
  printf 'skip\tDebian disk image\toffline: no network\n'
  printf 'ctest\tunit\t0\t%s\n' "$WORK/bytes.xml"
} >"$WORK/steps.tsv"
summarize steps "2 passed, 1 failed, 1 skipped" 1 -- --elapsed 42 "$WORK/steps.tsv"
[ "$(tail -n 2 "$WORK/steps.out" | head -n 1)" = "total time: 42 s" ] || fail "steps: no 'total time: 42 s' before the last line"
expect_output steps '^  FAILED: packages build: exit 2$'
summarize steps-ci "2 passed, 2 failed, 0 skipped" 1 CI=true -- --allowlist "$WORK/allow.txt" "$WORK/steps.tsv"
expect_output steps-ci '^  FAILED: Debian disk image: skipped on CI'

# 6. A malformed allow-list line fails the run; so does a bad regex.
printf 'A.Skip\n^(x # unbalanced\n' >"$WORK/bad-allow.txt"
summarize bad-allow "1 passed, 3 failed, 2 skipped" 1 -- --allowlist "$WORK/bad-allow.txt" "$WORK/basic.tsv"
expect_output bad-allow 'FAILED: skip allow-list: .*bad-allow\.txt:1: not `NAME-OR-REGEX # reason`'
expect_output bad-allow 'FAILED: skip allow-list: .*bad-allow\.txt:2: bad regex'

# 7. The project's allow-list parses, allows the benchmarks and nothing that
# needs a machine CI has (QEMU, Ceph, root).
junit "$WORK/real.xml" "StreamCostBench.DaemonCpuPerStream:notrun:SKIP_REGULAR_EXPRESSION_MATCHED" \
  "VmE2eTest.Guest61QmpAndPanic:notrun:SKIP_REGULAR_EXPRESSION_MATCHED"
cat >"$WORK/gtest/FleetE2e.xml" <<'GTEST'
<?xml version="1.0" encoding="UTF-8"?>
<testsuites tests="2" name="AllTests">
  <testsuite name="FleetUploadBench" tests="1">
    <testcase name="RealCapturesAgainstCurlAndMemcpy" status="run" result="skipped" classname="FleetUploadBench" />
  </testsuite>
  <testsuite name="FleetUploadE2e" tests="1">
    <testcase name="PanicWhileTheStoreIsDownIsUploadedAfterRestartAndFetched" status="run" result="skipped" classname="FleetUploadE2e" />
  </testsuite>
</testsuites>
GTEST
junit "$WORK/real-e2e.xml" "FleetE2e:run"
printf 'ctest\te2e\t0\t%s\nctest\te2e\t0\t%s\n' "$WORK/real.xml" "$WORK/real-e2e.xml" >"$WORK/real.tsv"
summarize real-ci "0 passed, 2 failed, 2 skipped" 1 CI=true -- --allowlist "$ROOT/tests/skip-allowlist.txt" \
  --gtest-dir "$WORK/gtest" "$WORK/real.tsv"
expect_output real-ci '^  FAILED: VmE2eTest\.Guest61QmpAndPanic: skipped on CI'
expect_output real-ci '^  FAILED: FleetE2e/FleetUploadE2e\.PanicWhileTheStoreIsDownIsUploadedAfterRestartAndFetched: skipped on CI'
expect_output real-ci '^  SKIPPED: StreamCostBench\.DaemonCpuPerStream: '
expect_output real-ci '^  SKIPPED: FleetE2e/FleetUploadBench\.RealCapturesAgainstCurlAndMemcpy: '

if [ "$failures" -ne 0 ]; then
  echo "run_summary_test: $failures check(s) failed"
  exit 1
fi
echo "run_summary_test: all checks passed"
