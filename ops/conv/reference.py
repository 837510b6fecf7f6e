"""The convolutions' numpy reference (the CPU fallback and the ground truth the Taichi steps are
held to) and the geometry every part of the family computes as TFLite does: output sizes,
paddings, and the bytes of the temporary arrays the reference makes (OpDef.temp_bytes).

All are im2col + matmul on the float view: `extract_patches` gathers, for each of the (few)
kernel taps, the strided slice of the zero-padded input it sees, and one einsum contracts the
patches with the filter. Zero padding is exact for quantized tensors too (the float view of the
input's zero point is 0.0). `spatial_geometry`, `tap_windows` and `extract_patches` are shared
with pooling and MediaPipe's ops.
"""
import numpy as np

from ..common import (PADDING_SAME, PADDING_VALID, apply_activation, conv_output_size,
                      conv_padding_before)

PADDING_NAMES = {PADDING_SAME: "SAME", PADDING_VALID: "VALID"}


# -- geometry and im2col (also used by pooling and MediaPipe's ops) ---------------------------
def spatial_geometry(node, padding, in_h, in_w, k_h, k_w, s_h, s_w, d_h=1, d_w=1):
    """(out_h, out_w, pad_top, pad_left) as TFLite computes them; ModelError when a VALID
    window does not fit in the input."""
    out_h = conv_output_size(padding, in_h, k_h, s_h, d_h)
    out_w = conv_output_size(padding, in_w, k_w, s_w, d_w)
    if out_h < 1 or out_w < 1:
        eff_h, eff_w = (k_h - 1) * d_h + 1, (k_w - 1) * d_w + 1
        raise node.fail(f"the {eff_h}x{eff_w} window (filter size with dilation) does not fit "
                        f"in the {in_h}x{in_w} input with {PADDING_NAMES[padding]} padding")
    pad_top = conv_padding_before(padding, in_h, k_h, s_h, d_h, out_h)
    pad_left = conv_padding_before(padding, in_w, k_w, s_w, d_w, out_w)
    return out_h, out_w, pad_top, pad_left


def tap_windows(x, k_h, k_w, s_h, s_w, d_h, d_w, pad_top, pad_left, out_h, out_w, fill=0.0):
    """For each kernel tap (i, j): the [N, out_h, out_w, C] view of the padded input it sees,
    x[n, y*s_h - pad_top + i*d_h, x*s_w - pad_left + j*d_w, c] (`fill` outside the input)."""
    n, h, w, c = x.shape
    need_h = (out_h - 1) * s_h + (k_h - 1) * d_h + 1
    need_w = (out_w - 1) * s_w + (k_w - 1) * d_w + 1
    pad_bottom = max(need_h - pad_top - h, 0)
    pad_right = max(need_w - pad_left - w, 0)
    xp = np.pad(x, ((0, 0), (pad_top, pad_bottom), (pad_left, pad_right), (0, 0)),
                constant_values=fill)
    for i in range(k_h):            # kernel taps only: a small static count
        for j in range(k_w):
            yield i, j, xp[:, i * d_h: i * d_h + (out_h - 1) * s_h + 1: s_h,
                           j * d_w: j * d_w + (out_w - 1) * s_w + 1: s_w, :]


def extract_patches(x, k_h, k_w, s_h, s_w, d_h, d_w, pad_top, pad_left, out_h, out_w,
                    fill=0.0):
    """im2col on NHWC: [N, out_h, out_w, k_h, k_w, C], where patch (y, x, i, j) is
    x[n, y*s_h - pad_top + i*d_h, x*s_w - pad_left + j*d_w, c], or `fill` outside the input."""
    n, _, _, c = x.shape
    patches = np.empty((n, out_h, out_w, k_h, k_w, c), dtype=x.dtype)
    for i, j, window in tap_windows(x, k_h, k_w, s_h, s_w, d_h, d_w, pad_top, pad_left,
                                    out_h, out_w, fill):
        patches[:, :, :, i, j, :] = window
    return patches


def add_bias(out, bias):
    return out if bias is None else out + np.asarray(bias, out.dtype)


def as_float(x):
    x = np.asarray(x)
    return x if x.dtype.kind == "f" else x.astype(np.float32)


# -- CONV_2D and DEPTHWISE_CONV_2D ------------------------------------------------------------
def conv_geometry(node, k_h, k_w):
    o = node.options
    _, in_h, in_w, _ = node.inputs[0].shape
    return spatial_geometry(node, o.padding, in_h, in_w, k_h, k_w, o.stride_h, o.stride_w,
                            o.dilation_h, o.dilation_w)


def conv_patches(node, x, k_h, k_w):
    """im2col of a CONV_2D / DEPTHWISE_CONV_2D input: (patches, out_h, out_w)."""
    o = node.options
    out_h, out_w, pad_top, pad_left = conv_geometry(node, k_h, k_w)
    p = extract_patches(x, k_h, k_w, o.stride_h, o.stride_w, o.dilation_h, o.dilation_w,
                        pad_top, pad_left, out_h, out_w)
    return p, out_h, out_w


def reference_conv(node, inputs):
    o = node.options
    x, w = as_float(inputs[0]), as_float(inputs[1])
    bias = inputs[2] if len(inputs) > 2 else None
    c_out, k_h, k_w, c_f = w.shape
    n, _, _, c_in = x.shape
    groups = c_in // c_f
    out_h, out_w, pad_top, pad_left = conv_geometry(node, k_h, k_w)
    if groups == 1 and (k_h, k_w, o.stride_h, o.stride_w) == (1, 1, 1, 1):
        # a pointwise conv is one matrix product (BLAS), no patches
        out = x.reshape(-1, c_in) @ w.reshape(c_out, c_in).T
    elif groups == 1:
        # im2col, then one matrix product with the filter as [taps * channels, c_out]
        p, _, _ = conv_patches(node, x, k_h, k_w)
        out = p.reshape(-1, k_h * k_w * c_f) @ w.transpose(1, 2, 3, 0).reshape(-1, c_out)
    else:
        p, _, _ = conv_patches(node, x, k_h, k_w)
        p = p.reshape(n, out_h, out_w, k_h, k_w, groups, c_f)
        wg = w.reshape(groups, c_out // groups, k_h, k_w, c_f)
        out = np.einsum("nyxijgc,goijc->nyxgo", p, wg, optimize=True)
    out = add_bias(out.reshape(n, out_h, out_w, c_out), bias)
    return [apply_activation(out, o.fused_activation_function)]


def float_bytes(spec) -> int:
    """Bytes per element of a reference's float working arrays (as_float: float64 stays)."""
    return 8 if spec.dtype is not None and np.dtype(spec.dtype) == np.float64 else 4


def padded_bytes(node, k_h, k_w) -> int:
    """The zero-padded copy of the input tap_windows makes."""
    n, in_h, in_w, c_in = node.inputs[0].shape
    return n * (in_h + k_h * node.options.dilation_h) * (in_w + k_w * node.options.dilation_w) * c_in


def conv_temp_bytes(node) -> int:
    """The reference's patches (im2col: every output pixel's window, k_h x k_w times the input;
    a 64x64 filter over a 512x512 input makes 4 GiB of them for a 1 MiB output), the padded
    input and, grouped, the einsum's copy of the patches."""
    o = node.options
    c_out, k_h, k_w, c_f = node.inputs[1].shape
    n, _, _, c_in = node.inputs[0].shape
    grouped = c_f != c_in
    if not grouped and (k_h, k_w, o.stride_h, o.stride_w) == (1, 1, 1, 1):
        return 0                    # one matrix product on the input as it is
    _, out_h, out_w, _ = node.outputs[0].shape
    patches = n * out_h * out_w * k_h * k_w * c_in
    elements = patches * (2 if grouped else 1) + padded_bytes(node, k_h, k_w)
    return elements * float_bytes(node.inputs[0])


def reference_depthwise(node, inputs):
    o = node.options
    x, w = as_float(inputs[0]), as_float(inputs[1])
    bias = inputs[2] if len(inputs) > 2 else None
    _, k_h, k_w, c_out = w.shape
    n, _, _, c_in = x.shape
    mult = c_out // c_in
    o_ = node.options
    out_h, out_w, pad_top, pad_left = conv_geometry(node, k_h, k_w)
    # output channel c*mult + m reads input channel c: accumulate tap by tap, each a broadcast
    # multiply of the window the tap sees (no patches: a depthwise tap has no reduction)
    w = w.reshape(k_h, k_w, c_in, mult)
    out = np.zeros((n, out_h, out_w, c_in, mult), dtype=np.result_type(x.dtype, w.dtype))
    for i, j, window in tap_windows(x, k_h, k_w, o_.stride_h, o_.stride_w, o_.dilation_h,
                                    o_.dilation_w, pad_top, pad_left, out_h, out_w):
        out += window[..., None] * w[i, j]
    out = add_bias(out.reshape(n, out_h, out_w, c_out), bias)
    return [apply_activation(out, o.fused_activation_function)]


# -- TRANSPOSE_CONV ----------------------------------------------------------------------------
def transpose_conv_padding(node, out_h, out_w, k_h, k_w):
    """TFLite pads a transpose conv as the forward conv from its output back to its input:
    ComputePaddingHeightWidth on the output's size (dilation 1), offset dropped."""
    o = node.options
    fwd_h = conv_output_size(o.padding, out_h, k_h, o.stride_h)
    fwd_w = conv_output_size(o.padding, out_w, k_w, o.stride_w)
    return (conv_padding_before(o.padding, out_h, k_h, o.stride_h, 1, fwd_h),
            conv_padding_before(o.padding, out_w, k_w, o.stride_w, 1, fwd_w))


def transpose_conv(x, w, bias, out_h, out_w, s_h, s_w, pad_top, pad_left):
    """out[n, oy, ox, o] = bias[o] + sum of x[n, iy, ix, c] * w[o, i, j, c] over the input
    pixels and taps with iy*s_h + i - pad_top == oy and ix*s_w + j - pad_left == ox."""
    n, in_h, in_w, _ = x.shape
    c_out, k_h, k_w, _ = w.shape
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
    return add_bias(out, bias)


def transpose_temp_bytes(node, x, w) -> int:
    """transpose_conv's arrays besides the output: every input pixel times every tap
    (`contrib`, and einsum's copy of it) and the uncropped canvas."""
    n, in_h, in_w, _ = x.shape
    c_out, k_h, k_w, _ = w.shape
    _, out_h, out_w, _ = node.outputs[0].shape
    o = node.options
    contrib = n * in_h * in_w * k_h * k_w * c_out
    canvas = (n * max((in_h - 1) * o.stride_h, out_h) + k_h) * (max((in_w - 1) * o.stride_w, out_w) + k_w) * c_out
    return (2 * contrib + canvas) * float_bytes(x)


def transpose_conv_temp_bytes(node) -> int:
    return transpose_temp_bytes(node, node.inputs[2], node.inputs[1])


def reference_transpose_conv(node, inputs):
    o = node.options
    w, x = as_float(inputs[1]), as_float(inputs[2])
    bias = inputs[3] if len(inputs) > 3 else None
    _, out_h, out_w, _ = node.outputs[0].shape
    _, k_h, k_w, _ = w.shape
    pad_top, pad_left = transpose_conv_padding(node, out_h, out_w, k_h, k_w)
    out = transpose_conv(x, w, bias, out_h, out_w, o.stride_h, o.stride_w, pad_top, pad_left)
    return [apply_activation(out, o.fused_activation_function)]


# -- FULLY_CONNECTED ---------------------------------------------------------------------------
def reference_fully_connected(node, inputs):
    x, w = as_float(inputs[0]), as_float(inputs[1])
    bias = inputs[2] if len(inputs) > 2 else None
    units, depth = w.shape
    out = add_bias(x.reshape(-1, depth) @ w.T, bias)
    out = apply_activation(out, node.options.fused_activation_function)
    return [out.reshape(node.outputs[0].shape)]


# -- CUSTOM:Convolution2DTransposeBias (MediaPipe; the package's __init__ says more) -----------
TFLITE_PADDING_SAME, TFLITE_PADDING_VALID = 1, 2        # TfLitePadding (C API)


def transpose_conv_bias_geometry(node):
    """(out_h, out_w, pad_top, pad_left) as MediaPipe's Prepare and Eval compute them."""
    o = node.options
    _, in_h, in_w, _ = node.inputs[0].shape
    _, k_h, k_w, _ = node.inputs[1].shape
    pad_h = pad_w = 0
    if o.padding == TFLITE_PADDING_SAME:
        pad_h = max(0, k_h - (in_h - 1) % o.stride_h - 1)
        pad_w = max(0, k_w - (in_w - 1) % o.stride_w - 1)
    return (o.stride_h * (in_h - 1) + k_h - pad_h, o.stride_w * (in_w - 1) + k_w - pad_w,
            pad_h // 2, pad_w // 2)


def transpose_conv_bias_temp_bytes(node) -> int:
    return transpose_temp_bytes(node, node.inputs[0], node.inputs[1])


def reference_transpose_conv_bias(node, inputs):
    x, w, bias = (as_float(v) for v in inputs)
    out_h, out_w, pad_top, pad_left = transpose_conv_bias_geometry(node)
    o = node.options
    return [transpose_conv(x, w, bias, out_h, out_w, o.stride_h, o.stride_w, pad_top, pad_left)]

