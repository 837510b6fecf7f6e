"""The constants of tflite_taichi/costs.py, measured (`auto` keeps on the CPU
what the CPU runs faster, by a cost model measured per backend).

    python bench/cost_constants.py --backends reference cuda vulkan opengl [--runs 200] [--json F]

- `reference` (numpy, the CPU path): one op's fixed cost (per op of a chain of 32 ADDs of 8
  floats; a small pool's for comparison: numpy walks its taps), its cost per element (a
  64K-element ADD) and per multiply-add (the slower of a 3x3 conv of 16 channels at 64x64 and a
  FULLY_CONNECTED 256 -> 256 of batch 64);
- a Taichi backend: an invoke's fixed cost (the one-op model: launch, copies, the wait) and
  each further task's (a chain of 32 pools, unfusable, one task each: the slope).
- `auto`: a tiny MLP classifier (FC 32 -> 64 -> 10, softmax) through backend='auto' (costs.py's
  decision and its time; each Taichi backend's row has the same MLP's time on it).
Each backend in a process of its own; medians over --runs after 10 warm-up invokes.
"""
import argparse
import json
import os
import subprocess
import sys
import time
import warnings

import numpy as np

CHAIN = 32


def _models():
    from tflite_taichi.builder import ModelBuilder
    from tflite_taichi.tools.demo import build_tiny_mlp
    from tflite_taichi.testing import Const, Input, Output, one_op_model
    rng = np.random.default_rng(0)
    b = ModelBuilder()
    g = b.subgraph()
    t = g.input("x", (1, 4, 4, 4))
    for i in range(CHAIN):
        out = g.tensor(f"p{i}", (1, 4, 4, 4))
        g.op("AVERAGE_POOL_2D", [t], [out], padding="SAME", stride_h=1, stride_w=1,
             filter_height=2, filter_width=2)
        t = out
    g.output(t)
    pools = b.finish()
    b = ModelBuilder()
    g = b.subgraph()
    t = g.input("x", (1, 8))
    for i in range(CHAIN):
        out = g.tensor(f"a{i}", (1, 8))
        g.op("ADD", [t, g.const(f"c{i}", np.full((1, 8), 0.5, np.float32))], [out])
        t = out
    g.output(t)
    adds = b.finish()
    return {
        "mlp": build_tiny_mlp(),
        "relu8": one_op_model("RELU", [Input((1, 8))], [Output((1, 8))]),
        "pools": pools,
        "adds": adds,
        "add64k": one_op_model("ADD", [Input((1, 65536)), Input((1, 65536))], [Output((1, 65536))]),
        "conv3x3": one_op_model("CONV_2D", [Input((1, 64, 64, 16)),
                                            Const(rng.uniform(-1, 1, (16, 3, 3, 16)).astype(np.float32)),
                                            Const(np.zeros(16, np.float32))], [Output((1, 64, 64, 16))],
                                padding="SAME", stride_h=1, stride_w=1),
        "fc256": one_op_model("FULLY_CONNECTED", [Input((64, 256)),
                                                  Const(rng.uniform(-1, 1, (256, 256)).astype(np.float32)),
                                                  Const(np.zeros(256, np.float32))], [Output((64, 256))]),
    }


def invoke_us(model: bytes, backend: str, runs: int) -> float:
    """Median microseconds of an invoke after allocate (compiles) and 10 warm-up invokes."""
    from tflite_taichi import Interpreter
    from tflite_taichi.testing import random_input
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        it = Interpreter(model_content=model, backend=backend)
        it.allocate_tensors()
    rng = np.random.default_rng(0)
    for d in it.get_input_details():
        it.set_tensor(d["index"], random_input(d, rng, -1.0, 1.0))
    for _ in range(10):
        it.invoke()
    ts = []
    for _ in range(runs):
        t = time.perf_counter()
        it.invoke()
        ts.append(time.perf_counter() - t)
    return float(np.median(ts) * 1e6)


def measure(backend: str, runs: int) -> dict:
    m = _models()
    if backend == "auto":               # the MLP through auto, and what it decided
        from tflite_taichi import Interpreter
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            it = Interpreter(model_content=m["mlp"], backend="auto")
            it.allocate_tensors()
        s = it.summary()
        return {"backend": "auto", "resolved": s["backend"], "mlp_us": round(invoke_us(m["mlp"], "auto", runs), 1),
                "mlp_ops_on_gpu": s["ops_delegated"],
                "reason": s["fallback"][0]["reason"] if s["fallback"] else None}
    one = invoke_us(m["relu8"], backend, runs)
    pools = invoke_us(m["pools"], backend, runs)
    if backend == "reference":
        adds = invoke_us(m["adds"], backend, runs)
        add = invoke_us(m["add64k"], backend, runs)
        fc = invoke_us(m["fc256"], backend, runs)
        conv = invoke_us(m["conv3x3"], backend, max(runs // 10, 5))
        return {"backend": backend, "op_us": round(max(adds - one, 0.0) / (CHAIN - 1), 2),
                "mlp_us": round(invoke_us(m["mlp"], backend, runs), 1),
                "pool_op_us": round(pools / CHAIN, 2),
                "ns_per_element": round(1e3 * max(add - one, 0.0) / (3 * 65536), 4),
                # the slower of a small-channel 3x3 conv (numpy's worst) and a GEMM-shaped FC:
                # overestimating numpy keeps work on the GPU when in doubt
                "ns_per_mac": round(1e3 * max(max(conv - one, 0.0) / (64 * 64 * 16 * 9 * 16),
                                              max(fc - one, 0.0) / (64 * 256 * 256)), 5),
                "raw_us": {"relu8": one, "adds": adds, "pools": pools, "add64k": add, "fc256": fc,
                           "conv3x3": conv}}
    return {"backend": backend, "invoke_us": round(one, 1),
            "task_us": round(max(pools - one, 0.0) / (CHAIN - 1), 2),
            "mlp_us": round(invoke_us(m["mlp"], backend, runs), 1),
            "raw_us": {"relu8": one, "pools": pools}}


def run_children(script: str, backends, runs: int, extra=()) -> list:
    """`script --child B --runs N [extra]` per backend, each in a process of its own (Taichi
    runs one arch per process): their RESULT lines, or the error a child ended with."""
    results = []
    for b in backends:
        out = subprocess.run([sys.executable, script, "--child", b, "--runs", str(runs), *extra],
                             capture_output=True, text=True, env=os.environ)
        line = [l for l in out.stdout.splitlines() if l.startswith("RESULT ")]
        results.append(json.loads(line[0][7:]) if line
                       else {"backend": b, "error": (out.stderr or out.stdout)[-400:]})
    return results


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backends", nargs="+", default=["reference", "cpu"])
    p.add_argument("--runs", type=int, default=200)
    p.add_argument("--json")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print("RESULT " + json.dumps(measure(args.child, args.runs)), flush=True)
        return 0
    results = run_children(__file__, args.backends, args.runs)
    for r in results:
        print(json.dumps(r), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"runs": args.runs, "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
