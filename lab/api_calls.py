"""The tf.lite calls one by one, LiteRT's own Interpreter against ours (`auto`): best of 5 x 20,000
calls of set_tensor, invoke, get_tensor and the whole step (every input set, invoke, every output
read), on one model (a path, a shared model's name or `one_op`, as bench/cpu_step.py takes them).

    python lab/api_calls.py [MODEL] [--threads 2]
"""
import argparse
import os
import sys
import time

import numpy as np

# bench/cpu_step.py, the maintained harness, names the models this probe takes
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "bench"))
from cpu_step import model_bytes  # noqa: E402


def best_us(call, n: int = 20000, rounds: int = 5) -> float:
    """The fastest of `rounds` means over `n` calls, in microseconds."""
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(n):
            call()
        best = min(best, (time.perf_counter() - start) / n)
    return best * 1e6


def calls(it) -> dict:
    ins, outs = it.get_input_details(), it.get_output_details()
    data = [(d["index"], np.zeros(d["shape"], d["dtype"])) for d in ins]
    readable = [d["index"] for d in outs]

    def step():
        for index, x in data:
            it.set_tensor(index, x)
        it.invoke()
        return [it.get_tensor(o) for o in readable]
    first, x = data[0]
    step()
    return {"step": step, "set_tensor": lambda: it.set_tensor(first, x), "invoke": it.invoke,
            "get_tensor": lambda: it.get_tensor(readable[0])}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("model", nargs="?", default="one_op")
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args()
    from ai_edge_litert.interpreter import Interpreter as LiteRT

    from tflite_taichi import Interpreter
    _label, path = model_bytes(a.model)
    runtimes = {"litert": LiteRT(model_path=path, num_threads=a.threads),
                "ours": Interpreter(model_path=path, num_threads=a.threads)}
    for name, it in runtimes.items():
        it.allocate_tensors()
        timed = {what: best_us(call) for what, call in calls(it).items()}
        print(name, "  ".join(f"{what} {us:.2f} us" for what, us in timed.items()))


if __name__ == "__main__":
    main()
