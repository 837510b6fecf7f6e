"""Where convolutions lose on a backend (issue #13, item 2): MobileNet v1's convolution shapes as
one-op models, each invoke's median minus the backend's empty invoke (a RELU of 8 floats: the
launch, copies and wait), side by side per backend.

    python lab/conv_shapes.py --backends cuda vulkan [--runs 100] [--json F]

Each backend in a process of its own (Taichi runs one arch per process); the first invoke
compiles, then 10 warm-up and --runs timed invokes. A developer's tool: the table says which
shape classes (pointwise at 112-7 px, 3x3 depthwise, the strided stem) a work layout must fix.

`--chain N`: each layer's cost as the slope of a chain of N copies of it (C_out -> C_out at the
output size, stride 1) against one copy: (t_N - t_1) / (N - 1). Copies in and out and the wait
cancel there, which the one-op difference leaves in (the stem is left out: it cannot chain).
"""
import argparse
import json
import os
import sys

import numpy as np

# the maintained harnesses this probe builds on live in bench/
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "bench"))
from cost_constants import invoke_us, run_children  # noqa: E402
from gemm_micro import chain_model  # noqa: E402

# (name, kind, input H=W, C_in, C_out, stride): MobileNet v1 224's layers
LAYERS = [("stem 3x3/2", "conv3", 224, 3, 32, 2),
          ("dw 112 c32", "dw", 112, 32, 32, 1), ("pw 112 32->64", "pw", 112, 32, 64, 1),
          ("dw 112 c64 /2", "dw", 112, 64, 64, 2), ("pw 56 64->128", "pw", 56, 64, 128, 1),
          ("dw 56 c128", "dw", 56, 128, 128, 1), ("pw 56 128->128", "pw", 56, 128, 128, 1),
          ("pw 28 128->256", "pw", 28, 128, 256, 1), ("dw 28 c256", "dw", 28, 256, 256, 1),
          ("pw 28 256->256", "pw", 28, 256, 256, 1), ("pw 14 256->512", "pw", 14, 256, 512, 1),
          ("dw 14 c512", "dw", 14, 512, 512, 1), ("pw 14 512->512", "pw", 14, 512, 512, 1),
          ("pw 7 512->1024", "pw", 7, 512, 1024, 1), ("dw 7 c1024", "dw", 7, 1024, 1024, 1),
          ("pw 7 1024->1024", "pw", 7, 1024, 1024, 1)]


def _model(kind, h, c_in, c_out, stride):
    from tflite_taichi.testing import Const, Input, Output, one_op_model
    rng = np.random.default_rng(0)
    out_h = -(-h // stride)
    k = 1 if kind == "pw" else 3
    opts = dict(padding="SAME", stride_h=stride, stride_w=stride, fused_activation_function="RELU6")
    if kind == "dw":
        return one_op_model("DEPTHWISE_CONV_2D", [
            Input((1, h, h, c_in)), Const(rng.uniform(-1, 1, (1, 3, 3, c_in)).astype(np.float32)),
            Const(np.zeros(c_in, np.float32))], [Output((1, out_h, out_h, c_in))],
            depth_multiplier=1, **opts)
    return one_op_model("CONV_2D", [
        Input((1, h, h, c_in)), Const(rng.uniform(-1, 1, (c_out, k, k, c_in)).astype(np.float32)),
        Const(np.zeros(c_out, np.float32))], [Output((1, out_h, out_h, c_out))], **opts)


def _chain(kind, h, c, layers):
    """`layers` copies of a C -> C pointwise (gemm_micro's chain) or 3x3 depthwise conv at h x h,
    stride 1, RELU6."""
    if kind == "pw":
        return chain_model(h, c, layers)
    from tflite_taichi.builder import ModelBuilder
    rng = np.random.default_rng(0)
    b = ModelBuilder()
    g = b.subgraph()
    t = g.input("x", (1, h, h, c))
    for i in range(layers):
        out = g.tensor(f"y{i}", (1, h, h, c))
        bias = g.const(f"b{i}", np.zeros(c, np.float32))
        opts = dict(padding="SAME", stride_h=1, stride_w=1, fused_activation_function="RELU6")
        w = g.const(f"w{i}", rng.uniform(-0.3, 0.3, (1, 3, 3, c)).astype(np.float32))
        g.op("DEPTHWISE_CONV_2D", [t, w, bias], [out], depth_multiplier=1, **opts)
        t = out
    g.output(t)
    return b.finish()


def measure_chains(backend, runs, layers):
    rows = {}
    for name, kind, h, _c_in, c_out, stride in LAYERS:
        if kind == "conv3":
            continue
        out_h = -(-h // stride)
        one = invoke_us(_chain(kind, out_h, c_out, 1), backend, runs)
        many = invoke_us(_chain(kind, out_h, c_out, layers), backend, runs)
        us = (many - one) / (layers - 1)
        macs = out_h * out_h * c_out * (9 if kind == "dw" else c_out)
        rows[name] = {"us": round(us, 1), "gmacs": round(macs / max(us, 1e-3) / 1e3, 1),
                      "one_us": round(one, 1), "chain_us": round(many, 1)}
    return {"backend": backend, "chain": layers, "layers": rows}


def measure(backend, runs, chain=0):
    from tflite_taichi.testing import Input, Output, one_op_model
    if chain:
        return measure_chains(backend, runs, chain)
    floor = invoke_us(one_op_model("RELU", [Input((1, 8))], [Output((1, 8))]), backend, runs)
    rows = {}
    for name, kind, h, c_in, c_out, stride in LAYERS:
        us = invoke_us(_model(kind, h, c_in, c_out, stride), backend, runs)
        k = 1 if kind == "pw" else 3
        out_h = -(-h // stride)
        macs = out_h * out_h * c_out * k * k * (1 if kind == "dw" else c_in)
        rows[name] = {"us": round(us - floor, 1), "gmacs": round(macs / max(us - floor, 1e-3) / 1e3, 1)}
    return {"backend": backend, "empty_invoke_us": round(floor, 1), "layers": rows}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backends", nargs="+", default=["cpu"])
    p.add_argument("--runs", type=int, default=100)
    p.add_argument("--chain", type=int, default=0, help="time each layer as a chain of N copies")
    p.add_argument("--json")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print("RESULT " + json.dumps(measure(args.child, args.runs, args.chain)), flush=True)
        return 0
    extra = ["--chain", str(args.chain)] if args.chain else []
    results = run_children(__file__, args.backends, args.runs, extra)
    ok = [r for r in results if "layers" in r]
    print("| layer | " + " | ".join(f"{r['backend']} us (GMAC/s)" for r in ok) + " |")
    print("| --- |" + " --- |" * len(ok))
    for name, *_ in LAYERS:
        if all(name in r["layers"] for r in ok):
            print(f"| {name} | " + " | ".join(f"{r['layers'][name]['us']} ({r['layers'][name]['gmacs']})"
                                           for r in ok) + " |")
    if not args.chain:
        print("| empty invoke | " + " | ".join(f"{r['empty_invoke_us']}" for r in ok) + " |")
    for r in results:
        if "error" in r:
            print(f"{r['backend']}: {r['error']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"runs": args.runs, "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
