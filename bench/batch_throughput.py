"""Images per second at a batch size (the batched target): the model's input resized to
batch B, median of N invokes after warm-up, on one backend, and LiteRT on the same machine when
it is installed, and PyTorch eager (a GPU user's yardstick) when torch is installed: the same
network built from the model's weights by bench/torch_eager.py, on cuda when torch has it.

    python bench/batch_throughput.py MODEL --backend cuda --batch 32 [--runs 20] [--litert-threads 16] [--torch]
"""
import argparse
import importlib.util
import os
import sys
import warnings

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from timing import spread_ms, timed  # noqa: E402


def _seconds(times):
    """(median, p10, p90) of `times`, in seconds."""
    s = spread_ms(times)
    return s["median_ms"] / 1e3, s["p10_ms"] / 1e3, s["p90_ms"] / 1e3


def _time(it, runs):
    d = it.get_input_details()[0]
    it.set_tensor(d["index"], np.random.default_rng(0).uniform(0, 1, d["shape"]).astype(d["dtype"]))
    return _seconds(timed(it.invoke, runs, warmup=3))


def _time_torch(model, batch, runs):
    import torch
    from torch_eager import TorchModel
    device = "cuda" if torch.cuda.is_available() else "cpu"
    net = TorchModel(model, batch=batch, device=device)
    shape = (batch, *net.subgraph.tensors[net.subgraph.inputs[0]].shape[1:])
    x = torch.as_tensor(np.random.default_rng(0).uniform(0, 1, shape).astype(np.float32), device=device)
    x = net._nchw(x)

    def run():
        with torch.inference_mode():
            values = dict(net.consts)
            values[net.subgraph.inputs[0]] = x
            for kind, op, weight, bias, groups, node in net.plan:
                values[op.outputs[0]] = net._run(kind, op, weight, bias, groups, node, values)
            if device == "cuda":
                torch.cuda.synchronize()

    return device, _seconds(timed(run, runs, warmup=3))


def _resized(it, batch):
    d = it.get_input_details()[0]
    it.resize_tensor_input(d["index"], [batch, *d["shape"][1:]])
    it.allocate_tensors()
    return it


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model")
    p.add_argument("--backend", default="cuda")
    p.add_argument("--precision", default="fp32")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--litert-threads", type=int, default=0, help="0: skip LiteRT")
    p.add_argument("--torch", action="store_true",
                   help="also PyTorch eager (input already on the device, as a GPU pipeline has it)")
    a = p.parse_args(argv)
    warnings.simplefilter("ignore")
    from tflite_taichi import Interpreter
    rows = []
    it = _resized(Interpreter(model_path=a.model, backend=a.backend, precision=a.precision), a.batch)
    rows.append((f"tflite_taichi {a.backend}/{a.precision}",) + _time(it, a.runs))
    if a.litert_threads:
        try:
            from ai_edge_litert.interpreter import Interpreter as LiteRT
            lite = _resized(LiteRT(model_path=a.model, num_threads=a.litert_threads), a.batch)
            rows.append((f"LiteRT XNNPACK {a.litert_threads} threads",) + _time(lite, a.runs))
        except ImportError:
            rows.append(("LiteRT (not installed)", float("nan"), float("nan"), float("nan")))
    if a.torch:
        if importlib.util.find_spec("torch") is None:
            rows.append(("PyTorch (not installed)", float("nan"), float("nan"), float("nan")))
        else:
            device, times = _time_torch(a.model, a.batch, a.runs)
            rows.append((f"PyTorch eager {device}",) + times)
    print(f"{a.model} batch {a.batch}:")
    for name, med, p10, p90 in rows:
        print(f"  {name:<34} median {1e3 * med:8.2f} ms (p10 {1e3 * p10:.2f}, p90 {1e3 * p90:.2f})"
              f"  {a.batch / med:8.0f} images/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
