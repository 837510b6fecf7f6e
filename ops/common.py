"""What several op families share: fused activations, padding, broadcasting, axes, custom
options written as flexbuffer maps, index range checks."""
from __future__ import annotations

import numpy as np

from tflite_taichi.errors import InputError, ModelError

from .base import Fusion, OpDef, register_op

# tflite.ActivationFunctionType
ACT_NONE, ACT_RELU, ACT_RELU_N1_TO_1, ACT_RELU6, ACT_TANH, ACT_SIGN_BIT = range(6)
ACTIVATION_NAMES = {0: "NONE", 1: "RELU", 2: "RELU_N1_TO_1", 3: "RELU6", 4: "TANH", 5: "SIGN_BIT"}

# tflite.Padding
PADDING_SAME, PADDING_VALID = 0, 1

# |x| beyond which tanh is +-1 to within one float32 ulp (1 - tanh(9.1) = 2.5e-8): a backend's
# tanh built from exp(2x) could give inf/inf = NaN for large |x| (GLSL leaves tanh's accuracy to
# the driver; lavapipe and llvmpipe saturate correctly), so larger inputs never reach it.
TANH_SATURATION = 9.1


def apply_activation(x: np.ndarray, act: int) -> np.ndarray:
    """The fused activation every TFLite op with `fused_activation_function` applies."""
    if act == ACT_NONE:
        return x
    if act == ACT_RELU:
        return np.maximum(x, 0)
    if act == ACT_RELU_N1_TO_1:
        return np.clip(x, -1, 1)
    if act == ACT_RELU6:
        return np.clip(x, 0, 6)
    if act == ACT_TANH:
        return np.tanh(x)
    if act == ACT_SIGN_BIT:
        return np.signbit(x).astype(x.dtype)
    raise ValueError(f"unknown fused activation {act}")


def check_activation(node, act: int) -> int:
    if act not in ACTIVATION_NAMES:
        raise node.fail(f"unknown fused activation function {act}")
    return act


def conv_output_size(padding: int, in_size: int, filter_size: int, stride: int, dilation: int = 1) -> int:
    """TFLite's ComputeOutSize."""
    effective = (filter_size - 1) * dilation + 1
    if padding == PADDING_SAME:
        return (in_size + stride - 1) // stride
    return (in_size - effective + stride) // stride


def conv_padding_before(padding: int, in_size: int, filter_size: int, stride: int,
                        dilation: int, out_size: int) -> int:
    """Padding before the first element (TFLite's ComputePaddingWithOffset, offset dropped:
    the extra odd pixel goes after)."""
    effective = (filter_size - 1) * dilation + 1
    total = max((out_size - 1) * stride + effective - in_size, 0)
    return total // 2


def check_padding(node, padding: int) -> int:
    if padding not in (PADDING_SAME, PADDING_VALID):
        raise node.fail(f"unknown padding {padding}")
    return padding


def broadcast_shapes(node, *shapes) -> tuple:
    try:
        return tuple(int(d) for d in np.broadcast_shapes(*[tuple(s) for s in shapes]))
    except ValueError:
        raise node.fail("input shapes " + " and ".join(str(list(s)) for s in shapes)
                        + " do not broadcast") from None


def normalize_axes(node, axes, rank: int) -> tuple:
    """Axes as a sorted tuple of non-negative ints, checked against `rank`."""
    out = []
    for a in np.asarray(axes).reshape(-1).tolist():
        a = int(a)
        if not -rank <= a < max(rank, 1):
            raise node.fail(f"axis {a} out of range for rank {rank}")
        out.append(a % max(rank, 1))
    return tuple(sorted(set(out)))


def positive_ints(node, what: str, *values):
    for v in values:
        if int(v) < 1:
            raise node.fail(f"{what} must be >= 1, got {v}")


def unbroadcast_inputs(node) -> tuple:
    """The inputs of an element-wise op that have its output's shape: either can be handed over
    by its producer's store (the other is loaded, broadcast)."""
    out = tuple(node.outputs[0].shape)
    return tuple(i for i, spec in enumerate(node.inputs)
                 if spec is not None and tuple(spec.shape) == out)


def register_binary(name: str, infer, reference, taichi, **fields) -> OpDef:
    """Registers a two-input element-wise op (the arithmetic, math and logical families): its
    inputs broadcast, its Taichi part a kit.BroadcastBinaryStep, which stores each element once
    and takes an unbroadcast input as a value handed over by that input's producer (epilogue
    fusion). `fields` set the rest (options, parsing) or override these."""
    definition = dict(name=name, infer=infer, reference=reference, taichi=taichi, min_inputs=2,
                      max_inputs=2, fusion=Fusion(stores_once=True, epilogue_inputs=unbroadcast_inputs))
    return register_op(OpDef(**{**definition, **fields}))


def flexbuffer_map(op, layout: str = "") -> dict:
    """An op's custom_options read as the flexbuffer map converters write (detection's
    post-process, MediaPipe's transforms); a ModelError naming the op when they are absent,
    unreadable or not a map. `layout`: what the map holds, for the message."""
    from flatbuffers import flexbuffers
    what = f"op #{op.index} ({op.name})"
    about = f" ({layout})" if layout else ""
    raw = bytes(op.custom_options or b"")
    if not raw:
        raise ModelError(f"{what}: custom_options must hold a flexbuffer map{about}; there are none")
    try:
        value = flexbuffers.Loads(raw)
    except Exception as e:  # corrupt bytes fail in any of its decoders (offsets, types, recursion)
        raise ModelError(f"{what}: custom_options are not a readable flexbuffer{about} "
                         f"({type(e).__name__}: {e})") from None
    if not isinstance(value, dict):
        raise ModelError(f"{what}: custom_options must be a flexbuffer map{about}, hold a "
                         f"{type(value).__name__}")
    return value


# -- values the op refuses: at prepare (constants) or at invoke (run-time indices) ---------
def invoke_error(node, message: str) -> InputError:
    """A value only known at invoke (a run-time index) that the op cannot take."""
    return InputError(f"op #{node.index} ({node.op}): {message}")


def check_range(node, idx: np.ndarray, size: int, what: str, at_prepare: bool):
    """Every entry of `idx` in [0, size), else a ModelError (constant indices) or an
    InputError (run-time indices), naming the op and the first bad entry."""
    idx = np.asarray(idx)
    bad = (idx < 0) | (idx >= size)
    if bad.any():
        where = tuple(int(c) for c in np.argwhere(bad)[0])
        message = (f"{what} {int(idx[where])} at {list(where)} is out of range "
                   f"[0, {size})")
        raise node.fail(message) if at_prepare else invoke_error(node, message)
