"""Dynamic-range quantized models (the TFLite converter's default optimisation): int8 constant
weights (symmetric; per-channel along the output channel, or per-tensor), float32 bias, float32
activations in and out. We run them as the official GPU delegate does: the weights are
dequantized once at prepare and the op is plain float math, on the reference path and on the
delegate (the dequantized weights go into its weights buffer).

LiteRT's hybrid kernels quantize the *input* activations on the fly instead. What LiteRT 2.3
does (tensorflow/lite/kernels/fully_connected.cc, conv.cc, depthwise_conv.cc, transpose_conv.cc;
measured case by case in test_litert_quantizes_inputs_as_stated):
  FULLY_CONNECTED    each row of `depth` inputs on its own; symmetric, s = max|x| / 127,
                     q = round(x / s) in [-127, 127], unless the op's asymmetric_quantize_inputs:
                     then asymmetric, s = (max(x, 0) - min(x, 0)) / 255 with a nudged zero point.
                     Per-tensor and per-channel weights.
  CONV_2D            each batch image (H*W*C inputs) on its own; symmetric when the filter has
                     one scale or per-channel scales that are all equal, asymmetric when they
                     differ, and asymmetric for a grouped conv (which needs per-channel scales:
                     LiteRT refuses a single one).
  DEPTHWISE_CONV_2D  each batch image, asymmetric; per-channel filters only: with a single scale
                     (and several channels) LiteRT reads a scale per channel past the end of the
                     one-element array: garbage outputs (seen: errors of 13 to 1e33), so the
                     per-tensor case is held to the float model with the dequantized weights
                     (test_equals_the_float_model_with_dequantized_weights) instead.
  TRANSPOSE_CONV     each batch image, asymmetric; per-tensor or per-channel.
  LSTM               each batch row of the input, symmetric (the op's asymmetric_quantize_inputs
                     aside); tested on the first step from a zero state (no recurrent terms).
then acc = sum of w_q * (q - zero_point) exactly in int32, out = acc * (s * s_w[channel]) + bias,
and the fused activation in float. BATCH_MATMUL and EMBEDDING_LOOKUP (hybrid too in LiteRT) are
not ops of this package.

THE BOUND (per output element). Ours: y = sum_k w_k x_k + b in float32, w_k = s_w q_w the
dequantized weight. LiteRT: y' = sum_k w_k xh_k + b with xh_k = s (q_k - zp) and
|x_k - xh_k| <= s/2 (rounding to nearest; the int8 range covers [min, max] of the row to within
half a step, so the clamp costs nothing more). Hence
    |y - y'| <= (s/2) * A1,        A1 = sum over the taps that read the input of |w_k|
(padding reads 0 on both sides and costs nothing), plus float32 rounding, u = 2^-24:
  - s and 1/s are float32 (range/127, 127/range): q moves by at most ~400u steps, so we use
    (1/2 + 2^-12) * s instead of s/2;
  - our float32 sum of n products and the bias errs by at most (n + 2) u (A2 + |b|), where
    A2 = sum_k |w_k| |x_k|; LiteRT's int32 sum is exact, its two float products and the bias
    add err by at most 3u (A2 + s A1 + |b|); both (generously): (n + 8) u (A2 + s A1 + |b|).
    BOUND = (1/2 + 2^-12) s A1 + (n + 8) u (A2 + s A1 + |b|)
Fused activations (RELU, RELU6, RELU_N1_TO_1) are 1-Lipschitz, so the bound holds after them.
A1 and A2 come from LiteRT's own float kernels on a twin model holding |w| (zero bias, no
activation) fed with ones and with |x|: the geometry (padding, strides, dilation) is LiteRT's.
Measured over 500 random cases per op, twice (HYPOTHESIS_PROFILE=thorough): the worst
|y - y'| / BOUND is 0.99 (FULLY_CONNECTED), 0.999 / 0.99 (CONV_2D per-tensor / per-channel),
0.997 (DEPTHWISE_CONV_2D), 0.996 / 0.98 (TRANSPOSE_CONV): the bound is tight. Assuming the
asymmetric step for a symmetric kernel breaks it (2x, test_litert_quantizes_inputs_as_stated).
The LSTM's bound (first step, see its test) propagates the gate bounds through the worst-case
slopes of sigmoid and tanh; measured worst ratio 0.19.

XNNPACK (LiteRT's default delegate) takes the hybrid FULLY_CONNECTED and CONV_2D (its outputs
differ from the builtin kernels'; DEPTHWISE_CONV_2D it leaves to them) and quantizes its inputs
asymmetrically (qd8, whatever the op's option), per row, or per image or finer for CONV_2D (a
finer row has a smaller range): with the asymmetric per-row / per-image step the measured worst
ratio is 0.99 for both ops. As XNNPACK may decline an instance to the builtin (symmetric)
kernel, its test uses the larger, symmetric step.

Delegate tests use power-of-two weight scales and dyadic inputs (multiples of 1/8), so every
product and sum is exact in float32 and the reference and the kernels agree whatever their
summation order: check_delegate's 1e-5 of the largest magnitude then holds strictly.
"""
import numpy as np
import pytest
from hypothesis import assume, given, settings, strategies as st

from cases.conv import (_conv_options, _depthwise_options, _dyadic, conv_case, depthwise_case,
                        fully_connected_case, transpose_conv_case)
from cases.sequence import _x as lstm_x, litert_steps, lstm_case, lstm_model, lstm_weights
from tflite_taichi.builder import ModelBuilder
from tflite_taichi.testing import (FLOAT_RTOL, TAICHI_EXAMPLES, Const, Input, Output,
                                   assert_float_close, check_against_litert, check_delegate,
                                   one_op_model, quantize_array, run_litert, run_ours, strategies)

S = strategies()
U = 2.0 ** -24
ROUNDING_OF_S = 2.0 ** -12        # float32 s and 1/s: see the module docstring


# -- weights, inputs, bound ---------------------------------------------------------------------
def _int8_weights(draw, rng, shape, dim, per_channel, pow2=False):
    """int8 data, its symmetric quantization (per-channel along `dim` or per-tensor) and the
    dequantized float32 weights. pow2: scales 2^-k (exact products with dyadic inputs)."""
    data = rng.integers(-127, 128, shape).astype(np.int8)
    count = shape[dim] if per_channel else 1
    if pow2:
        scales = np.array([2.0 ** -draw(st.integers(3, 9)) for _ in range(count)], np.float32)
    else:
        scales = np.array([draw(S.scales(1e-3, 0.05)) for _ in range(count)], np.float32)
    quant = (scales, np.zeros(count, np.int64), dim if per_channel else 0)
    b_shape = [1] * len(shape)
    if per_channel:
        b_shape[dim] = count
    real = (data.astype(np.float64) * scales.reshape(b_shape)).astype(np.float32)
    return data, quant, real


@st.composite
def activations_in(draw, shape):
    """Float inputs of a random magnitude, sometimes shifted off zero (all one sign: the
    asymmetric quantization's case) and sometimes with an all-zero first batch row (LiteRT
    gives such a row scale 1 and skips it)."""
    rng = np.random.default_rng(draw(S.seeds()))
    x = rng.normal(size=shape) * draw(st.floats(0.05, 20.0))
    if draw(st.booleans()):
        x = x + draw(st.floats(-3.0, 3.0)) * np.abs(x).max()
    x = x.astype(np.float32)
    if shape[0] > 1 and draw(st.integers(0, 4)) == 0:
        x[0] = 0
    return x


def _input_scales(x, rows, asymmetric):
    """The scale LiteRT's hybrid kernel gives each of `rows` rows of x (float64)."""
    r = np.asarray(x, np.float64).reshape(rows, -1)
    if asymmetric:
        return (np.maximum(r.max(axis=1), 0) - np.minimum(r.min(axis=1), 0)) / 255.0
    return np.abs(r).max(axis=1) / 127.0


def _bound(a1, a2, bias, s, n_terms):
    """The module docstring's BOUND; a1, a2 like the output, s broadcastable to it."""
    absb = 0.0 if bias is None else np.abs(np.asarray(bias, np.float64))
    return (0.5 + ROUNDING_OF_S) * s * a1 + (n_terms + 8) * U * (a2 + s * a1 + absb)


def _assert_within(ours, litert, bound, what):
    ours, litert = np.asarray(ours, np.float64), np.asarray(litert, np.float64)
    assert ours.shape == litert.shape, f"{what}: shape {ours.shape} != {litert.shape}"
    err = np.abs(ours - litert)
    ratio = err / np.maximum(bound, 1e-300)
    worst = np.unravel_index(np.argmax(ratio), ratio.shape)
    assert np.all(err <= bound), (f"{what}: |ours - LiteRT| = {err[worst]:.4g} > bound "
                                  f"{bound[worst]:.4g} at {worst} ({int((err > bound).sum())} "
                                  f"of {err.size} elements)")


# -- models ---------------------------------------------------------------------------------------
def one_op(op, inputs, output, **options):
    return one_op_model(op, inputs, [output], **options)


def _fc(c, x_shape, weights, bias, act=None, asymmetric=False):
    return one_op("FULLY_CONNECTED", [Input(x_shape), weights, bias], Output(c["out_shape"]),
                  keep_num_dims=c["keep"], fused_activation_function=act or c["act"],
                  asymmetric_quantize_inputs=asymmetric)


def _fc_filter(c):
    return (c["units"], c["depth"])


def _conv(c, weights, bias, act=None):
    return one_op("CONV_2D", [Input(c["in_shape"]), weights, bias], Output(c["out_shape"]),
                  **_conv_options(c["padding"], c["s"], c["d"], act or c["act"]))


def _depthwise(c, weights, bias, act=None):
    options = dict(_depthwise_options(c), fused_activation_function=act or c["act"])
    return one_op("DEPTHWISE_CONV_2D", [Input(c["in_shape"]), weights, bias],
                  Output(c["out_shape"]), version=2, **options)


def _tconv(c, weights, bias, act=None):
    ins = [Const(np.array(c["out_shape"], np.int32)), weights, Input(c["in_shape"])]
    ins += [bias] if bias is not None else []
    return one_op("TRANSPOSE_CONV", ins, Output(c["out_shape"]), version=4,
                  padding=c["padding"], stride_h=c["s"][0], stride_w=c["s"][1],
                  fused_activation_function=act or c["act"])


def _tconv_terms(c):
    return -(-c["k"][0] // c["s"][0]) * -(-c["k"][1] // c["s"][1]) * c["in_shape"][3]


# The convolutions: model builder, filter shape from the case, the filter's output-channel
# dimension, and n (the products summed into one output, at most).
OPS = {
    "CONV_2D": dict(build=_conv, filter=lambda c: (c["c_out"], *c["k"], c["c_f"]), dim=0,
                    terms=lambda c: c["k"][0] * c["k"][1] * c["c_f"]),
    "DEPTHWISE_CONV_2D": dict(build=_depthwise, filter=lambda c: (1, *c["k"], c["c_out"]),
                              dim=3, terms=lambda c: c["k"][0] * c["k"][1]),
    "TRANSPOSE_CONV": dict(build=_tconv, filter=lambda c: (c["c_out"], *c["k"], c["in_shape"][3]),
                           dim=0, terms=_tconv_terms),
}


def _check_conv_family(op, c, per_channel, data, asymmetric):
    spec = OPS[op]
    rng = np.random.default_rng(data.draw(S.seeds(), label="weights seed"))
    q, quant, real = _int8_weights(data.draw, rng, spec["filter"](c), spec["dim"], per_channel)
    if asymmetric is None:          # CONV_2D: symmetric iff one group and one distinct scale
        asymmetric = c["in_shape"][3] != c["c_f"] or np.unique(quant[0]).size > 1
    bias = rng.normal(size=c["c_out"]).astype(np.float32)
    has_bias = op != "TRANSPOSE_CONV" or c["bias"]
    bias_in = Const(bias) if has_bias else None
    x = data.draw(activations_in(c["in_shape"]), label="x")
    model = spec["build"](c, Const(q, quant), bias_in)
    expected, = run_litert(model, [x])
    actual, = run_ours(model, [x])
    twin = spec["build"](c, Const(np.abs(real)),
                         Const(np.zeros(c["c_out"], np.float32)) if has_bias else None, "NONE")
    a1 = run_litert(twin, [np.ones_like(x)])[0].astype(np.float64)
    a2 = run_litert(twin, [np.abs(x)])[0].astype(np.float64)
    n = c["in_shape"][0]
    s = _input_scales(x, n, asymmetric).reshape(n, 1, 1, 1)
    bound = _bound(a1, a2, bias if has_bias else None, s, spec["terms"](c))
    kind = "per-channel" if per_channel else "per-tensor"
    _assert_within(actual, expected, bound, f"{op} ({kind})")


# -- ours vs LiteRT's hybrid kernels ------------------------------------------------------------
@given(case=fully_connected_case(), per_channel=st.booleans(), asymmetric=st.booleans(),
       data=st.data())
def test_fully_connected_within_the_hybrid_bound(case, per_channel, asymmetric, data):
    c = case
    rng = np.random.default_rng(data.draw(S.seeds(), label="weights seed"))
    q, quant, real = _int8_weights(data.draw, rng, _fc_filter(c), 0, per_channel)
    bias = rng.normal(size=c["units"]).astype(np.float32) if c["bias"] else None
    x = data.draw(activations_in(c["in_shape"]), label="x")
    model = _fc(c, c["in_shape"], Const(q, quant), Const(bias) if c["bias"] else None,
                asymmetric=asymmetric)
    expected, = run_litert(model, [x])
    actual, = run_ours(model, [x])
    rows = x.size // c["depth"]
    xr = x.reshape(rows, c["depth"]).astype(np.float64)
    a1 = np.broadcast_to(np.abs(real).sum(axis=1, dtype=np.float64), (rows, c["units"]))
    a2 = np.abs(xr) @ np.abs(real.astype(np.float64)).T
    s = _input_scales(x, rows, asymmetric)[:, None]
    bound = _bound(a1, a2, bias, s, c["depth"])
    _assert_within(actual.reshape(rows, -1), expected.reshape(rows, -1), bound,
                   "FULLY_CONNECTED")


@given(case=conv_case(), per_channel=st.booleans(), data=st.data())
def test_conv2d_within_the_hybrid_bound(case, per_channel, data):
    groups = case["in_shape"][3] // case["c_f"]
    per_channel = per_channel or groups > 1           # LiteRT: grouped needs per-channel scales
    _check_conv_family("CONV_2D", case, per_channel, data, None)


@given(case=depthwise_case(), data=st.data())
def test_depthwise_within_the_hybrid_bound(case, data):
    _check_conv_family("DEPTHWISE_CONV_2D", case, True, data, True)


@given(case=transpose_conv_case(), per_channel=st.booleans(), data=st.data())
def test_transpose_conv_within_the_hybrid_bound(case, per_channel, data):
    _check_conv_family("TRANSPOSE_CONV", case, per_channel, data, True)


# (op, filter scales: one, or one per output channel, asymmetric_quantize_inputs, groups, mode)
MODES = [("FULLY_CONNECTED", [0.01], False, 1, "symmetric"),
         ("FULLY_CONNECTED", [0.01], True, 1, "asymmetric"),
         ("CONV_2D", [0.01], False, 1, "symmetric"),
         ("CONV_2D", [0.01, 0.02], False, 1, "asymmetric"),
         ("CONV_2D", [0.01, 0.01], False, 1, "symmetric"),     # equal scales: per-tensor
         ("CONV_2D", [0.01, 0.01], False, 2, "asymmetric"),    # grouped: per-channel path
         ("DEPTHWISE_CONV_2D", [0.01, 0.02], False, 1, "asymmetric"),
         ("DEPTHWISE_CONV_2D", [0.01, 0.01], False, 1, "asymmetric"),
         ("TRANSPOSE_CONV", [0.01], False, 1, "asymmetric"),
         ("TRANSPOSE_CONV", [0.01, 0.02], False, 1, "asymmetric")]


@pytest.mark.parametrize("op,scales,option,groups,mode", MODES)
def test_litert_quantizes_inputs_as_stated(op, scales, option, groups, mode):
    """The input quantization each hybrid kernel uses, measured: inputs in [0, M] with M present
    in every quantized row (FULLY_CONNECTED: rows [M, r]; convolutions: one image holding M).
    Symmetric steps are M/127, asymmetric M/255, so over 4096 values the largest error
    |y - y'| / (|w| s/2) comes close to 1 with the right s and to 0.5 or 2 with the other:
    the bound above rests on the right one."""
    rng = np.random.default_rng(21)
    big = 3.0
    scales = np.array(scales, np.float32)
    quant = (scales, np.zeros(scales.size, np.int64), 3 if op == "DEPTHWISE_CONV_2D" else 0)
    if op == "FULLY_CONNECTED":
        x = np.stack([np.full(4096, big), rng.uniform(0, big, 4096)], axis=1).astype(np.float32)
        q = np.array([[0, 127]], np.int8)
        model = one_op(op, [Input(x.shape), Const(q, quant), None], Output((4096, 1)),
                       asymmetric_quantize_inputs=option)
    else:
        x = rng.uniform(0, big, (1, 64, 64, groups)).astype(np.float32)
        x[0, 0, 0, :] = big
        shape = (1, 1, 1, 2) if op == "DEPTHWISE_CONV_2D" else (2, 1, 1, 1)
        q = np.full(shape, 127, np.int8)
        opts = dict(padding="VALID", stride_h=1, stride_w=1)
        out = Output((1, 64, 64, 2))
        zero_bias = Const(np.zeros(2, np.float32))
        if op == "TRANSPOSE_CONV":
            model = one_op(op, [Const(np.array([1, 64, 64, 2], np.int32)), Const(q, quant),
                                Input(x.shape), zero_bias], out, version=3, **opts)
        else:
            if op == "DEPTHWISE_CONV_2D":
                opts["depth_multiplier"] = 2
            model = one_op(op, [Input(x.shape), Const(q, quant), zero_bias], out, **opts)
    expected, = run_litert(model, [x])
    actual, = run_ours(model, [x])
    step = big / (127.0 if mode == "symmetric" else 255.0)
    err = np.abs(actual.astype(np.float64) - expected).reshape(-1, expected.shape[-1])
    ratio = (err / (127 * np.resize(scales.astype(np.float64), err.shape[1]) * step / 2)).max()
    assert 0.9 <= ratio <= 1.001, f"{op}: worst error is {ratio:.3f} x |w| s/2 with {mode} s"


# -- LSTM ---------------------------------------------------------------------------------------
@given(case=lstm_case(layer_norm=False, activations=["TANH"]), w_scale=S.scales(1e-3, 0.02),
       seed=S.seeds())
def test_lstm_first_step_within_the_hybrid_bound(case, w_scale, seed):
    """LiteRT runs an LSTM with int8 weights and float input as a hybrid too (the input quantized
    per batch row, symmetric). First invoke, zero state (so the recurrent terms are 0 on both
    sides), no projection or layer norm, TANH cell activation. Per batch row and cell, each
    gate's pre-activation differs by at most d_g = the BOUND above (taps: the row's inputs),
    then with |i|, |g|, |o|, |tanh| <= 1 and sigmoid' <= 1/4, tanh' <= 1:
      i: d_i / 4 (CIFG: i = 1 - f, d_f / 4);  g: d_g;  c = i g (+ f * 0): dc <= di + dg + di dg
      o: (d_o + |p_o| dc) / 4 (peephole on the new cell);  h = o tanh(c): dh <= do + dc + do dc
    (cell_clip clamps: 1-Lipschitz) plus the float LSTM's own tolerance against LiteRT
    (FLOAT_RTOL of the largest output, tests/test_ops_sequence.py) for the nonlinearities."""
    assume(not case["projection"])
    x = lstm_x(case, seed)
    (expected, *_), = litert_steps(lstm_model(case, "variable", weight_q=w_scale), [x])
    actual, = run_ours(lstm_model(case, "zero", weight_q=w_scale), [x])
    w = {k: None if v is None else (v if k.startswith("b_") else
                                    quantize_array(v, (w_scale, 0)).astype(np.float64) * w_scale)
         for k, v in lstm_weights(case).items()}
    s = _input_scales(x, case["n_batch"], False)[:, None]               # [batch, 1]
    ax = np.abs(x.astype(np.float64))

    def d_gate(k):          # [batch, cell]
        a1 = np.abs(w["w_" + k]).sum(axis=1)[None, :]
        a2 = ax @ np.abs(w["w_" + k]).T
        return _bound(a1, a2, w["b_" + k], s, case["n_input"])

    di = d_gate("f") / 4 if case["cifg"] else d_gate("i") / 4
    dg = d_gate("c")
    dc = di + dg + di * dg
    p_o = np.abs(w["p_o"])[None, :] if case["peephole"] else 0.0
    do = (d_gate("o") + p_o * dc) / 4
    bound = do + dc + do * dc + FLOAT_RTOL * np.abs(expected).max()
    _assert_within(actual, expected, bound, "LSTM")


# -- ours == the float model with the dequantized weights (exact data) -----------------------------
@st.composite
def any_case(draw):
    op = draw(st.sampled_from(["FULLY_CONNECTED", *OPS]))
    case = draw({"FULLY_CONNECTED": fully_connected_case(), "CONV_2D": conv_case(),
                 "DEPTHWISE_CONV_2D": depthwise_case(),
                 "TRANSPOSE_CONV": transpose_conv_case()}[op])
    return op, case


def _exact_models(op, c, draw, rng, per_channel):
    """(dynamic-range model, its float twin with the dequantized weights, input shape), with
    power-of-two scales: every product and sum of dyadic data is exact in float32."""
    if op == "FULLY_CONNECTED":
        q, quant, real = _int8_weights(draw, rng, _fc_filter(c), 0, per_channel, pow2=True)
        bias = Const(_dyadic(rng, c["units"], 1)) if c["bias"] else None
        return (_fc(c, c["in_shape"], Const(q, quant), bias),
                _fc(c, c["in_shape"], Const(real), bias), c["in_shape"])
    spec = OPS[op]
    q, quant, real = _int8_weights(draw, rng, spec["filter"](c), spec["dim"], per_channel,
                                   pow2=True)
    bias = Const(_dyadic(rng, c["c_out"], 1)) if op != "TRANSPOSE_CONV" or c["bias"] else None
    return (spec["build"](c, Const(q, quant), bias), spec["build"](c, Const(real), bias),
            c["in_shape"])


@given(case=any_case(), per_channel=st.booleans(), data=st.data(), seed=S.seeds())
def test_equals_the_float_model_with_dequantized_weights(case, per_channel, data, seed):
    """What the GPU delegate computes: the float op on the dequantized weights. Held to LiteRT's
    float kernels on the twin model (per-tensor DEPTHWISE_CONV_2D included, which LiteRT's
    hybrid kernel gets wrong)."""
    op, c = case
    rng = np.random.default_rng(seed)
    model, twin, in_shape = _exact_models(op, c, data.draw, rng, per_channel)
    x = _dyadic(rng, in_shape, 3)
    expected, = run_litert(twin, [x])
    actual, = run_ours(model, [x])
    assert_float_close(actual, expected, what=op)


# -- XNNPACK -------------------------------------------------------------------------------------
@given(data=st.data(), per_channel=st.booleans(),
       op=st.sampled_from(["FULLY_CONNECTED", "CONV_2D"]))
def test_xnnpack_within_the_hybrid_bound(data, per_channel, op):
    """LiteRT's default path: XNNPACK runs hybrid FULLY_CONNECTED and CONV_2D with its own
    asymmetric quantization per row (per image or finer for CONV_2D), and leaves to the builtin
    kernels whatever it declines. Either way a step is at most the symmetric one
    (max|x| / 127 >= (max(x, 0) - min(x, 0)) / 255), so the bound uses that."""
    rng = np.random.default_rng(data.draw(S.seeds(), label="weights seed"))
    if op == "FULLY_CONNECTED":
        c = data.draw(fully_connected_case(), label="case")
        q, quant, real = _int8_weights(data.draw, rng, _fc_filter(c), 0, per_channel)
        bias = rng.normal(size=c["units"]).astype(np.float32) if c["bias"] else None
        x = data.draw(activations_in(c["in_shape"]), label="x")
        model = _fc(c, c["in_shape"], Const(q, quant), Const(bias) if c["bias"] else None,
                    asymmetric=data.draw(st.booleans(), label="asymmetric option"))
        rows = x.size // c["depth"]
        a1 = np.broadcast_to(np.abs(real).sum(axis=1, dtype=np.float64), (rows, c["units"]))
        a2 = np.abs(x.reshape(rows, -1).astype(np.float64)) @ np.abs(real.astype(np.float64)).T
        s = _input_scales(x, rows, False)[:, None]
        n_terms, shape = c["depth"], (rows, c["units"])
    else:
        c = data.draw(conv_case(), label="case")
        per_channel = per_channel or c["in_shape"][3] != c["c_f"]
        q, quant, real = _int8_weights(data.draw, rng, OPS[op]["filter"](c), 0, per_channel)
        bias = rng.normal(size=c["c_out"]).astype(np.float32)
        x = data.draw(activations_in(c["in_shape"]), label="x")
        model = _conv(c, Const(q, quant), Const(bias))
        twin = _conv(c, Const(np.abs(real)), Const(np.zeros(c["c_out"], np.float32)), "NONE")
        a1 = run_litert(twin, [np.ones_like(x)])[0].astype(np.float64)
        a2 = run_litert(twin, [np.abs(x)])[0].astype(np.float64)
        n = c["in_shape"][0]
        s = _input_scales(x, n, False).reshape(n, 1, 1, 1)
        n_terms, shape = OPS[op]["terms"](c), c["out_shape"]
    bound = _bound(a1, a2, bias, s, n_terms)
    expected, = run_litert(model, [x], kernels="xnnpack")
    actual, = run_ours(model, [x])
    _assert_within(actual.reshape(shape), expected.reshape(shape), bound, f"{op} vs XNNPACK")


# -- weight-only int8 (DEQUANTIZE of a constant, folded at prepare) -----------------------------
def _weight_only_model(rng, per_channel_scales):
    """int8 filter -> DEQUANTIZE -> float CONV_2D: the newer converters' weight-only form."""
    b = ModelBuilder()
    g = b.subgraph()
    x = g.input("x", (1, 6, 5, 3))
    q = rng.integers(-127, 128, (4, 3, 3, 3)).astype(np.int8)
    w8 = g.const("w8", q, quantization=(per_channel_scales, np.zeros(4, np.int64), 0))
    w32 = g.tensor("w32", (4, 3, 3, 3))
    g.op("DEQUANTIZE", [w8], [w32])
    y = g.tensor("y", (1, 6, 5, 4))
    g.op("CONV_2D", [x, w32, g.const("bias", _dyadic(rng, 4, 1))], [y], padding="SAME",
         stride_h=1, stride_w=1, fused_activation_function="RELU6")
    g.output(y)
    return b.finish()


# -- the delegate ------------------------------------------------------------------------------
@settings(max_examples=TAICHI_EXAMPLES)
@given(case=any_case(), per_channel=st.booleans(), data=st.data(), seed=S.seeds())
def test_delegate_takes_dynamic_range_ops(taichi_workers, case, per_channel, data, seed):
    """Every op delegated (no fallback: the int8 weights are dequantized into the weights
    buffer) and within 1e-5 of the largest magnitude of the reference."""
    op, c = case
    rng = np.random.default_rng(seed)
    model, _, in_shape = _exact_models(op, c, data.draw, rng, per_channel)
    summaries = check_delegate(model, taichi_workers, [_dyadic(rng, in_shape, 3)])
    for backend, summary in summaries.items():
        assert summary["ops_delegated"] == 1, (backend, summary)


def _chain_model(rng):
    """CONV_2D (per-channel) -> DEPTHWISE_CONV_2D (per-channel) -> FULLY_CONNECTED (per-tensor),
    all dynamic-range, power-of-two scales: one partition."""
    b = ModelBuilder()
    g = b.subgraph()
    x = g.input("x", (2, 6, 6, 3))

    def w8(name, shape, dim, per_channel):
        count = shape[dim] if per_channel else 1
        scales = (2.0 ** -rng.integers(4, 8, count)).astype(np.float32)
        return g.const(name, rng.integers(-127, 128, shape).astype(np.int8),
                       quantization=(scales, np.zeros(count, np.int64), dim if per_channel else 0))

    c1, c2, y = g.tensor("c1", (2, 3, 3, 4)), g.tensor("c2", (2, 3, 3, 8)), g.tensor("y", (2, 5))
    g.op("CONV_2D", [x, w8("w1", (4, 3, 3, 3), 0, True), g.const("b1", _dyadic(rng, 4, 1))], [c1],
         padding="SAME", stride_h=2, stride_w=2, fused_activation_function="RELU")
    g.op("DEPTHWISE_CONV_2D", [c1, w8("w2", (1, 3, 3, 8), 3, True),
                               g.const("b2", _dyadic(rng, 8, 1))], [c2],
         padding="SAME", stride_h=1, stride_w=1, depth_multiplier=2)
    g.op("FULLY_CONNECTED", [c2, w8("w3", (5, 72), 0, False), g.const("b3", _dyadic(rng, 5, 1))],
         [y], fused_activation_function="NONE")
    g.output(y)
    return b.finish()


def test_delegate_dynamic_range_chain_is_one_partition(taichi_workers):
    rng = np.random.default_rng(11)
    model = _chain_model(rng)
    summaries = check_delegate(model, taichi_workers, [_dyadic(rng, (2, 6, 6, 3), 2)])
    for backend, summary in summaries.items():
        assert summary["ops_delegated"] == 3 and len(summary["partitions"]) == 1, (backend, summary)


def test_delegate_weight_only_int8_is_folded_then_delegated(taichi_workers):
    rng = np.random.default_rng(12)
    model = _weight_only_model(rng, (2.0 ** -rng.integers(4, 8, 4)).astype(np.float32))
    x = _dyadic(rng, (1, 6, 5, 3), 3)
    check_against_litert(model, [x])
    summaries = check_delegate(model, taichi_workers, [x])
    for backend, summary in summaries.items():
        assert summary["ops_folded"] == 1 and summary["ops_delegated"] == 1, (backend, summary)


def test_delegate_lstm_with_int8_weights(taichi_workers):
    """A dynamic-range LSTM (int8 weights, float input and state) on the delegate."""
    case = dict(n_batch=2, n_input=5, n_cell=4, n_output=3, cifg=False, peephole=True,
                projection=True, projection_bias=True, layer_norm=False, act="TANH",
                cell_clip=0.0, proj_clip=0.0, seed=16, n_inputs=20)
    rng = np.random.default_rng(16)
    feeds = [rng.uniform(-2, 2, shape).astype(np.float32) for shape in ((2, 5), (2, 3), (2, 4))]
    summaries = check_delegate(lstm_model(case, "input", weight_q=0.01), taichi_workers, feeds)
    for backend, summary in summaries.items():
        assert summary["ops_delegated"] == 1, (backend, summary)


def test_weights_buffer_holds_the_dequantized_int8_weights():
    """The delegate's weights buffer (planner) carries the int8 constant as its real values."""
    from tflite_taichi.interpreter import Interpreter
    from tflite_taichi.partition import build_schedule
    from tflite_taichi.planner import plan_partition
    rng = np.random.default_rng(13)
    q = rng.integers(-127, 128, (5, 7)).astype(np.int8)
    scales = rng.uniform(1e-3, 0.05, 5).astype(np.float32)
    model = one_op("FULLY_CONNECTED", [Input((3, 7)), Const(q, (scales, np.zeros(5, np.int64), 0)),
                                       Const(np.ones(5, np.float32))], Output((3, 5)))
    it = Interpreter(model_content=model, backend="reference")
    it.allocate_tensors()
    prepared = it._main.prepared
    schedule = build_schedule(prepared, warn=False)
    [partition] = schedule.partitions
    plan = plan_partition(partition, prepared)
    # FULLY_CONNECTED's weights are packed [D, U] (units innermost) for its kernel
    ref = plan.packed[(0, 1)]
    expected = (q.astype(np.float64) * scales[:, None]).astype(np.float32).T.reshape(-1)
    np.testing.assert_array_equal(plan.weights[ref.offset:ref.offset + q.size], expected)


def test_fp16_on_vulkan(vulkan_workers):
    check_delegate(_chain_model(np.random.default_rng(14)), vulkan_workers, precision="fp16",
                   seed=1)


def test_gles(gles_worker):
    rng = np.random.default_rng(15)
    check_delegate(_chain_model(rng), [gles_worker], [_dyadic(rng, (2, 6, 6, 3), 2)])
