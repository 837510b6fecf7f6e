"""Memory plan of one partition: where every tensor it touches lives.

- the partition's inputs and outputs live in the program's `io` buffer (float32 even with
  precision='fp16', so a model's outputs keep their float32 range: a sigmoid's 1e-9 is 0 in
  float16), at offsets the program fixes for the whole subgraph (program_builder.io_layout): a tensor
  one partition writes and another reads stays there, on the device, and the host reaches it
  through the program's host link. Every kernel of a chunked partition sees the whole io
  buffer (buffers are bound once, not copied with each launch). The resource variables its
  ops read or assign live in io too, each in a slot of its own that nothing else writes
  (partition.VariableSlot), addressed through the ops' handle tensors;
- intermediates live in the `arena`, at offsets reused once a tensor's last reader has run
  (first-fit over lifetime intervals, in steps); partial sums of split reductions in a float32
  `scratch` buffer (OpDef.scratch). Partitions run one after another, so the program gives them
  one arena and one scratch buffer, each the size of the largest partition's;
- constants live in the partition's `weights` buffer, dequantized once at prepare and, where
  the op's Taichi part asks for it (`OpDef.pack`), laid out for the kernel that reads them.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from tflite_taichi.graph import PreparedGraph
from tflite_taichi.ops.kit import ARENA, IO_IN, IO_OUT, SCRATCH, WEIGHTS, TensorRef
from tflite_taichi.partition import Partition
from tflite_taichi.quant import is_float_view, quantized_range


@dataclass
class Plan:
    arena_size: int
    io_size: int                             # float32 elements of io the partition addresses
    weights: np.ndarray                      # host copy of the weights buffer (float32)
    refs: dict                               # tensor index -> TensorRef (as its ops read/write it)
    packed: dict = field(default_factory=dict)       # (op index, input position) -> TensorRef
    io_offsets: dict = field(default_factory=dict)   # tensor -> offset in io (inputs, outputs)
    scratch: dict = field(default_factory=dict)      # op index -> scratch TensorRef (OpDef.scratch)
    scratch_size: int = 1                            # float32 elements: the largest op's need

    def digest_parts(self) -> tuple:
        """What the generated kernels bake in as constants: sizes and every tensor's place."""
        def place(ref):
            return (getattr(ref, "buffer", None), getattr(ref, "offset", None),
                    getattr(ref, "shape", None), getattr(ref, "quant", None),
                    getattr(ref, "codes", False))
        return (self.arena_size, self.io_size, int(self.weights.size), self.scratch_size,
                sorted((t, place(r)) for t, r in self.refs.items()),
                sorted((k, place(r)) for k, r in self.packed.items()),
                sorted((k, place(r)) for k, r in self.scratch.items()))


def _quant_of(spec):
    """(scale, zp, qmin, qmax) when the op writing this tensor must snap it to its grid."""
    if not is_float_view(spec.dtype, spec.quantization):
        return None
    q = spec.quantization
    lo, hi = quantized_range(spec.dtype)
    return (float(q.scale[0]), float(q.zero_point[0]), lo, hi)


def _keeps_grid(step) -> bool:
    """An op moving values (Fusion.moves_values) whose data inputs (those of its outputs'
    dtype) are quantized exactly as every output, per tensor: each stored value is a point of
    the output's grid already, so its store need not snap it (4-10 float operations an element:
    most of a streaming model's slices and concatenations on the CPU)."""
    if getattr(step.node.options, "fused_activation_function", 0):   # a clamp: RELU6's 6 may
        return False                                                  # fall between grid points
    outs = [s for s in step.node.outputs if s is not None]
    if not outs or any(s.quantization is None or s.quantization.per_channel for s in outs):
        return False
    grid = (outs[0].dtype, float(outs[0].quantization.scale[0]), float(outs[0].quantization.zero_point[0]))

    def grid_of(s):
        q = s.quantization
        if q is None or q.per_channel:
            return None
        return (s.dtype, float(q.scale[0]), float(q.zero_point[0]))
    if any(grid_of(s) != grid for s in outs):
        return False
    data = [s for s in step.node.inputs if s is not None and s.dtype == outs[0].dtype]
    return bool(data) and all(grid_of(s) == grid for s in data)


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


def local_io_layout(p: Partition, graph: PreparedGraph) -> dict:
    """io offsets of a partition on its own (inputs, then outputs): for a plan outside a program."""
    offsets, at = {}, 0
    for t in list(p.inputs) + [t for t in p.outputs if t not in p.inputs]:
        offsets[t] = at
        at += _numel(graph.specs[t].shape)
    slots = {}
    for t, slot in p.variables.items():
        if slot.key not in slots:
            slots[slot.key] = at
            at += slot.count
        offsets[t] = slots[slot.key]
    return offsets


def plan_partition(p: Partition, graph: PreparedGraph, fp16: bool = False, io_offsets=None,
                   early_writes=None, virtual=(), aliases=None, late_reads=(), io_codes=()) -> Plan:
    """`io_offsets`: tensor -> its offset in the program's io buffer, for every input and
    output of the partition (default: a layout of this partition alone).
    `early_writes`: tensor -> the step that really writes it when earlier than its op (an op
    fused into its producer's store: codegen.epilogue_fusions).
    `virtual`: tensors handed from a store to a fused op, never in memory (no place).
    `aliases`: tensor -> the tensor whose memory it addresses (a reshape: codegen.aliases);
    the source then lives until the alias's last reader.
    `late_reads`: (tensor, step) pairs of reads at a later step than the reading op's own (an
    op computed at its reader's loads: codegen.load_fusions).
    `io_codes`: io tensors held as their integer codes (program_builder.io_layout: the model's quantized
    inputs and outputs that only the device and the host's casts see; TensorRef.codes)."""
    specs = graph.specs
    storage = "f16" if fp16 else "f32"
    io_offsets = io_offsets if io_offsets is not None else local_io_layout(p, graph)
    weights, refs, packed = _pack_weights(p, graph, storage)
    aliases = aliases or {}

    def root(t):
        while t in aliases:
            t = aliases[t]
        return t

    readers, producer = {}, {}
    for i, step in enumerate(p.steps):
        for t in step.op.inputs:
            readers.setdefault(root(t), []).append(i)
        for t in step.op.outputs:
            if t not in aliases:
                producer[t] = i
    for t, i in late_reads:
        readers.setdefault(root(t), []).append(i)
    for t, i in (early_writes or {}).items():
        producer[t] = min(producer[t], i)

    arena, io_end, used = _Arena(), 0, {}
    for t in p.inputs:
        shape = specs[t].shape
        refs[t] = (TensorRef(IO_IN, io_offsets[t], shape, _quant_of(specs[t]), codes=True)
                   if t in io_codes else TensorRef(IO_IN, io_offsets[t], shape))
        used[t] = io_offsets[t]
        io_end = max(io_end, io_offsets[t] + _numel(shape))
    for t, slot in p.variables.items():        # a variable's slot: its ops' Taichi parts copy
        refs[t] = TensorRef(IO_OUT, io_offsets[t], slot.shape)   # from and to it (ops/state.py)
        io_end = max(io_end, io_offsets[t] + slot.count)
    outputs = set(p.outputs)
    for t in p.outputs:
        shape = specs[t].shape
        refs[t] = TensorRef(IO_OUT, io_offsets[t], shape, _quant_of(specs[t]),
                            codes=t in io_codes)
        used[t] = io_offsets[t]
        io_end = max(io_end, io_offsets[t] + _numel(shape))

    for t, born in producer.items():               # intermediates, offsets reused by lifetime
        if t in outputs:
            continue
        if t in virtual:                            # its shape and grid only (EpilogueRef)
            refs[t] = TensorRef(ARENA, 0, specs[t].shape, _quant_of(specs[t]), storage)
            continue
        end = max(readers.get(t, [born]))           # an unread output still needs its slot while written
        at = arena.place(born, end, _numel(specs[t].shape))
        refs[t] = TensorRef(ARENA, at, specs[t].shape, _quant_of(specs[t]), storage)
    for step in p.steps:                            # values already on the output's grid
        if step.opdef.fusion.moves_values and _keeps_grid(step):
            for t in step.op.outputs:
                ref = refs.get(t)
                if ref is not None and ref.quant is not None and not ref.codes:
                    refs[t] = TensorRef(ref.buffer, ref.offset, ref.shape, None, ref.storage)
    for t in aliases:                               # the source's place, the alias's shape
        src = refs[root(t)]
        refs[t] = TensorRef(src.buffer, src.offset, specs[t].shape, src.quant, src.storage,
                            src.codes)
    scratch, scratch_size = {}, 1
    for step in p.steps:             # scratch lives while its op runs: every op's starts at 0
        size = step.opdef.scratch(step.node) if step.opdef.scratch is not None else 0
        if size:
            scratch[step.op.index] = TensorRef(SCRATCH, 0, (size,))
            scratch_size = max(scratch_size, size)
    return Plan(arena_size=max(arena.size, 1), io_size=max(io_end, 1), weights=weights, refs=refs,
                packed=packed, io_offsets=used, scratch=scratch, scratch_size=scratch_size)
