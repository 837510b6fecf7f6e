"""A program's kernels compiled in worker processes, in parallel, away from the caller.

Why: a cold start is Taichi's Python frontend compiling every kernel (seconds per kernel), and
Taichi's frontend is one per process and not thread-safe, so one process compiles one kernel
at a time; four compiles in four processes took as long as one alone on the H200's 16 cores.
So a program's kernels are split into modules (`kernel_groups`: at most MODULE_GROUPS, by
weight, the same split on every machine so that the cache keys do not depend on the core
count), and each module is compiled and saved as a Taichi AOT module by a worker process (up
to one per core, `worker_count`); the caller only loads the saved modules through Taichi's C
API, and never starts Taichi's Python frontend itself.

What travels to a worker is what Taichi's frontend reads (`codegen.build_kernels`): each
partition's steps as op indices, tensor indices, the op's Node and the op's name, and the
memory plan without the weights (the kernels address them; the caller uploads them). A worker
finds the ops by name among the built-in ops, so a program with an op registered by the
user's program (or a built-in replaced) compiles in the caller's process instead
(`why_not_shipped`), as does one with TFLITE_TAICHI_COMPILE_WORKERS=0. A worker that fails
(a crash, a kernel Taichi refuses, a module it says it saved and did not, or silence for
TFLITE_TAICHI_COMPILE_DEADLINE seconds: then it is killed) costs a RuntimeWarning and the same
compile in the caller's process, which raises what the compile raises there.

Protocol: the caller writes pickled `Job`s to a worker's stdin, one at a time; for each, the
worker prints `kernel NAME` after each kernel compiles (the caller's compile_progress
callback), `module INDEX REL` when module INDEX is saved in its folder (REL: the file or folder
in it), then `done`. Workers are kept for the next program (Taichi's start is paid once per
worker), exit after IDLE_EXIT_S without a job or at the end of their input, and die with their
caller (PR_SET_PDEATHSIG on Linux, and a check of its parent's pid). A worker that raises
exits: the caller starts a new one for the next job. A worker is started by
children.python_command: nothing is imported from the caller's current folder."""
from __future__ import annotations

import atexit
import contextlib
import dataclasses
import os
import pickle
import queue
import shutil
import subprocess
import threading
import time
import warnings
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np

from tflite_taichi.runtime.children import python_command
from tflite_taichi.runtime.session import SESSION

MODULE_GROUPS = 8          # the most modules one program's kernels are split into


def kernel_groups(weights: list, groups: int = MODULE_GROUPS) -> list:
    """Kernel positions split into min(len(weights), groups) groups of similar total weight
    (the heaviest kernel first into the lightest group; ties broken by position, so the split
    is the same everywhere). Each group's positions are in order."""
    count = min(len(weights), max(int(groups), 1))
    if count == 0:
        return []
    members, totals = [[] for _ in range(count)], [0] * count
    for position in sorted(range(len(weights)), key=lambda i: (-weights[i], i)):
        lightest = min(range(count), key=lambda g: (totals[g], g))
        members[lightest].append(position)
        totals[lightest] += weights[position]
    return [sorted(m) for m in members]


def worker_count(modules: int) -> int:
    """How many worker processes compile `modules` modules: TFLITE_TAICHI_COMPILE_WORKERS
    (0: compile in this process), by default one per core this process may use, at most one
    per module."""
    from tflite_taichi import switches
    from tflite_taichi.errors import BackendUnavailable, InputError
    try:
        wanted = switches.value("TFLITE_TAICHI_COMPILE_WORKERS")
    except InputError as e:
        raise BackendUnavailable(str(e)) from None
    if wanted is None:
        from tflite_taichi.threads import usable_cores
        wanted = usable_cores()
    return max(0, min(wanted, modules))


# -- what a worker gets -------------------------------------------------------------------------
@dataclass(frozen=True)
class ShippedOp:
    """What build_kernels reads of a model_ir.Operator."""
    index: int
    name: str
    inputs: tuple
    outputs: tuple


@dataclass
class ShippedStep:
    """A graph.Step as a worker needs it: the op is found by name among the built-in ops."""
    op: ShippedOp
    node: object
    updates_state: bool = False     # graph.Step's: overwrites variable tensors (StepIO.state)

    @property
    def opdef(self):
        from tflite_taichi.ops import builtin
        return builtin(self.op.name)


@dataclass
class ShippedPartition:
    steps: list
    variables: dict = dataclasses.field(default_factory=dict)   # partition.Partition's slots


@dataclass
class Job:
    backend: str
    caps: list                  # device capabilities the modules are compiled for
    llvm: bool                  # cuda/x64 modules are saved as folders, gfx ones as archives
    cache_root: Optional[str]   # the drivers' caches point there while Taichi starts
    codes: list                 # codegen.PartitionCode, shipped (weights left out)
    modules: list               # (index, folder, [(kernel name, code position, chunk position)])
    switches: dict = dataclasses.field(default_factory=dict)    # TFLITE_TAICHI_* (switches())


def why_not_shipped(codes) -> Optional[str]:
    """Why these partitions must compile in this process (None: a worker can take them)."""
    from tflite_taichi.ops import builtin
    for code in codes:
        for step in code.partition.steps:
            if builtin(step.opdef.name) is not step.opdef:
                return (f"op {step.opdef.name} is not a built-in op of tflite_taichi (a worker "
                        "process would not know it)")
    return None


def shipped(code):
    """A codegen.PartitionCode as it travels: steps reduced to what build_kernels reads, the
    plan without its weights."""
    steps = [ShippedStep(ShippedOp(s.op.index, s.opdef.name, tuple(s.op.inputs),
                                   tuple(s.op.outputs)), s.node, s.updates_state)
             for s in code.partition.steps]
    plan = dataclasses.replace(code.plan, weights=np.zeros(0, np.float32))
    return dataclasses.replace(code, partition=ShippedPartition(steps, dict(code.partition.variables)),
                               plan=plan, kernels=[])


def aot_module(caps=()):
    """A `ti.aot.Module` for the current arch, compiled for device capabilities `caps` (Taichi's
    names, "spirv_has_float16=1": SPIR-V archs generate code for them, and the C API loads the
    module only on a device with exactly these). Taichi 1.7.4's constructor finalizes the root
    FieldsBuilder and refuses a second module per process ("can only finalize the root
    FieldsBuilder once"); we declare no fields, so every module after the first skips that step
    and is otherwise built as the constructor does (same private calls, pinned taichi)."""
    import taichi as ti
    from taichi.lang import impl
    from tflite_taichi.runtime import taichi_build
    arch = impl.current_cfg().arch
    fmt = taichi_build.artifact_format(arch.name)        # taichi-forge: PTX on cuda (taichi_build.py)
    fb = impl._root_fb
    if not fb.finalized:
        return (ti.aot.Module(caps=list(caps)) if fmt is None
                else ti.aot.Module(caps=list(caps), artifact_format=fmt))
    module = ti.aot.Module.__new__(ti.aot.Module)
    module._arch = arch
    module._kernels, module._fields, module._content = [], {}, []
    module._aot_builder = impl.get_runtime().prog.make_aot_module_builder(module._arch, list(caps))
    if fmt is not None:
        module._aot_builder.set_artifact_format(fmt)
    return module


# -- compiling: here or in workers ----------------------------------------------------------------
def save_module(codes, kernels, folder: str, caps, llvm: bool,
                compiled: Callable[[str], None] = lambda name: None) -> str:
    """Compile `kernels` ((name, code position, chunk position)) of `codes` with Taichi's Python
    frontend (started in this process on its arch) and save them as one AOT module in `folder`;
    returns the module's file or folder name there. `compiled(name)` after each kernel."""
    from tflite_taichi import codegen
    from tflite_taichi.ops import taichi_frontend
    from tflite_taichi.runtime.device import TAICHI_LOCK
    built = {}
    with TAICHI_LOCK, codegen.intended_unrolling():
        module = aot_module(caps)
        for name, code_at, chunk_at in kernels:
            if code_at not in built:
                built[code_at] = codegen.build_kernels(codes[code_at])
            with taichi_frontend.top_level_loops(codes[code_at].cpu_threads), \
                    codegen.compiling(codes[code_at], chunk_at):
                module.add_kernel(built[code_at][chunk_at], name=name)    # Taichi compiles it here
            compiled(name)
        if llvm:                        # cuda/x64: a .tcm archive crashes the C API loader
            rel = "module"
            os.mkdir(os.path.join(folder, rel), 0o700)
            module.save(os.path.join(folder, rel))
        else:
            rel = "module.tcm"
            module.archive(os.path.join(folder, rel))
        for code_at in built:
            codes[code_at].kernels = []     # the Python kernels are not run: let them go
    return rel


class CompileWorkerError(RuntimeError):
    """A worker process did not deliver its modules (its message says why)."""


IDLE_EXIT_S = 120.0     # a worker given no job for this long exits (its memory back)
IDLE_MARGIN_S = 10.0    # ...and one this close to it is replaced rather than sent a job


class _Worker:
    """One compile worker process, kept for the jobs that follow (Taichi started once)."""

    def __init__(self):
        env = dict(os.environ)
        package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))
        env.setdefault("ENABLE_TAICHI_HEADER_PRINT", "False")
        self.process = subprocess.Popen(
            python_command("tflite_taichi.runtime.compile_worker:main", os.getpid(), IDLE_EXIT_S),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        self.events: Optional[queue.Queue] = None      # the job in progress's
        self.stderr_tail: list = []
        self.kill_reason: Optional[str] = None         # why the caller killed it
        self.idle_since = time.monotonic()
        threading.Thread(target=self._read_events, daemon=True).start()
        threading.Thread(target=self._read_stderr, daemon=True).start()

    def usable(self) -> bool:
        return (self.process.poll() is None
                and time.monotonic() - self.idle_since < IDLE_EXIT_S - IDLE_MARGIN_S)

    def send(self, job: Job, events: queue.Queue) -> None:
        self.events = events
        try:
            pickle.dump(job, self.process.stdin, protocol=pickle.HIGHEST_PROTOCOL)
            self.process.stdin.flush()
        except (BrokenPipeError, OSError):
            pass                        # it died: its exit says why

    def _read_events(self) -> None:
        for raw in self.process.stdout:
            kind, _, payload = raw.decode("utf-8", "replace").rstrip("\n").partition(" ")
            if kind in ("kernel", "module", "done") and self.events is not None:
                if kind == "done":
                    self.idle_since = time.monotonic()
                self.events.put((kind, self, payload))
        self.process.wait()
        if self.events is not None:
            self.events.put(("exit", self, None))

    def _read_stderr(self) -> None:
        for raw in self.process.stderr:
            self.stderr_tail = (self.stderr_tail + [raw.decode("utf-8", "replace").rstrip()])[-20:]

    def failure(self) -> str:
        code = self.process.wait()
        if self.kill_reason is not None:
            return f"a compile worker failed: {self.kill_reason}"
        lines = [line for line in self.stderr_tail if line.strip()]
        what = f"killed by signal {-code}" if code < 0 else f"exit code {code}"
        return f"a compile worker failed ({what}): " + (lines[-1][:400] if lines else "no message")

    def kill_for(self, reason: str) -> None:
        """Kill it (a stopped process too); its exit then fails the job with `reason`."""
        self.kill_reason = reason
        self.process.kill()

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        with contextlib.suppress(OSError):
            self.process.wait(timeout=5)


class _Pool:
    """This process's compile workers: one job at a time (a lock), workers started as needed
    and kept while they are used."""

    def __init__(self):
        self.pid = os.getpid()
        self.lock = threading.Lock()
        self.workers: list = []

    def run(self, job: Job, workers: int, compiled: Callable[[str], None]) -> dict:
        sizes = [len(kernels) for _, _, kernels in job.modules]
        shares = [[job.modules[i] for i in group] for group in kernel_groups(sizes, workers)]
        with self.lock:
            for worker in [w for w in self.workers if not w.usable()]:
                worker.stop()
                self.workers.remove(worker)
            while len(self.workers) < len(shares):
                self.workers.append(_Worker())
            busy = self.workers[:len(shares)]
            events: queue.Queue = queue.Queue()
            for worker, share in zip(busy, shares):
                worker.send(dataclasses.replace(job, modules=share), events)
            try:
                return self._collect(job, busy, events, compiled)
            finally:
                for worker in busy:
                    worker.events = None

    def _collect(self, job: Job, busy: list, events: queue.Queue, compiled) -> dict:
        saved, failures, waiting = {}, [], set(busy)
        deadline_s = compile_deadline()
        heard = dict.fromkeys(busy, time.monotonic())   # each worker's last word
        while waiting:
            try:
                kind, worker, payload = events.get(
                    timeout=_until_stalled(heard, waiting, deadline_s))
            except queue.Empty:
                _kill_stalled(heard, waiting, deadline_s)
                continue                            # each killed one's "exit" comes next
            heard[worker] = time.monotonic()
            if kind == "kernel":
                compiled(payload)
            elif kind == "module":
                index, rel = payload.split(" ", 1)
                saved[int(index)] = rel
            elif worker in waiting:                 # "done", or "exit" before it was
                waiting.discard(worker)
                if kind == "exit":
                    failures.append(worker.failure())
                    self.workers.remove(worker)
                    for other in waiting:           # the caller compiles it all again: stop now
                        other.stop()
                        self.workers.remove(other)
                    waiting.clear()
        missing = [index for index, folder, _ in job.modules
                   if not _module_saved(folder, saved.get(index))]
        if failures or missing:
            raise CompileWorkerError("; ".join(failures) or f"modules {missing} were not saved")
        return saved

    def describe(self) -> dict:
        """Its size now and whether a job runs (the session's describe())."""
        alive = [w for w in list(self.workers) if w.process.poll() is None]
        return {"started": True, "workers": len(alive), "busy": self.lock.locked()}

    def close(self) -> None:
        for worker in self.workers:
            with contextlib.suppress(OSError):
                worker.process.stdin.close()        # a worker exits at the end of its input
        self.workers = []


def compile_deadline() -> float:
    """Seconds a compile worker may go without a word (a kernel compiled, a module saved) before
    it is killed: TFLITE_TAICHI_COMPILE_DEADLINE."""
    from tflite_taichi import switches
    from tflite_taichi.errors import BackendUnavailable, InputError
    try:
        return switches.value("TFLITE_TAICHI_COMPILE_DEADLINE")
    except InputError as e:
        raise BackendUnavailable(str(e)) from None


def _until_stalled(heard: dict, waiting: set, deadline_s: float) -> float:
    """Seconds until the first of `waiting` has been silent for `deadline_s` (at least a
    moment: a killed worker's exit is on its way)."""
    return max(0.05, min(heard[w] for w in waiting) + deadline_s - time.monotonic())


def _kill_stalled(heard: dict, waiting: set, deadline_s: float) -> None:
    now = time.monotonic()
    for worker in waiting:
        if now - heard[worker] >= deadline_s and worker.kill_reason is None:
            worker.kill_for(f"it compiled nothing for {deadline_s:g} s and was killed "
                            "(TFLITE_TAICHI_COMPILE_DEADLINE)")


def _module_saved(folder: str, rel: Optional[str]) -> bool:
    """A worker's word that it saved a module, checked: REL is a name in `folder`, and there."""
    return (rel is not None and rel == os.path.basename(rel) and rel not in ("", ".", "..")
            and os.path.exists(os.path.join(folder, rel)))


def _the_pool() -> _Pool:
    """The process's pool, kept in the session (SESSION.compile_pool); a forked child makes its
    own: its parent's pipes are not its own."""
    s = SESSION
    with s.compile_pool_lock:
        pool = s.own_compile_pool()
        if pool is None:
            pool = s.compile_pool = _Pool()
            atexit.register(pool.close)
        return pool


def compile_in_workers(job: Job, workers: int, compiled: Callable[[str], None]) -> dict:
    """Run `job`'s modules on `workers` processes; {module index: REL} when all are saved, else
    CompileWorkerError. The modules are dealt out heaviest first (kernel_groups on their kernel
    counts), one share per worker."""
    return _the_pool().run(job, workers, compiled)


def switches() -> dict:
    """The TFLITE_TAICHI_* variables of this process now: a worker takes them for each job (the
    ops read some while their kernels are built)."""
    from tflite_taichi import switches as _switches
    return _switches.inherited()


def _empty(folder: str) -> None:
    """What a worker killed while saving left in a module's own folder goes before the module is
    saved there again."""
    for name in os.listdir(folder):
        path = os.path.join(folder, name)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        else:
            os.unlink(path)


def build_modules(codes, modules: list, backend: str, caps, llvm: bool,
                  cache_root: Optional[str], compiled: Callable[[str], None]) -> tuple:
    """Compile each of `modules` ((index, folder, kernels)) into its folder: in worker processes
    where they can take the program (see the module docstring), else here. ({index: REL},
    where they were compiled, in words)."""
    workers = worker_count(len(modules))
    reason = why_not_shipped(codes) if workers else "TFLITE_TAICHI_COMPILE_WORKERS=0"
    if reason is None:
        job = Job(backend, list(caps), llvm, cache_root, [shipped(c) for c in codes], modules,
                  switches())
        try:
            saved = compile_in_workers(job, workers, compiled)
            return saved, f"{workers} worker process{'es' if workers > 1 else ''}"
        except (CompileWorkerError, pickle.PicklingError, TypeError, AttributeError) as e:
            reason = f"{type(e).__name__}: {e}"
            warnings.warn(f"tflite_taichi: {reason}; compiling in this process instead",
                          RuntimeWarning, stacklevel=4)
    from tflite_taichi.runtime.device import ensure_python_taichi
    ensure_python_taichi(backend)
    for _, folder, _ in modules:
        _empty(folder)
    saved = {index: save_module(codes, kernels, folder, caps, llvm, compiled)
             for index, folder, kernels in modules}
    return saved, f"this process ({reason})"
