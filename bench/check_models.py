"""Whole models on one backend, held against LiteRT's outputs for the same seeded inputs.

LiteRT is not on the GPU machine, so its answers travel: `--make-expected` runs LiteRT here
(XNNPACK, its default) and writes inputs and outputs per model to an .npz; the check mode runs
our Interpreter on a backend and compares every output with them (within 1e-4 of the output's
largest magnitude for fp32, 2e-2 for fp16), and reports delegation and timings.

    python bench/check_models.py --make-expected --models ../shared/models --expected .models
    python bench/check_models.py --backend vulkan --models .models --expected .models [--precision fp16]
"""
import argparse
import json
import os
import platform
import sys
import time
import warnings

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from timing import spread_ms, timed  # noqa: E402

FLOAT_MODELS = ["face_detection_short_range", "iris_landmark", "hand_landmark_lite",
                "mobilenet_v1_fp32", "selfie_segmentation"]
RTOL = {"fp32": 1e-4, "fp16": 2e-2}
SEED = 1234


def make_expected(models_dir, out_dir, names):
    from tflite_taichi.testing import random_input
    from ai_edge_litert.interpreter import Interpreter as LiteRT
    os.makedirs(out_dir, exist_ok=True)
    for name in names:
        it = LiteRT(model_path=os.path.join(models_dir, f"{name}.tflite"))
        it.allocate_tensors()
        rng = np.random.default_rng(SEED)
        arrays = {}
        for i, d in enumerate(it.get_input_details()):
            x = random_input(d, rng, 0.0, 1.0)
            it.set_tensor(d["index"], x)
            arrays[f"input_{i}"] = x
        it.invoke()
        for i, d in enumerate(it.get_output_details()):
            arrays[f"output_{i}"] = it.get_tensor(d["index"])
        np.savez(os.path.join(out_dir, f"{name}.expected.npz"), **arrays)
        print(f"{name}: LiteRT outputs written")


def check(backend, precision, models_dir, expected_dir, names, runs):
    from tflite_taichi import Interpreter
    results, ok = [], True
    for name in names:
        exp = np.load(os.path.join(expected_dir, f"{name}.expected.npz"))
        start = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            it = Interpreter(model_path=os.path.join(models_dir, f"{name}.tflite"), backend=backend,
                             precision=precision)
            it.allocate_tensors()
        for i, d in enumerate(it.get_input_details()):
            it.set_tensor(d["index"], exp[f"input_{i}"])
        it.invoke()
        it.get_tensor(it.get_output_details()[0]["index"])
        first = time.perf_counter() - start
        times = timed(it.invoke, runs)
        s = it.summary()
        errors = []
        for i, d in enumerate(it.get_output_details()):
            y, e = it.get_tensor(d["index"]).astype(np.float64), exp[f"output_{i}"].astype(np.float64)
            errors.append(float(np.max(np.abs(y - e)) / max(np.max(np.abs(e)), 1e-30)))
        passed = max(errors) <= RTOL[precision] and not s["fallback"]
        ok &= passed
        row = {"model": name, "backend": s["backend"], "precision": precision,
               "ops": s["ops_total"], "delegated": s["ops_delegated"], "folded": s["ops_folded"],
               "cpu": len(s["fallback"]), "partitions": len(s["partitions"]),
               "kernels": sum(p["kernels"] for p in s["partitions"]),
               "max_rel_err": max(errors), "first_invoke_s": round(first, 3),
               **{key: round(ms, 3) for key, ms in spread_ms(times).items()},
               "pass": passed}
        if s["cache"] is not None:
            row["cache"] = s["cache"]["state"]
        if s["runtime"] is not None:
            row.update(device=s["runtime"]["device"], waits=s["runtime"]["waits_per_invoke"],
                       build_s=s["runtime"]["build_s"])
        if s["fallback"]:
            row["fallback"] = s["fallback"][:5]
        results.append(row)
        print(json.dumps(row), flush=True)
    return ok, results


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default=os.path.join(os.path.dirname(__file__), "..", "..", "shared", "models"))
    p.add_argument("--expected", default=".models")
    p.add_argument("--make-expected", action="store_true")
    p.add_argument("--backend", default="auto")
    p.add_argument("--precision", default="fp32", choices=("fp32", "fp16"))
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--only", nargs="*", default=None)
    args = p.parse_args(argv)
    names = args.only or FLOAT_MODELS
    if args.make_expected:
        make_expected(args.models, args.expected, names)
        return 0
    import taichi
    print(json.dumps({"python": sys.version.split()[0], "numpy": np.__version__,
                      "taichi": taichi.__version__, "machine": platform.node(),
                      "processor": platform.processor() or platform.machine()}))
    ok, _ = check(args.backend, args.precision, args.models, args.expected, names, args.runs)
    print("ALL PASS" if ok else "SOME FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
