"""The tflite-taichi command line (its subcommands are listed by build_parser)."""
from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import time
from collections import Counter

import numpy as np

from tflite_taichi.errors import TfliteTaichiError
from tflite_taichi.interpreter import BACKENDS, Interpreter
from tflite_taichi.testing import random_input


class UsageError(Exception):
    """A mistake in the command line (a file --input names, an input name): main() prints it as
    one line, `tflite-taichi <command>: error: ...`, and exits with 2, as argparse does."""


def at_least_one(text: str) -> int:
    """argparse type of --runs: a count of invokes, so 0 or less is a mistake, not "once"."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"takes a whole number, got {text!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {n}")
    return n


def _fmt_quant(detail) -> str:
    q = detail["quantization_parameters"]
    if q["scales"].size == 0:
        return ""
    if q["scales"].size == 1:
        return f" scale={q['scales'][0]:.6g} zero_point={int(q['zero_points'][0])}"
    zps = sorted({int(z) for z in q["zero_points"]})
    return (f" per-channel along dim {q['quantized_dimension']}: {q['scales'].size} scales "
            f"{q['scales'].min():.6g}..{q['scales'].max():.6g}, zero_point "
            f"{zps[0] if len(zps) == 1 else f'{zps[0]}..{zps[-1]}'}")


def _fmt_tensor(d) -> str:
    return f"{d['name']} {d['shape'].tolist()} {np.dtype(d['dtype']).name}{_fmt_quant(d)}"


def _parse_input_args(pairs) -> dict:
    """--input NAME=file.npy arguments -> {NAME: path}, before any file is read."""
    given = {}
    for pair in pairs or []:
        name, sep, path = pair.partition("=")
        if not sep or not name or not path:
            raise UsageError(f"--input takes NAME=file.npy, got {pair!r}")
        if name in given:
            raise UsageError(f"--input {name} is given twice")
        given[name] = path
    return given


def _read_npy(name: str, path: str) -> np.ndarray:
    """The array numpy.save wrote to `path` (for input `name`); a UsageError naming both if not."""
    magic = np.lib.format.MAGIC_PREFIX
    try:
        with open(path, "rb") as f:
            head = f.read(len(magic))
            if head != magic:
                # np.load would try the file as a pickle (refused) and say "pickled data"
                kind = "a .npz archive" if head.startswith(b"PK") else "not a .npy file"
                raise UsageError(f"--input {name}: {path} is {kind}; give one array saved with "
                                 "numpy.save")
            f.seek(0)
            return np.load(f, allow_pickle=False)
    except FileNotFoundError:
        raise UsageError(f"--input {name}: no such file: {path}") from None
    except OSError as e:
        raise UsageError(f"--input {name}: cannot read {path}: {e.strerror or e}") from None
    except (ValueError, EOFError) as e:     # a truncated file, an array of Python objects
        raise UsageError(f"--input {name}: {path} is not a readable .npy file ({e})") from None


def _inputs_by_name(it) -> dict:
    """{every name --input accepts: the input's detail}: each model input's tensor name, and
    its name in the signatures of the main graph (e.g. `keras_tensor`, as
    get_signature_list() gives it, beside the tensor's `serving_default_keras_tensor:0`)."""
    details = {d["index"]: d for d in it.get_input_details()}
    names = {d["name"]: d for d in details.values()}
    for sig in it.model.signatures:
        if sig.subgraph_index == it.model.main.index:
            for name, t in sig.inputs.items():
                if t in details:
                    names.setdefault(name, details[t])
    return names


def _match_inputs(it, given: dict) -> dict:
    """{input tensor index: (NAME, path)} of the --input arguments, by tensor or signature name;
    a UsageError lists the names there are."""
    names = _inputs_by_name(it)
    unknown = [name for name in given if name not in names]
    if unknown:
        raise UsageError(f"the model has no input named {', '.join(map(repr, unknown))}; its "
                         f"inputs: {', '.join(map(repr, names))}")
    matched = {}
    for name, path in given.items():
        index = names[name]["index"]
        if index in matched:
            raise UsageError(f"--input {matched[index][0]} and --input {name} name the same "
                             f"input, '{names[name]['name']}'")
        matched[index] = (name, path)
    return matched


def _load_inputs(it, pairs, seed):
    """Resize, allocate and set the inputs: the given arrays, seeded random ones for the rest.
    Every file is read before allocate_tensors(), which may compile for a minute."""
    given = _match_inputs(it, _parse_input_args(pairs))
    arrays = {index: _read_npy(name, path) for index, (name, path) in given.items()}
    rng = np.random.default_rng(seed)
    for d in it.get_input_details():
        if d["index"] in arrays and tuple(arrays[d["index"]].shape) != tuple(d["shape"]):
            it.resize_tensor_input(d["index"], arrays[d["index"]].shape)
    with _compile_progress_bar():
        it.allocate_tensors()
    feeds = {}
    for d in it.get_input_details():
        feeds[d["index"]] = arrays.get(d["index"])
        if feeds[d["index"]] is None:
            feeds[d["index"]] = random_input(d, rng, 0.0, 1.0)
        it.set_tensor(d["index"], feeds[d["index"]])
    return feeds


class _KernelBar:
    """delegate.compile_progress's callback as one tqdm bar of the kernels compiled, made at the
    first report (a warm cache reports nothing, so shows nothing); each program that compiles
    adds its kernels to the total."""

    def __init__(self, stream):
        self.stream, self.bar = stream, None

    def __call__(self, done: int, total: int) -> None:
        if done == 0 and self.bar is None:
            from tqdm import tqdm
            self.bar = tqdm(total=total, desc="compiling kernels", unit="kernel", file=self.stream)
        elif done == 0:
            self.bar.total += total
            self.bar.refresh()
        else:
            self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


@contextlib.contextmanager
def _compile_progress_bar():
    """A progress bar of kernel compiles on stderr while the block runs, when stderr is a
    terminal (a cold cache compiles for seconds to a minute, silently otherwise); nothing in a
    pipe or a log."""
    if not sys.stderr.isatty():
        yield
        return
    from tflite_taichi.delegate import compile_progress
    bar = _KernelBar(sys.stderr)
    try:
        with compile_progress(bar):
            yield
    finally:
        bar.close()


def _print_profile(it) -> None:
    prof = it.profile()
    print(f"  profile ({prof['backend']}, {prof['launches_per_invoke']} kernel launch(es) per invoke):")
    print(f"    {'what':<44} {'launches':>8} {'median ms':>10}")
    for item in prof["items"]:
        ops = item["ops"]
        what = (f"partition: {len(ops)} ops (#{ops[0]}..#{ops[-1]})" if item["kind"] == "partition"
                else f"cpu: #{ops[0]} {item['op']}")
        ms = f"{item['ms']:.3f}" if item["ms"] is not None else "-"
        print(f"    {what:<44} {item['launches']:>8} {ms:>10}")


def cmd_run(args) -> int:
    start = time.perf_counter()
    it = Interpreter(model_path=args.model, backend=args.backend, precision=args.precision,
                     profile=args.profile)
    constructed = time.perf_counter()
    _load_inputs(it, args.input, args.seed)
    start_s = (constructed - start, time.perf_counter() - constructed)
    times = []
    for _ in range(args.runs):
        start = time.perf_counter()
        it.invoke()
        times.append(time.perf_counter() - start)
    outputs = []
    s = it.summary()
    print(f"{os.path.basename(args.model)} on backend={it.backend} ({it._precision}): "
          f"{s['ops_delegated']} of {s['ops_total']} ops delegated in {len(s['partitions'])} "
          f"partition(s), {len(s['fallback'])} on the CPU, {s['ops_folded']} folded")
    if s["calls"]:      # the subgraphs IF/WHILE call, each delegated on its own
        print(f"  called subgraphs: {sum(c['ops_delegated'] for c in s['calls'])} of "
              f"{sum(c['ops_total'] for c in s['calls'])} ops delegated, over "
              f"{len(s['calls'])} call preparation(s)")
    for d in it.get_output_details():
        y = it.get_tensor(d["index"])
        outputs.append((d["name"], y))
        stats = (f"min {y.min():.6g} max {y.max():.6g} mean {y.astype(np.float64).mean():.6g}"
                 if y.size else "empty")
        print(f"  output {_fmt_tensor(d)}: {stats}")
    first = times[0] * 1e3
    median = float(np.median(times)) * 1e3
    print(f"  start: {_start_text(s, *start_s)}")
    print(f"  invoke: first {first:.2f} ms, median {median:.2f} ms over {len(times)} run(s)")
    if args.profile:
        _print_profile(it)
    if args.output:
        _write_outputs(args.output, outputs)
    return 0


def _start_text(summary: dict, construct_s: float, allocate_s: float) -> str:
    """What getting ready cost: construct, allocate (where the kernels were compiled or loaded)."""
    text = f"construct {construct_s:.2f} s, allocate_tensors {allocate_s:.2f} s"
    cache, runtime = summary.get("cache") or {}, summary.get("runtime") or {}
    if runtime.get("compiled_in"):
        text += (f" (kernels compiled in {runtime['compiled_in']}: {runtime['build_s']:.2f} s; "
                 f"cached for the next run)")
    elif cache.get("state") == "warm":
        text += " (kernels loaded from the cache)"
    return text


def _write_outputs(path: str, outputs: list) -> None:
    """[(tensor name, array)] as an .npz, each under its tensor name, or NAME#INDEX where that
    is empty or an earlier output's (the batch command's rule: see docs/usage.md)."""
    from tflite_taichi.batch.outputs import output_columns, save_npz
    columns = output_columns([name for name, _ in outputs])
    if not path.endswith(".npz"):
        path += ".npz"                   # as np.savez named it
    try:
        save_npz(path, {column: y for column, (_, y) in zip(columns, outputs)})
    except OSError as e:
        raise UsageError(f"--output {path}: cannot write it: {e.strerror or e}") from None
    print(f"  outputs written to {path}")
    for index, (column, (name, _)) in enumerate(zip(columns, outputs)):
        if column != name:
            print(f"  output {index} ({name!r}) is {column!r} in it: its name is taken")


def cmd_inspect(args) -> int:
    it = Interpreter(model_path=args.model, backend="reference")
    it.allocate_tensors()
    m = it.model
    print(f"{args.model}: {m.size} bytes, schema v{m.version}, {len(m.subgraphs)} subgraph(s)")
    if m.description:
        print(f"  description: {m.description}")
    for d in it.get_input_details():
        print(f"  input  {_fmt_tensor(d)}")
    for d in it.get_output_details():
        print(f"  output {_fmt_tensor(d)}")
    for key, sig in it.get_signature_list().items():
        print(f"  signature {key}: inputs {sig['inputs']} outputs {sig['outputs']}")
    summary = it.summary()
    print(f"  kind: {summary['quantization']}"
          + ("; runs as a float view (quantized tensors carried as float32 real values, snapped "
             "to their grid after every op; IO (de)quantized on the CPU)" if summary["float_view"] else ""))
    for sg in m.subgraphs:
        counts = Counter(op.name for op in sg.operators)
        print(f"subgraph {sg.index} '{sg.name}': {len(sg.operators)} ops: "
              + ", ".join(f"{n} x{c}" for n, c in counts.most_common()))
    print("ops (subgraph 0):")
    for row in it.op_table():
        where = "folded at prepare" if row["folded"] else "reference (numpy)"
        delegate = "yes" if row["delegate"] is None else f"no: {row['delegate']}"
        print(f"  #{row['index']:<4} {row['op']:<24} v{row['version']}  {row['outputs']}  "
              f"[{where}; delegate {delegate}]")
    quantized = [d for d in it.get_tensor_details() if d["quantization_parameters"]["scales"].size]
    if args.tensors or quantized:
        listed = it.get_tensor_details() if args.tensors else quantized
        print(f"tensors (subgraph 0){'' if args.tensors else ', quantized ones (--tensors: all)'}:")
        for d in listed:
            kind = "constant" if it.model.main.tensors[d["index"]].data is not None else "runtime"
            print(f"  {d['index']:<5} {_fmt_tensor(d)}  [{kind}]")
    return 0


def cmd_demo(args) -> int:
    from tflite_taichi.demo import build_demo_model
    model = build_demo_model()
    path = os.path.join(tempfile.mkdtemp(prefix="tflite_taichi_demo_"), "demo.tflite")
    with open(path, "wb") as f:
        f.write(model)
    print(f"built a {len(model)}-byte demo classifier with tflite_taichi.builder: {path}")
    results = {}
    import warnings
    from tflite_taichi.partition import DelegateWarning
    warnings.simplefilter("ignore", DelegateWarning)     # the summary line below says it
    for backend in ("auto", "reference"):
        it = Interpreter(model_path=path, backend=backend)
        with _compile_progress_bar():
            it.allocate_tensors()
        d = it.get_input_details()[0]
        x = random_input(d, np.random.default_rng(0), 0.0, 1.0)
        it.set_tensor(d["index"], x)
        times = []
        for _ in range(args.runs):
            start = time.perf_counter()
            it.invoke()
            times.append(time.perf_counter() - start)
        y = it.get_tensor(it.get_output_details()[0]["index"])
        results[backend] = y
        label = f"{backend} -> {it.backend}" if backend == "auto" else backend
        print(f"  {label:<22} median {np.median(times) * 1e3:7.2f} ms  top class {int(y.argmax())} "
              f"p={float(y.max()):.4f}")
    diff = float(np.max(np.abs(results["auto"] - results["reference"])))
    print(f"  max |auto - reference| = {diff:.3g}")
    try:
        from tflite_taichi.testing import run_litert
        lite = run_litert(model, [random_input(d, np.random.default_rng(0), 0.0, 1.0)], "xnnpack")[0]
        print(f"  max |reference - LiteRT| = {float(np.max(np.abs(results['reference'] - lite))):.3g}")
    except ImportError:
        print("  (LiteRT not installed: pip install 'tflite-taichi[test]' to compare with it)")
    summary = Interpreter(model_path=path, backend="auto").summary()
    print(f"  summary: backend={summary['backend']} ops={summary['ops_total']} "
          f"delegated={summary['ops_delegated']} on numpy={len(summary['fallback'])}"
          + (" (auto without a GPU keeps the ops numpy runs faster on numpy)"
             if summary["backend"] == "cpu" and summary["fallback"] else ""))
    return 0


def cmd_bench(args) -> int:
    from tflite_taichi.bench import run_cli
    return run_cli(args)


def cmd_batch(args) -> int:
    from tflite_taichi import batch
    result = batch.run(args.model, args.inputs, args.out, backend=args.backend,
                       batch_size=args.batch, workers=args.workers, ray=args.ray,
                       gpus_per_worker=args.gpus_per_worker, cpus_per_worker=args.cpus_per_worker,
                       fmt=args.format, preprocess=args.preprocess, precision=args.precision,
                       retries=args.retries, overwrite=args.overwrite, resume=args.resume,
                       progress=sys.stderr.isatty(), task_timeout=args.task_timeout)
    per_invoke = sorted({w["items_per_invoke"] for w in result.workers if "items_per_invoke" in w})
    notes = sorted({w["batching"] for w in result.workers if "batching" in w})
    print(f"batch: {result.written} of {result.items} inputs written to {args.out}, "
          f"{result.errors} in {os.path.join(args.out, 'errors.jsonl')}")
    if args.resume:
        print(f"batch: resumed: {result.resumed} input(s) were written by the interrupted run, "
              f"{result.items - result.resumed} run now")
    if result.ray:
        who = (f"Ray, {result.ray['actors']} actor(s) of {result.ray['gpus_per_actor']:g} GPU and "
               f"{result.ray['cpus_per_actor']:g} CPU on a cluster of {result.ray['cluster']}")
    else:
        who = (f"local pool, {len(result.workers)} worker(s)"
               + (f", {'/'.join(map(str, per_invoke))} item(s) per invoke" if per_invoke else ""))
    print(f"batch: {result.seconds:.2f} s, {result.items_per_second:.1f} items/s on "
          f"{result.backend} ({who})")
    if result.steady_items_per_second:
        print(f"batch: {result.steady_items_per_second:.1f} items/s once every worker had started "
              f"({result.workers_ready_s:.2f} s)")
    for note in notes:
        if not note.startswith(f"{args.batch} items"):
            print(f"batch: {note}")
    for w in result.workers:
        if "items" in w:
            gpu = f" on GPU {w['gpu']}" if w.get("gpu") is not None else ""
            started = (f"started in {w['start_s']:.2f} s" if "start_s" in w
                       else "still starting when the work ran out")
            print(f"batch:   worker {w['worker']}{gpu}: {w['items']} items, {started}")
    return 1 if result.errors else 0


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"takes a number, got {text!r}") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"takes a number >= 0, got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tflite-taichi")
    sub = p.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run a model on random (seeded) or given inputs")
    run.add_argument("model")
    run.add_argument("--backend", default="auto", choices=BACKENDS)
    run.add_argument("--precision", default="fp32", choices=("fp32", "fp16"))
    run.add_argument("--input", action="append", metavar="NAME=file.npy")
    run.add_argument("--output", metavar="out.npz")
    run.add_argument("--seed", type=int, default=0)
    run.add_argument("--runs", type=at_least_one, default=1, help="invokes to time (default 1)")
    run.add_argument("--profile", action="store_true",
                     help="per-partition and per-CPU-op times and kernel launches")
    run.set_defaults(func=cmd_run)
    ins = sub.add_parser("inspect", help="IO, op counts, and per-op support")
    ins.add_argument("model")
    ins.add_argument("--tensors", action="store_true", help="also list every tensor")
    ins.set_defaults(func=cmd_inspect)
    demo = sub.add_parser("demo", help="build a small model and run it")
    demo.add_argument("--runs", type=at_least_one, default=5, help="invokes to time (default 5)")
    demo.set_defaults(func=cmd_demo)
    from tflite_taichi.bench import add_arguments as bench_arguments
    bench = sub.add_parser("bench", help="time models on LiteRT and each backend of ours, side by side")
    bench.add_argument("model", nargs="+", metavar="model.tflite")
    bench_arguments(bench)
    bench.add_argument("--json", metavar="out.json", help="also write every number as JSON")
    bench.add_argument("--out", metavar="NAME", help="also write the report: NAME.md, NAME.json, NAME.png")
    bench.add_argument("--title", default="", help="the report's title (with --out)")
    bench.set_defaults(func=cmd_bench)
    bat = sub.add_parser("batch", help="run a folder of inputs through a model on every GPU "
                         "(a local pool of processes, or a Ray cluster)")
    bat.add_argument("model")
    bat.add_argument("inputs", nargs="+", metavar="INPUTS",
                     help=".npy/.npz files, images, Parquet/Arrow tables, or folders of them")
    bat.add_argument("--out", required=True, metavar="DIR", help="where outputs and errors.jsonl go")
    bat.add_argument("--backend", default="auto", choices=BACKENDS)
    bat.add_argument("--precision", default="fp32", choices=("fp32", "fp16"))
    bat.add_argument("--batch", type=at_least_one, default=16, metavar="N",
                     help="items per invoke where the batch dimension resizes (default 16)")
    bat.add_argument("--workers", type=at_least_one, metavar="N",
                     help="worker processes or Ray actors (default: one per GPU, or per core "
                          "on cpu/reference)")
    bat.add_argument("--ray", nargs="?", const="", metavar="ADDRESS",
                     help="run on Ray Data: a local cluster, or the one at ADDRESS")
    bat.add_argument("--gpus-per-worker", type=_fraction, metavar="F",
                     help="Ray: GPUs per actor (0.25 puts four on one GPU; default 1 on a GPU backend)")
    bat.add_argument("--cpus-per-worker", type=_fraction, default=1.0, metavar="F",
                     help="Ray: CPUs per actor (default 1)")
    bat.add_argument("--format", default="parquet", choices=("parquet", "npz"))
    bat.add_argument("--preprocess", metavar="P",
                     help="images to a float input: unit, signed, raw, imagenet or "
                          "'mean=M;std=S' (default: the model's metadata)")
    bat.add_argument("--retries", type=int, default=2, metavar="N",
                     help="runs again of a batch whose worker died (default 2)")
    bat.add_argument("--task-timeout", type=_fraction, metavar="S",
                     help="local pool: kill a worker that finishes nothing for S seconds and run "
                          "its batch again (default: no limit)")
    bat.add_argument("--overwrite", action="store_true",
                     help="replace a previous run's outputs in --out (only the files it wrote)")
    bat.add_argument("--resume", action="store_true",
                     help="finish the interrupted run in --out (same model, inputs, --format): "
                          "run only the inputs it did not write")
    bat.set_defaults(func=cmd_batch)
    # the top line of --help names every subcommand: taken from the parser, so none is left out
    p.description = "tflite-taichi: " + " | ".join(sub.choices)
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    args.argv = None if argv is None else list(argv)[1:]    # what followed the subcommand
    try:
        return args.func(args)
    except UsageError as e:
        print(f"tflite-taichi {args.command}: error: {e}", file=sys.stderr)
        return 2
    except TfliteTaichiError as e:
        print(f"tflite-taichi: error: {type(e).__name__}: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
