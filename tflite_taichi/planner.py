"""Memory plan of one partition: where every tensor it touches lives.

- inputs and outputs of the partition live in the `io` buffer, the only one copied between
  host and device at each invoke; it is float32 even with precision='fp16', so a model's
  outputs keep their float32 range (a sigmoid's 1e-9 is 0 in float16);
- intermediates live in the `arena`, at offsets reused once a tensor's last reader has run
  (first-fit over lifetime intervals, in steps);
- constants live in the `weights` buffer, dequantized to float once at prepare.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from tflite_taichi.graph import PreparedGraph
from tflite_taichi.ops.tiutil import ARENA, IO, WEIGHTS, TensorRef, ti
from tflite_taichi.partition import Partition
from tflite_taichi.quant import is_float_view, quantized_range


@dataclass
class Plan:
    arena_size: int
    io_size: int
    weights: np.ndarray                      # host copy of the weights buffer (float32)
    refs: dict                               # tensor index -> TensorRef
    io_inputs: list = field(default_factory=list)    # (tensor, offset, shape)
    io_outputs: list = field(default_factory=list)


def _quant_of(spec):
    """(scale, zp, qmin, qmax) when the op writing this tensor must snap it to its grid."""
    if not is_float_view(spec.dtype, spec.quantization):
        return None
    q = spec.quantization
    lo, hi = quantized_range(spec.dtype)
    return (float(q.scale[0]), float(q.zero_point[0]), lo, hi)


def _numel(shape) -> int:
    return int(np.prod(shape, dtype=np.int64))


def plan_partition(p: Partition, graph: PreparedGraph, fp16: bool = False) -> Plan:
    specs = graph.specs
    refs = {}
    storage = ti.f16 if fp16 else ti.f32

    # weights: every float constant an op of the partition reads
    chunks, offset = [], 0
    for t in p.constants:
        value = np.asarray(specs[t].value, dtype=np.float32).reshape(-1)
        refs[t] = TensorRef(WEIGHTS, offset, specs[t].shape, storage=storage)
        chunks.append(value)
        offset += value.size
    weights = np.concatenate(chunks) if chunks else np.zeros(1, np.float32)

    # io: partition inputs, then outputs
    io_off, io_inputs, io_outputs = 0, [], []
    for t in p.inputs:
        refs[t] = TensorRef(IO, io_off, specs[t].shape)
        io_inputs.append((t, io_off, specs[t].shape))
        io_off += _numel(specs[t].shape)
    for t in p.outputs:
        refs[t] = TensorRef(IO, io_off, specs[t].shape, _quant_of(specs[t]))
        io_outputs.append((t, io_off, specs[t].shape))
        io_off += _numel(specs[t].shape)

    # arena: intermediates, offsets reused by lifetime
    born, last_read = {}, {}
    for i, step in enumerate(p.steps):
        for t in step.op.inputs:
            if t in born:
                last_read[t] = i
        for t in step.op.outputs:
            if t not in refs:
                born[t] = i
    placed = []                                   # (start, end, offset, size)
    arena_size = 0
    for t, start in born.items():
        end = last_read.get(t, start)             # an unread output still needs its slot while written
        size = max(_numel(specs[t].shape), 1)
        busy = sorted((o, o + s) for (b, e, o, s) in placed if not (e < start or b > end))
        at = 0
        for lo, hi in busy:
            if at + size <= lo:
                break
            at = max(at, hi)
        placed.append((start, end, at, size))
        arena_size = max(arena_size, at + size)
        refs[t] = TensorRef(ARENA, at, specs[t].shape, _quant_of(specs[t]), storage)
    return Plan(arena_size=max(arena_size, 1), io_size=max(io_off, 1), weights=weights,
                refs=refs, io_inputs=io_inputs, io_outputs=io_outputs)
