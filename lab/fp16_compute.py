"""Does fp16 arithmetic pay on this GPU? (issue 31, item 2.) The inner loops of the delegate's two
hottest kernels, written three ways with Taichi's Python frontend and timed on one backend:

- `f32`: float32 buffers, float32 arithmetic (precision="fp32");
- `f16 store`: float16 buffers, float32 arithmetic (precision="fp16" today: each load cast up);
- `f16 math`: float16 buffers and float16 arithmetic (what item 2 would generate).

Each time is per launch, launches enqueued BATCH at a time and synchronised once, beside a
one-element kernel's (the launch floor, which Taichi's Python runtime sets: compare the rows
of one kernel with each other, not with the delegate's launches). Kernels: a pointwise convolution (1x1 CONV_2D as one output element per thread, the register
form PointwiseConvStep uses for batch-1 shapes) and a 3x3 depthwise convolution, at MobileNet
and PoseNet shapes. Median of --runs invokes (each followed by ti.sync), after 10 warm-up.

    python lab/fp16_compute.py --arch cuda [--runs 20]
"""
import argparse
import functools
import sys
import time

import numpy as np

POINTWISE = [(56, 128, 128), (28, 256, 256), (14, 512, 512), (17, 1024, 1024)]   # side, c_in, c_out
DEPTHWISE = [(112, 96), (56, 144), (28, 192), (14, 576)]                        # side, channels


BATCH = 50          # launches per sync: the runtime's wait is paid once per batch


def _time(fn, sync, runs: int) -> float:
    """Median us per launch, over `runs` batches of BATCH launches each ended by one sync."""
    for _ in range(3):
        fn()
    sync()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        for _ in range(BATCH):
            fn()
        sync()
        times.append((time.perf_counter() - start) / BATCH)
    return 1e6 * float(np.median(times))


def _pointwise(ti, px: int, c_in: int, c_out: int, store, math):
    @ti.kernel
    def pointwise(x: ti.types.ndarray(dtype=store, ndim=1), w: ti.types.ndarray(dtype=store, ndim=1),
                  y: ti.types.ndarray(dtype=store, ndim=1)):
        for i in range(px * c_out):
            pix, co = i // c_out, i % c_out
            acc = ti.cast(0.0, math)
            for ci in range(c_in):
                acc += ti.cast(x[pix * c_in + ci], math) * ti.cast(w[ci * c_out + co], math)
            y[i] = ti.cast(ti.min(ti.max(acc, 0.0), 6.0), store)
    return pointwise


def _depthwise(ti, side: int, ch: int, store, math):
    @ti.kernel
    def depthwise(x: ti.types.ndarray(dtype=store, ndim=1), w: ti.types.ndarray(dtype=store, ndim=1),
                  y: ti.types.ndarray(dtype=store, ndim=1)):
        for i in range(side * side * ch):
            c = i % ch
            oy, ox = (i // ch) // side, (i // ch) % side
            acc = ti.cast(0.0, math)
            for ky, kx in ti.static(ti.ndrange(3, 3)):
                iy, ix = oy + ky - 1, ox + kx - 1
                if 0 <= iy < side and 0 <= ix < side:
                    acc += ti.cast(x[(iy * side + ix) * ch + c], math) * \
                        ti.cast(w[(ky * 3 + kx) * ch + c], math)
            y[i] = ti.cast(ti.min(ti.max(acc, 0.0), 6.0), store)
    return depthwise


def _compare(ti, forms: dict, label: str, x32, w32, outputs: int, runs: int, macs, make) -> None:
    """Time `make(store, math)`'s kernel in every form on the same data; print each row."""
    base = None
    for name, (store, math) in forms.items():
        host = np.float16 if store == ti.f16 else np.float32
        x, w, y = ti.ndarray(store, x32.size), ti.ndarray(store, w32.size), ti.ndarray(store, outputs)
        x.from_numpy(x32.astype(host))
        w.from_numpy(w32.astype(host))
        kernel = make(store, math)
        us = _time(functools.partial(kernel, x, w, y), ti.sync, runs)
        out = y.to_numpy().astype(np.float32)
        base = out if base is None else base
        rate = f"{macs / us / 1e6:6.2f} TMAC/s  " if macs else ""
        print(f"  {label} {name:10s} {us:8.1f} us  {rate}max|diff| {np.abs(out - base).max():.1e}",
              flush=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--arch", default="cuda")
    p.add_argument("--runs", type=int, default=20)
    a = p.parse_args()
    import taichi as ti
    ti.init(arch=getattr(ti, a.arch), offline_cache=False, log_level=ti.WARN)
    forms = {"f32": (ti.f32, ti.f32), "f16 store": (ti.f16, ti.f32), "f16 math": (ti.f16, ti.f16)}
    rng = np.random.default_rng(0)
    print(f"arch {a.arch}; median us per launch over {a.runs} batches of {BATCH} launches and a "
          "sync; max |diff| against f32")
    one = ti.ndarray(ti.f32, 1)

    @ti.kernel
    def empty(y: ti.types.ndarray(dtype=ti.f32, ndim=1)):
        y[0] = 1.0

    print(f"  a one-element kernel (the launch floor)  {_time(lambda: empty(one), ti.sync, a.runs):8.1f} us")

    for side, c_in, c_out in POINTWISE:
        x32 = rng.uniform(0, 1, side * side * c_in).astype(np.float32)
        w32 = (rng.uniform(-1, 1, c_in * c_out) / np.sqrt(c_in)).astype(np.float32)
        label = f"pointwise {side}x{side} {c_in}->{c_out:<5d}"
        _compare(ti, forms, label, x32, w32, side * side * c_out, a.runs, side * side * c_in * c_out,
                 functools.partial(_pointwise, ti, side * side, c_in, c_out))
    for side, ch in DEPTHWISE:
        x32 = rng.uniform(0, 1, side * side * ch).astype(np.float32)
        w32 = rng.uniform(-1, 1, 9 * ch).astype(np.float32) / 3
        label = f"depthwise {side}x{side}x{ch:<5d}     "
        _compare(ti, forms, label, x32, w32, side * side * ch, a.runs, None,
                 functools.partial(_depthwise, ti, side, ch))
    return 0


if __name__ == "__main__":
    sys.exit(main())
