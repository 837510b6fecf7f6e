"""The Taichi delegate's CONV_2D (grouped too), DEPTHWISE_CONV_2D, TRANSPOSE_CONV,
FULLY_CONNECTED, CUSTOM:Convolution2DTransposeBias (ops/conv/), AVERAGE_POOL_2D,
MAX_POOL_2D and L2_POOL_2D (float32 only, as LiteRT) (ops/pooling.py) against the reference path, through one-op models, on every
backend under test (cpu, vulkan, opengl; see conftest.py), float32 and int8; fp16 on vulkan;
GLES; and what stays on the CPU (the supports() refusals).

One case table (CONV_ROWS, tests/cases/conv.py: a row per op and dtype) drives one property
test; its cases come from the LiteRT tests' generators (tests/cases/conv.py, cases/pooling.py),
so the delegate sees the same attribute space. Global pools and fixed models (fp16, GLES) have
their own tests; the supports() refusals are a table too (REFUSED: cases.table.Refused), one
test. Float data are multiples of 1/8 (`_dyadic`): sums are then exact in float32 whatever the
order, as the reference and the kernels sum differently.
Tolerances: tflite_taichi.testing.TAICHI_RTOL (1e-5 of the largest magnitude; fp16 2^-9) and
one quantization unit for int8 outputs (check_delegate's rule)."""
import struct

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from cases.conv import CONV_ROWS, POOLS, _dyadic, _f32_inputs
from cases.table import Refused, check_refused, refused_id, row_id
from tflite_taichi.testing import (TAICHI_EXAMPLES, Const, Input, Output, check_delegate, check_op,
                                   one_op_model, strategies)

S = strategies()


@pytest.mark.parametrize("row", CONV_ROWS, ids=row_id)
def test_op_on_the_delegate(taichi_workers, row):
    check_op(row.cases, workers=taichi_workers)


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


# -- what stays on the CPU: supports() refusals --------------------------------------------------
def _unquantized_int8_weights(op):
    """An int8 constant without quantization is no float view the weights buffer can carry:
    the op runs on the reference path, with the reason."""
    rng = np.random.default_rng(3)
    if op == "CONV_2D":
        weights = Const(rng.integers(-3, 4, (4, 3, 3, 2)).astype(np.int8))
        return one_op_model(op, [Input((1, 5, 5, 2)), weights, Const(np.zeros(4, np.float32))],
                            [Output((1, 5, 5, 4))], padding="SAME", stride_h=1, stride_w=1)
    weights = Const(rng.integers(-3, 4, (4, 6)).astype(np.int8))
    return one_op_model(op, [Input((3, 6)), weights, None], [Output((3, 4))])


REFUSED = [
    Refused(f"{op} with unquantized int8 weights", _unquantized_int8_weights(op), op,
            "int8 without quantization")
    for op in ("CONV_2D", "FULLY_CONNECTED")
]


@pytest.mark.parametrize("case", REFUSED, ids=refused_id)
def test_what_stays_on_the_cpu(taichi_workers, case):
    check_refused(case, taichi_workers)
