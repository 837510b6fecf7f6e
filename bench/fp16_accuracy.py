"""How far precision='fp16' lands from float32, on realistic inputs.

For each model: the reference path's float32 outputs; the same graph with every op's float32
output rounded to float16 (what float16 storage of every tensor costs at best: float32
arithmetic, one round-to-nearest per stored tensor; the `ideal f16 storage` column); our
fp16 on each backend asked for; and LiteRT GPU's own fp16 (CompiledModel, ML Drift) where it
starts (a hardware Vulkan device: not lavapipe). Inputs are realistic, not noise:
`testing.synthetic_portrait` (with its seeded noise) for selfie_segmentation,
`testing.natural_image` (1/f spectrum) for the rest, one per seed.

    python bench/fp16_accuracy.py [MODEL ...] [--backends cpu vulkan] [--seeds 5] [--litert-gpu]
                                  [--out bench/results/fp16_accuracy_NAME]

Each cell: the largest |fp16 - fp32| over the outputs and seeds, as a fraction of the fp32
output's range (max - min), then the 99.9th percentile, then how many elements exceed 2e-2
(the acceptance criterion), over all seeds.
"""
import argparse
import json
import os
import platform
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_MODELS = os.environ.get("TFLITE_TAICHI_MODELS", os.path.join(HERE, "..", "..", "shared", "models"))
FLOAT_MODELS = ["face_detection_short_range", "iris_landmark", "hand_landmark_lite",
                "mobilenet_v1_fp32", "selfie_segmentation"]
CRITERION = 2e-2


def realistic_inputs(interpreter, name: str, seed: int) -> list:
    from tflite_taichi.testing import natural_image, synthetic_portrait
    rng = np.random.default_rng(seed)
    inputs = []
    for d in interpreter.get_input_details():
        _, h, w, c = d["shape"]
        x = (synthetic_portrait(h, w, rng) if "selfie" in name else natural_image(h, w, rng, c))
        inputs.append(x.astype(d["dtype"]))
    return inputs


def _run(interpreter, inputs) -> list:
    interpreter.allocate_tensors()
    for d, x in zip(interpreter.get_input_details(), inputs):
        interpreter.set_tensor(d["index"], x)
    interpreter.invoke()
    return [np.array(interpreter.get_tensor(d["index"]), np.float32)
            for d in interpreter.get_output_details()]


def ideal_f16_storage(path: str, inputs) -> list:
    """The reference path with each op's float32 output (and each float32 constant) rounded
    to float16, as float16 storage with float32 arithmetic would give at best."""
    from tflite_taichi import Interpreter
    from tflite_taichi import graph as graph_mod

    def f16(v):
        if isinstance(v, np.ndarray) and v.dtype == np.float32:
            return v.astype(np.float16).astype(np.float32)
        return v

    it = Interpreter(model_path=path, backend="reference")
    it.allocate_tensors()
    sub = it._main                          # the main subgraph's prepared graph and runtime
    feeds = {d["index"]: x for d, x in zip(it.get_input_details(), inputs)}
    values = {t: f16(v) for t, v in sub.prepared.constants.items()}
    values.update({t: f16(np.asarray(v, np.float32)) for t, v in feeds.items()})
    for step in sub.prepared.steps:
        args = [values[t] if t != -1 else None for t in step.op.inputs]
        for t, v in zip(step.op.outputs, graph_mod.run_step(step, args, sub.runtime, None)):
            values[t] = f16(v)
    return [values[d["index"]] for d in it.get_output_details()]


def litert_gpu_fp16(path: str, inputs):
    """LiteRT GPU's fp16 outputs, or the reason it did not start."""
    try:
        from tflite_taichi import Interpreter
        from tflite_taichi.tools.bench_child import CompiledModelRuntime
        ours = Interpreter(model_path=path, backend="reference")
        io = {"inputs": [{"name": d["name"], "shape": list(d["shape"])} for d in ours.get_input_details()],
              "outputs": [{"name": d["name"], "shape": list(d["shape"])} for d in ours.get_output_details()]}
        rt = CompiledModelRuntime({"model": path, "backend": "litert_gpu_fp16", "io": io})
        rt.construct()
        rt.allocate()
        rt.set_inputs(inputs)
        rt.invoke()
        return [np.array(o, np.float32) for o in rt.get_outputs()]
    except Exception as e:                  # no adapter on lavapipe, no LiteRT: say why
        return f"{type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}"


def compare(actual: list, expected: list) -> np.ndarray:
    """|actual - expected| / range(expected), every output's elements, flattened."""
    parts = []
    for a, e in zip(actual, expected):
        span = float(e.max() - e.min()) or 1.0
        parts.append((np.abs(a.astype(np.float64) - e) / span).ravel())
    return np.concatenate(parts)


def summarise(errors: list) -> dict:
    if not errors:
        return {}
    e = np.concatenate(errors)
    return {"max": float(e.max()), "p99.9": float(np.quantile(e, 0.999)),
            "over_criterion": int((e > CRITERION).sum()), "elements": int(e.size)}


def model_rows(path: str, workers: dict, seeds: int, litert_gpu: bool) -> dict:
    """`workers`: backend -> testing.BackendWorker (one Taichi backend per process)."""
    from tflite_taichi import Interpreter
    name = os.path.splitext(os.path.basename(path))[0]
    model = open(path, "rb").read()
    columns = {"ideal f16 storage": [], **{f"{b} fp16": [] for b in workers}}
    notes = {}
    if litert_gpu:
        columns["litert_gpu fp16"] = []
    reference = Interpreter(model_path=path, backend="reference")
    for seed in range(seeds):
        inputs = realistic_inputs(reference, name, seed)
        expected = _run(reference, inputs)
        columns["ideal f16 storage"].append(compare(ideal_f16_storage(path, inputs), expected))
        for b, worker in workers.items():
            outputs, _ = worker.run(model, inputs, "fp16")
            columns[f"{b} fp16"].append(compare([np.asarray(o, np.float32) for o in outputs], expected))
        if litert_gpu:
            got = litert_gpu_fp16(path, inputs)
            if isinstance(got, str):
                notes["litert_gpu fp16"] = got
                columns.pop("litert_gpu fp16", None)
                litert_gpu = False
            else:
                columns["litert_gpu fp16"].append(compare(got, expected))
    return {"model": name, "columns": {k: summarise(v) for k, v in columns.items()}, "notes": notes}


def cell(s: dict) -> str:
    return f"{s['max']:.2e} / {s['p99.9']:.1e} / {s['over_criterion']}" if s else "-"


def markdown(rows, command: str) -> str:
    import taichi as ti
    heads = list(dict.fromkeys(k for r in rows for k in r["columns"]))
    lines = ["# fp16 accuracy on realistic inputs", "",
             f"Command: `{command}`", "",
             f"Machine: {platform.node()} ({platform.machine()}, {os.cpu_count()} cores), "
             f"Python {platform.python_version()}, numpy {np.__version__}, taichi {'.'.join(map(str, ti.__version__))}.", "",
             "Each cell: max |fp16 - fp32| / range(fp32 output) over outputs and seeds / its 99.9th "
             f"percentile / elements over {CRITERION:g}.", "",
             "| model | " + " | ".join(heads) + " |",
             "| --- |" + " --- |" * len(heads)]
    for r in rows:
        lines.append(f"| {r['model']} | " + " | ".join(cell(r["columns"].get(h, {})) for h in heads) + " |")
    notes = {k: v for r in rows for k, v in r["notes"].items()}
    for k, v in notes.items():
        lines += ["", f"{k}: not measured here ({v})."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("models", nargs="*", default=FLOAT_MODELS)
    p.add_argument("--models-dir", default=DEFAULT_MODELS)
    p.add_argument("--backends", nargs="*", default=["cpu"])
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--litert-gpu", action="store_true", help="also LiteRT GPU's fp16 (hardware Vulkan)")
    p.add_argument("--out", help="write OUT.md and OUT.json")
    args = p.parse_args(argv)
    paths = [m if m.endswith(".tflite") else os.path.join(args.models_dir, m + ".tflite") for m in args.models]
    from tflite_taichi.testing import BackendWorker
    workers = {b: BackendWorker(b, timeout=1800) for b in args.backends}
    rows = []
    try:
        for path in paths:
            rows.append(model_rows(path, workers, args.seeds, args.litert_gpu))
            print(json.dumps(rows[-1]), flush=True)
    finally:
        for w in workers.values():
            w.close()
    text = markdown(rows, "python bench/fp16_accuracy.py " + " ".join(argv if argv is not None else sys.argv[1:]))
    print(text)
    if args.out:
        with open(args.out + ".md", "w") as f:
            f.write(text)
        with open(args.out + ".json", "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
