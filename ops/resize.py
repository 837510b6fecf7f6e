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
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .base import OpDef, register_op


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
        src = np.sign(src) * np.floor(np.abs(src) + np.float32(0.5))   # TfLiteRound
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


RESIZE_BILINEAR = register_op(OpDef(
    name="RESIZE_BILINEAR", infer=_infer_bilinear, reference=_bilinear, parse=_parse,
    options_class="ResizeBilinearOptions", min_inputs=2, max_inputs=2))

RESIZE_NEAREST_NEIGHBOR = register_op(OpDef(
    name="RESIZE_NEAREST_NEIGHBOR", infer=_infer, reference=_nearest, parse=_parse,
    options_class="ResizeNearestNeighborOptions", min_inputs=2, max_inputs=2))
