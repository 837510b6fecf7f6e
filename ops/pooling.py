"""2-D pooling: AVERAGE_POOL_2D and MAX_POOL_2D (NHWC, SAME/VALID, fused activation).

Windows come from conv.py's `extract_patches` (im2col). Padding never takes part: MAX_POOL_2D
pads with -inf, and AVERAGE_POOL_2D divides each window's sum by the number of input elements
it covers (TFLite's filter_count), not by the filter area.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .base import OpDef, register_op
from .common import (PADDING_SAME, apply_activation, check_activation, check_padding,
                     positive_ints)
from .conv import extract_patches, spatial_geometry


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
    n, _, _, c = spec.shape
    out_h, out_w, _, _ = _geometry(node)
    return [(n, out_h, out_w, c)]


def _windows(node, x, fill):
    o = node.options
    out_h, out_w, pad_top, pad_left = _geometry(node)
    return extract_patches(x, o.filter_h, o.filter_w, o.stride_h, o.stride_w, 1, 1,
                           pad_top, pad_left, out_h, out_w, fill=fill)


def _reference_average(node, inputs):
    x = np.asarray(inputs[0])
    x = x if x.dtype.kind == "f" else x.astype(np.float32)
    total = _windows(node, x, 0.0).sum(axis=(3, 4))
    # elements of each window inside the input (the same for every batch and channel)
    count = _windows(node, np.ones((1,) + x.shape[1:3] + (1,), x.dtype), 0.0).sum(axis=(3, 4))
    return [apply_activation(total / count, node.options.fused_activation_function)]


def _reference_max(node, inputs):
    x = np.asarray(inputs[0])
    fill = -np.inf if x.dtype.kind == "f" else np.iinfo(x.dtype).min
    out = _windows(node, x, fill).max(axis=(3, 4))
    return [apply_activation(out, node.options.fused_activation_function)]


AVERAGE_POOL_2D = register_op(OpDef(
    name="AVERAGE_POOL_2D", infer=_infer_pool, reference=_reference_average, parse=_parse_pool,
    options_class="Pool2DOptions", min_inputs=1, max_inputs=1))

MAX_POOL_2D = register_op(OpDef(
    name="MAX_POOL_2D", infer=_infer_pool, reference=_reference_max, parse=_parse_pool,
    options_class="Pool2DOptions", min_inputs=1, max_inputs=1))
