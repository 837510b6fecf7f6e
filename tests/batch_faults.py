"""A fault for the tests of batch's retries and timeouts, imported into every worker by
`batch.run(..., imports=FAULTS)` (the CLI's `--import batch_faults`): with
TFLITE_TAICHI_BATCH_FAULT="KIND:SUFFIX:MARKER", the first worker to run a batch holding an item
whose key ends with SUFFIX creates the file MARKER and then, for KIND "kill", kills its own
process (SIGKILL, as the OOM killer would), or for "hang", sleeps for an hour (a hung driver);
later attempts run. With an empty MARKER every attempt does it.
KIND "lose_gpu" (SUFFIX: a GPU, as CUDA_VISIBLE_DEVICES names it): the first worker on that GPU to
run a batch creates MARKER and kills itself, and from then on no worker starts on that GPU (its
interpreter raises BackendUnavailable): a GPU lost mid-run. KIND "no_gpu": no worker starts on
that GPU at all ("*": on any). With a MARKER, the workers on the other GPUs run nothing until the
driver has retired the lost GPU's slot (record_retirements makes the driver create MARKER.retired
then): otherwise they may finish the work before the slot's restart is refused, and a test of
retirement would depend on the machine's load.
KIND "exit_at_start" (SUFFIX: a GPU, or "*"): a local pool's worker on that GPU exits (os._exit(1))
as it imports this module, before it reports "ready": a slot that cannot start. With a MARKER, the
workers on the other GPUs run nothing until the driver has retired that slot (as for lose_gpu).
KIND "together" (SUFFIX: a number of workers N, MARKER: a folder): a worker's first batch waits
until N workers hold one, so that each of them takes work (on a loaded machine one worker can
otherwise do all of it while the other is still starting).

Importing this module wraps BatchRunner.run in that process: the runtime holds no test hook.
Workers find it on sys.path (a local pool's spawned workers take the test process's sys.path;
Ray's actors and a CLI subprocess get TESTS_DIR through PYTHONPATH)."""
import functools
import os
import signal
import time

from tflite_taichi import switches
from tflite_taichi.batch.runner import BatchRunner
from tflite_taichi.errors import BackendUnavailable
from tflite_taichi.runtime import children

FAULT_ENV = "TFLITE_TAICHI_BATCH_FAULT"
FAULTS = ("batch_faults",)                   # batch.run's imports=
TESTS_DIR = os.path.dirname(os.path.abspath(__file__))


def _fault():
    spec = switches.value(FAULT_ENV)
    return spec.split(":", 2) if spec else (None, None, None)


def _on_gpu(gpu: str) -> bool:
    return gpu == "*" or os.environ.get("CUDA_VISIBLE_DEVICES") == gpu


def refuse_start() -> None:
    """At a worker's start (when it imports this module): a GPU that is gone (lose_gpu once its MARKER
    exists, no_gpu always) refuses it, as a driver refuses a device that fell off the bus."""
    kind, gpu, marker = _fault()
    if kind == "no_gpu" and _on_gpu(gpu) or kind == "lose_gpu" and _on_gpu(gpu) and os.path.exists(marker):
        raise BackendUnavailable(f"GPU {os.environ.get('CUDA_VISIBLE_DEVICES')} is gone (a test)")


RETIRED = ".retired"         # MARKER + this: the driver retired the lost GPU's slot
RETIREMENT_WAIT_S = 120      # a driver that never retires it (or a worker that never starts): the
                             # others go on, and the test fails


def record_retirements(monkeypatch, marker: str) -> None:
    """In the driver (the test's process): each retirement of a local pool's slot creates
    MARKER.retired, which the workers on the other GPUs wait for (inject_fault)."""
    from tflite_taichi.batch import pool
    real = pool.LocalPool._retire

    def retire_and_record(self, w, why):
        try:
            real(self, w, why)
        finally:
            open(marker + RETIRED, "a").close()
    monkeypatch.setattr(pool.LocalPool, "_retire", retire_and_record)


def _wait_for_retirement(marker: str) -> None:
    deadline = time.monotonic() + RETIREMENT_WAIT_S
    while not os.path.exists(marker + RETIRED) and time.monotonic() < deadline:
        time.sleep(0.02)


def _wait_together(workers: int, folder: str) -> None:
    os.makedirs(folder, exist_ok=True)
    open(os.path.join(folder, str(os.getpid())), "a").close()
    deadline = time.monotonic() + RETIREMENT_WAIT_S
    while len(os.listdir(folder)) < workers and time.monotonic() < deadline:
        time.sleep(0.02)


def inject_fault(keys: list) -> None:
    kind, suffix, marker = _fault()
    if kind == "together":
        _wait_together(int(suffix), marker)
        return
    if kind in ("lose_gpu", "no_gpu", "exit_at_start") and marker and not _on_gpu(suffix):
        _wait_for_retirement(marker)
        return
    if kind == "lose_gpu" and _on_gpu(suffix):
        keys = [suffix]                         # any batch on that GPU is the victim
    elif kind not in ("kill", "hang") or not any(k.endswith(suffix) for k in keys):
        return
    if marker:
        try:
            fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return
        os.close(fd)
    if kind in ("kill", "lose_gpu"):
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
if children.parent_pid() is not None:    # a local pool's worker, importing this at its start
    if _fault()[0] == "exit_at_start" and _on_gpu(_fault()[1]):    # (BatchRunner: --import)
        os._exit(1)
    refuse_start()


def with_tests_on_path(env: dict) -> dict:
    """`env` with TESTS_DIR first on PYTHONPATH (for processes that do not take sys.path)."""
    given = env.get("PYTHONPATH")
    return {**env, "PYTHONPATH": TESTS_DIR + (os.pathsep + given if given else "")}
