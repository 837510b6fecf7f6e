"""The Taichi delegate's CONV_2D (grouped too), DEPTHWISE_CONV_2D, TRANSPOSE_CONV,
FULLY_CONNECTED, CUSTOM:Convolution2DTransposeBias (ops/conv.py), AVERAGE_POOL_2D,
MAX_POOL_2D and L2_POOL_2D (float32 only, as LiteRT) (ops/pooling.py) against the reference path, through one-op models, on every
backend under test (cpu, vulkan, opengl; see conftest.py), float32 and int8; fp16 on vulkan;
GLES; and the supports() refusal.

Cases come from the LiteRT tests' generators (tests/cases/conv.py, cases/pooling.py), so
the delegate sees the same attribute space. Float data are multiples of 1/8 (`_dyadic`): sums
are then exact in float32 whatever the order, as the reference and the kernels sum differently.
Tolerances: tflite_taichi.testing.TAICHI_RTOL (1e-5 of the largest magnitude; fp16 2^-9) and
one quantization unit for int8 outputs (check_delegate's rule)."""
import struct

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from cases.conv import (_conv_options, _depthwise_options, _dyadic, _int8_bias, _int8_filter,
                        _int8_output_scale, _tcb_options, _transpose_conv_model, conv_case,
                        depthwise_case, fully_connected_case, tcb_case, transpose_conv_case)
from cases.pooling import pool_case
from tflite_taichi.testing import (TAICHI_EXAMPLES, Const, Input, Output, check_delegate, check_op,
                                   one_op_model, strategies)

S = strategies()
POOLS = ["AVERAGE_POOL_2D", "MAX_POOL_2D"]         # float32 and int8
FLOAT_POOLS = POOLS + ["L2_POOL_2D"]


def _f32_inputs(rng, model_shapes):
    return [_dyadic(rng, shape, 3) for shape in model_shapes]


# -- models from the LiteRT tests' cases -------------------------------------------------------
def _conv_model(c, rng, int8=None):
    """int8: None for float32, else (draw, input quantization)."""
    if int8 is None:
        return one_op_model("CONV_2D", [Input(c["in_shape"]),
                                        Const(_dyadic(rng, (c["c_out"], *c["k"], c["c_f"]), 1)),
                                        Const(_dyadic(rng, c["c_out"], 1))],
                            [Output(c["out_shape"])],
                            **_conv_options(c["padding"], c["s"], c["d"], c["act"]))
    draw, qi = int8
    filt, fq, fscales = _int8_filter(draw, rng, (c["c_out"], *c["k"], c["c_f"]), 0)
    qo = (_int8_output_scale(draw, qi[0], fscales, c["k"][0] * c["k"][1] * c["c_f"]),
          draw(st.integers(-128, 127)))
    return one_op_model("CONV_2D", [Input(c["in_shape"], np.int8, qi), Const(filt, fq),
                                    _int8_bias(rng, qi[0], fscales, c["c_out"])],
                        [Output(c["out_shape"], np.int8, qo)],
                        **_conv_options(c["padding"], c["s"], c["d"], c["act"]))


def _depthwise_model(c, rng, int8=None):
    if int8 is None:
        return one_op_model("DEPTHWISE_CONV_2D",
                            [Input(c["in_shape"]), Const(_dyadic(rng, (1, *c["k"], c["c_out"]), 1)),
                             Const(_dyadic(rng, c["c_out"], 1))],
                            [Output(c["out_shape"])], version=2, **_depthwise_options(c))
    draw, qi = int8
    filt, fq, fscales = _int8_filter(draw, rng, (1, *c["k"], c["c_out"]), 3)
    qo = (_int8_output_scale(draw, qi[0], fscales, c["k"][0] * c["k"][1]),
          draw(st.integers(-128, 127)))
    return one_op_model("DEPTHWISE_CONV_2D",
                        [Input(c["in_shape"], np.int8, qi), Const(filt, fq),
                         _int8_bias(rng, qi[0], fscales, c["c_out"])],
                        [Output(c["out_shape"], np.int8, qo)], version=3,
                        **_depthwise_options(c))


def _tconv_model(c, rng, int8=None):
    w_shape = (c["c_out"], *c["k"], c["in_shape"][3])
    if int8 is None:
        inputs = [Const(_dyadic(rng, w_shape, 1)), Input(c["in_shape"])]
        if c["bias"]:
            inputs.append(Const(_dyadic(rng, c["c_out"], 1)))
        return _transpose_conv_model(c, inputs, Output(c["out_shape"]), 4)
    draw, qi = int8
    weights, wq, wscales = _int8_filter(draw, rng, w_shape, 0)
    taps = -(-c["k"][0] // c["s"][0]) * -(-c["k"][1] // c["s"][1]) * c["in_shape"][3]
    qo = (_int8_output_scale(draw, qi[0], wscales, taps), draw(st.integers(-128, 127)))
    inputs = [Const(weights, wq), Input(c["in_shape"], np.int8, qi)]
    if c["bias"]:
        inputs.append(_int8_bias(rng, qi[0], wscales, c["c_out"]))
    return _transpose_conv_model(c, inputs, Output(c["out_shape"], np.int8, qo), 4)


def _fc_options(c):
    return dict(keep_num_dims=c["keep"], fused_activation_function=c["act"])


def _tcb_model(c, rng):
    return one_op_model("CUSTOM:Convolution2DTransposeBias",
                        [Input(c["in_shape"]),
                         Const(_dyadic(rng, (c["c_out"], *c["k"], c["in_shape"][3]), 1)),
                         Const(_dyadic(rng, c["c_out"], 1))],
                        [Output(c["out_shape"])], custom_options=_tcb_options(c["padding"], c["s"]))


# -- float32 and int8 on every backend -------------------------------------------------------------
# The property tests go through check_op, the helper a user's op gets: a strategy of cases
# (model, inputs[, check_delegate's options]; inputs None: seeded from the model), each run on
# the reference path and on every worker's backend, delegated and matching.
@st.composite
def float32_cases(draw, case, make):
    """`make(case, rng)`'s model for a drawn case, its input dyadic (exact sums in any order)."""
    c, rng = draw(case), np.random.default_rng(draw(S.seeds()))
    return make(c, rng), _f32_inputs(rng, [c["in_shape"]])


@st.composite
def int8_cases(draw, case, make):
    """`make(case, rng, (draw, qi))`'s int8 model for a drawn case: filters, output scale and
    zero point drawn inside; inputs seeded from the model."""
    c, qi, seed = draw(case), draw(S.quant_params()), draw(S.seeds())
    return make(c, np.random.default_rng(seed), (draw, qi)), None, {"seed": seed}


@st.composite
def fully_connected_float32_cases(draw):
    """Constant weights (in the weights buffer) or weights and bias given at run time."""
    c, const_weights = draw(fully_connected_case()), draw(st.booleans())
    rng = np.random.default_rng(draw(S.seeds()))
    weights = _dyadic(rng, (c["units"], c["depth"]), 1)
    bias = _dyadic(rng, c["units"], 1)
    x = _dyadic(rng, c["in_shape"], 3)
    if const_weights:
        ins, feeds = [Input(c["in_shape"]), Const(weights), Const(bias) if c["bias"] else None], [x]
    else:
        extra = [Input(bias.shape)] if c["bias"] else []
        ins, feeds = [Input(c["in_shape"]), Input(weights.shape)] + extra, [x, weights]
        feeds += [bias] if c["bias"] else []
    return one_op_model("FULLY_CONNECTED", ins, [Output(c["out_shape"])], **_fc_options(c)), feeds


@st.composite
def fully_connected_int8_cases(draw):
    c, qi, seed = draw(fully_connected_case()), draw(S.quant_params()), draw(S.seeds())
    rng = np.random.default_rng(seed)
    weights, wq, wscales = _int8_filter(draw, rng, (c["units"], c["depth"]), 0)
    qo = (_int8_output_scale(draw, qi[0], wscales, c["depth"]), draw(st.integers(-128, 127)))
    model = one_op_model("FULLY_CONNECTED",
                         [Input(c["in_shape"], np.int8, qi), Const(weights, wq),
                          _int8_bias(rng, qi[0], wscales, c["units"], c["bias"])],
                         [Output(c["out_shape"], np.int8, qo)], **_fc_options(c))
    return model, None, {"seed": seed}


@st.composite
def pool_float32_cases(draw, op):
    case = draw(pool_case())
    model = one_op_model(op, [Input(case["in_shape"])], [Output(case["out_shape"])],
                         **case["options"])
    return model, _f32_inputs(np.random.default_rng(draw(S.seeds())), [case["in_shape"]])


@st.composite
def pool_int8_cases(draw, op):
    """One quantization for input and output (as converters write it), or two: the float
    view handles both."""
    case, qi, qo, same = draw(pool_case()), draw(S.quant_params()), draw(S.quant_params()), draw(
        st.booleans())
    model = one_op_model(op, [Input(case["in_shape"], np.int8, qi)],
                         [Output(case["out_shape"], np.int8, qi if same else qo)],
                         **case["options"])
    return model, None, {"seed": draw(S.seeds())}


def test_conv2d_float32(taichi_workers):
    check_op(float32_cases(conv_case(), _conv_model), workers=taichi_workers)


def test_conv2d_int8(taichi_workers):
    check_op(int8_cases(conv_case(), _conv_model), workers=taichi_workers)


def test_depthwise_float32(taichi_workers):
    check_op(float32_cases(depthwise_case(), _depthwise_model), workers=taichi_workers)


def test_depthwise_int8(taichi_workers):
    check_op(int8_cases(depthwise_case(), _depthwise_model), workers=taichi_workers)


def test_transpose_conv_float32(taichi_workers):
    check_op(float32_cases(transpose_conv_case(), _tconv_model), workers=taichi_workers)


def test_transpose_conv_int8(taichi_workers):
    check_op(int8_cases(transpose_conv_case(), _tconv_model), workers=taichi_workers)


def test_fully_connected_float32(taichi_workers):
    check_op(fully_connected_float32_cases(), workers=taichi_workers)


def test_fully_connected_int8(taichi_workers):
    check_op(fully_connected_int8_cases(), workers=taichi_workers)


def test_transpose_conv_bias_float32(taichi_workers):
    check_op(float32_cases(tcb_case(stride_within_kernel=False), _tcb_model), workers=taichi_workers)


@pytest.mark.parametrize("op", FLOAT_POOLS)
def test_pool_float32(taichi_workers, op):
    check_op(pool_float32_cases(op), workers=taichi_workers)


@pytest.mark.parametrize("op", POOLS)
def test_pool_int8(taichi_workers, op):
    check_op(pool_int8_cases(op), workers=taichi_workers)


@st.composite
def global_pool_case(draw):
    """A pool whose one output position's window covers the input: VALID with the input's
    size, or SAME with a stride and filter at least the input's (padding inside the window)."""
    n, h, w = draw(st.integers(1, 2)), draw(st.integers(1, 40)), draw(st.integers(1, 40))
    c = draw(st.sampled_from([1, 3, 16, 40]))
    if draw(st.booleans()):
        options = dict(padding="VALID", filter_height=h, filter_width=w)
    else:
        options = dict(padding="SAME", filter_height=h + draw(st.integers(0, 2)),
                       filter_width=w + draw(st.integers(0, 2)))
    options.update(stride_h=max(h, 1), stride_w=max(w, 1),
                   fused_activation_function=draw(st.sampled_from(["NONE", "RELU", "RELU6"])))
    return dict(in_shape=(n, h, w, c), out_shape=(n, 1, 1, c), options=options)


@pytest.mark.parametrize("op", POOLS)
@settings(max_examples=TAICHI_EXAMPLES)
@given(case=global_pool_case(), int8=st.booleans(), qi=S.quant_params(), seed=S.seeds())
def test_global_pool_is_a_split_reduction(taichi_workers, op, case, int8, qi, seed):
    """Global pools (squeeze-excite, classifier heads) run as reduce.py's split reduction:
    two tasks (shares, then their combination) where the taps are many, and the pool's
    answers either way. A serial `cpu` partition (costs.cpu_loop_threads: small work) runs its
    loops in one serial task, in order: one task however many loops."""
    dtype, q = (np.int8, qi) if int8 else (np.float32, None)
    model = one_op_model(op, [Input(case["in_shape"], dtype, q)],
                         [Output(case["out_shape"], dtype, q)], **case["options"])
    inputs = None if int8 else _f32_inputs(np.random.default_rng(seed), [case["in_shape"]])
    n, h, w, c = case["in_shape"]
    from tflite_taichi.ops.reduce import reduce_scratch_size
    split = reduce_scratch_size(n * c, h * w) > 0
    for backend, s in check_delegate(model, taichi_workers, inputs, seed=seed).items():
        serial = s["partitions"][0]["cpu_threads"] == 1
        assert backend == "cpu" or s["partitions"][0]["cpu_threads"] == 0, (backend, s["partitions"])
        if s["runtime"].get("tasks_per_invoke"):
            expected = 2 if split and not serial else 1
            assert s["runtime"]["tasks_per_invoke"] == expected, (backend, case, s["runtime"])


@settings(max_examples=max(TAICHI_EXAMPLES // 2, 3))
@given(case=global_pool_case(), seed=S.seeds())
def test_global_l2_pool_is_one_thread_per_output(taichi_workers, case, seed):
    """reduce.py has no sum of squares: a global L2 pool stays one task, each thread walking
    its whole window."""
    model = one_op_model("L2_POOL_2D", [Input(case["in_shape"])], [Output(case["out_shape"])],
                         **case["options"])
    inputs = _f32_inputs(np.random.default_rng(seed), [case["in_shape"]])
    for backend, s in check_delegate(model, taichi_workers, inputs).items():
        if s["runtime"].get("tasks_per_invoke"):
            assert s["runtime"]["tasks_per_invoke"] == 1, (backend, case, s["runtime"])


def test_a_128x128_global_pool_is_split_into_balanced_shares():
    from tflite_taichi.ops.reduce import reduce_scratch_size
    assert reduce_scratch_size(16, 128 * 128) == 128 * 16     # 128 shares of 128 taps


# -- fixed models: fp16 on vulkan, GLES -------------------------------------------------------
def _fixed_models():
    rng = np.random.default_rng(7)
    d = lambda *shape: _dyadic(rng, shape, 1)  # noqa: E731
    conv = dict(padding="SAME", stride_h=2, stride_w=1, dilation_h_factor=1,
                dilation_w_factor=2, fused_activation_function="RELU6")
    return {
        "CONV_2D": one_op_model("CONV_2D", [Input((1, 9, 8, 4)), Const(d(6, 3, 3, 2)),
                                            Const(d(6))], [Output((1, 5, 8, 6))], **conv),
        "DEPTHWISE_CONV_2D": one_op_model(
            "DEPTHWISE_CONV_2D", [Input((1, 9, 8, 3)), Const(d(1, 3, 3, 6)), Const(d(6))],
            [Output((1, 5, 8, 6))], depth_multiplier=2, **conv),
        "TRANSPOSE_CONV": one_op_model(
            "TRANSPOSE_CONV", [Const(np.array([1, 9, 8, 5], np.int32)), Const(d(5, 3, 3, 4)),
                               Input((1, 5, 4, 4)), Const(d(5))],
            [Output((1, 9, 8, 5))], version=4, padding="SAME", stride_h=2, stride_w=2,
            fused_activation_function="RELU"),
        "FULLY_CONNECTED": one_op_model(
            "FULLY_CONNECTED", [Input((2, 3, 16)), Const(d(7, 16)), Const(d(7))],
            [Output((2, 3, 7))], keep_num_dims=True, fused_activation_function="RELU_N1_TO_1"),
        "Convolution2DTransposeBias": one_op_model(
            "CUSTOM:Convolution2DTransposeBias", [Input((1, 5, 6, 4)), Const(d(3, 4, 4, 4)),
                                                  Const(d(3))],
            [Output((1, 10, 12, 3))], custom_options=struct.pack("<iii", 1, 2, 2)),
        "AVERAGE_POOL_2D": one_op_model(
            "AVERAGE_POOL_2D", [Input((2, 9, 7, 3))], [Output((2, 3, 3, 3))], padding="SAME",
            filter_height=3, filter_width=4, stride_h=3, stride_w=3),
        "MAX_POOL_2D": one_op_model(
            "MAX_POOL_2D", [Input((2, 9, 7, 3))], [Output((2, 4, 2, 3))], padding="VALID",
            filter_height=3, filter_width=4, stride_h=2, stride_w=2,
            fused_activation_function="RELU"),
        "L2_POOL_2D": one_op_model(
            "L2_POOL_2D", [Input((2, 9, 7, 3))], [Output((2, 3, 4, 3))], padding="SAME",
            filter_height=4, filter_width=3, stride_h=3, stride_w=2,
            fused_activation_function="RELU6"),      # inputs in -3..3: RMS below 6
    }


FIXED = _fixed_models()


@pytest.mark.parametrize("name", list(FIXED))
def test_fp16_on_vulkan(vulkan_workers, name):
    check_delegate(FIXED[name], vulkan_workers, precision="fp16", seed=1)


@pytest.mark.parametrize("name", list(FIXED))
def test_gles(gles_worker, name):
    check_delegate(FIXED[name], [gles_worker], seed=2)


# -- supports() refusals -----------------------------------------------------------------------
@pytest.mark.parametrize("op", ["CONV_2D", "FULLY_CONNECTED"])
def test_unquantized_int8_weights_stay_on_the_cpu(taichi_workers, op):
    """An int8 constant without quantization is no float view the weights buffer can carry:
    the op runs on the reference path, with the reason."""
    rng = np.random.default_rng(3)
    w_shape = (4, 3, 3, 2) if op == "CONV_2D" else (4, 6)
    weights = Const(rng.integers(-3, 4, w_shape).astype(np.int8))
    if op == "CONV_2D":
        model = one_op_model(op, [Input((1, 5, 5, 2)), weights, Const(np.zeros(4, np.float32))],
                             [Output((1, 5, 5, 4))], padding="SAME", stride_h=1, stride_w=1)
    else:
        model = one_op_model(op, [Input((3, 6)), weights, None], [Output((3, 4))])
    summaries = check_delegate(model, taichi_workers, expect_all_delegated=False)
    for backend, summary in summaries.items():
        assert summary["ops_delegated"] == 0, backend
        [row] = summary["fallback"]
        assert row["op"] == op and "int8 without quantization" in row["reason"], row
