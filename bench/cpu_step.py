"""A user's step on the CPU, ours against LiteRT, side by side in one process.

    python bench/cpu_step.py MODEL... [--backends litert,auto,cpu,reference] [--threads 2]
        [--steps 200] [--warmup N] [--warmup-s S] [--load K] [--json OUT.json]

MODEL: a .tflite path, a shared model's name (../shared/models), a zoo name, or `one_op` (an
ADD of two [1, 8] float tensors: the Python cost of a step).
Runtimes (`--backends`): `litert` (its CPU path, `num_threads=--threads`), `litert_gpu` (its GPU
path: CompiledModel with the GPU accelerator, fp16 by default as LiteRT's), `torch` (the same
network in PyTorch eager on CUDA, bench/torch_eager.py: image classifiers only), and any of our
backends (auto, cpu, reference, cuda, vulkan, ...).
Every runtime gets its interpreter in this one process (LiteRT with `num_threads=--threads`, ours
with the same `num_threads`), is warmed up, then the steps are interleaved: one step of each
runtime in turn, so a busy moment of the machine hits every runtime alike (each round starting
with the next runtime: the one after LiteRT finds its thread pool still spinning). A step is what a
user's loop does: set every input, invoke, get every output. Reported per runtime: median, p10-p90
and the median's ratio to LiteRT's.

Taichi runs one arch per process: `cpu` and a GPU backend (or `auto` where it picks a GPU) cannot
share a run; measure them in two invocations, each with LiteRT beside it.

Thread settings cannot be compared in one process: OpenBLAS's workers are the process's, and
the spinning that one runtime's BLAS calls leave behind slows every runtime after it (LiteRT
included: mobilenet_v1_fp32 on LiteRT 14.1 ms beside our 2-thread BLAS, 6.9 ms beside our
1-thread BLAS). Compare two commits with bench/with_package.py, one process each.

`--load K` starts K busy processes beside the run (each spins one core in pure Python: "a second
CPU-heavy job"), started before the interpreters and stopped at the end.
"""
import argparse
import json
import multiprocessing
import os
import platform
import sys
import time
import warnings

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from timing import spread_ms  # noqa: E402  (bench/timing.py: the step's figures, shared)

SHARED = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "models")


def model_bytes(name: str) -> tuple:
    """(label, path) of a model: a path, a shared model's name or a zoo model (written to a
    temporary file: both runtimes read paths)."""
    if os.path.isfile(name):
        return os.path.basename(name).rsplit(".", 1)[0], name
    shared = os.path.join(SHARED, name + ".tflite")
    if os.path.isfile(shared):
        return name, shared
    import tempfile
    path = os.path.join(tempfile.mkdtemp(prefix="cpu-step-"), name + ".tflite")
    with open(path, "wb") as f:
        f.write(one_op() if name == "one_op" else _zoo(name))
    return name, path


def _zoo(name: str) -> bytes:
    from tflite_taichi.tools import zoo
    return zoo.build(name)


def one_op() -> bytes:
    from tflite_taichi.builder import ModelBuilder
    b = ModelBuilder()
    g = b.subgraph()
    x = g.input("x", (1, 8))
    y = g.tensor("y", (1, 8))
    g.op("ADD", [x, g.const("one", np.ones((1, 8), np.float32))], [y])
    g.output(y)
    return b.finish()


def _spin(stop) -> None:
    x = 0
    while not stop.is_set():
        for _ in range(100000):
            x += 1


class Step:
    """One runtime's interpreter and its step (set, invoke, get)."""

    def __init__(self, name: str, path: str, threads: int, inputs: list):
        self.name = name
        self.label = name
        self.times = []
        if name == "litert_gpu":
            self.step = _litert_gpu_step(path, inputs)
            return
        if name == "torch":
            self.step = _torch_step(path, inputs)
            return
        if name == "litert":
            from ai_edge_litert.interpreter import Interpreter as LiteRT
            self.it = LiteRT(model_path=path, num_threads=threads)
        else:
            from tflite_taichi import Interpreter
            self.it = Interpreter(model_path=path, backend=name, num_threads=threads)
        self.it.allocate_tensors()
        if hasattr(self.it, "wait_for_kernels"):    # `auto` on a GPU answers on the CPU until then
            self.it.wait_for_kernels()
        self.inputs = [(d["index"], x) for d, x in zip(self.it.get_input_details(), inputs)]
        self.outputs = [d["index"] for d in self.it.get_output_details()]
        self.label = name if name != "auto" else f"auto -> {self.it.backend}"
        self.choice = None

    def chosen(self, limit_s: float = 60.0) -> None:
        """`auto` after its warm-up: stepped on until it has made its choice (measuring the GPU
        takes 0.3 s of its invokes: hundreds of steps of a fast model, more than a warm-up),
        then where it runs and why (summary()["auto_choice"])."""
        if self.name != "auto":
            return
        from tflite_taichi.interpreter import HOST_BACKENDS
        on_the_host = HOST_BACKENDS + ("cpu",)     # no GPU, or the model handed to LiteRT
        deadline = time.perf_counter() + limit_s
        while (self.it.backend not in on_the_host and time.perf_counter() < deadline
               and self.it.summary().get("auto_choice") is None):    # on a GPU, still measuring
            for _ in range(50):
                self.step()
        self.label = f"auto -> {self.it.backend}"
        self.choice = ((self.it.summary().get("auto_choice") or {}).get("text")
                       or ("undecided" if self.it.backend not in on_the_host else "no GPU"))

    def step(self) -> list:
        it = self.it
        for index, x in self.inputs:
            it.set_tensor(index, x)
        it.invoke()
        return [it.get_tensor(i) for i in self.outputs]

    def timed(self) -> None:
        start = time.perf_counter()
        self.step()
        self.times.append(time.perf_counter() - start)


def _litert_gpu_step(path: str, inputs: list):
    """LiteRT's GPU path (as ../shared/tools/gpu_anchors.py runs it): write every input buffer,
    run, read every output; inputs matched to the signature's order by shape."""
    from ai_edge_litert.compiled_model import CompiledModel
    from ai_edge_litert.hardware_accelerator import HardwareAccelerator
    from ai_edge_litert.options import Options
    cm = CompiledModel.from_file(path, options=Options(hardware_accelerators=HardwareAccelerator.GPU))
    if not cm.is_fully_accelerated():
        raise RuntimeError("LiteRT's GPU path does not take the whole model")
    sig = list(cm.get_signature_list())[0]
    names = cm.get_signature_list()[sig]
    idet, odet = cm.get_input_tensor_details(sig), cm.get_output_tensor_details(sig)
    xs = [next(x for x in inputs if tuple(x.shape) == tuple(idet[n]["shape"])) for n in names["inputs"]]
    outs = [(tuple(odet[n]["shape"]), np.dtype(odet[n]["dtype"])) for n in names["outputs"]]
    ib, ob = cm.create_input_buffers(0), cm.create_output_buffers(0)

    def step():
        for b, x in zip(ib, xs):
            b.write(x)
        cm.run_by_index(0, ib, ob)
        return [b.read(int(np.prod(s)), dt).reshape(s) for b, (s, dt) in zip(ob, outs)]
    return step


def _torch_step(path: str, inputs: list):
    """PyTorch eager on CUDA, the network rebuilt from the model's weights (bench/torch_eager.py)."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from torch_eager import TorchModel
    net = TorchModel(path, batch=1, device="cuda")
    return lambda: [net(inputs[0])]


def run_model(label: str, path: str, backends: list, threads: int, steps: int, warmup: int,
              warmup_s: float = 0.0) -> list:
    from tflite_taichi.tools.bench import make_inputs
    inputs = make_inputs(path)
    runtimes = []
    for name in backends:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                runtimes.append(Step(name, path, threads, inputs))
            except Exception as e:            # a runtime that cannot run the model is a row
                print(f"{label:28} {name:10} error: {type(e).__name__}: {e}"[:200], flush=True)
    for r in list(runtimes):
        try:
            for _ in range(warmup):
                r.step()
            until = time.perf_counter() + warmup_s      # a GPU that idled climbs to its clock
            while time.perf_counter() < until:          # over ~0.25 s of work (the H100, H200)
                r.step()
            r.chosen()
        except Exception as e:               # e.g. torch's form refusing an int8 input
            print(f"{label:28} {r.name:10} error: {type(e).__name__}: {e}"[:200], flush=True)
            runtimes.remove(r)
    if not runtimes:                # each refused the model: its error line says why
        return []
    for i in range(steps):          # each round starts with the next runtime: none always runs
        for r in runtimes[i % len(runtimes):] + runtimes[:i % len(runtimes)]:   # right after
            r.timed()                                       # LiteRT's spinning thread pool
    base = next((r for r in runtimes if r.name == "litert"), None)
    rows = []
    for r in runtimes:
        row = {"model": label, "runtime": r.label, **spread_ms(r.times)}
        if base is not None:
            row["vs_litert"] = row["median_ms"] / float(np.median(base.times) * 1e3)
        if getattr(r, "choice", None):
            row["auto_choice"] = r.choice
        rows.append(row)
        ratio = f"{row['vs_litert']:6.2f}x" if "vs_litert" in row else ""
        print(f"{label:28} {r.label:22} {row['median_ms']:9.4g} ms  "
              f"p10-p90 {row['p10_ms']:.4g}-{row['p90_ms']:.4g}  {ratio}", flush=True)
        if "auto_choice" in row:
            print(f"{'':28} auto chose {row['auto_choice']}", flush=True)
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("models", nargs="+")
    p.add_argument("--backends", default="litert,auto,cpu,reference")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--warmup-s", type=float, default=0.0,
                   help="and then step each runtime for this many seconds before timing")
    p.add_argument("--load", type=int, default=0, help="busy processes beside the run")
    p.add_argument("--json")
    a = p.parse_args(argv)
    stop = multiprocessing.Event()
    load = [multiprocessing.Process(target=_spin, args=(stop,), daemon=True) for _ in range(a.load)]
    for proc in load:
        proc.start()
    import taichi  # noqa: F401  (the version line below; our import is lazy)
    from importlib.metadata import version
    print(f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, Python "
          f"{platform.python_version()}, numpy {np.__version__}, taichi {version('taichi')}, "
          f"ai-edge-litert {version('ai-edge-litert')}; threads {a.threads}, load {a.load}, "
          f"{a.steps} interleaved steps", flush=True)
    rows = []
    try:
        for name in a.models:
            label, path = model_bytes(name)
            rows += run_model(label, path, a.backends.split(","), a.threads, a.steps, a.warmup,
                              a.warmup_s)
    finally:
        stop.set()
        for proc in load:
            proc.join(5)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"argv": sys.argv, "threads": a.threads, "load": a.load, "rows": rows}, f,
                      indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
