"""How fast Taichi's x64 backend runs a pointwise convolution (a GEMM) in the forms a kernel can
take, against numpy's BLAS, on this machine's cores (issue 29 item 2).

    python lab/cpu_gemm_forms.py [--pixels 196] [--c-in 512] [--c-out 512] [--threads 2]

Forms (out[p, o] = sum_i x[p, i] w[i, o], w packed [I, O] as the delegate packs it):
- `gather`: the GPU's PointwiseConvStep, a thread per (4 pixels, output channel), a strided
  weight load per multiply-add;
- `blocked PxB`: a thread per (P pixels, B output channels), each reduction step one contiguous
  weight row segment times P inputs, P x B accumulators in registers;
- `axpy`: a thread per pixel, each input channel an axpy over the output row in memory (the
  loop vectoriser's form);
- numpy: x @ w (OpenBLAS with its threads).
Each form is checked against numpy before it is timed (median of 20 calls).
"""
import argparse
import time

import numpy as np


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pixels", type=int, default=14 * 14)
    p.add_argument("--c-in", type=int, default=512)
    p.add_argument("--c-out", type=int, default=512)
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args(argv)
    import taichi as ti
    ti.init(arch=ti.cpu, cpu_max_num_threads=a.threads, offline_cache=False)
    H, CI, CO = a.pixels, a.c_in, a.c_out
    rng = np.random.default_rng(0)
    x = rng.random(H * CI, dtype=np.float32)
    w = rng.random(CI * CO, dtype=np.float32)
    f32 = ti.types.ndarray(dtype=ti.f32, ndim=1)

    @ti.kernel
    def gather(x: f32, w: f32, out: f32):
        for tile, co in ti.ndrange(-(-H // 4), CO):
            acc = ti.Vector([0.0] * 4)
            for c in range(CI):
                wv = w[c * CO + co]
                for t in ti.static(range(4)):
                    acc[t] += x[ti.min(tile * 4 + t, H - 1) * CI + c] * wv
            for t in ti.static(range(4)):
                if tile * 4 + t < H:
                    out[(tile * 4 + t) * CO + co] = acc[t]

    def blocked(P, B):
        @ti.kernel
        def kernel(x: f32, w: f32, out: f32):
            for tile, blk in ti.ndrange(-(-H // P), CO // B):
                acc = ti.Matrix.zero(ti.f32, P, B)
                for c in range(CI):
                    xs = ti.Vector([x[ti.min(tile * P + t, H - 1) * CI + c] for t in ti.static(range(P))])
                    ws = ti.Vector([w[c * CO + blk * B + j] for j in ti.static(range(B))])
                    for t in ti.static(range(P)):
                        for j in ti.static(range(B)):
                            acc[t, j] += xs[t] * ws[j]
                for t in ti.static(range(P)):
                    if tile * P + t < H:
                        for j in ti.static(range(B)):
                            out[(tile * P + t) * CO + blk * B + j] = acc[t, j]
        return kernel

    @ti.kernel
    def axpy(x: f32, w: f32, out: f32):
        for q in range(H):
            for o in range(CO):
                out[q * CO + o] = 0.0
            for c in range(CI):
                xv = x[q * CI + c]
                for o in range(CO):
                    out[q * CO + o] += xv * w[c * CO + o]

    expected = x.reshape(H, CI) @ w.reshape(CI, CO)
    out = np.zeros(H * CO, np.float32)
    forms = [("gather", gather)] + [(f"blocked {P}x{B}", blocked(P, B))
                                    for P, B in ((4, 16), (4, 8), (8, 8), (2, 32)) if CO % B == 0]
    forms.append(("axpy", axpy))
    macs = H * CI * CO
    print(f"{H} pixels, {CI} -> {CO} channels, {a.threads} threads, taichi {ti.__version__}")
    for name, kernel in forms:
        kernel(x, w, out)
        np.testing.assert_allclose(out.reshape(H, CO), expected, rtol=1e-4)
        times = []
        for _ in range(20):
            start = time.perf_counter()
            kernel(x, w, out)
            times.append(time.perf_counter() - start)
        ms = float(np.median(times)) * 1e3
        print(f"{name:14} {ms:8.2f} ms  {macs / ms / 1e6:6.1f} GMAC/s")
    xs, ws = x.reshape(H, CI), w.reshape(CI, CO)
    times = []
    for _ in range(20):
        start = time.perf_counter()
        xs @ ws
        times.append(time.perf_counter() - start)
    ms = float(np.median(times)) * 1e3
    print(f"{'numpy':14} {ms:8.2f} ms  {macs / ms / 1e6:6.1f} GMAC/s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
