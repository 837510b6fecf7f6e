"""Indexing and ordering: GATHER, GATHER_ND, ONE_HOT, ARG_MAX, ARG_MIN, TOPK_V2, WHERE, CUMSUM.

Semantics are LiteRT's (tflite/kernels/*.cc):
- GATHER (axis, batch_dims): out = params.shape[:axis] + indices.shape[batch_dims:] +
  params.shape[axis+1:]; the first batch_dims dimensions of params and indices are shared.
  Indices must lie in [0, params.shape[axis]): no negative indices (LiteRT refuses them at
  invoke). GATHER_ND: out = indices.shape[:-1] + params.shape[indices.shape[-1]:], each index
  row within params' dimensions. An out-of-range index is a ModelError at prepare when the
  indices are constant, an InputError naming the op at invoke otherwise (LiteRT: "gather index
  out of bounds"); never an IndexError.
- ONE_HOT (axis, -1 = last): depth inserted at `axis`; an index outside [0, depth) (negative
  too) gives a row of off_value.
- ARG_MAX / ARG_MIN: ties give the first index (LiteRT's strict comparison); the output type
  is the output tensor's (int32/int64; output_type must agree when set). NaN inputs are
  undefined: LiteRT's answer depends on the row length; ours is numpy's (the first NaN).
- TOPK_V2: the k largest along the last axis, in decreasing order, ties by lower index first.
- WHERE: the coordinates of the true (non-zero) elements, int64 [num_true, rank], row-major.
- CUMSUM (exclusive, reverse): a sequential sum along the axis (a constant, or a run-time
  input on the CPU path), in the input's type (int32 wraps). LiteRT has no quantized CUMSUM; here an int8 one sums the real values and
  snaps each to the output's grid, as every float-view op does.

Shapes that depend on values: this runtime fixes every shape at allocate_tensors (`infer`), so
the inputs that decide an output shape must be known then (constants, or folded from
constants): ONE_HOT's depth, ARG_MAX/ARG_MIN's axis, TOPK_V2's k, and WHERE's whole condition
(its output has one row per true element, so WHERE always folds at prepare).

Quantized tensors arrive as real values (the float view): GATHER/GATHER_ND/TOPK_V2 values and
ONE_HOT's on/off values are re-snapped to the output's grid. LiteRT copies the int8 bytes
instead; the two agree when input and output share their quantization, as converters write
them.

Taichi (the delegate): GATHER and GATHER_ND with constant indices, ONE_HOT with constant
indices (on/off values at run time; all-constant folds), CUMSUM on a constant axis. The
delegate carries no int32 tensors and packs only float constants into its weights buffer
(whose fp16 storage could not hold indices above 2048 exactly anyway), so a constant index
table is compiled into the kernel as arithmetic runs `(start, base, step)`: a lookup is at
most MAX_RUNS compare-and-selects, one thread per output element. Tables with more runs stay
on the CPU (`supports`). CUMSUM: one thread per line walking the axis; with few
lines and a long axis the line is cut into chunks (chunk sums in scratch, then every chunk
scans from the sum of those before it).
(No `from __future__ import annotations` here: Taichi reads the ti.func annotations.)
"""
import math
from dataclasses import dataclass

import numpy as np

from .base import DataDependentShape, Fusion, OpDef, register_op
from .common import check_range, invoke_error
from .kit import split_count, ti
from .tables import RunTable, arithmetic_runs, runs_reason

# tflite.TensorType codes an output_type may name.
_FLOAT32, _INT32, _INT64 = 0, 2, 4
_INDEX_DTYPES = {np.dtype(np.int16), np.dtype(np.int32), np.dtype(np.int64)}


def _ints(value) -> list:
    return [int(v) for v in np.asarray(value).reshape(-1).tolist()]


def _dtype(spec) -> np.dtype:
    return np.dtype(spec.dtype)


def _check_index_tensor(node, i: int, what: str, dtypes=_INDEX_DTYPES):
    spec = node.inputs[i] if i < len(node.inputs) else None
    if spec is None:
        raise node.fail(f"{what} (input {i}) is missing")
    if _dtype(spec) not in dtypes or spec.is_quantized:
        names = "/".join(sorted(d.name for d in dtypes))
        raise node.fail(f"{what} must be a {names} tensor, got {_dtype(spec).name}")
    return spec


def _scalar_input(node, i: int, what: str, dtypes=_INDEX_DTYPES) -> int:
    """A constant integer input holding exactly one value (LiteRT: NumElements == 1)."""
    _check_index_tensor(node, i, what, dtypes)
    values = _ints(node.input_value(i, what))
    if len(values) != 1:
        raise node.fail(f"{what} must hold one value, has {len(values)}")
    return values[0]


def _axis(node, axis: int, rank: int, what: str = "axis") -> int:
    if not -rank <= axis < rank:
        raise node.fail(f"{what} {axis} is out of range for rank {rank} "
                        f"(valid: {-rank}..{rank - 1})")
    return axis % rank


# -- GATHER -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class GatherOptions:
    axis: int = 0
    batch_dims: int = 0


def _parse_gather(opts) -> GatherOptions:
    return GatherOptions(int(opts.Axis()), int(opts.BatchDims()))


def _gather_dims(node) -> tuple:
    """(axis, batch_dims), non-negative and validated as LiteRT's Prepare does."""
    params, indices = node.inputs[0], _check_index_tensor(node, 1, "the indices")
    rank, irank = params.rank, indices.rank
    if rank == 0:
        raise node.fail("params must have at least one dimension")
    axis = _axis(node, node.options.axis, rank)
    batch_dims = node.options.batch_dims
    if batch_dims < 0:
        batch_dims += irank
    if not 0 <= batch_dims <= irank:
        raise node.fail(f"batch_dims {node.options.batch_dims} is out of range for indices of "
                        f"rank {irank}")
    if batch_dims > axis:
        raise node.fail(f"batch_dims {batch_dims} must not exceed the axis {axis}")
    for d in range(batch_dims):
        if params.shape[d] != indices.shape[d]:
            raise node.fail(f"batch dimension {d} differs: params {list(params.shape)}, "
                            f"indices {list(indices.shape)}")
    return axis, batch_dims


def _gather_sizes(params_shape, indices_shape, axis, batch_dims) -> tuple:
    """(B, O, A, I, K): batch, outer, axis, inner sizes of params; indices per batch."""
    def prod(s):
        return int(np.prod(s, dtype=np.int64))
    return (prod(params_shape[:batch_dims]), prod(params_shape[batch_dims:axis]),
            int(params_shape[axis]), prod(params_shape[axis + 1:]),
            prod(indices_shape[batch_dims:]))


def _infer_gather(node):
    axis, batch_dims = _gather_dims(node)
    params, indices = node.inputs
    if indices.value is not None:
        check_range(node, indices.value, params.shape[axis], "index", at_prepare=True)
    return [tuple(params.shape[:axis]) + tuple(indices.shape[batch_dims:])
            + tuple(params.shape[axis + 1:])]


def _gather(node, inputs):
    params, indices = np.asarray(inputs[0]), np.asarray(inputs[1]).astype(np.int64)
    axis, batch_dims = _gather_dims(node)
    check_range(node, indices, params.shape[axis], "index", at_prepare=False)
    b, o, a, i, k = _gather_sizes(params.shape, indices.shape, axis, batch_dims)
    p = params.reshape(b, o, a, i)
    t = indices.reshape(b, k)
    out = p[np.arange(b)[:, None], :, t, :]          # (b, k, o, i): advanced indices first
    return [out.transpose(0, 2, 1, 3).reshape(node.outputs[0].shape)]


@ti.data_oriented
class GatherStep:
    """One thread per output element: out[b, o, k, i] = params[b, o, table[b*K + k], i]."""

    def __init__(self, x, out, table, sizes):
        self.x, self.out, self.table = x, out, table
        self.B, self.O, self.A, self.I, self.K = sizes
        self.n = max(out.size, 1)

    @ti.func
    def run(self, arena: ti.template(), weights: ti.template(), io: ti.template()):
        for f in range(self.n):
            i = f % self.I
            t = f // self.I
            k = t % self.K
            t = t // self.K
            o = t % self.O
            b = t // self.O
            src = ((b * self.O + o) * self.A + self.table.at(b * self.K + k)) * self.I + i
            self.out.store(arena, io, f, self.x.load(arena, weights, io, src))


def _gather_ranges(node) -> dict:
    """Indices within the gathered axis (LiteRT also takes -dim..-1 there; made-up inputs keep
    to the non-negative ones)."""
    return {1: (0, node.inputs[0].shape[_gather_dims(node)[0]])}


def _gather_supports(node):
    if node.inputs[1].value is None:
        return "the indices are known only at run time"
    return runs_reason(node.inputs[1].value, "indices")


def _gather_taichi(node, io):
    axis, batch_dims = _gather_dims(node)
    indices = node.input_value(1, "the indices")
    sizes = _gather_sizes(node.inputs[0].shape, node.inputs[1].shape, axis, batch_dims)
    return GatherStep(io.inputs[0], io.outputs[0], RunTable(arithmetic_runs(indices)), sizes)


GATHER = register_op(OpDef(name="GATHER", infer=_infer_gather, reference=_gather,
                           parse=_parse_gather, options_class="GatherOptions",
                           taichi=_gather_taichi, supports=_gather_supports,
                           input_ranges=_gather_ranges, fusion=Fusion(moves_values=True), min_inputs=2,
                           max_inputs=2))


# -- GATHER_ND --------------------------------------------------------------------------------
def _gather_nd_check(node) -> int:
    params, indices = node.inputs[0], _check_index_tensor(node, 1, "the indices")
    if params.rank == 0:
        raise node.fail("params must have at least one dimension")
    if indices.rank == 0:
        raise node.fail("the indices must have at least one dimension")
    m = indices.shape[-1]
    if m == 0:
        raise node.fail("the index rows are empty (indices of shape "
                        f"{list(indices.shape)}); LiteRT refuses them at invoke")
    if m > params.rank:
        raise node.fail(f"index rows of length {m} exceed the params' rank {params.rank}")
    return m


def _gather_nd_range(node, indices, at_prepare: bool):
    m = indices.shape[-1]
    shape = node.inputs[0].shape
    for d in range(m):          # a static count: the index row length
        check_range(node, indices[..., d], shape[d], f"index (dimension {d})", at_prepare)


def _infer_gather_nd(node):
    m = _gather_nd_check(node)
    params, indices = node.inputs
    if indices.value is not None:
        _gather_nd_range(node, np.asarray(indices.value), at_prepare=True)
    return [tuple(indices.shape[:-1]) + tuple(params.shape[m:])]


def _gather_nd(node, inputs):
    params, indices = np.asarray(inputs[0]), np.asarray(inputs[1]).astype(np.int64)
    m = _gather_nd_check(node)
    _gather_nd_range(node, indices, at_prepare=False)
    return [params[tuple(indices[..., d] for d in range(m))].reshape(node.outputs[0].shape)]


def _gather_nd_offsets(node) -> np.ndarray:
    """The flat params offset of each index row (constant indices)."""
    indices = np.asarray(node.input_value(1, "the indices"), dtype=np.int64)
    shape = node.inputs[0].shape
    strides = np.cumprod((1,) + tuple(shape[::-1]), dtype=np.int64)[::-1][1:]
    m = indices.shape[-1]
    return (indices.reshape(-1, m) * strides[:m]).sum(axis=1)


@ti.data_oriented
class GatherNdStep:
    """One thread per output element: out[r, s] = params[offset[r] + s]."""

    def __init__(self, x, out, table, slice_size):
        self.x, self.out, self.table, self.S = x, out, table, int(slice_size)
        self.n = max(out.size, 1)

    @ti.func
    def run(self, arena: ti.template(), weights: ti.template(), io: ti.template()):
        for f in range(self.n):
            src = self.table.at(f // self.S) + f % self.S
            self.out.store(arena, io, f, self.x.load(arena, weights, io, src))


def _gather_nd_supports(node):
    if node.inputs[1].value is None:
        return "the indices are known only at run time"
    return runs_reason(_gather_nd_offsets(node), "indices")


def _gather_nd_taichi(node, io):
    m = _gather_nd_check(node)
    slice_size = int(np.prod(node.inputs[0].shape[m:], dtype=np.int64))
    return GatherNdStep(io.inputs[0], io.outputs[0],
                        RunTable(arithmetic_runs(_gather_nd_offsets(node))), slice_size)


GATHER_ND = register_op(OpDef(name="GATHER_ND", infer=_infer_gather_nd, reference=_gather_nd,
                              taichi=_gather_nd_taichi, supports=_gather_nd_supports,
                              min_inputs=2, max_inputs=2))


# -- ONE_HOT ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class OneHotOptions:
    axis: int = -1


def _parse_one_hot(opts) -> OneHotOptions:
    return OneHotOptions(int(opts.Axis()))


def _one_hot_dims(node) -> tuple:
    """(axis, depth), validated."""
    indices = _check_index_tensor(node, 0, "the indices",
                                  {np.dtype(np.int32), np.dtype(np.int64)})
    depth = _scalar_input(node, 1, "the depth", {np.dtype(np.int32)})
    if depth < 0:
        raise node.fail(f"the depth must be >= 0, got {depth}")
    rank = indices.rank
    axis = node.options.axis
    if not -1 <= axis <= rank:
        raise node.fail(f"axis {axis} is out of range for indices of rank {rank} "
                        f"(valid: -1..{rank})")
    axis = rank if axis == -1 else axis
    out = node.outputs[0]
    for i, what in ((2, "on_value"), (3, "off_value")):
        spec = node.inputs[i]
        if spec is None:
            raise node.fail(f"{what} (input {i}) is missing")
        if int(np.prod(spec.shape, dtype=np.int64)) != 1:
            raise node.fail(f"{what} must hold one value, has shape {list(spec.shape)}")
        if _dtype(spec) != _dtype(out):
            raise node.fail(f"{what} is {_dtype(spec).name}, the output is {_dtype(out).name}")
    return axis, depth


def _infer_one_hot(node):
    axis, depth = _one_hot_dims(node)
    shape = tuple(node.inputs[0].shape)
    return [shape[:axis] + (depth,) + shape[axis:]]


def _one_hot(node, inputs):
    axis, depth = _one_hot_dims(node)
    indices = np.expand_dims(np.asarray(inputs[0]), axis)
    positions = np.arange(depth).reshape((depth,) + (1,) * (indices.ndim - axis - 1))
    on, off = (np.asarray(v).reshape(()) for v in inputs[2:4])
    return [np.where(indices == positions, on, off)]


@ti.data_oriented
class OneHotStep:
    """One thread per output element (o, d, i): on if indices[o, i] == d else off."""

    def __init__(self, on, off, out, table, outer, depth, inner):
        self.on, self.off, self.out, self.table = on, off, out, table
        self.D, self.I = int(depth), int(inner)
        self.n = max(out.size, 1)

    @ti.func
    def run(self, arena: ti.template(), weights: ti.template(), io: ti.template()):
        for f in range(self.n):
            i = f % self.I
            t = f // self.I
            d = t % self.D
            o = t // self.D
            v = self.off.load(arena, weights, io, 0)
            if self.table.at(o * self.I + i) == d:
                v = self.on.load(arena, weights, io, 0)
            self.out.store(arena, io, f, v)


def _one_hot_supports(node):
    if node.inputs[0].value is None:
        return "the indices are known only at run time"
    return runs_reason(node.inputs[0].value, "indices")


def _one_hot_taichi(node, io):
    axis, depth = _one_hot_dims(node)
    shape = node.inputs[0].shape
    outer = int(np.prod(shape[:axis], dtype=np.int64))
    inner = int(np.prod(shape[axis:], dtype=np.int64))
    table = RunTable(arithmetic_runs(node.input_value(0, "the indices")))
    return OneHotStep(io.inputs[2], io.inputs[3], io.outputs[0], table, outer, depth, inner)


ONE_HOT = register_op(OpDef(name="ONE_HOT", infer=_infer_one_hot, reference=_one_hot,
                            parse=_parse_one_hot, options_class="OneHotOptions",
                            taichi=_one_hot_taichi, supports=_one_hot_supports,
                            min_inputs=4, max_inputs=4))


# -- ARG_MAX / ARG_MIN ------------------------------------------------------------------------
@dataclass(frozen=True)
class ArgOptions:
    output_type: int = _FLOAT32       # the schema default (absent): the output tensor decides


def _parse_arg(opts) -> ArgOptions:
    return ArgOptions(int(opts.OutputType()))


def _check_output_type(node, out_type: int, spec, what: str = "output_type"):
    wanted = {_INT32: np.dtype(np.int32), _INT64: np.dtype(np.int64)}
    dtype = _dtype(spec)
    if out_type == _FLOAT32:
        if dtype not in wanted.values():
            raise node.fail(f"the output must be int32 or int64, got {dtype.name}")
    elif out_type not in wanted:
        raise node.fail(f"{what} must be INT32 or INT64, got tensor type {out_type}")
    elif wanted[out_type] != dtype:
        raise node.fail(f"{what} {wanted[out_type].name} does not match the output tensor's "
                        f"type {dtype.name}")


def _arg_axis(node) -> int:
    axis = _scalar_input(node, 1, "the axis", {np.dtype(np.int32), np.dtype(np.int64)})
    return _axis(node, axis, node.inputs[0].rank)


def _infer_arg(node):
    _check_output_type(node, node.options.output_type, node.outputs[0])
    axis = _arg_axis(node)
    shape = node.inputs[0].shape
    return [tuple(d for i, d in enumerate(shape) if i != axis)]


def _arg(fn):
    def reference(node, inputs):
        return [fn(np.asarray(inputs[0]), axis=_arg_axis(node))]
    return reference


ARG_MAX = register_op(OpDef(name="ARG_MAX", infer=_infer_arg, reference=_arg(np.argmax),
                            parse=_parse_arg, options_class="ArgMaxOptions",
                            min_inputs=2, max_inputs=2))
ARG_MIN = register_op(OpDef(name="ARG_MIN", infer=_infer_arg, reference=_arg(np.argmin),
                            parse=_parse_arg, options_class="ArgMinOptions",
                            min_inputs=2, max_inputs=2))


# -- TOPK_V2 ----------------------------------------------------------------------------------
def _topk_k(node) -> int:
    x = node.inputs[0]
    if x.rank == 0:
        raise node.fail("the input must have at least one dimension")
    k = _scalar_input(node, 1, "k")
    n = x.shape[-1]
    if not 0 <= k <= n:
        raise node.fail(f"k = {k} is out of range for a last dimension of {n}")
    return k


def _infer_topk(node):
    k = _topk_k(node)
    if len(node.outputs) != 2:
        raise node.fail(f"has {len(node.outputs)} outputs, the op produces 2 (values, indices)")
    if _dtype(node.outputs[1]) not in _INDEX_DTYPES:
        raise node.fail(f"the indices output must be int16/int32/int64, got "
                        f"{_dtype(node.outputs[1]).name}")
    shape = tuple(node.inputs[0].shape[:-1]) + (k,)
    return [shape, shape]


def _topk(node, inputs):
    x = np.asarray(inputs[0])
    k = _topk_k(node)
    n = x.shape[-1]
    # Decreasing values, ties by lower index: a stable ascending sort of the reversed row,
    # reversed back (no negation, so no integer overflow).
    order = n - 1 - np.argsort(x[..., ::-1], axis=-1, kind="stable")[..., ::-1]
    order = order[..., :k]
    return [np.take_along_axis(x, order, axis=-1), order]


TOPK_V2 = register_op(OpDef(name="TOPK_V2", infer=_infer_topk, reference=_topk,
                            min_inputs=2, max_inputs=2))


# -- WHERE ------------------------------------------------------------------------------------
def _where_condition(node) -> np.ndarray:
    """The condition as booleans: non-zero elements are true (raw integers for a quantized
    condition, as LiteRT tests the stored value)."""
    spec = node.inputs[0]
    value = spec.value
    if value is None:       # [number of true elements, rank]: inferred again at each invoke
        raise DataDependentShape(f"WHERE's output shape depends on tensor '{spec.name}'")
    return _truth(spec, value)


def _truth(spec, value) -> np.ndarray:
    value = np.asarray(value)
    if spec.is_quantized:
        q = spec.quantization
        scale, zero = q.broadcastable(value.ndim)
        return np.round(value / scale) + zero != 0
    return value != 0


def _infer_where(node):
    if _dtype(node.outputs[0]) not in (np.dtype(np.int32), np.dtype(np.int64)):
        raise node.fail(f"the output must be int64, got {_dtype(node.outputs[0]).name}")
    if node.inputs[0].rank == 0:
        raise node.fail("the condition must have at least one dimension (as LiteRT requires)")
    cond = _where_condition(node)
    return [(int(np.count_nonzero(cond)), cond.ndim)]


def _where(node, inputs):
    return [np.argwhere(_truth(node.inputs[0], inputs[0]))]


WHERE = register_op(OpDef(name="WHERE", infer=_infer_where, reference=_where,
                          min_inputs=1, max_inputs=1))


# -- CUMSUM -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class CumsumOptions:
    exclusive: bool = False
    reverse: bool = False


def _parse_cumsum(opts) -> CumsumOptions:
    return CumsumOptions(bool(opts.Exclusive()), bool(opts.Reverse()))


def _cumsum_axis_spec(node):
    spec = _check_index_tensor(node, 1, "the axis", {np.dtype(np.int32)})
    if int(np.prod(spec.shape, dtype=np.int64)) != 1:
        raise node.fail(f"the axis must hold one value, has shape {list(spec.shape)}")
    x = node.inputs[0]
    if x.rank == 0:
        raise node.fail("the input must have at least one dimension")
    if not (x.is_quantized or _dtype(x) in (np.dtype(np.float32), np.dtype(np.float16),
                                            np.dtype(np.int32), np.dtype(np.int64))):
        raise node.fail(f"cannot sum a {_dtype(x).name} tensor (float32, int32, int64 or "
                        "quantized)")
    return spec


def _infer_cumsum(node):
    spec = _cumsum_axis_spec(node)
    if spec.value is not None:
        _axis(node, _ints(spec.value)[0], node.inputs[0].rank)
    return [tuple(node.inputs[0].shape)]


def _cumsum(node, inputs):
    _cumsum_axis_spec(node)
    x = np.asarray(inputs[0])
    axis = _ints(inputs[1])[0]
    if not -x.ndim <= axis < x.ndim:
        raise invoke_error(node, f"axis {axis} is out of range for rank {x.ndim}")
    axis %= x.ndim
    if node.options.reverse:
        x = np.flip(x, axis)
    out = np.cumsum(x, axis=axis, dtype=x.dtype)      # sequential, in the input's type
    if node.options.exclusive:
        head = np.zeros_like(np.take(out, [0], axis=axis))
        out = np.concatenate([head, np.delete(out, -1, axis=axis)], axis=axis)
    if node.options.reverse:
        out = np.flip(out, axis)
    return [out]


# Few lines over a long axis: cut each line into chunks of at least CUMSUM_MIN_TERMS and at
# least sqrt(length) elements, so that the second pass (a chunk's start: the sum of the chunk
# totals before it, then its own scan) stays as short as the first.
CUMSUM_MIN_TERMS = 16


def _cumsum_layout(node) -> tuple:
    """(lines, axis length, inner size, splits, chunk) of a constant-axis CUMSUM."""
    shape = node.inputs[0].shape
    axis = _axis(node, _ints(node.input_value(1, "the axis"))[0], len(shape))
    n = int(shape[axis])
    inner = int(np.prod(shape[axis + 1:], dtype=np.int64))
    lines = int(np.prod(shape, dtype=np.int64)) // max(n, 1)
    splits = split_count(lines, n, max(CUMSUM_MIN_TERMS, math.isqrt(n)))
    chunk = -(-n // splits)
    return lines, n, inner, -(-n // chunk), chunk


def _cumsum_scratch(node) -> int:
    if node.inputs[1].value is None:
        return 0
    lines, _, _, splits, _ = _cumsum_layout(node)
    return lines * splits if splits > 1 else 0


@ti.data_oriented
class CumsumStep:
    """Line l = (outer o, inner i); scan position j maps to axis position j (or n-1-j reversed).
    Unsplit: one thread per line. Split: thread (s, l) sums chunk s into scratch, then thread
    (s, l) starts from the chunks before it and scans its own chunk."""

    def __init__(self, x, out, lines, n, inner, splits, chunk, exclusive, reverse, scratch):
        self.x, self.out = x, out
        self.lines, self.n, self.inner = int(lines), int(n), int(inner)
        self.exclusive, self.reverse = bool(exclusive), bool(reverse)
        usable = scratch is not None and splits > 1
        self.splits = int(splits) if usable else 1
        self.chunk = int(chunk) if usable else self.n
        self.scratch = scratch if usable else out

    @ti.func
    def _pos(self, l, j):
        k = j
        if ti.static(self.reverse):
            k = self.n - 1 - j
        return (l // self.inner) * self.n * self.inner + l % self.inner + k * self.inner

    @ti.func
    def _scan(self, arena: ti.template(), weights: ti.template(), io: ti.template(),
              l, lo, hi, start):
        acc = start
        for j in range(lo, hi):
            p = self._pos(l, j)
            v = self.x.load(arena, weights, io, p)
            if ti.static(self.exclusive):
                self.out.store(arena, io, p, acc)
                acc += v
            else:
                acc += v
                self.out.store(arena, io, p, acc)

    @ti.func
    def run(self, arena: ti.template(), weights: ti.template(), io: ti.template()):
        if ti.static(self.splits == 1):
            for l in range(self.lines):
                self._scan(arena, weights, io, l, 0, self.n, 0.0)
        else:
            for s, l in ti.ndrange(self.splits, self.lines):
                lo = s * self.chunk
                acc = 0.0
                for j in range(lo, ti.min(lo + self.chunk, self.n)):
                    acc += self.x.load(arena, weights, io, self._pos(l, j))
                self.scratch.store(arena, io, s * self.lines + l, acc)
            for s, l in ti.ndrange(self.splits, self.lines):
                acc = 0.0
                for t in range(s):
                    acc += self.scratch.load(arena, weights, io, t * self.lines + l)
                lo = s * self.chunk
                self._scan(arena, weights, io, l, lo, ti.min(lo + self.chunk, self.n), acc)


def _cumsum_supports(node):
    if node.inputs[1].value is None:
        return "the axis is known only at run time"
    return None


def _cumsum_taichi(node, io):
    lines, n, inner, splits, chunk = _cumsum_layout(node)
    o = node.options
    return CumsumStep(io.inputs[0], io.outputs[0], lines, n, inner, splits, chunk,
                      o.exclusive, o.reverse, io.scratch)


CUMSUM = register_op(OpDef(name="CUMSUM", infer=_infer_cumsum, reference=_cumsum,
                           parse=_parse_cumsum, options_class="CumsumOptions",
                           taichi=_cumsum_taichi, supports=_cumsum_supports,
                           scratch=_cumsum_scratch, min_inputs=2, max_inputs=2))
