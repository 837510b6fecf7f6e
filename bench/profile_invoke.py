"""Where an invoke's time goes on one backend: the whole step (set inputs, invoke, get outputs),
the invoke alone, per partition and CPU op (`profile=True`, which waits after every kernel to
time it), launches and waits per invoke; with `--kernel-profiler` on cuda, Taichi's per-task
kernel profiler, mapped back to the ops (it needs Taichi's Python runtime, so that run uses
TFLITE_TAICHI_RUNTIME=python).

    python bench/profile_invoke.py MODEL --backend cuda [--runs 100] [--kernel-profiler]

A developer's tool; `bench/bench.py` is the side-by-side benchmark.
"""
import argparse
import os
import re
import sys
import time
import warnings

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from timing import describe, step_of, timed  # noqa: E402


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model")
    p.add_argument("--backend", default="cuda")
    p.add_argument("--precision", default="fp32")
    p.add_argument("--runs", type=int, default=100)
    p.add_argument("--kernel-profiler", action="store_true",
                   help="cuda: Taichi's kernel profiler per task (through Taichi's Python runtime)")
    p.add_argument("--tasks", type=int, default=15, help="slowest kernel-profiler tasks to list")
    args = p.parse_args(argv)
    warnings.simplefilter("ignore")
    if args.kernel_profiler:
        os.environ["TFLITE_TAICHI_RUNTIME"] = "python"
        import taichi as ti
        init = ti.init
        ti.init = lambda *a, **k: init(*a, kernel_profiler=True, **k)
        os.environ["TFLITE_TAICHI_CHUNK_STEPS"] = "1"   # a kernel per step: tasks map to ops
    from tflite_taichi import Interpreter
    from tflite_taichi.testing import random_input

    t0 = time.perf_counter()
    it = Interpreter(model_path=args.model, backend=args.backend, precision=args.precision)
    it.allocate_tensors()
    t1 = time.perf_counter()
    rng = np.random.default_rng(0)
    feeds = [(d["index"], random_input(d, rng, 0.0, 1.0)) for d in it.get_input_details()]
    step = step_of(it, feeds)
    timed(step, 0, warmup=10)
    steps, invokes = [], []
    for _ in range(args.runs):          # a step, then an invoke alone: both see the same clocks
        steps += timed(step, 1)
        invokes += timed(it.invoke, 1)
    s = it.summary()
    runtime = s["runtime"] or {}
    print(f"{args.model} on {s['backend']}/{args.precision} ({runtime.get('device')}): "
          f"{s['ops_delegated']} ops in {len(s['partitions'])} partition(s), "
          f"{runtime.get('launches_per_invoke')} launch(es), {runtime.get('tasks_per_invoke')} task(s) and "
          f"{runtime.get('waits_per_invoke')} wait(s) per invoke; construct+allocate {t1 - t0:.2f} s ({s['cache']['state']})")
    print(f"step (set inputs + invoke + get outputs) {describe(steps)} over {args.runs}")
    print(f"invoke alone {describe(invokes)}")

    profiled = Interpreter(model_path=args.model, backend=args.backend, precision=args.precision,
                           profile=True)
    profiled.allocate_tensors()
    for index, x in feeds:
        profiled.set_tensor(index, x)
    for _ in range(args.runs):
        profiled.invoke()
    report = profiled.profile()
    print("profile=True (a wait after every kernel):")
    for row in report["items"]:
        what = (f"partition of {len(row['ops'])} ops, {row['launches']} launch(es)"
                if row["kind"] == "partition" else f"cpu {row['op']} #{row['ops'][0]}")
        print(f"  {row['ms']:8.3f} ms  {what}")
    if args.kernel_profiler and args.backend in ("cuda", "cpu"):
        import taichi as ti
        ti.profiler.clear_kernel_profiler_info()
        for _ in range(args.runs):
            it.invoke()
        # kernels in the order they were built: chunk by chunk, partition by partition; with
        # one step per chunk, a task's kernel is a step (its fused ops ride along)
        steps_ = []
        for p in it._main.schedule.partitions:
            code = it._main.program.code(p)
            for chunk in code.chunks:
                st = p.steps[chunk[0]]
                fused = [p.steps[j].op.name for j, (i, _) in code.fusions.items() if i == chunk[0]]
                steps_.append((st, fused))
        records = {}
        profiler = ti.profiler.kernel_profiler._ti_kernel_profiler
        profiler._update_records()          # Taichi 1.7 fetches the device's records lazily
        for r in profiler._traced_records:
            records.setdefault(r.name, []).append(r.kernel_time)
        total = sum(sum(v) for v in records.values()) / args.runs
        print(f"  kernel profiler: {total:.3f} ms of GPU time per invoke in {len(records)} task(s)")
        ids = sorted({int(m.group(1)) for name in records
                      for m in [re.match(r"partition_kernel_c(\d+)_", name)] if m})
        rows = sorted(records.items(), key=lambda kv: -sum(kv[1]))[:args.tasks]
        for name, times in rows:
            m = re.match(r"partition_kernel_c(\d+)_", name)
            op = ""
            if m and ids.index(int(m.group(1))) < len(steps_):
                st, fused = steps_[ids.index(int(m.group(1)))]
                spec = st.node.inputs[0]
                w = st.node.inputs[1] if len(st.node.inputs) > 1 and st.node.inputs[1] is not None else None
                op = (f"{st.op.name} #{st.op.index} {list(spec.shape) if spec is not None else ''}"
                      f"{' w' + str(list(w.shape)) if w is not None and w.value is not None else ''}"
                      f" -> {list(st.node.outputs[0].shape)}" + (f" + {','.join(fused)}" if fused else ""))
            print(f"    {1e3 * sum(times) / args.runs:8.1f} us  {name[:44]:<44} {op}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
