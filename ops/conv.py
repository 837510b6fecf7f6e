"""Convolutions and the fully-connected layer: CONV_2D (grouped too), DEPTHWISE_CONV_2D,
TRANSPOSE_CONV, FULLY_CONNECTED.

All are im2col + matmul on the float view: `extract_patches` gathers, for each of the (few)
kernel taps, the strided slice of the zero-padded input it sees, and one einsum contracts the
patches with the filter. Zero padding is exact for quantized tensors too (the float view of the
input's zero point is 0.0). `extract_patches` and `spatial_geometry` are shared with pooling.py.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .base import OpDef, register_op
from .common import (PADDING_SAME, PADDING_VALID, apply_activation,
                     check_activation, check_padding, conv_output_size, conv_padding_before,
                     positive_ints)

_PADDING_NAMES = {PADDING_SAME: "SAME", PADDING_VALID: "VALID"}


# -- shared helpers (also used by pooling.py) ------------------------------------------------
def spatial_geometry(node, padding, in_h, in_w, k_h, k_w, s_h, s_w, d_h=1, d_w=1):
    """(out_h, out_w, pad_top, pad_left) as TFLite computes them; ModelError when a VALID
    window does not fit in the input."""
    out_h = conv_output_size(padding, in_h, k_h, s_h, d_h)
    out_w = conv_output_size(padding, in_w, k_w, s_w, d_w)
    if out_h < 1 or out_w < 1:
        eff_h, eff_w = (k_h - 1) * d_h + 1, (k_w - 1) * d_w + 1
        raise node.fail(f"the {eff_h}x{eff_w} window (filter size with dilation) does not fit "
                        f"in the {in_h}x{in_w} input with {_PADDING_NAMES[padding]} padding")
    pad_top = conv_padding_before(padding, in_h, k_h, s_h, d_h, out_h)
    pad_left = conv_padding_before(padding, in_w, k_w, s_w, d_w, out_w)
    return out_h, out_w, pad_top, pad_left


def extract_patches(x, k_h, k_w, s_h, s_w, d_h, d_w, pad_top, pad_left, out_h, out_w,
                    fill=0.0):
    """im2col on NHWC: [N, out_h, out_w, k_h, k_w, C], where patch (y, x, i, j) is
    x[n, y*s_h - pad_top + i*d_h, x*s_w - pad_left + j*d_w, c], or `fill` outside the input."""
    n, h, w, c = x.shape
    need_h = (out_h - 1) * s_h + (k_h - 1) * d_h + 1
    need_w = (out_w - 1) * s_w + (k_w - 1) * d_w + 1
    pad_bottom = max(need_h - pad_top - h, 0)
    pad_right = max(need_w - pad_left - w, 0)
    xp = np.pad(x, ((0, 0), (pad_top, pad_bottom), (pad_left, pad_right), (0, 0)),
                constant_values=fill)
    patches = np.empty((n, out_h, out_w, k_h, k_w, c), dtype=xp.dtype)
    for i in range(k_h):            # kernel taps only: a small static count
        for j in range(k_w):
            patches[:, :, :, i, j, :] = xp[:, i * d_h: i * d_h + (out_h - 1) * s_h + 1: s_h,
                                           j * d_w: j * d_w + (out_w - 1) * s_w + 1: s_w, :]
    return patches


def _require_rank(node, i, rank, what):
    spec = node.inputs[i]
    if spec.rank != rank:
        raise node.fail(f"{what} must have rank {rank}, has shape {list(spec.shape)}")
    return spec.shape


def _check_bias(node, i, channels):
    spec = node.inputs[i] if i < len(node.inputs) else None
    if spec is None:
        return
    if tuple(spec.shape) != (channels,):
        raise node.fail(f"bias must have shape [{channels}], has {list(spec.shape)}")


def _add_bias(out, bias):
    return out if bias is None else out + np.asarray(bias, out.dtype)


def _float(x):
    x = np.asarray(x)
    return x if x.dtype.kind == "f" else x.astype(np.float32)


# -- CONV_2D ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class ConvOptions:
    padding: int = PADDING_SAME
    stride_h: int = 1
    stride_w: int = 1
    dilation_h: int = 1
    dilation_w: int = 1
    fused_activation_function: int = 0
    depth_multiplier: int = 0          # DEPTHWISE_CONV_2D only


def _parse_conv(opts) -> ConvOptions:
    return ConvOptions(padding=int(opts.Padding()), stride_h=int(opts.StrideH()),
                       stride_w=int(opts.StrideW()), dilation_h=int(opts.DilationHFactor()),
                       dilation_w=int(opts.DilationWFactor()),
                       fused_activation_function=int(opts.FusedActivationFunction()))


def _parse_depthwise(opts) -> ConvOptions:
    return ConvOptions(padding=int(opts.Padding()), stride_h=int(opts.StrideH()),
                       stride_w=int(opts.StrideW()), dilation_h=int(opts.DilationHFactor()),
                       dilation_w=int(opts.DilationWFactor()),
                       fused_activation_function=int(opts.FusedActivationFunction()),
                       depth_multiplier=int(opts.DepthMultiplier()))


def _check_conv_options(node):
    o = node.options
    check_padding(node, o.padding)
    check_activation(node, o.fused_activation_function)
    positive_ints(node, "strides", o.stride_h, o.stride_w)
    positive_ints(node, "dilation factors", o.dilation_h, o.dilation_w)


def _conv_geometry(node, k_h, k_w):
    o = node.options
    _, in_h, in_w, _ = node.inputs[0].shape
    return spatial_geometry(node, o.padding, in_h, in_w, k_h, k_w, o.stride_h, o.stride_w,
                            o.dilation_h, o.dilation_w)


def _infer_conv(node):
    _check_conv_options(node)
    n, _, _, c_in = _require_rank(node, 0, 4, "input")
    c_out, k_h, k_w, c_f = _require_rank(node, 1, 4, "filter")
    if c_f < 1 or c_in % c_f:
        raise node.fail(f"input channels ({c_in}) must be a multiple of the filter's input "
                        f"channels ({c_f})")
    groups = c_in // c_f
    if groups < 1 or c_out % groups:
        raise node.fail(f"output channels ({c_out}) must be a multiple of the number of "
                        f"groups ({groups} = {c_in} input channels / {c_f} per filter)")
    positive_ints(node, "filter size", k_h, k_w)
    _check_bias(node, 2, c_out)
    out_h, out_w, _, _ = _conv_geometry(node, k_h, k_w)
    return [(n, out_h, out_w, c_out)]


def _reference_conv(node, inputs):
    o = node.options
    x, w = _float(inputs[0]), _float(inputs[1])
    bias = inputs[2] if len(inputs) > 2 else None
    c_out, k_h, k_w, c_f = w.shape
    n, _, _, c_in = x.shape
    groups = c_in // c_f
    out_h, out_w, pad_top, pad_left = _conv_geometry(node, k_h, k_w)
    p = extract_patches(x, k_h, k_w, o.stride_h, o.stride_w, o.dilation_h, o.dilation_w,
                        pad_top, pad_left, out_h, out_w)
    p = p.reshape(n, out_h, out_w, k_h, k_w, groups, c_f)
    wg = w.reshape(groups, c_out // groups, k_h, k_w, c_f)
    out = np.einsum("nyxijgc,goijc->nyxgo", p, wg, optimize=True)
    out = _add_bias(out.reshape(n, out_h, out_w, c_out), bias)
    return [apply_activation(out, o.fused_activation_function)]


CONV_2D = register_op(OpDef(
    name="CONV_2D", infer=_infer_conv, reference=_reference_conv, parse=_parse_conv,
    options_class="Conv2DOptions", min_inputs=2, max_inputs=3))


# -- DEPTHWISE_CONV_2D -------------------------------------------------------------------------
def _infer_depthwise(node):
    _check_conv_options(node)
    n, _, _, c_in = _require_rank(node, 0, 4, "input")
    one, k_h, k_w, c_out = _require_rank(node, 1, 4, "filter")
    if one != 1:
        raise node.fail(f"filter must have shape [1, H, W, C*M], has {list(node.inputs[1].shape)}")
    positive_ints(node, "filter size", k_h, k_w)
    if c_in < 1 or c_out % c_in:
        raise node.fail(f"filter channels ({c_out}) must be a multiple of the input channels "
                        f"({c_in})")
    # The depth multiplier is c_out / c_in. Like LiteRT, the options' depth_multiplier is not
    # checked: converters have written inconsistent values, and LiteRT derives it from shapes.
    _check_bias(node, 2, c_out)
    out_h, out_w, _, _ = _conv_geometry(node, k_h, k_w)
    return [(n, out_h, out_w, c_out)]


def _reference_depthwise(node, inputs):
    o = node.options
    x, w = _float(inputs[0]), _float(inputs[1])
    bias = inputs[2] if len(inputs) > 2 else None
    _, k_h, k_w, c_out = w.shape
    n, _, _, c_in = x.shape
    mult = c_out // c_in
    out_h, out_w, pad_top, pad_left = _conv_geometry(node, k_h, k_w)
    p = extract_patches(x, k_h, k_w, o.stride_h, o.stride_w, o.dilation_h, o.dilation_w,
                        pad_top, pad_left, out_h, out_w)
    # output channel c*mult + m reads input channel c
    out = np.einsum("nyxijc,ijcm->nyxcm", p, w.reshape(k_h, k_w, c_in, mult), optimize=True)
    out = _add_bias(out.reshape(n, out_h, out_w, c_out), bias)
    return [apply_activation(out, o.fused_activation_function)]


DEPTHWISE_CONV_2D = register_op(OpDef(
    name="DEPTHWISE_CONV_2D", infer=_infer_depthwise, reference=_reference_depthwise,
    parse=_parse_depthwise, options_class="DepthwiseConv2DOptions", min_inputs=2,
    max_inputs=3))


# -- TRANSPOSE_CONV ----------------------------------------------------------------------------
@dataclass(frozen=True)
class TransposeConvOptions:
    padding: int = PADDING_SAME
    stride_h: int = 1
    stride_w: int = 1
    fused_activation_function: int = 0


def _parse_transpose_conv(opts) -> TransposeConvOptions:
    return TransposeConvOptions(padding=int(opts.Padding()), stride_h=int(opts.StrideH()),
                                stride_w=int(opts.StrideW()),
                                fused_activation_function=int(opts.FusedActivationFunction()))


def _transpose_conv_padding(node, out_h, out_w, k_h, k_w):
    """TFLite pads a transpose conv as the forward conv from its output back to its input:
    ComputePaddingHeightWidth on the output's size (dilation 1), offset dropped."""
    o = node.options
    fwd_h = conv_output_size(o.padding, out_h, k_h, o.stride_h)
    fwd_w = conv_output_size(o.padding, out_w, k_w, o.stride_w)
    return (conv_padding_before(o.padding, out_h, k_h, o.stride_h, 1, fwd_h),
            conv_padding_before(o.padding, out_w, k_w, o.stride_w, 1, fwd_w))


def _infer_transpose_conv(node):
    o = node.options
    check_padding(node, o.padding)
    check_activation(node, o.fused_activation_function)
    positive_ints(node, "strides", o.stride_h, o.stride_w)
    shape_spec = node.inputs[0]
    if shape_spec.dtype is not None and np.dtype(shape_spec.dtype) != np.int32:
        raise node.fail(f"output_shape must be int32, is {np.dtype(shape_spec.dtype)}")
    out_shape = np.asarray(node.input_value(0, "output_shape")).reshape(-1)
    if out_shape.size != 4:
        raise node.fail(f"output_shape must hold 4 values (NHWC), holds {out_shape.tolist()}")
    out_shape = tuple(int(d) for d in out_shape)
    c_out, k_h, k_w, c_w = _require_rank(node, 1, 4, "weights")
    n, _, _, c_in = _require_rank(node, 2, 4, "input")
    positive_ints(node, "weights size", k_h, k_w)
    if c_in != c_w:
        raise node.fail(f"input channels ({c_in}) != the weights' input channels ({c_w})")
    if out_shape[0] != n or out_shape[3] != c_out or min(out_shape) < 1:
        raise node.fail(f"output_shape {list(out_shape)} does not match batch {n} and "
                        f"{c_out} output channels")
    _check_bias(node, 3, c_out)
    # LiteRT requires the input to be what the forward conv of output_shape would produce.
    _, in_h, in_w, _ = node.inputs[2].shape
    want = (conv_output_size(o.padding, out_shape[1], k_h, o.stride_h),
            conv_output_size(o.padding, out_shape[2], k_w, o.stride_w))
    if (in_h, in_w) != want:
        raise node.fail(f"input is {in_h}x{in_w}, but a {_PADDING_NAMES[o.padding]} "
                        f"{k_h}x{k_w} stride {o.stride_h}x{o.stride_w} convolution of the "
                        f"{out_shape[1]}x{out_shape[2]} output_shape gives {want[0]}x{want[1]}")
    return [out_shape]


def _reference_transpose_conv(node, inputs):
    o = node.options
    w, x = _float(inputs[1]), _float(inputs[2])
    bias = inputs[3] if len(inputs) > 3 else None
    n, out_h, out_w, c_out = node.outputs[0].shape
    _, k_h, k_w, _ = w.shape
    _, in_h, in_w, _ = x.shape
    s_h, s_w = o.stride_h, o.stride_w
    pad_top, pad_left = _transpose_conv_padding(node, out_h, out_w, k_h, k_w)
    # every input pixel times every tap, then scattered onto a canvas holding the whole
    # (uncropped) output; the output is the canvas shifted by the padding
    contrib = np.einsum("nyxc,oijc->nyxijo", x, w, optimize=True)
    full_h = max((in_h - 1) * s_h + k_h, pad_top + out_h)
    full_w = max((in_w - 1) * s_w + k_w, pad_left + out_w)
    canvas = np.zeros((n, full_h, full_w, c_out), dtype=contrib.dtype)
    for i in range(k_h):            # kernel taps only
        for j in range(k_w):
            canvas[:, i: i + (in_h - 1) * s_h + 1: s_h,
                   j: j + (in_w - 1) * s_w + 1: s_w, :] += contrib[:, :, :, i, j, :]
    out = canvas[:, pad_top: pad_top + out_h, pad_left: pad_left + out_w, :]
    out = _add_bias(out, bias)
    return [apply_activation(out, o.fused_activation_function)]


TRANSPOSE_CONV = register_op(OpDef(
    name="TRANSPOSE_CONV", infer=_infer_transpose_conv, reference=_reference_transpose_conv,
    parse=_parse_transpose_conv, options_class="TransposeConvOptions", min_inputs=3,
    max_inputs=4))


# -- FULLY_CONNECTED ---------------------------------------------------------------------------
WEIGHTS_FORMAT_DEFAULT = 0
_WEIGHTS_FORMAT_NAMES = {0: "DEFAULT", 1: "SHUFFLED4x16INT8"}


@dataclass(frozen=True)
class FullyConnectedOptions:
    fused_activation_function: int = 0
    weights_format: int = WEIGHTS_FORMAT_DEFAULT
    keep_num_dims: bool = False


def _parse_fully_connected(opts) -> FullyConnectedOptions:
    return FullyConnectedOptions(fused_activation_function=int(opts.FusedActivationFunction()),
                                 weights_format=int(opts.WeightsFormat()),
                                 keep_num_dims=bool(opts.KeepNumDims()))


def _infer_fully_connected(node):
    o = node.options
    check_activation(node, o.fused_activation_function)
    if o.weights_format != WEIGHTS_FORMAT_DEFAULT:
        name = _WEIGHTS_FORMAT_NAMES.get(o.weights_format, str(o.weights_format))
        raise node.fail(f"weights_format {name} is not supported (only DEFAULT)")
    in_shape = tuple(node.inputs[0].shape)
    units, depth = _require_rank(node, 1, 2, "weights")
    _check_bias(node, 2, units)
    size = int(np.prod(in_shape, dtype=np.int64))
    if depth < 1 or not in_shape or size % depth:
        raise node.fail(f"input of shape {list(in_shape)} cannot be read as rows of {depth} "
                        "(the weights' second dimension)")
    if o.keep_num_dims:
        if in_shape[-1] != depth:
            raise node.fail(f"keep_num_dims needs the input's last dimension ({in_shape[-1]}) "
                            f"to equal the weights' second dimension ({depth})")
        return [in_shape[:-1] + (units,)]
    return [(size // depth, units)]


def _reference_fully_connected(node, inputs):
    x, w = _float(inputs[0]), _float(inputs[1])
    bias = inputs[2] if len(inputs) > 2 else None
    units, depth = w.shape
    out = _add_bias(x.reshape(-1, depth) @ w.T, bias)
    out = apply_activation(out, node.options.fused_activation_function)
    return [out.reshape(node.outputs[0].shape)]


FULLY_CONNECTED = register_op(OpDef(
    name="FULLY_CONNECTED", infer=_infer_fully_connected, reference=_reference_fully_connected,
    parse=_parse_fully_connected, options_class="FullyConnectedOptions", min_inputs=2,
    max_inputs=3))

__all__ = ["CONV_2D", "DEPTHWISE_CONV_2D", "TRANSPOSE_CONV", "FULLY_CONNECTED",
           "extract_patches", "spatial_geometry"]
