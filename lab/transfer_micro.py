"""Host<->device transfer costs through Taichi 1.7's Python API, per backend (issue #5 design
input; the C API's candidates are measured by lab/capi_io.py): ndarray.from_numpy / to_numpy at a model input's size and an output's size, and a numpy
array passed straight to a kernel. Also checks a tuple of ndarrays as one ti.template argument.

    python lab/transfer_micro.py --backend cuda
"""
import argparse
import sys
import time

import numpy as np


def median_us(fn, runs=200):
    for _ in range(10):
        fn()
    t = []
    for _ in range(runs):
        s = time.perf_counter()
        fn()
        t.append(time.perf_counter() - s)
    return 1e6 * float(np.median(t))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--backend", default="cpu")
    a = p.parse_args()
    from tflite_taichi import backend
    backend.ensure_python_taichi(a.backend)
    import taichi as ti
    big, small = 224 * 224 * 3, 1000
    nd_big, nd_small = ti.ndarray(ti.f32, big), ti.ndarray(ti.f32, small)
    h_big, h_small = np.random.rand(big).astype(np.float32), np.random.rand(small).astype(np.float32)

    @ti.func
    def touch(bufs: ti.template()):
        for i in range(8):
            bufs[1][i] = bufs[0][i] * 2.0

    @ti.kernel
    def k_tuple(a: ti.types.ndarray(ndim=1), b: ti.types.ndarray(ndim=1)):
        touch((a, b))

    @ti.kernel
    def k_one(a: ti.types.ndarray(ndim=1)):
        for i in range(8):
            a[i] = a[i] + 0.0

    k_tuple(nd_big, nd_small)
    ti.sync()
    ok = np.allclose(nd_small.to_numpy()[:8], 2 * nd_big.to_numpy()[:8])
    print(f"{a.backend}: tuple-of-ndarrays template arg works: {ok}")

    def launch_sync():
        k_one(nd_small)
        ti.sync()
    rows = {
        "from_numpy 600 KB": lambda: (nd_big.from_numpy(h_big), ti.sync()),
        "to_numpy 600 KB": lambda: nd_big.to_numpy(),
        "from_numpy 4 KB": lambda: (nd_small.from_numpy(h_small), ti.sync()),
        "to_numpy 4 KB": lambda: nd_small.to_numpy(),
        "kernel(numpy 600 KB) + sync": lambda: (k_one(h_big), ti.sync()),
        "kernel(ndarray) + sync": launch_sync,
    }
    for name, fn in rows.items():
        print(f"  {name:<30} {median_us(fn):9.1f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
