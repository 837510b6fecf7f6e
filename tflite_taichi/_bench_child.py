"""Run by tflite_taichi.bench in a fresh subprocess: one runtime (LiteRT or one backend of ours)
on one model, timed. A script, not a module import, so that importing the runtime is measured
apart from the start and nothing of ours is imported before the clock starts.

    python _bench_child.py SPEC.json

SPEC (written by bench.py): model, backend ('litert' or ours), precision, threads, stage
('cold': the start only; 'warm': the start, then warm-up and timed invokes), runs, warmup,
profile, inputs (.npz), outputs (.npz to write), result (.json to write), cache_dir, sys_path.
Progress goes to stdout as lines '@@bench <stage> <n>' (n invokes done since the last line).
"""
import gc
import json
import os
import sys
import time
import traceback


def _emit(stage: str, n: int) -> None:
    print(f"@@bench {stage} {n}", flush=True)


def _count_files(path):
    if not path or not os.path.isdir(path):
        return 0
    return sum(len(files) for _, _, files in os.walk(path))


def _start(spec, np):
    """Create the interpreter, allocate, set the inputs, first invoke: each phase's seconds."""
    import warnings
    backend = spec["backend"]
    t = time.perf_counter()
    if backend == "litert":
        from ai_edge_litert.interpreter import Interpreter as Runtime
        kwargs = {"num_threads": spec["threads"]}
    else:
        from tflite_taichi.interpreter import Interpreter as Runtime
        kwargs = {"backend": backend, "precision": spec["precision"], "profile": spec["profile"]}
        import inspect
        if spec.get("cache_dir") and "cache_dir" in inspect.signature(Runtime).parameters:
            kwargs["cache_dir"] = spec["cache_dir"]
    import_s = time.perf_counter() - t
    data = np.load(spec["inputs"])
    feeds = [data[f"input_{i}"] for i in range(len(data.files))]
    warnings.simplefilter("ignore")              # DelegateWarning lines: summary() says it
    cache_files = _count_files(spec.get("cache_dir"))
    gc.collect()
    t0 = time.perf_counter()
    it = Runtime(model_path=spec["model"], **kwargs)
    t1 = time.perf_counter()
    it.allocate_tensors()
    t2 = time.perf_counter()
    for d, x in zip(it.get_input_details(), feeds):
        it.set_tensor(d["index"], x)
    it.invoke()
    t3 = time.perf_counter()
    cache = getattr(it, "_cache", None)
    start = {"import_s": import_s, "construct_s": t1 - t0, "allocate_s": t2 - t1,
             "first_invoke_s": t3 - t2, "start_s": t3 - t0,
             "cache_files_before": cache_files,
             "cache_state": cache.info()["state"] if cache is not None else None}
    return it, start


def _timed(spec, it, np):
    """Warm-up, then `runs` timed invokes (gc off): seconds per invoke."""
    last = time.perf_counter()
    pending = 0

    def tick(stage):
        nonlocal last, pending
        pending += 1
        now = time.perf_counter()
        if now - last >= 0.25:
            _emit(stage, pending)
            last, pending = now, 0

    t = time.perf_counter()
    it.invoke()
    second = time.perf_counter() - t
    tick("warmup")
    for _ in range(max(spec["warmup"] - 1, 0)):
        it.invoke()
        tick("warmup")
    if pending:
        _emit("warmup", pending)
        pending = 0
    times = []
    gc.collect()
    gc.disable()
    try:
        for _ in range(spec["runs"]):
            t = time.perf_counter()
            it.invoke()
            times.append(time.perf_counter() - t)
            tick("timed")
    finally:
        gc.enable()
    if pending:
        _emit("timed", pending)
    return second, times


def main(path: str) -> int:
    with open(path) as f:
        spec = json.load(f)
    for p in reversed(spec.get("sys_path") or []):
        if p not in sys.path:
            sys.path.insert(0, p)
    result = {"ok": False, "stage": spec["stage"], "backend": spec["backend"], "pid": os.getpid()}
    try:
        import numpy as np
        it, start = _start(spec, np)
        result["start"] = start
        _emit(spec["stage"], 1)
        if spec["stage"] == "warm":
            second, times = _timed(spec, it, np)
            result["second_invoke_ms"] = second * 1e3
            result["times_ms"] = [t * 1e3 for t in times]
            outputs = {f"output_{i}": it.get_tensor(d["index"])
                       for i, d in enumerate(it.get_output_details())}
            np.savez(spec["outputs"], **outputs)
            if spec["backend"] != "litert":
                s = it.summary()
                result["summary"] = {
                    "backend": s["backend"], "ops_total": s["ops_total"],
                    "ops_delegated": s["ops_delegated"], "ops_folded": s["ops_folded"],
                    "ops_cpu": len(s["fallback"]),
                    "partitions": len(s["partitions"]),
                    "kernels": sum(p["kernels"] for p in s["partitions"]),
                }
                if spec["profile"]:
                    result["profile"] = it.profile()
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
