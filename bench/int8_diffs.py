"""How far the delegate's float view lands from LiteRT's integer kernels on an int8 model.

Runs MODEL on one backend with every tensor preserved, and LiteRT (XNNPACK, its default) on the
same seeded int8 inputs, and counts the differences in units (quantization steps) over the model
output and over every int8 tensor an op writes. Needs ai-edge-litert.

    python bench/int8_diffs.py --backend vulkan --inputs 20 [--model ../shared/models/mobilenet_v1_int8.tflite]
"""
import argparse
import json
import os
import sys
import warnings

import numpy as np


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=os.path.join(os.path.dirname(__file__), "..", "..", "shared",
                                                   "models", "mobilenet_v1_int8.tflite"))
    p.add_argument("--backend", default="vulkan")
    p.add_argument("--inputs", type=int, default=20)
    args = p.parse_args(argv)
    warnings.simplefilter("ignore")
    from ai_edge_litert.interpreter import Interpreter as LiteRT
    from tflite_taichi import Interpreter
    from tflite_taichi.testing import random_input
    ours = Interpreter(model_path=args.model, backend=args.backend, experimental_preserve_all_tensors=True)
    ours.allocate_tensors()
    lite = LiteRT(model_path=args.model, experimental_preserve_all_tensors=True)
    lite.allocate_tensors()
    s = ours.summary()
    out_index = ours.get_output_details()[0]["index"]
    tensors = [t for op in ours.model.main.operators for t in op.outputs
               if ours.model.main.tensors[t].dtype == np.int8]
    hist_out, hist_all = np.zeros(256, np.int64), np.zeros(256, np.int64)
    rng = np.random.default_rng(2026)
    for _ in range(args.inputs):
        x = random_input(ours.get_input_details()[0], rng)
        for it in (ours, lite):
            it.set_tensor(it.get_input_details()[0]["index"], x)
            it.invoke()
        for t in tensors:
            d = np.abs(ours.get_tensor(t).astype(int) - lite.get_tensor(t).astype(int)).ravel()
            counts = np.bincount(d, minlength=256)[:256]
            hist_all += counts
            if t == out_index:
                hist_out += counts
    top = int(max(np.nonzero(hist_all)[0].max(), 3)) + 1
    print(json.dumps({"model": os.path.basename(args.model), "backend": s["backend"],
                      "ops_delegated": s["ops_delegated"], "ops_total": s["ops_total"],
                      "cpu": len(s["fallback"]), "inputs": args.inputs, "int8_tensors": len(tensors),
                      "output_diff_counts": hist_out[:top].tolist(),
                      "all_int8_tensors_diff_counts": hist_all[:top].tolist()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
