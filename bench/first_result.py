"""The first result a user waits for, in a fresh process: import, Interpreter, allocate_tensors,
set every input (zeros), invoke, get every output; prints the seconds and the backend.

    python bench/first_result.py ours|litert MODEL [--threads N] [--backend auto]

`litert`: ai_edge_litert's own Interpreter (the yardstick). Run it twice with a fresh
TFLITE_TAICHI_CACHE_DIR for a cold and a warm start."""
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
    print(f"{time.perf_counter() - START:.3f} s {backend}")


if __name__ == "__main__":
    sys.exit(main())
