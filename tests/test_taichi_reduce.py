"""MEAN, SUM, REDUCE_MAX, REDUCE_MIN, REDUCE_PROD, REDUCE_ANY, REDUCE_ALL, RESIZE_BILINEAR and
RESIZE_NEAREST_NEIGHBOR on the delegate (cpu, vulkan, opengl workers; fp16 on vulkan; gles) vs
the reference path, over the attribute space of the LiteRT tests. Tolerances:
tflite_taichi.testing.TAICHI_RTOL; quantized outputs within one quantization step
(check_delegate's rule: a value on a rounding boundary may snap either way). One case table
(REDUCE_ROWS and RESIZE_ROWS, tests/cases/reduce.py and cases/resize.py: a row per op and
dtype, or ops drawn together) drives one property test; long reductions, resize ties, fp16 and
GLES have their own tests; what stays on the CPU is a table too (REFUSED: cases.table.Refused),
one test."""
import numpy as np
import pytest

from tflite_taichi.testing import Const, Input, Output, check_delegate, check_op, one_op_model
from cases.reduce import (NEW_REDUCE_OPS, OPS as REDUCE_OPS, REDUCE_ROWS, _new_reduce_inputs,
                          _reduce_model, all_inputs)
from cases.resize import OPS as RESIZE_OPS, RESIZE_ROWS, _model as resize_model
from cases.table import Refused, check_refused, refused_id, row_id


@pytest.mark.parametrize("row", REDUCE_ROWS + RESIZE_ROWS, ids=row_id)
def test_op_on_the_delegate(taichi_workers, row):
    check_op(row.cases, workers=taichi_workers)


def test_reduce_fp16_on_vulkan(vulkan_workers):
    case = ((2, 5, 3, 4), np.array([1, 2], np.int32), True, (2, 1, 1, 4))
    for op in REDUCE_OPS:
        check_delegate(_reduce_model(op, case), vulkan_workers, seed=1, precision="fp16")


def test_reduce_gles(gles_worker):
    case = ((3, 4, 5), np.array([-1, 0], np.int32), False, (4,))
    check_delegate(_reduce_model("MEAN", case), [gles_worker], seed=2)


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


# -- resizes -------------------------------------------------------------------------------
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


# -- REDUCE_ALL (bool carried as 0/1: the minimum) ------------------------------------------
def test_long_reduce_all_split_into_partial_results(taichi_workers):
    # 3 outputs of 4096 terms: the split reduction; one False in the second slice's last share
    case = ((3, 64, 64), np.array([1, 2], np.int32), False, (3,))
    x = np.ones((3, 64, 64), bool)
    x[1, 63, 60] = False
    check_delegate(_reduce_model("REDUCE_ALL", case, np.bool_), taichi_workers, [x])


def test_reduce_all_gles(gles_worker):
    case = ((3, 4, 5), np.array([-1, 0], np.int32), False, (4,))
    check_delegate(_reduce_model("REDUCE_ALL", case, np.bool_), [gles_worker], [all_inputs((3, 4, 5), 2)])


# -- what stays on the CPU -------------------------------------------------------------------
def _bool_reduce(op):
    return one_op_model(op, [Input((2, 3), np.bool_), Const(np.array([1], np.int32))],
                        [Output((2,), np.bool_)])


REFUSED = [
    Refused("bool REDUCE_MAX", _bool_reduce("REDUCE_MAX"), "REDUCE_MAX", "bool",
            [np.array([[0, 1, 0], [0, 0, 0]], bool)]),
    Refused("bool REDUCE_MIN", _bool_reduce("REDUCE_MIN"), "REDUCE_MIN", "bool",
            [np.array([[0, 1, 0], [1, 1, 1]], bool)]),
    # 1014 -> 3211 rows with half_pixel_centers: 83 rows where float32 rounding moves the
    # reference's index, above MAX_NEAREST_FIXES
    Refused("RESIZE_NEAREST_NEIGHBOR with too many ties",
            resize_model("RESIZE_NEAREST_NEIGHBOR", (1, 1014, 1, 1), (3211, 1), False, True),
            "RESIZE_NEAREST_NEIGHBOR", "rounding corrections", seed=6),
]


@pytest.mark.parametrize("case", REFUSED, ids=refused_id)
def test_what_stays_on_the_cpu(taichi_workers, case):
    check_refused(case, taichi_workers)
