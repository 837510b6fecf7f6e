"""LOG_SOFTMAX, L2_NORMALIZATION, LOCAL_RESPONSE_NORMALIZATION vs LiteRT through one-op models:
float32, and int8/uint8 for the first two (with the fixed output quantization LiteRT's kernels
require). Tolerances: tflite_taichi.testing (LiteRT 2.3's quantized LOG_SOFTMAX and
L2_NORMALIZATION kernels matched the float view exactly on every case tried; for int8
LOG_SOFTMAX that is its optimized kernel: QUANTIZED_ORACLE says why).

LOCAL_RESPONSE_NORMALIZATION is held to LiteRT's optimized builtin kernel: its reference kernel
(BUILTIN_REF) sums the channel window c - radius .. c + radius - 1, one channel short of
TensorFlow's definition, which the optimized and XNNPACK kernels (and ours) follow."""
import numpy as np
import pytest
from hypothesis import given, strategies as st

from tflite_taichi.errors import ModelError
from tflite_taichi.testing import (Input, Output, check_against_litert, model_inputs,
                                   one_op_model, run_ours, strategies)

S = strategies()
ROW_OPS = ["LOG_SOFTMAX", "L2_NORMALIZATION"]
MAX_RANK = {"LOG_SOFTMAX": 5, "L2_NORMALIZATION": 4}
# the output quantization LiteRT's kernels require: dtype -> (scale, zero point)
FIXED_OUTPUT = {"LOG_SOFTMAX": {np.int8: (16 / 256, 127), np.uint8: (16 / 256, 255)},
                "L2_NORMALIZATION": {np.int8: (1 / 128, 0), np.uint8: (1 / 128, 128)}}


@st.composite
def row_case(draw, op):
    """(shape, input spread): the spread scales uniform [-1, 1] inputs, so rows range from
    near-constant to widely spread (LOG_SOFTMAX's exp underflows; L2's norms vary)."""
    shape = draw(S.shapes(1, MAX_RANK[op], 1, 7))
    spread = draw(st.sampled_from([0.01, 1.0, 5.0, 40.0]))
    return shape, spread


def row_inputs(shape, spread, seed, zero_rows=False):
    rng = np.random.default_rng(seed)
    x = (rng.uniform(-1, 1, shape) * spread).astype(np.float32)
    if zero_rows and len(shape) > 1:
        x[..., ::2, :] = 0.0          # whole rows of zeros: L2's epsilon
    return [x]


def row_model(op, shape, dtype=np.float32, qi=None):
    qo = FIXED_OUTPUT[op][dtype] if dtype in (np.int8, np.uint8) else None
    return one_op_model(op, [Input(shape, dtype, qi)], [Output(shape, dtype, qo)])


@pytest.mark.parametrize("op", ROW_OPS)
@given(data=st.data(), seed=S.seeds())
def test_float32_matches_litert(op, data, seed):
    shape, spread = data.draw(row_case(op))
    zero_rows = op == "L2_NORMALIZATION" and data.draw(st.booleans())
    check_against_litert(row_model(op, shape), row_inputs(shape, spread, seed, zero_rows))


@pytest.mark.parametrize("op", ROW_OPS)
@pytest.mark.parametrize("dtype", [np.int8, np.uint8])
@given(data=st.data(), seed=S.seeds())
def test_quantized_matches_litert(op, dtype, data, seed):
    shape, _ = data.draw(row_case(op))
    qi = data.draw(S.quant_params(dtype, scale_range=(1e-3, 0.5)))
    check_against_litert(row_model(op, shape, dtype, qi), seed=seed,
                         kernels=QUANTIZED_ORACLE.get((op, np.dtype(dtype)), "reference"))


# LiteRT 2.3's int8 LOG_SOFTMAX: its reference kernel (BUILTIN_REF) sends elements whose
# log-softmax is below about -15.6 to -128 (seen: a row spread 15.65 apart, -128 where
# round(-15.65 * 16) + 127 = -123), while its optimized kernel, the one a user's interpreter
# runs (XNNPACK takes no LOG_SOFTMAX), gives -123, as the float view does: held to that one.
QUANTIZED_ORACLE = {("LOG_SOFTMAX", np.dtype(np.int8)): "builtin"}


@st.composite
def lrn_case(draw):
    """(shape, options): 4-D inputs, radius up to past the depth, bias > 0 and alpha >= 0 so
    the base stays positive (TensorFlow's domain)."""
    shape = draw(S.shapes(4, 4, 1, 6))
    radius = draw(st.integers(0, 7))
    bias = draw(st.sampled_from([1e-2, 0.5, 1.0, 2.0]))
    alpha = draw(st.sampled_from([0.0, 1e-4, 0.1, 1.0]))
    beta = draw(st.sampled_from([0.0, 0.25, 0.5, 0.75, 1.5]))
    return shape, dict(radius=radius, bias=bias, alpha=alpha, beta=beta)


def lrn_model(shape, options):
    return one_op_model("LOCAL_RESPONSE_NORMALIZATION", [Input(shape)], [Output(shape)], **options)


@given(case=lrn_case(), seed=S.seeds())
def test_lrn_float32_matches_litert(case, seed):
    shape, options = case
    check_against_litert(lrn_model(shape, options), seed=seed, kernels="builtin")


def test_lrn_window_is_symmetric():
    # one channel lit: with radius 1 its square reaches exactly the channels either side
    x = np.zeros((1, 1, 1, 5), np.float32)
    x[..., 2] = 2.0
    x[..., [1, 3, 4]] = 1.0
    model = lrn_model((1, 1, 1, 5), dict(radius=1, bias=1.0, alpha=1.0, beta=1.0))
    y = check_against_litert(model, [x], kernels="builtin")[0]
    sums = np.array([1, 1 + 4, 1 + 4 + 1, 4 + 1 + 1, 1 + 1], np.float32)
    np.testing.assert_allclose(y[0, 0, 0], x[0, 0, 0] / (1 + sums), rtol=1e-6)


# -- invalid attributes --------------------------------------------------------------------------
def _refused(model, op, match=None):
    with pytest.raises(ModelError, match=op + (f".*{match}" if match else "")):
        run_ours(model, model_inputs(model))


@pytest.mark.parametrize("op", ROW_OPS)
@pytest.mark.parametrize("dtype", [np.int8, np.uint8])
def test_wrong_output_quantization_is_refused(op, dtype):
    scale, zp = FIXED_OUTPUT[op][dtype]
    for q in [(scale * 2, zp), (scale, zp - 1)]:
        model = one_op_model(op, [Input((2, 5), dtype, (0.1, 3))], [Output((2, 5), dtype, q)])
        _refused(model, op, "quantized with scale")


@pytest.mark.parametrize("op", ROW_OPS)
def test_rank_0_is_refused(op):
    _refused(one_op_model(op, [Input(())], [Output(())]), op, "rank")


@pytest.mark.parametrize("op", ROW_OPS + ["LOCAL_RESPONSE_NORMALIZATION"])
def test_int32_is_refused(op):
    model = one_op_model(op, [Input((1, 2, 2, 3), np.int32)], [Output((1, 2, 2, 3), np.int32)])
    _refused(model, op, "dtype int32")


def test_l2_rank_5_is_refused():
    model = one_op_model("L2_NORMALIZATION", [Input((1, 1, 2, 2, 3))], [Output((1, 1, 2, 2, 3))])
    _refused(model, "L2_NORMALIZATION", "rank")


def test_l2_fused_activation_is_refused():
    model = one_op_model("L2_NORMALIZATION", [Input((2, 3))], [Output((2, 3))],
                         fused_activation_function="RELU")
    _refused(model, "L2_NORMALIZATION", "RELU")


@pytest.mark.parametrize("shape", [(2, 3, 4), (1, 1, 2, 3, 4)])
def test_lrn_needs_rank_4(shape):
    model = lrn_model(shape, dict(radius=1, bias=1.0, alpha=1.0, beta=0.5))
    _refused(model, "LOCAL_RESPONSE_NORMALIZATION", "rank")


def test_lrn_negative_radius_is_refused():
    model = lrn_model((1, 2, 2, 3), dict(radius=-1, bias=1.0, alpha=1.0, beta=0.5))
    _refused(model, "LOCAL_RESPONSE_NORMALIZATION", "radius")


def test_lrn_int8_is_refused():
    model = one_op_model("LOCAL_RESPONSE_NORMALIZATION", [Input((1, 2, 2, 3), np.int8, (0.1, 0))],
                         [Output((1, 2, 2, 3), np.int8, (0.1, 0))], radius=1, bias=1.0,
                         alpha=1.0, beta=0.5)
    _refused(model, "LOCAL_RESPONSE_NORMALIZATION", "int8")
