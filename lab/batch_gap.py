"""Why one `tflite-taichi batch` worker at batch 1 ran at ~0.8x a plain loop on the H200
(bench/results/batch_h200.md): the same images through variants of the loop, each in its
own process, and the pool with one worker, in one run.

    python lab/batch_gap.py MODEL FOLDER --n 3000 --backend cuda

Variants: the plain loop; the loop after resize_tensor_input to the same shape (the pool's
runner resized before it allocated); the loop with CUDA_VISIBLE_DEVICES=0 (the pool sets it per
worker); the loop in a spawned multiprocessing child (how the pool starts workers); the pool
driven in-process; the command line (`python -m tflite_taichi batch`, as batch_scale.py runs it;
added after bench/results/batch_gap_h200.json was measured, and not run on a GPU yet).
"""
import argparse
import json
import multiprocessing
import os
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def loop(model, files, backend, preprocess, resize) -> float:
    from tflite_taichi.batch.inputs import decode, input_spec, parse_preprocess
    from tflite_taichi.interpreter import Interpreter
    spec = input_spec(Interpreter(model_path=model, backend="reference"), parse_preprocess(preprocess))
    it = Interpreter(model_path=model, backend=backend)
    i_in = it.get_input_details()[0]["index"]
    if resize:
        it.resize_tensor_input(i_in, list(it.get_input_details()[0]["shape"]))
    it.allocate_tensors()
    i_out = it.get_output_details()[0]["index"]
    began = time.perf_counter()
    for path in files:
        with open(path, "rb") as f:
            x = decode(spec, path, f.read())[0]
        it.set_tensor(i_in, x[None])
        it.invoke()
        np.array(it.get_tensor(i_out)[0], copy=True)
    return len(files) / (time.perf_counter() - began)


def _spawned(queue, *args):
    queue.put(loop(*args))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model")
    p.add_argument("folder")
    p.add_argument("--n", type=int, default=3000)
    p.add_argument("--backend", default="cuda")
    p.add_argument("--preprocess", default="signed")
    p.add_argument("--variant", help=argparse.SUPPRESS)
    p.add_argument("--out")
    args = p.parse_args()
    files = sorted(os.path.join(args.folder, n) for n in os.listdir(args.folder))[:args.n]
    if args.variant:
        if args.variant == "spawned":
            ctx = multiprocessing.get_context("spawn")
            queue = ctx.Queue()
            child = ctx.Process(target=_spawned, args=(queue, args.model, files, args.backend,
                                                       args.preprocess, False))
            child.start()
            rate = queue.get()
            child.join()
        else:
            rate = loop(args.model, files, args.backend, args.preprocess, args.variant == "resized")
        print(json.dumps({"variant": args.variant, "images_per_s": round(rate, 1)}))
        return 0
    rows = []
    for variant in ("plain", "resized", "cuda_visible_devices", "spawned", "pool", "cli", "plain"):
        if variant == "cli":
            import tempfile
            with tempfile.TemporaryDirectory() as images, tempfile.TemporaryDirectory() as out:
                for f in files:
                    os.symlink(os.path.abspath(f), os.path.join(images, os.path.basename(f)))
                subprocess.run([sys.executable, "-m", "tflite_taichi", "batch", args.model, images,
                                "--out", out, "--backend", args.backend, "--workers", "1",
                                "--batch", "1", "--format", "npz", "--preprocess",
                                args.preprocess], check=True, capture_output=True)
                with open(os.path.join(out, "_outputs.json")) as f:
                    summary = json.load(f)["summary"]
            rows.append({"variant": "the command line (1 worker, batch 1), after start",
                         "images_per_s": summary["steady_items_per_s"]})
        elif variant == "pool":
            import tempfile
            from tflite_taichi import batch
            with tempfile.TemporaryDirectory() as images, tempfile.TemporaryDirectory() as out:
                for f in files:
                    os.symlink(os.path.abspath(f), os.path.join(images, os.path.basename(f)))
                r = batch.run(args.model, [images], out, backend=args.backend, batch_size=1,
                              workers=1, fmt="npz", preprocess=args.preprocess)
            rows.append({"variant": "pool (1 worker, batch 1), after start",
                         "images_per_s": r.steady_items_per_second})
        else:
            env = dict(os.environ)
            if variant == "cuda_visible_devices":
                env["CUDA_VISIBLE_DEVICES"] = "0"
            proc = subprocess.run([sys.executable, os.path.abspath(__file__), args.model, args.folder,
                                   "--n", str(args.n), "--backend", args.backend, "--preprocess",
                                   args.preprocess, "--variant", variant], env=env,
                                  capture_output=True, text=True)
            if proc.returncode != 0:
                raise SystemExit(proc.stderr[-3000:])
            rows.append(json.loads(proc.stdout.strip().splitlines()[-1]))
        print(rows[-1], flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"command": " ".join(sys.argv), "images": len(files), "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, ROOT)
    sys.exit(main())
