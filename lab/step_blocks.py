"""One model, one backend, one process: the step's medians in blocks after `auto` has chosen,
which threads burnt CPU meanwhile, and the step split into set / invoke / get.

    python lab/step_blocks.py MODEL.tflite BACKEND      # BACKEND: litert (LiteRT's own), auto, cuda, ...

Asked once (bench/results/auto_side_by_side_h100.md): was `auto`'s step on the GPU slower than
the backend alone (a thread of ours busy beside it), or was one side-by-side process unlucky?
"""
import os
import sys
import threading
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))
from cpu_step import Step  # noqa: E402  (the harness's runtime and step: bench/cpu_step.py)


def thread_cpu_seconds() -> dict:
    """thread id -> (name, user + system CPU seconds), from /proc (Linux)."""
    seen = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        name = stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2:].split()
        seen[tid] = (name, (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"))
    return seen


def main() -> None:
    path, backend = sys.argv[1], sys.argv[2]
    from tflite_taichi.tools.bench import make_inputs
    runtime = Step(backend, path, 16, make_inputs(path))
    step, it = runtime.step, runtime.it
    outputs = runtime.outputs
    end = time.perf_counter() + 0.5            # past an idle GPU's climb to its clock
    while time.perf_counter() < end:
        step()
    runtime.chosen()                           # `auto`: stepped on until it chose
    if backend == "auto":
        print(runtime.label, runtime.choice)
    for block in range(3):
        before, start, times = thread_cpu_seconds(), time.perf_counter(), []
        for _ in range(400):
            t = time.perf_counter()
            step()
            times.append(time.perf_counter() - t)
        wall, after = time.perf_counter() - start, thread_cpu_seconds()
        busy = sorted(((cpu - before.get(tid, (0, 0))[1], name) for tid, (name, cpu) in after.items()),
                      reverse=True)[:4]
        print(f"block {block}: median {np.median(times) * 1e3:.4f} ms p10 {np.percentile(times, 10) * 1e3:.4f} "
              f"p90 {np.percentile(times, 90) * 1e3:.4f}; cpu/wall {sum(c for c, _ in busy) / wall:.2f}; "
              "busiest threads " + ", ".join(f"{name}:{cpu:.2f}s" for cpu, name in busy))
    print("threads:", len(os.listdir("/proc/self/task")), "python threads:",
          [t.name for t in threading.enumerate()])
    phases, n = np.zeros(3), 400
    for _ in range(n):
        t0 = time.perf_counter()
        for index, x in runtime.inputs:
            it.set_tensor(index, x)
        t1 = time.perf_counter()
        it.invoke()
        t2 = time.perf_counter()
        for o in outputs:
            it.get_tensor(o)
        phases += (t1 - t0, t2 - t1, time.perf_counter() - t2)
    print("phases ms (set, invoke, get):", np.round(phases / n * 1e3, 4))


if __name__ == "__main__":
    main()
