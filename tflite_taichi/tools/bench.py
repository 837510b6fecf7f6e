"""Benchmarks: LiteRT (CPU and GPU) and every backend of ours, side by side.

For one model and a list of backends, each backend is measured in fresh subprocesses (Taichi
runs one arch per process; LiteRT gets its own process too, so that every runtime starts from
the same state). The runtimes:

- `litert`: LiteRT's Interpreter, its default resolver (XNNPACK on the CPU), `threads` threads;
- `litert_gpu` / `litert_gpu_fp16`: LiteRT's GPU path, `CompiledModel` with
  `HardwareAccelerator.GPU` (ML Drift over WebGPU/Vulkan), `GpuOptions(enforce_f32=True)` /
  the default `GpuOptions()` (fp16). Where it does not start (no hardware GPU: "No adapters
  found" on lavapipe; a model it refuses: "Failed to modify graph with delegate") the row says
  so (ok False, the reason from the exception and LiteRT's log), the run goes on;
- `reference` (ours, numpy) and the Taichi backends of ours (`cpu`, `vulkan`, `cuda`, ...).

What is measured:

- a *step* is what a user's loop does: set every input, invoke, get every output (LiteRT CPU
  and ours: set_tensor / invoke / get_tensor; LiteRT GPU: TensorBuffer.write / run_by_index /
  TensorBuffer.read). The latency is that step, so that a runtime that leaves its outputs on
  the device until they are read is not timed short;
- cold start: a fresh process with a brand-new, empty cache folder; the seconds from
  constructing the runtime to the end of the first result (construct + allocate + the first
  step, which is where Taichi compiles or loads its kernels). Importing the runtime is measured
  apart (`import_s`), before the clock starts;
- warm start: a second fresh process, with the cache folder as the cold run left it; the same
  seconds. `warm_pct` is warm as a percentage of cold;
- latency: in that second process, one step (`second_step_ms`), W warm-up steps, then N timed
  steps (garbage collector off): median, p10, p90, min, max in milliseconds (`latency_ms`;
  every step in `times_ms`). `invoke()` / `run_by_index()` alone, inside those same steps, is
  kept apart (`invoke_ms`, `invoke_median_ms`);
- ours, per row, from `Interpreter.summary()`: kernel launches and host waits per invoke
  (`launches_per_invoke`, `waits_per_invoke`), where the kernels run (`device_kind`: Taichi's
  C API 'capi' or its Python runtime 'python'; None when nothing is delegated), the cache state
  of each process (`cold.cache_state`, `warm.cache_state`: the warm process should say 'warm',
  and `cache_state` is that), partitions and ops delegated / on the CPU;
- LiteRT GPU, per row: `fully_accelerated` (CompiledModel.is_fully_accelerated());
- the outputs of the last step compared with LiteRT CPU's (or, without it, the reference's),
  output by output in the model's order (matched by name, else by shape or size, in the child):
  max |ours - oracle| / max |oracle| over every output, so that a fast wrong answer shows.

Every backend gets the same seeded random input, set by name (else by shape). The caches:
`cache_dir=None` gives each (model, backend) a new empty folder under the work folder; a given
`cache_dir` is used as it is. The child's Interpreter gets `cache_dir=<that folder>` (cold and
warm alike), $TFLITE_TAICHI_CACHE_DIR points there too, and so do the GPU drivers' own caches
(Mesa's and NVIDIA's shader caches, CUDA's JIT cache, XDG_CACHE_HOME), so that cold is cold for
LiteRT too. (Taichi's own offline cache is off in tflite_taichi: the kernel cache is ours.)

    from tflite_taichi.tools.bench import bench_model, default_backends, render_markdown
    result = bench_model("model.tflite", default_backends(), runs=100, warmup=10)

`bench/bench.py` is the many-model command (markdown, JSON, PNG); `tflite-taichi bench MODEL` is
the one-model form with a progress bar.
"""
from __future__ import annotations

import datetime
import importlib.metadata
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
import threading
from typing import Optional, Sequence

import numpy as np

from tflite_taichi.runtime.children import python_script_command

LITERT = "litert"
LITERT_GPU = "litert_gpu"
LITERT_GPU_FP16 = "litert_gpu_fp16"
LITERT_GPUS = (LITERT_GPU, LITERT_GPU_FP16)
LITERTS = (LITERT,) + LITERT_GPUS
REFERENCE = "reference"
TAICHI_BACKENDS = ("cuda", "vulkan", "metal", "opengl", "gles", "cpu")
AUTO = "auto"
KNOWN_BACKENDS = LITERTS + (REFERENCE, AUTO) + TAICHI_BACKENDS
SEED = 0
CHILD_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bench_child.py")

# The drivers' caches a start can hit, each pointed at a subfolder of the run's cache folder
# (the same subfolders tflite_taichi.runtime.cache uses); TFLITE_TAICHI_CACHE_DIR is the folder itself.
CACHE_ENV = {
    "MESA_SHADER_CACHE_DIR": "mesa",               # lavapipe / llvmpipe / Mesa GPU drivers
    "__GL_SHADER_DISK_CACHE_PATH": "nvidia-gl",    # NVIDIA's GL/Vulkan shader cache
    "CUDA_CACHE_PATH": "cuda",                     # CUDA's PTX JIT cache
    "XDG_CACHE_HOME": "xdg",                       # anything else that follows XDG
}


# -- which backends ----------------------------------------------------------------------------
def litert_available() -> bool:
    try:
        import importlib.util
        return importlib.util.find_spec("ai_edge_litert") is not None
    except (ImportError, ValueError):
        return False


def default_backends(litert: bool = True) -> list:
    """LiteRT CPU (when installed), LiteRT GPU fp32 (when installed and a hardware GPU backend of
    ours was found: never on a CPU-only machine, where it cannot start), `reference`, then every
    Taichi backend `auto` would consider that runs a kernel here: hardware GPUs (software devices
    such as lavapipe/llvmpipe are skipped unless named) and Taichi's `cpu`. Probing starts a
    subprocess per GPU backend."""
    from tflite_taichi import backend as ti_backend
    gpus_found = []
    for name in TAICHI_BACKENDS:
        if name == "cpu" or (name == "metal" and sys.platform != "darwin"):
            continue
        ok, software, _ = ti_backend.probe(name)
        if ok and not software:
            gpus_found.append(name)
    names = []
    if litert and litert_available():
        names.append(LITERT)
        if gpus_found:
            names.append(LITERT_GPU)
    names.append(REFERENCE)
    return names + gpus_found + ["cpu"]


def device_of(backend: str, threads: Optional[int] = None) -> dict:
    """What a backend runs on: {'device': text, 'software': bool or None, 'ok', 'detail'}.
    GPU backends of ours are probed (a subprocess each, cached per process); a named backend
    that does not start is reported, not raised. LiteRT GPU is not probed: where it does not
    start, its row says why."""
    if backend in LITERTS:
        ok = litert_available()
        device = (f"CPU, XNNPACK, {threads} thread(s)" if backend == LITERT else
                  "GPU, LiteRT ML Drift (WebGPU/Vulkan), "
                  + ("fp32" if backend == LITERT_GPU else "fp16"))
        return {"ok": ok, "device": device, "software": None,
                "detail": "" if ok else "ai_edge_litert is not installed"}
    if backend == REFERENCE:
        return {"ok": True, "device": "CPU, numpy", "software": None, "detail": ""}
    if backend == "cpu":
        return {"ok": True, "device": f"CPU, Taichi LLVM ({cpu_model()})", "software": None, "detail": ""}
    if backend == AUTO:
        from tflite_taichi import backend as ti_backend
        chosen = ti_backend.choose_auto()
        where = (f"cpu: Taichi LLVM + numpy for {', '.join(sorted(ti_backend.cpu_reference_ops()))}"
                 if chosen == "cpu" else chosen)
        return {"ok": True, "device": f"auto -> {where}", "software": None, "detail": ""}
    from tflite_taichi import backend as ti_backend
    if backend == "metal" and sys.platform != "darwin":
        return {"ok": False, "device": "", "software": None, "detail": "Metal needs macOS"}
    ok, software, detail = ti_backend.probe(backend)
    if not ok:
        return {"ok": False, "device": "", "software": None, "detail": detail}
    device = detail or backend
    if device.count("(") > device.count(")"):      # the probe's name loses its last ')'
        device += ")"
    return {"ok": True, "device": device + (", software" if software else ""),
            "software": software, "detail": ""}


def check_backends(backends: Sequence[str]) -> list:
    """The backends named (a comma-separated item counts as several; `litert-gpu` is
    `litert_gpu`), once each, in order; ValueError for a name that is not one."""
    backends = [b.strip().replace("-", "_") for item in backends for b in item.split(",") if b.strip()]
    unknown = [b for b in backends if b not in KNOWN_BACKENDS]
    if unknown:
        raise ValueError(f"unknown backend(s) {unknown}; choose from {', '.join(KNOWN_BACKENDS)}")
    return list(dict.fromkeys(backends))


# -- inputs, outputs ---------------------------------------------------------------------------
def make_inputs(model_path: str, seed: int = SEED, shapes=None) -> list:
    """Seeded random inputs for the model, as `tflite-taichi run` makes them
    (testing.model_random_inputs: uniform in [0, 1) for floats, the full range for quantized
    integers, ids and indices within what their ops accept), from our reference path: no
    Taichi, no LiteRT."""
    return inputs_and_io(model_path, seed, shapes)[0]


def inputs_and_io(model_path: str, seed: int = SEED, shapes=None) -> tuple:
    """make_inputs and model_io from one reference Interpreter (one read of the model)."""
    from tflite_taichi.testing import model_random_inputs
    it = _sized(model_path, shapes)
    it.allocate_tensors()       # shapes and readers: ids are drawn within their table
    return model_random_inputs(it, np.random.default_rng(seed)), _io_of(it)


def _sized(model_path: str, shapes=None):
    """A reference Interpreter of the model with its inputs resized to `shapes` (--shape
    NAME=D1,D2 arguments, held to the declared shape: cli_inputs.apply_shapes)."""
    from tflite_taichi.cli_inputs import apply_shapes
    from tflite_taichi.interpreter import Interpreter
    it = Interpreter(model_path=model_path, backend=REFERENCE)
    apply_shapes(it, shapes)
    return it


def model_io(model_path: str, shapes=None) -> dict:
    """The model's inputs and outputs, in its order: {'inputs': [{'name', 'shape'}], 'outputs':
    [...]} (from our reader, at the --shape sizes). The child matches each runtime's tensors to
    these (by name, else by shape or size), so that inputs are set and outputs compared tensor
    for tensor, and resizes an input the model declares at another size."""
    it = _sized(model_path, shapes)
    if shapes:
        it.allocate_tensors()       # outputs at the inputs' sizes
    return _io_of(it)


def _io_of(it) -> dict:
    return {kind: [{"name": d["name"], "shape": [int(n) for n in d["shape"]]} for d in details]
            for kind, details in (("inputs", it.get_input_details()),
                                  ("outputs", it.get_output_details()))}


def relative_diff(outputs: Sequence[np.ndarray], expected: Sequence[np.ndarray]) -> float:
    """max over outputs of max|y - e| / max|e| (float64; inf on a shape mismatch or a NaN where
    the oracle has none)."""
    worst = 0.0
    if len(outputs) != len(expected):
        return float("inf")
    for y, e in zip(outputs, expected):
        if np.shape(y) != np.shape(e):
            return float("inf")
        y, e = np.asarray(y, np.float64), np.asarray(e, np.float64)
        if y.size == 0:
            continue
        if not np.array_equal(np.isnan(y), np.isnan(e)):
            return float("inf")
        finite = np.isfinite(e)
        if not np.array_equal(y[~finite & ~np.isnan(e)], e[~finite & ~np.isnan(e)]):
            return float("inf")
        if not finite.any():
            continue
        scale = max(float(np.max(np.abs(e[finite]))), np.finfo(np.float32).tiny)
        worst = max(worst, float(np.max(np.abs(y[finite] - e[finite]))) / scale)
    return worst


def _load_outputs(path: str) -> list:
    with np.load(path) as data:
        return [data[f"output_{i}"] for i in range(len(data.files))]


# -- one backend, one stage: a subprocess ------------------------------------------------------
def cache_env(cache_dir: str) -> dict:
    """Environment variables that point every cache we know of into `cache_dir`: the drivers'
    (CACHE_ENV) and ours (TFLITE_TAICHI_CACHE_DIR, though the child also passes cache_dir)."""
    env = {var: os.path.join(cache_dir, sub) for var, sub in CACHE_ENV.items()}
    env["TFLITE_TAICHI_CACHE_DIR"] = cache_dir
    return env


def _child_env(backend: str, cache_dir: str) -> dict:
    env = dict(os.environ)
    if backend in ("opengl", "gles"):
        from tflite_taichi.backend import _env_for
        env = _env_for(backend)
    env.update(cache_env(cache_dir))
    env.setdefault("ENABLE_TAICHI_HEADER_PRINT", "False")
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _run_child(spec: dict, workdir: str, env: dict, timeout: float, progress) -> dict:
    """Run bench_child.py on `spec`; its result dict (ok False with the reason on a failure)."""
    name = f"{spec['backend']}-{spec['stage']}"
    spec = dict(spec, result=os.path.join(workdir, f"{name}.result.json"),
                sys_path=[p for p in sys.path if p and os.path.isdir(p)])
    spec_path = os.path.join(workdir, f"{name}.spec.json")
    with open(spec_path, "w") as f:
        json.dump(spec, f)
    log_path = os.path.join(workdir, f"{name}.log")
    killed = []

    with open(log_path, "w") as log:
        proc = subprocess.Popen(python_script_command(CHILD_SCRIPT, spec_path),
                                stdout=subprocess.PIPE, stderr=log, text=True, env=env)

        def kill():
            killed.append(True)
            proc.kill()
        timer = threading.Timer(timeout, kill)
        timer.start()
        other, stage = [], None
        try:
            for line in proc.stdout:
                if line.startswith("@@bench "):
                    _, now_stage, n = line.split()
                    if progress is not None:
                        if now_stage != stage and hasattr(progress, "describe"):
                            progress.describe(f"{spec['backend']}: {now_stage}")
                        progress.update(int(n))
                    stage = now_stage
                elif line.strip():
                    other.append(line.rstrip())
            code = proc.wait()
        finally:
            timer.cancel()
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    if os.path.exists(spec["result"]):
        with open(spec["result"]) as f:
            result = json.load(f)
        if not result.get("ok") and spec["backend"] in LITERTS:
            # LiteRT's exceptions name a source line; what went wrong is in its log
            said = log_errors(log_path)
            if said:
                raised = str(result.get("error"))
                result["raised"] = raised
                result["error"] = f"{said} (LiteRT's log; it raised {raised.split(':')[0]})"
        return result
    with open(log_path) as f:
        tail = [l for l in f.read().splitlines() + other if l.strip()][-3:]
    why = f"killed after {timeout:.0f} s" if killed else f"the process died (exit code {code})"
    return {"ok": False, "error": f"{why}: {' | '.join(tail)[-400:]}"}


_LOG_ERROR = (re.compile(r"ERROR:\s*(?:\[[^\]]*\]\s*)?(.*)$"),       # LiteRT: ERROR: [file:line] what
              re.compile(r"E\d{4} [^\]]*\]\s*(.*)$"))                   # glog: E0000 time pid file:line] what
_LOG_ALWAYS = ("Failed to modify graph with delegate", "No adapters found")
_LOG_NOISE = ("compiler_plugin", "Could not load shared library", "Source Location Trace")


def log_errors(log_path: str, limit: int = 400) -> str:
    """What a LiteRT log says went wrong: its error lines ('ERROR: [file:line] what', glog's
    'E0000 ... file:line] what') without the prefixes, and any line naming a known failure
    (a refused model, no GPU adapter); not the vendor-plugin noise; '; '-joined, once each."""
    try:
        with open(log_path, errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return ""
    said = []
    for line in lines:
        line = line.strip()
        if any(n in line for n in _LOG_NOISE):
            continue
        what = next((m.group(1).strip() for m in (p.match(line) for p in _LOG_ERROR) if m), "")
        if not what:
            what = next((line[line.index(k):] for k in _LOG_ALWAYS if k in line), "")
        if what and what not in said:
            said.append(what)
    return "; ".join(said)[:limit]


def _stats(times_ms: Sequence[float]) -> dict:
    t = np.asarray(times_ms, np.float64)
    return {"runs": int(t.size), "median": float(np.median(t)), "p10": float(np.percentile(t, 10)),
            "p90": float(np.percentile(t, 90)), "min": float(t.min()), "max": float(t.max()),
            "mean": float(t.mean())}


def units_per_backend(runs: int, warmup: int) -> int:
    """Progress units one backend takes: cold start, warm start, warm-up and timed steps."""
    return 2 + max(warmup, 1) + runs


def precision_of(backend: str, precision: str = "fp32") -> str:
    """The precision a row runs at: LiteRT CPU and the reference fp32, LiteRT GPU by its name,
    ours as asked."""
    if backend in (LITERT, LITERT_GPU, REFERENCE):
        return "fp32"
    if backend == LITERT_GPU_FP16:
        return "fp16"
    return precision


def bench_backend(model_path: str, backend: str, inputs_npz: str, workdir: str, *,
                  threads: int, runs: int, warmup: int, precision: str = "fp32",
                  cache_dir: Optional[str] = None, profile: bool = False,
                  timeout: float = 1800.0, progress=None, io: Optional[dict] = None) -> dict:
    """One backend on one model: cold start, warm start, latency; a row of the table (without the
    comparison with the oracle: bench_model adds it). io: model_io(model_path), if known."""
    row = {"backend": backend, "precision": precision_of(backend, precision),
           "ok": False, "error": None}
    if backend == LITERT:
        row["threads"] = threads
    own_cache = cache_dir is None
    cache = cache_dir or tempfile.mkdtemp(prefix=f"cache-{backend}-", dir=workdir)
    row["cache"] = {"dir": None if own_cache else cache,
                    "cold": "new empty folder" if own_cache else "as given",
                    "warm": "as the cold run left it"}
    spec = {"model": os.path.abspath(model_path), "backend": backend, "precision": row["precision"],
            "threads": threads, "runs": runs, "warmup": max(warmup, 1), "profile": profile,
            "inputs": inputs_npz, "outputs": os.path.join(workdir, f"{backend}.outputs.npz"),
            "io": io or model_io(model_path), "cache_dir": cache}
    env = _child_env(backend, cache)
    counter = _Counter(progress)
    ours = backend not in LITERTS
    try:
        for stage in ("cold", "warm"):
            counter.describe(f"{backend}: {stage} start")
            result = _run_child(dict(spec, stage=stage), workdir, env, timeout, counter)
            if not result.get("ok"):
                row["error"] = f"{stage} run: {result.get('error')}"
                if result.get("raised"):
                    row["raised"] = result["raised"]
                return row
            row[stage] = dict(result["start"])
            summary = result.get("summary") or {}
            cache_info = summary.get("cache") or {}
            row[stage]["cache_state"] = cache_info.get("state")
            row[stage]["cache_reason"] = cache_info.get("reason")
            row[stage]["cache_dir"] = cache_info.get("dir")
            row[stage]["build_s"] = (summary.get("runtime") or {}).get("build_s")
    finally:                  # keep the bar's total honest whatever happened
        counter.update(max(units_per_backend(runs, warmup) - counter.n, 0))
    row["warm_pct"] = (100.0 * row["warm"]["start_s"] / row["cold"]["start_s"]
                       if row["cold"]["start_s"] > 0 else None)
    row["second_step_ms"] = result["second_step_ms"]
    row["latency_ms"] = _stats(result["times_ms"])
    row["times_ms"] = result["times_ms"]
    row["invoke_ms"] = _stats(result["invoke_times_ms"])
    row["invoke_median_ms"] = row["invoke_ms"]["median"]
    row["matched"] = result.get("matched")
    if "fully_accelerated" in result:
        row["fully_accelerated"] = result["fully_accelerated"]
    if "cuda_context" in result:
        row["cuda_context"] = result["cuda_context"]
    if ours:
        s = result["summary"]
        runtime = s.get("runtime")
        row.update({"ops_total": s["ops_total"], "ops_delegated": s["ops_delegated"],
                    "ops_folded": s["ops_folded"], "ops_cpu": s["ops_cpu"],
                    "partitions": s["partitions"],
                    # nothing delegated (the reference): no launches, no waits, no device
                    "launches_per_invoke": runtime["launches_per_invoke"] if runtime else 0,
                    "waits_per_invoke": runtime["waits_per_invoke"] if runtime else 0,
                    # Taichi tasks (GPU dispatches) per invoke; None where the module does not say
                    "tasks_per_invoke": runtime.get("tasks_per_invoke") if runtime else 0,
                    "device_kind": runtime["device"] if runtime else None,
                    "cache_state": row["warm"]["cache_state"]})
        for key in ("host_wait", "perf_boost"):         # vulkan: vulkan_host.py
            if runtime and key in runtime:
                row[key] = runtime[key]
    if "profile" in result:
        row["profile"] = result["profile"]
    row["outputs"] = spec["outputs"]
    row["ok"] = True
    return row


class _Counter:
    """Forwards progress to a tqdm-like bar (or nowhere) and counts it."""

    def __init__(self, bar):
        self.bar, self.n = bar, 0

    def update(self, n: int) -> None:
        self.n += n
        if self.bar is not None and n:
            self.bar.update(n)

    def describe(self, text: str) -> None:
        if self.bar is not None and hasattr(self.bar, "set_postfix_str"):
            self.bar.set_postfix_str(text, refresh=False)


def bench_model(model_path: str, backends: Optional[Sequence[str]] = None, *,
                threads: Optional[int] = None, runs: int = 100, warmup: int = 10,
                precision: str = "fp32", seed: int = SEED, cache_dir: Optional[str] = None,
                profile: bool = False, timeout: float = 1800.0, progress=None,
                devices: Optional[dict] = None, workdir: Optional[str] = None,
                shapes=None) -> dict:
    """Benchmark one model on each backend in turn (never two at once). Returns
    {'model', 'path', 'inputs', 'oracle', 'rows'}: one row per backend (see bench_backend), each
    with 'max_rel_diff' against the oracle (LiteRT CPU if it ran, else the reference).
    progress: a tqdm-like object (update(n), set_postfix_str(s, refresh)) or None.
    devices: backend -> device_of(...) already computed (bench/bench.py probes once).
    shapes: --shape NAME=D1,D2 arguments for inputs the model sizes at run time."""
    if runs < 1:
        raise ValueError("runs must be >= 1")
    backends = check_backends(backends if backends is not None else default_backends())
    threads = threads or os.cpu_count() or 1
    devices = dict(devices or {})
    own_workdir = workdir is None
    workdir = workdir or tempfile.mkdtemp(prefix="tflite_taichi_bench_")
    name = os.path.splitext(os.path.basename(model_path))[0]
    try:
        model_dir = os.path.join(workdir, name)
        os.makedirs(model_dir, exist_ok=True)
        inputs, io = inputs_and_io(model_path, seed, shapes)
        inputs_npz = os.path.join(model_dir, "inputs.npz")
        np.savez(inputs_npz, **{f"input_{i}": x for i, x in enumerate(inputs)})
        rows = []
        for backend in backends:
            device = devices.get(backend) or device_of(backend, threads)
            devices[backend] = device
            if not device["ok"]:
                row = {"backend": backend, "ok": False, "error": f"does not start here: {device['detail']}"}
                if progress is not None:
                    progress.update(units_per_backend(runs, warmup))
            else:
                row = bench_backend(model_path, backend, inputs_npz, model_dir, threads=threads,
                                    runs=runs, warmup=warmup, precision=precision,
                                    cache_dir=cache_dir, profile=profile, timeout=timeout,
                                    progress=progress, io=io)
            row["device"] = device.get("device", "")
            row["software"] = device.get("software")
            rows.append(row)
        oracle = next((b for b in (LITERT, REFERENCE) for r in rows if r["backend"] == b and r["ok"]), None)
        expected = _load_outputs(next(r for r in rows if r["backend"] == oracle)["outputs"]) if oracle else None
        for row in rows:
            if row["ok"]:
                row["max_rel_diff"] = None if expected is None else relative_diff(
                    _load_outputs(row.pop("outputs")), expected)
            row.pop("outputs", None)
        return {"model": name, "path": os.path.abspath(model_path), "oracle": oracle, "seed": seed,
                "inputs": [{"shape": list(x.shape), "dtype": x.dtype.name} for x in inputs],
                "runs": runs, "warmup": max(warmup, 1), "threads": threads, "rows": rows}
    finally:
        if own_workdir:
            shutil.rmtree(workdir, ignore_errors=True)


# -- the machine and the versions --------------------------------------------------------------
def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def gpus() -> list:
    """nvidia-smi's GPUs (name, driver, memory), when nvidia-smi is there."""
    if not shutil.which("nvidia-smi"):
        return []
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                              "--format=csv,noheader"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return []
    return [l.strip() for l in out.stdout.splitlines() if l.strip()] if out.returncode == 0 else []


def machine_info() -> dict:
    info = {"cpu": cpu_model(), "cores": os.cpu_count(), "os": platform.platform(),
            "gpus": gpus()}
    if hasattr(os, "sched_getaffinity"):
        info["cores_usable"] = len(os.sched_getaffinity(0))
    try:
        with open("/proc/meminfo") as f:
            kb = int(next(l for l in f if l.startswith("MemTotal")).split()[1])
        info["memory_gib"] = round(kb / 2**20, 1)
    except (OSError, StopIteration, ValueError):
        pass
    if hasattr(os, "getloadavg"):
        info["loadavg"] = [round(x, 2) for x in os.getloadavg()]
    return info


def versions() -> dict:
    out = {"python": platform.python_version(), "numpy": np.__version__}
    for dist in ("taichi", "ai-edge-litert", "tflite-taichi"):
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = "not installed"
    try:
        here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        commit = subprocess.run(["git", "-C", here, "rev-parse", "--short=12", "HEAD"],
                                capture_output=True, text=True, timeout=10)
        if commit.returncode == 0:
            # a tree with uncommitted changes to tracked files is not that commit: say so
            changed = subprocess.run(["git", "-C", here, "status", "--porcelain", "--untracked-files=no"],
                                     capture_output=True, text=True, timeout=10)
            dirty = "+changes" if changed.returncode == 0 and changed.stdout.strip() else ""
            out["tflite-taichi commit"] = commit.stdout.strip() + dirty
    except (OSError, subprocess.SubprocessError):
        pass
    return out


def now() -> str:
    return datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")


# -- reports -------------------------------------------------------------------------------------
def _f(x, fmt):
    return "-" if x is None else format(x, fmt)


def _n(x) -> str:
    """A time for the table: three significant digits, no exponent for the usual ranges."""
    if x is None:
        return "-"
    if x >= 100:
        return f"{x:.0f}"
    if x >= 10:
        return f"{x:.1f}"
    if x >= 0.01:
        return f"{x:.2f}"
    return f"{x:.3g}"


def _label(row) -> str:
    b = row["backend"]
    if b == LITERT:
        return f"litert ({row.get('threads')} thr)"
    if b in LITERT_GPUS:
        return b
    return b + (" fp16" if row.get("precision") == "fp16" else "")


def _pct(x) -> str:
    return "-" if x is None else f"{x:.0f}%"


TABLE_HEAD = ["model", "backend", "device", "cold start s", "warm start s", "warm / cold",
              "warm-run cache", "median ms (step)", "p10-p90 ms", "min ms", "launches / invoke",
              "waits / invoke", "device kind", "ops GPU / CPU", "max rel. diff"]


def table_rows(results: Sequence[dict]) -> list:
    """The table as a list of rows of strings (header first)."""
    lines = [list(TABLE_HEAD)]
    for res in results:
        for r in res["rows"]:
            if not r["ok"]:
                lines.append([res["model"], _label(r), r.get("device") or "-",
                              f"error: {r['error']}"[:300].replace("|", "/").replace("\n", " ")]
                             + ["-"] * (len(TABLE_HEAD) - 4))
                continue
            lat = r["latency_ms"]
            ours = r["backend"] not in LITERTS
            if r["backend"] in LITERT_GPUS:
                ops = {True: "all (fully accelerated)", False: "partly"}.get(r.get("fully_accelerated"), "-")
            elif ours:
                ops = f"{r.get('ops_delegated', 0)} / {r.get('ops_cpu', '-')}"
            else:
                ops = "-"
            diff = ("(oracle)" if r["backend"] == res["oracle"] else _f(r.get("max_rel_diff"), ".1e"))
            lines.append([
                res["model"], _label(r), r.get("device") or "-",
                _n(r["cold"]["start_s"]), _n(r["warm"]["start_s"]), _pct(r.get("warm_pct")),
                (r.get("cache_state") or "-") if ours else "-",
                _n(lat["median"]), f"{_n(lat['p10'])}-{_n(lat['p90'])}", _n(lat["min"]),
                str(r.get("launches_per_invoke", "-")) if ours else "-",
                str(r.get("waits_per_invoke", "-")) if ours else "-",
                (r.get("device_kind") or "-") if ours else "-",
                ops, diff])
    return lines


def _markdown(lines: list) -> str:
    """Rows of strings (header first) as a markdown table."""
    out = ["| " + " | ".join(lines[0]) + " |", "|" + " --- |" * len(lines[0])]
    out += ["| " + " | ".join(l) + " |" for l in lines[1:]]
    return "\n".join(out)


def render_table(results: Sequence[dict]) -> str:
    return _markdown(table_rows(results))


# the terminal's table by default: what a user compares, in at most 100 columns (--wide: all);
# each model's name heads its rows (a model column would take a long name's width on every row)
COMPACT_HEAD = ["runtime", "step ms", "p10-p90 ms", "start s cold/warm", "ops ours/CPU",
                "max rel. diff"]


def compact_rows(results: Sequence[dict]) -> list:
    """(model, cells) per row of the table's columns a user compares; the devices go in
    devices_text."""
    rows = []
    for line in table_rows(results)[1:]:
        model, label, _device, cold, warm = line[:5]
        if line[3].startswith("error: "):
            rows.append((model, [label, line[3]]))
            continue
        rows.append((model, [label, line[7], line[8], f"{cold}/{warm}", line[13], line[14]]))
    return rows


def render_compact(results: Sequence[dict]) -> str:
    """The compact table: a heading line per model, its runtimes' rows under it, aligned (a
    failed row's reason runs on), then what each runtime ran on."""
    rows = compact_rows(results)
    ok = [cells for _, cells in rows if len(cells) == len(COMPACT_HEAD)]
    widths = [max(len(c[i]) for c in ok + [COMPACT_HEAD]) for i in range(len(COMPACT_HEAD))]
    widths[0] = max([widths[0]] + [len(cells[0]) for _, cells in rows])

    def line(cells):
        return ("  " + "  ".join(c.ljust(w) for c, w in zip(cells, widths))).rstrip()
    out, model = [line(COMPACT_HEAD)], None
    for name, cells in rows:
        if name != model:
            out.append(f"{name}:")
            model = name
        out.append(line(cells) if len(cells) == len(COMPACT_HEAD)
                   else "  " + cells[0].ljust(widths[0]) + "  " + cells[1])
    out.append("ran on:")
    out.append(devices_text(results))
    return "\n".join(out)


def devices_text(results: Sequence[dict]) -> str:
    """What each runtime ran on, one line each, whole (a table cell would cut or widen it)."""
    seen = {}
    for res in results:
        for r in res["rows"]:
            seen.setdefault(_label(r), r.get("device") or "-")
    # a device's description can run to 250 characters (several GPUs, a driver's long name):
    # wrapped to a terminal's width, continued under its label
    return "\n".join(textwrap.fill(f"{label}: {device}", width=DEVICE_LINE_WIDTH, initial_indent="  ",
                                   subsequent_indent="      ", break_on_hyphens=False)
                     for label, device in seen.items())


DEVICE_LINE_WIDTH = 100


def render_text(results: Sequence[dict], wide: bool = True) -> str:
    """The table for a terminal: aligned columns; wide=False the compact form (render_compact)."""
    if not wide:
        return render_compact(results)
    lines = table_rows(results)
    failed = [l[3].startswith("error: ") for l in lines]
    widths = [max(len(l[i]) for l, bad in zip(lines, failed) if not bad or i < 3)
              for i in range(len(lines[0]))]
    out = []
    for l, bad in zip(lines, failed):      # a row that failed: its reason runs on, unaligned
        cells = l[:4] if bad else l
        out.append("  ".join(c.ljust(w) for c, w in zip(cells, widths[:len(cells) - 1] + [0])).rstrip())
    return "\n".join(out)


GPU_BACKENDS = ("cuda", "vulkan", "metal", "opengl", "gles")


def _speed_label(backend: str, row: Optional[dict]) -> str:
    if backend == LITERT:
        return f"LiteRT CPU {row.get('threads')} thr" if row else "LiteRT CPU"
    if backend in LITERT_GPUS:
        return "LiteRT GPU" + (" fp16" if backend == LITERT_GPU_FP16 else "")
    return backend + (" fp16" if row and row.get("precision") == "fp16" else "")


def _refusal(row: dict) -> str:
    """A short cell for a row that did not run: LiteRT GPU's two usual reasons by name."""
    error = (row.get("error") or "").lower()
    if "no adapters found" in error:
        return "no GPU adapter"
    if "delegate" in error and row["backend"] in LITERT_GPUS:
        return "refuses the model"
    return "error"


def speed_rows(results: Sequence[dict]) -> list:
    """One row per model: the step median (ms) of every runtime side by side, the fastest in
    bold, then where both ran, our fastest backend against the faster LiteRT (CPU or GPU), in
    words: "2.00x faster" or "18.25x slower" (a bare ratio read as a speed-up either way). Header first; a runtime that did not run says why in a word."""
    backends = list(dict.fromkeys(r["backend"] for res in results for r in res["rows"]))
    first_rows = {b: next((r for res in results for r in res["rows"] if r["backend"] == b and r["ok"]), None)
                  for b in backends}
    head = ["model"] + [_speed_label(b, first_rows[b]) for b in backends]
    theirs = [b for b in backends if b in LITERTS]
    ours = [b for b in backends if b not in LITERTS]
    with_ratio = bool(theirs and ours)
    if with_ratio:
        head.append(RATIO_HEAD)
    lines = [head]
    for res in results:
        rows = {r["backend"]: r for r in res["rows"]}
        median = {b: r["latency_ms"]["median"] for b, r in rows.items() if r["ok"]}
        fastest = min(median.values()) if median else None
        cells = [res["model"]]
        for b in backends:
            r = rows.get(b)
            if r is None:
                cells.append("-")
            elif not r["ok"]:
                cells.append(_refusal(r))
            else:
                cell = f"{_n(median[b])} ms"
                cells.append(f"**{cell}**" if median[b] == fastest and len(median) > 1 else cell)
        if with_ratio:
            lite = [median[b] for b in theirs if b in median]
            mine = [median[b] for b in ours if b in median]
            cells.append(_against_litert(min(mine), min(lite)) if lite and mine else "-")
        lines.append(cells)
    return lines


RATIO_HEAD = "ours vs LiteRT"


def _against_litert(ours_ms: float, litert_ms: float) -> str:
    """Our time against LiteRT's, as a reader says it: "2.00x faster", "18.25x slower"."""
    if ours_ms == litert_ms:
        return "as fast"
    if ours_ms < litert_ms:
        return f"{litert_ms / ours_ms:.2f}x faster"
    return f"{ours_ms / litert_ms:.2f}x slower"


def render_speed_table(results: Sequence[dict]) -> str:
    return _markdown(speed_rows(results))


def render_speed_text(results: Sequence[dict]) -> str:
    lines = [[c.replace("**", "") for c in l] for l in speed_rows(results)]
    widths = [max(len(l[i]) for l in lines) for i in range(len(lines[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(l, widths)).rstrip() for l in lines)


def phases_table(results: Sequence[dict]) -> str:
    """Where the starts go: import, construct, allocate, first step (cold / warm), then the
    second step and the invoke alone (median of the timed steps), the cache."""
    out = ["| model | backend | import s | construct s | allocate s | first step s | "
           "second step ms | invoke-only median ms | cache files before warm run | "
           "cache state | kernel build s |", "|" + " --- |" * 11]
    for res in results:
        for r in res["rows"]:
            if not r["ok"]:
                continue
            c, w = r["cold"], r["warm"]
            pair = "{} / {}".format
            state = "-" if c.get("cache_state") is None else pair(c["cache_state"], w.get("cache_state"))
            build = "-" if c.get("build_s") is None else pair(_n(c["build_s"]), _n(w.get("build_s")))
            out.append(f"| {res['model']} | {_label(r)} | {pair(_n(c['import_s']), _n(w['import_s']))} | "
                       f"{pair(_n(c['construct_s']), _n(w['construct_s']))} | "
                       f"{pair(_n(c['allocate_s']), _n(w['allocate_s']))} | "
                       f"{pair(_n(c['first_invoke_s']), _n(w['first_invoke_s']))} | "
                       f"{_n(r['second_step_ms'])} | {_n(r.get('invoke_median_ms'))} | "
                       f"{w['cache_files_before']} | {state} | {build} |")
    return "\n".join(out)


METHOD = """\
How (tflite_taichi/tools/bench.py): every backend runs in fresh subprocesses, one after the other.
A *step* is what a user's loop does: set every input, invoke, get every output (LiteRT CPU and ours:
`set_tensor` / `invoke` / `get_tensor`; LiteRT GPU: `TensorBuffer.write` / `run_by_index` / `read`).
*Cold start*: a new process with a new, empty cache folder (passed as `cache_dir` to our Interpreter,
and Mesa's, NVIDIA's and CUDA's caches and XDG_CACHE_HOME pointed into it), seconds from constructing
the runtime to the end of the first result (construct, allocate, the first step: where Taichi compiles
or loads its kernels); importing the runtime is not in it (see the phases table). *Warm start*: a
second new process with the cache folder as the cold run left it; *warm / cold*: warm as a percentage
of cold; *warm-run cache*: our cache's state in that process (`summary()["cache"]`). *Latency*: in that
second process, {warmup} warm-up steps then {runs} timed steps with the garbage collector off: median,
p10-p90, min (the invoke alone, inside the same steps, is in the phases table). *Launches / waits*:
kernel launches and host waits per invoke, *device kind*: `capi` (Taichi's C API) or `python` (its
Python runtime), from `summary()["runtime"]` (ours). *ops GPU / CPU*: ops run by the delegate / on
the numpy path (folded ones in neither); for LiteRT GPU whether it is fully accelerated. *max rel.
diff*: max |output - {oracle}| / max |{oracle} output| over every output (matched by name), for the
same seeded input (uniform [0, 1)). LiteRT CPU: its default resolver (XNNPACK) with {threads}
thread(s); LiteRT GPU: CompiledModel on the GPU accelerator (ML Drift), `GpuOptions(enforce_f32=True)`
for litert_gpu, the default (fp16) for litert_gpu_fp16; `reference` is numpy (its BLAS picks its own
threads); Taichi `cpu` uses every core."""


def render_markdown(report: dict) -> str:
    """The whole report: title, note, machine, versions, command, method, table, phases."""
    m, v = report["machine"], report["versions"]
    results = report["results"]
    first = results[0] if results else {"runs": 0, "warmup": 0, "threads": 0, "oracle": None}
    lines = [f"# {report.get('title') or 'Benchmark'}", ""]
    if report.get("note"):
        lines += [f"**Note:** {report['note']}", ""]
    lines += [
        f"Date: {report['date']}.",
        "",
        f"Machine: {m['cpu']}, {m['cores']} cores"
        + (f" ({m['cores_usable']} usable)" if m.get("cores_usable") not in (None, m["cores"]) else "")
        + (f", {m['memory_gib']} GiB" if m.get("memory_gib") else "")
        + f"; GPU: {', '.join(m['gpus']) if m['gpus'] else 'none (nvidia-smi: absent or no GPU)'}; {m['os']}."
        + (f" Load average at start {m['loadavg']}, at end {report.get('loadavg_end')}." if m.get("loadavg") else ""),
        "",
        "Versions: " + ", ".join(f"{k} {val}" for k, val in v.items()) + ".",
        "",
        "Command:",
        "",
        "    " + report["command"],
        "",
        METHOD.format(warmup=first["warmup"], runs=first["runs"], threads=first["threads"],
                      oracle="LiteRT CPU" if first.get("oracle") == LITERT else (first.get("oracle") or "oracle")),
        "",
        render_table(results),
        "",
        f"Step medians side by side (ms; the fastest in bold; {RATIO_HEAD}: our fastest against the "
        "faster LiteRT):",
        "",
        render_speed_table(results),
        "",
        "Where the starts go (cold / warm), and the invoke alone:",
        "",
        phases_table(results),
        "",
    ]
    if report.get("plot"):
        lines += [f"![median step latency, p10-p90]({report['plot']})", ""]
    elif report.get("plot_note"):
        lines += [report["plot_note"], ""]
    return "\n".join(lines)


def plot(results: Sequence[dict], path: str) -> Optional[str]:
    """A bar chart of median latency with p10-p90 error bars, per model and backend (log scale).
    None when matplotlib is not installed (pip install 'tflite-taichi[bench]'), else the path."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    def legend(row):                    # no device column here: say what is a software device
        return _label(row) + (" (software device)" if row.get("software") else "")
    labels = list(dict.fromkeys(legend(r) for res in results for r in res["rows"] if r["ok"]))
    models = [res["model"] for res in results]
    width = 0.8 / max(len(labels), 1)
    fig, ax = plt.subplots(figsize=(max(6.0, 1.0 + len(models) * len(labels) * 0.45), 4.5))
    for j, label in enumerate(labels):
        xs, med, lo, hi = [], [], [], []
        for i, res in enumerate(results):
            row = next((r for r in res["rows"] if r["ok"] and legend(r) == label), None)
            if row is None:
                continue
            lat = row["latency_ms"]
            xs.append(i + (j - (len(labels) - 1) / 2) * width)
            med.append(lat["median"])
            lo.append(lat["median"] - lat["p10"])
            hi.append(lat["p90"] - lat["median"])
        ax.bar(xs, med, width, yerr=[lo, hi], capsize=3, label=label)
    ax.set_xticks(range(len(models)))
    ax.set_xticklabels(models)
    ax.set_yscale("log")
    ax.set_ylabel("step latency (set, invoke, get), ms\n(median; bars p10-p90)")
    ax.legend(fontsize="small")
    ax.grid(axis="y", which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def make_report(results: Sequence[dict], command: str, machine: dict, *, title: str = "",
                note: str = "", started: Optional[str] = None) -> dict:
    """The report write_report writes; `started`: now() when the run began (machine_info() too)."""
    date = f"{started} to {now()}" if started else now()
    return {"title": title, "note": note, "date": date, "command": command, "machine": machine,
            "versions": versions(), "results": list(results),
            "loadavg_end": [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None}


def write_report(report: dict, out: str) -> list:
    """Writes OUT.json (raw numbers), OUT.png (when matplotlib is there) and OUT.md; returns the
    paths written."""
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    written = []
    png = plot(report["results"], out + ".png")
    if png:
        report["plot"] = os.path.basename(png)
        written.append(png)
    else:
        report["plot_note"] = ("No plot: matplotlib is not installed "
                               "(pip install 'tflite-taichi[bench]').")
    with open(out + ".json", "w") as f:
        json.dump(report, f, indent=1)
    written.insert(0, out + ".json")
    with open(out + ".md", "w") as f:
        f.write(render_markdown(report))
    written.insert(0, out + ".md")
    return written


# -- the command line (tflite-taichi bench, bench/bench.py) --------------------------------------
def add_arguments(p, many: bool = False) -> None:
    """The options `tflite-taichi bench` and bench/bench.py share."""
    p.add_argument("--backends", nargs="+", metavar="B", default=None,
                   help="space- or comma-separated, from " + ", ".join(KNOWN_BACKENDS) + " (default: litert, "
                   "litert_gpu when a hardware GPU backend of ours starts, reference and every Taichi "
                   "backend auto would consider: hardware GPUs that start, and cpu; a software "
                   "Vulkan/OpenGL device runs when named). litert: LiteRT CPU (XNNPACK); litert_gpu, "
                   "litert_gpu_fp16: LiteRT's GPU path (CompiledModel, ML Drift) fp32 / fp16")
    p.add_argument("--threads", type=int, default=None, help="LiteRT's threads (default: every core)")
    p.add_argument("--runs", type=int, default=100,
                   help="timed steps (set inputs, invoke, get outputs; default 100)")
    p.add_argument("--warmup", type=int, default=10, help="warm-up steps before them (default 10)")
    p.add_argument("--precision", default="fp32", choices=("fp32", "fp16"),
                   help="for the Taichi backends (default fp32; LiteRT GPU: pick litert_gpu_fp16)")
    p.add_argument("--seed", type=int, default=SEED, help="of the random input (default 0)")
    p.add_argument("--profile", action="store_true",
                   help="run ours with profile=True and keep it.profile() in the JSON")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds per subprocess (default 1800)")
    p.add_argument("--shape", action="append", metavar="NAME=D1,D2",
                   help="an input's shape where the model sizes it at run time (-1 in its "
                        "signature, e.g. --shape audio=1,16000); every runtime runs at it, on "
                        "each model that has an input of that name")


def progress_bar(total: int, desc: str):
    """A tqdm bar on stderr (the table goes to stdout)."""
    from tqdm import tqdm
    return tqdm(total=total, desc=desc, unit="step", file=sys.stderr, dynamic_ncols=True,
                mininterval=0.5)


def bench_models(paths: Sequence[str], backends: Sequence[str], args, threads: int,
                 devices: dict) -> list:
    """bench_model for each path in turn, the options from `args` (add_arguments'), one
    progress bar on stderr over them all: what `tflite-taichi bench` and bench/bench.py run."""
    per_model = shapes_per_model(paths, getattr(args, "shape", None))
    bar = progress_bar(len(paths) * len(backends) * units_per_backend(args.runs, args.warmup),
                       "bench")
    results = []
    try:
        for path in paths:
            bar.set_description(os.path.splitext(os.path.basename(path))[0])
            results.append(bench_model(path, backends, threads=threads, runs=args.runs,
                                       warmup=args.warmup, precision=args.precision, seed=args.seed,
                                       profile=args.profile, timeout=args.timeout, progress=bar,
                                       devices=devices, shapes=per_model[path]))
    finally:
        bar.close()
    return results


def shapes_per_model(paths: Sequence[str], pairs) -> dict:
    """{model path: the --shape NAME=D1,D2 arguments naming one of its inputs}: each --shape
    applies to the models that have that input; a name no model has is a UsageError, said
    before anything runs."""
    from tflite_taichi.cli_inputs import UsageError, inputs_by_name, parse_shape_args
    from tflite_taichi.interpreter import Interpreter
    named = parse_shape_args(pairs)
    per_model, used = {}, set()
    for path in paths:
        inputs = inputs_by_name(Interpreter(model_path=path, backend="reference")) if named else {}
        per_model[path] = [pair for pair, name in zip(pairs or [], named) if name in inputs] or None
        used.update(name for name in named if name in inputs)
    unused = [name for name in named if name not in used]
    if unused:
        raise UsageError(f"--shape {unused[0]}: no model given has an input named {unused[0]!r}")
    return per_model


def run_cli(args) -> int:
    """`tflite-taichi bench MODEL [MODEL ...]`: the table on stdout (with the runtimes side by side
    when several ran), a progress bar on stderr; --out NAME writes NAME.md/.json/.png as
    bench/bench.py does, --json the results alone (one model: its result; several: a list)."""
    backends = check_backends(args.backends) if args.backends else default_backends()
    missing = [m for m in args.model if not os.path.isfile(m)]
    if missing:
        print(f"tflite-taichi: error: no model file {missing[0]}", file=sys.stderr)
        return 2
    threads = args.threads or os.cpu_count() or 1
    started, machine = now(), machine_info()
    devices = {b: device_of(b, threads) for b in backends}
    results = bench_models(args.model, backends, args, threads, devices)
    print(render_text(results, wide=getattr(args, "wide", False)))
    if len(backends) > 1:
        print()
        print(render_speed_text(results))
    if getattr(args, "json", None):
        with open(args.json, "w") as f:
            json.dump(results[0] if len(results) == 1 else results, f, indent=1)
    if getattr(args, "out", None):
        import shlex
        command = "tflite-taichi bench " + " ".join(
            shlex.quote(a) for a in (sys.argv[2:] if args.argv is None else args.argv))
        report = make_report(results, command, machine, title=args.title or
                             f"Benchmark: {', '.join(r['model'] for r in results)}", started=started)
        print("written: " + ", ".join(write_report(report, args.out)))
    # every row that did not run says why; the exit status is 1 when one of ours or LiteRT CPU
    # failed, not when LiteRT's GPU path has no hardware adapter here or refuses a model (a row
    # saying so is the answer there)
    failed = [(res["model"], r) for res in results for r in res["rows"] if not r["ok"]]
    for model, r in failed:
        print(f"{model} on {r['backend']}: {r['error']}", file=sys.stderr)
    return 1 if any(r["backend"] not in LITERT_GPUS for _, r in failed) else 0
