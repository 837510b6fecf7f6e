"""BATCH_MATMUL on the delegate (cpu, vulkan, opengl workers; fp16 on vulkan; gles) vs the
reference path, over the attribute space of the LiteRT tests (run-time or constant RHS, the
latter packed for the kernel; adj_x / adj_y; broadcast batch dimensions; split-K).
Tolerances: tflite_taichi.testing.TAICHI_RTOL; quantized outputs within one quantization step.
One case table (MATMUL_ROWS, tests/cases/matmul.py: a row per dtype) drives one property test;
split-K, fp16 and GLES have their own tests."""
import numpy as np
import pytest

from tflite_taichi.testing import check_delegate, check_op
from cases.matmul import MATMUL_ROWS, matmul_model
from cases.table import row_id


@pytest.mark.parametrize("row", MATMUL_ROWS, ids=row_id)
def test_op_on_the_delegate(taichi_workers, row):
    check_op(row.cases, workers=taichi_workers)


def test_split_k(taichi_workers):
    # 2 x 3 outputs of 700 terms: partial sums in scratch; constant RHS with adj_y (packed)
    case = ((2, 3, 700), (1, 4, 700), False, True, (2, 3, 4))
    rhs = np.random.default_rng(0).uniform(-1, 1, case[1]).astype(np.float32)
    check_delegate(matmul_model(case, rhs_const=rhs), taichi_workers, seed=0)
    case = ((2, 700, 3), (700, 4), True, False, (2, 3, 4))
    check_delegate(matmul_model(case), taichi_workers, seed=1)


def test_matmul_fp16_on_vulkan(vulkan_workers):
    case = ((2, 1, 5, 6), (3, 7, 6), False, True, (2, 3, 5, 7))
    check_delegate(matmul_model(case), vulkan_workers, seed=1, precision="fp16")


def test_matmul_gles(gles_worker):
    case = ((2, 6, 5), (6, 7), True, False, (2, 5, 7))
    rhs = np.random.default_rng(2).uniform(-3, 3, case[1]).astype(np.float32)
    check_delegate(matmul_model(case, rhs_const=rhs), [gles_worker], seed=2)
