"""Pointwise-conv kernel shapes of MobileNet v1, each as a chain of identical 1x1 CONV_2D layers
(so GPU work, not the launch, dominates), timed with the shared-memory GEMM tiles off (the
register-tiled gather, PointwiseConvStep) and with several tile shapes (ops/conv/kernels.py GemmTileStep;
TFLITE_TAICHI_GEMM_TILES = tile_m,tile_n,micro_m,micro_n). The A/B behind GEMM_CONFIG.

    python bench/gemm_micro.py --backend cuda [--layers 8] [--runs 100]

Prints per shape and config: median and p10-p90 invoke time, and the time per layer.
"""
import argparse
import os
import sys
import time

import numpy as np

SHAPES = [(112, 64), (56, 128), (28, 256), (14, 512), (7, 1024)]   # (side, channels): MobileNet's pointwise convs
CONFIGS = ["off", "64,64,4,4", "32,64,2,4", "32,32,2,2", "64,32,4,2", "16,64,1,4"]


def chain_model(side: int, channels: int, layers: int) -> bytes:
    from tflite_taichi.builder import ModelBuilder
    rng = np.random.default_rng(0)
    b = ModelBuilder()
    g = b.subgraph()
    t = g.input("x", (1, side, side, channels))
    for i in range(layers):
        out = g.tensor(f"t{i}", (1, side, side, channels))
        w = (rng.uniform(-1, 1, (channels, 1, 1, channels)) / np.sqrt(channels)).astype(np.float32)
        g.op("CONV_2D", [t, g.const(f"w{i}", w), g.const(f"b{i}", np.zeros(channels, np.float32))],
             [out], padding="VALID", stride_h=1, stride_w=1, fused_activation_function="RELU6")
        t = out
    g.output(t)
    return b.finish()


def time_invokes(it, x, runs):
    it.set_tensor(it.get_input_details()[0]["index"], x)
    for _ in range(10):
        it.invoke()
    t = []
    for _ in range(runs):
        s = time.perf_counter()
        it.invoke()
        t.append(time.perf_counter() - s)
    return 1e3 * np.percentile(t, [50, 10, 90])


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", default="cuda")
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--runs", type=int, default=100)
    p.add_argument("--configs", nargs="*", default=CONFIGS)
    p.add_argument("--shapes", nargs="*", default=[f"{s}x{c}" for s, c in SHAPES],
                   help="SIDExCHANNELS, e.g. 14x512")
    a = p.parse_args()
    # a tile config runs tiled whatever its block count (ops/conv/select.py's GEMM_MIN_BLOCKS would send
    # small shapes back to the gather, and the A/B would compare a kernel with itself)
    os.environ["TFLITE_TAICHI_GEMM_MIN_BLOCKS"] = "1"
    from tflite_taichi import Interpreter
    print(f"backend {a.backend}, {a.layers} chained 1x1 CONV_2D (RELU6) per shape, {a.runs} invokes")
    for side, ch in (tuple(int(v) for v in spec.split("x")) for spec in a.shapes):
        model = chain_model(side, ch, a.layers)
        x = np.random.default_rng(1).uniform(0, 1, (1, side, side, ch)).astype(np.float32)
        reference = None
        for config in a.configs:
            os.environ.pop("TFLITE_TAICHI_NO_SHARED_TILES", None)
            os.environ.pop("TFLITE_TAICHI_GEMM_TILES", None)
            if config == "off":
                os.environ["TFLITE_TAICHI_NO_SHARED_TILES"] = "1"
            else:
                os.environ["TFLITE_TAICHI_GEMM_TILES"] = config
            it = Interpreter(model_content=model, backend=a.backend)
            it.allocate_tensors()
            med, p10, p90 = time_invokes(it, x, a.runs)
            y = it.get_tensor(it.get_output_details()[0]["index"])
            reference = y if reference is None else reference
            diff = float(np.abs(y - reference).max())
            print(f"  {side:3d}x{side:<3d}x{ch:<4d} {config:10s} median {med:7.3f} ms "
                  f"(p10 {p10:.3f}, p90 {p90:.3f})  {1e3 * med / a.layers:7.1f} us/layer  "
                  f"max|diff vs off| {diff:.1e}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
