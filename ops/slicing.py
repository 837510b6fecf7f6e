"""Padding, slicing and splitting: PAD, PADV2, SLICE, STRIDED_SLICE, SPLIT, SPLIT_V,
DYNAMIC_UPDATE_SLICE (numpy only: no Taichi part yet).

STRIDED_SLICE follows numpy indexing (TensorFlow's tf.strided_slice): a spec of `len(begin)`
entries, each a slice `begin:end:stride`, an index (shrink_axis_mask), a new axis
(new_axis_mask) or an ellipsis (ellipsis_mask, at most one); dimensions the spec does not reach
are kept whole. Where LiteRT's kernel departs from that (an ellipsis together with a new axis; an
ellipsis that covers no dimension and is not the last entry), numpy defines the result. Where
numpy has no counterpart, LiteRT's rules are taken:
- a shrink entry whose begin_mask bit is set takes the first element (the last one for a
  negative stride);
- `offset` (newer op versions): `end` holds the size of the slice, in elements of the input,
  measured from `begin`; the output size along that axis is ceil(end / stride), and the start is
  clamped so that the slice lies inside the input (as XLA's dynamic_slice does; LiteRT reads out
  of bounds there). With `offset` the begin input may be known only at run time.

SPLIT (axis first, then the input; num_splits equal parts) and SPLIT_V (input, size_splits with
at most one -1, axis) cut the input along one axis.

Taichi: slices and splits are affine gathers (ops/shape.py's `Move`, one parallel loop per
output, one thread per output element); PAD/PADV2 is one loop over the output that reads the
input or takes the pad value. Indices, sizes and paddings are read statically at build time.
(No `from __future__ import annotations` here: Taichi reads the ti.func annotations.)
"""
from dataclasses import dataclass
from typing import Optional

import numpy as np

from .base import Fusion, OpDef, register_op
from .shape import MoveStep, gather_move
from .kit import ti, unravel


def _ints(value) -> list:
    return [int(v) for v in np.asarray(value).reshape(-1).tolist()]


def _index_input(node, i: int, what: str, length: int = None, required: bool = True):
    """A constant integer index tensor (int32/int64) as a list of ints."""
    spec = node.inputs[i] if i < len(node.inputs) else None
    if spec is None:
        raise node.fail(f"{what} (input {i}) is missing")
    if not np.issubdtype(np.dtype(spec.dtype), np.integer) or spec.is_quantized:
        raise node.fail(f"{what} must be an int32 or int64 tensor, got {np.dtype(spec.dtype).name}")
    if len(spec.shape) != 1:
        raise node.fail(f"{what} must be 1-D, has shape {list(spec.shape)}")
    if length is not None and spec.shape[0] != length:
        raise node.fail(f"{what} has {spec.shape[0]} entries, expected {length}")
    if not required and spec.value is None:
        return None
    return _ints(node.input_value(i, what))


# -- PAD / PADV2 ------------------------------------------------------------------------------
def _paddings(node) -> np.ndarray:
    spec = node.inputs[1]
    if spec is None:
        raise node.fail("the paddings (input 1) are missing")
    if not np.issubdtype(np.dtype(spec.dtype), np.integer) or spec.is_quantized:
        raise node.fail(f"the paddings must be an int32 or int64 tensor, got "
                        f"{np.dtype(spec.dtype).name}")
    rank = len(node.inputs[0].shape)
    if tuple(spec.shape) != (rank, 2):
        raise node.fail(f"the paddings must have shape [{rank}, 2] for an input of rank {rank}, "
                        f"have {list(spec.shape)}")
    pads = np.asarray(node.input_value(1, "the paddings"), dtype=np.int64).reshape(rank, 2)
    if (pads < 0).any():
        raise node.fail(f"negative padding in {pads.tolist()}")
    return pads


def _infer_pad(node):
    pads = _paddings(node)
    if len(node.inputs) > 2 and node.inputs[2] is not None:
        value = node.inputs[2]
        if int(np.prod(value.shape, dtype=np.int64)) != 1:
            raise node.fail(f"the constant value must hold one element, has shape "
                            f"{list(value.shape)}")
    return [tuple(int(d + lo + hi) for d, (lo, hi) in zip(node.inputs[0].shape, pads))]


def _pad(node, inputs):
    x = inputs[0]
    pads = _paddings(node)
    value = 0
    if len(inputs) > 2 and inputs[2] is not None:
        value = np.asarray(inputs[2]).reshape(-1)[0]
    # A quantized tensor pads with its zero point, i.e. the real value 0: 0.0 on the float view.
    return [np.pad(x, [tuple(p) for p in pads.tolist()], mode="constant",
                   constant_values=np.asarray(value, dtype=x.dtype))]


@ti.data_oriented
class PadStep:
    """One thread per output element: the input element it covers, or the pad value (a
    constant, or element 0 of `value_ref`: PADV2's value input when it is a run-time or packed
    float tensor)."""

    def __init__(self, x, out, pads, value: float = 0.0, value_ref=None):
        self.x, self.out = x, out
        self.lo = tuple(int(lo) for lo, _ in pads)
        self.padded = tuple(int(lo) > 0 or int(hi) > 0 for lo, hi in pads)
        self.value = float(value)
        self.value_ref = value_ref
        self.has_value_ref = value_ref is not None
        self.loop = out.shape or (1,)
        self.rank = out.rank

    @ti.func
    def _value_at(self, arena: ti.template(), weights: ti.template(), io: ti.template(), I):
        """Output element I (an index vector): the input element it covers, or the pad value."""
        inside = 1
        src = 0
        for d in ti.static(range(self.rank)):
            i = I[d] - self.lo[d]
            if ti.static(self.padded[d]):
                # plain branches: GLSL (OpenGL/GLES) rejects & between comparisons here
                if i < 0:
                    inside = 0
                if i >= self.x.shape[d]:
                    inside = 0
            src += i * self.x.strides[d]
        v = self.value
        if inside != 0:
            v = self.x.load(arena, weights, io, src)
        else:
            if ti.static(self.has_value_ref):
                v = self.value_ref.load(arena, weights, io, 0)
        return v

    @ti.func
    def run(self, arena: ti.template(), weights: ti.template(), io: ti.template()):
        for I in ti.grouped(ti.ndrange(*self.loop)):
            self.out.store(arena, io, self.out.flat_index(I), self._value_at(arena, weights, io, I))

    @ti.func
    def fused_load(self, arena: ti.template(), weights: ti.template(), io: ti.template(), flat):
        """Output element `flat`, as its reader's load asks for it (Fusion.computed_at_load):
        the padding becomes a bounds test in the reader's addressing."""
        return self.out.snap(self._value_at(arena, weights, io, unravel(flat, self.out)))


def _pad_taichi(node, io):
    x, out = io.inputs[0], io.outputs[0]
    pads = _paddings(node).tolist()
    value, value_ref = 0.0, None
    if len(node.inputs) > 2 and node.inputs[2] is not None:
        if io.inputs[2] is not None:
            value_ref = io.inputs[2]
        else:     # a constant the planner does not pack (not a float-view tensor)
            value = float(np.asarray(node.input_value(2, "the constant value")).reshape(-1)[0])
    return PadStep(x, out, pads, value, value_ref)


PAD = register_op(OpDef(name="PAD", infer=_infer_pad, reference=_pad, taichi=_pad_taichi,
                        min_inputs=2, max_inputs=2, fusion=Fusion(computed_at_load=True)))
PADV2 = register_op(OpDef(name="PADV2", infer=_infer_pad, reference=_pad, taichi=_pad_taichi,
                          min_inputs=2, max_inputs=3, fusion=Fusion(computed_at_load=True)))


# -- SLICE ------------------------------------------------------------------------------------
def _slice_window(node) -> list:
    """(begin, size) per dimension, size -1 resolved and everything checked."""
    shape = node.inputs[0].shape
    rank = len(shape)
    begin = _index_input(node, 1, "begin", rank)
    size = _index_input(node, 2, "size", rank)
    window = []
    for d, (n, b, s) in enumerate(zip(shape, begin, size)):
        if s == -1:
            s = n - b
        if b < 0 or s < 0 or b + s > n:
            raise node.fail(f"begin {begin} and size {size} do not fit the input shape "
                            f"{list(shape)} (dimension {d})")
        window.append((b, s))
    return window


def _infer_slice(node):
    return [tuple(s for _, s in _slice_window(node))]


def _slice(node, inputs):
    index = tuple(slice(b, b + s) for b, s in _slice_window(node))
    return [inputs[0][index]]


def _slice_taichi(node, io):
    x = io.inputs[0]
    base = sum(b * st for (b, _), st in zip(_slice_window(node), x.strides))
    return MoveStep([gather_move(x, io.outputs[0], base, x.strides)])


SLICE = register_op(OpDef(name="SLICE", infer=_infer_slice, reference=_slice,
                          taichi=_slice_taichi, fusion=Fusion(moves_values=True), min_inputs=3,
                          max_inputs=3))


# -- STRIDED_SLICE ----------------------------------------------------------------------------
@dataclass(frozen=True)
class StridedSliceOptions:
    begin_mask: int = 0
    end_mask: int = 0
    ellipsis_mask: int = 0
    new_axis_mask: int = 0
    shrink_axis_mask: int = 0
    offset: bool = False


def _parse_strided_slice(opts) -> StridedSliceOptions:
    return StridedSliceOptions(int(opts.BeginMask()), int(opts.EndMask()), int(opts.EllipsisMask()),
                               int(opts.NewAxisMask()), int(opts.ShrinkAxisMask()),
                               bool(opts.Offset()))


def _slice_bounds(n: int, begin: int, end: int, stride: int, begin_masked: bool,
                  end_masked: bool, offset: bool):
    """LiteRT's (= Python's slice.indices) start and stop of one axis of size n; with `offset`,
    `end` is a size measured from the start."""
    start = begin + n if begin < 0 else begin
    start = min(max(start, 0), n) if stride > 0 else min(max(start, -1), n - 1)
    if begin_masked:
        start = 0 if stride > 0 else n - 1
    if offset:
        return start, None
    stop = end + n if end < 0 else end
    stop = min(max(stop, 0), n) if stride > 0 else min(max(stop, -1), n - 1)
    if end_masked:
        stop = n if stride > 0 else -1
    return start, stop


def _as_slice(start: int, count: int, stride: int) -> slice:
    """A numpy slice taking `count` elements from `start` by `stride` (no negative wrap)."""
    if count <= 0:
        return slice(0, 0)
    stop = start + (count - 1) * stride + (1 if stride > 0 else -1)
    return slice(start, stop if stop >= 0 else None, stride)


def strided_slice_index(node, shape, begin, end, strides, begin_known: bool = True):
    """The numpy index expression STRIDED_SLICE applies to an input of `shape`.

    Returns a tuple of ints, slices and None (new axes). `begin` may be None only with `offset`
    when `begin_known` is False (shape inference of a slice whose start is dynamic): starts are
    then placeholders, and only the output shape of the result is meaningful.
    """
    o = node.options
    rank = len(shape)
    n_spec = len(end)
    ellipses = [i for i in range(n_spec) if o.ellipsis_mask >> i & 1]
    if len(ellipses) > 1:
        raise node.fail(f"ellipsis_mask {o.ellipsis_mask} sets more than one ellipsis")
    ellipsis = ellipses[0] if ellipses else None
    consuming = [i for i in range(n_spec)
                 if i != ellipsis and not o.new_axis_mask >> i & 1]
    if len(consuming) > rank:
        raise node.fail(f"the slice spec indexes {len(consuming)} dimensions, the input "
                        f"{list(shape)} has {rank}")
    index, d = [], 0
    for i in range(n_spec):
        if i == ellipsis:
            cover = rank - len(consuming)
            index.extend([slice(None)] * cover)
            d += cover
            continue
        if o.new_axis_mask >> i & 1:
            index.append(None)
            continue
        n, stride = shape[d], strides[i]
        if stride == 0:
            raise node.fail(f"stride {i} is 0")
        b = begin[i] if begin_known else 0
        if o.shrink_axis_mask >> i & 1:
            if o.begin_mask >> i & 1:
                at = 0 if stride > 0 else n - 1
            else:
                at = b + n if b < 0 else b
            if not 0 <= at < n:
                if not begin_known:
                    at = 0
                else:
                    raise node.fail(f"index {b} (entry {i} of the spec, shrink_axis_mask) is out "
                                    f"of range for dimension {d} of size {n}")
            index.append(at)
        elif o.offset:
            count = max(-(-end[i] // stride), 0)      # ceil(end / stride), at least 0
            span = (count - 1) * abs(stride) + 1 if count else 0
            if span > n:
                raise node.fail(f"a slice of {end[i]} elements with stride {stride} does not "
                                f"fit dimension {d} of size {n}")
            start, _ = _slice_bounds(n, b, 0, stride, bool(o.begin_mask >> i & 1), False, True)
            if count:      # keep the window inside the input
                start = (min(max(start, 0), n - span) if stride > 0
                         else min(max(start, span - 1), n - 1))
            index.append(_as_slice(start, count, stride))
        else:
            start, stop = _slice_bounds(n, b, end[i], stride, bool(o.begin_mask >> i & 1),
                                        bool(o.end_mask >> i & 1), False)
            count = max(-(-(stop - start) // stride), 0)
            index.append(_as_slice(start, count, stride))
        d += 1
    return tuple(index)


def _strided_slice_inputs(node):
    shape = node.inputs[0].shape
    offset = node.options.offset
    end = _index_input(node, 2, "end")
    strides = _index_input(node, 3, "strides", len(end))
    begin = _index_input(node, 1, "begin", len(end), required=not offset)
    return shape, begin, end, strides


def _infer_strided_slice(node):
    shape, begin, end, strides = _strided_slice_inputs(node)
    index = strided_slice_index(node, shape, begin, end, strides, begin_known=begin is not None)
    return [np.broadcast_to(np.empty((), np.int8), shape)[index].shape]


def _strided_slice(node, inputs):
    x, begin, end, strides = inputs
    index = strided_slice_index(node, x.shape, _ints(begin), _ints(end), _ints(strides))
    return [np.array(x[index])]


def _strided_slice_supports(node) -> Optional[str]:
    if node.inputs[1] is None or node.inputs[1].value is None:
        return "begin is known only at run time"
    return None


def _strided_slice_taichi(node, io):
    """The numpy index as an affine gather: an int entry moves the base, a slice gives its
    output dimension the coefficient step * input stride, a new axis the coefficient 0."""
    x, out = io.inputs[0], io.outputs[0]
    shape, begin, end, strides = _strided_slice_inputs(node)
    index = strided_slice_index(node, shape, begin, end, strides)
    base, coefs, d = 0, [], 0
    for item in index:
        if item is None:
            coefs.append(0)
            continue
        if isinstance(item, slice):
            start, _, step = item.indices(shape[d])
            base += start * x.strides[d]
            coefs.append(step * x.strides[d])
        else:
            base += int(item) * x.strides[d]
        d += 1
    coefs.extend(x.strides[d:])                 # dimensions the spec does not reach: whole
    if len(coefs) != out.rank:
        raise node.fail(f"internal: the slice spec gives {len(coefs)} output dimensions, the "
                        f"output has {out.rank}")
    return MoveStep([gather_move(x, out, base, coefs)])


STRIDED_SLICE = register_op(OpDef(name="STRIDED_SLICE", infer=_infer_strided_slice,
                                  reference=_strided_slice, parse=_parse_strided_slice,
                                  options_class="StridedSliceOptions",
                                  supports=_strided_slice_supports, taichi=_strided_slice_taichi,
                                  fusion=Fusion(moves_values=True), min_inputs=4, max_inputs=4))


# -- SPLIT / SPLIT_V --------------------------------------------------------------------------
@dataclass(frozen=True)
class SplitOptions:
    num_splits: int = 0


def _parse_split(opts) -> SplitOptions:
    return SplitOptions(int(opts.NumSplits()))


def _split_axis(node, i: int, data: int) -> int:
    """The constant axis input `i` (one value, any integer type) for the input `data`."""
    spec = node.inputs[i]
    if spec is None:
        raise node.fail(f"the axis (input {i}) is missing")
    if not np.issubdtype(np.dtype(spec.dtype), np.integer) or spec.is_quantized:
        raise node.fail(f"the axis must be an int32 tensor, got {np.dtype(spec.dtype).name}")
    values = _ints(node.input_value(i, "the axis"))
    if len(values) != 1:
        raise node.fail(f"the axis input must hold one value, has {len(values)}")
    rank = len(node.inputs[data].shape)
    axis = values[0]
    if not -rank <= axis < rank:
        raise node.fail(f"axis {axis} is out of range for rank {rank} "
                        f"(valid: {-rank}..{rank - 1})")
    return axis % rank


def _split_sizes(node) -> tuple:
    """(axis, sizes of the pieces along it, data input index) of SPLIT or SPLIT_V."""
    n_out = len(node.outputs)
    num = node.options.num_splits
    if node.op == "SPLIT":
        data = 1
        axis = _split_axis(node, 0, data)
        n = node.inputs[data].shape[axis]
        if num < 1:
            raise node.fail(f"num_splits must be >= 1, got {num}")
        if n % num:
            raise node.fail(f"dimension {axis} of the input {list(node.inputs[data].shape)} "
                            f"(size {n}) does not split into {num} equal parts")
        sizes = [n // num] * num
    else:
        data = 0
        axis = _split_axis(node, 2, data)
        n = node.inputs[data].shape[axis]
        sizes = _index_input(node, 1, "size_splits")
        if num != len(sizes):
            raise node.fail(f"num_splits is {num} but size_splits has {len(sizes)} entries")
        if sum(s == -1 for s in sizes) > 1:
            raise node.fail(f"size_splits {sizes} has more than one -1")
        if any(s < -1 for s in sizes):
            raise node.fail(f"size_splits {sizes} has a negative size")
        known = sum(s for s in sizes if s != -1)
        if -1 in sizes:
            if known > n:
                raise node.fail(f"size_splits {sizes} add up to more than dimension {axis} "
                                f"(size {n})")
            sizes = [n - known if s == -1 else s for s in sizes]
        elif known != n:
            raise node.fail(f"size_splits {sizes} add up to {known}, dimension {axis} of the "
                            f"input has size {n}")
    if n_out != num:
        raise node.fail(f"num_splits is {num} but the op has {n_out} outputs")
    return axis, sizes, data


def _infer_split(node):
    axis, sizes, data = _split_sizes(node)
    shape = node.inputs[data].shape
    return [tuple(shape[:axis]) + (s,) + tuple(shape[axis + 1:]) for s in sizes]


def _split(node, inputs):
    axis, sizes, data = _split_sizes(node)
    cuts = np.cumsum(sizes)[:-1]
    return np.split(inputs[data], cuts, axis=axis)


def _split_taichi(node, io):
    """One gather per output, all in this step."""
    axis, sizes, data = _split_sizes(node)
    x = io.inputs[data]
    moves, at = [], 0
    for out, size in zip(io.outputs, sizes):
        moves.append(gather_move(x, out, at * x.strides[axis], x.strides))
        at += size
    return MoveStep(moves)


SPLIT = register_op(OpDef(name="SPLIT", infer=_infer_split, reference=_split,
                          parse=_parse_split, options_class="SplitOptions",
                          taichi=_split_taichi, fusion=Fusion(moves_values=True), min_inputs=2,
                          max_inputs=2))
SPLIT_V = register_op(OpDef(name="SPLIT_V", infer=_infer_split, reference=_split,
                            parse=_parse_split, options_class="SplitVOptions",
                            taichi=_split_taichi, fusion=Fusion(moves_values=True), min_inputs=3,
                            max_inputs=3))


# -- DYNAMIC_UPDATE_SLICE ---------------------------------------------------------------------
# operand with `update` written at start_indices (one per dimension, run-time values allowed:
# a KV cache's position, a converted WHILE loop's step counter). As LiteRT (and XLA's
# dynamic_update_slice), each start is clamped so that the update lies inside the operand.
def _infer_dynamic_update_slice(node):
    operand, update, starts = node.inputs[0], node.inputs[1], node.inputs[2]
    if len(update.shape) != len(operand.shape):
        raise node.fail(f"update has rank {len(update.shape)}, the operand {len(operand.shape)}")
    if any(u > n for u, n in zip(update.shape, operand.shape)):
        raise node.fail(f"update {list(update.shape)} does not fit the operand {list(operand.shape)}")
    if np.dtype(update.dtype) != np.dtype(operand.dtype):
        raise node.fail(f"update is {np.dtype(update.dtype).name}, the operand "
                        f"{np.dtype(operand.dtype).name}")
    if not (_same_grid(update.quantization, operand.quantization)
            and _same_grid(node.outputs[0].quantization, operand.quantization)):
        # LiteRT copies the integers as they are: with another grid that would be a silent
        # rescale by the ratio of the scales, so such a model is refused
        raise node.fail("operand, update and output must share one quantization (LiteRT copies "
                        "the stored integers unchanged)")
    if (not np.issubdtype(np.dtype(starts.dtype), np.integer) or len(starts.shape) != 1
            or starts.shape[0] != len(operand.shape)):
        raise node.fail(f"start_indices must be a 1-D int32/int64 tensor of {len(operand.shape)} "
                        f"entries, has {np.dtype(starts.dtype).name} {list(starts.shape)}")
    return [tuple(operand.shape)]


def _same_grid(a, b) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return (np.array_equal(a.scale, b.scale) and np.array_equal(a.zero_point, b.zero_point)
            and (not a.per_channel or a.quantized_dimension == b.quantized_dimension))


def _dynamic_update_slice(node, inputs):
    operand, update, starts = inputs[0], inputs[1], np.asarray(inputs[2]).astype(np.int64)
    starts = np.clip(starts, 0, np.subtract(operand.shape, update.shape))
    out = np.array(operand, copy=True)
    out[tuple(slice(s, s + u) for s, u in zip(starts.tolist(), update.shape))] = update
    return [out]


DYNAMIC_UPDATE_SLICE = register_op(OpDef(
    name="DYNAMIC_UPDATE_SLICE", infer=_infer_dynamic_update_slice,
    reference=_dynamic_update_slice, min_inputs=3, max_inputs=3))
