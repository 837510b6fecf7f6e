"""The local pool: one worker process per GPU (or per core on cpu/reference), each with one
Interpreter, fed tasks of a few batches by the driver.

Processes, not threads: Taichi runs one backend and one device per process, and the decoding is
Python. Workers are fresh Python processes (a forked Taichi or CUDA runtime is unusable), started
by children.ConnectedChild so that nothing is imported from the current folder, with a pipe each
and their device in the environment (CUDA_VISIBLE_DEVICES for cuda; TI_VISIBLE_DEVICE, Taichi's
Vulkan device index, for vulkan). Each worker reads its tasks' inputs itself and writes their
outputs itself (part files named by run and task), so only keys and counts cross the pipes.

A worker that dies (killed, out of memory, a crash in a driver) is noticed by the driver, which
starts another in its place and gives the dead worker's tasks to the pool again. The task it was
running is split in two halves first (one input that kills whatever runs it must not take its
neighbours with it): halving goes on until the culprit runs alone, and an input whose worker died
`retries + 1` times running it alone is given up and goes to the errors file with the exit
status. Tasks it had only queued go back as they were. A task's part file is written under its
final name only when complete, a retried task rewrites the same name, and a split task's files
are removed before its halves run, so no input is lost or written twice.

A worker slot that cannot start an interpreter (its GPU gone, out of memory, a driver that
refuses it) or dies START_ATTEMPTS times in a row while starting is retired: its tasks go to the
others and the run goes on on the remaining slots (GPUs), the report saying which slot went and
why. Only when every slot is retired does the run end (a model no worker can load, say).

A driver that dies takes its workers with it (children.die_with_parent): a worker left running
would write parts into a folder that a rerun of the driver now owns.
"""
from __future__ import annotations

import collections
import contextlib
import multiprocessing.connection
import os
import time
import traceback
from typing import Optional

from tflite_taichi.batch.inputs import ItemError, TableCache, load_payload
from tflite_taichi.runtime.cache import environment
from tflite_taichi.errors import BatchError
from tflite_taichi.batch.outputs import (ERROR_PARTS, error_part_name, write_error_part,
                                         write_part)
from tflite_taichi.batch.runner import BatchRunner, RunConfig
from tflite_taichi.runtime.children import ConnectedChild, exit_if_parent_gone

PREFETCH = 2                 # tasks queued per worker: the next one is ready when one finishes
START_ATTEMPTS = 3           # a worker slot that dies this many times while starting is retired
START_WAIT_S = 30.0          # how long an idle worker leaves the tasks kept for workers still
                             # starting before it takes them itself (the run's end waits as long
                             # for starting workers: _stop)


def _worker_main(conn, slot: int, config: RunConfig) -> None:
    """A worker (a ConnectedChild, which dies with the driver): its interpreter, then tasks from
    `conn` until None, each answered on `conn`."""
    try:
        runner = BatchRunner(config)
    except BaseException as e:   # noqa: BLE001 - reported to the driver, which ends the run
        conn.send(("failed", slot, f"{type(e).__name__}: {e}"))
        return
    conn.send(("ready", slot, runner.describe()))
    tables = TableCache()
    while True:
        try:
            task = conn.recv()
        except EOFError:         # the driver is gone
            return
        if task is None:
            return
        task_id, items = task
        started = time.perf_counter()
        try:
            payloads, errors = [], []
            for item in items:
                try:
                    payloads.append((item.key, load_payload(item, tables, config.spec)))
                except ItemError as e:
                    errors.append((item.key, str(e)))
            keys, outputs, run_errors = runner.run(payloads)
            errors += run_errors
            exit_if_parent_gone()        # its folder may be another run's by now
            if keys:
                write_part(config.out_dir, part_name(task_id, config.part_prefix), keys, outputs,
                           config.info, config.fmt)
            write_error_part(config.out_dir, [item.key for item in items], errors)
        except BaseException:    # noqa: BLE001 - a bug or a failing disk: the driver retries
            conn.send(("crashed", slot, task_id, traceback.format_exc()))
            return
        conn.send(("done", slot, task_id, len(keys), len(errors), time.perf_counter() - started,
                   runner.describe()))        # it changes if the batching falls back


def part_name(task_id: int, prefix: str = "part") -> str:
    return f"{prefix}-{task_id:06d}"


class _Worker:
    def __init__(self, slot: int, env: dict):
        self.slot, self.env = slot, env
        self.process = None
        self.conn = None                 # the driver's end of this worker's pipe
        self.outstanding = []            # task ids sent, not done
        self.ready = False
        self.start_failures = 0
        self.done_items = 0
        self.info = None
        self.last_heard = 0.0            # time.monotonic() of its last message, or of work given
        self.idle_since = 0.0            # time.monotonic() when it last had no task
        self.kill_reason = None          # why the driver killed it (a task that took too long)
        self.retired = None              # why its slot takes no more work (it cannot start)


class LocalPool:
    """Each worker has a pipe of its own to the driver: a worker killed while writing can only
    break its own pipe (a queue shared by all would stay locked for every other writer)."""

    def __init__(self, config: RunConfig, worker_envs: list, retries: int, progress=None,
                 task_timeout: Optional[float] = None):
        self.config = config
        self.task_timeout = task_timeout  # seconds a busy worker may go without finishing a task
        self.workers = [_Worker(i, env) for i, env in enumerate(worker_envs)]
        self.retries = retries
        self.progress = progress         # callable(items done now, worker) or None
        self.restarts = 0
        self.started = None
        self.items_done = 0
        self.ready_marks = []            # (seconds after start, items done) as each worker
                                         # first started: the steady rate is measured after the
                                         # last (a worker still starting when the work ran out
                                         # did none of it, and does not count)

    def _start(self, w: _Worker) -> None:
        w.ready, w.outstanding, w.kill_reason = False, [], None
        w.last_heard = time.monotonic()
        with environment(w.env):        # a child copies os.environ at start
            w.process = ConnectedChild(_worker_main, (w.slot, self.config))
        w.conn = w.process.conn

    def run(self, tasks: list) -> dict:
        """tasks: [(task id, [Item])]. Returns {"given_up": [(key, reason)], "workers": [...]}."""
        self.pending = collections.deque(tasks)
        self.by_id = dict(tasks)
        self.attempts = collections.Counter()
        self.finished, self.given_up = set(), []
        self.next_id = max(self.by_id, default=-1) + 1     # the ids of halves of split tasks
        self.started = time.perf_counter()
        for w in self.workers:
            self._start(w)
        try:
            while len(self.finished) < len(self.by_id):
                self._feed()
                # a worker's death closes its end of the pipe: its connection says so too
                waiting = {w.conn: w for w in self.workers if w.process is not None}
                for ready in multiprocessing.connection.wait(list(waiting), timeout=1.0):
                    w = waiting[ready]
                    if w.process is None or ready is not w.conn:
                        continue                 # replaced earlier in this round
                    self._service(w)
                self._kill_stuck_workers()
            elapsed = time.perf_counter() - self.started    # the workers' exit is not work
        finally:
            self._stop()
        report = {"given_up": self.given_up, "restarts": self.restarts,
                  "workers": [{"worker": w.slot, "items": w.done_items, **(w.info or {}),
                               **({"retired": w.retired} if w.retired else {})}
                              for w in self.workers],
                  "notes": [f"worker {w.slot}{_device_of(w.env)} was retired ({w.retired}); the "
                            f"others ran its work" for w in self.workers if w.retired]}
        if self.ready_marks and elapsed > self.ready_marks[-1][0]:
            ready_s, done = self.ready_marks[-1]
            report["workers_ready_s"] = round(ready_s, 3)
            report["steady_items_per_s"] = round((self.items_done - done) / (elapsed - ready_s), 2)
        return report

    def _service(self, w: _Worker) -> None:
        """Read what worker `w` sent; if its pipe is closed, it is gone."""
        while True:
            try:
                if not w.conn.poll():
                    return
                message = w.conn.recv()
            except (EOFError, OSError):
                break
            w.last_heard = time.monotonic()
            self._handle(w, message)
            if w.process is None or message[0] == "crashed":
                return
        w.process.join(timeout=10)       # its pipe closed as it exited
        if w.process.is_alive():         # it closed its end itself: a worker no longer
            w.process.kill()
            w.process.join()
        self._lost(w, w.kill_reason or f"exit status {w.process.exitcode}")

    def _kill_stuck_workers(self) -> None:
        """A worker with work that has finished nothing for task_timeout seconds (a hung GPU
        driver, a deadlock) is killed; its tasks then go the way of any dead worker's. Starting
        workers are not timed: a cold kernel cache can take minutes."""
        if not self.task_timeout:
            return
        now = time.monotonic()
        for w in self.workers:
            if (w.process is not None and w.ready and w.outstanding and w.kill_reason is None
                    and now - w.last_heard > self.task_timeout):
                w.kill_reason = f"it finished nothing for {self.task_timeout:g} s and was killed"
                w.process.kill()

    def _feed(self) -> None:
        """Pending tasks to the ready workers, one at a time to the least busy (fewest tasks
        queued, then fewest items done): a worker that has done nothing yet takes the last
        task before one that has."""
        broken = set()
        while self.pending:
            takers = [w for w in self.workers
                      if w.ready and w.slot not in broken and len(w.outstanding) < PREFETCH
                      and not self._kept_for_starting_workers(w)]
            if not takers:
                return
            w = min(takers, key=lambda w: (len(w.outstanding), w.done_items))
            if not w.outstanding:
                w.last_heard = time.monotonic()      # an idle worker's clock starts now
            task_id, items = self.pending.popleft()
            w.outstanding.append(task_id)
            try:
                w.conn.send((task_id, items))
            except (BrokenPipeError, OSError):
                broken.add(w.slot)           # dead: the wait on its pipe says so next

    def _kept_for_starting_workers(self, w: _Worker) -> bool:
        """Whether the pending tasks are kept for the workers that have not started yet, one
        each, rather than given to `w`: the first worker to start would otherwise queue the
        tasks of a small run and do it all while the others start. An idle `w` takes them after
        START_WAIT_S (a worker may take minutes to start, or never)."""
        starting = sum(1 for other in self.workers
                       if other is not w and other.info is None and not other.retired)
        if len(self.pending) > starting:
            return False
        if w.outstanding:
            return True
        return time.monotonic() - w.idle_since < START_WAIT_S

    def _handle(self, w: _Worker, message) -> None:
        kind = message[0]
        if kind == "ready":
            if w.info is None:
                self.ready_marks.append((time.perf_counter() - self.started, self.items_done))
            w.ready, w.info, w.start_failures = True, message[2], 0
            w.idle_since = time.monotonic()
        elif kind == "failed":
            w.process.join(timeout=10)
            self._retire(w, f"it cannot start an interpreter: {message[2]}")
        elif kind == "done":
            _, _, task_id, written, errors, _seconds, w.info = message
            if task_id in w.outstanding:
                w.outstanding.remove(task_id)
            if not w.outstanding:
                w.idle_since = time.monotonic()
            if task_id not in self.finished:
                self.finished.add(task_id)
                w.done_items += written + errors
                self.items_done += written + errors
                if self.progress is not None:
                    self.progress(written + errors, w)
        elif kind == "crashed":
            _, _, task_id, trace = message
            w.process.join(timeout=10)
            self._lost(w, f"it raised {trace.strip().splitlines()[-1]}")

    def _lost(self, w: _Worker, why: str) -> None:
        """Worker `w` is gone: its tasks go back to the pool (or are given up), and a new worker
        takes its slot."""
        if not w.ready:
            w.start_failures += 1
            if w.start_failures >= START_ATTEMPTS:
                self._retire(w, f"it died {w.start_failures} times while starting (last: {why})")
                return
        # a worker runs its tasks in the order sent, and the driver has read every "done" it sent:
        # the first outstanding task is the one it died running, the others were only queued
        running = [t for t in w.outstanding[:1] if t not in self.finished]
        queued = [t for t in w.outstanding[1:] if t not in self.finished]
        self.pending.extendleft((t, self.by_id[t]) for t in reversed(queued))
        for task_id in running:
            if len(self.by_id[task_id]) > 1:
                self._split(task_id)
                continue
            self.attempts[task_id] += 1
            if self.attempts[task_id] > self.retries:
                self.finished.add(task_id)
                reason = (f"not run: the worker running it alone died {self.attempts[task_id]} "
                          f"times (last: {why})")
                self.given_up += [(item.key, reason) for item in self.by_id[task_id]]
                if self.progress is not None:
                    self.progress(len(self.by_id[task_id]), w)
            else:
                self.pending.appendleft((task_id, self.by_id[task_id]))
        w.outstanding = []
        w.conn.close()
        self.restarts += 1
        if len(self.finished) < len(self.by_id):
            self._start(w)
        else:
            w.process = None

    def _retire(self, w: _Worker, why: str) -> None:
        """Worker slot `w` takes no more work (it cannot start: its GPU is gone, say); what it
        had goes back to the pool. With no slot left, the run ends."""
        w.retired = why
        self.pending.extendleft((t, self.by_id[t]) for t in reversed(w.outstanding)
                                if t not in self.finished)
        w.outstanding, w.ready = [], False
        with contextlib.suppress(Exception):
            w.conn.close()
        w.process = None
        if all(other.retired for other in self.workers):
            raise BatchError("no worker could start: " + "; ".join(
                f"worker {other.slot}{_device_of(other.env)}: {other.retired}" for other in self.workers))

    def _split(self, task_id: int) -> None:
        """Task `task_id` killed its worker: its halves run in its place, as new tasks, and
        what it may have written before dying is removed (its halves write those inputs)."""
        items = self.by_id[task_id]
        self.finished.add(task_id)
        self._remove_outputs(task_id, items)
        middle = len(items) // 2
        halves = [(self.next_id, items[:middle]), (self.next_id + 1, items[middle:])]
        self.next_id += 2
        self.by_id.update(halves)
        self.pending.extendleft(reversed(halves))

    def _remove_outputs(self, task_id: int, items: list) -> None:
        folder, part = self.config.out_dir, part_name(task_id, self.config.part_prefix)
        for path in (os.path.join(folder, f"{part}.{self.config.fmt}"),
                     os.path.join(folder, ERROR_PARTS,
                                  error_part_name([i.key for i in items]) + ".jsonl")):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)

    def _stop(self) -> None:
        for w in self.workers:
            if w.process is not None and w.process.is_alive():
                with contextlib.suppress(Exception):
                    w.conn.send(None)
        deadline = time.monotonic() + START_WAIT_S
        for w in self.workers:
            if w.process is None:
                continue
            w.process.join(timeout=max(0.0, deadline - time.monotonic()))
            if w.process.is_alive():
                w.process.kill()
                w.process.join()
            with contextlib.suppress(Exception):
                w.conn.close()


def _device_of(env: dict) -> str:
    """' (GPU n)' for a worker given a GPU, else ''."""
    gpu = env.get("CUDA_VISIBLE_DEVICES")
    return f" (GPU {gpu})" if gpu is not None else ""


def worker_environments(backend: str, workers: int, devices: Optional[list]) -> list:
    """The environment of each worker: its GPU (worker i on device i mod the number of
    devices) for cuda and vulkan; nothing for the others."""
    if backend not in ("cuda", "vulkan") or not devices:
        return [{} for _ in range(workers)]
    envs = []
    for i in range(workers):
        position = i % len(devices)
        env = {"CUDA_VISIBLE_DEVICES": str(devices[position])}
        if backend == "vulkan":
            # Taichi's Vulkan device index; NVIDIA's Vulkan driver lists GPUs in CUDA's order
            env["TI_VISIBLE_DEVICE"] = str(devices[position])
        envs.append(env)
    return envs
