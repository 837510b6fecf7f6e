"""Interpreter lifetime: does a process that loads and unloads models, or invokes one model many
times, grow? (the target: 100 create/destroy cycles may grow RSS by at most 20 MB; 10,000 invokes
not at all.)

    python bench/lifetime.py [MODEL.tflite] --backend cpu [--cycles 100] [--invokes 10000]
        [--json OUT.json]

Without MODEL, the demo model the package builds. One process: a first cycle fills the kernel
cache (a cold build runs Taichi's frontend once), `--settle` more cycles let allocators reach
their steady state, then `--cycles` create -> allocate_tensors -> invoke -> close/garbage-collect
cycles, then one interpreter invoked `--invokes` times. RSS (VmRSS of /proc/self/status) is read
after each phase; the result is one JSON line (and OUT.json).
"""
import argparse
import gc
import json
import os
import sys
import tempfile
import time

import numpy as np


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    return float("nan")


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", nargs="?")
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--cycles", type=int, default=100)
    ap.add_argument("--settle", type=int, default=5)
    ap.add_argument("--invokes", type=int, default=10000)
    ap.add_argument("--cache-dir", default=None, help="default: a new temporary folder")
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    from tflite_taichi import Interpreter
    if a.model:
        with open(a.model, "rb") as f:
            content = f.read()
    else:
        from tflite_taichi.tools.demo import build_demo_model
        content = build_demo_model()
    cache_dir = a.cache_dir or tempfile.mkdtemp(prefix="lifetime-cache-")
    rng = np.random.default_rng(0)

    def make():
        it = Interpreter(model_content=content, backend=a.backend, cache_dir=cache_dir)
        it.allocate_tensors()
        return it

    def feed(it):
        for d in it.get_input_details():
            x = rng.random(d["shape"], dtype=np.float32)
            it.set_tensor(d["index"], x.astype(d["dtype"]) if d["dtype"] != np.float32 else x)

    def cycle(close: bool):
        it = make()
        feed(it)
        it.invoke()
        for o in it.get_output_details():
            it.get_tensor(o["index"])
        if close:
            it.close()
        del it
        gc.collect()

    result = {"backend": a.backend, "model": os.path.basename(a.model) if a.model else "demo",
              "cycles": a.cycles, "invokes": a.invokes}
    t = time.perf_counter()
    cycle(True)                             # builds the module into the cache
    result["first_cycle_s"] = time.perf_counter() - t
    for _ in range(a.settle):
        cycle(True)
    result["rss_before_cycles_mb"] = before = rss_mb()
    trace = []
    t = time.perf_counter()
    for i in range(a.cycles):
        cycle(close=i % 2 == 0)             # close() and plain garbage collection, alternately
        if (i + 1) % max(a.cycles // 10, 1) == 0:
            trace.append(round(rss_mb() - before, 2))
    result["cycle_s"] = (time.perf_counter() - t) / max(a.cycles, 1)
    result["rss_after_cycles_mb"] = rss_mb()
    result["cycles_growth_mb"] = result["rss_after_cycles_mb"] - before
    result["cycles_trace_mb"] = trace
    it = make()
    feed(it)
    for _ in range(min(100, a.invokes)):
        it.invoke()
    gc.collect()
    start = rss_mb()
    trace = []
    t = time.perf_counter()
    for i in range(a.invokes):
        it.invoke()
        if (i + 1) % max(a.invokes // 10, 1) == 0:
            trace.append(round(rss_mb() - start, 2))
    result["invoke_ms"] = (time.perf_counter() - t) / max(a.invokes, 1) * 1e3
    gc.collect()
    result["invokes_growth_mb"] = rss_mb() - start
    result["invokes_trace_mb"] = trace
    result["device"] = (it.summary()["runtime"] or {}).get("device")
    line = json.dumps(result)
    print("RESULT " + line, flush=True)
    if a.json:
        with open(a.json, "w") as f:
            f.write(line + "\n")
    return result


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
