"""Where an invoke's time goes on one backend: host work, upload, kernels, download, and (cuda)
Taichi's kernel profiler per offloaded task, mapped back to the ops of the partition.

    python bench/profile_invoke.py MODEL --backend cuda [--runs 100] [--tasks 15]

A developer's tool for issue #5 (speed); `bench/bench.py` is the side-by-side benchmark.
"""
import argparse
import re
import sys
import time
import warnings

import numpy as np


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model")
    p.add_argument("--backend", default="cuda")
    p.add_argument("--precision", default="fp32")
    p.add_argument("--runs", type=int, default=100)
    p.add_argument("--tasks", type=int, default=15, help="slowest kernel-profiler tasks to list")
    args = p.parse_args(argv)
    warnings.simplefilter("ignore")
    import taichi as ti
    kernel_profiler = args.backend == "cuda"
    if kernel_profiler:               # only CUDA has Taichi's per-task kernel profiler
        init = ti.init
        ti.init = lambda *a, **k: init(*a, kernel_profiler=True, **k)
    from tflite_taichi import Interpreter
    from tflite_taichi import codegen
    from tflite_taichi.testing import random_input

    spans = {"upload": [], "kernels": [], "download": []}
    original_run = codegen.CompiledPartition.run

    def timed_run(self, values):          # the same steps as CompiledPartition.run, timed
        t0 = time.perf_counter()
        self._upload(values)
        ti.sync()
        t1 = time.perf_counter()
        self._launch()
        ti.sync()
        t2 = time.perf_counter()
        self._download(values)
        t3 = time.perf_counter()
        spans["upload"].append(t1 - t0)
        spans["kernels"].append(t2 - t1)
        spans["download"].append(t3 - t2)

    t0 = time.perf_counter()
    it = Interpreter(model_path=args.model, backend=args.backend, precision=args.precision)
    it.allocate_tensors()
    t1 = time.perf_counter()
    d = it.get_input_details()[0]
    it.set_tensor(d["index"], random_input(d, np.random.default_rng(0), 0.0, 1.0))
    for _ in range(10):
        it.invoke()
    plain = []
    for _ in range(args.runs):
        s = time.perf_counter()
        it.invoke()
        plain.append(time.perf_counter() - s)
    codegen.CompiledPartition.run = timed_run
    if kernel_profiler:
        ti.profiler.clear_kernel_profiler_info()
    for _ in range(args.runs):
        it.invoke()
    codegen.CompiledPartition.run = original_run
    s = it.summary()
    print(f"{args.model} on {s['backend']}/{args.precision}: {s['ops_delegated']} ops in "
          f"{len(s['partitions'])} partition(s), {sum(p['kernels'] for p in s['partitions'])} kernel(s); "
          f"construct+allocate (compile) {t1 - t0:.2f} s")
    print(f"invoke median {1e3 * np.median(plain):.3f} ms (p10 {1e3 * np.percentile(plain, 10):.3f}, "
          f"p90 {1e3 * np.percentile(plain, 90):.3f}) over {args.runs}")
    for k, v in spans.items():
        print(f"  {k:<9} median {1e3 * np.median(v):.3f} ms")
    if kernel_profiler:
        steps = [st for p in it._main.schedule.partitions for st in p.steps]
        records = {}
        profiler = ti.profiler.kernel_profiler._ti_kernel_profiler
        profiler._update_records()          # Taichi 1.7 fetches the device's records lazily
        for r in profiler._traced_records:
            records.setdefault(r.name, []).append(r.kernel_time)
        total = sum(sum(v) for v in records.values()) / args.runs
        print(f"  kernel profiler: {total:.3f} ms of GPU time per invoke in {len(records)} task(s)")
        rows = sorted(records.items(), key=lambda kv: -sum(kv[1]))[:args.tasks]
        for name, times in rows:
            m = re.search(r"_c\d+_(\d+)_", name)
            op = ""
            if m and int(m.group(1)) < len(steps):
                st = steps[int(m.group(1))]
                op = f"{st.op.name} #{st.op.index} {[list(st.node.outputs[0].shape)]}"
            print(f"    {1e3 * sum(times) / args.runs:8.1f} us  {name[:48]:<48} {op}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
