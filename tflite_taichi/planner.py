"""Memory plan of one partition: where every tensor it touches lives.

- inputs of the partition live in `io_in` and outputs in `io_out`: host float32 arrays handed
  to the kernels as arguments (float32 even with precision='fp16', so a model's outputs keep
  their float32 range: a sigmoid's 1e-9 is 0 in float16). Only the first kernel of a chunked
  partition receives io_in and only the last io_out, so an input read by a later chunk is first
  staged into the arena, and an output written by an earlier chunk is staged out of it;
- intermediates live in the `arena`, at offsets reused once a tensor's last reader has run
  (first-fit over lifetime intervals, in steps); partial sums of split reductions in a float32
  `scratch` buffer (OpDef.scratch);
- constants live in the `weights` buffer, dequantized once at prepare and, where the op's
  Taichi part asks for it (`OpDef.pack`), laid out for the kernel that reads them.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from tflite_taichi.graph import PreparedGraph
from tflite_taichi.ops.tiutil import ARENA, IO_IN, IO_OUT, SCRATCH, WEIGHTS, TensorRef, ti
from tflite_taichi.partition import Partition
from tflite_taichi.quant import is_float_view, quantized_range


@dataclass
class Plan:
    arena_size: int
    io_in_size: int
    io_out_size: int
    weights: np.ndarray                      # host copy of the weights buffer (float32)
    refs: dict                               # tensor index -> TensorRef (as its ops read/write it)
    packed: dict = field(default_factory=dict)       # (op index, input position) -> TensorRef
    io_inputs: list = field(default_factory=list)    # (tensor, offset, shape) in io_in
    io_outputs: list = field(default_factory=list)   # (tensor, offset, shape) in io_out
    stage_in: list = field(default_factory=list)     # (io_in ref, arena ref): first kernel copies
    stage_out: list = field(default_factory=list)    # (arena ref, io_out ref): last kernel copies
    scratch: dict = field(default_factory=dict)      # op index -> scratch TensorRef (OpDef.scratch)
    scratch_size: int = 1                            # float32 elements: the largest op's need


def _quant_of(spec):
    """(scale, zp, qmin, qmax) when the op writing this tensor must snap it to its grid."""
    if not is_float_view(spec.dtype, spec.quantization):
        return None
    q = spec.quantization
    lo, hi = quantized_range(spec.dtype)
    return (float(q.scale[0]), float(q.zero_point[0]), lo, hi)


def _numel(shape) -> int:
    return int(np.prod(shape, dtype=np.int64))


class _Arena:
    """First-fit placement of [start, end] step intervals."""

    def __init__(self):
        self.placed = []              # (start, end, offset, size)
        self.size = 0

    def place(self, start: int, end: int, size: int) -> int:
        size = max(size, 1)
        busy = sorted((o, o + n) for (b, e, o, n) in self.placed if not (e < start or b > end))
        at = 0
        for lo, hi in busy:
            if at + size <= lo:
                break
            at = max(at, hi)
        self.placed.append((start, end, at, size))
        self.size = max(self.size, at + size)
        return at


def _pack_weights(p: Partition, graph: PreparedGraph, storage):
    """Weights buffer and refs: each constant once as stored, plus a per-op copy where the op's
    `pack` lays it out for its kernel (e.g. a conv filter with output channels innermost)."""
    specs = graph.specs
    chunks, offset, refs, packed = [], 0, {}, {}

    def add(value, shape):
        nonlocal offset
        ref = TensorRef(WEIGHTS, offset, shape, storage=storage)
        chunks.append(value.reshape(-1))
        offset += value.size
        return ref

    for step in p.steps:
        pack = step.opdef.pack
        for i, t in enumerate(step.op.inputs):
            if t == -1 or t not in p.constants:
                continue
            value = np.asarray(specs[t].value, dtype=np.float32)
            laid_out = pack(step.node, i, value) if pack is not None else None
            if laid_out is not None:
                laid_out = np.ascontiguousarray(laid_out, dtype=np.float32)
                packed[(step.op.index, i)] = add(laid_out, laid_out.shape)
            elif t not in refs:
                refs[t] = add(value, specs[t].shape)
    weights = np.concatenate(chunks) if chunks else np.zeros(1, np.float32)
    return weights, refs, packed


def plan_partition(p: Partition, graph: PreparedGraph, fp16: bool = False, chunks=None,
                   early_writes=None) -> Plan:
    """`chunks`: (start, end) step ranges, one per kernel (default: one kernel).
    `early_writes`: tensor -> the step that really writes it when earlier than its op (an ADD
    fused into its producer's store: codegen.residual_fusions)."""
    specs = graph.specs
    storage = ti.f16 if fp16 else ti.f32
    n = len(p.steps)
    chunks = chunks or [(0, n)]
    first_end, last_start = chunks[0][1], chunks[-1][0]
    weights, refs, packed = _pack_weights(p, graph, storage)

    readers, producer = {}, {}
    for i, step in enumerate(p.steps):
        for t in step.op.inputs:
            readers.setdefault(t, []).append(i)
        for t in step.op.outputs:
            producer[t] = i
    for t, i in (early_writes or {}).items():
        producer[t] = min(producer[t], i)

    arena, io_inputs, io_outputs, stage_in, stage_out = _Arena(), [], [], [], []
    in_off = 0
    for t in p.inputs:
        shape = specs[t].shape
        direct = TensorRef(IO_IN, in_off, shape)
        io_inputs.append((t, in_off, shape))
        in_off += _numel(shape)
        if max(readers.get(t, [0])) < first_end:
            refs[t] = direct                       # every reader is in the first kernel
        else:
            at = arena.place(-1, max(readers[t]), _numel(shape))
            refs[t] = TensorRef(ARENA, at, shape, storage=storage)
            stage_in.append((direct, refs[t]))

    out_off, outputs = 0, set(p.outputs)
    for t in p.outputs:
        shape = specs[t].shape
        io_outputs.append((t, out_off, shape))
        direct = TensorRef(IO_OUT, out_off, shape, _quant_of(specs[t]))
        if producer[t] >= last_start:
            refs[t] = direct                       # written by the last kernel: straight to io_out
        else:
            at = arena.place(producer[t], n, _numel(shape))
            refs[t] = TensorRef(ARENA, at, shape, _quant_of(specs[t]), storage)
            stage_out.append((refs[t], TensorRef(IO_OUT, out_off, shape)))
        out_off += _numel(shape)

    for t, born in producer.items():               # intermediates, offsets reused by lifetime
        if t in outputs:
            continue
        end = max(readers.get(t, [born]))           # an unread output still needs its slot while written
        at = arena.place(born, end, _numel(specs[t].shape))
        refs[t] = TensorRef(ARENA, at, specs[t].shape, _quant_of(specs[t]), storage)
    scratch, scratch_size = {}, 1
    for step in p.steps:             # scratch lives while its op runs: every op's starts at 0
        size = step.opdef.scratch(step.node) if step.opdef.scratch is not None else 0
        if size:
            scratch[step.op.index] = TensorRef(SCRATCH, 0, (size,))
            scratch_size = max(scratch_size, size)
    return Plan(arena_size=max(arena.size, 1), io_in_size=max(in_off, 1), io_out_size=max(out_off, 1),
                weights=weights, refs=refs, packed=packed, io_inputs=io_inputs,
                io_outputs=io_outputs, stage_in=stage_in, stage_out=stage_out, scratch=scratch,
                scratch_size=scratch_size)
