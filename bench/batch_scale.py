"""`tflite-taichi batch` over a folder of images with 1, 2, 4 workers
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


def _user_step(runtime: str, model: str, backend: str, threads: int, batch: int):
    """(label, step): step(x of shape [n, ...]) -> the first output, as a user's loop runs it:
    set the inputs, invoke, read every output."""
    if runtime == "litert":
        from ai_edge_litert.interpreter import Interpreter
        it = Interpreter(model_path=model, num_threads=threads)
    elif runtime == "litert-gpu":
        from ai_edge_litert.compiled_model import CompiledModel
        from ai_edge_litert.hardware_accelerator import HardwareAccelerator
        from ai_edge_litert.options import Options
        cm = CompiledModel.from_file(model, options=Options(hardware_accelerators=HardwareAccelerator.GPU))
        if not cm.is_fully_accelerated():
            raise RuntimeError("LiteRT GPU refuses the model (not fully accelerated)")
        sig = list(cm.get_signature_list())[0]
        details = cm.get_output_tensor_details(sig)
        names = list(cm.get_signature_list()[sig]["outputs"])
        shapes = [tuple(details[n]["shape"]) for n in names]
        inputs, outputs = cm.create_input_buffers(0), cm.create_output_buffers(0)

        def step(x):
            inputs[0].write(x)
            cm.run_by_index(0, inputs, outputs)
            return [b.read(int(np.prod(sh)), np.float32).reshape(sh) for b, sh in zip(outputs, shapes)][0]
        return "litert-gpu", step
    elif runtime in ("torch", "torch-graph"):
        sys.path.insert(0, os.path.join(ROOT, "bench"))
        from torch_eager import TorchModel
        net = TorchModel(model, batch=batch, device="cuda")
        return "torch-eager", net
    else:
        from tflite_taichi.interpreter import Interpreter
        it = Interpreter(model_path=model, backend=backend)
    i_in = it.get_input_details()[0]["index"]
    if batch != 1:
        it.resize_tensor_input(i_in, [batch, *it.get_input_details()[0]["shape"][1:]])
    it.allocate_tensors()
    outs = [d["index"] for d in it.get_output_details()]

    def step(x):
        it.set_tensor(i_in, x)
        it.invoke()
        return [np.array(it.get_tensor(i), copy=True) for i in outs][0]
    return ("litert-cpu" if runtime == "litert" else backend), step


def loop(runtime: str, model: str, folder: str, backend: str, preprocess: str, threads: int,
         save: str, batch: int = 1) -> dict:
    """A user's loop in this process: read and decode `batch` images, run them, read the
    outputs; the runtime's creation and first allocation are its start."""
    from tflite_taichi.batch.inputs import decode, input_spec, parse_preprocess
    from tflite_taichi.interpreter import Interpreter as Ours
    spec = input_spec(Ours(model_path=model, backend="reference"), parse_preprocess(preprocess))
    started = time.perf_counter()
    label, step = _user_step(runtime, model, backend, threads, batch)
    start_s = time.perf_counter() - started
    files, outputs = _files(folder), []
    files = files[:len(files) // batch * batch]          # whole batches only
    began = time.perf_counter()
    for first in range(0, len(files), batch):
        xs = []
        for path in files[first:first + batch]:
            with open(path, "rb") as f:
                xs.append(decode(spec, path, f.read())[0])
        outputs.extend(step(np.stack(xs)))
    seconds = time.perf_counter() - began
    np.save(save, np.stack(outputs))
    return {"runtime": runtime if batch == 1 else f"{runtime}, batch {batch}", "backend": label,
            "workers": 1, "items_per_invoke": batch, "start_s": round(start_s, 3),
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
    p.add_argument("--runtimes", nargs="+", default=["ours", "litert"],
                   help="loops: ours, litert (CPU), litert-gpu, torch (eager, cuda); NAME:B runs "
                        "batches of B images per call")
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
        name, _, batch = args.runtime.partition(":")
        row = loop(name, args.model, args.folder, args.backend, args.preprocess, args.threads,
                   os.path.join(args.work, f"loop_{args.runtime.replace(':', '_')}.npy"),
                   int(batch or 1))
        print(json.dumps(row))
        return 0
    files, rows = _files(args.folder), []
    for runtime in args.runtimes:      # each loop in its own process, as a user's script is
        proc = subprocess.run([sys.executable, os.path.abspath(__file__), "loop", args.model,
                               args.folder, "--runtime", runtime, "--backend", args.backend,
                               "--preprocess", args.preprocess, "--threads", str(args.threads),
                               "--work", args.work], capture_output=True, text=True)
        if proc.returncode != 0:       # a runtime that cannot run the model: a row saying why
            lines = proc.stderr.strip().splitlines() or ["failed"]
            why = next((ln for ln in reversed(lines) if "Error" in ln), lines[-1])[:200]
            rows.append({"runtime": runtime, "backend": runtime, "workers": 1,
                         "items_per_invoke": "", "start_s": "", "images_per_s": why,
                         "steady_images_per_s": ""})
        else:
            rows.append(json.loads(proc.stdout.strip().splitlines()[-1]))
        print(rows[-1], flush=True)
    reference = np.load(os.path.join(args.work, "loop_ours.npy")) if "ours" in args.runtimes else None
    for runtime, row in zip(args.runtimes, rows):
        saved = os.path.join(args.work, f"loop_{runtime.replace(':', '_')}.npy")
        if reference is not None and runtime != "ours" and os.path.exists(saved):
            got = np.load(saved)
            row["max_diff"] = float(np.max(np.abs(got - reference[:len(got)])))
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
