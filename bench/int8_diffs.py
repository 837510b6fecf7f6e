"""How far the delegate's float view lands from LiteRT's integer kernels on an int8 model.

Runs MODEL on one backend with every tensor preserved, and LiteRT (XNNPACK, its default) on the
same seeded int8 inputs, invoked one after another in one interpreter each (so a stateful model
such as okay_nabu runs as a sequence), and counts the differences in units (quantization steps)
over the model output and over every int8 tensor an op writes.

    python bench/int8_diffs.py --backend vulkan --inputs 20 [--model ../shared/models/mobilenet_v1_int8.tflite]

Where LiteRT is not installed (the GPU machine), record LiteRT's side first and check against it:

    python bench/int8_diffs.py --model M --inputs 20 --all-tensors 4 --make-expected M.int8.npz
    python bench/int8_diffs.py --model M --backend cuda --expected M.int8.npz

`--all-tensors K` keeps every int8 tensor for the first K inputs only (the others: the output),
so the file stays small enough to carry.
"""
import argparse
import json
import os
import sys
import warnings

import numpy as np

DEFAULT_MODEL = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "models",
                             "mobilenet_v1_int8.tflite")


def _int8_tensors(model_path):
    from tflite_taichi import Interpreter
    it = Interpreter(model_path=model_path, backend="reference")
    main = it.model.main
    out_index = it.get_output_details()[0]["index"]          # int8, or uint8 (okay_nabu)
    tensors = [t for op in main.operators for t in op.outputs if main.tensors[t].dtype == np.int8]
    return tensors + ([out_index] if out_index not in tensors else []), out_index, it.get_input_details()[0]


def _inputs(detail, count):
    from tflite_taichi.testing import random_input
    rng = np.random.default_rng(2026)
    return [random_input(detail, rng) for _ in range(count)]


def make_expected(args):
    from ai_edge_litert.interpreter import Interpreter as LiteRT
    tensors, out_index, in_detail = _int8_tensors(args.model)
    lite = LiteRT(model_path=args.model, experimental_preserve_all_tensors=True)
    lite.allocate_tensors()
    saved = {}
    for i, x in enumerate(_inputs(in_detail, args.inputs)):
        lite.set_tensor(lite.get_input_details()[0]["index"], x)
        lite.invoke()
        saved[f"input_{i}"] = x
        keep = tensors if i < args.all_tensors else [out_index]
        for t in keep:
            saved[f"t{t}_{i}"] = lite.get_tensor(t)
    np.savez_compressed(args.make_expected, **saved)
    print(f"wrote {args.make_expected}: {args.inputs} inputs, all int8 tensors for {args.all_tensors}")
    return 0


def _recorded(path, tensors):
    """(inputs, source, litert(i, x) -> {tensor: array}) from a --make-expected file."""
    expected = np.load(path)
    count = sum(1 for k in expected.files if k.startswith("input_"))

    def litert(i, _x):
        return {t: expected[f"t{t}_{i}"] for t in tensors if f"t{t}_{i}" in expected.files}
    return ([expected[f"input_{i}"] for i in range(count)],
            f"LiteRT outputs recorded in {os.path.basename(path)}", litert)


def _live(model, tensors, inputs):
    """The same, LiteRT (XNNPACK) run here on `inputs`, in order (its state carries over)."""
    from ai_edge_litert.interpreter import Interpreter as LiteRT
    lite = LiteRT(model_path=model, experimental_preserve_all_tensors=True)
    lite.allocate_tensors()

    def litert(_i, x):
        lite.set_tensor(lite.get_input_details()[0]["index"], x)
        lite.invoke()
        return {t: lite.get_tensor(t) for t in tensors}
    return inputs, "LiteRT (XNNPACK) in this process", litert


def check(args):
    from tflite_taichi import Interpreter
    tensors, out_index, in_detail = _int8_tensors(args.model)
    ours = Interpreter(model_path=args.model, backend=args.backend, experimental_preserve_all_tensors=True,
                       max_delegated_partitions=args.max_partitions)
    ours.allocate_tensors()
    inputs, source, litert = (_recorded(args.expected, tensors) if args.expected
                              else _live(args.model, tensors, _inputs(in_detail, args.inputs)))
    s = ours.summary()
    hist_out, hist_all = np.zeros(256, np.int64), np.zeros(256, np.int64)
    full_inputs = 0
    for i, x in enumerate(inputs):
        ours.set_tensor(ours.get_input_details()[0]["index"], x)
        ours.invoke()
        expected = litert(i, x)
        full_inputs += len(expected) == len(tensors)
        for t, e in expected.items():
            d = np.abs(ours.get_tensor(t).astype(int) - e.astype(int)).ravel()
            counts = np.bincount(d, minlength=256)[:256]
            hist_all += counts
            if t == out_index:
                hist_out += counts
    top = int(max(np.nonzero(hist_all)[0].max(), 3)) + 1
    print(json.dumps({"model": os.path.basename(args.model), "backend": s["backend"], "against": source,
                      "ops_delegated": s["ops_delegated"], "ops_total": s["ops_total"],
                      "partitions": len(s["partitions"]), "cpu": len(s["fallback"]),
                      "inputs": len(inputs), "inputs_with_all_tensors": full_inputs,
                      "int8_tensors": len(tensors),
                      "output_diff_counts": hist_out[:top].tolist(),
                      "all_int8_tensors_diff_counts": hist_all[:top].tolist()}))
    return 0


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=DEFAULT_MODEL)
    p.add_argument("--backend", default="vulkan")
    p.add_argument("--inputs", type=int, default=20)
    p.add_argument("--max-partitions", type=int, default=1)
    p.add_argument("--make-expected", metavar="FILE.npz", help="record LiteRT's side and exit")
    p.add_argument("--all-tensors", type=int, default=None,
                   help="with --make-expected: keep every int8 tensor for the first K inputs")
    p.add_argument("--expected", metavar="FILE.npz", help="compare with a recorded LiteRT run")
    args = p.parse_args(argv)
    if args.all_tensors is None:
        args.all_tensors = args.inputs
    warnings.simplefilter("ignore")
    return make_expected(args) if args.make_expected else check(args)


if __name__ == "__main__":
    sys.exit(main())
