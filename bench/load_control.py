"""A control for measurements under load: two plain LiteRT interpreters of one model and ours
(`auto`), steps interleaved (each round starting with the next runtime), one process spinning a
core as bench/cpu_step.py --load 1 does. Two identical runtimes differing by much says the
load, not the runtime, sets the medians.

    python bench/load_control.py MODEL.tflite [--steps 150] [--threads 2]
"""
import argparse
import multiprocessing
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from cpu_step import _spin  # noqa: E402


def step_of(it):
    d = it.get_input_details()[0]
    x = np.zeros(d["shape"], d["dtype"])
    out = it.get_output_details()[0]["index"]

    def step():
        it.set_tensor(d["index"], x)
        it.invoke()
        it.get_tensor(out)
    return step


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("model")
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args()
    from ai_edge_litert.interpreter import Interpreter as LiteRT

    from tflite_taichi import Interpreter
    stop = multiprocessing.Event()
    spinner = multiprocessing.Process(target=_spin, args=(stop,))
    spinner.start()
    try:
        runtimes = {"litert A": LiteRT(model_path=a.model, num_threads=a.threads),
                    "litert B": LiteRT(model_path=a.model, num_threads=a.threads),
                    "ours": Interpreter(model_path=a.model, num_threads=a.threads)}
        for it in runtimes.values():
            it.allocate_tensors()
        steps = {name: step_of(it) for name, it in runtimes.items()}
        names, times = list(steps), {name: [] for name in steps}
        for r in range(a.steps):
            for name in names[r % len(names):] + names[:r % len(names)]:
                start = time.perf_counter()
                steps[name]()
                times[name].append(time.perf_counter() - start)
    finally:
        stop.set()
        spinner.join()
    for name, seconds in times.items():
        p10, p90 = np.percentile(seconds, [10, 90]) * 1e3
        print(f"{name}: {np.median(seconds) * 1e3:.3f} ms (p10-p90 {p10:.3f}-{p90:.3f})")


if __name__ == "__main__":
    main()
