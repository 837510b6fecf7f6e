"""CI's skip policy (tests/check_skips.py, issue 27 item 6): a run with a skip that
tests/allowed_skips.txt does not list fails, naming the test and its reason; the same run passes
once the skip is allowed; an xfail is not a skip; CI's own list has a reason on every line."""
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
CHECK = os.path.join(HERE, "check_skips.py")

SAMPLE = '''
import pytest

def test_runs():
    pass

def test_skips():
    pytest.skip("the sample's own reason")

@pytest.mark.xfail(reason="an expected failure", raises=AssertionError, strict=True)
def test_fails():
    assert False
'''

MODULE_SKIP = '''
import pytest
pytest.importorskip("a_module_nobody_installed_zz")

def test_never():
    pass
'''


def _run(tmp_path, files, allowed):
    """pytest on `files` in a subprocess (junit report, as .ci/run writes it), then the checker."""
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    (tmp_path / "allowed.txt").write_text(allowed)
    report = tmp_path / "report.xml"
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}
    env["PYTEST_ADDOPTS"] = f"--junitxml={report}"
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *files],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]   # skips pass pytest
    return subprocess.run([sys.executable, CHECK, str(report), str(tmp_path / "allowed.txt")],
                          capture_output=True, text=True, timeout=60)


def test_an_unlisted_skip_fails_the_run_with_its_reason(tmp_path):
    check = _run(tmp_path, {"test_sample.py": SAMPLE}, "# nothing allowed\n")
    assert check.returncode == 1, check.stdout + check.stderr
    assert "test_sample.test_skips" in check.stderr and "the sample's own reason" in check.stderr
    assert "test_fails" not in check.stderr          # an xfail is not a skip


def test_a_module_skipped_at_collection_fails_the_run(tmp_path):
    check = _run(tmp_path, {"test_sample.py": SAMPLE, "test_gone.py": MODULE_SKIP},
                 "test_sample.test_skips  # allowed here\n")
    assert check.returncode == 1, check.stdout + check.stderr
    assert "test_gone" in check.stderr and "a_module_nobody_installed_zz" in check.stderr
    assert "test_sample.test_skips" not in check.stderr


def test_an_allowed_skip_passes(tmp_path):
    check = _run(tmp_path, {"test_sample.py": SAMPLE}, "test_sample.test_sk*  # the sample may skip\n")
    assert check.returncode == 0, check.stdout + check.stderr
    assert "1 skipped, all allowed" in check.stdout


def test_an_allowance_without_a_reason_is_refused(tmp_path):
    sys.path.insert(0, HERE)
    try:
        import check_skips
    finally:
        sys.path.remove(HERE)
    path = tmp_path / "allowed.txt"
    path.write_text("tests.test_x.test_y\n")
    with pytest.raises(ValueError, match="reason"):
        check_skips.read_allowed(str(path))
    assert check_skips.main([str(tmp_path / "absent.xml"), str(path)]) == 2


def test_ci_allows_no_skip():
    """CI's machine can run every test: its allow-list is empty (each line it ever gets must
    carry a reason, which read_allowed enforces)."""
    sys.path.insert(0, HERE)
    try:
        import check_skips
    finally:
        sys.path.remove(HERE)
    assert check_skips.read_allowed(check_skips.ALLOWED) == []
