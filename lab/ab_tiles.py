"""A/B of the shared-memory GEMM tiles on a whole model, alternating in one process so that the
machine's state is the same for every variant (issues #5 and 31): the switches of each variant
set in the environment before its Interpreter is built.

    python lab/ab_tiles.py MODEL --backend cuda [--batch 1] [--rounds 3] [--runs 200]
        [--variant LABEL:KEY=VALUE,KEY=VALUE ...]

Without --variant: tiles off (TFLITE_TAICHI_NO_SHARED_TILES=1) against the default selection.
A variant's KEY is a TFLITE_TAICHI_* switch without its prefix, e.g.
`t32:GEMM_TILES=32,32,2,2,GEMM_MIN_BLOCKS=150`.
"""
import argparse
import os
import sys
import time

import numpy as np

DEFAULT_VARIANTS = ["off:NO_SHARED_TILES=1", "default:"]


def parse_variant(spec: str) -> tuple:
    """'LABEL:KEY=VALUE,KEY=VALUE' -> (label, {'TFLITE_TAICHI_' + KEY: VALUE}); a value may hold
    commas (GEMM_TILES=32,32,2,2): a part without '=' belongs to the value before it."""
    label, _, rest = spec.partition(":")
    env, key = {}, None
    for part in filter(None, rest.split(",")):
        if "=" in part:
            key, value = part.split("=", 1)
            env[f"TFLITE_TAICHI_{key}"] = value
        elif key is not None:
            env[f"TFLITE_TAICHI_{key}"] += "," + part
        else:
            raise SystemExit(f"variant {spec!r}: {part!r} is not KEY=VALUE")
    return label, env


def time_variant(model, backend, batch, runs, env) -> tuple:
    from tflite_taichi import Interpreter
    keys = {k for _, e in VARIANTS for k in e}
    for k in keys:
        os.environ.pop(k, None)
    os.environ.update(env)
    it = Interpreter(model_path=model, backend=backend)
    d = it.get_input_details()[0]
    if batch != 1:
        it.resize_tensor_input(d["index"], [batch, *d["shape"][1:]])
    it.allocate_tensors()
    shape = it.get_input_details()[0]["shape"]
    x = np.random.default_rng(0).uniform(0, 1, shape).astype(d["dtype"]) if d["dtype"] == np.float32 \
        else np.random.default_rng(0).integers(-128, 127, shape).astype(d["dtype"])
    it.set_tensor(d["index"], x)
    for _ in range(20):
        it.invoke()
    t = []
    for _ in range(runs):
        s = time.perf_counter()
        it.invoke()
        t.append(time.perf_counter() - s)
    return tuple(1e3 * np.percentile(t, [50, 10, 90]))


VARIANTS: list = []


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model")
    p.add_argument("--backend", default="cuda")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--runs", type=int, default=200)
    p.add_argument("--variant", nargs="+", default=DEFAULT_VARIANTS)
    a = p.parse_args()
    VARIANTS[:] = [parse_variant(v) for v in a.variant]
    print(f"{a.model} on {a.backend}, batch {a.batch}, {a.runs} invokes per measurement")
    for r in range(a.rounds):
        for label, env in VARIANTS:
            med, p10, p90 = time_variant(a.model, a.backend, a.batch, a.runs, env)
            print(f"  round {r} {label:<10} median {med:.3f} ms (p10 {p10:.3f}, p90 {p90:.3f})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
