"""CI's skip policy (issue 27, item 6): a test run on CI's machine (../shared/models beside the
clone, the test and ray extras installed, TFLITE_TAICHI_EXPECT_GPU=none) must skip nothing but
what tests/allowed_skips.txt lists, each with its reason. A skip nobody reads hides a test that
stopped running (a missing model folder skipped 37 tests, a missing ai_edge_litert 12 modules).

    python tests/check_skips.py REPORT.xml [ALLOWED.txt]

REPORT.xml is the run's JUnit report (.ci/run runs pytest with PYTEST_ADDOPTS=--junitxml=...: an
environment variable, like TFLITE_TAICHI_EXPECT_GPU, so that the README's test command stays the
one CI runs). Every skipped test (a module skipped at collection too; an xfail is not a skip)
must match an allow-list line, `PATTERN  # reason`, PATTERN an fnmatch pattern on the test's
dotted name (tests.test_bench.test_name[param], tests.test_module for a whole module). Exit 1
listing each unexpected skip with its reason; 2 when the report is missing or holds no test.
"""
from __future__ import annotations

import fnmatch
import os
import sys
import xml.etree.ElementTree as ET

ALLOWED = os.path.join(os.path.dirname(os.path.abspath(__file__)), "allowed_skips.txt")


def read_allowed(path: str) -> list[tuple[str, str]]:
    """(pattern, reason) per line; a line without a reason is an error, not an allowance."""
    entries = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            pattern, _, reason = line.partition("#")
            if not pattern.strip() or not reason.strip():
                raise ValueError(f"{path}:{number}: an allowed skip needs `PATTERN  # reason`: {line!r}")
            entries.append((pattern.strip(), reason.strip()))
    return entries


def skipped_tests(report: str) -> tuple[int, list[tuple[str, str]]]:
    """(number of test cases, [(dotted name, reason)] of those skipped, xfails left out)."""
    root = ET.parse(report).getroot()
    cases = list(root.iter("testcase"))
    skips = []
    for case in cases:
        for skipped in case.findall("skipped"):
            if skipped.get("type") == "pytest.xfail":
                continue
            classname, name = case.get("classname", ""), case.get("name", "")
            dotted = f"{classname}.{name}" if classname else name
            reason = (skipped.text or skipped.get("message") or "").strip()
            skips.append((dotted, reason))
    return len(cases), skips


def main(argv: list[str]) -> int:
    if not 1 <= len(argv) <= 2:
        print(__doc__, file=sys.stderr)
        return 2
    report, allowed_path = argv[0], argv[1] if len(argv) > 1 else ALLOWED
    if not os.path.isfile(report):
        print(f"skip policy: no test report at {report}", file=sys.stderr)
        return 2
    allowed = read_allowed(allowed_path)
    count, skips = skipped_tests(report)
    if count == 0:
        print(f"skip policy: the report {report} holds no test", file=sys.stderr)
        return 2
    unexpected = [(name, reason) for name, reason in skips
                  if not any(fnmatch.fnmatchcase(name, pattern) for pattern, _ in allowed)]
    if unexpected:
        print(f"skip policy: {len(unexpected)} test(s) skipped that must run here "
              f"(allowed: {allowed_path}):", file=sys.stderr)
        for name, reason in unexpected:
            print(f"  SKIPPED {name}: {reason}", file=sys.stderr)
        return 1
    print(f"skip policy: {count} tests, {len(skips)} skipped, all allowed ({allowed_path})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
