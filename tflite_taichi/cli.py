"""The tflite-taichi command line (its subcommands are listed by build_parser)."""
from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import time
import warnings
from collections import Counter

import numpy as np

from tflite_taichi.cli_inputs import (UsageError, apply_shapes, check_declared_shape, match_inputs,
                                      needs_shapes, parse_input_args, parse_shape_args,
                                      read_npy, refuse_float64, signature_text)
from tflite_taichi.errors import ModelError, TfliteTaichiError
from tflite_taichi.interpreter import BACKENDS, Interpreter
from tflite_taichi.testing import model_random_inputs, random_input


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


def _load_inputs(it, pairs, seed, shape_pairs=None, resize=False):
    """Resize, allocate and set the inputs: the given arrays, seeded random ones for the rest.
    An array or --shape must fit the input's declared shape, except where the model leaves a
    dimension to run time (-1), unless `resize`. Every file is read before allocate_tensors(),
    which may compile for a minute."""
    given = match_inputs(it, parse_input_args(pairs))
    sized = match_inputs(it, parse_shape_args(shape_pairs), "--shape")
    arrays = {index: read_npy(name, path) for index, (name, path) in given.items()}
    rng = np.random.default_rng(seed)
    for d in it.get_input_details():
        index = d["index"]
        if index in arrays:
            refuse_float64(arrays[index], d, f"--input {given[index][0]}: {given[index][1]}")
        if index in arrays and index in sized and tuple(arrays[index].shape) != sized[index][1]:
            raise UsageError(f"--input {given[index][0]} is {list(arrays[index].shape)} but "
                             f"--shape {sized[index][0]} says {list(sized[index][1])}")
        if index in arrays:
            wanted, what = tuple(arrays[index].shape), f"--input {given[index][0]}"
        elif index in sized:
            wanted, what = sized[index][1], f"--shape {sized[index][0]}"
        else:
            continue
        if wanted != tuple(d["shape"]):
            if not resize:
                check_declared_shape(d, wanted, what)
            it.resize_tensor_input(index, wanted)
    try:
        with _compile_progress_bar():
            it.allocate_tensors()
    except ModelError as e:
        unsized = [d for d in it.get_input_details()
                   if -1 in d["shape_signature"] and d["index"] not in arrays and d["index"] not in sized]
        if not unsized:
            raise
        raise UsageError(needs_shapes(unsized, e)) from None
    feeds = {}
    made_up = model_random_inputs(it, rng)      # valid for the model: ids within their table
    for d, random_value in zip(it.get_input_details(), made_up):
        feeds[d["index"]] = arrays.get(d["index"])
        if feeds[d["index"]] is None:
            feeds[d["index"]] = random_value
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
            self.bar = tqdm(total=total, desc="compiling kernels (once: cached for the next run)",
                            unit="kernel", file=self.stream)
        elif done == 0:
            self.bar.total += total
            self.bar.refresh()
        else:
            self.bar.update(1)

    def compiling(self) -> bool:
        return self.bar is not None and self.bar.n < self.bar.total

    def counts(self) -> tuple:
        return self.bar.n, self.bar.total

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


class _KernelLog:
    """delegate.compile_progress's callback for a pipe or a log: a line when kernels start
    compiling and one when the last is done, with how long it took (a bar's redraws would
    flood a log)."""

    def __init__(self, stream):
        self.stream, self.total, self.done, self.start = stream, 0, 0, None

    def __call__(self, done: int, total: int) -> None:
        if done == 0:
            self.total += total         # before the line: a Ctrl-C may land as soon as it is out
            if self.start is None:
                self.start = time.perf_counter()
                print(f"tflite-taichi: compiling {total} kernel(s): the first run of this model "
                      "here (they are cached for the next)...", file=self.stream, flush=True)
        else:
            self.done += 1

    def compiling(self) -> bool:
        return self.start is not None and self.done < self.total

    def counts(self) -> tuple:
        return self.done, self.total

    def close(self) -> None:
        if self.start is not None:
            print(f"tflite-taichi: compiled {self.done} of {self.total} kernel(s) in "
                  f"{time.perf_counter() - self.start:.1f} s", file=self.stream, flush=True)


@contextlib.contextmanager
def _compile_progress_bar():
    """While the block runs, kernel compiles said on stderr: a progress bar on a terminal, a
    line at the start and one at the end in a pipe or a log (a cold cache compiles for seconds
    to a minute: silence looked like a hang). A warm cache reports nothing, so shows nothing."""
    from tflite_taichi.delegate import compile_progress
    bar = _KernelBar(sys.stderr) if sys.stderr.isatty() else _KernelLog(sys.stderr)
    try:
        with compile_progress(bar):
            yield
    except KeyboardInterrupt:
        if bar.compiling():
            raise _InterruptedCompile("{} of {}".format(*bar.counts())) from None
        raise
    finally:
        if not bar.compiling():
            bar.close()         # "compiled N of M" only of a compile that finished


class _InterruptedCompile(KeyboardInterrupt):
    """Ctrl-C while kernels compiled: main() says that their compile starts over next time."""


def _print_profile(it) -> None:
    prof = it.profile()
    # a CPU op is named by what runs it: numpy, or LiteRT's kernels (an island between partitions)
    runs_on = {row["index"]: row["runs_on"] for row in it.op_table()}
    print(f"  profile ({prof['backend']}, {prof['launches_per_invoke']} kernel launch(es) per invoke):")
    print(f"    {'what':<44} {'launches':>8} {'median ms':>10}")
    for item in prof["items"]:
        ops = item["ops"]
        what = (f"partition: {len(ops)} ops (#{ops[0]}..#{ops[-1]})" if item["kind"] == "partition"
                else f"{runs_on.get(ops[0], 'numpy')}: #{ops[0]} {item['op']}")
        ms = f"{item['ms']:.3f}" if item["ms"] is not None else "-"
        print(f"    {what:<44} {item['launches']:>8} {ms:>10}")


@contextlib.contextmanager
def _plain_warnings():
    """Warnings raised while the block runs, said the command line's way: the delegate's notes
    (DelegateWarning: each op it cannot take and why; and its INFO log lines: the ops it keeps
    on the CPU by choice, what ran where) kept in order in the list the block gets, for the
    command to print with -v (its summary line says what ran where), never on stderr; any other
    warning as one `tflite-taichi: warning:` line on stderr (Python's form adds the file and
    source line of our entry point, twice the noise)."""
    from tflite_taichi.partition import DelegateWarning, notes_into
    notes = []
    with warnings.catch_warnings(record=True) as caught, notes_into(caught):
        warnings.simplefilter("always")
        try:
            yield notes
        finally:
            for w in caught:
                if isinstance(w, str):                      # a logged note, already "INFO: ..."
                    notes.append(w)
                elif issubclass(w.category, DelegateWarning):
                    notes.append(str(w.message))
                elif not issubclass(w.category, (DeprecationWarning, PendingDeprecationWarning)):
                    print(f"tflite-taichi: warning: {w.message}", file=sys.stderr)


def _device_text(it, summary: dict) -> str:
    """Where the delegate ran, in a user's words: the backend, and for a software device (Mesa's
    lavapipe or llvmpipe: the CPU pretending to be a GPU) that it is one."""
    from tflite_taichi.backend import is_software_device
    backend = it.backend
    if backend == "reference":
        return "the reference path (numpy on the CPU, no delegate)"
    if backend == "litert":
        threads = (summary.get("cpu_executor") or {}).get("threads")
        return (f"LiteRT's CPU kernels (XNNPACK, {threads} thread{'s' if threads != 1 else ''}"
                + ("; no hardware GPU was found)" if it._requested_backend == "auto" else ")"))
    if backend == "cpu":
        if it._requested_backend != "auto":
            return "cpu (Taichi on the CPU)"
        refused = summary.get("litert_refused")     # auto tried LiteRT's kernels first
        return ("cpu (Taichi on the CPU: no hardware GPU was found"
                + (f", and LiteRT cannot run the model: {_shortened(refused)})" if refused else ")"))
    device = (summary.get("runtime") or {}).get("vulkan_device") or _probed_device(backend)
    if device and is_software_device(device):
        return f"{backend} on {device}, a software device (the CPU emulating a GPU: slower than cpu)"
    return f"{backend} ({device})" if device else backend


def _shortened(text: str, limit: int = 120) -> str:
    return text if len(text) <= limit else text[:limit - 3].rstrip() + "..."


def _probed_device(backend: str):
    """The device the start-up probe of a GPU API found (OpenGL's renderer: llvmpipe is the CPU
    emulating a GPU), where the runtime does not name it; None where nothing was probed."""
    from tflite_taichi.backend import GFX_PROBED
    from tflite_taichi.runtime import session
    if backend not in GFX_PROBED:
        return None
    ok, _software, device = session.SESSION.probes.get(backend, (False, False, ""))
    return device if ok else None


def _placement_text(it, s: dict, verb: str = "ran") -> str:
    """One line: where the ops ran (`verb` "runs": where they will run)."""
    text = f"{verb} on {_device_text(it, s)}"
    if s["backend"] == "reference":
        return text
    choice = s.get("auto_choice")
    if s["backend"] == "litert":
        text += f": all {s['ops_total']} ops"
        if choice is not None:      # `auto` found LiteRT faster than the GPU on this model
            verb = "planned" if choice["how"] == "planned" else "measured"
            text += f" (auto {verb} {choice['text']})"
        return text
    ops = s["ops_total"] - s["ops_folded"]
    text += f": {s['ops_delegated']} of {ops} ops on the delegate"
    if s["fallback"]:
        kinds = Counter(f["op"] for f in s["fallback"])
        on_litert = sum(f.get("runs_on") == "litert" for f in s["fallback"])
        where = ("LiteRT's kernels" if on_litert == len(s["fallback"]) else
                 f"{on_litert} on LiteRT's kernels" if on_litert else "numpy")
        text += (f", {len(s['fallback'])} on the CPU ({where}: "
                 + ", ".join(f"{op}" + (f" x{n}" if n > 1 else "") for op, n in kinds.most_common(4))
                 + (", ..." if len(kinds) > 4 else "") + "; -v says why)")
    if s["ops_folded"]:
        text += f"; {s['ops_folded']} computed once at load"
    if s["calls"]:      # the subgraphs IF/WHILE call, each delegated on its own
        text += (f"; the subgraphs they call: {sum(c['ops_delegated'] for c in s['calls'])} of "
                 f"{sum(c['ops_total'] for c in s['calls'])} ops on the delegate")
    return text


def cmd_run(args) -> int:
    with _plain_warnings() as notes:
        start = time.perf_counter()
        # the invokes timed and the outputs shown are the backend's own: `auto` waits for its
        # kernels here too, as every explicit backend does
        it = Interpreter(model_path=args.model, backend=args.backend, precision=args.precision,
                         profile=args.profile, answer_while_compiling=False)
        constructed = time.perf_counter()
        _load_inputs(it, args.input, args.seed, args.shape, args.resize)
        start_s = (constructed - start, time.perf_counter() - constructed)
        _say_first_dispatch(it)
        times = []
        for _ in range(args.runs):
            start = time.perf_counter()
            it.invoke()
            times.append(time.perf_counter() - start)
        s = it.summary()
    outputs = []
    print(f"{os.path.basename(args.model)} ({_kind_text(it, s)}) {_placement_text(it, s)}")
    if args.verbose:
        for note in notes:
            print(f"  delegate: {note}")
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


def _say_first_dispatch(it) -> None:
    """A line on stderr before the first invoke after a cold compile on a GPU API: the driver
    builds each kernel's pipeline (its own shader compile) at its first dispatch, seconds
    on a big model, which would otherwise pass without a word."""
    from tflite_taichi.backend import GFX_PROBED
    if it.backend in GFX_PROBED and (it.summary().get("runtime") or {}).get("compiled_in"):
        print("tflite-taichi: preparing the GPU pipelines (the first invoke after a compile)...",
              file=sys.stderr, flush=True)


def _kind_text(it, summary: dict) -> str:
    """What the model is (float32, full-integer int8, float16 weights...); the delegate's
    storage precision only where it is not the model's own: fp16 on a Taichi backend."""
    kind = summary["quantization"]
    if summary["backend"] not in ("reference", "litert") and it._precision == "fp16":
        kind += "; the delegate's tensors in fp16"
    return kind


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
    """A summary first (what the model is, its IO, its ops by kind, what the delegate would
    take and why not the rest); --ops lists every op, --tensors every tensor; --explore and
    --node-data show what the delegate did on the graph (tools/explore.py)."""
    extras = [flag for flag, given in (("--profile", args.profile), ("--port", args.port is not None),
                                       ("--no-browser", args.no_browser))
              if given]
    if extras and not (args.explore or args.node_data):
        raise UsageError(f"{', '.join(extras)}: only with --explore or --node-data")
    it = Interpreter(model_path=args.model, backend="reference")
    m = it.model
    print(f"{args.model}: {m.size} bytes, schema v{m.version}, {len(m.subgraphs)} subgraph(s)")
    if m.description:
        print(f"  description: {m.description}")
    prepared_error = _prepare_for_inspect(it, args.shape)
    for d in it.get_input_details():
        print(f"  input  {_fmt_tensor(d)}{_signature_note(d)}")
    for d in it.get_output_details():
        print(f"  output {_fmt_tensor(d)}{_signature_note(d, settable=False)}")
    for key, sig in it.get_signature_list().items():
        print(f"  signature {key}: inputs {sig['inputs']} outputs {sig['outputs']}")
    for sg in m.subgraphs:
        counts = Counter(op.name for op in sg.operators)
        print(f"  subgraph {sg.index} '{sg.name}': {len(sg.operators)} ops: "
              + ", ".join(f"{n} x{c}" for n, c in counts.most_common()))
    if prepared_error is not None:
        print(f"  which ops the delegate takes depends on the shapes: {prepared_error}")
        return 0
    summary = it.summary()
    print(f"  kind: {summary['quantization']}"
          + ("; runs as a float view (quantized tensors carried as float32 real values, snapped "
             "to their grid after every op; IO (de)quantized on the CPU)" if summary["float_view"] else ""))
    could = it.op_table()           # the reference path's table: what the delegate supports
    placed = _print_placement(args, could)
    rows = placed.op_table() if placed is not None else could
    if args.ops:
        print(f"ops (subgraph 0) on --backend {args.backend}:" if placed is not None else
              "ops (subgraph 0), as the delegate would take them elsewhere:")
        places = {"folded": "folded at prepare", "delegate": "the delegate",
                  "litert": "LiteRT's CPU kernels", "numpy": "reference (numpy)"}
        for row, support in zip(rows, could):
            where = places[row["runs_on"]] if placed is not None else "elsewhere: " + (
                "folded at prepare" if support["folded"] else
                "the delegate" if support["delegate"] is None else "the CPU")
            delegate = "yes" if support["delegate"] is None else f"no: {support['delegate']}"
            print(f"  #{row['index']:<4} {row['op']:<24} v{row['version']}  {row['outputs']}  "
                  f"[{where}; delegate {delegate}]")
    if args.tensors:
        print("tensors (subgraph 0):")
        for d in it.get_tensor_details():
            kind = "constant" if it.model.main.tensors[d["index"]].data is not None else "runtime"
            print(f"  {d['index']:<5} {_fmt_tensor(d)}  [{kind}]")
    if not (args.ops and args.tensors):
        print("  (--ops: every op and whether the delegate takes it; --tensors: every tensor)")
    if args.explore or args.node_data:
        return _explore(args)
    return 0


def _explore(args) -> int:
    """--node-data: write the overlays; --explore: show them in Model Explorer."""
    from tflite_taichi.tools import explore
    if args.explore:
        explore.model_explorer()        # says how to get it before anything compiles
    from tflite_taichi.partition import DelegateWarning
    with warnings.catch_warnings():     # the summary above said what the delegate takes
        warnings.simplefilter("ignore", DelegateWarning)
        data = explore.collect(args.model, args.backend, args.profile, args.shape)
    if args.node_data:
        for name, path in explore.write(data, args.node_data).items():
            print(f"node data ({name}): {path}")
    if args.explore:
        explore.serve(args.model, data, port=args.port, open_browser=not args.no_browser)
    return 0


def _prepare_for_inspect(it, shape_pairs):
    """Allocate at the --shape sizes; where the model cannot be prepared at the placeholder
    size of a run-time-sized input, what to say instead of failing (None when prepared)."""
    sized = apply_shapes(it, shape_pairs)
    try:
        it.allocate_tensors()
    except ModelError as e:
        unsized = [d for d in it.get_input_details()
                   if -1 in d["shape_signature"] and d["index"] not in sized]
        if not unsized:
            raise
        return needs_shapes(unsized, e)
    return None


def _signature_note(d, settable: bool = True) -> str:
    """Where the model leaves dimensions to run time: the declared form beside the shape."""
    if -1 not in d["shape_signature"]:
        return ""
    return (f" (declared {signature_text(d)}: -1 is sized at run time"
            + ("; --shape sets it)" if settable else ")"))


def _print_placement(args, could: list):
    """Where the ops will run with `--backend` (the same line `run` prints after running, from
    an Interpreter prepared as `run` prepares it: a Taichi backend compiles its kernels here,
    cached for the run), then what the delegate could take on a Taichi backend where that
    backend does not run the delegate (litert, reference) or cannot start here (its reason
    said). Returns the prepared Interpreter, or None where the backend cannot start."""
    from tflite_taichi.errors import BackendUnavailable
    try:
        with _plain_warnings():      # the line below says what the delegate's notes say
            placed = Interpreter(model_path=args.model, backend=args.backend,
                                 answer_while_compiling=False)
            apply_shapes(placed, args.shape)
            with _compile_progress_bar():
                placed.allocate_tensors()
    except BackendUnavailable as e:
        print(f"  --backend {args.backend} cannot start here ({e})")
        _print_delegate_summary(could, "elsewhere, the delegate would take")
        return None
    summary = placed.summary()
    print(f"  --backend {args.backend} {_placement_text(placed, summary, verb='runs')}")
    if placed.backend in ("litert", "reference"):
        _print_delegate_summary(could, "on a Taichi backend (--backend cpu, vulkan, ...), the "
                                       "delegate would take")
    else:
        _print_refusals(summary["fallback"])
    return placed


def _print_delegate_summary(rows, lead: str) -> None:
    """How many ops the delegate takes by the op table `rows`, and the others grouped by op
    and reason."""
    runtime = [r for r in rows if not r["folded"]]
    refused = [{"op": r["op"], "reason": r["delegate"]} for r in runtime if r["delegate"] is not None]
    folded = len(rows) - len(runtime)
    print(f"  {lead} {len(runtime) - len(refused)} of {len(runtime)} ops"
          + (f"; {folded} computed once at load" if folded else "") + (":" if refused else ""))
    _print_refusals(refused)


def _print_refusals(refused: list) -> None:
    """The ops the delegate does not take ({op, reason} each), grouped by op and reason."""
    for (op, reason), n in Counter((r["op"], r["reason"]) for r in refused).most_common():
        print(f"    not {op}" + (f" x{n}" if n > 1 else "") + f": {reason}")


def cmd_demo(args) -> int:
    """The demo model, written to a temporary folder that is removed when the demo ends (one
    left per run piled up in /tmp)."""
    with tempfile.TemporaryDirectory(prefix="tflite_taichi_demo_") as folder:
        return _demo(args, os.path.join(folder, "demo.tflite"))


def _demo(args, path: str) -> int:
    from tflite_taichi.tools.demo import build_demo_model
    model = build_demo_model()
    with open(path, "wb") as f:
        f.write(model)
    print(f"built a {len(model)}-byte demo classifier with tflite_taichi.builder "
          "(tflite_taichi.tools.demo.build_demo_model(); a temporary file, removed at the end)")
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
    if summary["backend"] == "litert":
        print(f"  summary: backend=litert ops={summary['ops_total']} (every op on LiteRT's CPU "
              "kernels: no hardware GPU was found)")
    else:
        print(f"  summary: backend={summary['backend']} ops={summary['ops_total']} "
              f"delegated={summary['ops_delegated']} on numpy={len(summary['fallback'])}"
              + (" (auto without a GPU keeps the ops numpy runs faster on numpy)"
                 if summary["backend"] == "cpu" and summary["fallback"] else ""))
    return 0


def cmd_bench(args) -> int:
    from tflite_taichi.tools.bench import run_cli
    return run_cli(args)


def cmd_batch(args) -> int:
    from tflite_taichi import batch
    result = batch.run(args.model, args.inputs, args.out, backend=args.backend,
                       batch_size=args.batch, workers=args.workers, ray=args.ray,
                       gpus_per_worker=args.gpus_per_worker, cpus_per_worker=args.cpus_per_worker,
                       fmt=args.format, preprocess=args.preprocess, precision=args.precision,
                       retries=args.retries, overwrite=args.overwrite, resume=args.resume,
                       progress=True, task_timeout=args.task_timeout,
                       imports=args.imports)
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
    for note in result.notes:
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


def _version_text() -> str:
    """tflite-taichi's version and the runtimes it stands on (none of them imported for it)."""
    from importlib import metadata
    def version(dist):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return "not installed"
    return (f"tflite-taichi {version('tflite-taichi')} (taichi {version('taichi')}, numpy "
            f"{version('numpy')}, LiteRT {version('ai-edge-litert')}, Python {sys.version.split()[0]})")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tflite-taichi")
    p.add_argument("--version", action="version", version=_version_text())
    sub = p.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run a model on random (seeded) or given inputs",
                         description="Run MODEL once (or --runs times) and print its outputs' "
                         "statistics, where its ops ran and how long starting and each invoke took.")
    run.add_argument("model", help="a .tflite file")
    run.add_argument("--backend", default="auto", choices=BACKENDS,
                     help="where the delegate runs: auto (the best hardware GPU, else Taichi on "
                          "the CPU), a Taichi backend, or reference (numpy, no Taichi); default auto")
    run.add_argument("--precision", default="fp32", choices=("fp32", "fp16"),
                     help="the delegate's storage: fp16 halves memory on cuda, vulkan and cpu "
                          "(default fp32)")
    run.add_argument("--input", action="append", metavar="NAME=file.npy",
                     help="an input's value, saved with numpy.save (NAME: the tensor's or the "
                          "signature's name; repeat for several); the rest are seeded random")
    run.add_argument("--shape", action="append", metavar="NAME=D1,D2",
                     help="an input's shape where the model sizes it at run time (-1 in its "
                          "signature, e.g. --shape audio=1,16000); random values of that shape")
    run.add_argument("--resize", action="store_true",
                     help="let --input/--shape change dimensions the model declares fixed "
                          "(resize_tensor_input; the model may not work at that shape)")
    run.add_argument("--output", metavar="out.npz", help="write every output to this .npz file")
    run.add_argument("--seed", type=int, default=0, help="of the random inputs (default 0)")
    run.add_argument("--runs", type=at_least_one, default=1, help="invokes to time (default 1)")
    run.add_argument("--profile", action="store_true",
                     help="per-partition and per-CPU-op times and kernel launches")
    run.add_argument("-v", "--verbose", action="store_true",
                     help="also print the delegate's notes (each op it leaves to the CPU, and why)")
    run.set_defaults(func=cmd_run)
    ins = sub.add_parser("inspect", help="IO, op counts, and per-op support",
                         description="What MODEL is and what the delegate would take: a summary "
                         "first; --ops and --tensors for the details.")
    ins.add_argument("model", help="a .tflite file")
    ins.add_argument("--ops", action="store_true",
                     help="list every op of the main graph with whether the delegate takes it")
    ins.add_argument("--tensors", action="store_true", help="also list every tensor")
    ins.add_argument("--shape", action="append", metavar="NAME=D1,D2",
                     help="an input's shape where the model sizes it at run time")
    ins.add_argument("--explore", action="store_true",
                     help="open Google's Model Explorer on the model with what the delegate did: "
                          "where each op runs, why not on the GPU, fusion groups; served on "
                          "127.0.0.1 to the holder of the printed address's token alone (pip "
                          'install "tflite-taichi[explore]")')
    ins.add_argument("--node-data", metavar="FILE.json",
                     help="write that as Model Explorer's node data instead (FILE.json: where "
                          "each op runs; FILE.why.json, FILE.fusion.json, FILE.time.json beside "
                          "it); needs no Model Explorer")
    ins.add_argument("--backend", default="auto", choices=BACKENDS,
                     help="the backend whose placement inspect says, --explore and --node-data "
                          "show: what `run` on it does (a Taichi backend compiles its kernels "
                          "here, cached for the run; default auto)")
    ins.add_argument("--profile", action="store_true",
                     help="with --explore/--node-data: time each op (12 invokes on random "
                          "inputs, one kernel per fusion group)")
    ins.add_argument("--port", type=int, default=None,
                     help="Model Explorer's port on 127.0.0.1 (default: 8080 or the next free)")
    ins.add_argument("--no-browser", action="store_true",
                     help="start Model Explorer without opening a browser (print its address, "
                          "whose token is what lets a browser in: keep it to yourself)")
    ins.set_defaults(func=cmd_inspect)
    demo = sub.add_parser("demo", help="build a small model and run it")
    demo.add_argument("--runs", type=at_least_one, default=5, help="invokes to time (default 5)")
    demo.set_defaults(func=cmd_demo)
    from tflite_taichi.tools.bench import add_arguments as bench_arguments
    bench = sub.add_parser("bench", help="time models on LiteRT and each backend of ours, side by side")
    bench.add_argument("model", nargs="+", metavar="model.tflite")
    bench_arguments(bench)
    bench.add_argument("--wide", action="store_true",
                       help="the full table (devices, cold and warm starts, cache, launches and "
                            "waits per invoke): wider than a terminal")
    bench.add_argument("--json", metavar="out.json", help="also write every number as JSON")
    bench.add_argument("--out", metavar="NAME", help="also write the report: NAME.md, NAME.json, NAME.png")
    bench.add_argument("--title", default="", help="the report's title (with --out)")
    bench.set_defaults(func=cmd_bench)
    bat = sub.add_parser("batch", help="run a folder of inputs through a model on every GPU "
                         "(a local pool of processes, or a Ray cluster)")
    bat.add_argument("model", help="a .tflite file")
    bat.add_argument("inputs", nargs="+", metavar="INPUTS",
                     help=".npy/.npz files, images, Parquet/Arrow tables, or folders of them")
    bat.add_argument("--out", required=True, metavar="DIR", help="where outputs and errors.jsonl go")
    bat.add_argument("--backend", default="auto", choices=BACKENDS,
                     help="where each worker's delegate runs (default auto: the best hardware "
                          "GPU, else Taichi on the CPU)")
    bat.add_argument("--precision", default="fp32", choices=("fp32", "fp16"),
                     help="the delegate's storage (default fp32)")
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
    bat.add_argument("--format", default="parquet", choices=("parquet", "npz"),
                     help="how outputs are written: Parquet (default) or .npz part files, each "
                          "holding a few batches' inputs (batch.read_outputs reads either)")
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
    bat.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE",
                     help="a module this process and every worker import first, e.g. one that "
                          "registers the model's custom ops (tflite_taichi.register_op); repeatable")
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
    except KeyboardInterrupt as e:      # Ctrl-C: a line, not a traceback; 128 + SIGINT, as a shell says
        model = getattr(args, "model", None)
        model = os.path.basename(model if isinstance(model, str) else model[0]) if model else ""
        print(f"tflite-taichi {args.command}: interrupted"
              + (f" while compiling the kernels of {model} ({e} done): the rest are not cached "
                 "and compile at the next run" if isinstance(e, _InterruptedCompile) else ""),
              file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
