"""2-D pooling: AVERAGE_POOL_2D, MAX_POOL_2D and L2_POOL_2D (NHWC, SAME/VALID, fused activation).

Windows come from conv.py's `tap_windows` (strided views, no im2col). Padding never takes part: MAX_POOL_2D
pads with -inf, and AVERAGE_POOL_2D divides each window's sum by the number of input elements
it covers (TFLite's filter_count), not by the filter area. L2_POOL_2D is
sqrt(sum of squares / filter_count) over the same taps (reference_ops::L2Pool), then the fused
activation; LiteRT has it for float32 only, and so does this (any other dtype is a ModelError).
The reference sums windows in float64 and rounds once (as MEAN does): TFLite's reference kernel's
float32 running sum is tens of ulps off over a global pool, further than LiteRT's XNNPACK path.

The Taichi part is one thread per output element with a serial loop over the window's taps
inside the input; a global average or max pool (one output position whose window covers the
input) is reduce.py's split reduction over H and W instead (L2 has no such reduction there:
it stays one thread per output). No `from __future__ import annotations`: Taichi reads the ti.func annotations.
"""
from dataclasses import dataclass

import numpy as np

from .base import Fusion, OpDef, register_op
from .common import (PADDING_SAME, apply_activation, check_activation, check_padding,
                     positive_ints)
from .conv import spatial_geometry, tap_windows
from .reduce import MAX_CODE, MEAN_CODE, ReduceStep, reduce_scratch_size
from .kit import activation, nan_max, ti


@dataclass(frozen=True)
class PoolOptions:
    padding: int = PADDING_SAME
    stride_h: int = 1
    stride_w: int = 1
    filter_h: int = 1
    filter_w: int = 1
    fused_activation_function: int = 0


def _parse_pool(opts) -> PoolOptions:
    return PoolOptions(padding=int(opts.Padding()), stride_h=int(opts.StrideH()),
                       stride_w=int(opts.StrideW()), filter_h=int(opts.FilterHeight()),
                       filter_w=int(opts.FilterWidth()),
                       fused_activation_function=int(opts.FusedActivationFunction()))


def _geometry(node):
    o = node.options
    _, in_h, in_w, _ = node.inputs[0].shape
    return spatial_geometry(node, o.padding, in_h, in_w, o.filter_h, o.filter_w,
                            o.stride_h, o.stride_w)


def _infer_pool(node):
    o = node.options
    check_padding(node, o.padding)
    check_activation(node, o.fused_activation_function)
    positive_ints(node, "strides", o.stride_h, o.stride_w)
    positive_ints(node, "filter size", o.filter_h, o.filter_w)
    spec = node.inputs[0]
    if spec.rank != 4:
        raise node.fail(f"input must have rank 4 (NHWC), has shape {list(spec.shape)}")
    if spec.dtype is not None and np.dtype(spec.dtype).kind not in "fiu":
        raise node.fail(f"input '{spec.name}' is {np.dtype(spec.dtype).name}; pooling takes "
                        "float or integer tensors")
    if node.op == "L2_POOL_2D":
        for t in (spec, node.outputs[0]):
            if t.dtype is not None and np.dtype(t.dtype) != np.float32:
                raise node.fail(f"'{t.name}' is {np.dtype(t.dtype).name}; L2_POOL_2D takes and "
                                "gives float32 only (as LiteRT's kernel)")
    n, _, _, c = spec.shape
    out_h, out_w, _, _ = _geometry(node)
    return [(n, out_h, out_w, c)]


def _window_reduce(node, x, fill, combine, accumulate=None):
    """Each window of x reduced with `combine` (np.add / np.maximum) into [N, out_h, out_w, C],
    without materialising the patches: a loop over the taps (each a strided view of the padded
    input) or, when windows are larger than the output (a global pool), over the outputs.
    `accumulate`: the dtype the reduction runs in (None: x's), numpy casting each tap or block
    as it goes rather than copying x."""
    o = node.options
    out_h, out_w, pad_top, pad_left = _geometry(node)
    dtype = x.dtype if accumulate is None else np.dtype(accumulate)
    if o.filter_h * o.filter_w <= out_h * out_w:
        out = None
        for _, _, window in tap_windows(x, o.filter_h, o.filter_w, o.stride_h, o.stride_w, 1, 1,
                                        pad_top, pad_left, out_h, out_w, fill=fill):
            out = window.astype(dtype) if out is None else combine(out, window, out=out)
        return out
    n, h, w, c = x.shape
    out = np.empty((n, out_h, out_w, c), dtype=dtype)
    for oy in range(out_h):
        y0, y1 = max(oy * o.stride_h - pad_top, 0), min(oy * o.stride_h - pad_top + o.filter_h, h)
        for ox in range(out_w):
            x0, x1 = max(ox * o.stride_w - pad_left, 0), min(ox * o.stride_w - pad_left + o.filter_w, w)
            block = x[:, y0:y1, x0:x1, :]
            # padding takes no part in a window's max, and adds 0 to its sum (fill), as above
            out[:, oy, ox, :] = (combine.reduce(block.reshape(n, -1, c), axis=1, dtype=dtype)
                                 if block.size else fill)
    return out


def _window_mean(node, x):
    """Each window's sum over the number of its taps inside the input (TFLite's filter_count),
    summed in float64 and rounded to x's type once, as MEAN does (reduce.py): a float32 running
    sum over a global pool's 128x128 taps drifts by tens of ulps (selfie_segmentation's
    squeeze-excite pools), further from the exact mean than LiteRT's own kernels are."""
    total = _window_reduce(node, x, 0.0, np.add, accumulate=np.float64)
    # elements of each window inside the input (the same for every batch and channel)
    count = _window_reduce(node, np.ones((1,) + x.shape[1:3] + (1,), np.float64), 0.0, np.add)
    return (total / count).astype(x.dtype)


def _reference_average(node, inputs):
    x = np.asarray(inputs[0])
    x = x if x.dtype.kind == "f" else x.astype(np.float32)
    return [apply_activation(_window_mean(node, x), node.options.fused_activation_function)]


def _reference_l2(node, inputs):
    x = np.asarray(inputs[0], np.float32)
    return [apply_activation(np.sqrt(_window_mean(node, x * x)), node.options.fused_activation_function)]


def _reference_max(node, inputs):
    x = np.asarray(inputs[0])
    fill = -np.inf if x.dtype.kind == "f" else np.iinfo(x.dtype).min
    out = _window_reduce(node, x, fill, np.maximum)
    return [apply_activation(out, node.options.fused_activation_function)]


# -- Taichi ----------------------------------------------------------------------------------
POOL_AVERAGE, POOL_MAX, POOL_L2 = 0, 1, 2
_POOL_KINDS = {"AVERAGE_POOL_2D": POOL_AVERAGE, "MAX_POOL_2D": POOL_MAX, "L2_POOL_2D": POOL_L2}


@ti.data_oriented
class PoolStep:
    """One thread per output element; the window's taps inside the input only (SAME padding
    never takes part): the max of them, their sum divided by how many there are, or the root
    of their squares' sum divided by how many there are (L2)."""

    def __init__(self, x, out, k, s, pad, act, kind):
        self.x, self.out = x, out
        _, self.in_h, self.in_w, self.c = x.shape
        self.k_h, self.k_w = k
        self.s_h, self.s_w = s
        self.pad_top, self.pad_left = pad
        self.act, self.kind = act, kind
        self.is_max = kind == POOL_MAX

    @ti.func
    def run(self, arena: ti.template(), weights: ti.template(), io: ti.template()):
        for n, oy, ox, c in ti.ndrange(*self.out.shape):
            acc = 0.0
            if ti.static(self.is_max):
                acc = -3.4028234663852886e38      # every window holds at least one input tap
            count = 0
            for i in range(self.k_h):
                iy = oy * self.s_h - self.pad_top + i
                if (iy >= 0) and (iy < self.in_h):
                    for j in range(self.k_w):
                        ix = ox * self.s_w - self.pad_left + j
                        if (ix >= 0) and (ix < self.in_w):
                            v = self.x.load(arena, weights, io,
                                            ((n * self.in_h + iy) * self.in_w + ix) * self.c + c)
                            if ti.static(self.is_max):
                                acc = nan_max(acc, v)       # NaN propagates, as np.max
                            elif ti.static(self.kind == POOL_L2):
                                acc += v * v
                            else:
                                acc += v
                            count += 1
            if ti.static(self.kind == POOL_AVERAGE):
                acc = acc / ti.cast(count, ti.f32)
            elif ti.static(self.kind == POOL_L2):
                acc = ti.sqrt(acc / ti.cast(count, ti.f32))
            flat = ((n * self.out.shape[1] + oy) * self.out.shape[2] + ox) * self.c + c
            self.out.store(arena, io, flat, activation(acc, self.act))


def _global(node):
    """Whether the one output position's window covers the whole input (a global pool:
    squeeze-excite blocks, classifier heads), and so is a reduction over H and W."""
    o = node.options
    if node.op == "L2_POOL_2D":         # reduce.py has no sum of squares
        return False
    out_h, out_w, pad_top, pad_left = _geometry(node)
    _, in_h, in_w, _ = node.inputs[0].shape
    # the window spans input rows -pad_top .. filter_h - 1 - pad_top (pad_top >= 0)
    return (out_h == 1 and out_w == 1
            and o.filter_h - pad_top >= in_h and o.filter_w - pad_left >= in_w)


def _pool_scratch(node) -> int:
    if not _global(node):
        return 0
    n, in_h, in_w, c = node.inputs[0].shape
    return reduce_scratch_size(n * c, in_h * in_w)


def _pool_taichi(node, io):
    o = node.options
    if _global(node):
        # one thread per output walked 128x128 taps alone (selfie_segmentation's squeeze-excite
        # pools: 142 us each on the H200); as a split reduction the taps spread over threads
        code = MAX_CODE if node.op == "MAX_POOL_2D" else MEAN_CODE
        return ReduceStep(code, io.inputs[0], io.outputs[0], (1, 2), io.scratch,
                          act=o.fused_activation_function)
    _, _, pad_top, pad_left = _geometry(node)
    return PoolStep(io.inputs[0], io.outputs[0], (o.filter_h, o.filter_w),
                    (o.stride_h, o.stride_w), (pad_top, pad_left), o.fused_activation_function,
                    kind=_POOL_KINDS[node.op])


# numpy_faster_on_cpu: without a hardware GPU, backend='auto' keeps AVERAGE and MAX pooling on
# numpy, which ran them faster than Taichi's cpu backend: measured per op on the shared models,
# bench/results/cpu_2core.md (L2_POOL_2D was not in the measured set: it stays on Taichi).
AVERAGE_POOL_2D = register_op(OpDef(
    name="AVERAGE_POOL_2D", infer=_infer_pool, reference=_reference_average, parse=_parse_pool,
    options_class="Pool2DOptions", taichi=_pool_taichi, scratch=_pool_scratch, min_inputs=1,
    max_inputs=1, fusion=Fusion(stores_once=True), numpy_faster_on_cpu=True))

MAX_POOL_2D = register_op(OpDef(
    name="MAX_POOL_2D", infer=_infer_pool, reference=_reference_max, parse=_parse_pool,
    options_class="Pool2DOptions", taichi=_pool_taichi, scratch=_pool_scratch, min_inputs=1,
    max_inputs=1, fusion=Fusion(stores_once=True), numpy_faster_on_cpu=True))

L2_POOL_2D = register_op(OpDef(
    name="L2_POOL_2D", infer=_infer_pool, reference=_reference_l2, parse=_parse_pool,
    options_class="Pool2DOptions", taichi=_pool_taichi, scratch=_pool_scratch, min_inputs=1,
    max_inputs=1, fusion=Fusion(stores_once=True)))
