"""Shape and layout ops: RESHAPE, SHAPE, PACK, UNPACK, EXPAND_DIMS, SQUEEZE, TRANSPOSE,
CONCATENATION, DEPTH_TO_SPACE, SPACE_TO_DEPTH, BROADCAST_ARGS, BITCAST.

All of them move values without arithmetic (CONCATENATION adds its fused activation), so on the
float view a quantized tensor keeps its real values and the runtime's fake-quant snaps the
output to its own grid. (LiteRT copies the int8 bytes instead; the two agree whenever input and
output share their quantization, which LiteRT requires for most of these ops anyway.)

Taichi: every op here (and the slicing family's, ops/slicing.py) is an affine data movement:
a loop over some index space I, reading source element `src_base + sum(I * src_coefs)` and
writing destination element `dst_base + sum(I * dst_coefs)`. `MoveStep` runs a list of such
moves (one per input of CONCATENATION/PACK, one per output of UNPACK/SPLIT), each its own
parallel loop, one thread per element moved; adjacent loop dimensions that are contiguous on
both sides are merged at build time, so a RESHAPE is a 1-D copy. SHAPE is always folded at
prepare and has no Taichi part.

BROADCAST_ARGS and BITCAST run on the CPU (integer shape vectors; raw bytes, which the float
view does not carry), folded at prepare when their inputs are constant:
- BROADCAST_ARGS: two 1-D int32 (or int64) shape vectors of one dtype -> the numpy broadcast of
  the two shapes, length max(n1, n2) (LiteRT's broadcast_args.cc). Two entries that differ and
  are both not 1 are a ModelError here (at prepare for constants, at invoke otherwise), where
  LiteRT aborts the process (TFLITE_CHECK_EQ); a negative entry is one too (no shape has it;
  LiteRT passes a -1 against a 1 through).
- BITCAST: the input's bytes reinterpreted as the output tensor's dtype (tf.bitcast, LiteRT's
  bitcast.cc): same item size, same shape; a wider input [..] gives [.., in_size / out_size];
  a narrower one needs its last dimension to be out_size / in_size and drops it (rank 0 cannot:
  LiteRT reads dimension -1 there). A quantized tensor contributes and receives its stored
  integers (its float view re-quantized, exact on its grid). A bool output holds True for every
  nonzero byte (numpy bools of other bytes than 0/1 are not well formed: LiteRT hands those
  out; they compare equal to True).
(No `from __future__ import annotations` here: Taichi reads the ti.func annotations.)
"""
import math
from dataclasses import dataclass
from typing import Optional

import numpy as np

from tflite_taichi.quant import dequantize, is_float_view, quantize

from .base import Fusion, OpDef, register_op
from .common import apply_activation, check_activation, positive_ints
from .kit import activation, ti

# tflite.TensorType codes SHAPE's out_type may name.
_FLOAT32, _INT32, _INT64 = 0, 2, 4


def _ints(value) -> list:
    """A constant index tensor's values as Python ints (any integer dtype, any shape)."""
    return [int(v) for v in np.asarray(value).reshape(-1).tolist()]


def _check_int_tensor(node, i: int, what: str):
    spec = node.inputs[i]
    if spec is None:
        raise node.fail(f"{what} (input {i}) is missing")
    if not np.issubdtype(np.dtype(spec.dtype), np.integer) or spec.is_quantized:
        raise node.fail(f"{what} must be an int32 or int64 tensor, got {np.dtype(spec.dtype).name}")


def _axis(node, axis: int, rank: int, what: str = "axis") -> int:
    """`axis` in [-rank, rank) made non-negative, else a ModelError."""
    if not -rank <= axis < rank:
        raise node.fail(f"{what} {axis} is out of range for rank {rank} (valid: {-rank}..{rank - 1})")
    return axis % rank


# -- Taichi: affine moves ---------------------------------------------------------------------
def _simplify(loop, src_coefs, dst_coefs) -> tuple:
    """The same move over fewer loop dimensions: size-1 dimensions dropped, and an outer
    dimension merged into the next one where both sides are contiguous across them. An empty
    loop (a scalar) becomes one iteration."""
    merged = []
    for n, s, d in zip(loop, src_coefs, dst_coefs):
        n, s, d = int(n), int(s), int(d)
        if n == 1:
            continue
        if merged and merged[-1][1] == s * n and merged[-1][2] == d * n:
            merged[-1] = (merged[-1][0] * n, s, d)
            continue
        merged.append((n, s, d))
    if not merged:
        merged = [(1, 0, 0)]
    return tuple(zip(*merged))


@ti.data_oriented
class Move:
    """One parallel loop over `loop`: dst[dst_base + I . dst_coefs] = act(src[src_base + I . src_coefs]).
    Everything is static; the store applies the destination's quantization grid."""

    def __init__(self, src, dst, loop, src_base, src_coefs, dst_base, dst_coefs, act=0):
        if len(loop) != len(src_coefs) or len(loop) != len(dst_coefs):
            raise ValueError("a move needs one source and one destination coefficient per loop dimension")
        self.src, self.dst, self.act = src, dst, int(act)
        self.loop, self.src_coefs, self.dst_coefs = _simplify(loop, src_coefs, dst_coefs)
        self.src_base, self.dst_base = int(src_base), int(dst_base)
        self.rank = len(self.loop)

    def __repr__(self):
        return (f"Move({self.src} -> {self.dst}, loop={self.loop}, src={self.src_base}+{self.src_coefs}, "
                f"dst={self.dst_base}+{self.dst_coefs})")

    @ti.func
    def run(self, arena: ti.template(), weights: ti.template(), io: ti.template()):
        for I in ti.grouped(ti.ndrange(*self.loop)):
            s = self.src_base
            d = self.dst_base
            for j in ti.static(range(self.rank)):
                s += I[j] * self.src_coefs[j]
                d += I[j] * self.dst_coefs[j]
            v = self.src.load(arena, weights, io, s)
            self.dst.store(arena, io, d, activation(v, self.act))


@ti.data_oriented
class MoveStep:
    """An op as a list of moves, run in order (each its own parallel task)."""

    def __init__(self, moves):
        self.moves = list(moves)

    @ti.func
    def run(self, arena: ti.template(), weights: ti.template(), io: ti.template()):
        for m in ti.static(self.moves):
            m.run(arena, weights, io)


def copy_move(src, dst) -> Move:
    """dst = src element for element (row-major order kept): RESHAPE and friends."""
    return Move(src, dst, (dst.size,), 0, (1,), 0, (1,))


def gather_move(src, dst, src_base: int, src_coefs) -> Move:
    """Every element of dst, read from src at src_base + I . src_coefs (I: dst's index)."""
    return Move(src, dst, dst.shape, src_base, src_coefs, 0, dst.strides)


def scatter_move(src, dst, dst_base: int, dst_coefs, act: int = 0) -> Move:
    """Every element of src, written to dst at dst_base + I . dst_coefs (I: src's index)."""
    return Move(src, dst, src.shape, 0, src.strides, dst_base, dst_coefs, act)


def _without(values, axis: int) -> tuple:
    return tuple(v for d, v in enumerate(values) if d != axis)


def _copy_taichi(node, io):
    return MoveStep([copy_move(io.inputs[0], io.outputs[0])])


# -- RESHAPE ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class ReshapeOptions:
    new_shape: Optional[tuple] = None     # None: the options have no new_shape


def _parse_reshape(opts) -> ReshapeOptions:
    if opts.NewShapeIsNone():
        return ReshapeOptions(None)
    return ReshapeOptions(tuple(int(d) for d in opts.NewShapeAsNumpy().tolist()))


def _reshape_target(node) -> list:
    """The requested shape (may hold one -1): the shape input when it is a vector, else the
    options' new_shape, as LiteRT chooses."""
    shape_in = node.inputs[1] if len(node.inputs) > 1 else None
    new_shape = node.options.new_shape if node.options is not None else None
    if shape_in is not None and len(shape_in.shape) == 1:
        _check_int_tensor(node, 1, "the shape input")
        if shape_in.value is None and new_shape is not None:
            # Only known at run time; the converter's static copy in the options stands in.
            return list(new_shape)
        return _ints(node.input_value(1, "the shape input"))
    if new_shape is None:
        raise node.fail("no new shape: neither a 1-D shape input nor ReshapeOptions.new_shape")
    if list(new_shape) == [0]:
        return []          # legacy models write [0] for a scalar
    return list(new_shape)


def _element_count(shape) -> int:
    """Elements in `shape`, exact for any shape (Python integers: an int64 product wraps, and a
    huge new shape could then seem to match the input's count or show a wrong count)."""
    return math.prod(int(d) for d in shape)


def _infer_reshape(node):
    x = node.inputs[0]
    target = _reshape_target(node)
    count = _element_count(x.shape)
    if sum(d == -1 for d in target) > 1:
        raise node.fail(f"new shape {target} has more than one -1 dimension")
    if any(d < -1 for d in target):
        raise node.fail(f"new shape {target} has a negative dimension")
    if -1 in target:
        known = _element_count(d for d in target if d != -1)
        if known == 0 or count % known:
            raise node.fail(f"cannot reshape {list(x.shape)} ({count} elements) to {target}")
        target = [count // known if d == -1 else d for d in target]
    target_count = _element_count(target)
    if target_count != count:
        raise node.fail(f"cannot reshape {list(x.shape)} ({count} elements) to {target} "
                        f"({target_count} elements)")
    return [tuple(target)]


def _reshape(node, inputs):
    return [np.reshape(inputs[0], node.outputs[0].shape)]


RESHAPE = register_op(OpDef(name="RESHAPE", infer=_infer_reshape, reference=_reshape,
                            parse=_parse_reshape, options_class="ReshapeOptions",
                            taichi=_copy_taichi, min_inputs=1, max_inputs=2, fusion=Fusion(alias_input=0)))


# -- SHAPE ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ShapeOptions:
    out_type: int = _INT32


def _parse_shape(opts) -> ShapeOptions:
    return ShapeOptions(int(opts.OutType()))


def _infer_shape(node):
    out_type = node.options.out_type
    out_dtype = np.dtype(node.outputs[0].dtype)
    wanted = {_INT32: np.dtype(np.int32), _INT64: np.dtype(np.int64)}
    if out_type == _FLOAT32:
        # out_type absent (the schema default): the output tensor's type decides.
        if out_dtype not in wanted.values():
            raise node.fail(f"output must be int32 or int64, got {out_dtype.name}")
    elif out_type not in wanted:
        raise node.fail(f"out_type must be INT32 or INT64, got tensor type {out_type}")
    elif wanted[out_type] != out_dtype:
        raise node.fail(f"out_type {wanted[out_type].name} does not match the output tensor's "
                        f"type {out_dtype.name}")
    return [(len(node.inputs[0].shape),)]


def _shape(node, inputs):
    return [np.array(node.inputs[0].shape, dtype=np.dtype(node.outputs[0].dtype))]


SHAPE = register_op(OpDef(name="SHAPE", infer=_infer_shape, reference=_shape,
                          parse=_parse_shape, options_class="ShapeOptions", reads_only_shapes=True,
                          min_inputs=1, max_inputs=1))


# -- PACK / UNPACK ----------------------------------------------------------------------------
@dataclass(frozen=True)
class PackOptions:
    values_count: int = 0
    axis: int = 0


def _parse_pack(opts) -> PackOptions:
    return PackOptions(int(opts.ValuesCount()), int(opts.Axis()))


def _infer_pack(node):
    n = len(node.inputs)
    if node.options.values_count != n:
        raise node.fail(f"values_count is {node.options.values_count} but the op has {n} inputs")
    if any(s is None for s in node.inputs):
        raise node.fail("an input is missing")
    shape = node.inputs[0].shape
    for i, s in enumerate(node.inputs[1:], 1):
        if s.shape != shape:
            raise node.fail(f"input {i} has shape {list(s.shape)}, input 0 has {list(shape)}")
    axis = _axis(node, node.options.axis, len(shape) + 1)
    return [tuple(shape[:axis]) + (n,) + tuple(shape[axis:])]


def _pack(node, inputs):
    axis = node.options.axis % (len(node.inputs[0].shape) + 1)
    return [np.stack(inputs, axis=axis)]


def _pack_taichi(node, io):
    out = io.outputs[0]
    axis = node.options.axis % out.rank
    coefs = _without(out.strides, axis)
    return MoveStep([scatter_move(x, out, k * out.strides[axis], coefs)
                     for k, x in enumerate(io.inputs)])


PACK = register_op(OpDef(name="PACK", infer=_infer_pack, reference=_pack, parse=_parse_pack,
                         options_class="PackOptions", taichi=_pack_taichi, fusion=Fusion(moves_values=True),
                         min_inputs=1))


@dataclass(frozen=True)
class UnpackOptions:
    num: int = 0
    axis: int = 0


def _parse_unpack(opts) -> UnpackOptions:
    return UnpackOptions(int(opts.Num()), int(opts.Axis()))


def _infer_unpack(node):
    shape = node.inputs[0].shape
    if not shape:
        raise node.fail("cannot unpack a scalar")
    axis = _axis(node, node.options.axis, len(shape))
    num = node.options.num
    if num != shape[axis]:
        raise node.fail(f"num is {num} but dimension {axis} of the input {list(shape)} "
                        f"has size {shape[axis]}")
    if len(node.outputs) != num:
        raise node.fail(f"num is {num} but the op has {len(node.outputs)} outputs")
    out = tuple(shape[:axis]) + tuple(shape[axis + 1:])
    return [out] * num


def _unpack(node, inputs):
    axis = node.options.axis % len(node.inputs[0].shape)
    x = inputs[0]
    return [np.take(x, i, axis=axis) for i in range(x.shape[axis])]


def _unpack_taichi(node, io):
    x = io.inputs[0]
    axis = node.options.axis % x.rank
    coefs = _without(x.strides, axis)
    return MoveStep([gather_move(x, out, k * x.strides[axis], coefs)
                     for k, out in enumerate(io.outputs)])


UNPACK = register_op(OpDef(name="UNPACK", infer=_infer_unpack, reference=_unpack,
                           parse=_parse_unpack, options_class="UnpackOptions",
                           taichi=_unpack_taichi, fusion=Fusion(moves_values=True), min_inputs=1,
                           max_inputs=1))


# -- EXPAND_DIMS / SQUEEZE ----------------------------------------------------------------------
def _expand_axis(node) -> int:
    _check_int_tensor(node, 1, "the axis input")
    values = _ints(node.input_value(1, "the axis input"))
    if len(values) != 1:
        raise node.fail(f"the axis input must hold one value, has {len(values)}")
    return _axis(node, values[0], len(node.inputs[0].shape) + 1)


def _infer_expand_dims(node):
    shape = node.inputs[0].shape
    axis = _expand_axis(node)
    return [tuple(shape[:axis]) + (1,) + tuple(shape[axis:])]


def _expand_dims(node, inputs):
    return [np.reshape(inputs[0], node.outputs[0].shape)]


EXPAND_DIMS = register_op(OpDef(name="EXPAND_DIMS", infer=_infer_expand_dims,
                                reference=_expand_dims, taichi=_copy_taichi,
                                min_inputs=2, max_inputs=2, fusion=Fusion(alias_input=0)))


@dataclass(frozen=True)
class SqueezeOptions:
    squeeze_dims: tuple = ()


def _parse_squeeze(opts) -> SqueezeOptions:
    if opts.SqueezeDimsIsNone():
        return SqueezeOptions(())
    return SqueezeOptions(tuple(int(d) for d in opts.SqueezeDimsAsNumpy().tolist()))


def _infer_squeeze(node):
    shape = node.inputs[0].shape
    rank = len(shape)
    if node.options.squeeze_dims:
        dims = {_axis(node, d, rank, "squeeze dimension") for d in node.options.squeeze_dims}
        for d in sorted(dims):
            if shape[d] != 1:
                raise node.fail(f"cannot squeeze dimension {d} of shape {list(shape)}: "
                                f"its size is {shape[d]}, not 1")
    else:
        dims = {d for d in range(rank) if shape[d] == 1}
    return [tuple(s for d, s in enumerate(shape) if d not in dims)]


def _squeeze(node, inputs):
    return [np.reshape(inputs[0], node.outputs[0].shape)]


SQUEEZE = register_op(OpDef(name="SQUEEZE", infer=_infer_squeeze, reference=_squeeze,
                            parse=_parse_squeeze, options_class="SqueezeOptions",
                            taichi=_copy_taichi, min_inputs=1, max_inputs=1, fusion=Fusion(alias_input=0)))


# -- TRANSPOSE --------------------------------------------------------------------------------
def _perm(node) -> tuple:
    _check_int_tensor(node, 1, "the permutation")
    perm = _ints(node.input_value(1, "the permutation"))
    rank = len(node.inputs[0].shape)
    if sorted(perm) != list(range(rank)):
        raise node.fail(f"permutation {perm} is not a permutation of 0..{rank - 1} "
                        f"(input rank {rank})")
    return tuple(perm)


def _infer_transpose(node):
    shape = node.inputs[0].shape
    return [tuple(shape[p] for p in _perm(node))]


def _transpose(node, inputs):
    return [np.transpose(inputs[0], _ints(inputs[1]))]


def _transpose_taichi(node, io):
    x = io.inputs[0]
    return MoveStep([gather_move(x, io.outputs[0], 0, [x.strides[p] for p in _perm(node)])])


TRANSPOSE = register_op(OpDef(name="TRANSPOSE", infer=_infer_transpose, reference=_transpose,
                              taichi=_transpose_taichi, fusion=Fusion(moves_values=True), min_inputs=2,
                              max_inputs=2))


# -- CONCATENATION ----------------------------------------------------------------------------
@dataclass(frozen=True)
class ConcatenationOptions:
    axis: int = 0
    fused_activation_function: int = 0


def _parse_concatenation(opts) -> ConcatenationOptions:
    return ConcatenationOptions(int(opts.Axis()), int(opts.FusedActivationFunction()))


def _infer_concatenation(node):
    check_activation(node, node.options.fused_activation_function)
    if any(s is None for s in node.inputs):
        raise node.fail("an input is missing")
    first = node.inputs[0].shape
    rank = len(first)
    if rank == 0:
        raise node.fail("cannot concatenate scalars")
    axis = _axis(node, node.options.axis, rank)
    total = 0
    for i, s in enumerate(node.inputs):
        if len(s.shape) != rank or any(a != b for d, (a, b) in enumerate(zip(s.shape, first))
                                       if d != axis):
            raise node.fail(f"input {i} has shape {list(s.shape)}, which does not match input 0 "
                            f"{list(first)} outside axis {axis}")
        total += s.shape[axis]
    return [tuple(first[:axis]) + (total,) + tuple(first[axis + 1:])]


def _concatenation(node, inputs):
    axis = node.options.axis % len(node.inputs[0].shape)
    out = np.concatenate(inputs, axis=axis)
    return [apply_activation(out, node.options.fused_activation_function)]


def _concatenation_taichi(node, io):
    out = io.outputs[0]
    axis = node.options.axis % out.rank
    moves, at = [], 0
    for x in io.inputs:
        moves.append(scatter_move(x, out, at * out.strides[axis], out.strides,
                                  node.options.fused_activation_function))
        at += x.shape[axis]
    return MoveStep(moves)


CONCATENATION = register_op(OpDef(name="CONCATENATION", infer=_infer_concatenation,
                                  reference=_concatenation, parse=_parse_concatenation,
                                  options_class="ConcatenationOptions",
                                  taichi=_concatenation_taichi, fusion=Fusion(moves_values=True),
                                  min_inputs=1))


# -- DEPTH_TO_SPACE / SPACE_TO_DEPTH ----------------------------------------------------------
# NHWC. DEPTH_TO_SPACE: out[b, h*bs + i, w*bs + j, c] = in[b, h, w, (i*bs + j)*C_out + c];
# SPACE_TO_DEPTH is its inverse. On the 6-D views [B, H, W, bs, bs, C] (depth side) and
# [B, H, bs, W, bs, C] (space side) both are one transpose, so one affine move.
@dataclass(frozen=True)
class BlockOptions:
    block_size: int = 0


def _parse_block(opts) -> BlockOptions:
    return BlockOptions(int(opts.BlockSize()))


def _check_nhwc(node) -> tuple:
    shape = node.inputs[0].shape
    if len(shape) != 4:
        raise node.fail(f"the input must be 4-D (NHWC), has shape {list(shape)}")
    positive_ints(node, "block_size", node.options.block_size)
    return tuple(shape)


def _infer_depth_to_space(node):
    b, h, w, c = _check_nhwc(node)
    bs = node.options.block_size
    if c % (bs * bs):
        raise node.fail(f"the input depth {c} is not a multiple of block_size^2 = {bs * bs}")
    return [(b, h * bs, w * bs, c // (bs * bs))]


def _depth_to_space(node, inputs):
    x = inputs[0]
    b, h, w, c = x.shape
    bs = node.options.block_size
    y = x.reshape(b, h, w, bs, bs, c // (bs * bs)).transpose(0, 1, 3, 2, 4, 5)
    return [y.reshape(node.outputs[0].shape)]


def _depth_to_space_taichi(node, io):
    x, out = io.inputs[0], io.outputs[0]
    b, h, w, c = x.shape
    bs = node.options.block_size
    co = c // (bs * bs)
    loop = (b, h, w, bs, bs, co)                       # the input, in its own order
    src = x.strides[:3] + (bs * co, co, 1)
    o = out.strides
    dst = (o[0], bs * o[1], bs * o[2], o[1], o[2], 1)
    return MoveStep([Move(x, out, loop, 0, src, 0, dst)])


DEPTH_TO_SPACE = register_op(OpDef(name="DEPTH_TO_SPACE", infer=_infer_depth_to_space,
                                   reference=_depth_to_space, parse=_parse_block,
                                   options_class="DepthToSpaceOptions",
                                   taichi=_depth_to_space_taichi, min_inputs=1, max_inputs=1))


def _infer_space_to_depth(node):
    b, h, w, c = _check_nhwc(node)
    bs = node.options.block_size
    if h % bs or w % bs:
        raise node.fail(f"the input height {h} and width {w} must be multiples of "
                        f"block_size {bs}")
    return [(b, h // bs, w // bs, c * bs * bs)]


def _space_to_depth(node, inputs):
    x = inputs[0]
    b, h, w, c = x.shape
    bs = node.options.block_size
    y = x.reshape(b, h // bs, bs, w // bs, bs, c).transpose(0, 1, 3, 2, 4, 5)
    return [y.reshape(node.outputs[0].shape)]


def _space_to_depth_taichi(node, io):
    x, out = io.inputs[0], io.outputs[0]
    b, ho, wo, _ = out.shape
    bs = node.options.block_size
    c = x.shape[3]
    loop = (b, ho, wo, bs, bs, c)                      # the output, in its own order
    i = x.strides
    src = (i[0], bs * i[1], bs * i[2], i[1], i[2], 1)
    dst = out.strides[:3] + (bs * c, c, 1)
    return MoveStep([Move(x, out, loop, 0, src, 0, dst)])


SPACE_TO_DEPTH = register_op(OpDef(name="SPACE_TO_DEPTH", infer=_infer_space_to_depth,
                                   reference=_space_to_depth, parse=_parse_block,
                                   options_class="SpaceToDepthOptions",
                                   taichi=_space_to_depth_taichi, min_inputs=1, max_inputs=1))


# -- BROADCAST_ARGS ---------------------------------------------------------------------------
_SHAPE_DTYPES = (np.dtype(np.int32), np.dtype(np.int64))


def _infer_broadcast_args(node):
    specs = list(node.inputs) + [node.outputs[0]]
    for spec in specs:
        dtype = np.dtype(spec.dtype) if spec.dtype is not None else None
        if dtype not in _SHAPE_DTYPES or spec.is_quantized:
            raise node.fail(f"tensor '{spec.name}' must be int32 or int64, got "
                            f"{dtype.name if dtype is not None else 'opaque'}")
    if len({np.dtype(spec.dtype) for spec in specs}) > 1:
        raise node.fail("both shapes and the output must have one dtype, got "
                        + ", ".join(f"'{s.name}' {np.dtype(s.dtype).name}" for s in specs))
    for spec in node.inputs:
        if len(spec.shape) != 1:
            raise node.fail(f"shape '{spec.name}' must be 1-D, has shape {list(spec.shape)}")
    return [(max(node.inputs[0].shape[0], node.inputs[1].shape[0]),)]


def _broadcast_args(node, inputs):
    a, b = (_ints(v) for v in inputs)
    for spec, dims in zip(node.inputs, (a, b)):
        if any(d < 0 for d in dims):
            raise node.fail(f"shape '{spec.name}' = {dims} has a negative dimension")
    n = max(len(a), len(b))
    a, b = [1] * (n - len(a)) + a, [1] * (n - len(b)) + b     # aligned at the trailing end
    out = []
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y and 1 not in (x, y):
            raise node.fail(f"shapes {a[n - len(a):]} and {b} do not broadcast: dimension {i} "
                            f"is {x} and {y}")
        out.append(y if x == 1 else x)
    return [np.array(out, dtype=np.dtype(node.outputs[0].dtype))]


BROADCAST_ARGS = register_op(OpDef(name="BROADCAST_ARGS", infer=_infer_broadcast_args,
                                   reference=_broadcast_args, min_inputs=2, max_inputs=2))


# -- BITCAST ----------------------------------------------------------------------------------
def _item_size(node, spec) -> int:
    if spec.dtype is None or np.dtype(spec.dtype).kind not in "biufc":
        raise node.fail(f"tensor '{spec.name}' has no fixed-size numeric dtype to bitcast")
    return np.dtype(spec.dtype).itemsize


def _infer_bitcast(node):
    x, out = node.inputs[0], node.outputs[0]
    size_in, size_out = _item_size(node, x), _item_size(node, out)
    shape = tuple(x.shape)
    if size_in > size_out:
        return [shape + (size_in // size_out,)]
    if size_in < size_out:
        ratio = size_out // size_in
        if not shape or shape[-1] != ratio:
            raise node.fail(f"input '{x.name}' {list(shape)} ({np.dtype(x.dtype).name}) must end "
                            f"in a dimension of {ratio} to become one {np.dtype(out.dtype).name}")
        return [shape[:-1]]
    return [shape]


def _stored(spec, value) -> np.ndarray:
    """A tensor's data as the model stores it: the integers of a quantized (float view) one."""
    if is_float_view(spec.dtype, spec.quantization):
        return quantize(value, spec.quantization, spec.dtype)       # exact: on its grid
    return np.asarray(value, dtype=np.dtype(spec.dtype))


def _bitcast(node, inputs):
    out = node.outputs[0]
    data = np.ascontiguousarray(_stored(node.inputs[0], inputs[0])).reshape(-1)  # 0-d: no view
    if np.dtype(out.dtype) == np.bool_:
        y = data.view(np.uint8) != 0       # well-formed bools (see the module docstring)
    else:
        y = data.view(np.dtype(out.dtype))
    y = y.reshape(out.shape)
    if is_float_view(out.dtype, out.quantization):
        return [dequantize(y, out.quantization)]
    return [y.copy()]


BITCAST = register_op(OpDef(name="BITCAST", infer=_infer_bitcast, reference=_bitcast,
                            min_inputs=1, max_inputs=1))
