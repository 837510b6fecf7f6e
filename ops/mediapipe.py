"""MediaPipe's custom pooling ops: CUSTOM:MaxPoolingWithArgmax2D and CUSTOM:MaxUnpooling2D
(segmentation models pool with argmax, then unpool with those indices).

Both take their parameters as the raw bytes of a C `TfLitePoolParams` in custom_options, read
as its leading int32 fields: padding (TfLitePadding: 1 SAME, 2 VALID), stride_width,
stride_height, filter_width, filter_height, activation (TfLiteFusedActivation; absent: none).
The struct's trailing computed-padding fields are ignored, as the kernels recompute them.

Semantics: those of MediaPipe's own kernels (mediapipe/util/tflite/operations/
max_pool_argmax.cc, max_unpooling.cc), which the official GPU delegate shares:
- MaxPoolingWithArgmax2D: input [N, H, W, C] -> values and indices, both [N, OH, OW, C], with
  TFLite's pooling geometry (SAME: OH = ceil(H / s), VALID: OH = (H - f + s) // s, padding
  before = total // 2). Each window's maximum over the taps inside the input, scanning the
  window row by row and keeping the first maximum (a strict >, starting from float32's lowest
  value); its index is the tap's position in the window, row-major: ky * filter_width + kx,
  counted from the window's padded origin. The activation clamps the values (RELU, RELU6,
  RELU_N1_TO_1; the others leave them as they are, as MediaPipe's CalculateActivationRange
  does); it does not touch the indices.
- MaxUnpooling2D: values and indices [N, H, W, C] -> [N, H * filter_h, W * filter_w, C], zero
  but where an input element lands: idx = int(index) (truncated), then
  (y * stride_h - pad_h + idx / filter_w, x * stride_w - pad_w + idx % filter_w) with C's
  truncating division, pad = max(0, ((H - 1) * stride + filter - H * filter) // 2) (0 whenever
  stride <= filter); a destination outside the output is skipped, and where several elements
  land on one place the last in NHWC order wins. Padding mode and activation are not used.
  A non-finite index, or one beyond int32, is skipped (C leaves it undefined).

The index tensors: float32 (what MediaPipe's kernels require, and real models carry), holding
the index as a float (MediaPipe's CPU kernel adds 0.1 before storing; every consumer truncates,
so exact integers are stored here, as the GPU delegate does); or int32 holding it as an integer,
plain or quantized with scale 1 and zero point 0.

LiteRT has no CPU kernel for these ops: only its XNNPACK delegate (the default resolver) runs
them, with differences measured in tests/test_ops_mediapipe.py: it needs stride == filter,
activation NONE and, for MaxUnpooling2D, VALID padding; it writes the index as a raw uint32
into whatever the index tensor is (a float32 tensor then holds denormal bit patterns), counted
column-major (kx * filter_h + ky), and reads it back the same way, so XNNPACK's pool -> unpool
agrees with MediaPipe's; and with top or left padding (SAME, total padding >= 2) its window
holds copies of the first row/column in the padded slots, so a maximum there gets a padded
slot's index.

The Taichi parts take float32 index tensors (int32 ones, plain or quantized, stay on the CPU:
partition.delegate_reason). MaxPoolingWithArgmax2D is one thread per output element, writing
both outputs; MaxUnpooling2D is a gather, one thread per output element, looking at the input
elements whose window covers it (in NHWC order, the last match wins), as the GPU delegate
does. For an index outside its window, [0, filter_h * filter_w) - which MaxPoolingWithArgmax2D
never writes - the gather drops the element where the reference (MediaPipe's CPU kernel) may
place it in a neighbouring window. No `from __future__ import annotations` here: Taichi reads
the annotations of the ti.func methods below.
"""
import struct
from dataclasses import dataclass

import numpy as np

from tflite_taichi.errors import ModelError

from .base import OpDef, register_op
from .common import PADDING_SAME, PADDING_VALID, positive_ints
from .conv import spatial_geometry, tap_windows
from .kit import ti

TFLITE_PADDING_SAME, TFLITE_PADDING_VALID = 1, 2        # TfLitePadding (C API)
_SCHEMA_PADDING = {TFLITE_PADDING_SAME: PADDING_SAME, TFLITE_PADDING_VALID: PADDING_VALID}
# TfLiteFusedActivation (C API): 0 none, 1 relu, 2 relu_n1_to_1, 3 relu6, 4 tanh, 5 sign_bit,
# 6 sigmoid. MediaPipe's kernels clamp for the first three and leave values alone otherwise.
ACT_NONE, ACT_RELU, ACT_RELU_N1_TO_1, ACT_RELU6 = 0, 1, 2, 3
_ACT_SIGMOID = 6
_CLAMP = {ACT_RELU: (0.0, None), ACT_RELU_N1_TO_1: (-1.0, 1.0), ACT_RELU6: (0.0, 6.0)}
POOL_PARAMS = struct.Struct("<5i")      # padding, stride_w, stride_h, filter_w, filter_h
FLOAT32_LOWEST = float(np.finfo(np.float32).min)
# A float16 arena (precision='fp16') holds integers exactly up to 2048: larger windows'
# indices would round, so the delegate refuses them.
MAX_FP16_EXACT_INDEX = 2048


@dataclass(frozen=True)
class PoolParams:
    padding: int          # TfLitePadding: 1 SAME, 2 VALID
    stride_h: int
    stride_w: int
    filter_h: int
    filter_w: int
    activation: int = ACT_NONE


def _parse_pool_params(op) -> PoolParams:
    raw = op.custom_options or b""
    if len(raw) < POOL_PARAMS.size:
        raise ModelError(f"op #{op.index} ({op.name}): custom_options must hold a TfLitePoolParams "
                         "(padding, stride_width, stride_height, filter_width, filter_height as "
                         f"int32: at least {POOL_PARAMS.size} bytes), has {len(raw)} bytes")
    padding, stride_w, stride_h, filter_w, filter_h = POOL_PARAMS.unpack_from(raw)
    act = struct.unpack_from("<i", raw, POOL_PARAMS.size)[0] if len(raw) >= 24 else ACT_NONE
    return PoolParams(padding=padding, stride_h=stride_h, stride_w=stride_w, filter_h=filter_h,
                      filter_w=filter_w, activation=act)


def pool_params_bytes(padding: str, stride, filter_size, activation: int = ACT_NONE) -> bytes:
    """custom_options for these ops, as a converter writes them: the whole TfLitePoolParams
    (padding 'SAME' or 'VALID', stride and filter as (h, w), computed padding zero)."""
    code = {"SAME": TFLITE_PADDING_SAME, "VALID": TFLITE_PADDING_VALID}[padding]
    return struct.pack("<6i4i", code, stride[1], stride[0], filter_size[1], filter_size[0],
                       activation, 0, 0, 0, 0)


def _check_params(node):
    o = node.options
    if o.padding not in _SCHEMA_PADDING:
        raise node.fail(f"unknown padding {o.padding} in custom_options (TfLitePadding: "
                        f"{TFLITE_PADDING_SAME} SAME, {TFLITE_PADDING_VALID} VALID)")
    positive_ints(node, "strides", o.stride_h, o.stride_w)
    positive_ints(node, "filter size", o.filter_h, o.filter_w)
    if not 0 <= o.activation <= _ACT_SIGMOID:
        raise node.fail(f"unknown fused activation {o.activation} in custom_options "
                        "(TfLiteFusedActivation: 0 to 6)")


def _require(node, spec, what, rank=4):
    if spec.rank != rank:
        raise node.fail(f"{what} must have rank {rank} (NHWC), has shape {list(spec.shape)}")


def _require_float32(node, spec, what):
    if spec.dtype is None or np.dtype(spec.dtype) != np.float32 or spec.quantization is not None:
        dtype = np.dtype(spec.dtype).name if spec.dtype is not None else "untyped"
        raise node.fail(f"{what} is {dtype}; MediaPipe's op takes float32 values")


def _check_index_tensor(node, spec, what):
    """float32, or int32 (plain, or quantized with scale 1 and zero point 0)."""
    dtype = np.dtype(spec.dtype) if spec.dtype is not None else None
    if dtype == np.float32 and spec.quantization is None:
        return
    if dtype == np.int32:
        q = spec.quantization
        if q is None or (q.scale.size == 1 and float(q.scale[0]) == 1.0
                         and int(q.zero_point[0]) == 0):
            return
        raise node.fail(f"{what} is int32 quantized with scale {q.scale.tolist()} and zero point "
                        f"{q.zero_point.tolist()}; indices are plain integers (scale 1, zero "
                        "point 0)")
    raise node.fail(f"{what} is {dtype.name if dtype is not None else 'untyped'}; indices are "
                    "float32 (as MediaPipe's kernels take them) or int32")


# -- MaxPoolingWithArgmax2D ------------------------------------------------------------------
def _pool_geometry(node):
    o = node.options
    _, in_h, in_w, _ = node.inputs[0].shape
    return spatial_geometry(node, _SCHEMA_PADDING[o.padding], in_h, in_w, o.filter_h,
                            o.filter_w, o.stride_h, o.stride_w)


def _infer_pool(node):
    _check_params(node)
    x = node.inputs[0]
    _require(node, x, "input")
    _require_float32(node, x, "input")
    _require_float32(node, node.outputs[0], "output 0 (values)")
    _check_index_tensor(node, node.outputs[1], "output 1 (indices)")
    n, _, _, c = x.shape
    out_h, out_w, _, _ = _pool_geometry(node)
    return [(n, out_h, out_w, c)] * 2


def _clamp(v, act):
    lo, hi = _CLAMP.get(act, (None, None))
    if lo is not None or hi is not None:
        v = np.clip(v, lo, hi)
    return v


def _reference_pool(node, inputs):
    o = node.options
    x = np.asarray(inputs[0], np.float32)
    out_h, out_w, pad_top, pad_left = _pool_geometry(node)
    best = np.full((x.shape[0], out_h, out_w, x.shape[3]), FLOAT32_LOWEST, np.float32)
    index = np.zeros(best.shape, np.int64)
    # taps in row-major window order; padding (-inf) and NaN never win a strict >
    for i, j, window in tap_windows(x, o.filter_h, o.filter_w, o.stride_h, o.stride_w, 1, 1,
                                    pad_top, pad_left, out_h, out_w, fill=-np.inf):
        better = window > best
        best = np.where(better, window, best)
        index = np.where(better, i * o.filter_w + j, index)
    return [_clamp(best, o.activation), index]


@ti.data_oriented
class MaxPoolArgmaxStep:
    """One thread per output element: the window's taps inside the input, row by row, the
    first strict maximum and its row-major tap index."""

    def __init__(self, x, values, indices, k, s, pad, act):
        self.x, self.values, self.indices = x, values, indices
        _, self.in_h, self.in_w, self.c = x.shape
        self.k_h, self.k_w = k
        self.s_h, self.s_w = s
        self.pad_top, self.pad_left = pad
        lo, hi = _CLAMP.get(act, (None, None))
        self.has_lo, self.has_hi = lo is not None, hi is not None
        self.lo, self.hi = lo or 0.0, hi or 0.0

    @ti.func
    def run(self, arena: ti.template(), weights: ti.template(), io: ti.template()):
        for n, oy, ox, c in ti.ndrange(*self.values.shape):
            best = FLOAT32_LOWEST
            index = 0
            for i in ti.static(range(self.k_h)):
                iy = oy * self.s_h - self.pad_top + i
                if (iy >= 0) and (iy < self.in_h):
                    for j in ti.static(range(self.k_w)):
                        ix = ox * self.s_w - self.pad_left + j
                        if (ix >= 0) and (ix < self.in_w):
                            v = self.x.load(arena, weights, io,
                                            ((n * self.in_h + iy) * self.in_w + ix) * self.c + c)
                            if v > best:
                                best = v
                                index = i * self.k_w + j
            if ti.static(self.has_lo):
                best = ti.max(best, self.lo)
            if ti.static(self.has_hi):
                best = ti.min(best, self.hi)
            flat = ((n * self.values.shape[1] + oy) * self.values.shape[2] + ox) * self.c + c
            self.values.store(arena, io, flat, best)
            self.indices.store(arena, io, flat, ti.cast(index, ti.f32))


def _pool_taichi(node, io):
    o = node.options
    _, _, pad_top, pad_left = _pool_geometry(node)
    return MaxPoolArgmaxStep(io.inputs[0], io.outputs[0], io.outputs[1], (o.filter_h, o.filter_w),
                             (o.stride_h, o.stride_w), (pad_top, pad_left), o.activation)


def _window_supports(node):
    o = node.options
    if o.filter_h * o.filter_w > MAX_FP16_EXACT_INDEX:
        return (f"a {o.filter_h}x{o.filter_w} window: its indices go beyond "
                f"{MAX_FP16_EXACT_INDEX}, which float16 storage does not hold exactly")
    return None


MAX_POOLING_WITH_ARGMAX_2D = register_op(OpDef(
    name="CUSTOM:MaxPoolingWithArgmax2D", infer=_infer_pool, reference=_reference_pool,
    parse=_parse_pool_params, taichi=_pool_taichi, supports=_window_supports, min_inputs=1,
    max_inputs=1))


# -- MaxUnpooling2D --------------------------------------------------------------------------
def _unpool_padding(node):
    """(pad_h, pad_w) as MediaPipe's Prepare computes them: ComputePadding with the unpooled
    size as the 'input' and the pooled size as the 'output'."""
    o = node.options
    _, h, w, _ = node.inputs[0].shape
    pad_h = max(0, ((h - 1) * o.stride_h + o.filter_h - h * o.filter_h) // 2)
    pad_w = max(0, ((w - 1) * o.stride_w + o.filter_w - w * o.filter_w) // 2)
    return pad_h, pad_w


def _infer_unpool(node):
    _check_params(node)
    x, idx = node.inputs
    _require(node, x, "input 0 (values)")
    _require(node, idx, "input 1 (indices)")
    _require_float32(node, x, "input 0 (values)")
    _require_float32(node, node.outputs[0], "the output")
    _check_index_tensor(node, idx, "input 1 (indices)")
    if tuple(idx.shape) != tuple(x.shape):
        raise node.fail(f"indices {list(idx.shape)} must have the values' shape {list(x.shape)}")
    o = node.options
    n, h, w, c = x.shape
    return [(n, h * o.filter_h, w * o.filter_w, c)]


def _truncated_indices(idx):
    """int64 indices as C's float -> int conversion gives them, and where that is defined."""
    idx = np.asarray(idx)
    if idx.dtype.kind in "iu":
        return idx.astype(np.int64), np.ones(idx.shape, bool)
    idx = idx.astype(np.float64)
    ok = np.isfinite(idx) & (np.abs(idx) < 2.0 ** 31)
    return np.trunc(np.where(ok, idx, 0.0)).astype(np.int64), ok


def _reference_unpool(node, inputs):
    o = node.options
    x = np.asarray(inputs[0], np.float32)
    idx, ok = _truncated_indices(inputs[1])
    n, h, w, c = x.shape
    out_h, out_w = h * o.filter_h, w * o.filter_w
    pad_h, pad_w = _unpool_padding(node)
    # C's truncating / and %: the quotient rounds toward zero, the remainder has idx's sign
    dy = np.sign(idx) * (np.abs(idx) // o.filter_w)
    dx = idx - dy * o.filter_w
    b, y, xx, ch = np.indices(x.shape, sparse=True)
    oy = y * o.stride_h - pad_h + dy
    ox = xx * o.stride_w - pad_w + dx
    ok = ok & (oy >= 0) & (oy < out_h) & (ox >= 0) & (ox < out_w)
    target = ((b * out_h + oy) * out_w + ox) * c + ch
    target, values = target[ok], x[ok]               # in NHWC order: the scan order
    out = np.zeros(n * out_h * out_w * c, np.float32)
    # where several land on one place the last wins: first occurrence in the reversed order
    last, first_in_reversed = np.unique(target[::-1], return_index=True)
    out[last] = values[::-1][first_in_reversed]
    return [out.reshape(n, out_h, out_w, c)]


@ti.data_oriented
class MaxUnpoolStep:
    """One thread per output element (n, oy, ox, c): the input elements (y, x) whose window
    covers it, ascending in NHWC order, each matching when its index truncates to the output's
    tap position in that window; the last match wins (MediaPipe's scan order), else 0."""

    def __init__(self, x, idx, out, k, s, pad):
        self.x, self.idx, self.out = x, idx, out
        _, self.in_h, self.in_w, self.c = x.shape
        self.k_h, self.k_w = k
        self.s_h, self.s_w = s
        self.pad_h, self.pad_w = pad
        # input rows (columns) whose window covers one output row (column): at most this many
        self.n_y = -(-self.k_h // self.s_h)
        self.n_x = -(-self.k_w // self.s_w)

    @ti.func
    def run(self, arena: ti.template(), weights: ti.template(), io: ti.template()):
        for n, oy, ox, c in ti.ndrange(*self.out.shape):
            r = 0.0
            # the last input row (column) whose window starts at or before oy (ox)
            top_y = (oy + self.pad_h) // self.s_h
            top_x = (ox + self.pad_w) // self.s_w
            for a in ti.static(range(self.n_y)):
                y = top_y - (self.n_y - 1 - a)          # ascending
                ky = oy + self.pad_h - y * self.s_h
                if (y >= 0) and (y < self.in_h):
                    if ky < self.k_h:
                        for b in ti.static(range(self.n_x)):
                            x = top_x - (self.n_x - 1 - b)
                            kx = ox + self.pad_w - x * self.s_w
                            if (x >= 0) and (x < self.in_w):
                                if kx < self.k_w:
                                    flat = ((n * self.in_h + y) * self.in_w + x) * self.c + c
                                    t = ti.cast(ky * self.k_w + kx, ti.f32)
                                    v = self.idx.load(arena, weights, io, flat)
                                    # trunc(v) == t without converting v (NaN and inf never
                                    # match): t <= v < t + 1, or -1 < v < 1 for t = 0
                                    if v < t + 1.0:
                                        if t > 0.0:
                                            if v >= t:
                                                r = self.x.load(arena, weights, io, flat)
                                        elif v > -1.0:
                                            r = self.x.load(arena, weights, io, flat)
            flat_out = ((n * self.out.shape[1] + oy) * self.out.shape[2] + ox) * self.c + c
            self.out.store(arena, io, flat_out, r)


def _unpool_taichi(node, io):
    o = node.options
    return MaxUnpoolStep(io.inputs[0], io.inputs[1], io.outputs[0], (o.filter_h, o.filter_w),
                         (o.stride_h, o.stride_w), _unpool_padding(node))


MAX_UNPOOLING_2D = register_op(OpDef(
    name="CUSTOM:MaxUnpooling2D", infer=_infer_unpool, reference=_reference_unpool,
    parse=_parse_pool_params, taichi=_unpool_taichi, supports=_window_supports, min_inputs=2,
    max_inputs=2))

__all__ = ["MAX_POOLING_WITH_ARGMAX_2D", "MAX_UNPOOLING_2D", "pool_params_bytes"]
