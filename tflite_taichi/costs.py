"""What a partition costs on a GPU backend against the numpy path, for backend='auto': a
partition the CPU runs faster stays on the CPU, and summary() says why.

An invoke that runs a partition pays the backend's fixed cost (launch, the host link's copies,
the wait: Vulkan's wait alone is ~0.56 ms) and a cost per further task; the numpy path pays a
fixed cost per op plus its memory traffic and multiply-adds. For a small serial model (an LSTM
classifier's head, a tiny MLP) the GPU's fixed cost is the whole story, and numpy wins.

The constants are `bench/cost_constants.py`'s medians on the H200 machine
(bench/results/cost_constants_h200.md): its host for numpy, its GPU per backend. They are
estimates for deciding, not predictions: the numpy side counts an op's elements and, for ops
with a weight tensor, out_elements x (weight elements / output channels) multiply-adds, which
overestimates depthwise and pooling work (so big spatial partitions stay on the GPU).
"""
from __future__ import annotations

import numpy as np

# numpy (the reference path): us per op (an MLP's FULLY_CONNECTED/SOFTMAX: (58.0 - 13.4) / 3, the
# heavier per-op figure, so that in doubt work stays on the GPU; the H200 run's "chain of ADDs",
# 1.4 us per op, timed the MLP again: a bug in bench/cost_constants.py since fixed; on the 2-core
# machine a real 32-ADD chain costs 2.8 us per op, below 15 either way),
# ns per element touched (a 64K ADD), ns per multiply-add (the slower of a 3x3 conv of 16
# channels and a GEMM-shaped FC: 0.16)
NUMPY = {"op_us": 15.0, "ns_per_element": 0.21, "ns_per_mac": 0.16}
# per backend: (us for an invoke with one task, us per further task): a one-op model's invoke and
# the slope of a chain of 32 pools
GPU = {"cuda": (84.0, 5.9), "vulkan": (786.0, 4.7), "opengl": (96.0, 21.9)}
GPU["gles"] = GPU["opengl"]
GPU["metal"] = GPU["vulkan"]             # not measured (no Mac): Vulkan's as a stand-in


def _elements(spec) -> int:
    return int(np.prod(spec.shape, dtype=np.int64)) if spec is not None else 0


def numpy_us(steps) -> float:
    """Estimated microseconds of these steps on the numpy path."""
    return NUMPY["op_us"] * len(steps) + work_us(steps)


def work_us(steps) -> float:
    """Estimated microseconds of these steps' arithmetic and memory traffic on one core (the
    numpy estimate without its per-op Python cost)."""
    total = 0.0
    for st in steps:
        out = sum(_elements(s) for s in st.node.outputs)
        touched = out + sum(_elements(s) for s in st.node.inputs if s is not None and s.value is None)
        macs = sum(out * (_elements(s) // int(s.shape[0])) for s in st.node.inputs
                   if s is not None and s.value is not None and len(s.shape) >= 2 and s.shape[0])
        total += 1e-3 * (NUMPY["ns_per_element"] * touched + NUMPY["ns_per_mac"] * macs)
    return total


# Taichi's CPU backends hand every top-level loop to their thread pool and wait for it; a
# partition whose whole work is below this runs each loop serially in the caller's thread
# instead (bench/results/cpu_taichi_2core.md)
SERIAL_BELOW_US = 50.0


def cpu_loop_threads(steps, budget: int) -> int:
    """Threads for each top-level loop of a `cpu` backend partition of these steps: 1 (a serial
    task, no thread-pool dispatch) where the work is small, else the thread budget."""
    return 1 if budget <= 1 or work_us(steps) < SERIAL_BELOW_US else budget


# backend='auto' without a GPU keeps an op that declares `numpy_faster_on_cpu` on numpy only
# where its work is at least this: below it, numpy's per-op cost (NUMPY["op_us"]) and the
# crossing between the paths outweigh what BLAS saves (bench/results/cpu_taichi_2core.md)
NUMPY_CPU_ABOVE_US = 20.0


def numpy_wins_on_cpu(step) -> bool:
    return work_us([step]) >= NUMPY_CPU_ABOVE_US


# A subgraph that IF/WHILE call (executor.DelegatedCall) pays more per call than a main graph's
# invoke: the general schedule walk, a put after each CPU step feeding the partition, a take of
# every output, on every call. Measured on the H200 with the converted Keras loops
# (bench/results/cpu_taichi_h200.md, run 6): a WHILE condition's one-op partition cost ~240 us a
# call on cuda (explicit cuda minus auto, over 7 calls), against GPU["cuda"]'s 84 for an invoke.
CALL_EXTRA_US = 156.0


def gpu_us(steps, backend: str, called: bool = False) -> float:
    """Estimated microseconds of an invoke running these steps as one partition on `backend`
    (one task per step: fusion only lowers it); `called`: as a called subgraph, per call."""
    fixed, per_task = GPU.get(backend, GPU["vulkan"])
    return fixed + per_task * max(len(steps) - 1, 0) + (CALL_EXTRA_US if called else 0.0)


def cpu_is_faster(steps, backend: str, called: bool = False):
    """(numpy us, backend us) when numpy's estimate is below the backend's, else None."""
    cpu, gpu = numpy_us(steps), gpu_us(steps, backend, called)
    return (cpu, gpu) if cpu < gpu else None
