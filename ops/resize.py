"""Spatial resizes of NHWC tensors: RESIZE_BILINEAR and RESIZE_NEAREST_NEIGHBOR.

The second input is a constant int32 [new_height, new_width]. Both ops take align_corners and
half_pixel_centers and follow TFLite's reference kernels' coordinate rules exactly, in float32
as they compute them. RESIZE_BILINEAR refuses both flags at once, as LiteRT does;
RESIZE_NEAREST_NEIGHBOR accepts them together, as LiteRT's kernel does (its formula below
then rounds (dst + 0.5) * scale with the align_corners scale).

- scale = in / out, or (in - 1) / (out - 1) with align_corners and out > 1;
- bilinear: src = (dst + 0.5) * scale - 0.5 with half_pixel_centers, else dst * scale;
  low = max(floor(src), 0) (the top-left index is clamped at 0, and its weight src - low then
  goes negative, which is harmless because both taps are then the same pixel),
  high = min(ceil(src), in - 1); the output mixes the four taps with weights from src - low.
  LiteRT's int8 and int16 kernels compute the same with coordinates in 10-bit fixed point
  (scale_10 = round(1024 * scale)); for those inputs the reference uses these coordinates,
  so the float view matches them to the final rounding (float coordinates would be off by up
  to 10 int8 units, hundreds of int16 units, on 30 -> 80 resizes).
- nearest: src = (dst + offset) * scale with offset 0.5 when half_pixel_centers;
  round half away from zero with align_corners, floor otherwise; then min(src, in - 1) and,
  with half_pixel_centers, max(src, 0).
"""
from dataclasses import dataclass

import numpy as np

from .base import Fusion, OpDef, register_op
from .kit import ti


# Input types whose RESIZE_BILINEAR kernel in LiteRT works in 10-bit fixed-point coordinates
# (uint8 and float use float coordinates).
FIXED_POINT_TYPES = (np.dtype(np.int8), np.dtype(np.int16))


@dataclass(frozen=True)
class ResizeOptions:
    align_corners: bool = False
    half_pixel_centers: bool = False


def _parse(opts) -> ResizeOptions:
    return ResizeOptions(bool(opts.AlignCorners()), bool(opts.HalfPixelCenters()))


def _size(node) -> tuple:
    spec = node.inputs[1]
    if np.dtype(spec.dtype) != np.int32:
        raise node.fail(f"size must be an int32 tensor, got {np.dtype(spec.dtype).name}")
    if spec.shape != (2,):
        raise node.fail(f"size must have shape [2] (new_height, new_width), got {list(spec.shape)}")
    h, w = (int(v) for v in node.input_value(1, "size").reshape(-1))
    if h < 1 or w < 1:
        raise node.fail(f"size must be positive, got [{h}, {w}]")
    return h, w


def _infer_bilinear(node):
    opts = node.options
    if opts.align_corners and opts.half_pixel_centers:
        raise node.fail("align_corners and half_pixel_centers cannot both be true")
    return _infer(node)


def _infer(node):
    x = node.inputs[0]
    if x.rank != 4:
        raise node.fail(f"input must have rank 4 (NHWC), got shape {list(x.shape)}")
    h, w = _size(node)
    if (x.shape[1] == 0 or x.shape[2] == 0) and h * w > 0 and x.shape[0] * x.shape[3] > 0:
        raise node.fail(f"cannot resize an empty image (input shape {list(x.shape)}) to {h}x{w}")
    return [(x.shape[0], h, w, x.shape[3])]


def _scale(in_size: int, out_size: int, align_corners: bool) -> np.float32:
    if align_corners and out_size > 1:
        return np.float32(in_size - 1) / np.float32(out_size - 1)
    return np.float32(in_size) / np.float32(out_size)


def _bilinear_taps(in_size, out_size, opts):
    """Per output index along one axis: (low index, high index, weight of high) in float32."""
    scale = _scale(in_size, out_size, opts.align_corners)
    dst = np.arange(out_size, dtype=np.float32)
    if opts.half_pixel_centers:
        src = (dst + np.float32(0.5)) * scale - np.float32(0.5)
    else:
        src = dst * scale
    low = np.maximum(np.floor(src), 0).astype(np.int64)
    high = np.minimum(np.ceil(src), in_size - 1).astype(np.int64)
    return low, high, (src - low.astype(np.float32)).astype(np.float32)


def _bilinear_taps_fixed(in_size, out_size, opts):
    """LiteRT's int8/int16 kernel: the same coordinates with 1/1024 resolution, in integers."""
    if opts.align_corners and out_size > 1:
        scale_10 = ((in_size - 1) * 1024 + (out_size - 1) // 2) // (out_size - 1)
    else:
        scale_10 = (in_size * 1024 + out_size // 2) // out_size
    dst = np.arange(out_size, dtype=np.int64)
    src = dst * scale_10
    if opts.half_pixel_centers:
        src = src + scale_10 // 2 - 512
    # C++ integer division truncates toward zero; src > -1024 here, so both clamps agree with it.
    # The upper clamp of `low` is ours: the rounded-up scale_10 can put the last rows past the
    # input (e.g. 1 -> 55 rows), where LiteRT's kernel reads out of bounds.
    low = np.clip(np.trunc(src / 1024), 0, in_size - 1).astype(np.int64)
    high = np.minimum(np.trunc((src + 1023) / 1024), in_size - 1).astype(np.int64)
    return low, high, ((src - 1024 * low) / 1024.0).astype(np.float32)


def _bilinear(node, inputs):
    x = np.asarray(inputs[0])
    _, out_h, out_w, _ = node.outputs[0].shape
    opts = node.options
    taps = (_bilinear_taps_fixed if np.dtype(node.inputs[0].dtype) in FIXED_POINT_TYPES
            else _bilinear_taps)
    y0, y1, dy = taps(x.shape[1], out_h, opts)
    x0, x1, dx = taps(x.shape[2], out_w, opts)
    dy = dy.reshape(1, -1, 1, 1)
    dx = dx.reshape(1, 1, -1, 1)
    one = np.float32(1)
    top, bottom = x[:, y0], x[:, y1]
    # The reference kernel's sum, term by term in its order, in float32.
    out = (top[:, :, x0] * (one - dy) * (one - dx)
           + bottom[:, :, x0] * dy * (one - dx)
           + top[:, :, x1] * (one - dy) * dx
           + bottom[:, :, x1] * dy * dx)
    return [out.astype(x.dtype, copy=False)]


def _nearest_index(in_size, out_size, opts):
    scale = _scale(in_size, out_size, opts.align_corners)
    offset = np.float32(0.5 if opts.half_pixel_centers else 0.0)
    src = (np.arange(out_size, dtype=np.float32) + offset) * scale
    if opts.align_corners:
        # TfLiteRound (std::round, half away from zero; src >= 0). floor(src + 0.5) would
        # round 0.49999997 up: the float32 sum is inexact there, src - floor(src) never is.
        low = np.floor(src)
        src = np.where(src - low >= np.float32(0.5), low + np.float32(1), low)
    else:
        src = np.floor(src)
    idx = np.minimum(src.astype(np.int64), in_size - 1)
    if opts.half_pixel_centers:
        idx = np.maximum(idx, 0)
    return idx


def _nearest(node, inputs):
    x = np.asarray(inputs[0])
    _, out_h, out_w, _ = node.outputs[0].shape
    iy = _nearest_index(x.shape[1], out_h, node.options)
    ix = _nearest_index(x.shape[2], out_w, node.options)
    return [x[:, iy][:, :, ix]]


# -- Taichi ----------------------------------------------------------------------------------
# One thread per output element. Bilinear computes its source coordinates in the kernel with
# the reference's float32 formulas (the scale is a compile-time float32 constant, so no division
# runs on the device; a compiler fusing a multiply-add moves a coordinate by an ulp, which the
# interpolation turns into an ulp-sized change) or, for int8/int16, with its 10-bit fixed-point
# integers, exactly. Nearest picks a pixel, where one ulp can change the answer, so its indices
# come from exact integer arithmetic plus static corrections that reproduce the reference's
# float32 ties (`_nearest_plan`).
@ti.func
def _bilinear_axis(dst, scale: ti.template(), half: ti.template(), in_size: ti.template()):
    """(low, high, weight of high) along one axis, float coordinates."""
    src = ti.cast(dst, ti.f32) * scale
    if ti.static(half):
        src = (ti.cast(dst, ti.f32) + 0.5) * scale - 0.5
    low = ti.max(ti.cast(ti.floor(src), ti.i32), 0)
    high = ti.min(ti.cast(ti.ceil(src), ti.i32), in_size - 1)
    return low, high, src - ti.cast(low, ti.f32)


@ti.func
def _bilinear_axis_fixed(dst, scale_10: ti.template(), half: ti.template(),
                         in_size: ti.template()):
    """(low, high, weight of high) along one axis, 10-bit fixed-point coordinates. src > -1024,
    so floor division agrees with C++'s truncation once clamped at 0."""
    src = dst * scale_10
    if ti.static(half):
        src += scale_10 // 2 - 512
    low = ti.min(ti.max(src // 1024, 0), in_size - 1)
    high = ti.min((src + 1023) // 1024, in_size - 1)
    return low, high, ti.cast(src - 1024 * low, ti.f32) * (1.0 / 1024.0)


@ti.func
def _nearest_axis(dst, a: ti.template(), b: ti.template(), d: ti.template(),
                  fix_at: ti.template(), fix_to: ti.template(), in_size: ti.template()):
    """The reference's index: the exact rational formula in integers, then the few positions
    where the reference's float32 rounding lands on the other side of a tie (`_nearest_plan`)."""
    idx = ti.min((a * dst + b) // d, in_size - 1)
    for k in ti.static(range(len(fix_at))):
        if dst == fix_at[k]:
            idx = fix_to[k]
    return idx


# Above this many float32 rounding corrections along one axis, RESIZE_NEAREST_NEIGHBOR stays
# on the CPU (each is one compare per thread; sizes up to 64 -> 256 need at most 6).
MAX_NEAREST_FIXES = 64


def _nearest_plan(in_size, out_size, opts):
    """The reference's index along one axis as idx = min((a*dst + b) // d, in - 1), exact
    rational arithmetic, plus (position, index) corrections where the reference's float32
    arithmetic lands the other side of an exact tie. With scale p/q and offset o (0 or 1/2):
    floor((dst + o) p / q), or with align_corners round(...) = floor(((dst + o) p + q/2) / q)."""
    table = _nearest_index(in_size, out_size, opts)
    if opts.align_corners and out_size > 1:
        p, q = in_size - 1, out_size - 1
    else:
        p, q = in_size, out_size
    a = 2 * p
    b = (p if opts.half_pixel_centers else 0) + (q if opts.align_corners else 0)
    d = 2 * q
    exact = np.minimum((a * np.arange(out_size, dtype=np.int64) + b) // d, in_size - 1)
    at = np.nonzero(exact != table)[0]
    return a, b, d, tuple(int(i) for i in at), tuple(int(table[i]) for i in at)


def _scale_10(in_size, out_size, align_corners):
    if align_corners and out_size > 1:
        return ((in_size - 1) * 1024 + (out_size - 1) // 2) // (out_size - 1)
    return (in_size * 1024 + out_size // 2) // out_size


@ti.data_oriented
class ResizeStep:
    def __init__(self, bilinear, fixed, x, out, opts):
        self.bilinear, self.fixed, self.x, self.out = bilinear, fixed, x, out
        self.align, self.half = bool(opts.align_corners), bool(opts.half_pixel_centers)
        _, self.in_h, self.in_w, self.c = x.shape
        self.loop = out.shape
        _, out_h, out_w, _ = out.shape
        self.scale_h = float(_scale(self.in_h, out_h, self.align))
        self.scale_w = float(_scale(self.in_w, out_w, self.align))
        self.scale10_h = _scale_10(self.in_h, out_h, self.align)
        self.scale10_w = _scale_10(self.in_w, out_w, self.align)
        if not bilinear:
            self.plan_h = _nearest_plan(self.in_h, out_h, opts)
            self.plan_w = _nearest_plan(self.in_w, out_w, opts)

    @ti.func
    def _pixel(self, arena: ti.template(), weights: ti.template(), io: ti.template(), n, y, x, c):
        s = ti.static(self.x.strides)
        return self.x.load(arena, weights, io, n * s[0] + y * s[1] + x * s[2] + c)

    @ti.func
    def run(self, arena: ti.template(), weights: ti.template(), io: ti.template()):
        for I in ti.grouped(ti.ndrange(*self.loop)):
            n, c = I[0], I[3]
            r = 0.0
            if ti.static(self.bilinear):
                y0, y1, dy, x0, x1, dx = 0, 0, 0.0, 0, 0, 0.0
                if ti.static(self.fixed):
                    y0, y1, dy = _bilinear_axis_fixed(I[1], self.scale10_h, self.half, self.in_h)
                    x0, x1, dx = _bilinear_axis_fixed(I[2], self.scale10_w, self.half, self.in_w)
                else:
                    y0, y1, dy = _bilinear_axis(I[1], self.scale_h, self.half, self.in_h)
                    x0, x1, dx = _bilinear_axis(I[2], self.scale_w, self.half, self.in_w)
                # the reference's sum, term by term in its order
                r = (self._pixel(arena, weights, io, n, y0, x0, c) * (1.0 - dy) * (1.0 - dx)
                     + self._pixel(arena, weights, io, n, y1, x0, c) * dy * (1.0 - dx)
                     + self._pixel(arena, weights, io, n, y0, x1, c) * (1.0 - dy) * dx
                     + self._pixel(arena, weights, io, n, y1, x1, c) * dy * dx)
            else:
                iy = _nearest_axis(I[1], *self.plan_h, self.in_h)
                ix = _nearest_axis(I[2], *self.plan_w, self.in_w)
                r = self._pixel(arena, weights, io, n, iy, ix, c)
            self.out.store(arena, io, self.out.flat_index(I), r)


def _bilinear_taichi(node, io):
    fixed = np.dtype(node.inputs[0].dtype) in FIXED_POINT_TYPES
    return ResizeStep(True, fixed, io.inputs[0], io.outputs[0], node.options)


def _nearest_taichi(node, io):
    return ResizeStep(False, False, io.inputs[0], io.outputs[0], node.options)


def _nearest_supports(node):
    x, out = node.inputs[0].shape, node.outputs[0].shape
    for axis, name in ((1, "height"), (2, "width")):
        fixes = len(_nearest_plan(x[axis], out[axis], node.options)[3])
        if fixes > MAX_NEAREST_FIXES:
            return (f"the {name} resize {x[axis]} -> {out[axis]} needs {fixes} float32 rounding "
                    f"corrections (the delegate takes up to {MAX_NEAREST_FIXES})")
    return None


# numpy_faster_on_cpu: without a hardware GPU, backend='auto' keeps both resizes on numpy, which
# ran them faster than Taichi's cpu backend: measured per op on the shared models,
# bench/results/cpu_2core.md.
RESIZE_BILINEAR = register_op(OpDef(
    name="RESIZE_BILINEAR", infer=_infer_bilinear, reference=_bilinear, parse=_parse,
    options_class="ResizeBilinearOptions", taichi=_bilinear_taichi, min_inputs=2, max_inputs=2,
    fusion=Fusion(stores_once=True),
    numpy_faster_on_cpu=True))

RESIZE_NEAREST_NEIGHBOR = register_op(OpDef(
    name="RESIZE_NEAREST_NEIGHBOR", infer=_infer, reference=_nearest, parse=_parse,
    options_class="ResizeNearestNeighborOptions", taichi=_nearest_taichi,
    supports=_nearest_supports, min_inputs=2, max_inputs=2, fusion=Fusion(stores_once=True),
    numpy_faster_on_cpu=True))
