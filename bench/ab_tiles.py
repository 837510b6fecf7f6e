"""A/B of the shared-memory GEMM tiles on a whole model, alternating in one process so that the
machine's state is the same for both (issue #5): TFLITE_TAICHI_NO_SHARED_TILES toggled between
Interpreter builds.

    python bench/ab_tiles.py MODEL --backend cuda [--batch 1] [--rounds 3] [--runs 200]
"""
import argparse
import os
import sys
import time

import numpy as np


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model")
    p.add_argument("--backend", default="cuda")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--runs", type=int, default=200)
    a = p.parse_args()
    from tflite_taichi import Interpreter
    print(f"{a.model} on {a.backend}, batch {a.batch}, {a.runs} invokes per measurement")
    for r in range(a.rounds):
        for tiles in (False, True):
            if tiles:
                os.environ.pop("TFLITE_TAICHI_NO_SHARED_TILES", None)
            else:
                os.environ["TFLITE_TAICHI_NO_SHARED_TILES"] = "1"
            it = Interpreter(model_path=a.model, backend=a.backend)
            d = it.get_input_details()[0]
            if a.batch != 1:
                it.resize_tensor_input(d["index"], [a.batch, *d["shape"][1:]])
            it.allocate_tensors()
            x = np.random.default_rng(0).uniform(0, 1, it.get_input_details()[0]["shape"]).astype(np.float32)
            it.set_tensor(d["index"], x)
            for _ in range(20):
                it.invoke()
            t = []
            for _ in range(a.runs):
                s = time.perf_counter()
                it.invoke()
                t.append(time.perf_counter() - s)
            med, p10, p90 = 1e3 * np.percentile(t, [50, 10, 90])
            print(f"  round {r} tiles {'on ' if tiles else 'off'}  median {med:.3f} ms (p10 {p10:.3f}, p90 {p90:.3f})",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
