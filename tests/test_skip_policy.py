"""CI's run policy. The skip policy (tests/check_skips.py): a run with a skip that
tests/allowed_skips.txt does not list fails, naming the test and its reason; the same run passes
once the skip is allowed; an allowance allows exactly what it names; a report that shows no test
run fails; an xfail is not a skip; CI's own list has a reason on every line. The time limit
(pytest-timeout, pyproject.toml): every test has one, and a test that hangs fails the run."""
import os
import shutil
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


def _check_skips():
    sys.path.insert(0, HERE)
    try:
        import check_skips
    finally:
        sys.path.remove(HERE)
    return check_skips


def test_an_allowance_without_a_reason_is_refused(tmp_path):
    check_skips = _check_skips()
    path = tmp_path / "allowed.txt"
    path.write_text("tests.test_x.test_y\n")
    with pytest.raises(ValueError, match="reason"):
        check_skips.read_allowed(str(path))
    assert check_skips.main([str(tmp_path / "absent.xml"), str(path)]) == 2


def test_ci_allows_no_skip():
    """CI's machine can run every test: its allow-list is empty (each line it ever gets must
    carry a reason, which read_allowed enforces)."""
    check_skips = _check_skips()
    assert check_skips.read_allowed(check_skips.ALLOWED) == []


@pytest.mark.parametrize("pattern, allowed, refused", [
    # a name allows that test alone: no longer name, no parameter of it
    ("tests.test_a.test_x", ["tests.test_a.test_x"],
     ["tests.test_a.test_x2", "tests.test_a.test_x[cpu]", "tests.test_a.test_x.y"]),
    # brackets are the parameters' own, not a character class
    ("tests.test_a.test_x[cpu]", ["tests.test_a.test_x[cpu]"],
     ["tests.test_a.test_xc", "tests.test_a.test_x[cpu-1]", "tests.test_a.test_x"]),
    # `*` says where more may follow, and only there
    ("tests.test_a.test_x[*]", ["tests.test_a.test_x[cpu]", "tests.test_a.test_x[a-b]"],
     ["tests.test_a.test_x", "tests.test_a.test_x2", "tests.test_a.test_x2[cpu]"]),
    ("tests.test_a.test_x*", ["tests.test_a.test_x", "tests.test_a.test_x2[cpu]"],
     ["tests.test_a.test_y", "tests.test_b.test_x"]),
    # a module skipped at collection: its own name, not its neighbours
    ("tests.test_a", ["tests.test_a"], ["tests.test_ab", "tests.test_a.test_x"]),
    # a pytest node id names the same tests as the dotted name
    ("tests/test_a.py::test_x", ["tests.test_a.test_x"],
     ["tests.test_a.test_x2", "tests.test_a.test_x[cpu]"]),
    ("tests/test_a.py::TestCase::test_x[a::b/c]", ["tests.test_a.TestCase.test_x[a::b/c]"],
     ["tests.test_a.TestCase.test_x[a.b.c]", "tests.test_a.TestCase.test_x"]),
])
def test_an_allowance_allows_exactly_what_it_names(pattern, allowed, refused):
    check_skips = _check_skips()
    for name in allowed:
        assert check_skips.allows(pattern, name), (pattern, name)
    for name in refused:
        assert not check_skips.allows(pattern, name), (pattern, name)


SIBLINGS = SAMPLE + '''
def test_skips2():
    pytest.skip("the sibling's reason")

@pytest.mark.parametrize("p", ["cpu"])
def test_skips_param(p):
    pytest.skip("the parameter's reason")
'''


def test_an_allowance_for_one_test_fails_a_run_that_skips_its_sibling(tmp_path):
    """End to end, through pytest's own report: the allowance names test_skips; the run also
    skips test_skips2 and a parameter of a test whose name starts the same."""
    check = _run(tmp_path, {"test_sample.py": SIBLINGS}, "test_sample.test_skips  # this one only\n")
    assert check.returncode == 1, check.stdout + check.stderr
    lines = check.stderr.splitlines()
    assert any("test_sample.test_skips2:" in l and "the sibling's reason" in l for l in lines)
    assert any("test_sample.test_skips_param[cpu]:" in l and "the parameter's reason" in l
               for l in lines), check.stderr
    assert "test_sample.test_skips:" not in check.stderr


NO_TESTS = ('<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" '
            'errors="0" failures="0" skipped="0" tests="0" time="0.1"></testsuite></testsuites>')


@pytest.mark.parametrize("content, why", [
    (NO_TESTS, "holds no test"),
    ("", "cannot be read as JUnit XML"),
    ("<testsuites><testsuite", "cannot be read as JUnit XML"),
    (None, "no test report"),
])
def test_a_report_that_shows_no_test_run_fails(tmp_path, capsys, content, why):
    check_skips = _check_skips()
    report = tmp_path / "report.xml"
    if content is not None:
        report.write_text(content)
    allowed = tmp_path / "allowed.txt"
    allowed.write_text("# nothing allowed\n")
    assert check_skips.main([str(report), str(allowed)]) == 2
    message = capsys.readouterr().err
    assert why in message and str(report) in message


def test_a_run_that_collects_nothing_fails_the_policy(tmp_path):
    (tmp_path / "test_empty.py").write_text("# no test here\n")
    (tmp_path / "allowed.txt").write_text("# nothing allowed\n")
    report = tmp_path / "report.xml"
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          f"--junitxml={report}", "test_empty.py"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 5, run.stdout[-2000:] + run.stderr[-2000:]     # no tests collected
    check = subprocess.run([sys.executable, CHECK, str(report), str(tmp_path / "allowed.txt")],
                           capture_output=True, text=True, timeout=60)
    assert check.returncode == 2, check.stdout + check.stderr
    assert "holds no test" in check.stderr


def test_every_test_has_a_time_limit(request):
    """pyproject.toml: pytest-timeout is required, with a limit in minutes that ends the process
    wherever a test is stuck (the reasons are beside the setting)."""
    config = request.config
    assert config.pluginmanager.hasplugin("timeout")
    assert 0 < float(config.getini("timeout")) <= 900
    assert config.getini("timeout_method") == "thread"
    assert any(p.startswith("pytest-timeout") for p in config.getini("required_plugins"))


HANGS = """
import threading

def test_hangs():
    threading.Event().wait()        # nothing ever sets it
"""


@pytest.mark.parametrize("processes", [[], ["-n0"]], ids=["test processes", "one process"])
def test_a_test_that_hangs_fails_the_run_at_its_limit(tmp_path, processes):
    """The project's settings (pyproject.toml and tests/conftest.py), with the limit cut to 2 s:
    the stuck test fails the run once, named, with the stack it is stuck in, long before this
    test's own bound; in pytest-xdist's test processes (the default) as in one process (-n0).
    Under xdist, pytest-timeout's report went to a terminal nobody sees, and with --dist
    loadfile the crashed test's file went back in the queue: the test hung nine times."""
    (tmp_path / "test_hangs.py").write_text(HANGS)
    shutil.copy(os.path.join(HERE, "conftest.py"), tmp_path / "conftest.py")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTEST_ADDOPTS", "PYTEST_TIMEOUT")}
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          "-c", os.path.join(HERE, "..", "pyproject.toml"), *processes,
                          "--rootdir", str(tmp_path), "-o", "timeout=2", "test_hangs.py"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    output = run.stdout + run.stderr
    assert run.returncode != 0, output[-3000:]
    assert "Timeout" in output and "test_hangs" in output, output[-3000:]
    assert "threading.Event().wait()" in output or ', line 5 in test_hangs' in output, output[-3000:]
    assert output.count("FAILED test_hangs.py::test_hangs") <= 1, output[-3000:]
