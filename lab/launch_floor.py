"""What an invoke costs before any work (issue 31, items 3 and 4): on one backend, in one process,
the host's wait alone, a launch enqueued, a launch waited for, a task more in a kernel, and a
model's invoke against the floor its launches and tasks put under it.

    python lab/launch_floor.py --backend vulkan [--runs 300] [--model mobilenet_v2 ...]

Rows (median us over --runs, p10-p90):
- `wait, nothing launched`: the device's wait with an empty queue (Vulkan: Taichi's flush, our
  empty submit with a fence, the poll; CUDA: the stream synchronisation); on Vulkan its parts
  each alone (Taichi's ti_flush, our empty submit and fence poll, a blocking fence wait instead
  of the poll) and Taichi's own ti_wait;
- `launch x K, no wait`: K launches of a one-task kernel enqueued (host time only; their work
  drains before the next row);
- `launch x K + wait`: the same, then the wait: an invoke of K kernels with nothing else;
- `one kernel of N tasks + wait`: a chain of N element-wise ops of [1, 8] with fusion off
  (TFLITE_TAICHI_FUSION=none), one kernel: the slope over N is a task's cost inside a kernel;
- `invoke MODEL`: Interpreter.invoke() of a model (zoo name or path), with its launches and
  tasks per invoke and the floor they imply: wait + launches x (launch+wait slope) + tasks x
  (task slope).

Taichi runs one arch per process: one backend per run. A developer's tool.
"""
import argparse
import os
import sys
import time
import warnings

import numpy as np


def _chain(n: int) -> bytes:
    from tflite_taichi.builder import ModelBuilder
    b = ModelBuilder()
    g = b.subgraph()
    x = g.input("x", (1, 8))
    for i in range(n):
        y = g.tensor(f"y{i}", (1, 8))
        g.op("NEG" if i % 2 else "ABS", [x], [y])
        x = y
    g.output(x)
    return b.finish()


def _interpreter(model: bytes, backend: str, **env):
    """An allocated Interpreter of `model`, planned under the TFLITE_TAICHI_* settings `env`
    (read when its kernels are planned)."""
    from tflite_taichi import Interpreter
    from tflite_taichi.runtime.cache import environment
    with environment({k: str(v) for k, v in env.items()}):
        it = Interpreter(model_content=model, backend=backend)
        it.allocate_tensors()
    for d in it.get_input_details():
        it.set_tensor(d["index"], np.ones(d["shape"], d["dtype"]))
    it.invoke()
    return it


def _times(fn, runs: int) -> np.ndarray:
    for _ in range(max(runs // 10, 3)):
        fn()
    out = np.empty(runs)
    for i in range(runs):
        start = time.perf_counter()
        fn()
        out[i] = time.perf_counter() - start
    return out * 1e6


def _row(label: str, us: np.ndarray) -> dict:
    row = {"what": label, "median_us": float(np.median(us)), "p10_us": float(np.percentile(us, 10)),
           "p90_us": float(np.percentile(us, 90))}
    print(f"{label:<44} {row['median_us']:9.1f} us  (p10-p90 {row['p10_us']:.1f}-{row['p90_us']:.1f})",
          flush=True)
    return row


def _slope(xs, ys) -> float:
    return float(np.polyfit(np.asarray(xs, float), np.asarray(ys, float), 1)[0])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", required=True)
    p.add_argument("--runs", type=int, default=300)
    p.add_argument("--launches", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    p.add_argument("--tasks", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--model", nargs="*", default=[], help="zoo names or .tflite paths to hold to the floor")
    p.add_argument("--json", help="write the rows here")
    args = p.parse_args(argv)
    warnings.simplefilter("ignore")
    rows = []
    # K one-task kernels: a chain of K ops, one kernel per step
    biggest = _interpreter(_chain(max(args.launches)), args.backend, TFLITE_TAICHI_CHUNK_STEPS=1,
                           TFLITE_TAICHI_FUSION="none")
    program = biggest._main.program
    device = program.device
    launches = [launch for per_partition in program._launches for launch in per_partition]
    print(f"{args.backend}: {getattr(device, 'vulkan_device', None) or device.kind}; "
          f"{len(launches)} kernels of one task", flush=True)
    rows.append(_row("wait, nothing launched", _times(device.wait, args.runs)))
    fence = getattr(device, "_fence", None)
    if fence is not None:       # Vulkan: the wait's parts, nothing launched
        rows.append(_row("  Taichi's ti_flush alone", _times(device.flush, args.runs)))
        rows.append(_row("  our empty submit + fence poll alone", _times(fence.wait, args.runs)))
        rows.append(_row("  Taichi's ti_wait alone", _times(device.drain, args.runs)))
        saved, fence.spin_s = fence.spin_s, 0.0
        rows.append(_row("  empty submit + blocking fence wait", _times(fence.wait, args.runs)))
        fence.spin_s = saved
    with_wait = []
    for k in args.launches:
        def enqueue(k=k):
            for launch in launches[:k]:
                launch()

        def enqueue_and_wait(k=k):
            enqueue(k)
            device.wait()
        enqueued = []
        for _ in range(args.runs):
            start = time.perf_counter()
            enqueue()
            enqueued.append((time.perf_counter() - start) * 1e6)
            device.wait()
        rows.append(_row(f"launch x {k}, no wait", np.asarray(enqueued)))
        with_wait.append(_row(f"launch x {k} + wait", _times(enqueue_and_wait, args.runs)))
    rows += with_wait
    per_launch = _slope(args.launches, [r["median_us"] for r in with_wait])
    print(f"{'a launch more (slope)':<44} {per_launch:9.1f} us", flush=True)
    # one kernel of N tasks
    with_tasks = []
    for n in args.tasks:
        it = _interpreter(_chain(n), args.backend, TFLITE_TAICHI_FUSION="none")
        prog = it._main.program
        ls = [launch for per_partition in prog._launches for launch in per_partition]

        def run_all(ls=ls, dev=prog.device):
            for launch in ls:
                launch()
            dev.wait()
        with_tasks.append(_row(f"one kernel of {n} tasks + wait ({len(ls)} launch)", _times(run_all, args.runs)))
    rows += with_tasks
    per_task = _slope(args.tasks, [r["median_us"] for r in with_tasks])
    print(f"{'a task more in a kernel (slope)':<44} {per_task:9.1f} us", flush=True)
    wait_us = rows[0]["median_us"]
    for name in args.model:
        if os.path.isfile(name):
            with open(name, "rb") as f:
                model = f.read()
        else:
            from tflite_taichi.tools import zoo
            model = zoo.build(name)
        it = _interpreter(model, args.backend)
        runtime = it.summary()["runtime"] or {}
        n_launches, n_tasks = runtime.get("launches_per_invoke") or 0, runtime.get("tasks_per_invoke") or 0
        row = _row(f"invoke {os.path.basename(name)}", _times(it.invoke, args.runs))
        floor = wait_us + n_launches * per_launch + n_tasks * per_task
        row.update(launches=n_launches, tasks=n_tasks, floor_us=floor)
        print(f"  {n_launches} launch(es), {n_tasks} tasks: floor {floor:.1f} us "
              f"(wait {wait_us:.1f} + launches x {per_launch:.1f} + tasks x {per_task:.1f}); "
              f"the invoke is {row['median_us'] / floor:.2f}x it", flush=True)
        rows.append(row)
    if args.json:
        import json
        with open(args.json, "w") as f:
            json.dump({"backend": args.backend, "argv": sys.argv, "per_launch_us": per_launch,
                       "per_task_us": per_task, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
