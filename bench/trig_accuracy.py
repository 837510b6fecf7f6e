"""How accurate are the backends' float32 sin, cos and atan2? The error model of
Landmarks2TransformMatrix (ops/transforms/reference.py, TRIG_ULPS) takes its trig error from here.

    python bench/trig_accuracy.py cpu vulkan opengl > bench/results/trig_accuracy.md

Each backend runs in its own process (Taichi is one arch per process): 2^20 float32 arguments
(sin, cos: half over [-4 pi, 4 pi], half over [-1000, 1000]; atan2(y, x): y in [-100, 100];
atan(z) as atan2(z, 1), z = x / 1000), held against numpy's float64 results. The error is given
in units of u = 2^-24 absolute (what the error model uses: the results are at most pi)."""
import os
import subprocess
import sys

def child(arch):
    import numpy as np
    import taichi as ti
    ti.init(arch=getattr(ti, arch), log_level=ti.ERROR, offline_cache=False)
    n = 1 << 20
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.uniform(-4 * np.pi, 4 * np.pi, n // 2),
                        rng.uniform(-1e3, 1e3, n // 2)]).astype(np.float32)
    y = rng.uniform(-100, 100, n).astype(np.float32)
    xs, ys, out = ti.ndarray(ti.f32, n), ti.ndarray(ti.f32, n), ti.ndarray(ti.f32, (4, n))
    xs.from_numpy(x)
    ys.from_numpy(y)

    @ti.kernel
    def trig(a: ti.types.ndarray(), b: ti.types.ndarray(), o: ti.types.ndarray()):
        for i in range(n):
            o[0, i] = ti.sin(a[i])
            o[1, i] = ti.cos(a[i])
            o[2, i] = ti.atan2(b[i], a[i])
            o[3, i] = ti.atan2(a[i] * 0.001, 1.0)

    trig(xs, ys, out)
    got = out.to_numpy().astype(np.float64)
    x64, y64 = x.astype(np.float64), y.astype(np.float64)
    z = (x * np.float32(0.001)).astype(np.float64)       # the kernel's float32 product
    want = [np.sin(x64), np.cos(x64), np.arctan2(y64, x64), np.arctan2(z, 1.0)]
    errors = [float(np.max(np.abs(g - w)) / 2.0 ** -24) for g, w in zip(got, want)]
    print(" | ".join(f"{e:.1f}" for e in errors))


def main(backends):
    import numpy
    import taichi
    print("# float32 trig accuracy of the Taichi backends here\n")
    print(f"- command: `python bench/trig_accuracy.py {' '.join(backends)}`")
    print(f"- machine: {os.uname().machine}, {os.cpu_count()} cores, no GPU (Vulkan on Mesa "
          "lavapipe, OpenGL on llvmpipe)")
    print(f"- versions: taichi {'.'.join(map(str, taichi.__version__))}, numpy {numpy.__version__}")
    print("- max |float32 result - float64 result| over 2^20 arguments, in u = 2^-24\n")
    print("| backend | sin | cos | atan2(y, x) | atan(z) |")
    print("| --- | --- | --- | --- | --- |")
    env = dict(os.environ, EGL_PLATFORM=os.environ.get("EGL_PLATFORM", "surfaceless"),
               ENABLE_TAICHI_HEADER_PRINT="False")
    for backend in backends:
        run = subprocess.run([sys.executable, __file__, "--child", backend], env=env,
                             capture_output=True, text=True)
        lines = [l for l in run.stdout.splitlines() if "|" in l]
        print(f"| {backend} | {lines[-1] if lines else 'failed: ' + run.stderr[-200:]} |")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        child(sys.argv[2])
    else:
        main(sys.argv[1:] or ["cpu", "vulkan", "opengl"])
