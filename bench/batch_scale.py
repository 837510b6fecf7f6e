"""Issue 17's measurement: `tflite-taichi batch` over a folder of images with 1, 2, 4 workers
sharing one GPU, against one Interpreter in a user's loop and against LiteRT CPU's loop, on the
same JPEG files, each run in its own process (side by side, one machine, one call).

    python bench/batch_scale.py images MODEL DIR --n 10000          # write N JPEGs (once)
    python bench/batch_scale.py run MODEL DIR --backend cuda --workers 1 2 4 --batch 1 32 \\
        --preprocess signed --runtimes ours litert --threads 16 --out NAME   # NAME.md, NAME.json

Each runtime decodes with the same code (tflite_taichi.batch.inputs.decode: Pillow, resized to
the model's input, normalised by --preprocess). "images/s" is the whole run, the workers' start
included; "steady" counts only after every worker had started. The one-interpreter and LiteRT
loops save their outputs, and each batch run's outputs are compared with the interpreter's.
"""
import argparse
import json
import os
import platform
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def write_images(model: str, folder: str, n: int, side: int = 0) -> None:
    """N JPEGs of the model's input size (or side x side): smooth random scenes (a coarse random
    grid upsampled, plus grain), so they compress as photos do (~16 kB), not as noise."""
    from concurrent.futures import ProcessPoolExecutor
    os.makedirs(folder, exist_ok=True)
    if side:
        size = (side, side)
    else:
        from tflite_taichi.interpreter import Interpreter
        shape = Interpreter(model_path=model, backend="reference").get_input_details()[0]["shape"]
        size = (int(shape[2]), int(shape[1]))
    with ProcessPoolExecutor() as pool:
        list(pool.map(_one_image, [(folder, i, size) for i in range(n)], chunksize=64))


def _one_image(args) -> None:
    from PIL import Image
    folder, i, (w, h) = args
    rng = np.random.default_rng(i)
    coarse = Image.fromarray(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8))
    pixels = np.asarray(coarse.resize((w, h), Image.Resampling.BICUBIC), dtype=np.int16)
    pixels = np.clip(pixels + rng.integers(-12, 13, pixels.shape), 0, 255).astype(np.uint8)
    Image.fromarray(pixels).save(os.path.join(folder, f"img{i:06d}.jpg"), quality=90)


def _files(folder: str) -> list:
    return sorted(os.path.join(folder, n) for n in os.listdir(folder) if n.endswith(".jpg"))


def loop(runtime: str, model: str, folder: str, backend: str, preprocess: str, threads: int,
         save: str) -> dict:
    """A user's loop in this process: read, decode, set, invoke, get, per image."""
    from tflite_taichi.batch.inputs import decode, input_spec, parse_preprocess
    from tflite_taichi.interpreter import Interpreter as Ours
    spec = input_spec(Ours(model_path=model, backend="reference"), parse_preprocess(preprocess))
    started = time.perf_counter()
    if runtime == "litert":
        from ai_edge_litert.interpreter import Interpreter
        it = Interpreter(model_path=model, num_threads=threads)
    else:
        it = Ours(model_path=model, backend=backend)
    it.allocate_tensors()
    start_s = time.perf_counter() - started
    i_in, i_out = it.get_input_details()[0]["index"], it.get_output_details()[0]["index"]
    files, outputs = _files(folder), []
    began = time.perf_counter()
    for path in files:
        with open(path, "rb") as f:
            x = decode(spec, path, f.read())[0]
        it.set_tensor(i_in, x[None])
        it.invoke()
        outputs.append(np.array(it.get_tensor(i_out)[0], copy=True))
    seconds = time.perf_counter() - began
    np.save(save, np.stack(outputs))
    return {"runtime": runtime, "backend": backend if runtime == "ours" else "litert-cpu",
            "workers": 1, "items_per_invoke": 1, "start_s": round(start_s, 3),
            "seconds": round(seconds + start_s, 3),
            "images_per_s": round(len(files) / (seconds + start_s), 1),
            "steady_images_per_s": round(len(files) / seconds, 1)}


def batch_command(model, folder, backend, workers, batch, preprocess, out) -> dict:
    command = [sys.executable, "-m", "tflite_taichi", "batch", model, folder, "--out", out,
               "--backend", backend, "--workers", str(workers), "--batch", str(batch),
               "--format", "npz", "--overwrite"] + (["--preprocess", preprocess] if preprocess else [])
    began = time.perf_counter()
    proc = subprocess.run(command, capture_output=True, text=True)
    wall = time.perf_counter() - began
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    with open(os.path.join(out, "_outputs.json")) as f:
        summary = json.load(f)["summary"]
    return {"runtime": "tflite-taichi batch", "backend": backend, "workers": workers,
            "items_per_invoke": max(w.get("items_per_invoke", 0) for w in summary["workers"]),
            "workers_that_ran": sum(1 for w in summary["workers"] if w["items"]),
            "start_s": summary["workers_ready_s"], "seconds": round(wall, 3),
            "images_per_s": round(summary["written"] / wall, 1),
            "steady_images_per_s": summary["steady_items_per_s"], "command": " ".join(command[2:]),
            "summary": summary}


def compare(out: str, files: list, reference: np.ndarray) -> float:
    from tflite_taichi.batch import read_outputs
    found = read_outputs(out)
    if sorted(found) != files:
        raise SystemExit(f"{out}: {len(found)} outputs for {len(files)} images")
    got = np.stack([next(iter(found[p].values())) for p in files])
    return float(np.max(np.abs(got - reference)))


def render(rows: list, meta: dict) -> str:
    lines = [f"# {meta['title']}", "", f"Command: `{meta['command']}`", "",
             f"Machine: {meta['machine']}; {meta['versions']}", "",
             f"{meta['images']} JPEG images ({meta['image_bytes'] // meta['images']} bytes each on "
             "average), decoded with Pillow and normalised by every runtime with the same code.", "",
             "| runtime | backend | workers | images per invoke | start s | images/s (whole run) "
             "| images/s (after start) | max diff vs one interpreter |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        diff = r.get("max_diff")
        ran = r.get("workers_that_ran", r["workers"])
        workers = f"{r['workers']}" + (f" ({ran} started in time to work)" if ran < r["workers"] else "")
        lines.append(f"| {r['runtime']} | {r['backend']} | {workers} | {r['items_per_invoke']} "
                     f"| {r['start_s']} | {r['images_per_s']} | {r['steady_images_per_s']} | "
                     f"{'' if diff is None else f'{diff:.2e}'} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", choices=("images", "run", "loop"))
    p.add_argument("model")
    p.add_argument("folder")
    p.add_argument("--n", type=int, default=10000)
    p.add_argument("--side", type=int, default=0, help="images: side x side instead of the model's size")
    p.add_argument("--backend", default="cuda")
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--batch", type=int, nargs="+", default=[1, 32])
    p.add_argument("--preprocess", default="signed")
    p.add_argument("--runtimes", nargs="+", default=["ours", "litert"], choices=("ours", "litert"))
    p.add_argument("--threads", type=int, default=16)
    p.add_argument("--work", default="/tmp/batch_scale")
    p.add_argument("--out", help="NAME: writes NAME.md and NAME.json")
    p.add_argument("--title", default="tflite-taichi batch: images/s")
    p.add_argument("--runtime", default="ours", help=argparse.SUPPRESS)   # loop's child
    args = p.parse_args(argv)
    if args.what == "images":
        write_images(args.model, args.folder, args.n, args.side)
        print(f"{len(_files(args.folder))} images in {args.folder}")
        return 0
    os.makedirs(args.work, exist_ok=True)
    if args.what == "loop":
        row = loop(args.runtime, args.model, args.folder, args.backend, args.preprocess,
                   args.threads, os.path.join(args.work, f"loop_{args.runtime}.npy"))
        print(json.dumps(row))
        return 0
    files, rows = _files(args.folder), []
    for runtime in args.runtimes:      # each loop in its own process, as a user's script is
        proc = subprocess.run([sys.executable, os.path.abspath(__file__), "loop", args.model,
                               args.folder, "--runtime", runtime, "--backend", args.backend,
                               "--preprocess", args.preprocess, "--threads", str(args.threads),
                               "--work", args.work], capture_output=True, text=True)
        if proc.returncode != 0:
            raise SystemExit(f"the {runtime} loop failed:\n{proc.stdout}\n{proc.stderr}")
        rows.append(json.loads(proc.stdout.strip().splitlines()[-1]))
        print(rows[-1], flush=True)
    reference = np.load(os.path.join(args.work, "loop_ours.npy")) if "ours" in args.runtimes else None
    if reference is not None and "litert" in args.runtimes:
        rows[args.runtimes.index("litert")]["max_diff"] = float(np.max(np.abs(
            np.load(os.path.join(args.work, "loop_litert.npy")) - reference)))
    for batch in args.batch:
        for workers in args.workers:
            out = os.path.join(args.work, f"out_b{batch}_w{workers}")
            row = batch_command(args.model, args.folder, args.backend, workers, batch,
                                args.preprocess, out)
            if reference is not None:
                row["max_diff"] = compare(out, files, reference)
            rows.append(row)
            print({k: v for k, v in row.items() if k != "summary"}, flush=True)
    import taichi
    try:
        from importlib.metadata import version
        litert = f", ai-edge-litert {version('ai-edge-litert')}"
    except Exception:      # LiteRT's slim copy on the GPU machine has no dist-info
        litert = ""
    meta = {"title": args.title, "command": "python bench/batch_scale.py " + " ".join(sys.argv[1:] if argv is None else argv),
            "machine": f"{platform.node()} ({os.cpu_count()} cores)",
            "versions": f"Python {platform.python_version()}, numpy {np.__version__}, taichi {taichi.__version__}{litert}",
            "images": len(files), "image_bytes": sum(os.path.getsize(f) for f in files)}
    try:
        gpu = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True).stdout.strip()
        meta["machine"] += f", {gpu}"
    except OSError:
        pass
    text = render(rows, meta)
    print(text)
    if args.out:
        with open(args.out + ".md", "w") as f:
            f.write(text)
        with open(args.out + ".json", "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, ROOT)
    sys.exit(main())
