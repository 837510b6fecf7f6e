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
from tflite_taichi.testing import (Input, Output, check_against_litert, model_inputs, one_op_model,
                                   run_ours)
from cases.normalization import FIXED_OUTPUT, ROW_OPS, S, lrn_case, lrn_model, row_case, row_inputs, row_model


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
