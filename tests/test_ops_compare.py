"""Comparisons, LOGICAL_OR/NOT, SELECT/SELECT_V2 and CAST vs LiteRT through one-op models.
Bool outputs must match exactly; CAST's float outputs within tflite_taichi.testing's tolerance.

LiteRT 2.3's own behaviour, found here (see ops/compare.py):
- 8-bit quantized comparisons rescale both sides to `(q - zp) * scale * 2^8` in fixed point
  (real values closer than ~1/256 can compare equal); tested with equal and different scales
  and zero points. LiteRT aborts on a scale of exactly 1, on a non-quantized int8 pair and on a
  pair with one quantized side, and returns garbage for scales above 1: those cases are tested
  against our own definition (numpy), not LiteRT.
- int16: EQUAL rescales when quantized; LESS & co. compare the raw integers, scales ignored.
  NOT_EQUAL of non-quantized int16 leaves LiteRT's output unwritten: tested against numpy.
- SELECT of quantized values copies raw integers; with x, y and the output on one grid that is
  the real-value select defined here; different grids are tested against the real-value formula.
- CAST: float -> int truncates and saturates, NaN -> max; int -> int wraps; -> bool is != 0.
"""
import numpy as np
import pytest
from hypothesis import given, strategies as st

from tflite_taichi import Interpreter
from tflite_taichi.errors import ModelError
from tflite_taichi.ops.compare import COMPARISONS, cast_values
from tflite_taichi.testing import (Input, Output, check_against_litert, one_op_model,
                                   quantize_array, run_ours)
from cases.elementwise import broadcast_pair
from cases.compare import COMPARE_SCALES, S, SWEEP_SCALES, cast_values_of, every_pair, float_compare_case, quantized_compare_case, quantized_pair, select_model, select_shapes

ORDER_OPS = ["LESS", "LESS_EQUAL", "GREATER", "GREATER_EQUAL"]
NUMPY = {"EQUAL": np.equal, "NOT_EQUAL": np.not_equal, "LESS": np.less,
         "LESS_EQUAL": np.less_equal, "GREATER": np.greater, "GREATER_EQUAL": np.greater_equal}


# -- comparisons --------------------------------------------------------------------------------
@pytest.mark.parametrize("op", COMPARISONS)
@given(case=st.data())
def test_float32_matches_litert(op, case):
    model, inputs = case.draw(float_compare_case(op))
    check_against_litert(model, inputs)


@pytest.mark.parametrize("op", COMPARISONS)
@given(case=st.data())
def test_quantized_8bit_matches_litert(op, case):
    model, inputs = case.draw(quantized_compare_case(op))
    check_against_litert(model, inputs)


@pytest.mark.parametrize("op", COMPARISONS)
@pytest.mark.parametrize("dtype", [np.int8, np.uint8])
def test_quantized_8bit_every_pair_matches_litert(op, dtype):
    """Every pair of stored values, at scales with and without merging and with rounding ties."""
    for qa, qb in SWEEP_SCALES:
        if dtype == np.uint8:
            qa, qb = (qa[0], qa[1] + 128), (qb[0], qb[1] + 128)
        model = one_op_model(op, [Input((65536,), dtype, qa), Input((65536,), dtype, qb)],
                             [Output((65536,), np.bool_)])
        check_against_litert(model, every_pair(dtype))


@given(op=st.sampled_from(COMPARISONS), dtype=st.sampled_from([np.int32, np.int64, np.int16,
                                                               np.float16, np.bool_]),
       shapes=broadcast_pair(), seed=S.seeds())
def test_other_dtypes_match_litert(op, dtype, shapes, seed):
    if dtype == np.bool_ and op not in ("EQUAL", "NOT_EQUAL"):
        op = "EQUAL"            # LiteRT orders no bools
    if dtype == np.int16 and op == "NOT_EQUAL":
        op = "EQUAL"            # LiteRT leaves the output unwritten (see below)
    a_shape, b_shape, out_shape = shapes
    rng = np.random.default_rng(seed)
    a, b = (rng.integers(-2, 3, s).astype(dtype) for s in (a_shape, b_shape))
    model = one_op_model(op, [Input(a_shape, dtype), Input(b_shape, dtype)],
                         [Output(out_shape, np.bool_)])
    check_against_litert(model, [a, b])


@given(op=st.sampled_from(COMPARISONS), qa=S.quant_params(np.int16, scale_range=COMPARE_SCALES),
       qb=S.quant_params(np.int16, scale_range=COMPARE_SCALES), same=st.booleans(),
       shapes=broadcast_pair(), seed=S.seeds())
def test_quantized_int16_matches_litert(op, qa, qb, same, shapes, seed):
    """EQUAL/NOT_EQUAL rescale (as 8-bit); the order comparisons compare raw integers."""
    a_shape, b_shape, out_shape = shapes
    qb = qa if same else qb
    rng = np.random.default_rng(seed)
    model = one_op_model(op, [Input(a_shape, np.int16, qa), Input(b_shape, np.int16, qb)],
                         [Output(out_shape, np.bool_)])
    check_against_litert(model, quantized_pair(rng, a_shape, b_shape, np.int16, qa, qb))


def test_int16_not_equal_compares_values():
    """LiteRT 2.3's NOT_EQUAL never writes its output for non-quantized int16: numpy here."""
    a, b = np.array([1, 2, -5, 300], np.int16), np.array([1, 3, -5, -300], np.int16)
    model = one_op_model("NOT_EQUAL", [Input((4,), np.int16), Input((4,), np.int16)],
                         [Output((4,), np.bool_)])
    np.testing.assert_array_equal(run_ours(model, [a, b])[0], a != b)


@pytest.mark.parametrize("op", COMPARISONS)
def test_non_quantized_int8_compares_raw_values(op):
    """LiteRT aborts (a zero scale): ours compares the stored integers."""
    a, b = np.array([-128, -1, 0, 5, 127], np.int8), np.array([127, -1, 1, 5, -128], np.int8)
    model = one_op_model(op, [Input((5,), np.int8), Input((5,), np.int8)], [Output((5,), np.bool_)])
    np.testing.assert_array_equal(run_ours(model, [a, b])[0], NUMPY[op](a, b))


@pytest.mark.parametrize("op", COMPARISONS)
def test_scales_from_one_up_compare_real_values(op):
    """LiteRT aborts at scale 1 and returns garbage above: ours compares the real values
    (x 256, as LiteRT's rescaled values are), also against a scale below 1."""
    q = np.arange(-128, 128).astype(np.int8)
    for qa, qb in [((1.0, 0), (1.0, 0)), ((2.0, 3), (0.5, -1)), ((1.5, 0), (3.0, 0))]:
        model = one_op_model(op, [Input((256,), np.int8, qa), Input((256,), np.int8, qb)],
                             [Output((256,), np.bool_)])
        b = np.roll(q, 3)
        real_a = (q.astype(np.float64) - qa[1]) * qa[0]
        real_b = (b.astype(np.float64) - qb[1]) * qb[0]
        expected = NUMPY[op](real_a, real_b) if qb[0] >= 1 else None
        got = run_ours(model, [q, b])[0]
        if expected is not None:
            np.testing.assert_array_equal(got, expected)
        else:   # the side with scale 0.5 is rescaled as LiteRT does: exact here (256 * 0.5)
            np.testing.assert_array_equal(got, NUMPY[op](real_a * 256, np.round(real_b * 256)))


# -- LOGICAL_OR, LOGICAL_NOT --------------------------------------------------------------------
@given(shapes=broadcast_pair(), seed=S.seeds())
def test_logical_or_matches_litert(shapes, seed):
    a_shape, b_shape, out_shape = shapes
    model = one_op_model("LOGICAL_OR", [Input(a_shape, np.bool_), Input(b_shape, np.bool_)],
                         [Output(out_shape, np.bool_)])
    check_against_litert(model, seed=seed)


@given(shape=S.shapes(0, 4), seed=S.seeds())
def test_logical_not_matches_litert(shape, seed):
    model = one_op_model("LOGICAL_NOT", [Input(shape, np.bool_)], [Output(shape, np.bool_)])
    check_against_litert(model, seed=seed)


@pytest.mark.parametrize("op", ["SELECT", "SELECT_V2"])
@given(case=st.data(), dtype=st.sampled_from([np.float32, np.int8, np.int32, np.bool_]),
       q=S.quant_params(), seed=S.seeds())
def test_select_matches_litert(op, case, dtype, q, seed):
    shapes = case.draw(select_shapes(op))
    model = select_model(op, shapes, dtype, q if dtype == np.int8 else None)
    check_against_litert(model, seed=seed)


@pytest.mark.parametrize("cond,x,declared", [((1, 1), (1,), (1, 1, 1)), ((), (1, 1), ()),
                                             ((1,), (), (1, 1))])
@pytest.mark.parametrize("op", ["SELECT", "SELECT_V2"])
def test_select_of_single_elements_keeps_the_declared_shape(op, cond, x, declared):
    model = select_model(op, (cond, x, (), declared))
    assert check_against_litert(model, seed=1)[0].shape == declared


@pytest.mark.parametrize("op", ["SELECT", "SELECT_V2"])
@given(qx=S.quant_params(), qy=S.quant_params(), qo=S.quant_params(), seed=S.seeds())
def test_select_quantized_on_different_grids_selects_real_values(op, qx, qy, qo, seed):
    """LiteRT copies raw integers whatever the scales; ours selects real values, requantized."""
    rng = np.random.default_rng(seed)
    cond = rng.integers(0, 2, (3, 4)).astype(bool)
    x, y = (rng.integers(-128, 128, (3, 4)).astype(np.int8) for _ in range(2))
    model = select_model(op, ((3, 4), (3, 4), (3, 4), (3, 4)), np.int8, (qx, qy, qo))
    real = np.where(cond, (x.astype(np.int64) - qx[1]) * qx[0], (y.astype(np.int64) - qy[1]) * qy[0])
    expected = quantize_array(real.astype(np.float32), qo)
    np.testing.assert_array_equal(run_ours(model, [cond, x, y])[0], expected)


# -- CAST ---------------------------------------------------------------------------------------
CAST_TYPES = [np.float32, np.int32, np.int8, np.uint8, np.int16, np.int64, np.bool_, np.float16]
SPECIAL_VALUES = {
    "f": [0.0, -0.0, 0.5, -0.5, 1.7, -1.7, 2.5, -2.5, 127.9, 128.5, -128.9, -129.7, 255.9, 256.5,
          -300, 32767.5, -32768.9, 40000, 65504, 65519.9, 65520, 2**31 - 128, 2**31, -2**31,
          3e9, -3e9, 1e20, -1e20, 1e-8, 3e-8, 6.1e-5, np.inf, -np.inf, np.nan],
    "i": [0, 1, -1, 127, 128, -128, -129, 255, 256, 32767, 32768, -32769, 65535, 70000,
          2**31 - 1, -2**31, 2**40 + 5, -2**40 - 5],
}


def special_values(dtype) -> np.ndarray:
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return np.array([True, False, True])
    if dtype.kind == "f":
        return np.array(SPECIAL_VALUES["f"], np.float32).astype(dtype)
    info = np.iinfo(dtype)
    return np.array([v for v in SPECIAL_VALUES["i"] if info.min <= v <= info.max], dtype)


@pytest.mark.parametrize("src", CAST_TYPES, ids=lambda t: np.dtype(t).name)
@pytest.mark.parametrize("dst", CAST_TYPES, ids=lambda t: np.dtype(t).name)
def test_cast_special_values_match_litert(src, dst):
    x = special_values(src)
    model = one_op_model("CAST", [Input(x.shape, src)], [Output(x.shape, dst)])
    check_against_litert(model, [x])


@given(src=st.sampled_from(CAST_TYPES), dst=st.sampled_from(CAST_TYPES), shape=S.shapes(0, 3),
       data=st.data())
def test_cast_matches_litert(src, dst, shape, data):
    x = data.draw(cast_values_of(src, shape))
    model = one_op_model("CAST", [Input(shape, src)], [Output(shape, dst)])
    check_against_litert(model, [x])


@pytest.mark.parametrize("src,dst", [(np.float64, np.int32), (np.float32, np.float64),
                                     (np.complex64, np.float32), (np.complex64, np.int32),
                                     (np.complex64, np.bool_), (np.int32, np.complex64),
                                     (np.uint16, np.int8), (np.float32, np.uint32),
                                     (np.uint32, np.int32), (np.float64, np.float16)])
def test_cast_other_types_match_litert(src, dst):
    x = special_values(np.float32 if np.dtype(src).kind == "c" else src)
    if np.dtype(src).kind == "c":
        x = (x + 1j * x[::-1]).astype(src)
    model = one_op_model("CAST", [Input(x.shape, src)], [Output(x.shape, dst)])
    check_against_litert(model, [x])


@given(q_in=S.quant_params(), q_out=S.quant_params(), dst=st.sampled_from([np.float32, np.int32,
                                                                           np.bool_, np.int16]),
       seed=S.seeds())
def test_cast_of_quantized_tensors_converts_raw_integers(q_in, q_out, dst, seed):
    """LiteRT's CAST ignores quantization: int8 (quantized) -> dst, and float -> int8 (quantized)."""
    rng = np.random.default_rng(seed)
    model = one_op_model("CAST", [Input((3, 5), np.int8, q_in)], [Output((3, 5), dst)])
    check_against_litert(model, [rng.integers(-128, 128, (3, 5)).astype(np.int8)])
    model = one_op_model("CAST", [Input((3, 5))], [Output((3, 5), np.int8, q_out)])
    check_against_litert(model, [rng.uniform(-200, 200, (3, 5)).astype(np.float32)])


def test_cast_values_follow_the_definition():
    x = np.array([np.nan, -np.inf, np.inf, -1.9, 1.9, 3e9, -3e9, 2**31 - 128], np.float32)
    np.testing.assert_array_equal(
        cast_values(x, np.int32),
        np.array([2**31 - 1, -2**31, 2**31 - 1, -1, 1, 2**31 - 1, -2**31, 2**31 - 128], np.int32))
    np.testing.assert_array_equal(cast_values(np.array([300, -1], np.int32), np.uint8), [44, 255])
    np.testing.assert_array_equal(cast_values(np.array([1 + 0j, 2j]), np.bool_), [True, False])


# -- invalid models -----------------------------------------------------------------------------
def _refused(model, inputs, op):
    with pytest.raises(ModelError, match=op):
        run_ours(model, inputs)


@pytest.mark.parametrize("op", ORDER_OPS)
def test_ordering_bools_is_refused(op):
    model = one_op_model(op, [Input((2,), np.bool_), Input((2,), np.bool_)], [Output((2,), np.bool_)])
    _refused(model, [np.zeros(2, bool)] * 2, op)


@pytest.mark.parametrize("op", COMPARISONS)
def test_comparison_errors(op):
    z = np.zeros((2, 3), np.float32)
    _refused(one_op_model(op, [Input((2, 3)), Input((2, 3), np.int32)], [Output((2, 3), np.bool_)]),
             [z, z.astype(np.int32)], op)
    _refused(one_op_model(op, [Input((2, 3)), Input((4,))], [Output((2, 3), np.bool_)]),
             [z, np.zeros(4, np.float32)], op)
    _refused(one_op_model(op, [Input((2, 3)), Input((2, 3))], [Output((2, 3))]), [z, z], op)
    q = np.zeros((2, 3), np.int8)
    _refused(one_op_model(op, [Input((2, 3), np.int8, (0.1, 0)), Input((2, 3), np.int8)],
                          [Output((2, 3), np.bool_)]), [q, q], op)


def test_logical_errors():
    z = np.zeros((2, 3), np.float32)
    _refused(one_op_model("LOGICAL_OR", [Input((2, 3)), Input((2, 3), np.bool_)],
                          [Output((2, 3), np.bool_)]), [z, z > 0], "LOGICAL_OR")
    _refused(one_op_model("LOGICAL_OR", [Input((2, 3), np.bool_), Input((3, 2), np.bool_)],
                          [Output((2, 3), np.bool_)]), [z > 0, z.T > 0], "LOGICAL_OR")
    _refused(one_op_model("LOGICAL_NOT", [Input((2, 3))], [Output((2, 3), np.bool_)]), [z],
             "LOGICAL_NOT")


def test_select_errors():
    z, c = np.zeros((2, 3), np.float32), np.zeros((2, 3), bool)
    for op in ("SELECT", "SELECT_V2"):
        _refused(one_op_model(op, [Input((2, 3)), Input((2, 3)), Input((2, 3))],
                              [Output((2, 3))]), [z, z, z], op)          # a float condition
        _refused(one_op_model(op, [Input((2, 3), np.bool_), Input((2, 3)), Input((2, 3), np.int32)],
                              [Output((2, 3))]), [c, z, z.astype(np.int32)], op)
        _refused(one_op_model(op, [Input((2, 3), np.bool_), Input((2, 3)), Input((2, 3))],
                              [Output((2, 3), np.int32)]), [c, z, z], op)
        _refused(select_model(op, ((2, 3), (2, 3), (2, 3), (2, 3)), np.int8,
                              ((0.1, 0), None, (0.1, 0))),
                 [c, z.astype(np.int8), z.astype(np.int8)], op)
        _refused(select_model(op, ((2, 3), (2, 3), (4, 3), (2, 3))),
                 [c, z, np.zeros((4, 3), np.float32)], op)
    # SELECT's condition: x's shape, a scalar or 1-D along the first dimension only
    for cond in [(3,), (2, 1), (1,)]:
        _refused(select_model("SELECT", (cond, (2, 3), (2, 3), (2, 3))),
                 [np.zeros(cond, bool), z, z], "SELECT")
    _refused(select_model("SELECT", ((2, 3), (2, 3), (2, 1), (2, 3))),
             [c, z, np.zeros((2, 1), np.float32)], "SELECT")


def test_cast_errors():
    model = one_op_model("CAST", [Input((2,))], [Output((2,), np.uint64)])
    _refused(model, [np.zeros(2, np.float32)], "CAST")


def test_logical_and_of_float_tensors_is_refused():
    """LiteRT's LOGICAL_AND takes bool only (LOGICAL_AND lives in elementwise.py, its checks here)."""
    with pytest.raises(ModelError, match="LOGICAL_AND"):
        Interpreter(model_content=one_op_model("LOGICAL_AND", [Input((3,)), Input((3,))], [Output((3,), np.bool_)]),
                    backend="reference").allocate_tensors()
