"""Element-wise binary ops (ops/elementwise.py) on the delegate (cpu, vulkan, opengl workers;
fp16 on vulkan; gles) vs the reference path. Tolerances: tflite_taichi.testing.TAICHI_RTOL; a
quantized output within one unit. One case table (ELEMENTWISE_ROWS, tests/cases/elementwise.py:
a row per op and dtype) drives one property test; fp16 and GLES have their own tests; what
stays on the CPU is a table too (REFUSED: cases.table.Refused), one test."""
import numpy as np
import pytest

from tflite_taichi.testing import Const, Input, Output, check_delegate, check_op, one_op_model
from cases.elementwise import ELEMENTWISE_ROWS, binary_model as _model
from cases.table import Refused, check_refused, refused_id, row_id


@pytest.mark.parametrize("row", ELEMENTWISE_ROWS, ids=row_id)
def test_op_on_the_delegate(taichi_workers, row):
    check_op(row.cases, workers=taichi_workers)


@pytest.mark.parametrize("op", ["ADD", "MUL", "SQUARED_DIFFERENCE"])
def test_fp16_on_vulkan(vulkan_workers, op):
    model, inputs = _model(op, ((2, 5, 3), (5, 1), (2, 5, 3)), "RELU6", True, 7)
    check_delegate(model, vulkan_workers, inputs, precision="fp16")


def test_gles(gles_worker):
    model, inputs = _model("SUB", ((3, 1, 4), (2, 4), (3, 2, 4)), "NONE", False, 3)
    check_delegate(model, [gles_worker], inputs)


REFUSED = [
    Refused("int32 DIV",
            one_op_model("DIV", [Input((4,), np.int32), Const(np.array([3, -3, 2, 1], np.int32))],
                         [Output((4,), np.int32)]),
            "DIV", "int32", [np.array([7, 7, -7, 0], np.int32)]),
]


@pytest.mark.parametrize("case", REFUSED, ids=refused_id)
def test_what_stays_on_the_cpu(taichi_workers, case):
    check_refused(case, taichi_workers)
