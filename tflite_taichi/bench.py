"""Benchmarks (issue #5): LiteRT and every backend of ours, side by side, in one run.

For one model and a list of backends, each backend is measured in fresh subprocesses (Taichi
runs one arch per process; LiteRT gets its own process too, so that every runtime starts from
the same state):

- cold start: a fresh process with a brand-new, empty cache folder; the seconds from
  `Interpreter(...)` to the end of the first invoke (construct + allocate_tensors + set_tensor +
  the first invoke, which is where Taichi compiles). Importing the runtime is measured apart
  (`import_s`), before the clock starts.
- warm start: a second fresh process, with the cache folder as the cold run left it.
- latency: in that second process, W warm-up invokes, then N timed invokes (garbage collector
  off): median, p10, p90, min, max in milliseconds. Only `invoke()` is timed: the inputs are set
  once, the outputs stay in the runtime's buffers (ours: copied back to the host inside invoke).
- launches per invoke, partitions and ops delegated / on the CPU, for our backends;
- the outputs of the last invoke compared with LiteRT's (or, without LiteRT, the reference's):
  max |ours - oracle| / max |oracle| over every output, so that a fast wrong answer shows.

Every backend gets the same seeded random input. The caches: `cache_dir=None` gives each
(model, backend) a new empty folder under the work folder, and points the caches we know of at
it through the environment (Taichi's offline cache, Mesa's and NVIDIA's shader caches, CUDA's
JIT cache, XDG_CACHE_HOME); a given `cache_dir` is used as it is. When the Interpreter takes a
`cache_dir` argument, the child passes it on as well (see _bench_child.py).

    from tflite_taichi.bench import bench_model, default_backends, render_markdown
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
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from typing import Optional, Sequence

import numpy as np

LITERT = "litert"
REFERENCE = "reference"
TAICHI_BACKENDS = ("cuda", "vulkan", "metal", "opengl", "gles", "cpu")
AUTO = "auto"
KNOWN_BACKENDS = (LITERT, REFERENCE, AUTO) + TAICHI_BACKENDS
SEED = 0
CHILD_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_bench_child.py")

# The caches a start can hit, each pointed at a subfolder of the run's cache folder.
CACHE_ENV = {
    "TI_OFFLINE_CACHE_FILE_PATH": "taichi",        # Taichi's offline cache (kernels, rhi cache)
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
    """LiteRT (when installed), `reference`, then every Taichi backend `auto` would consider that
    runs a kernel here: hardware GPUs (software devices such as lavapipe/llvmpipe are skipped
    unless named) and Taichi's `cpu`. Probing starts a subprocess per GPU backend."""
    from tflite_taichi import backend as ti_backend
    names = [LITERT] if litert and litert_available() else []
    names.append(REFERENCE)
    for name in TAICHI_BACKENDS:
        if name == "cpu" or (name == "metal" and sys.platform != "darwin"):
            continue
        ok, software, _ = ti_backend.probe(name)
        if ok and not software:
            names.append(name)
    names.append("cpu")
    return names


def device_of(backend: str, threads: Optional[int] = None) -> dict:
    """What a backend runs on: {'device': text, 'software': bool or None, 'ok', 'detail'}.
    GPU backends are probed (a subprocess each, cached per process); a named backend that does
    not start is reported, not raised."""
    if backend == LITERT:
        ok = litert_available()
        return {"ok": ok, "device": f"CPU, XNNPACK, {threads} thread(s)", "software": None,
                "detail": "" if ok else "ai_edge_litert is not installed"}
    if backend == REFERENCE:
        return {"ok": True, "device": "CPU, numpy", "software": None, "detail": ""}
    if backend == "cpu":
        return {"ok": True, "device": f"CPU, Taichi LLVM ({cpu_model()})", "software": None, "detail": ""}
    if backend == AUTO:
        from tflite_taichi import backend as ti_backend
        chosen = ti_backend.choose_auto()
        where = (f"cpu: Taichi LLVM + numpy for {', '.join(sorted(ti_backend.CPU_REFERENCE_OPS))}"
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
    """The backends named (a comma-separated item counts as several), once each, in order;
    ValueError for a name that is not one."""
    backends = [b.strip() for item in backends for b in item.split(",") if b.strip()]
    unknown = [b for b in backends if b not in KNOWN_BACKENDS]
    if unknown:
        raise ValueError(f"unknown backend(s) {unknown}; choose from {', '.join(KNOWN_BACKENDS)}")
    return list(dict.fromkeys(backends))


# -- inputs, outputs ---------------------------------------------------------------------------
def make_inputs(model_path: str, seed: int = SEED) -> list:
    """Seeded random inputs for the model (uniform in [0, 1) for floats, as `tflite-taichi run`;
    the full range for quantized integers), from our reader: no Taichi, no LiteRT."""
    from tflite_taichi.interpreter import Interpreter
    from tflite_taichi.testing import random_input
    rng = np.random.default_rng(seed)
    it = Interpreter(model_path=model_path, backend=REFERENCE)
    return [random_input(d, rng, 0.0, 1.0) for d in it.get_input_details()]


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
    """Environment variables that point every cache we know of into `cache_dir`."""
    return {var: os.path.join(cache_dir, sub) for var, sub in CACHE_ENV.items()}


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
    """Run _bench_child.py on `spec`; its result dict (ok False with the reason on a failure)."""
    name = f"{spec['backend']}-{spec['stage']}"
    spec = dict(spec, result=os.path.join(workdir, f"{name}.result.json"),
                sys_path=[p for p in sys.path if p and os.path.isdir(p)])
    spec_path = os.path.join(workdir, f"{name}.spec.json")
    with open(spec_path, "w") as f:
        json.dump(spec, f)
    log_path = os.path.join(workdir, f"{name}.log")
    killed = []

    with open(log_path, "w") as log:
        proc = subprocess.Popen([sys.executable, CHILD_SCRIPT, spec_path], stdout=subprocess.PIPE,
                                stderr=log, text=True, env=env)

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
            return json.load(f)
    with open(log_path) as f:
        tail = [l for l in f.read().splitlines() + other if l.strip()][-3:]
    why = f"killed after {timeout:.0f} s" if killed else f"the process died (exit code {code})"
    return {"ok": False, "error": f"{why}: {' | '.join(tail)[-400:]}"}


def _stats(times_ms: Sequence[float]) -> dict:
    t = np.asarray(times_ms, np.float64)
    return {"runs": int(t.size), "median": float(np.median(t)), "p10": float(np.percentile(t, 10)),
            "p90": float(np.percentile(t, 90)), "min": float(t.min()), "max": float(t.max()),
            "mean": float(t.mean())}


def units_per_backend(runs: int, warmup: int) -> int:
    """Progress units one backend takes: cold start, warm start, warm-up and timed invokes."""
    return 2 + max(warmup, 1) + runs


def bench_backend(model_path: str, backend: str, inputs_npz: str, workdir: str, *,
                  threads: int, runs: int, warmup: int, precision: str = "fp32",
                  cache_dir: Optional[str] = None, profile: bool = False,
                  timeout: float = 1800.0, progress=None) -> dict:
    """One backend on one model: cold start, warm start, latency; a row of the table (without the
    comparison with the oracle: bench_model adds it)."""
    row = {"backend": backend, "precision": precision if backend not in (LITERT, REFERENCE) else "fp32",
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
            "cache_dir": cache}
    env = _child_env(backend, cache)
    counter = _Counter(progress)
    try:
        for stage in ("cold", "warm"):
            counter.describe(f"{backend}: {stage} start")
            result = _run_child(dict(spec, stage=stage), workdir, env, timeout, counter)
            if not result.get("ok"):
                row["error"] = f"{stage} run: {result.get('error')}"
                return row
            row[stage] = result["start"]
    finally:                  # keep the bar's total honest whatever happened
        counter.update(max(units_per_backend(runs, warmup) - counter.n, 0))
    row["second_invoke_ms"] = result["second_invoke_ms"]
    row["latency_ms"] = _stats(result["times_ms"])
    row["times_ms"] = result["times_ms"]
    if "summary" in result:
        s = result["summary"]
        row.update({"ops_total": s["ops_total"], "ops_delegated": s["ops_delegated"],
                    "ops_folded": s["ops_folded"], "ops_cpu": s["ops_cpu"],
                    "partitions": s["partitions"], "launches_per_invoke": s["kernels"]})
    if "profile" in result:
        row["profile"] = result["profile"]
        row["launches_per_invoke"] = result["profile"]["launches_per_invoke"]
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
                devices: Optional[dict] = None, workdir: Optional[str] = None) -> dict:
    """Benchmark one model on each backend in turn (never two at once). Returns
    {'model', 'path', 'inputs', 'oracle', 'rows'}: one row per backend (see bench_backend), each
    with 'max_rel_diff' against the oracle (LiteRT if it ran, else the reference).
    progress: a tqdm-like object (update(n), set_postfix_str(s, refresh)) or None.
    devices: backend -> device_of(...) already computed (bench/bench.py probes once)."""
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
        inputs = make_inputs(model_path, seed)
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
                                    progress=progress)
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
            out["tflite-taichi commit"] = commit.stdout.strip()
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
    return b + (" fp16" if row.get("precision") == "fp16" else "")


def table_rows(results: Sequence[dict]) -> list:
    """The table as a list of rows of strings (header first)."""
    head = ["model", "backend", "device", "cold start s", "warm start s", "median ms",
            "p10-p90 ms", "min ms", "launches / invoke", "ops GPU / CPU", "max rel. diff"]
    lines = [head]
    for res in results:
        for r in res["rows"]:
            if not r["ok"]:
                lines.append([res["model"], _label(r), r.get("device") or "-",
                              f"error: {r['error']}"[:200].replace("|", "/")] + ["-"] * 7)
                continue
            lat = r["latency_ms"]
            ours = r["backend"] != LITERT
            taichi = r["backend"] in TAICHI_BACKENDS + (AUTO,)
            diff = ("(oracle)" if r["backend"] == res["oracle"] else _f(r.get("max_rel_diff"), ".1e"))
            lines.append([
                res["model"], _label(r), r.get("device") or "-",
                _n(r["cold"]["start_s"]), _n(r["warm"]["start_s"]),
                _n(lat["median"]), f"{_n(lat['p10'])}-{_n(lat['p90'])}", _n(lat["min"]),
                str(r.get("launches_per_invoke", "-")) if taichi else "-",
                f"{r.get('ops_delegated', 0)} / {r.get('ops_cpu', '-')}" if ours else "-",
                diff])
    return lines


def render_table(results: Sequence[dict]) -> str:
    lines = table_rows(results)
    out = ["| " + " | ".join(lines[0]) + " |", "|" + " --- |" * len(lines[0])]
    out += ["| " + " | ".join(l) + " |" for l in lines[1:]]
    return "\n".join(out)


def render_text(results: Sequence[dict]) -> str:
    """The table for a terminal: aligned columns."""
    lines = table_rows(results)
    widths = [max(len(l[i]) for l in lines) for i in range(len(lines[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(l, widths)).rstrip() for l in lines)


def phases_table(results: Sequence[dict]) -> str:
    """Where the starts go: import, construct, allocate, first invoke (cold / warm), second invoke."""
    out = ["| model | backend | import s | construct s | allocate s | first invoke s | "
           "second invoke ms | cache files before warm run |", "|" + " --- |" * 8]
    for res in results:
        for r in res["rows"]:
            if not r["ok"]:
                continue
            c, w = r["cold"], r["warm"]
            pair = "{} / {}".format
            out.append(f"| {res['model']} | {_label(r)} | {pair(_n(c['import_s']), _n(w['import_s']))} | "
                       f"{pair(_n(c['construct_s']), _n(w['construct_s']))} | "
                       f"{pair(_n(c['allocate_s']), _n(w['allocate_s']))} | "
                       f"{pair(_n(c['first_invoke_s']), _n(w['first_invoke_s']))} | "
                       f"{_n(r['second_invoke_ms'])} | {w['cache_files_before']} |")
    return "\n".join(out)


METHOD = """\
How (tflite_taichi/bench.py): every backend runs in fresh subprocesses, one after the other.
*Cold start*: a new process with a new, empty cache folder (Taichi's offline cache, Mesa's, NVIDIA's and
CUDA's caches and XDG_CACHE_HOME pointed into it), seconds from `Interpreter(...)` to the end of the
first invoke (construct, allocate_tensors, set_tensor, first invoke: where Taichi compiles); importing
the runtime is not in it (see the phases table). *Warm start*: a second new process with the cache folder
as the cold run left it. *Latency*: in that second process, {warmup} warm-up invokes then {runs} timed
`invoke()` calls with the garbage collector off: median, p10-p90, min. *Launches*: kernel launches per
invoke (Taichi backends). *ops GPU / CPU*: ops run by the delegate / on the numpy path (folded ones in
neither). *max rel. diff*: max |output - {oracle}| / max |{oracle} output| over every output, for the
same seeded input (uniform [0, 1)). LiteRT: its default resolver (XNNPACK) with {threads} thread(s);
`reference` is numpy (its BLAS picks its own threads); Taichi `cpu` uses every core."""


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
                      oracle="LiteRT" if first.get("oracle") == LITERT else (first.get("oracle") or "oracle")),
        "",
        render_table(results),
        "",
        "Where the starts go (cold / warm):",
        "",
        phases_table(results),
        "",
    ]
    if report.get("plot"):
        lines += [f"![median latency, p10-p90]({report['plot']})", ""]
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
    ax.set_ylabel("invoke latency, ms (median; bars p10-p90)")
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
                   help="space- or comma-separated, from " + ", ".join(KNOWN_BACKENDS) + " (default: litert, reference and every "
                   "Taichi backend auto would consider: hardware GPUs that start, and cpu; a software "
                   "Vulkan/OpenGL device runs when named)")
    p.add_argument("--threads", type=int, default=None, help="LiteRT's threads (default: every core)")
    p.add_argument("--runs", type=int, default=100, help="timed invokes (default 100)")
    p.add_argument("--warmup", type=int, default=10, help="warm-up invokes before them (default 10)")
    p.add_argument("--precision", default="fp32", choices=("fp32", "fp16"),
                   help="for the Taichi backends (default fp32)")
    p.add_argument("--seed", type=int, default=SEED, help="of the random input (default 0)")
    p.add_argument("--profile", action="store_true",
                   help="run ours with profile=True and keep it.profile() in the JSON")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds per subprocess (default 1800)")


def progress_bar(total: int, desc: str):
    """A tqdm bar on stderr (the table goes to stdout)."""
    from tqdm import tqdm
    return tqdm(total=total, desc=desc, unit="invoke", file=sys.stderr, dynamic_ncols=True,
                mininterval=0.5)


def run_cli(args) -> int:
    """`tflite-taichi bench MODEL`: the table on stdout, a progress bar on stderr."""
    backends = check_backends(args.backends) if args.backends else default_backends()
    name = os.path.splitext(os.path.basename(args.model))[0]
    if not os.path.isfile(args.model):
        print(f"tflite-taichi: error: no model file {args.model}", file=sys.stderr)
        return 2
    bar = progress_bar(len(backends) * units_per_backend(args.runs, args.warmup), name)
    try:
        result = bench_model(args.model, backends, threads=args.threads, runs=args.runs,
                             warmup=args.warmup, precision=args.precision, seed=args.seed,
                             profile=args.profile, timeout=args.timeout, progress=bar)
    finally:
        bar.close()
    print(render_text([result]))
    if getattr(args, "json", None):
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    errors = [r for r in result["rows"] if not r["ok"]]
    for r in errors:
        print(f"{r['backend']}: {r['error']}", file=sys.stderr)
    return 1 if errors else 0
