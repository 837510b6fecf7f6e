"""Math ops (ops/arith.py) vs LiteRT through one-op models: float32, int8 where LiteRT has an int8
kernel, int32 (and raw int8/int16/int64) where the op computes on integers. Tolerances:
tflite_taichi.testing (1e-5 of the largest magnitude; 1 unit).

Oracle: LiteRT's reference kernels, except CEIL, ROUND and ELU, which BUILTIN_REF lacks in
LiteRT 2.3 ("Didn't find op"): its builtin kernels there.

LiteRT's int8 kernels, measured over 300 random cases each (ops/arith.py docstring): ABS
(requantizing multiplier) and SQRT (truncating, not rounding) within 1 unit; RSQRT (fixed
point), LOG, GELU (both forms) and ELU (256-entry tables) exact. LiteRT's int8 NEG,
FLOOR_DIV and FLOOR_MOD ignore the quantization (raw integers), so they are compared where
that coincides with real arithmetic: zero points 0 and one scale (FLOOR_DIV: output scale 1;
NEG: no -128 input, which LiteRT wraps to -128). Its int16 tables for RSQRT, LOG and GELU
interpolate 513 entries and miss by up to thousands of units near their curved ends, so int16
is compared for ABS and SQRT only.

ATAN2 vs LiteRT with equal shapes (LiteRT does not broadcast), float32 and float64, every pair
of special values; broadcast shapes and int8 (no LiteRT kernel) against np.arctan2. RIGHT_SHIFT
vs LiteRT in its six integer types, counts beyond the bit width and negative included.
"""
import numpy as np
import pytest
from hypothesis import given, strategies as st

from tflite_taichi.errors import ModelError
from tflite_taichi.interpreter import Interpreter
from tflite_taichi.testing import (Const, Input, Output, check_against_litert, one_op_model,
                                   run_ours, strategies)
from cases.elementwise import broadcast_pair
from cases.arith import ATAN2_SPECIALS, BINARY, UNARY, atan2_data, binary_data, unary_data, unary_options

S = strategies()
NOT_IN_BUILTIN_REF = {"CEIL", "ROUND", "ELU"}
# LiteRT int8 kernels that compute on real values (NEG, FLOOR_DIV, FLOOR_MOD: see above)
INT8_UNARY = ["ABS", "SQRT", "RSQRT", "LOG", "GELU", "ELU"]


def kernels(op):
    return "builtin" if op in NOT_IN_BUILTIN_REF else "reference"


# -- float32 -----------------------------------------------------------------------------------
@pytest.mark.parametrize("op", UNARY)
@given(shape=S.shapes(0, 4), magnitude=st.sampled_from([1.0, 4.0, 30.0]),
       approximate=st.booleans(), seed=S.seeds())
def test_unary_float32_matches_litert(op, shape, magnitude, approximate, seed):
    rng = np.random.default_rng(seed)
    model = one_op_model(op, [Input(shape)], [Output(shape)], **unary_options(op, approximate))
    check_against_litert(model, [unary_data(op, rng, shape, magnitude)], kernels=kernels(op))


@pytest.mark.parametrize("op", BINARY)
@given(shapes=broadcast_pair(), const_rhs=st.booleans(), decimals=st.booleans(), seed=S.seeds())
def test_binary_float32_matches_litert(op, shapes, const_rhs, decimals, seed):
    a_shape, b_shape, out_shape = shapes
    rng = np.random.default_rng(seed)
    a, b = binary_data(op, rng, a_shape, b_shape, decimals)
    model = one_op_model(op, [Input(a_shape), Const(b) if const_rhs else Input(b_shape)],
                         [Output(out_shape)])
    check_against_litert(model, [a] + ([] if const_rhs else [b]))


@given(n=st.integers(2, 5), shape=S.shapes(0, 4), consts=st.lists(st.booleans(), min_size=5,
       max_size=5), seed=S.seeds())
def test_add_n_float32_matches_litert(n, shape, consts, seed):
    rng = np.random.default_rng(seed)
    values = [rng.uniform(-3, 3, shape).astype(np.float32) for _ in range(n)]
    consts[0] = False                       # LiteRT refuses a model without run-time inputs
    ins = [Const(v) if c else Input(shape) for v, c in zip(values, consts)]
    model = one_op_model("ADD_N", ins, [Output(shape)])
    check_against_litert(model, [v for v, c in zip(values, consts) if not c])


def test_special_values_match_litert():
    """NaN propagates; log/sqrt/rsqrt of negatives are NaN; zeros and infinities as LiteRT."""
    x = np.array([-1.0, 0.0, -0.0, np.nan, np.inf, -np.inf, 2.0, 1e-30], np.float32)
    for op in ["LOG", "SQRT", "RSQRT", "ABS", "NEG", "SQUARE", "SIGN", "FLOOR", "SIN", "GELU"]:
        model = one_op_model(op, [Input(x.shape)], [Output(x.shape)])
        check_against_litert(model, [x])
    for op in ["CEIL", "ROUND", "ELU"]:
        model = one_op_model(op, [Input(x.shape)], [Output(x.shape)])
        check_against_litert(model, [x], kernels="builtin")
    a = np.array([-2, -2, 0, 0, 0, np.nan, 1, -8, -0.0, 5, np.inf, 2], np.float32)
    b = np.array([3, 0.5, -1, 0, 2, 0, np.nan, 1 / 3, -1, np.inf, 2, -np.inf], np.float32)
    model = one_op_model("POW", [Input(a.shape), Input(b.shape)], [Output(a.shape)])
    check_against_litert(model, [a, b])
    a = np.array([5, -5, 0, -0.0, 7, -7, np.inf, np.nan, 3e38, 1e-38], np.float32)
    b = np.array([0, 0, 3, 3, np.inf, np.inf, 2, 2, 1e-30, 3e38], np.float32)
    model = one_op_model("FLOOR_MOD", [Input(a.shape), Input(b.shape)], [Output(a.shape)])
    check_against_litert(model, [a, b])


def test_round_is_half_to_even():
    x = np.array([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 0.49999997, 8388609.0, -2.5000002], np.float32)
    model = one_op_model("ROUND", [Input(x.shape)], [Output(x.shape)])
    out = check_against_litert(model, [x], kernels="builtin")[0]
    np.testing.assert_array_equal(out, [0, 2, 2, -0, -2, -2, 0, 8388609, -3])


def test_float_floor_div_rounds_in_double():
    a = np.array([1.0, 0.3, -1.0, 0.7, 6.0], np.float32)
    b = np.array([0.1, 0.1, 0.1, 0.1, 0.3], np.float32)
    model = one_op_model("FLOOR_DIV", [Input(a.shape), Input(b.shape)], [Output(a.shape)])
    out = check_against_litert(model, [a, b])[0]
    np.testing.assert_array_equal(out, [9, 3, -10, 6, 19])


# -- integers ------------------------------------------------------------------------------------
INT_UNARY = [("ABS", np.int32), ("ABS", np.int16), ("NEG", np.int32), ("NEG", np.int64),
             ("NEG", np.int8), ("SIGN", np.int32)]


@pytest.mark.parametrize("op,dtype", INT_UNARY)
@given(shape=S.shapes(0, 4), seed=S.seeds())
def test_unary_int_matches_litert(op, dtype, shape, seed):
    rng = np.random.default_rng(seed)
    info = np.iinfo(dtype)
    x = rng.integers(info.min + 1, info.max, shape, dtype=np.int64).astype(dtype)
    model = one_op_model(op, [Input(shape, dtype)], [Output(shape, dtype)])
    check_against_litert(model, [x])


INT_BINARY = [("FLOOR_DIV", np.int32), ("FLOOR_DIV", np.int8), ("FLOOR_DIV", np.int16),
              ("FLOOR_MOD", np.int32), ("FLOOR_MOD", np.int64), ("FLOOR_MOD", np.int8),
              ("FLOOR_MOD", np.int16), ("POW", np.int32)]


@pytest.mark.parametrize("op,dtype", INT_BINARY)
@given(shapes=broadcast_pair(), const_rhs=st.booleans(), seed=S.seeds())
def test_binary_int_matches_litert(op, dtype, shapes, const_rhs, seed):
    """Python floor semantics (the quotient rounds down, the remainder takes the divisor's sign);
    divisors nonzero (LiteRT refuses 0 at invoke); POW exponents >= 0 without overflow."""
    a_shape, b_shape, out_shape = shapes
    rng = np.random.default_rng(seed)
    if op == "POW":
        a, b = rng.integers(-6, 7, a_shape), rng.integers(0, 9, b_shape)
    else:
        a = rng.integers(-100, 101, a_shape)
        b = rng.integers(1, 12, b_shape) * rng.choice([-1, 1], b_shape)
    a, b = a.astype(dtype), np.asarray(b, dtype).reshape(b_shape)
    rhs = Const(b) if const_rhs else Input(b_shape, dtype)
    model = one_op_model(op, [Input(a_shape, dtype), rhs], [Output(out_shape, dtype)])
    check_against_litert(model, [a] + ([] if const_rhs else [b]))


@given(n=st.integers(2, 5), shape=S.shapes(0, 4), seed=S.seeds())
def test_add_n_int32_matches_litert(n, shape, seed):
    model = one_op_model("ADD_N", [Input(shape, np.int32)] * n, [Output(shape, np.int32)])
    check_against_litert(model, seed=seed)


def _run(model, inputs):
    return run_ours(model, inputs)[0]


def test_integer_division_by_zero_gives_zero():
    """LiteRT refuses a zero divisor at invoke; here the result is 0 (as integer DIV)."""
    a, b = np.array([7, -7, 0, 5], np.int32), np.array([0, 0, 0, 2], np.int32)
    for op, expected in [("FLOOR_DIV", [0, 0, 0, 2]), ("FLOOR_MOD", [0, 0, 0, 1])]:
        model = one_op_model(op, [Input((4,), np.int32), Input((4,), np.int32)],
                             [Output((4,), np.int32)])
        np.testing.assert_array_equal(_run(model, [a, b]), expected)


def test_float_division_by_zero_is_ieee():
    a, b = np.array([7, -7, 0], np.float32), np.zeros(3, np.float32)
    model = one_op_model("FLOOR_DIV", [Input((3,)), Input((3,))], [Output((3,))])
    np.testing.assert_array_equal(_run(model, [a, b]), [np.inf, -np.inf, np.nan])


def test_int32_pow_negative_exponent_truncates():
    """LiteRT refuses a negative int32 exponent at invoke; here std::pow's value truncated."""
    a, b = np.array([2, 1, -1, -1, 3], np.int32), np.array([-1, -5, -3, -2, 0], np.int32)
    model = one_op_model("POW", [Input((5,), np.int32), Input((5,), np.int32)],
                         [Output((5,), np.int32)])
    np.testing.assert_array_equal(_run(model, [a, b]), [0, 1, -1, 1, 1])


# -- int8 ----------------------------------------------------------------------------------------
def int8_unary_input(op, rng, shape, qi):
    """Raw int8 data: SQRT/RSQRT inputs at or above the zero point (LiteRT refuses negatives)."""
    low = qi[1] if op in ("SQRT", "RSQRT") else -128
    return rng.integers(low, 128, shape).astype(np.int8)


@pytest.mark.parametrize("op", INT8_UNARY)
@given(shape=S.shapes(0, 4), qi=S.quant_params(), qo=S.quant_params(), approximate=st.booleans(),
       seed=S.seeds())
def test_unary_int8_matches_litert(op, shape, qi, qo, approximate, seed):
    rng = np.random.default_rng(seed)
    model = one_op_model(op, [Input(shape, np.int8, qi)], [Output(shape, np.int8, qo)],
                         **unary_options(op, approximate))
    check_against_litert(model, [int8_unary_input(op, rng, shape, qi)], kernels=kernels(op))


@pytest.mark.parametrize("op", ["ABS", "SQRT"])
@given(shape=S.shapes(0, 4), si=S.scales(1e-4, 1e-2), so=S.scales(1e-4, 1e-2), seed=S.seeds())
def test_unary_int16_matches_litert(op, shape, si, so, seed):
    rng = np.random.default_rng(seed)
    x = rng.integers(0 if op == "SQRT" else -32768, 32768, shape).astype(np.int16)
    model = one_op_model(op, [Input(shape, np.int16, (si, 0))], [Output(shape, np.int16, (so, 0))])
    check_against_litert(model, [x])


@given(shape=S.shapes(0, 4), scale=S.scales(), seed=S.seeds())
def test_neg_int8_matches_litert(shape, scale, seed):
    rng = np.random.default_rng(seed)
    q = (scale, 0)
    model = one_op_model("NEG", [Input(shape, np.int8, q)], [Output(shape, np.int8, q)])
    check_against_litert(model, [rng.integers(-127, 128, shape).astype(np.int8)])


@pytest.mark.parametrize("op", ["FLOOR_DIV", "FLOOR_MOD"])
@given(shapes=broadcast_pair(), log2_scale=st.integers(-7, 1), seed=S.seeds())
def test_binary_int8_matches_litert(op, shapes, log2_scale, seed):
    """Scales are powers of two so the real values are exact multiples of each other as the
    integers are: with scale 1.284 the dequantized 15 s is not exactly 3 x 5 s in float32, and
    floor and mod jump at exact multiples (the float view computes on the float32 values)."""
    a_shape, b_shape, out_shape = shapes
    rng = np.random.default_rng(seed)
    q = (2.0 ** log2_scale, 0)
    qo = (1.0, 0) if op == "FLOOR_DIV" else q
    # not -128: LiteRT's raw-integer -128 // -1 wraps to -128, the real quotient 128 saturates
    a = rng.integers(-127, 128, a_shape).astype(np.int8)
    b = (rng.integers(1, 20, b_shape) * rng.choice([-1, 1], b_shape)).astype(np.int8)
    model = one_op_model(op, [Input(a_shape, np.int8, q), Input(b_shape, np.int8, q)],
                         [Output(out_shape, np.int8, qo)])
    check_against_litert(model, [a, b])


# -- invalid models ----------------------------------------------------------------------------
def _prepare(model):
    Interpreter(model_content=model, backend="reference").allocate_tensors()


def test_integer_input_of_a_float_op_is_refused():
    with pytest.raises(ModelError, match="SIN.*int32"):
        _prepare(one_op_model("SIN", [Input((3,), np.int32)], [Output((3,), np.int32)]))


def test_dtype_mismatch_is_refused():
    with pytest.raises(ModelError, match="ABS.*same dtype"):
        _prepare(one_op_model("ABS", [Input((2, 3))], [Output((2, 3), np.int8, (0.1, 0))]))
    with pytest.raises(ModelError, match="FLOOR_DIV.*same dtype"):
        _prepare(one_op_model("FLOOR_DIV", [Input((3,)), Input((3,), np.int32)],
                              [Output((3,))]))


def test_non_broadcasting_shapes_are_refused():
    with pytest.raises(ModelError, match="POW.*broadcast"):
        _prepare(one_op_model("POW", [Input((2, 3)), Input((4,))], [Output((2, 3))]))


def test_add_n_shapes_must_match():
    with pytest.raises(ModelError, match="ADD_N.*shape"):
        _prepare(one_op_model("ADD_N", [Input((2, 3)), Input((3,))], [Output((2, 3))]))


def test_add_n_needs_two_inputs():
    with pytest.raises(ModelError, match="ADD_N"):
        _prepare(one_op_model("ADD_N", [Input((2, 3))], [Output((2, 3))]))


@given(shape=S.shapes(0, 4), magnitude=st.sampled_from([1e-3, 1.0, 1e4]),
       dtype=st.sampled_from([np.float32, np.float64]), const_rhs=st.booleans(), seed=S.seeds())
def test_atan2_matches_litert(shape, magnitude, dtype, const_rhs, seed):
    # LiteRT's ATAN2 takes equal shapes only (see ops/arith.py)
    rng = np.random.default_rng(seed)
    y, x = atan2_data(rng, shape, magnitude, dtype), atan2_data(rng, shape, magnitude, dtype)
    model = one_op_model("ATAN2", [Input(shape, dtype), Const(x) if const_rhs else Input(shape, dtype)],
                         [Output(shape, dtype)])
    check_against_litert(model, [y] + ([] if const_rhs else [x]))


@given(shapes=broadcast_pair(), seed=S.seeds())
def test_atan2_broadcasts_as_numpy(shapes, seed):
    a_shape, b_shape, out_shape = shapes
    rng = np.random.default_rng(seed)
    y, x = atan2_data(rng, a_shape, 3.0), atan2_data(rng, b_shape, 3.0)
    model = one_op_model("ATAN2", [Input(a_shape), Input(b_shape)], [Output(out_shape)])
    np.testing.assert_array_equal(_run(model, [y, x]), np.arctan2(y, x))


def test_atan2_special_values_match_litert():
    """Every pair of +-0, +-inf, NaN and finite values: C's atan2 table."""
    y, x = (v.reshape(-1) for v in np.meshgrid(ATAN2_SPECIALS, ATAN2_SPECIALS))
    model = one_op_model("ATAN2", [Input(y.shape), Input(x.shape)], [Output(y.shape)])
    out = check_against_litert(model, [y, x])[0]
    # the signs of zeros too (assert_float_close does not see them)
    np.testing.assert_array_equal(np.signbit(out), np.signbit(np.arctan2(y, x)))


@given(shapes=broadcast_pair(), qa=S.quant_params(), qb=S.quant_params(),
       qo=S.quant_params(scale_range=(0.02, 0.05)), seed=S.seeds())
def test_atan2_int8_is_the_float_formula_snapped(shapes, qa, qb, qo, seed):
    # LiteRT has no int8 ATAN2: the float view's atan2 of the real values, quantized once
    from tflite_taichi.quant import dequantize, quantize
    from tflite_taichi.builder import as_quantization
    a_shape, b_shape, out_shape = shapes
    rng = np.random.default_rng(seed)
    a = rng.integers(-128, 128, a_shape).astype(np.int8)
    b = rng.integers(-128, 128, b_shape).astype(np.int8)
    model = one_op_model("ATAN2", [Input(a_shape, np.int8, qa), Input(b_shape, np.int8, qb)],
                         [Output(out_shape, np.int8, qo)])
    real = np.arctan2(dequantize(a, as_quantization(qa)), dequantize(b, as_quantization(qb)))
    expected = quantize(real, as_quantization(qo), np.int8)
    np.testing.assert_array_equal(_run(model, [a, b]), expected)


def test_atan2_needs_floats():
    with pytest.raises(ModelError, match="ATAN2.*int32"):
        _prepare(one_op_model("ATAN2", [Input((3,), np.int32), Input((3,), np.int32)],
                              [Output((3,), np.int32)]))
    with pytest.raises(ModelError, match="ATAN2.*broadcast"):
        _prepare(one_op_model("ATAN2", [Input((2, 3)), Input((2,))], [Output((2, 3))]))


# -- RIGHT_SHIFT -------------------------------------------------------------------------------
SHIFT_DTYPES = [np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32]


@pytest.mark.parametrize("dtype", SHIFT_DTYPES)
@given(shapes=broadcast_pair(), const_rhs=st.booleans(), seed=S.seeds())
def test_right_shift_matches_litert(dtype, shapes, const_rhs, seed):
    """The whole value range; counts from -3 to bits + 3 (LiteRT clamps to [0, bits - 1])."""
    a_shape, b_shape, out_shape = shapes
    rng = np.random.default_rng(seed)
    info, bits = np.iinfo(dtype), 8 * np.dtype(dtype).itemsize
    x = rng.integers(info.min, int(info.max) + 1, a_shape, dtype=np.int64).astype(dtype)
    n = rng.integers(max(info.min, -3), bits + 4, b_shape).astype(dtype)
    rhs = Const(n) if const_rhs else Input(b_shape, dtype)
    model = one_op_model("RIGHT_SHIFT", [Input(a_shape, dtype), rhs], [Output(out_shape, dtype)])
    check_against_litert(model, [x] + ([] if const_rhs else [n]))


def test_right_shift_edge_counts():
    x = np.array([-7, -7, 7, -1, np.iinfo(np.int32).min, 12], np.int32)
    n = np.array([1, 40, 40, 31, 31, -2], np.int32)
    model = one_op_model("RIGHT_SHIFT", [Input((6,), np.int32), Input((6,), np.int32)],
                         [Output((6,), np.int32)])
    out = check_against_litert(model, [x, n])[0]
    np.testing.assert_array_equal(out, [-4, -1, 0, -1, -1, 12])   # rounds toward -inf


def test_right_shift_errors():
    with pytest.raises(ModelError, match="RIGHT_SHIFT.*float32"):
        _prepare(one_op_model("RIGHT_SHIFT", [Input((3,)), Input((3,))], [Output((3,))]))
    with pytest.raises(ModelError, match="RIGHT_SHIFT.*quantized"):
        _prepare(one_op_model("RIGHT_SHIFT", [Input((3,), np.int8, (0.1, 0)), Input((3,), np.int8)],
                              [Output((3,), np.int8)]))
    with pytest.raises(ModelError, match="RIGHT_SHIFT.*same dtype"):
        _prepare(one_op_model("RIGHT_SHIFT", [Input((3,), np.int32), Input((3,), np.int8)],
                              [Output((3,), np.int32)]))
    with pytest.raises(ModelError, match="RIGHT_SHIFT.*int64"):
        _prepare(one_op_model("RIGHT_SHIFT", [Input((3,), np.int64), Input((3,), np.int64)],
                              [Output((3,), np.int64)]))
    with pytest.raises(ModelError, match="RIGHT_SHIFT.*broadcast"):
        _prepare(one_op_model("RIGHT_SHIFT", [Input((2, 3), np.int32), Input((2,), np.int32)],
                              [Output((2, 3), np.int32)]))
