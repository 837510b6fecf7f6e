"""Convolutions and the fully-connected layer: CONV_2D (grouped too), DEPTHWISE_CONV_2D,
TRANSPOSE_CONV, FULLY_CONNECTED.

The family reads in four parts: here the OpDefs (options, shapes, what the delegate takes, how
constants are packed); reference.py the numpy reference and TFLite's geometry; kernels.py the
Taichi steps; select.py which step, tile shape and split an instance runs with on an arch.

Also MediaPipe's custom op CUSTOM:Convolution2DTransposeBias (a transpose conv whose bias is an
input and whose output size comes from the input size, not an output_shape tensor).

Names other modules import from `ops.conv` (pooling's geometry, the fast-path tests' thresholds)
are re-exported here from the part that defines them.
"""
import struct
from dataclasses import dataclass

import numpy as np

from tflite_taichi.errors import ModelError
from tflite_taichi.quant import is_float_view

from ..base import Fusion, OpDef, register_op
from ..common import (PADDING_SAME, check_activation, check_padding, conv_output_size,
                      positive_ints)
from .kernels import (GEMM_CONFIG, GEMM_K, PIXEL_TILE, ConvStep, FullyConnectedStep,  # noqa: F401
                      GemmTileStep, PointwiseConvStep, SplitKStep, TransposeConvStep,
                      gemm_blocks)
from .reference import (PADDING_NAMES, TFLITE_PADDING_SAME, TFLITE_PADDING_VALID,  # noqa: F401
                        add_bias, as_float, conv_geometry, conv_patches, conv_temp_bytes,
                        extract_patches, reference_conv, reference_depthwise,
                        reference_fully_connected, reference_transpose_conv,
                        reference_transpose_conv_bias, spatial_geometry, tap_windows,
                        transpose_conv, transpose_conv_bias_geometry,
                        transpose_conv_bias_temp_bytes, transpose_conv_padding,
                        transpose_conv_temp_bytes)
from .select import (GEMM_MIN_BLOCKS, SMALL_GRID_ARCHS, SMALL_GRID_CONFIG,  # noqa: F401
                     SMALL_GRID_MIN_BLOCKS, SPLIT_K_MIN_TERMS, SPLIT_K_THREADS, gemm_choice,
                     gemm_min_blocks, pointwise_splits, split_k)


# -- shared by the ops here ----------------------------------------------------------------------
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


def _split_k_scratch(node, splits: int) -> int:
    """OpDef.scratch of a split-K op splitting in `splits`: every partial sum of every output."""
    return splits * int(np.prod(node.outputs[0].shape)) if splits > 1 else 0


def _scratch_ref(io, splits):
    """The split-K scratch (float32, whatever the precision), when the op splits."""
    return io.scratch if splits > 1 else None


def _data_inputs_supported(node, *indices):
    """The delegate reads these inputs through the arena or the weights buffer: a constant that
    neither carries (e.g. an int8 filter without quantization) stays on the CPU."""
    for i in indices:
        spec = node.inputs[i] if i < len(node.inputs) else None
        if spec is None or spec.value is None:
            continue
        if not (np.dtype(spec.dtype).kind == "f" or is_float_view(spec.dtype, spec.quantization)):
            return (f"constant input {i} ('{spec.name}') is {np.dtype(spec.dtype).name} without "
                    "quantization; the delegate reads float (or quantized) weights")
    return None


def _bias_ref(io, i):
    return io.inputs[i] if i < len(io.inputs) else None


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
    out_h, out_w, _, _ = conv_geometry(node, k_h, k_w)
    return [(n, out_h, out_w, c_out)]


def _runs_pointwise(node) -> bool:
    """A 1x1, stride-1, ungrouped conv with a constant (packed) filter: PointwiseConvStep."""
    o = node.options
    c_out, k_h, k_w, c_f = node.inputs[1].shape
    return (node.inputs[1].value is not None and node.inputs[0].shape[3] == c_f
            and (k_h, k_w, o.stride_h, o.stride_w) == (1, 1, 1, 1))


def _conv_splits(node) -> int:
    c_out, _, _, c_f = node.inputs[1].shape
    if _runs_pointwise(node):
        return pointwise_splits(int(np.prod(node.outputs[0].shape[:3])), c_f, c_out)
    return split_k(int(np.prod(node.outputs[0].shape)), c_f)


def _conv_scratch(node) -> int:
    return _split_k_scratch(node, _conv_splits(node))


def _pack_filter_out_channels_last(node, i, value):
    """[O, H, W, I] -> [H, W, I, O]: output channels innermost, as the threads run."""
    return value.transpose(1, 2, 3, 0) if i == 1 else None


def _conv_taichi(node, io):
    o = node.options
    c_out, k_h, k_w, c_f = node.inputs[1].shape
    groups = node.inputs[0].shape[3] // c_f
    _, _, pad_top, pad_left = conv_geometry(node, k_h, k_w)
    packed = node.inputs[1].value is not None          # constants are packed by the planner
    splits = _conv_splits(node)
    pointwise = (groups == 1 and (k_h, k_w, o.stride_h, o.stride_w) == (1, 1, 1, 1))
    pixels = int(np.prod(node.outputs[0].shape[:3]))
    tiles = gemm_choice(pixels, c_out, c_f, io.arch) if packed and pointwise else None
    if tiles and _scratch_ref(io, splits) is None:
        return GemmTileStep(io.inputs[0], io.inputs[1], _bias_ref(io, 2), io.outputs[0],
                            pixels, c_f, c_out, o.fused_activation_function, tiles)
    if packed and pointwise:
        return PointwiseConvStep(io.inputs[0], io.inputs[1], _bias_ref(io, 2), io.outputs[0],
                                 o.fused_activation_function, _scratch_ref(io, splits), splits)
    return ConvStep(io.inputs[0], io.inputs[1], _bias_ref(io, 2), io.outputs[0], (k_h, k_w),
                    (o.stride_h, o.stride_w), (o.dilation_h, o.dilation_w), (pad_top, pad_left),
                    c_f=c_f, per_group=c_out // groups,
                    w_strides=(1, c_f * c_out, c_out) if packed else (k_h * k_w * c_f, c_f, 1),
                    act=o.fused_activation_function, scratch=_scratch_ref(io, splits), splits=splits)


def _conv_supports(node):
    return _data_inputs_supported(node, 0, 1, 2)


# numpy_faster_on_cpu: on a machine without a hardware GPU, backend='auto' keeps these ops on
# numpy rather than Taichi's cpu backend, which is slower for them (BLAS matrix products;
# depthwise as tap-by-tap vector multiply-adds): measured per op on the shared models,
# bench/results/cpu_2core.md.
CONV_2D = register_op(OpDef(
    name="CONV_2D", infer=_infer_conv, reference=reference_conv, parse=_parse_conv,
    options_class="Conv2DOptions", supports=_conv_supports, taichi=_conv_taichi,
    pack=_pack_filter_out_channels_last, scratch=_conv_scratch, min_inputs=2, max_inputs=3,
    fusion=Fusion(stores_once=True), litert_checks_omitted_inputs=True,
    numpy_faster_on_cpu=True, temp_bytes=conv_temp_bytes))


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
    out_h, out_w, _, _ = conv_geometry(node, k_h, k_w)
    return [(n, out_h, out_w, c_out)]


def _depthwise_taichi(node, io):
    o = node.options
    _, k_h, k_w, c_out = node.inputs[1].shape
    mult = c_out // node.inputs[0].shape[3]
    _, _, pad_top, pad_left = conv_geometry(node, k_h, k_w)
    return ConvStep(io.inputs[0], io.inputs[1], _bias_ref(io, 2), io.outputs[0], (k_h, k_w),
                    (o.stride_h, o.stride_w), (o.dilation_h, o.dilation_w), (pad_top, pad_left),
                    c_f=1, per_group=mult, w_strides=(1, c_out, 0),
                    act=o.fused_activation_function)


DEPTHWISE_CONV_2D = register_op(OpDef(
    name="DEPTHWISE_CONV_2D", infer=_infer_depthwise, reference=reference_depthwise,
    parse=_parse_depthwise, options_class="DepthwiseConv2DOptions", supports=_conv_supports,
    taichi=_depthwise_taichi, min_inputs=2, max_inputs=3, fusion=Fusion(stores_once=True),
    numpy_faster_on_cpu=True, litert_checks_omitted_inputs=True))   # see CONV_2D


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
        raise node.fail(f"input is {in_h}x{in_w}, but a {PADDING_NAMES[o.padding]} "
                        f"{k_h}x{k_w} stride {o.stride_h}x{o.stride_w} convolution of the "
                        f"{out_shape[1]}x{out_shape[2]} output_shape gives {want[0]}x{want[1]}")
    return [out_shape]


def _transpose_conv_taichi(node, io):
    o = node.options
    _, out_h, out_w, _ = node.outputs[0].shape
    _, k_h, k_w, _ = node.inputs[1].shape
    pad = transpose_conv_padding(node, out_h, out_w, k_h, k_w)
    return TransposeConvStep(io.inputs[2], io.inputs[1], _bias_ref(io, 3), io.outputs[0],
                             (o.stride_h, o.stride_w), pad, o.fused_activation_function,
                             (k_h, k_w), packed=node.inputs[1].value is not None)


def _transpose_conv_supports(node):
    return _data_inputs_supported(node, 1, 2, 3)


TRANSPOSE_CONV = register_op(OpDef(
    name="TRANSPOSE_CONV", infer=_infer_transpose_conv, reference=reference_transpose_conv,
    parse=_parse_transpose_conv, options_class="TransposeConvOptions",
    supports=_transpose_conv_supports, taichi=_transpose_conv_taichi,
    pack=_pack_filter_out_channels_last, min_inputs=3, max_inputs=4, fusion=Fusion(stores_once=True),
    numpy_faster_on_cpu=True, temp_bytes=transpose_conv_temp_bytes,   # see CONV_2D
    litert_checks_omitted_inputs=True))


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


def _fc_splits(node) -> int:
    return split_k(int(np.prod(node.outputs[0].shape)), node.inputs[1].shape[1])


def _fc_scratch(node) -> int:
    return _split_k_scratch(node, _fc_splits(node))


def _pack_fc_weights(node, i, value):
    """[U, D] -> [D, U]: units innermost, as the threads run."""
    return value.T if i == 1 else None


def _fully_connected_taichi(node, io):
    units, depth = node.inputs[1].shape
    splits = _fc_splits(node)
    rows = int(np.prod(node.outputs[0].shape)) // units
    packed = node.inputs[1].value is not None
    tiles = gemm_choice(rows, units, depth, io.arch) if packed and splits == 1 else None
    if tiles:
        return GemmTileStep(io.inputs[0], io.inputs[1], _bias_ref(io, 2), io.outputs[0],
                            rows, depth, units, node.options.fused_activation_function, tiles)
    return FullyConnectedStep(io.inputs[0], io.inputs[1], _bias_ref(io, 2), io.outputs[0],
                              depth, units, node.options.fused_activation_function,
                              packed=node.inputs[1].value is not None,
                              scratch=_scratch_ref(io, splits), splits=splits)


FULLY_CONNECTED = register_op(OpDef(
    name="FULLY_CONNECTED", infer=_infer_fully_connected, reference=reference_fully_connected,
    parse=_parse_fully_connected, options_class="FullyConnectedOptions",
    supports=_conv_supports, taichi=_fully_connected_taichi, pack=_pack_fc_weights,
    scratch=_fc_scratch, min_inputs=2, max_inputs=3, fusion=Fusion(stores_once=True),
    numpy_faster_on_cpu=True, litert_checks_omitted_inputs=True))   # see CONV_2D

# -- CUSTOM:Convolution2DTransposeBias (MediaPipe) ---------------------------------------------
# MediaPipe's transpose conv with a bias input (mediapipe/util/tflite/operations/
# transpose_conv_bias.cc): inputs are the input [N, H, W, I], weights [O, kH, kW, I] and bias
# [O]; custom_options are the raw bytes of a C TfLiteTransposeConvParams, read as its leading
# int32 fields (padding, stride_width, stride_height; newer TFLite appends fields that the op
# ignores). The padding there is the C enum TfLitePadding, not the schema's Padding.
# The output size comes from the input, as MediaPipe's Prepare computes it:
#   SAME:  total pad = max(0, k - (in - 1) % s - 1),  VALID: 0;
#   out = s * (in - 1) + k - total pad,  and the padding before is total pad // 2.
# No fused activation. MediaPipe's kernel takes float32 only.
_TFLITE_PADDING_NAMES = {TFLITE_PADDING_SAME: "SAME", TFLITE_PADDING_VALID: "VALID"}
TRANSPOSE_CONV_PARAMS = struct.Struct("<iii")           # padding, stride_width, stride_height


@dataclass(frozen=True)
class TransposeConvBiasOptions:
    padding: int          # TfLitePadding: 1 SAME, 2 VALID
    stride_h: int
    stride_w: int


def _parse_transpose_conv_bias(op) -> TransposeConvBiasOptions:
    raw = op.custom_options or b""
    if len(raw) < TRANSPOSE_CONV_PARAMS.size:
        raise ModelError(f"op #{op.index} ({op.name}): custom_options must hold a "
                         "TfLiteTransposeConvParams (padding, stride_width, stride_height as "
                         f"int32: {TRANSPOSE_CONV_PARAMS.size} bytes), has {len(raw)} bytes")
    padding, stride_w, stride_h = TRANSPOSE_CONV_PARAMS.unpack_from(raw)
    return TransposeConvBiasOptions(padding=padding, stride_h=stride_h, stride_w=stride_w)


def _infer_transpose_conv_bias(node):
    o = node.options
    if o.padding not in _TFLITE_PADDING_NAMES:
        raise node.fail(f"unknown padding {o.padding} in custom_options (TfLitePadding: "
                        f"{TFLITE_PADDING_SAME} SAME, {TFLITE_PADDING_VALID} VALID)")
    positive_ints(node, "strides", o.stride_h, o.stride_w)
    n, _, _, c_in = _require_rank(node, 0, 4, "input")
    c_out, k_h, k_w, c_w = _require_rank(node, 1, 4, "weights")
    positive_ints(node, "weights size", k_h, k_w)
    if c_in != c_w:
        raise node.fail(f"input channels ({c_in}) != the weights' input channels ({c_w})")
    _require_rank(node, 2, 1, "bias")
    _check_bias(node, 2, c_out)
    for what, spec in (("input", node.inputs[0]), ("weights", node.inputs[1]),
                       ("bias", node.inputs[2]), ("output", node.outputs[0])):
        if spec.dtype is None or np.dtype(spec.dtype) != np.float32:
            dtype = np.dtype(spec.dtype).name if spec.dtype is not None else "untyped"
            raise node.fail(f"{what} is {dtype}; MediaPipe's op takes float32 only")
    out_h, out_w, _, _ = transpose_conv_bias_geometry(node)
    return [(n, out_h, out_w, c_out)]


def _transpose_conv_bias_taichi(node, io):
    o = node.options
    _, _, pad_top, pad_left = transpose_conv_bias_geometry(node)
    _, k_h, k_w, _ = node.inputs[1].shape
    return TransposeConvStep(io.inputs[0], io.inputs[1], io.inputs[2], io.outputs[0],
                             (o.stride_h, o.stride_w), (pad_top, pad_left), 0, (k_h, k_w),
                             packed=node.inputs[1].value is not None)


CONVOLUTION_2D_TRANSPOSE_BIAS = register_op(OpDef(
    name="CUSTOM:Convolution2DTransposeBias", infer=_infer_transpose_conv_bias,
    reference=reference_transpose_conv_bias, parse=_parse_transpose_conv_bias,
    taichi=_transpose_conv_bias_taichi, pack=_pack_filter_out_channels_last, min_inputs=3,
    max_inputs=3, fusion=Fusion(stores_once=True), numpy_faster_on_cpu=True,
    temp_bytes=transpose_conv_bias_temp_bytes))   # see CONV_2D

__all__ = ["CONV_2D", "DEPTHWISE_CONV_2D", "TRANSPOSE_CONV", "FULLY_CONNECTED",
           "CONVOLUTION_2D_TRANSPOSE_BIAS", "extract_patches", "spatial_geometry"]

