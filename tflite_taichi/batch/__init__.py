"""Batch inference: a folder of inputs through a model, on every GPU of a host (a local pool of
worker processes) or of a Ray cluster (Ray Data), with outputs written as Parquet or .npz.

    from tflite_taichi import batch
    result = batch.run("model.tflite", ["frames/"], "out/", backend="cuda", batch_size=32)
    outputs = batch.read_outputs("out/")      # {input path: {output name: array}}

The same is `tflite-taichi batch MODEL INPUTS... --out DIR`. See docs/batch.md.
"""
from __future__ import annotations

import ctypes
import math
import os
import sys
import time
from dataclasses import dataclass, field, replace
from typing import Optional, Sequence, Union

from tflite_taichi.batch.inputs import (InputSpec, Item, check_images, discover, input_spec,
                                        parse_preprocess, require_pyarrow)
from tflite_taichi.batch.folder import Claim, check_out_dir, identity, prepare
from tflite_taichi.batch.outputs import (FORMATS, count_written, merge_errors, output_info,
                                         read_errors, read_outputs, write_manifest)
from tflite_taichi.batch.runner import RunConfig, import_modules, probe_batching
from tflite_taichi import threads
from tflite_taichi.errors import BatchError

__all__ = ["run", "BatchResult", "BatchError", "read_outputs", "read_errors", "discover",
           "gpu_devices", "output_info", "InputSpec", "Item"]

GPU_BACKENDS = ("cuda", "vulkan", "metal", "opengl", "gles")
TASK_ITEMS = 32          # items per task (one part file) at least: a few invokes' worth


@dataclass
class BatchResult:
    items: int                   # inputs found
    written: int                 # inputs whose outputs were written
    errors: int                  # inputs in errors.jsonl
    seconds: float               # the whole run, workers' start-up included
    backend: str
    mode: str                    # "local" or "ray"
    workers: list = field(default_factory=list)   # per worker: items, start_s, items_per_invoke
    out_dir: str = ""
    workers_ready_s: Optional[float] = None    # local pool: when every worker had started
    steady_items_per_second: Optional[float] = None   # local pool: the rate after that
    restarts: int = 0            # local pool: workers started again after one died
    ray: Optional[dict] = None   # Ray: actors, GPUs and CPUs per actor, the cluster's resources
    resumed: int = 0             # inputs an interrupted run had written (--resume): not run again
    notes: list = field(default_factory=list)   # what the run chose that a user should know

    @property
    def items_per_second(self) -> float:
        return (self.written + self.errors) / self.seconds if self.seconds > 0 else 0.0

    def summary(self) -> dict:
        return {"items": self.items, "written": self.written, "errors": self.errors,
                "seconds": round(self.seconds, 3), "items_per_s": round(self.items_per_second, 2),
                "workers_ready_s": self.workers_ready_s, "restarts": self.restarts,
                "steady_items_per_s": self.steady_items_per_second,
                "backend": self.backend, "mode": self.mode, "workers": self.workers,
                "ray": self.ray, "resumed": self.resumed}


def gpu_devices() -> list:
    """The GPUs a worker can be given: CUDA_VISIBLE_DEVICES's entries where it is set, else
    every device the CUDA driver counts; [] without an NVIDIA driver (one device is assumed)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [d.strip() for d in visible.split(",") if d.strip()]
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
        count = ctypes.c_int(0)
        if cuda.cuInit(0) != 0 or cuda.cuDeviceGetCount(ctypes.byref(count)) != 0:
            return []
        return [str(i) for i in range(count.value)]
    except OSError:
        return []


def _resolve_backend(backend: str, cache_dir: Optional[str], model_data: bytes) -> str:
    """The backend every worker runs: `auto` decided once here, as an Interpreter would (the
    first hardware GPU; else LiteRT's CPU kernels where LiteRT takes the model; else Taichi's
    cpu), so that every worker runs the same one."""
    from tflite_taichi.interpreter import BACKENDS
    if backend not in BACKENDS:
        raise BatchError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    if backend != "auto":
        return backend
    from tflite_taichi import backend as backends
    from tflite_taichi import litert_cpu
    chosen = backends.choose_auto(cache_dir)    # probes run in subprocesses: nothing is claimed here
    if chosen == "cpu" and litert_cpu.available():
        try:
            litert_cpu.LiteRTModel(model_data, 1).close()
            return "litert"
        except Exception:           # BackendUnavailable: LiteRT refuses the model (a custom op)
            pass
    return chosen


def _model_bytes(model: Union[str, bytes, os.PathLike]) -> bytes:
    if isinstance(model, (bytes, bytearray, memoryview)):
        return bytes(model)
    try:
        with open(model, "rb") as f:
            return f.read()
    except OSError as e:
        raise BatchError(f"cannot read the model {model}: {e.strerror or e}") from None


def _tasks(items: list, task_items: int) -> list:
    return [(i, items[start:start + task_items])
            for i, start in enumerate(range(0, len(items), task_items))]


def run(model, inputs: Union[str, Sequence[str]], out_dir: str, *, backend: str = "auto",
        batch_size: int = 16, workers: Optional[int] = None, ray: Optional[str] = None,
        gpus_per_worker: Optional[float] = None, cpus_per_worker: float = 1.0,
        fmt: str = "parquet", preprocess: Optional[str] = None, precision: str = "fp32",
        retries: int = 2, overwrite: bool = False, resume: bool = False, progress: bool = False,
        task_timeout: Optional[float] = None, cache_dir: Optional[str] = None,
        imports: Sequence[str] = ()) -> BatchResult:
    """Run every input found in `inputs` (files and folders) through `model` (a path or bytes),
    writing outputs and errors.jsonl into `out_dir`.

    batch_size: items per invoke where the model's batch dimension can be resized (else one).
    workers: local pool processes (default: one per GPU, or per core on cpu/reference), or Ray
    actors. ray: None for the local pool; "" to start or join a local Ray cluster (RAY_ADDRESS
    is honoured); an address ("auto", "ray://host:10001") to join one. gpus_per_worker: Ray's
    num_gpus per actor (default 1 on a GPU backend, 0 otherwise; 0.25 puts four on a GPU).
    fmt: "parquet" or "npz" (local pool only). preprocess: how image pixels become a float
    input, overriding the model's metadata (a preset or "mean=M;std=S"). retries: how often a
    batch whose worker died is run again. task_timeout: seconds a local pool worker with work may
    go without finishing a task before it is killed and its tasks retried (default: no limit).
    overwrite: remove a previous run's files from `out_dir` (only those) first. resume: finish
    the interrupted run in `out_dir` (same model, inputs and fmt): its complete part files are
    kept and only the inputs none of them holds are run. Either way every input ends up once.
    progress: say how the run goes on stderr (local pool; Ray shows Ray Data's): a bar on a
    terminal, plain lines in a pipe or a log.
    imports: modules imported here and in every worker before the model is read, e.g. one that
    registers the model's custom ops (a worker is a fresh process: what this process registered
    by other means is not there); each must be importable in the workers too.
    Returns a BatchResult; bad inputs are in errors.jsonl.
    """
    started = time.perf_counter()
    if isinstance(inputs, (str, os.PathLike)):
        inputs = [inputs]
    inputs = [os.fspath(p) for p in inputs]
    check_out_dir(out_dir, inputs)      # before anything is read, written or removed
    if fmt not in FORMATS:
        raise BatchError(f"unknown output format {fmt!r}; choose one of {', '.join(FORMATS)}")
    if ray is not None and fmt != "parquet":
        raise BatchError("with Ray, outputs are written by Ray Data's Parquet writer: --format parquet")
    if fmt == "parquet":
        require_pyarrow("writing Parquet outputs")
    if batch_size < 1 or retries < 0 or (workers is not None and workers < 1):
        raise BatchError("batch_size and workers must be at least 1, retries at least 0")
    if task_timeout is not None and not task_timeout > 0:
        raise BatchError(f"task_timeout must be a number of seconds above 0, got {task_timeout!r}")
    if task_timeout is not None and ray is not None:
        raise BatchError("--task-timeout is the local pool's: Ray Data's map_batches has no "
                         "per-task timeout (Ray's own health checks see dead actors, not hung ones)")
    import_modules(imports)
    model_data = _model_bytes(model)
    from tflite_taichi.interpreter import Interpreter
    reader = Interpreter(model_content=model_data, backend="reference")   # no Taichi here
    spec = input_spec(reader, parse_preprocess(preprocess))
    info = output_info(reader)
    batching_note = probe_batching(reader, spec, info, batch_size)   # resizes `reader`: last use
    items, problems = discover(list(inputs), exclude=out_dir)
    check_images(spec, items)
    resolved = _resolve_backend(backend, cache_dir, model_data)
    ident = identity(model_data, fmt, inputs, info)
    with Claim(out_dir) as claim:        # held until the summary is written: one run per folder
        record = prepare(claim.folder, ident, {item.key for item in items},
                         overwrite=overwrite, resume=resume)
        out_dir = claim.folder.path      # checked from / (folder.open_out): the real path
        task_items = batch_size * max(1, math.ceil(TASK_ITEMS / batch_size))
        config = RunConfig(model=model_data, backend=resolved, precision=precision,
                           batch_size=batch_size, spec=spec, info=info, out_dir=out_dir, fmt=fmt,
                           cache_dir=cache_dir, part_prefix=record.prefix, imports=tuple(imports),
                           batching_note=batching_note)
        todo = [item for item in items if item.key not in record.done]
        result = _run_items(todo, problems, config, ray=ray, workers=workers, retries=retries,
                            task_items=task_items, progress=progress, task_timeout=task_timeout,
                            gpus_per_worker=gpus_per_worker, cpus_per_worker=cpus_per_worker)
        result.items = len(items) + len(problems)
        result.resumed = len(items) - len(todo)
        result.seconds = time.perf_counter() - started
        write_manifest(out_dir, info, record.manifest(finished=True), result.summary())
    return result


def _run_items(items, problems, config: RunConfig, *, ray, workers, retries, task_items,
               progress, task_timeout, gpus_per_worker, cpus_per_worker) -> BatchResult:
    """Run `items` into the claimed folder; merge the errors and count what is written."""
    out_dir, resolved = config.out_dir, config.backend
    given_up = []
    if not items:
        report = {"workers": []}
    elif ray is None:
        report = _run_local(items, config, workers, retries, task_items, progress, task_timeout)
        given_up = report["given_up"]
    else:
        from tflite_taichi.batch.ray_data import run_ray
        if gpus_per_worker is None:
            gpus_per_worker = 1.0 if resolved in GPU_BACKENDS else 0.0
        if resolved not in GPU_BACKENDS:        # an actor's threads: the CPUs Ray gives it
            config = replace(config, threads=max(1, int(cpus_per_worker)))
        report = run_ray(items, config, address=ray, workers=workers,
                         gpus_per_worker=gpus_per_worker, cpus_per_worker=cpus_per_worker,
                         retries=retries, task_items=task_items, progress=progress)
    errors = merge_errors(out_dir, problems + given_up)
    return BatchResult(items=len(items) + len(problems), written=count_written(out_dir),
                       errors=len(errors), seconds=0.0, backend=resolved,
                       mode="local" if ray is None else "ray", workers=report["workers"],
                       out_dir=out_dir, workers_ready_s=report.get("workers_ready_s"),
                       steady_items_per_second=report.get("steady_items_per_s"),
                       restarts=report.get("restarts", 0), ray=report.get("ray"),
                       notes=report.get("notes", []))


def _run_local(items, config: RunConfig, workers: Optional[int], retries: int,
               task_items: int, progress: bool, task_timeout: Optional[float]) -> dict:
    from tflite_taichi.batch.pool import LocalPool, worker_environments
    devices = gpu_devices() if config.backend in ("cuda", "vulkan") else []
    if workers is None:
        workers = max(len(devices), 1) if config.backend in GPU_BACKENDS else threads.usable_cores()
    if config.backend not in GPU_BACKENDS:      # the cores shared out, not each worker taking all
        config = replace(config, threads=max(1, threads.usable_cores() // workers))
    asked = workers
    if len(items) < asked * task_items:     # a small run: smaller tasks, so every worker has some
        task_items = max(1, math.ceil(len(items) / asked))
    tasks = _tasks(items, task_items)
    workers = max(1, min(workers, len(tasks)))
    bar = _progress(len(items), workers, config.backend) if progress else None
    pool = LocalPool(config, worker_environments(config.backend, workers, devices), retries,
                     progress=bar.update if bar else None, task_timeout=task_timeout)
    try:
        report = pool.run(tasks)
    finally:
        if bar:
            bar.close()
    if workers < asked:
        report.setdefault("notes", []).append(
            f"{workers} of the {asked} workers started: {len(items)} input(s) give each worker "
            "one at least")
    return report


PROGRESS_LINE_S = 10.0       # in a pipe or a log: a progress line at most this often


def _progress(total: int, workers: int, backend: str):
    """A progress bar on a terminal; plain lines in a pipe or a log (a bar's redraws would flood
    it, and silence until the end looks like a hang), as `run` says its compiles."""
    if sys.stderr.isatty():
        return _ProgressBar(total, workers)
    return _ProgressLines(total, workers, backend, sys.stderr)


class _ProgressLines:
    """A line when the workers start, then one as tasks finish (the first at once, then at most
    one every PROGRESS_LINE_S, and the last): inputs done, items/s, each worker's count."""

    def __init__(self, total: int, workers: int, backend: str, stream):
        self.total, self.stream = total, stream
        self.per_worker = [0] * workers
        self.started = time.perf_counter()
        self.last_line = None
        self._say(f"batch: {total} input(s); starting {workers} worker(s) on {backend}...")

    def _say(self, line: str) -> None:
        print(line, file=self.stream, flush=True)

    def update(self, n: int, worker) -> None:
        self.per_worker[worker.slot] += n
        done, now = sum(self.per_worker), time.perf_counter()
        if done < self.total and self.last_line is not None and \
                now - self.last_line < PROGRESS_LINE_S:
            return
        self.last_line = now
        seconds = now - self.started
        counts = ", ".join(f"worker {i}: {c}" for i, c in enumerate(self.per_worker))
        self._say(f"batch: {done} of {self.total} inputs done in {seconds:.1f} s "
                  f"({done / seconds if seconds > 0 else 0.0:.1f} items/s; {counts})")

    def close(self) -> None:
        pass


class _ProgressBar:
    """Items done and items/s (tqdm), with each worker's count beside them."""

    def __init__(self, total: int, workers: int):
        from tqdm import tqdm
        self.bar = tqdm(total=total, unit="item", file=sys.stderr, dynamic_ncols=True)
        self.per_worker = [0] * workers

    def update(self, n: int, worker) -> None:
        self.per_worker[worker.slot] += n
        self.bar.set_postfix_str(" ".join(f"w{i}:{c}" for i, c in enumerate(self.per_worker)),
                                 refresh=False)
        self.bar.update(n)

    def close(self) -> None:
        self.bar.close()
