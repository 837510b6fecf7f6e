import os
import threading

import pytest
from hypothesis import HealthCheck, Phase, settings

from tflite_taichi import switches

# Hypothesis profiles (HYPOTHESIS_PROFILE, or pytest's --hypothesis-profile). Every count is
# relative to the profile: a test without a count runs its max_examples, a test with one states
# its count under "ci" through tflite_taichi.testing.examples(n) (scaled by max_examples / 50)
# or TAICHI_EXAMPLES (examples(20)).
# The real numbers under "ci": 50 examples for the LiteRT/reference property tests; 20
# (TAICHI_EXAMPLES) per Taichi-vs-reference test (each example compiles kernels on 3 backends);
# 5-10 where a test exercises partitioning or re-planning rather than kernels; the quantised
# delegate tests share 20 among a family's ops (3-7 per op); a few fp16/GLES spot checks 2-3.
# So not every test runs 50: "thorough" (500) runs ten times each count.
# "ci" is derandomized (draws seeded from each test: the same every run, no example database),
# so a new draw never turns CI red at landing. New draws are explored by "explore" and
# "thorough" (random draws; failures saved in .hypothesis/ and printed with their reproduce
# blob): "explore" runs TFLITE_TAICHI_EXPLORE_EXAMPLES (default 200) as the CI count of 50, so
# it scales every count as "thorough" does; .ci/run runs it in a short form on a few property
# test files, in its own step (select with HYPOTHESIS_PROFILE=explore or
# --hypothesis-profile=explore).
_COMMON = dict(deadline=None, print_blob=True,
               suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("ci", max_examples=50, derandomize=True, database=None, **_COMMON)
settings.register_profile("thorough", max_examples=500, **_COMMON)
settings.register_profile("explore", derandomize=False,
                          max_examples=switches.value("TFLITE_TAICHI_EXPLORE_EXAMPLES"),
                          **_COMMON)
# "debug": no shrinking, for checking that a test can fail (shrinking a Taichi case recompiles
# kernels at every step).
settings.register_profile("debug", max_examples=50, phases=[Phase.explicit, Phase.reuse, Phase.generate],
                          **_COMMON)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# the kernel cache this run made (not one the user gave): each test process gets its own in it
_RUN_CACHE = "TFLITE_TAICHI_TEST_RUN_CACHE"


def pytest_configure(config):
    """The caches of a test run are its own (temporary folders, removed at the end), set before
    any worker or subprocess starts so that they all inherit them: tests never write the user's
    home. Our kernel cache (a given TFLITE_TAICHI_CACHE_DIR is used as it is), and
    XDG_CACHE_HOME for what Taichi (~/.cache/taichi: its pipeline cache, version check) and Mesa
    (shader caches) would write there, MPLCONFIGDIR for matplotlib's (the benchmark's plots:
    ~/.config/matplotlib otherwise). Under pytest-xdist this runs in the controller first (its
    environment is the test processes') and then in each test process, where the kernel cache
    the run made becomes a folder of the process's own in it: what a test finds cached is
    what earlier tests of its process left, as in a run in one process, whatever the other
    processes ran meanwhile."""
    import tempfile
    config._tflite_taichi_temporary = []
    test_process = os.environ.get("PYTEST_XDIST_WORKER")   # gw0, gw1, ... (None: the controller)
    if test_process and os.environ.get(_RUN_CACHE) == os.environ.get("TFLITE_TAICHI_CACHE_DIR"):
        os.environ["TFLITE_TAICHI_CACHE_DIR"] = tempfile.mkdtemp(prefix=f"{test_process}-",
                                                                 dir=os.environ[_RUN_CACHE])
    for variable, prefix in (("TFLITE_TAICHI_CACHE_DIR", "tflite-taichi-test-cache-"),
                             ("XDG_CACHE_HOME", "tflite-taichi-test-xdg-"),
                             ("MPLCONFIGDIR", "tflite-taichi-test-mpl-")):
        if not os.environ.get(variable) or variable != "TFLITE_TAICHI_CACHE_DIR":
            folder = tempfile.mkdtemp(prefix=prefix)
            os.environ[variable] = folder
            config._tflite_taichi_temporary.append(folder)
            if variable == "TFLITE_TAICHI_CACHE_DIR":
                os.environ[_RUN_CACHE] = folder


@pytest.hookimpl(tryfirst=True, optionalhook=True)     # pytest-timeout's hook
def pytest_timeout_set_timer(item, settings):
    """In a pytest-xdist test process, the timer of a test's time limit (pyproject.toml) is ours:
    pytest-timeout's report of a stuck test (every thread's stack) goes to the process's
    terminal, which xdist does not show, and is lost with the process it ends; this one writes
    it to the process's stderr, which is the run's. Elsewhere pytest-timeout's timer runs."""
    if not os.environ.get("PYTEST_XDIST_WORKER") or settings.method != "thread" or not settings.timeout:
        return None
    timer = threading.Timer(settings.timeout, _report_a_stuck_test_and_exit, (item, settings.timeout))
    timer.daemon = True

    def cancel():
        timer.cancel()
        timer.join()
    item.cancel_timeout = cancel        # what pytest-timeout's pytest_timeout_cancel_timer calls
    timer.start()
    return True


def _report_a_stuck_test_and_exit(item, seconds: float) -> None:
    """The test's name and every thread's stack on stderr, then the process ends (as
    pytest-timeout's thread method does; xdist reports the test as the one that crashed it)."""
    import faulthandler
    try:
        capture = item.config.pluginmanager.getplugin("capturemanager")
        if capture is not None:
            capture.suspend_global_capture(item)     # file descriptor 2: the run's stderr again
        os.write(2, f"\n+++++ Timeout: {item.nodeid} still runs after {seconds:g} s; the stack of "
                    f"every thread +++++\n".encode())
        faulthandler.dump_traceback(file=2, all_threads=True)
    finally:
        os._exit(1)


@pytest.hookimpl(optionalhook=True)      # pytest-xdist's hook
def pytest_xdist_auto_num_workers(config):
    """`-n auto` (pyproject.toml's addopts): a test process per core, at most 4. Each starts a
    Taichi worker per backend (taichi_workers) and its own compile workers, and past 4 the run
    is bounded by its longest files (test_taichi_models.py, a few minutes) anyway."""
    return max(1, min(4, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                      else os.cpu_count() or 1))


def pytest_unconfigure(config):
    import shutil
    for folder in getattr(config, "_tflite_taichi_temporary", []):
        shutil.rmtree(folder, ignore_errors=True)


SHARED_MODELS = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "shared", "models"))


@pytest.fixture(scope="session")     # a path, read once: module-scoped runs of models use it too
def shared_models():
    path = switches.value("TFLITE_TAICHI_MODELS") or SHARED_MODELS
    if not os.path.isdir(path):
        pytest.skip(f"the shared model folder {path} is absent (set TFLITE_TAICHI_MODELS)")
    return path


# Taichi backends under test, each in its own worker process (Taichi is one arch per process).
# CI has cpu, vulkan (Mesa lavapipe) and opengl (llvmpipe); a backend listed here that does not
# start is a failure, not a skip: the delegate must really run on it.
TAICHI_BACKENDS = list(switches.value("TFLITE_TAICHI_TEST_BACKENDS"))


@pytest.fixture(scope="session")
def taichi_workers():
    from tflite_taichi.testing import BackendWorker
    workers = []
    try:
        for backend in TAICHI_BACKENDS:
            workers.append(BackendWorker(backend))
        yield workers
    finally:
        for w in workers:
            w.close()


@pytest.fixture
def vulkan_workers(taichi_workers):
    """[the vulkan worker] for fp16 tests (f16 storage: cuda, vulkan, cpu; CI has vulkan)."""
    vulkan = [w for w in taichi_workers if w.backend == "vulkan"]
    if not vulkan:
        pytest.skip("vulkan is not among TFLITE_TAICHI_TEST_BACKENDS")
    return vulkan


@pytest.fixture(scope="session")
def gles_worker():
    from tflite_taichi.testing import BackendWorker
    if "gles" not in switches.value("TFLITE_TAICHI_TEST_GLES"):
        pytest.skip("GLES disabled by TFLITE_TAICHI_TEST_GLES")
    w = BackendWorker("gles")
    yield w
    w.close()
