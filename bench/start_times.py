"""Time to first result in a fresh process, cold and warm, side by side.

Every run is a new process, timed from just before it is spawned to the moment its first
result is in the parent's hands' reach (the child stamps the wall clock when its first step
returns; both clocks are this machine's), so Python's start and every import count. For each
model, runner and variant: a fresh cache folder (ours, and CUDA's, the GL/Vulkan drivers' and
Mesa's shader caches) for a cold process, then --warm (1) processes on the same folders (warm).
The child also reports its phases (import, construct, allocate, first step), where the kernels
were compiled, and the median of STEPS further steps (set every input, invoke, get every
output), with the first step as fast as the median's 1.25x ("full speed at").

    python bench/start_times.py MODELS... [--runners cpu,vulkan,litert_cpu,litert_gpu]
        [--variant NAME=VAR=VALUE,VAR=VALUE ...] [--steps 30] [--json OUT.json]

Runners: ours by backend (cuda, vulkan, opengl, gles, cpu, auto, reference; BACKEND+answer:
Interpreter(answer_while_compiling=True), timed to its first result and to the first step the
delegate answered, "delegate at"), litert_cpu
(XNNPACK, all cores), litert_gpu (LiteRT's GPU path, ML Drift; it has no cache of any kind).
A variant is a set of environment variables for our runners, e.g. the state before the compile workers and the frontend patch:
`--variant before=TFLITE_TAICHI_FRONTEND_PATCH=0,TFLITE_TAICHI_COMPILE_WORKERS=0`; the default
variant "now" sets nothing.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

CHILD = r'''
import json, os, sys, time
t_start = time.perf_counter()
runner, model, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
import numpy as np

def seeded(details):
    rng = np.random.default_rng(0)
    xs = []
    for d in details:
        shape, dt = tuple(int(s) for s in d["shape"]), np.dtype(d["dtype"])
        if dt.kind == "f":
            xs.append(rng.random(shape, dtype=np.float32).astype(dt))
        elif dt.itemsize == 1:
            info = np.iinfo(dt)
            xs.append(rng.integers(info.min, info.max + 1, shape).astype(dt))
        else:
            xs.append(rng.integers(0, 8, shape).astype(dt))
    return xs

res = {}
t0 = time.perf_counter()
if runner == "litert_cpu":
    from ai_edge_litert.interpreter import Interpreter
    t1 = time.perf_counter()
    it = Interpreter(model_path=model, num_threads=os.cpu_count())
    t2 = time.perf_counter()
    it.allocate_tensors()
elif runner == "litert_gpu":
    from ai_edge_litert.compiled_model import CompiledModel
    from ai_edge_litert.hardware_accelerator import HardwareAccelerator
    from ai_edge_litert.options import Options
    t1 = time.perf_counter()
    cm = CompiledModel.from_file(model, options=Options(hardware_accelerators=HardwareAccelerator.GPU))
    t2 = time.perf_counter()
    sig = list(cm.get_signature_list())[0]
    idet, odet = cm.get_input_tensor_details(sig), cm.get_output_tensor_details(sig)
    inames = list(cm.get_signature_list()[sig]["inputs"])
    onames = list(cm.get_signature_list()[sig]["outputs"])
    ib, ob = cm.create_input_buffers(0), cm.create_output_buffers(0)
    res["fully_accelerated"] = bool(cm.is_fully_accelerated())
else:
    from tflite_taichi import Interpreter
    t1 = time.perf_counter()
    backend, _, answer = runner.partition("+")      # "vulkan+answer": answer_while_compiling
    it = Interpreter(model_path=model, backend=backend, answer_while_compiling=answer == "answer")
    t2 = time.perf_counter()
    it.allocate_tensors()
t3 = time.perf_counter()
if runner == "litert_gpu":
    xs = seeded([idet[n] for n in inames])
    shapes = [(tuple(odet[n]["shape"]), np.dtype(odet[n]["dtype"])) for n in onames]
    def step():
        for b, x in zip(ib, xs):
            b.write(x)
        cm.run_by_index(0, ib, ob)
        return [b.read(int(np.prod(s)), dt).reshape(s) for b, (s, dt) in zip(ob, shapes)]
else:
    ins, outs = it.get_input_details(), it.get_output_details()
    xs = seeded(ins)
    def step():
        for d, x in zip(ins, xs):
            it.set_tensor(d["index"], x)
        it.invoke()
        return [it.get_tensor(d["index"]) for d in outs]
step()
first_wall = time.time()
t4 = time.perf_counter()
if runner.endswith("+answer"):     # steps on the reference path until the delegate answers
    while it.summary()["runtime"]["answered_by"] != "delegate" and time.perf_counter() - t4 < 300:
        step()
    res["delegate_after_first_s"] = time.perf_counter() - t4
times, stamps = [], []
for _ in range(steps):
    a = time.perf_counter(); step(); b = time.perf_counter()
    times.append(b - a); stamps.append(b - t0)
median = float(np.median(times)) if times else None
full = next((s for t, s in zip(times, stamps) if t <= 1.25 * median), None) if times else None
res.update(first_wall=first_wall, t0_to_first_s=t4 - t0, import_s=t1 - t0, construct_s=t2 - t1, allocate_s=t3 - t2,
           first_step_s=t4 - t3, step_ms=median * 1e3 if median else None,
           full_speed_s=full, in_process_s=t4 - t_start)
if runner not in ("litert_cpu", "litert_gpu"):
    s = it.summary()
    rt, cache = s.get("runtime") or {}, s.get("cache") or {}
    res.update(backend=s.get("backend"), cache=cache.get("state"), compiled_in=rt.get("compiled_in"),
               build_s=rt.get("build_s"), device=rt.get("device"))
print("RESULT " + json.dumps(res), flush=True)
'''

DRIVER_CACHES = {"CUDA_CACHE_PATH": "nv", "__GL_SHADER_DISK_CACHE_PATH": "gl",
                 "MESA_SHADER_CACHE_DIR": "mesa", "XDG_CACHE_HOME": "xdg"}


def one_process(runner: str, model: str, steps: int, env: dict, timeout: float, cwd: str) -> dict:
    """One fresh process. `cwd`: a folder without a checkout in it, so that `python -c` (whose
    path starts with the working folder) imports the package that is installed, or the one a
    variant's PYTHONPATH names, rather than a source tree it happens to run in."""
    spawned = time.time()
    try:
        proc = subprocess.run([sys.executable, "-c", CHILD, runner, os.path.abspath(model), str(steps)],
                              capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    lines = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        tail = [l for l in (proc.stderr or proc.stdout).strip().splitlines() if l.strip()][-2:]
        return {"error": " | ".join(tail)[:300] or f"exit code {proc.returncode}"}
    res = json.loads(lines[-1][len("RESULT "):])
    res["first_result_s"] = res.pop("first_wall") - spawned
    if res.get("delegate_after_first_s") is not None:
        res["delegate_at_s"] = res["first_result_s"] + res["delegate_after_first_s"]
    if res.get("full_speed_s") is not None:      # from the spawn too (the child's is from t0)
        res["full_speed_s"] += res["first_result_s"] - res.pop("t0_to_first_s")
    return res


def parse_variants(given) -> dict:
    variants = {}
    for text in given or []:
        name, _, assignments = text.partition("=")
        env = dict(a.split("=", 1) for a in assignments.split(",") if a)
        variants[name] = env
    return variants or {"now": {}}


def byte_compiled_env() -> dict:
    """This process's environment for the children, with the package byte-compiled as pip
    installs it: a checkout's sources are otherwise compiled again by every child where
    PYTHONDONTWRITEBYTECODE is set (this machine's default), ~0.1 s no user pays."""
    import compileall
    import tflite_taichi
    from tflite_taichi import ops, quant
    for package in (tflite_taichi, ops, quant):
        compileall.compile_dir(os.path.dirname(package.__file__), quiet=1)
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("models", nargs="+")
    p.add_argument("--runners", default="cpu,litert_cpu")
    p.add_argument("--variant", action="append", help="NAME=VAR=VALUE,VAR=VALUE (ours only)")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--timeout", type=float, default=300)
    p.add_argument("--warm", type=int, default=1, help="warm processes after each cold one")
    p.add_argument("--json")
    a = p.parse_args(argv)
    variants = parse_variants(a.variant)
    base_env = byte_compiled_env()
    rows = []
    print(f"{'model':32} {'runner':12} {'variant':8} {'pass':5} {'first result':>12} {'import':>7} "
          f"{'constr':>7} {'alloc':>7} {'1st step':>8} {'delegate at':>11} {'full speed':>10} {'step ms':>8}"
          "  compiled in",
          flush=True)
    for model in a.models:
        for runner in a.runners.split(","):
            ours = not runner.startswith("litert")
            for name, extra in (variants.items() if ours else [("-", {})]):
                folder = tempfile.mkdtemp(prefix="start-")
                env = dict(base_env, TFLITE_TAICHI_CACHE_DIR=os.path.join(folder, "ours"), **extra)
                env.update({k: os.path.join(folder, v) for k, v in DRIVER_CACHES.items()})
                for stage in ["cold"] + ["warm"] * a.warm:
                    res = one_process(runner, model, a.steps, env, a.timeout, folder)
                    res.update(model=os.path.basename(model), runner=runner, variant=name, stage=stage,
                               env=extra)
                    rows.append(res)
                    print(_line(res), flush=True)
                shutil.rmtree(folder, ignore_errors=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"argv": sys.argv, "rows": rows}, f, indent=1)
    return 0


def _line(r: dict) -> str:
    head = f"{r['model'][:32]:32} {r['runner']:12} {r['variant']:8} {r['stage']:5}"
    if "error" in r:
        return f"{head} error: {r['error']}"

    def s(key):
        return f"{r[key]:.3f}" if isinstance(r.get(key), (int, float)) else "-"
    step = f"{r['step_ms']:.3f}" if r.get("step_ms") else "-"
    return (f"{head} {s('first_result_s'):>12} {s('import_s'):>7} {s('construct_s'):>7} {s('allocate_s'):>7} "
            f"{s('first_step_s'):>8} {s('delegate_at_s'):>11} {s('full_speed_s'):>10} {step:>8}  {r.get('compiled_in') or ''}")


if __name__ == "__main__":
    sys.exit(main())
