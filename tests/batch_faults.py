"""A fault for the tests of batch's retries and timeouts, imported into every worker by
`batch.run(..., imports=FAULTS)` (the CLI's `--import batch_faults`): with
TFLITE_TAICHI_BATCH_FAULT="KIND:SUFFIX:MARKER", the first worker to run a batch holding an item
whose key ends with SUFFIX creates the file MARKER and then, for KIND "kill", kills its own
process (SIGKILL, as the OOM killer would), or for "hang", sleeps for an hour (a hung driver);
later attempts run. With an empty MARKER every attempt does it.

Importing this module wraps BatchRunner.run in that process: the runtime holds no test hook.
Workers find it on sys.path (a local pool's spawned workers take the test process's sys.path;
Ray's actors and a CLI subprocess get TESTS_DIR through PYTHONPATH)."""
import functools
import os
import signal
import time

from tflite_taichi import switches
from tflite_taichi.batch.runner import BatchRunner

FAULT_ENV = "TFLITE_TAICHI_BATCH_FAULT"
FAULTS = ("batch_faults",)                   # batch.run's imports=
TESTS_DIR = os.path.dirname(os.path.abspath(__file__))


def inject_fault(keys: list) -> None:
    spec = switches.value(FAULT_ENV)
    if not spec:
        return
    kind, suffix, marker = spec.split(":", 2)
    if kind not in ("kill", "hang") or not any(k.endswith(suffix) for k in keys):
        return
    if marker:
        try:
            fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return
        os.close(fd)
    if kind == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(3600)


def _with_fault(run):
    @functools.wraps(run)
    def faulty_run(self, items):
        inject_fault([key for key, _ in items])
        return run(self, items)
    faulty_run.with_fault = True
    return faulty_run


if not getattr(BatchRunner.run, "with_fault", False):
    BatchRunner.run = _with_fault(BatchRunner.run)


def with_tests_on_path(env: dict) -> dict:
    """`env` with TESTS_DIR first on PYTHONPATH (for processes that do not take sys.path)."""
    given = env.get("PYTHONPATH")
    return {**env, "PYTHONPATH": TESTS_DIR + (os.pathsep + given if given else "")}
