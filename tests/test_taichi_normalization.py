"""LOG_SOFTMAX, L2_NORMALIZATION, LOCAL_RESPONSE_NORMALIZATION on the delegate (cpu, vulkan,
opengl workers; fp16 on vulkan; gles) vs the reference path, over the attribute space of the
LiteRT tests. Tolerances: tflite_taichi.testing.TAICHI_RTOL; quantized outputs within one
quantization step (check_delegate's rule). One case table (NORMALIZATION_ROWS,
tests/cases/normalization.py: each row draws the op inside each example, one compile per
example for the family) drives one property test; fp16, GLES and long rows have their own
tests."""
import pytest

from tflite_taichi.testing import check_delegate, check_op
from cases.normalization import NORMALIZATION_ROWS, ROW_OPS, lrn_model, row_inputs, row_model
from cases.table import row_id


@pytest.mark.parametrize("row", NORMALIZATION_ROWS, ids=row_id)
def test_ops_on_the_delegate(taichi_workers, row):
    check_op(row.cases, workers=taichi_workers)


def test_normalization_fp16_on_vulkan(vulkan_workers):
    for op in ROW_OPS:
        check_delegate(row_model(op, (2, 3, 17)), vulkan_workers, seed=1, precision="fp16")
    check_delegate(lrn_model((1, 3, 2, 9), dict(radius=2, bias=1.0, alpha=0.5, beta=0.75)),
                   vulkan_workers, seed=1, precision="fp16")


def test_normalization_gles(gles_worker):
    for op in ROW_OPS:
        check_delegate(row_model(op, (3, 11)), [gles_worker], seed=2)
    check_delegate(lrn_model((2, 2, 3, 6), dict(radius=1, bias=2.0, alpha=0.1, beta=0.5)),
                   [gles_worker], seed=2)


def test_long_rows(taichi_workers):
    # one row of 1000 logits (a classifier's LOG_SOFTMAX), and L2 over 4 rows of 512
    check_delegate(row_model("LOG_SOFTMAX", (1, 1000)), taichi_workers,
                   row_inputs((1, 1000), 10.0, 3))
    check_delegate(row_model("L2_NORMALIZATION", (4, 512)), taichi_workers, seed=4)
