"""The first result a user waits for, in a fresh process: import, Interpreter, allocate_tensors,
set every input (zeros), invoke, get every output; prints the seconds and the backend.

    python bench/first_result.py ours|litert MODEL [--threads N] [--backend auto]

`litert`: ai_edge_litert's own Interpreter (the yardstick). Run it twice with a fresh
TFLITE_TAICHI_CACHE_DIR for a cold and a warm start.

`--follow S` (ours): keep stepping for S seconds after the first result and print when the GPU
took over (`summary()["answered_by"]` turning 'delegate'), what `auto` chose, and the median step
of the last second; `auto` on a GPU answers on LiteRT while the kernels compile."""
import sys
import time

START = time.perf_counter()


def main() -> None:
    import argparse
    import numpy as np
    p = argparse.ArgumentParser()
    p.add_argument("runtime", choices=("ours", "litert"))
    p.add_argument("model")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--backend", default="auto")
    p.add_argument("--follow", type=float, default=0.0)
    args = p.parse_args()
    if args.runtime == "litert":
        from ai_edge_litert.interpreter import Interpreter
        it = Interpreter(model_path=args.model, num_threads=args.threads)
        backend = "LiteRT"
    else:
        from tflite_taichi import Interpreter
        it = Interpreter(model_path=args.model, num_threads=args.threads, backend=args.backend)
        backend = it.backend
    it.allocate_tensors()
    for d in it.get_input_details():
        it.set_tensor(d["index"], np.zeros(d["shape"], d["dtype"]))
    it.invoke()
    for d in it.get_output_details():
        it.get_tensor(d["index"])
    print(f"{time.perf_counter() - START:.3f} s {backend}", flush=True)
    if args.follow and args.runtime == "ours":
        follow(it, args.follow)


def follow(it, seconds: float) -> None:
    """Step for `seconds`: when answered_by first reads 'delegate', the choice, the last steps."""
    import numpy as np
    inputs = [(d["index"], np.zeros(d["shape"], d["dtype"])) for d in it.get_input_details()]
    outputs = [d["index"] for d in it.get_output_details()]
    end, took_over, steps = time.perf_counter() + seconds, None, []
    while time.perf_counter() < end:
        t = time.perf_counter()
        for index, x in inputs:
            it.set_tensor(index, x)
        it.invoke()
        for index in outputs:
            it.get_tensor(index)
        steps.append((t, time.perf_counter() - t))
        if took_over is None and it.summary()["answered_by"] == "delegate":
            took_over = time.perf_counter() - START
    last = [d for t, d in steps if t > end - 1.0]
    choice = (it.summary().get("auto_choice") or {}).get("text")
    print(f"gpu from {took_over if took_over is None else round(took_over, 3)} s; "
          f"last second's median step {np.median(last) * 1e3:.4g} ms ({len(last)} steps); "
          f"backend {it.backend}; choice: {choice}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
