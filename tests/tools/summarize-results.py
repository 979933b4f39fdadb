#!/usr/bin/env python3
"""Counts the results of one tests/run.sh run and prints its summary.

    summarize-results.py [--allowlist FILE] [--gtest-dir DIR] [--elapsed SECONDS] RESULTS

RESULTS is the list tests/run.sh writes as it goes, one line per step,
tab-separated:

    pass   NAME                      a step that is one test (clang-format, a fuzzer, ...)
    fail   NAME   [DETAIL]
    skip   NAME   REASON
    ctest  LABEL  EXIT  JUNIT        a `ctest -L LABEL --output-junit JUNIT` run
    gtest  NAME   EXIT  REPORT       a gtest binary run on its own (the sanitizer
                                     build's), with --gtest_output=xml:REPORT

Every ctest test in a JUnit file counts on its own: passed (status run),
failed (fail, or "Not Run" for any reason but a skip: ctest counts a missing
executable or a failed fixture as failed too), skipped (SKIP_RETURN_CODE or
SKIP_REGULAR_EXPRESSION matched, i.e. GTEST_SKIP; or disabled). A ctest test
with a GoogleTest XML report DIR/<ctest name>.xml (--gtest-dir) ran a whole
gtest binary in one process (FleetE2e: one Ceph cluster for all its tests):
it counts as the gtest tests inside it, named "<ctest name>/Suite.Test",
plus one failure of its own when the process failed with no test failing
(a crash in the environment's tear-down, a sanitizer report at exit); a
`gtest` line counts the same way. A ctest run that exits non-zero with no failed test in its JUnit (no tests
found, no JUnit written, ctest's own error) is one failure.

A skip is not a pass. With CI=true in the environment, a skip counts as a
failure unless its name is in the allow-list (tests/skip-allowlist.txt: one
test a line, its name or a ctest-style regex searched in the name, then
` # reason`). Outside CI skips count as skipped, each reported by name and
reason. The last line printed is `N passed, N failed, N skipped`, the line
before it the total time when --elapsed is given. Exit status 0 when
nothing failed, 1 otherwise, 2 on bad usage.
"""

import argparse
import os
import re
import sys
import xml.etree.ElementTree as ET

# ctest's <skipped message=...> for tests that really skipped; any other
# "notrun" (executable not found, fixture failed, ...) ctest counts as failed.
CTEST_SKIP_MESSAGES = ("SKIP_REGULAR_EXPRESSION_MATCHED", "SKIP_RETURN_CODE")


def on_ci():
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


class Results:
    def __init__(self):
        self.passed = []
        self.failed = []  # (name, detail)
        self.skipped = []  # (name, reason)

    def add(self, status, name, detail=""):
        if status == "pass":
            self.passed.append(name)
        elif status == "fail":
            self.failed.append((name, detail))
        elif status == "skip":
            self.skipped.append((name, detail))
        else:
            raise ValueError("unknown status " + status)


def parse_xml(path):
    """ElementTree root of PATH; a test's output can hold bytes that are not
    XML (ctest copies it in), so retry with those replaced."""
    with open(path, "rb") as f:
        data = f.read()
    try:
        return ET.fromstring(data)
    except ET.ParseError:
        text = data.decode("utf-8", errors="replace")
        text = re.sub(r"[\x00-\x08\x0b\x0c\x0e-\x1f]", "?", text)
        return ET.fromstring(text.encode("utf-8"))


def first_line(text, limit=200):
    text = (text or "").strip()
    line = text.splitlines()[0] if text else ""
    return line if len(line) <= limit else line[: limit - 3] + "..."


def failure_from_output(output):
    """Why a test failed, from its output when ctest's report says nothing
    (a script's failure message is empty): the last "FAIL:" line (the
    service tests' fail()), else GoogleTest's first "file:line: Failure" with
    the line after it, else the last line."""
    lines = [line.strip() for line in (output or "").splitlines() if line.strip()]
    for line in reversed(lines):
        if "FAIL:" in line:
            return first_line(line)
    for i, line in enumerate(lines):
        if re.search(r":\d+: Failure$", line):
            return first_line(" ".join(lines[i : i + 2]))
    return first_line(lines[-1]) if lines else ""


def skip_reason_from_output(output, fallback):
    """The reason a GTEST_SKIP() gave ("file:line: Skipped" then the message),
    else a line of a script's output that says it skipped, else FALLBACK."""
    lines = (output or "").splitlines()
    for i, line in enumerate(lines):
        if re.search(r":\d+: Skipped$", line):
            message = []
            for nxt in lines[i + 1 :]:
                if nxt.startswith("[  SKIPPED ]") or not nxt.strip():
                    break
                message.append(nxt.strip())
            if message:
                return first_line(" ".join(message))
    for line in lines:
        if re.search(r"\bskipp(ed|ing)\b", line, re.IGNORECASE) and "[  SKIPPED ]" not in line:
            return first_line(line)
    return fallback


def add_gtest_report(results, prefix, path):
    """The tests of one gtest XML report; returns (how many, how many failed)."""
    failed = 0
    cases = list(parse_xml(path).iter("testcase"))
    for case in cases:
        name = "%s/%s.%s" % (prefix, case.get("classname", "?"), case.get("name", "?"))
        failure = case.find("failure")
        if failure is None:
            failure = case.find("error")
        skipped = case.find("skipped")
        if failure is not None:
            # "file:line\nwhat failed": both on one line.
            results.add("fail", name, first_line(failure.get("message", "").replace("\n", ": ", 1)))
            failed += 1
        elif case.get("result") == "suppressed" or case.get("status") == "notrun":
            results.add("skip", name, "disabled")
        elif skipped is not None or case.get("result") == "skipped":
            message = skipped.get("message", "") if skipped is not None else ""
            # "file:line\nmessage": the message is what the test said.
            parts = message.split("\n", 1)
            results.add("skip", name, first_line(parts[-1]) or "skipped")
        else:
            results.add("pass", name)
    return len(cases), failed


def add_gtest_run(results, name, exit_status, report):
    """A gtest binary run directly: its tests count, each as NAME/Suite.Test;
    a failed process with no failed test (a sanitizer report at exit), no
    report or an empty one is one failure of NAME. Returns how many failed."""
    if not os.path.isfile(report):
        results.add("fail", name, "exit %d, no gtest report %s" % (exit_status, report))
        return 1
    try:
        inner, failed = add_gtest_report(results, name, report)
    except (ET.ParseError, OSError) as e:
        results.add("fail", name, "unreadable gtest report %s: %s" % (report, e))
        return 1
    if inner == 0:
        results.add("fail", name, "its gtest report %s lists no test" % report)
        return failed + 1
    if exit_status != 0 and failed == 0:
        results.add("fail", name + " (process)", "exit %d outside its tests" % exit_status)
        return 1
    return failed


def add_ctest_run(results, label, exit_status, junit, gtest_dir):
    what = "ctest -L %s" % label
    if not os.path.isfile(junit):
        results.add("fail", what, "exit %d, no JUnit report %s" % (exit_status, junit))
        return
    try:
        root = parse_xml(junit)
    except (ET.ParseError, OSError) as e:
        results.add("fail", what, "exit %d, unreadable JUnit report %s: %s" % (exit_status, junit, e))
        return
    failed = 0
    for case in root.iter("testcase"):
        name = case.get("name", "?")
        status = case.get("status", "")
        output = case.findtext("system-out") or ""
        report = os.path.join(gtest_dir, name + ".xml") if gtest_dir else ""
        if report and os.path.isfile(report) and status in ("run", "fail"):
            failed += add_gtest_run(results, name, 1 if status == "fail" else 0, report)
            continue
        if status == "run":
            results.add("pass", name)
        elif status == "disabled":
            results.add("skip", name, "disabled")
        elif status == "notrun":
            skipped = case.find("skipped")
            message = skipped.get("message", "") if skipped is not None else ""
            if message.startswith(CTEST_SKIP_MESSAGES):
                results.add("skip", name, skip_reason_from_output(output, message))
            else:
                results.add("fail", name, "not run: " + (message or "?"))
                failed += 1
        else:
            failure = case.find("failure")
            detail = failure.get("message", "") if failure is not None else ""
            results.add("fail", name, first_line(detail) or failure_from_output(output))
            failed += 1
    if exit_status != 0 and failed == 0:
        results.add("fail", what, "ctest exited %d with no failed test (no tests found?)" % exit_status)


def load_allowlist(path, results):
    """[(pattern, regex, reason)]; a malformed line is a failure of its own."""
    entries = []
    if not path:
        return entries
    if not os.path.isfile(path):
        results.add("fail", "skip allow-list", "%s does not exist" % path)
        return entries
    with open(path, encoding="utf-8") as f:
        for number, raw in enumerate(f, 1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            pattern, sep, reason = line.partition(" # ")
            pattern, reason = pattern.strip(), reason.strip()
            where = "%s:%d" % (path, number)
            if not sep or not reason or not pattern:
                results.add("fail", "skip allow-list", "%s: not `NAME-OR-REGEX # reason`: %s" % (where, line))
                continue
            try:
                entries.append((pattern, re.compile(pattern), reason))
            except re.error as e:
                results.add("fail", "skip allow-list", "%s: bad regex %r: %s" % (where, pattern, e))
    return entries


def allowed(name, entries):
    for pattern, regex, reason in entries:
        if name == pattern or regex.search(name):
            return reason
    return None


def main(argv):
    parser = argparse.ArgumentParser(description="Counts a tests/run.sh run's results.")
    parser.add_argument("results", help="the run's result list (see this script's header)")
    parser.add_argument("--allowlist", help="skips allowed on CI (tests/skip-allowlist.txt)")
    parser.add_argument("--gtest-dir", help="GoogleTest XML reports of one-process ctest tests")
    parser.add_argument("--elapsed", type=int, help="seconds the run took, printed before the summary")
    args = parser.parse_args(argv)

    results = Results()
    try:
        with open(args.results, encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError as e:
        print("summarize-results: %s" % e, file=sys.stderr)
        lines = []
        results.add("fail", "result list", str(e))
    for line in lines:
        if not line.strip():
            continue
        fields = line.split("\t")
        kind = fields[0]
        if kind in ("pass", "fail", "skip") and len(fields) >= 2:
            results.add(kind, fields[1], fields[2] if len(fields) > 2 else "")
        elif kind == "ctest" and len(fields) == 4 and re.fullmatch(r"-?\d+", fields[2]):
            add_ctest_run(results, fields[1], int(fields[2]), fields[3], args.gtest_dir)
        elif kind == "gtest" and len(fields) == 4 and re.fullmatch(r"-?\d+", fields[2]):
            add_gtest_run(results, fields[1], int(fields[2]), fields[3])
        else:
            results.add("fail", "result list", "malformed line: %r" % line)

    entries = load_allowlist(args.allowlist, results)
    ci = on_ci()
    counted_skips = []
    for name, reason in results.skipped:
        allow = allowed(name, entries)
        if ci and allow is None:
            results.failed.append(
                (name, "skipped on CI and not in the skip allow-list: %s" % (reason or "no reason given")))
        else:
            counted_skips.append((name, reason, allow))

    if counted_skips:
        print()
        print("skipped (%s):" % ("allowed on CI by the allow-list" if ci else "not run here; not a pass"))
        for name, reason, allow in counted_skips:
            note = "" if allow is None else " [allow-listed: %s]" % allow
            print("  SKIPPED: %s: %s%s" % (name, reason or "no reason given", note))
    if results.failed:
        print()
        print("failed:")
        for name, detail in results.failed:
            print("  FAILED: %s%s" % (name, ": " + detail if detail else ""))
    print()
    if args.elapsed is not None:
        print("total time: %d s" % args.elapsed)
    print("%d passed, %d failed, %d skipped" % (len(results.passed), len(results.failed), len(counted_skips)))
    return 1 if results.failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
