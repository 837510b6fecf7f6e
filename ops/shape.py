"""Shape and layout ops: RESHAPE, SHAPE, PACK, UNPACK, EXPAND_DIMS, SQUEEZE, TRANSPOSE,
CONCATENATION.

All of them move values without arithmetic (CONCATENATION adds its fused activation), so on the
float view a quantized tensor keeps its real values and the runtime's fake-quant snaps the
output to its own grid. (LiteRT copies the int8 bytes instead; the two agree whenever input and
output share their quantization, which LiteRT requires for most of these ops anyway.)
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from .base import OpDef, register_op
from .common import apply_activation, check_activation

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


def _infer_reshape(node):
    x = node.inputs[0]
    target = _reshape_target(node)
    count = int(np.prod(x.shape, dtype=np.int64))
    if sum(d == -1 for d in target) > 1:
        raise node.fail(f"new shape {target} has more than one -1 dimension")
    if any(d < -1 for d in target):
        raise node.fail(f"new shape {target} has a negative dimension")
    if -1 in target:
        known = int(np.prod([d for d in target if d != -1], dtype=np.int64))
        if known == 0 or count % known:
            raise node.fail(f"cannot reshape {list(x.shape)} ({count} elements) to {target}")
        target = [count // known if d == -1 else d for d in target]
    if int(np.prod(target, dtype=np.int64)) != count:
        raise node.fail(f"cannot reshape {list(x.shape)} ({count} elements) to {target} "
                        f"({int(np.prod(target, dtype=np.int64))} elements)")
    return [tuple(target)]


def _reshape(node, inputs):
    return [np.reshape(inputs[0], node.outputs[0].shape)]


RESHAPE = register_op(OpDef(name="RESHAPE", infer=_infer_reshape, reference=_reshape,
                            parse=_parse_reshape, options_class="ReshapeOptions",
                            min_inputs=1, max_inputs=2))


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


PACK = register_op(OpDef(name="PACK", infer=_infer_pack, reference=_pack, parse=_parse_pack,
                         options_class="PackOptions", min_inputs=1))


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


UNPACK = register_op(OpDef(name="UNPACK", infer=_infer_unpack, reference=_unpack,
                           parse=_parse_unpack, options_class="UnpackOptions",
                           min_inputs=1, max_inputs=1))


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
                                reference=_expand_dims, min_inputs=2, max_inputs=2))


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
                            min_inputs=1, max_inputs=1))


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


TRANSPOSE = register_op(OpDef(name="TRANSPOSE", infer=_infer_transpose, reference=_transpose,
                              min_inputs=2, max_inputs=2))


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


CONCATENATION = register_op(OpDef(name="CONCATENATION", infer=_infer_concatenation,
                                  reference=_concatenation, parse=_parse_concatenation,
                                  options_class="ConcatenationOptions", min_inputs=1))
