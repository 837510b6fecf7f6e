"""RESIZE_BILINEAR and RESIZE_NEAREST_NEIGHBOR vs LiteRT through one-op models: float32 and
int8, upsampling and downsampling, align_corners / half_pixel_centers.
Tolerances: tflite_taichi.testing (1e-5 of the largest magnitude; 1 unit)."""
import numpy as np
import pytest
from hypothesis import given, strategies as st

from tflite_taichi.errors import ModelError
from tflite_taichi.testing import (Const, Input, Output, check_against_litert, one_op_model,
                                   run_ours, strategies)
from cases.resize import OPS, _model, resize_case

S = strategies()


@given(case=resize_case("RESIZE_BILINEAR"), seed=S.seeds())
def test_bilinear_float32_matches_litert(case, seed):
    check_against_litert(_model("RESIZE_BILINEAR", *case), seed=seed)


@given(case=resize_case("RESIZE_NEAREST_NEIGHBOR"), seed=S.seeds())
def test_nearest_float32_matches_litert(case, seed):
    check_against_litert(_model("RESIZE_NEAREST_NEIGHBOR", *case), seed=seed)


# int8: LiteRT interpolates (or copies) the raw int8 values, so the output shares the input's
# quantization, as converted models have it.
@given(case=resize_case("RESIZE_BILINEAR"), q=S.quant_params(), seed=S.seeds())
def test_bilinear_int8_matches_litert(case, q, seed):
    check_against_litert(_model("RESIZE_BILINEAR", *case, np.int8, q), seed=seed)


@given(case=resize_case("RESIZE_NEAREST_NEIGHBOR"), q=S.quant_params(), seed=S.seeds())
def test_nearest_int8_matches_litert(case, q, seed):
    check_against_litert(_model("RESIZE_NEAREST_NEIGHBOR", *case, np.int8, q), seed=seed)


@pytest.mark.parametrize("op", OPS)
@given(data=st.data(), q=S.quant_params(np.int16), seed=S.seeds())
def test_int16_matches_litert(op, data, q, seed):
    # int16 bilinear uses the same 10-bit fixed-point coordinates as int8 in LiteRT; with
    # int16's fine grid, float coordinates would be off by hundreds of units.
    case = data.draw(resize_case(op))
    check_against_litert(_model(op, *case, np.int16, q), seed=seed)


def test_bilinear_int8_large_upsampling_stays_in_bounds():
    # 1 -> 55 rows: LiteRT's int8 scale_10 = (1024 + 27) // 55 = 19 puts row 54 at 1026/1024,
    # past the only input row; its kernel then reads the next batch (or past the buffer). We
    # clamp to the last row, so every output row of a batch is that batch's one pixel.
    q = (0.01, 0)
    model = _model("RESIZE_BILINEAR", (2, 1, 1, 1), (55, 1), False, False, np.int8, q)
    x = np.array([10, -100], np.int8).reshape(2, 1, 1, 1)
    out = run_ours(model, [x])[0]
    np.testing.assert_array_equal(out, np.repeat(x, 55, axis=1))


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("align, half", [(False, False), (True, False), (False, True)])
@pytest.mark.parametrize("shape, size", [((1, 3, 5, 2), (7, 11)), ((1, 7, 9, 1), (3, 4)),
                                         ((2, 1, 1, 3), (4, 1)), ((1, 4, 4, 1), (1, 1)),
                                         ((1, 4, 6, 1), (4, 6))])
def test_fixed_cases_match_litert(op, align, half, shape, size):
    check_against_litert(_model(op, shape, size, align, half))
    check_against_litert(_model(op, shape, size, align, half, np.int8, (0.02, -5)))


def test_bilinear_refuses_both_flags():
    model = _model("RESIZE_BILINEAR", (1, 2, 2, 1), (4, 4), True, True)
    with pytest.raises(ModelError, match="RESIZE_BILINEAR.*align_corners"):
        run_ours(model, [np.zeros((1, 2, 2, 1), np.float32)])


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("size", [(0, 4), (4, -1)])
def test_non_positive_size_is_refused(op, size):
    model = one_op_model(op, [Input((1, 2, 2, 1)), Const(np.array(size, np.int32))],
                         [Output((1, 4, 4, 1))])
    with pytest.raises(ModelError, match=op):
        run_ours(model, [np.zeros((1, 2, 2, 1), np.float32)])


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("size", [np.array([4, 4, 4], np.int32), np.array([4.0, 4.0], np.float32),
                                  np.array([[4, 4]], np.int32)])
def test_malformed_size_is_refused(op, size):
    model = one_op_model(op, [Input((1, 2, 2, 1)), Const(size)], [Output((1, 4, 4, 1))])
    with pytest.raises(ModelError, match=op):
        run_ours(model, [np.zeros((1, 2, 2, 1), np.float32)])


@pytest.mark.parametrize("op", OPS)
def test_size_given_at_run_time_matches_litert(op):
    model = one_op_model(op, [Input((1, 2, 2, 1)), Input((2,), np.int32)], [Output((1, 4, 4, 1))])
    x = np.random.default_rng(5).uniform(-1, 1, (1, 2, 2, 1)).astype(np.float32)
    for size in ([4, 4], [3, 5]):
        check_against_litert(model, [x, np.array(size, np.int32)])


@pytest.mark.parametrize("op", OPS)
def test_rank_other_than_4_is_refused(op):
    model = one_op_model(op, [Input((2, 2, 1)), Const(np.array([4, 4], np.int32))],
                         [Output((4, 4, 1))])
    with pytest.raises(ModelError, match=op):
        run_ours(model, [np.zeros((2, 2, 1), np.float32)])
