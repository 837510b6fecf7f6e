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

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cpu_step import _spin  # noqa: E402
from timing import describe, step_of, timed  # noqa: E402


def zeros_step(it):
    """The first input set to zeros, invoke, the first output read."""
    d = it.get_input_details()[0]
    return step_of(it, [(d["index"], np.zeros(d["shape"], d["dtype"]))],
                   [it.get_output_details()[0]["index"]])


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
        steps = {name: zeros_step(it) for name, it in runtimes.items()}
        names, times = list(steps), {name: [] for name in steps}
        for r in range(a.steps):
            for name in names[r % len(names):] + names[:r % len(names)]:
                times[name] += timed(steps[name], 1)
    finally:
        stop.set()
        spinner.join()
    for name, seconds in times.items():
        print(f"{name}: {describe(seconds)}")


if __name__ == "__main__":
    main()
