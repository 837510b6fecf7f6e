"""CONV_2D (grouped too), DEPTHWISE_CONV_2D, TRANSPOSE_CONV and FULLY_CONNECTED vs LiteRT's
reference kernels through one-op models: float32 and int8 (per-tensor and per-channel
filters), strides, dilations, paddings, fused activations, depth multipliers, keep_num_dims.
Tolerances: tflite_taichi.testing (1e-5 of the largest magnitude; 1 unit).

Float cases use dyadic data (multiples of 1/8, see `_dyadic`): every product and partial sum
is then exact in float32, so the result does not depend on summation order. With arbitrary
floats a sum that cancels to a tiny output differs between two correct orders by far more than
1e-5 of that output (seen: 6e-8 on an output of 1.6e-3 from terms of magnitude 3).

MediaPipe's CUSTOM:Convolution2DTransposeBias runs in LiteRT only through XNNPACK (its default
delegate), so it is held against XNNPACK and against a direct numpy formula."""
import struct

import numpy as np
import pytest
from hypothesis import given, strategies as st

from tflite_taichi.errors import ModelError
from tflite_taichi.testing import (Const, Input, Output, check_against_litert, one_op_model,
                                   run_litert, run_ours, assert_float_close)
from cases.conv import S, _conv_options, _depthwise_options, _dyadic, _int8_bias, _int8_filter, _int8_output_scale, _tcb_options, _tcb_out_size, _transpose_conv_model, conv_case, depthwise_case, fully_connected_case, tcb_case, transpose_conv_case


@given(case=conv_case(), seed=S.seeds())
def test_conv2d_float32_matches_litert(case, seed):
    rng = np.random.default_rng(seed)
    c = case
    filt = _dyadic(rng, (c["c_out"], *c["k"], c["c_f"]), 1)
    bias = _dyadic(rng, c["c_out"], 1)
    model = one_op_model("CONV_2D", [Input(c["in_shape"]), Const(filt), Const(bias)],
                         [Output(c["out_shape"])],
                         **_conv_options(c["padding"], c["s"], c["d"], c["act"]))
    check_against_litert(model, [_dyadic(rng, c["in_shape"], 3)])


@given(case=conv_case(), data=st.data(), qi=S.quant_params(), seed=S.seeds())
def test_conv2d_int8_matches_litert(case, data, qi, seed):
    rng = np.random.default_rng(seed)
    c = case
    filt, fq, fscales = _int8_filter(data.draw, rng, (c["c_out"], *c["k"], c["c_f"]), 0)
    taps = c["k"][0] * c["k"][1] * c["c_f"]
    qo = (_int8_output_scale(data.draw, qi[0], fscales, taps), data.draw(st.integers(-128, 127)))
    model = one_op_model(
        "CONV_2D",
        [Input(c["in_shape"], np.int8, qi), Const(filt, fq),
         _int8_bias(rng, qi[0], fscales, c["c_out"])],
        [Output(c["out_shape"], np.int8, qo)],
        **_conv_options(c["padding"], c["s"], c["d"], c["act"]))
    check_against_litert(model, seed=seed)


@given(case=depthwise_case(), version=st.sampled_from([1, 2]), seed=S.seeds())
def test_depthwise_float32_matches_litert(case, version, seed):
    rng = np.random.default_rng(seed)
    c = case
    filt = _dyadic(rng, (1, *c["k"], c["c_out"]), 1)
    bias = _dyadic(rng, c["c_out"], 1)
    model = one_op_model("DEPTHWISE_CONV_2D", [Input(c["in_shape"]), Const(filt), Const(bias)],
                         [Output(c["out_shape"])], version=version, **_depthwise_options(c))
    check_against_litert(model, [_dyadic(rng, c["in_shape"], 3)])


@given(case=depthwise_case(), data=st.data(), qi=S.quant_params(), seed=S.seeds())
def test_depthwise_int8_matches_litert(case, data, qi, seed):
    rng = np.random.default_rng(seed)
    c = case
    filt, fq, fscales = _int8_filter(data.draw, rng, (1, *c["k"], c["c_out"]), 3)
    qo = (_int8_output_scale(data.draw, qi[0], fscales, c["k"][0] * c["k"][1]),
          data.draw(st.integers(-128, 127)))
    model = one_op_model(
        "DEPTHWISE_CONV_2D",
        [Input(c["in_shape"], np.int8, qi), Const(filt, fq),
         _int8_bias(rng, qi[0], fscales, c["c_out"])],
        [Output(c["out_shape"], np.int8, qo)], version=3, **_depthwise_options(c))
    check_against_litert(model, seed=seed)


def test_depthwise_multiplier_comes_from_the_shapes():
    """LiteRT ignores an options depth_multiplier that disagrees with the filter; so do we."""
    rng = np.random.default_rng(1)
    filt = _dyadic(rng, (1, 3, 3, 6), 1)
    bias = _dyadic(rng, 6, 1)
    for mult in (0, 1, 3):
        model = one_op_model("DEPTHWISE_CONV_2D", [Input((1, 5, 4, 2)), Const(filt), Const(bias)],
                             [Output((1, 5, 4, 6))], padding="SAME", stride_h=1, stride_w=1,
                             depth_multiplier=mult)
        check_against_litert(model, [_dyadic(rng, (1, 5, 4, 2), 3)])


@pytest.mark.parametrize("op", ["CONV_2D", "DEPTHWISE_CONV_2D"])
def test_omitted_bias_is_zero_bias(op):
    """LiteRT refuses CONV_2D/DEPTHWISE_CONV_2D without a bias; ours takes -1 as no bias, which
    must equal LiteRT with a zero bias."""
    rng = np.random.default_rng(2)
    shape = (4, 3, 3, 2) if op == "CONV_2D" else (1, 3, 3, 4)
    filt = _dyadic(rng, shape, 1)
    opts = dict(padding="SAME", stride_h=2, stride_w=1, fused_activation_function="RELU")
    x = _dyadic(rng, (1, 6, 5, 2), 3)
    without = one_op_model(op, [Input(x.shape), Const(filt), None], [Output((1, 3, 5, 4))], **opts)
    zero = one_op_model(op, [Input(x.shape), Const(filt), Const(np.zeros(4, np.float32))],
                        [Output((1, 3, 5, 4))], **opts)
    assert_float_close(run_ours(without, [x])[0], run_litert(zero, [x])[0])


@given(case=transpose_conv_case(), version=st.sampled_from([1, 3, 4]), seed=S.seeds())
def test_transpose_conv_float32_matches_litert(case, version, seed):
    rng = np.random.default_rng(seed)
    c = case
    weights = _dyadic(rng, (c["c_out"], *c["k"], c["in_shape"][3]), 1)
    inputs = [Const(weights), Input(c["in_shape"])]
    if version >= 3 and c["bias"]:
        inputs.append(Const(_dyadic(rng, c["c_out"], 1)))
    check_against_litert(_transpose_conv_model(c, inputs, Output(c["out_shape"]), version),
                         [_dyadic(rng, c["in_shape"], 3)])


@given(case=transpose_conv_case(), data=st.data(), qi=S.quant_params(), seed=S.seeds())
def test_transpose_conv_int8_matches_litert(case, data, qi, seed):
    rng = np.random.default_rng(seed)
    c = case
    weights, wq, wscales = _int8_filter(data.draw, rng, (c["c_out"], *c["k"], c["in_shape"][3]), 0)
    taps = -(-c["k"][0] // c["s"][0]) * -(-c["k"][1] // c["s"][1]) * c["in_shape"][3]
    qo = (_int8_output_scale(data.draw, qi[0], wscales, taps), data.draw(st.integers(-128, 127)))
    inputs = [Const(weights, wq), Input(c["in_shape"], np.int8, qi)]
    if c["bias"]:
        inputs.append(_int8_bias(rng, qi[0], wscales, c["c_out"]))
    model = _transpose_conv_model(c, inputs, Output(c["out_shape"], np.int8, qo), 4)
    check_against_litert(model, seed=seed)


def _fc_model(c, inputs, out):
    return one_op_model("FULLY_CONNECTED", inputs, [out], keep_num_dims=c["keep"],
                        fused_activation_function=c["act"])


@given(case=fully_connected_case(), const_weights=st.booleans(), seed=S.seeds())
def test_fully_connected_float32_matches_litert(case, const_weights, seed):
    rng = np.random.default_rng(seed)
    c = case
    weights = _dyadic(rng, (c["units"], c["depth"]), 1)
    bias = _dyadic(rng, c["units"], 1)
    x = _dyadic(rng, c["in_shape"], 3)
    if const_weights:
        ins = [Input(c["in_shape"]), Const(weights), Const(bias) if c["bias"] else None]
        model = _fc_model(c, ins, Output(c["out_shape"]))
        check_against_litert(model, [x])
    else:
        ins = [Input(c["in_shape"]), Input(weights.shape)]
        ins += [Input(bias.shape)] if c["bias"] else []
        model = _fc_model(c, ins, Output(c["out_shape"]))
        check_against_litert(model, [x, weights] + ([bias] if c["bias"] else []))


@given(case=fully_connected_case(), data=st.data(), qi=S.quant_params(), seed=S.seeds())
def test_fully_connected_int8_matches_litert(case, data, qi, seed):
    rng = np.random.default_rng(seed)
    c = case
    weights, wq, wscales = _int8_filter(data.draw, rng, (c["units"], c["depth"]), 0)
    qo = (_int8_output_scale(data.draw, qi[0], wscales, c["depth"]),
          data.draw(st.integers(-128, 127)))
    model = _fc_model(c, [Input(c["in_shape"], np.int8, qi), Const(weights, wq),
                          _int8_bias(rng, qi[0], wscales, c["units"], c["bias"])],
                      Output(c["out_shape"], np.int8, qo))
    check_against_litert(model, seed=seed)


# -- invalid models ------------------------------------------------------------------------------
def _f32(*shape):
    return np.ones(shape, np.float32)


def _raises(model, op, match, inputs=None):
    with pytest.raises(ModelError, match=match) as info:
        run_ours(model, inputs or [])
    assert op in str(info.value)


CONV = dict(padding="SAME", stride_h=1, stride_w=1)


@pytest.mark.parametrize("options,match", [
    (dict(CONV, stride_h=0), "strides"),
    (dict(CONV, dilation_h_factor=0), "dilation"),
    (dict(CONV, padding=7), "padding"),
    (dict(CONV, fused_activation_function=9), "activation"),
])
@pytest.mark.parametrize("op", ["CONV_2D", "DEPTHWISE_CONV_2D"])
def test_conv_bad_options(op, options, match):
    filt = _f32(4, 3, 3, 4) if op == "CONV_2D" else _f32(1, 3, 3, 4)
    model = one_op_model(op, [Input((1, 5, 5, 4)), Const(filt), Const(_f32(4))],
                         [Output((1, 5, 5, 4))], **options)
    _raises(model, op, match, [np.ones((1, 5, 5, 4), np.float32)])


def test_conv_bad_shapes():
    x = [np.ones((1, 5, 5, 4), np.float32)]
    cases = [
        ((4, 3, 3, 3), (4,), "multiple of the filter's input channels"),   # 4 % 3
        ((3, 3, 3, 2), (3,), "multiple of the number of groups"),          # 2 groups, 3 outputs
        ((4, 3, 3, 4), (5,), "bias"),
    ]
    for filt, bias, match in cases:
        model = one_op_model("CONV_2D",
                             [Input((1, 5, 5, 4)), Const(_f32(*filt)), Const(_f32(*bias))],
                             [Output((1, 5, 5, filt[0]))], **CONV)
        _raises(model, "CONV_2D", match, x)
    model = one_op_model("CONV_2D", [Input((1, 3, 3, 4)), Const(_f32(4, 5, 5, 4)), Const(_f32(4))],
                         [Output((1, 1, 1, 4))], padding="VALID", stride_h=1, stride_w=1)
    _raises(model, "CONV_2D", "does not fit", [np.ones((1, 3, 3, 4), np.float32)])


def test_depthwise_bad_shapes():
    x = [np.ones((1, 5, 5, 4), np.float32)]
    for filt, match in [((2, 3, 3, 4), r"\[1, H, W, C\*M\]"),
                        ((1, 3, 3, 6), "multiple of the input")]:
        model = one_op_model("DEPTHWISE_CONV_2D", [Input((1, 5, 5, 4)), Const(_f32(*filt)),
                                                   Const(_f32(filt[3]))],
                             [Output((1, 5, 5, filt[3]))], **CONV)
        _raises(model, "DEPTHWISE_CONV_2D", match, x)


def test_transpose_conv_bad_models():
    x = [np.ones((1, 3, 4, 3), np.float32)]
    opts = dict(padding="SAME", stride_h=2, stride_w=2)
    w = Const(_f32(2, 3, 3, 3))
    # an input that is not what the forward conv of output_shape gives (LiteRT refuses it too)
    model = one_op_model("TRANSPOSE_CONV", [Const(np.array([1, 8, 8, 2], np.int32)), w,
                                            Input((1, 3, 4, 3))], [Output((1, 8, 8, 2))], **opts)
    _raises(model, "TRANSPOSE_CONV", "convolution of the", x)
    # output channels disagree with the weights
    model = one_op_model("TRANSPOSE_CONV", [Const(np.array([1, 6, 8, 5], np.int32)), w,
                                            Input((1, 3, 4, 3))], [Output((1, 6, 8, 5))], **opts)
    _raises(model, "TRANSPOSE_CONV", "output_shape", x)
    model = one_op_model("TRANSPOSE_CONV", [Const(np.array([1, 6, 8, 2], np.int32)), w,
                                            Input((1, 3, 4, 3))], [Output((1, 6, 8, 2))],
                         padding="SAME", stride_h=0, stride_w=2)
    _raises(model, "TRANSPOSE_CONV", "strides", x)


def test_fully_connected_bad_models():
    x = [np.ones((2, 4), np.float32)]
    model = one_op_model("FULLY_CONNECTED", [Input((2, 4)), Const(_f32(3, 4)), None],
                         [Output((2, 3))], weights_format="SHUFFLED4x16INT8")
    _raises(model, "FULLY_CONNECTED", "SHUFFLED4x16INT8", x)
    model = one_op_model("FULLY_CONNECTED", [Input((2, 4)), Const(_f32(3, 3)), None],
                         [Output((2, 3))])
    _raises(model, "FULLY_CONNECTED", "rows of 3", x)
    model = one_op_model("FULLY_CONNECTED", [Input((2, 4)), Const(_f32(3, 2)), None],
                         [Output((2, 2, 3))], keep_num_dims=True)
    _raises(model, "FULLY_CONNECTED", "keep_num_dims", x)
    model = one_op_model("FULLY_CONNECTED", [Input((2, 4)), Const(_f32(3, 4)), Const(_f32(4))],
                         [Output((2, 3))])
    _raises(model, "FULLY_CONNECTED", "bias", x)


# -- CUSTOM:Convolution2DTransposeBias (MediaPipe) -----------------------------------------------
# custom_options: a C TfLiteTransposeConvParams, i.e. int32 padding (TfLitePadding: 1 SAME,
# 2 VALID), stride_width, stride_height (newer TFLite appends fields the op ignores). LiteRT has
# no CPU kernel for it: only its default XNNPACK delegate runs it.
TCB = "CUSTOM:Convolution2DTransposeBias"


def _tcb_numpy(x, w, b, padding, s):
    """MediaPipe's Eval written out: the output starts as the bias; every input pixel adds
    x[n, y, x, :] . w[o, i, j, :] at (y*s_h - pad_top + i, x*s_w - pad_left + j) when inside."""
    n, in_h, in_w, _ = x.shape
    c_out, k_h, k_w, _ = w.shape
    out_h, pad_top = _tcb_out_size(padding, in_h, k_h, s[0])
    out_w, pad_left = _tcb_out_size(padding, in_w, k_w, s[1])
    out = np.broadcast_to(b.astype(np.float64), (n, out_h, out_w, c_out)).copy()
    for y in range(in_h):
        for xx in range(in_w):
            for i in range(k_h):
                for j in range(k_w):
                    oy, ox = y * s[0] - pad_top + i, xx * s[1] - pad_left + j
                    if 0 <= oy < out_h and 0 <= ox < out_w:
                        out[:, oy, ox, :] += x[:, y, xx, :].astype(np.float64) @ w[:, i, j, :].T
    return out.astype(np.float32)


def _tcb_model(c, weights, bias, extra=b""):
    return one_op_model(TCB, [Input(c["in_shape"]), Const(weights), Const(bias)],
                        [Output(c["out_shape"])],
                        custom_options=_tcb_options(c["padding"], c["s"], extra))


@given(case=tcb_case(), seed=S.seeds())
def test_transpose_conv_bias_matches_litert_xnnpack(case, seed):
    rng = np.random.default_rng(seed)
    c = case
    weights = _dyadic(rng, (c["c_out"], *c["k"], c["in_shape"][3]), 1)
    bias = _dyadic(rng, c["c_out"], 1)
    check_against_litert(_tcb_model(c, weights, bias), [_dyadic(rng, c["in_shape"], 3)],
                         kernels="xnnpack")


@given(case=tcb_case(stride_within_kernel=False),
       extra=st.sampled_from([b"", struct.pack("<ii", 1, 0)]), seed=S.seeds())
def test_transpose_conv_bias_matches_numpy(case, extra, seed):
    """Strides beyond the kernel too, and trailing TfLiteTransposeConvParams fields (activation,
    quantized_bias_type), which the op ignores."""
    rng = np.random.default_rng(seed)
    c = case
    weights = rng.standard_normal((c["c_out"], *c["k"], c["in_shape"][3])).astype(np.float32)
    bias = rng.standard_normal(c["c_out"]).astype(np.float32)
    x = rng.standard_normal(c["in_shape"]).astype(np.float32)
    out = run_ours(_tcb_model(c, weights, bias, extra), [x])[0]
    assert_float_close(out, _tcb_numpy(x, weights, bias, c["padding"], c["s"]))


def test_transpose_conv_bias_bad_models():
    x = [np.ones((1, 3, 4, 3), np.float32)]

    def model(options, w=(2, 3, 3, 3), b=(2,), in_dtype=np.float32, in_q=None):
        return one_op_model(TCB, [Input((1, 3, 4, 3), in_dtype, in_q), Const(_f32(*w)),
                                  Const(_f32(*b))], [Output((1, 6, 8, 2))],
                            custom_options=options)
    ok = struct.pack("<iii", 1, 2, 2)
    _raises(model(struct.pack("<ii", 1, 2)), "Convolution2DTransposeBias", "custom_options", x)
    _raises(model(None), "Convolution2DTransposeBias", "custom_options", x)
    _raises(model(struct.pack("<iii", 0, 2, 2)), "Convolution2DTransposeBias", "padding", x)
    _raises(model(struct.pack("<iii", 3, 2, 2)), "Convolution2DTransposeBias", "padding", x)
    _raises(model(struct.pack("<iii", 1, 0, 2)), "Convolution2DTransposeBias", "strides", x)
    _raises(model(ok, w=(2, 3, 3, 4)), "Convolution2DTransposeBias", "input channels", x)
    _raises(model(ok, b=(3,)), "Convolution2DTransposeBias", "bias", x)
    _raises(model(ok, b=(1, 2)), "Convolution2DTransposeBias", "bias", x)
    _raises(model(ok, in_dtype=np.int8, in_q=(0.1, 0)), "Convolution2DTransposeBias", "float32",
            [np.ones((1, 3, 4, 3), np.int8)])
