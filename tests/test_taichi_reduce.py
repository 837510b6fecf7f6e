"""MEAN, SUM, REDUCE_MAX, REDUCE_MIN, REDUCE_PROD, REDUCE_ANY, REDUCE_ALL, RESIZE_BILINEAR and
RESIZE_NEAREST_NEIGHBOR on the delegate (cpu, vulkan, opengl workers; fp16 on vulkan; gles) vs
the reference path, over the attribute space of the LiteRT tests. Tolerances:
tflite_taichi.testing.TAICHI_RTOL; quantized outputs within one quantization step
(check_delegate's rule: a value on a rounding boundary may snap either way)."""
import numpy as np
import pytest
from hypothesis import assume, strategies as st

from tflite_taichi.testing import (Const, Input, Output, check_delegate, check_op, model_inputs,
                                   one_op_model, strategies)
from cases.reduce import (OPS as REDUCE_OPS, all_inputs, any_inputs, prod_inputs, reduction,
                          rounding_floor)
from cases.resize import OPS as RESIZE_OPS, _model as resize_model, resize_case

S = strategies()


def _reduce_model(op, case, dtype=np.float32, qi=None, qo=None):
    shape, axes, keep_dims, out = case
    return one_op_model(op, [Input(shape, dtype, qi), Const(axes)], [Output(out, dtype, qo)],
                        keep_dims=keep_dims)


# The property tests go through check_op, the helper a user's op gets: a strategy of cases
# (model, inputs[, check_delegate's options]; inputs None: seeded from the model), each run on
# the reference path and on every worker's backend, delegated and matching.

# -- reductions ------------------------------------------------------------------------------
@st.composite
def reduce_float32_cases(draw, op):
    case = draw(reduction())
    model = _reduce_model(op, case)
    inputs = model_inputs(model, draw(S.seeds()))
    # the split reduction and numpy add in different orders: a sum that cancels (0.028 from
    # 60 terms up to 3: seed 55, axes [1, -1, 2]) is held to its terms' magnitudes
    return model, inputs, {"floor": rounding_floor(op, inputs[0], case[1])}


@st.composite
def reduce_int8_cases(draw, op):
    case, qi, qo = draw(reduction()), draw(S.quant_params()), draw(S.quant_params())
    # REDUCE_MAX keeps the input's quantization (LiteRT's constraint); MEAN/SUM rescale.
    qo = qi if op == "REDUCE_MAX" else qo
    return _reduce_model(op, case, np.int8, qi, qo), None, {"seed": draw(S.seeds())}


@pytest.mark.parametrize("op", REDUCE_OPS)
def test_reduce_float32_delegate_matches_reference(taichi_workers, op):
    check_op(reduce_float32_cases(op), workers=taichi_workers)


@pytest.mark.parametrize("op", REDUCE_OPS)
def test_reduce_int8_delegate_matches_reference(taichi_workers, op):
    check_op(reduce_int8_cases(op), workers=taichi_workers)


def test_reduce_fp16_on_vulkan(vulkan_workers):
    case = ((2, 5, 3, 4), np.array([1, 2], np.int32), True, (2, 1, 1, 4))
    for op in REDUCE_OPS:
        check_delegate(_reduce_model(op, case), vulkan_workers, seed=1, precision="fp16")


def test_reduce_gles(gles_worker):
    case = ((3, 4, 5), np.array([-1, 0], np.int32), False, (4,))
    check_delegate(_reduce_model("MEAN", case), [gles_worker], seed=2)


def test_reduce_of_bool_stays_on_the_cpu(taichi_workers):
    model = one_op_model("REDUCE_MAX", [Input((2, 3), np.bool_), Const(np.array([1], np.int32))],
                         [Output((2,), np.bool_)])
    summaries = check_delegate(model, taichi_workers, [np.array([[0, 1, 0], [0, 0, 0]], bool)],
                               expect_all_delegated=False)
    for summary in summaries.values():
        assert summary["ops_delegated"] == 0
        assert "bool" in summary["fallback"][0]["reason"]


# REDUCE_MIN, REDUCE_PROD, REDUCE_ANY: the op drawn in one test each (one compile per example).
NEW_REDUCE_OPS = ["REDUCE_MIN", "REDUCE_PROD", "REDUCE_ANY"]


def _new_reduce_inputs(op, shape, seed):
    if op == "REDUCE_ANY":
        return [any_inputs(shape, seed)]
    if op == "REDUCE_PROD":
        return [prod_inputs(shape, seed)]
    return None


@st.composite
def min_prod_any_cases(draw):
    op, case, seed = draw(st.sampled_from(NEW_REDUCE_OPS)), draw(reduction()), draw(S.seeds())
    dtype = np.bool_ if op == "REDUCE_ANY" else np.float32
    return _reduce_model(op, case, dtype), _new_reduce_inputs(op, case[0], seed), {"seed": seed}


@st.composite
def min_prod_int8_cases(draw):
    op, case = draw(st.sampled_from(["REDUCE_MIN", "REDUCE_PROD"])), draw(reduction())
    qi, widen, seed = draw(S.quant_params()), draw(st.floats(1.0, 2.0)), draw(S.seeds())
    # REDUCE_MIN keeps the input's quantization (LiteRT's constraint); REDUCE_PROD's output
    # quantization covers its products (as in the LiteRT test).
    shape, axes, _, _ = case
    x = np.random.default_rng(seed).integers(-128, 128, shape).astype(np.int8)
    qo = qi
    if op == "REDUCE_PROD":
        reduced = tuple(sorted({int(a) % len(shape) for a in axes.reshape(-1)}))
        prods = np.prod((x.astype(np.float64) - qi[1]) * qi[0], axis=reduced)
        lo, hi = min(float(prods.min()), 0.0), max(float(prods.max()), 0.0)
        assume(1e-30 < hi - lo < 1e30)
        scale = float(np.float32((hi - lo) / 240 * widen))
        qo = (scale, int(np.clip(round(-(lo + hi) / 2 / scale), -100, 100)))
    return _reduce_model(op, case, np.int8, qi, qo), [x]


def test_min_prod_any_delegate_matches_reference(taichi_workers):
    check_op(min_prod_any_cases(), workers=taichi_workers)


def test_min_prod_int8_delegate_matches_reference(taichi_workers):
    check_op(min_prod_int8_cases(), workers=taichi_workers)


def test_min_prod_any_fp16_on_vulkan(vulkan_workers):
    case = ((2, 5, 3, 4), np.array([1, 2], np.int32), True, (2, 1, 1, 4))
    for op in NEW_REDUCE_OPS:
        dtype = np.bool_ if op == "REDUCE_ANY" else np.float32
        check_delegate(_reduce_model(op, case, dtype), vulkan_workers,
                       _new_reduce_inputs(op, case[0], 1), precision="fp16")


def test_min_prod_any_gles(gles_worker):
    case = ((3, 4, 5), np.array([-1, 0], np.int32), False, (4,))
    for op in NEW_REDUCE_OPS:
        dtype = np.bool_ if op == "REDUCE_ANY" else np.float32
        check_delegate(_reduce_model(op, case, dtype), [gles_worker],
                       _new_reduce_inputs(op, case[0], 2), seed=2)


def test_long_min_prod_any_split_into_partial_results(taichi_workers):
    # 3 outputs of 4096 terms each: the split reduction (partial results in scratch)
    case = ((3, 64, 64), np.array([1, 2], np.int32), False, (3,))
    for op in NEW_REDUCE_OPS:
        dtype = np.bool_ if op == "REDUCE_ANY" else np.float32
        inputs = _new_reduce_inputs(op, case[0], 3)
        if op == "REDUCE_PROD":       # 4096 factors: keep the products in range
            inputs = [np.sign(inputs[0]) * np.float32(1.0) + inputs[0] * np.float32(0.01)]
        check_delegate(_reduce_model(op, case, dtype), taichi_workers, inputs, seed=3)


def test_min_of_bool_stays_on_the_cpu(taichi_workers):
    model = one_op_model("REDUCE_MIN", [Input((2, 3), np.bool_), Const(np.array([1], np.int32))],
                         [Output((2,), np.bool_)])
    summaries = check_delegate(model, taichi_workers, [np.array([[0, 1, 0], [1, 1, 1]], bool)],
                               expect_all_delegated=False)
    for summary in summaries.values():
        assert summary["ops_delegated"] == 0
        assert "bool" in summary["fallback"][0]["reason"]


# -- resizes -------------------------------------------------------------------------------
@st.composite
def resize_cases(draw, op, dtype=None, quant=None):
    """`op`'s case space; int8 bilinear: the 10-bit fixed-point coordinates of LiteRT's kernel."""
    case = draw(resize_case(op))
    quantized = () if dtype is None else (dtype, draw(quant))
    return resize_model(op, *case, *quantized), None, {"seed": draw(S.seeds())}


@pytest.mark.parametrize("op", RESIZE_OPS)
def test_resize_float32_delegate_matches_reference(taichi_workers, op):
    check_op(resize_cases(op), workers=taichi_workers)


@pytest.mark.parametrize("op", RESIZE_OPS)
def test_resize_int8_delegate_matches_reference(taichi_workers, op):
    check_op(resize_cases(op, np.int8, S.quant_params()), workers=taichi_workers)


def test_resize_bilinear_int16_delegate_matches_reference(taichi_workers):
    check_op(resize_cases("RESIZE_BILINEAR", np.int16, S.quant_params(np.int16)),
             workers=taichi_workers)


@pytest.mark.parametrize("align, half, in_h, out_h", [
    (False, False, 3, 123), (True, False, 14, 23), (False, True, 4, 122), (True, True, 8, 24)])
def test_resize_nearest_float32_ties(taichi_workers, align, half, in_h, out_h):
    # Rows where the reference's float32 coordinate falls on the other side of an exact
    # rounding tie than exact arithmetic (so needing `_nearest_plan`'s corrections), and
    # 12 -> 32 columns, where a fused multiply-add in float coordinates picked other pixels.
    x = np.arange(in_h * 12, dtype=np.float32).reshape(1, in_h, 12, 1)
    model = resize_model("RESIZE_NEAREST_NEIGHBOR", (1, in_h, 12, 1), (out_h, 32), align, half)
    check_delegate(model, taichi_workers, [x])


def test_resize_fp16_on_vulkan(vulkan_workers):
    for op in RESIZE_OPS:
        model = resize_model(op, (1, 5, 7, 3), (9, 4), False, True)
        check_delegate(model, vulkan_workers, seed=3, precision="fp16")


def test_resize_gles(gles_worker):
    check_delegate(resize_model("RESIZE_BILINEAR", (2, 4, 3, 2), (7, 9), True, False),
                   [gles_worker], seed=4)
    check_delegate(resize_model("RESIZE_NEAREST_NEIGHBOR", (1, 12, 12, 1), (31, 29), True, True),
                   [gles_worker], seed=5)


def test_resize_nearest_with_too_many_ties_stays_on_the_cpu(taichi_workers):
    # 1014 -> 3211 rows with half_pixel_centers: 83 rows where float32 rounding moves the
    # reference's index, above MAX_NEAREST_FIXES.
    model = resize_model("RESIZE_NEAREST_NEIGHBOR", (1, 1014, 1, 1), (3211, 1), False, True)
    summaries = check_delegate(model, taichi_workers, seed=6, expect_all_delegated=False)
    for summary in summaries.values():
        assert summary["ops_delegated"] == 0
        assert "rounding corrections" in summary["fallback"][0]["reason"]


# -- REDUCE_ALL (bool carried as 0/1: the minimum) ------------------------------------------
@st.composite
def reduce_all_cases(draw):
    case = draw(reduction())
    return _reduce_model("REDUCE_ALL", case, np.bool_), [all_inputs(case[0], draw(S.seeds()))]


def test_reduce_all_delegate_matches_reference(taichi_workers):
    check_op(reduce_all_cases(), workers=taichi_workers)


def test_long_reduce_all_split_into_partial_results(taichi_workers):
    # 3 outputs of 4096 terms: the split reduction; one False in the second slice's last share
    case = ((3, 64, 64), np.array([1, 2], np.int32), False, (3,))
    x = np.ones((3, 64, 64), bool)
    x[1, 63, 60] = False
    check_delegate(_reduce_model("REDUCE_ALL", case, np.bool_), taichi_workers, [x])


def test_reduce_all_gles(gles_worker):
    case = ((3, 4, 5), np.array([-1, 0], np.int32), False, (4,))
    check_delegate(_reduce_model("REDUCE_ALL", case, np.bool_), [gles_worker], [all_inputs((3, 4, 5), 2)])
