"""Run by tflite_taichi.tools.bench in a fresh subprocess: one runtime (LiteRT CPU, LiteRT GPU or one
backend of ours) on one model, timed. A script, not a module import, so that importing the
runtime is measured apart from the start and nothing of ours is imported before the clock starts.

    python bench_child.py SPEC.json

SPEC (written by bench.py): model, backend ('litert', 'litert_gpu', 'litert_gpu_fp16' or ours),
precision, threads, stage ('cold': the start only; 'warm': the start, then warm-up and timed
steps), runs, warmup, profile, inputs (.npz, in the model's input order), io ({'inputs': [{name,
shape}], 'outputs': [...]}: the model's inputs and outputs, in its order), outputs (.npz to write,
in the model's output order), result (.json to write), cache_dir, sys_path; for tests,
accelerator ('cpu' runs the LiteRT GPU path, CompiledModel, on LiteRT's CPU accelerator).
Progress goes to stdout as lines '@@bench <stage> <n>' (n steps done since the last line).

A step is what a user's loop does: set every input, invoke, get every output (LiteRT CPU and
ours: set_tensor / invoke / get_tensor; LiteRT GPU: TensorBuffer.write / run_by_index / read).
"""
import gc
import json
import os
import sys
import time
import traceback

from tflite_taichi import switches

LITERT_GPU = ("litert_gpu", "litert_gpu_fp16")


def _emit(stage: str, n: int) -> None:
    print(f"@@bench {stage} {n}", flush=True)


def _count_files(path):
    if not path or not os.path.isdir(path):
        return 0
    return sum(len(files) for _, _, files in os.walk(path))


def _size(shape) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def match(model_io, runtime_io):
    """For each of the model's tensors (a list of {'name', 'shape'}, in the model's order), the
    position of the same tensor among the runtime's (the same form, in the runtime's order):
    by name where the names agree, else the first unused one of the same shape, else of the
    same number of elements. Returns (positions, how) with how[k] 'name', 'shape' or 'size';
    ValueError when one cannot be matched."""
    if len(model_io) != len(runtime_io):
        raise ValueError(f"the model has {len(model_io)} tensor(s) here, the runtime "
                         f"{len(runtime_io)}")
    positions, how = [None] * len(model_io), [None] * len(model_io)
    used = set()
    by_name = {}
    for j, r in enumerate(runtime_io):
        by_name.setdefault(r.get("name"), j)
    for k, m in enumerate(model_io):
        j = by_name.get(m.get("name"))
        if m.get("name") is not None and j is not None and j not in used:
            positions[k], how[k] = j, "name"
            used.add(j)
    for kind, same in (("shape", lambda a, b: list(map(int, a)) == list(map(int, b))),
                       ("size", lambda a, b: _size(a) == _size(b))):
        for k, m in enumerate(model_io):
            if positions[k] is not None:
                continue
            j = next((j for j, r in enumerate(runtime_io)
                      if j not in used and same(m["shape"], r["shape"])), None)
            if j is not None:
                positions[k], how[k] = j, kind
                used.add(j)
    missing = [m.get("name") for k, m in enumerate(model_io) if positions[k] is None]
    if missing:
        raise ValueError(f"cannot match the model's tensor(s) {missing} with the runtime's "
                         f"{[(r.get('name'), list(r['shape'])) for r in runtime_io]}")
    return positions, how


class InterpreterRuntime:
    """LiteRT's Interpreter (CPU, XNNPACK) or ours: set_tensor / invoke / get_tensor."""

    def __init__(self, cls, spec, kwargs):
        self.cls, self.spec, self.kwargs = cls, spec, kwargs
        self.it = None
        self.matched = {}

    def construct(self):
        self.it = self.cls(model_path=self.spec["model"], **self.kwargs)

    def allocate(self):
        it, io = self.it, self.spec["io"]
        wanted = {d["name"]: d["shape"] for d in io["inputs"]}
        for d in it.get_input_details():        # inputs sized by --shape (model_io)
            shape = wanted.get(d["name"])
            if shape is not None and list(shape) != [int(n) for n in d["shape"]]:
                it.resize_tensor_input(d["index"], shape)
        it.allocate_tensors()
        ins = [{"name": d["name"], "shape": list(d["shape"])} for d in it.get_input_details()]
        outs = [{"name": d["name"], "shape": list(d["shape"])} for d in it.get_output_details()]
        pos, how_in = match(io["inputs"], ins)
        self.inputs = [(it.get_input_details()[j]["index"], k) for k, j in enumerate(pos)]
        pos, how_out = match(io["outputs"], outs)
        self.outputs = [it.get_output_details()[j]["index"] for j in pos]
        self.matched = {"inputs": how_in, "outputs": how_out}

    def set_inputs(self, feeds):
        for index, k in self.inputs:
            self.it.set_tensor(index, feeds[k])

    def invoke(self):
        self.it.invoke()

    def get_outputs(self):
        return [self.it.get_tensor(i) for i in self.outputs]


class CompiledModelRuntime:
    """LiteRT's GPU path (ML Drift, WebGPU/Vulkan): CompiledModel with the GPU accelerator;
    TensorBuffer.write / run_by_index / read."""

    def __init__(self, spec):
        from ai_edge_litert.compiled_model import CompiledModel
        from ai_edge_litert.hardware_accelerator import HardwareAccelerator
        from ai_edge_litert.options import Options
        from ai_edge_litert.gpu_options import GpuOptions
        self.spec = spec
        self.CompiledModel = CompiledModel
        accel = (HardwareAccelerator.CPU if spec.get("accelerator") == "cpu"
                 else HardwareAccelerator.GPU)
        gpu = GpuOptions(enforce_f32=True) if spec["backend"] == "litert_gpu" else GpuOptions()
        self.options = Options(hardware_accelerators=accel, gpu_options=gpu)
        self.cm = None
        self.matched = {}

    def construct(self):
        self.cm = self.CompiledModel.from_file(self.spec["model"], options=self.options)
        self.fully_accelerated = bool(self.cm.is_fully_accelerated())

    def allocate(self):
        import numpy as np
        cm, io = self.cm, self.spec["io"]
        signatures = cm.get_signature_list()
        sig = list(signatures)[0]
        idet, odet = cm.get_input_tensor_details(sig), cm.get_output_tensor_details(sig)
        inames, onames = list(signatures[sig]["inputs"]), list(signatures[sig]["outputs"])
        self.ib, self.ob = cm.create_input_buffers(0), cm.create_output_buffers(0)
        # a signature's own names ('input_1') or its tensors' ('serving_default_input_1:0'):
        # the model's names are the tensors'
        ins = [{"name": idet[n].get("name", n), "shape": list(idet[n]["shape"])} for n in inames]
        outs = [{"name": odet[n].get("name", n), "shape": list(odet[n]["shape"])} for n in onames]
        pos, how_in = match(io["inputs"], ins)
        feed_of = [None] * len(pos)
        for k, j in enumerate(pos):
            feed_of[j] = k
        self.feed_of = feed_of
        pos, how_out = match(io["outputs"], outs)
        self.reads = [(self.ob[j], _size(outs[j]["shape"]), np.dtype(odet[onames[j]]["dtype"]),
                       tuple(io["outputs"][k]["shape"])) for k, j in enumerate(pos)]
        self.matched = {"inputs": how_in, "outputs": how_out}

    def set_inputs(self, feeds):
        for b, k in zip(self.ib, self.feed_of):
            b.write(feeds[k])

    def invoke(self):
        self.cm.run_by_index(0, self.ib, self.ob)

    def get_outputs(self):
        return [b.read(n, dtype).reshape(shape) for b, n, dtype, shape in self.reads]


def _import(spec):
    """The runtime, imported (this is import_s)."""
    backend = spec["backend"]
    if backend == "litert":
        from ai_edge_litert.interpreter import Interpreter
        return InterpreterRuntime(Interpreter, spec, {"num_threads": spec["threads"]})
    if backend in LITERT_GPU:
        return CompiledModelRuntime(spec)
    from tflite_taichi.interpreter import Interpreter
    return InterpreterRuntime(Interpreter, spec, {
        "backend": backend, "precision": spec["precision"], "profile": spec["profile"],
        "cache_dir": spec.get("cache_dir") or None,
        "answer_while_compiling": False})      # the backend's own steps: `auto` waits too


def _start(spec, np):
    """Import, then construct, allocate, the first step (set inputs, invoke, get outputs): each
    phase's seconds."""
    import warnings
    t = time.perf_counter()
    rt = _import(spec)
    import_s = time.perf_counter() - t
    data = np.load(spec["inputs"])
    feeds = [data[f"input_{i}"] for i in range(len(data.files))]
    warnings.simplefilter("ignore")              # DelegateWarning lines: summary() says it
    cache_files = _count_files(spec.get("cache_dir"))
    gc.collect()
    t0 = time.perf_counter()
    rt.construct()
    t1 = time.perf_counter()
    rt.allocate()
    t2 = time.perf_counter()
    rt.set_inputs(feeds)
    rt.invoke()
    rt.get_outputs()
    t3 = time.perf_counter()
    start = {"import_s": import_s, "construct_s": t1 - t0, "allocate_s": t2 - t1,
             "first_invoke_s": t3 - t2, "start_s": t3 - t0,
             "cache_files_before": cache_files}
    return rt, feeds, start


def _timed(spec, rt, feeds):
    """The second step, warm-up steps, then `runs` timed steps (gc off). Returns the second
    step's seconds, each timed step's seconds, each timed step's invoke() alone, the last
    outputs."""
    last = time.perf_counter()
    pending = 0
    clock = time.perf_counter
    set_inputs, invoke, get_outputs = rt.set_inputs, rt.invoke, rt.get_outputs

    def tick(stage):
        nonlocal last, pending
        pending += 1
        now = clock()
        if now - last >= 0.25:
            _emit(stage, pending)
            last, pending = now, 0

    t = clock()
    set_inputs(feeds)
    invoke()
    get_outputs()
    second = clock() - t
    tick("warmup")
    for _ in range(max(spec["warmup"] - 1, 0)):
        set_inputs(feeds)
        invoke()
        get_outputs()
        tick("warmup")
    if pending:
        _emit("warmup", pending)
        pending = 0
    steps, invokes = [], []
    outputs = None
    gc.collect()
    gc.disable()
    try:
        for _ in range(spec["runs"]):
            t0 = clock()
            set_inputs(feeds)
            t1 = clock()
            invoke()
            t2 = clock()
            outputs = get_outputs()
            t3 = clock()
            steps.append(t3 - t0)
            invokes.append(t2 - t1)
            tick("timed")
    finally:
        gc.enable()
    if pending:
        _emit("timed", pending)
    return second, steps, invokes, outputs


def _ours_summary(rt):
    s = rt.it.summary()
    runtime = s.get("runtime") or None
    cache = s.get("cache") or None
    out = {
        "backend": s["backend"], "ops_total": s["ops_total"],
        "ops_delegated": s["ops_delegated"], "ops_folded": s["ops_folded"],
        "ops_cpu": len(s["fallback"]), "partitions": len(s["partitions"]),
        "kernels": sum(p["kernels"] for p in s["partitions"]),
        "runtime": runtime,
        "cache": None if cache is None else {k: cache.get(k) for k in ("state", "reason", "dir", "token")},
    }
    return out


def _hold_cuda_context() -> bool:
    """LiteRT's GPU path with the NVIDIA clock boost our vulkan backend takes (vulkan_host.py):
    a CUDA primary context on device 0, held for the process, so the two compare at equal
    clocks (TFLITE_TAICHI_BENCH_CUDA_CONTEXT=1)."""
    import ctypes
    try:
        cu = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    ctx, dev = ctypes.c_void_p(), ctypes.c_int()
    return (cu.cuInit(0) == 0 and cu.cuDeviceGet(ctypes.byref(dev), 0) == 0
            and cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0)


def main(path: str) -> int:
    with open(path) as f:
        spec = json.load(f)
    for p in reversed(spec.get("sys_path") or []):
        if p not in sys.path:
            sys.path.insert(0, p)
    result = {"ok": False, "stage": spec["stage"], "backend": spec["backend"], "pid": os.getpid()}
    ours = spec["backend"] != "litert" and spec["backend"] not in LITERT_GPU
    try:
        import numpy as np
        if spec["backend"] in LITERT_GPU and switches.value("TFLITE_TAICHI_BENCH_CUDA_CONTEXT"):
            result["cuda_context"] = _hold_cuda_context()
        rt, feeds, start = _start(spec, np)
        result["start"] = start
        result["matched"] = rt.matched
        if spec["backend"] in LITERT_GPU:
            result["fully_accelerated"] = rt.fully_accelerated
        _emit(spec["stage"], 1)
        if ours:
            result["summary"] = _ours_summary(rt)
        if spec["stage"] == "warm":
            second, steps, invokes, outputs = _timed(spec, rt, feeds)
            result["second_step_ms"] = second * 1e3
            result["times_ms"] = [t * 1e3 for t in steps]
            result["invoke_times_ms"] = [t * 1e3 for t in invokes]
            np.savez(spec["outputs"], **{f"output_{i}": y for i, y in enumerate(outputs)})
            if ours and spec["profile"]:
                result["profile"] = rt.it.profile()
        result["ok"] = True
    except BaseException as e:  # report, never hang the parent
        result["error"] = f"{type(e).__name__}: {e}"
        result["traceback"] = traceback.format_exc()
    with open(spec["result"], "w") as f:
        json.dump(result, f)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.path.pop(0)          # this file's folder: its modules (graph, model, ...) are not top-level
    sys.exit(main(sys.argv[1]))
