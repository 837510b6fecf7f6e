"""Does a backend's kernel time depend on how long the GPU has been busy (its clocks)? Invokes a
chain of 10 pointwise convs (56x56, 128 -> 128) back to back for --seconds and prints the median
invoke of each half second; run it beside `nvidia-smi --query-gpu=clocks.sm,pstate ... -lms 200`.

    python lab/clock_probe.py --backend vulkan --seconds 6
"""
import argparse
import sys
import time

import numpy as np

from conv_shapes import _chain   # lab/, the script's folder


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", default="vulkan")
    p.add_argument("--seconds", type=float, default=6.0)
    p.add_argument("--idle", type=float, default=2.0, help="sleep before starting (GPU idles)")
    p.add_argument("--cuda-context", action="store_true",
                   help="hold a CUDA context (no kernels) in the process while invoking")
    args = p.parse_args(argv)
    if args.cuda_context:
        import ctypes
        cu = ctypes.CDLL("libcuda.so.1")
        ctx, dev = ctypes.c_void_p(), ctypes.c_int()
        assert cu.cuInit(0) == 0 and cu.cuDeviceGet(ctypes.byref(dev), 0) == 0
        assert cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0
        assert cu.cuCtxSetCurrent(ctx) == 0
    import warnings
    warnings.simplefilter("ignore")
    from tflite_taichi import Interpreter
    it = Interpreter(model_content=_chain("pw", 56, 128, 10), backend=args.backend)
    it.allocate_tensors()
    it.invoke()
    time.sleep(args.idle)
    start = time.perf_counter()
    window, window_start = [], start
    while time.perf_counter() - start < args.seconds:
        t = time.perf_counter()
        it.invoke()
        window.append(time.perf_counter() - t)
        if t - window_start >= 0.5:
            print(f"{args.backend} t={t - start:5.2f}s invokes={len(window):5d} "
                  f"median={1e6 * np.median(window):8.1f} us", flush=True)
            window, window_start = [], t
    return 0


if __name__ == "__main__":
    sys.exit(main())
