"""CI's skip policy: a test run on CI's machine (../shared/models beside the clone, the test and
ray extras installed, TFLITE_TAICHI_EXPECT_GPU=none) must skip nothing but what
tests/allowed_skips.txt lists, each with its reason. A skip nobody reads hides a test that
stopped running (a missing model folder skipped 37 tests, a missing ai_edge_litert 12 modules).

    python tests/check_skips.py REPORT.xml [ALLOWED.txt]

REPORT.xml is the run's JUnit report (.ci/run runs pytest with PYTEST_ADDOPTS=--junitxml=...: an
environment variable, like TFLITE_TAICHI_EXPECT_GPU, so that the README's test command stays the
one CI runs). Every skipped test (a module skipped at collection too; an xfail is not a skip)
must match an allow-list line, `PATTERN  # reason`.

PATTERN names tests exactly: the test's dotted name as the report gives it
(tests.test_a.test_x[param], tests.test_a.TestCase.test_x, tests.test_a for a module skipped at
collection) or its pytest node id (tests/test_a.py::test_x[param]). Every character stands for
itself, brackets included, except `*`, which stands for any run of characters: so
`tests.test_a.test_x` allows that test alone, not test_x2 nor test_x[cpu]; `tests.test_a.test_x[*]`
allows each of its parameters; `tests.test_a.*` each test of the module. An allowance is as wide
as it says, never wider.

Exit 1 listing each unexpected skip with its reason; 2 when the report is missing, unreadable or
holds no test (a run that ran nothing has not shown that nothing skipped).
"""
from __future__ import annotations

import os
import re
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


def dotted_name(pattern: str) -> str:
    """A pattern written as a pytest node id (tests/test_a.py::test_x[p]) as the report's dotted
    name (tests.test_a.test_x[p]); the parameters, in brackets, are left as written."""
    head, bracket, params = pattern.partition("[")
    if "::" not in head:
        return pattern
    path, _, rest = head.partition("::")
    if path.endswith(".py"):
        path = path[:-3]
    return ".".join([path.replace("/", "."), *rest.split("::")]) + bracket + params


def pattern_regex(pattern: str) -> re.Pattern:
    """The whole-name match of an allowance: `*` any run of characters, everything else itself."""
    parts = (re.escape(part) for part in dotted_name(pattern).split("*"))
    return re.compile(".*".join(parts), re.DOTALL)


def allows(pattern: str, name: str) -> bool:
    return pattern_regex(pattern).fullmatch(name) is not None


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
    try:
        count, skips = skipped_tests(report)
    except (OSError, ET.ParseError) as e:
        print(f"skip policy: the test report {report} cannot be read as JUnit XML ({e})",
              file=sys.stderr)
        return 2
    if count == 0:
        print(f"skip policy: the report {report} holds no test", file=sys.stderr)
        return 2
    unexpected = [(name, reason) for name, reason in skips
                  if not any(allows(pattern, name) for pattern, _ in allowed)]
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
