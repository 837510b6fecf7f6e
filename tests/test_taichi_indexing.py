"""GATHER, GATHER_ND, ONE_HOT (constant indices) and CUMSUM (constant axis) on the delegate (cpu,
vulkan, opengl workers; fp16 on vulkan; gles) vs the reference path, over the attribute space of
the LiteRT tests (tests/test_ops_indexing.py). One case table (INDEXING_ROWS,
tests/cases/indexing.py: a row per op, float32 and int8 drawn in it to keep the compile count
down) drives one property test; many runs, long axes, fp16 and GLES have their own tests;
what stays on the CPU is a table too (REFUSED: cases.table.Refused), one test. Tolerances:
tflite_taichi.testing.TAICHI_RTOL; quantized outputs within one quantization step. ARG_MAX,
ARG_MIN, TOPK_V2 and WHERE have no Taichi part (int outputs or data-dependent shapes)."""
import numpy as np
import pytest

from tflite_taichi.ops.base import Node, TensorSpec, lookup
from tflite_taichi.ops.indexing import CumsumOptions
from tflite_taichi.ops.tables import MAX_RUNS, arithmetic_runs
from tflite_taichi.testing import Const, Input, Output, check_delegate, check_op, one_op_model
from cases.indexing import INDEXING_ROWS, cumsum_model
from cases.table import Refused, check_refused, refused_id, row_id


@pytest.mark.parametrize("row", INDEXING_ROWS, ids=row_id)
def test_op_on_the_delegate(taichi_workers, row):
    check_op(row.cases, workers=taichi_workers)


# -- GATHER / GATHER_ND -------------------------------------------------------------------------
def test_gather_with_many_runs_matches_reference(taichi_workers):
    # a permutation of 40 channels (up to MAX_RUNS arithmetic runs) and a batch_dims gather
    perm = np.random.default_rng(0).permutation(40).astype(np.int32)
    assert len(arithmetic_runs(perm)) > 10
    model = one_op_model("GATHER", [Input((2, 3, 40)), Const(perm)], [Output((2, 3, 40))], axis=2)
    check_delegate(model, taichi_workers, seed=1)
    idx = np.array([[4, 0, 0, 2], [1, 1, 3, 3]], np.int32)
    model = one_op_model("GATHER", [Input((2, 5, 6)), Const(idx)], [Output((2, 4, 6))],
                         axis=1, batch_dims=1)
    check_delegate(model, taichi_workers, seed=2)


# -- what stays on the CPU --------------------------------------------------------------------
def _gather_with_too_many_runs():
    idx = np.random.default_rng(3).integers(0, 50, 300).astype(np.int32)
    assert arithmetic_runs(idx) is None
    return one_op_model("GATHER", [Input((50, 2)), Const(idx)], [Output((300, 2))])


def _gather_nd_with_too_many_runs():
    idx = np.random.default_rng(4).integers(0, 8, (200, 2)).astype(np.int32)
    return one_op_model("GATHER_ND", [Input((8, 8, 3)), Const(idx)], [Output((200, 3))])


def _one_hot_with_too_many_runs():
    idx = np.random.default_rng(5).integers(0, 10, 200).astype(np.int32)
    return one_op_model("ONE_HOT", [Const(idx), Const(np.array(10, np.int32)), Input(()),
                                    Input(())], [Output((200, 10))])


REFUSED = [
    Refused("GATHER with too many runs", _gather_with_too_many_runs, "GATHER",
            f"more than {MAX_RUNS} arithmetic runs", seed=3),
    Refused("GATHER_ND with too many runs", _gather_nd_with_too_many_runs, "GATHER_ND",
            "arithmetic runs", seed=4),
    # refused by the partitioner's generic rule (a run-time int32 tensor), not by GATHER
    Refused("GATHER with run-time indices",
            one_op_model("GATHER", [Input((4, 3)), Input((2,), np.int32)], [Output((2, 3))]),
            "GATHER", "int32", [np.ones((4, 3), np.float32), np.array([3, 1], np.int32)]),
    Refused("ONE_HOT with too many runs", _one_hot_with_too_many_runs, "ONE_HOT",
            "arithmetic runs", [np.float32(1), np.float32(0)]),
]


@pytest.mark.parametrize("case", REFUSED, ids=refused_id)
def test_what_stays_on_the_cpu(taichi_workers, case):
    check_refused(case, taichi_workers)


# -- CUMSUM -----------------------------------------------------------------------------------
@pytest.mark.parametrize("shape, axis, exclusive, reverse", [
    ((3000,), 0, False, False), ((2, 1000, 3), 1, True, True), ((5, 400), -1, True, False)])
def test_cumsum_long_axis_split_matches_reference(taichi_workers, shape, axis, exclusive, reverse):
    # few lines over a long axis: chunk sums in scratch, then each chunk scans
    node = _cumsum_node(shape, axis, exclusive, reverse)
    assert lookup("CUMSUM").scratch(node) > 0
    case = (shape, np.array(axis, np.int32), exclusive, reverse)
    check_delegate(cumsum_model(case), taichi_workers, seed=7)


def _cumsum_node(shape, axis, exclusive=False, reverse=False, constant=True):
    axis = np.array(axis, np.int32)
    return Node(index=0, op="CUMSUM", version=1, options=CumsumOptions(exclusive, reverse),
                inputs=(TensorSpec(0, "x", tuple(shape), np.dtype(np.float32)),
                        TensorSpec(1, "axis", (), np.dtype(np.int32),
                                   value=axis if constant else None)),
                outputs=(TensorSpec(2, "y", tuple(shape), np.dtype(np.float32)),))


def test_cumsum_runtime_axis_is_refused():
    # a run-time axis is int32, which the partitioner refuses first; CUMSUM's own check guards
    # the Taichi part (it reads the axis at build time) all the same
    reason = lookup("CUMSUM").supports(_cumsum_node((2, 3), 0, constant=False))
    assert reason == "the axis is known only at run time"
    assert lookup("CUMSUM").supports(_cumsum_node((2, 3), 0)) is None


# -- fp16 and GLES ----------------------------------------------------------------------------
def _family_models():
    rng = np.random.default_rng(8)
    idx = np.array([[2, 0], [1, 1], [3, 2]], np.int32)
    return [
        (one_op_model("GATHER", [Input((2, 4, 3)), Const(np.array([3, 0, 1, 1], np.int32))],
                      [Output((2, 4, 3))], axis=1), None),
        (one_op_model("GATHER_ND", [Input((4, 3, 2)), Const(idx)], [Output((3, 2))]), None),
        (one_op_model("ONE_HOT", [Const(rng.integers(-1, 5, (2, 3)).astype(np.int32)),
                                  Const(np.array(4, np.int32)), Input(()), Input(())],
                      [Output((2, 4, 3))], axis=1),
         [np.float32(1.5), np.float32(-0.5)]),
        (cumsum_model(((3, 7), np.array(1, np.int32), True, False)), None),
    ]


def test_indexing_fp16_on_vulkan(vulkan_workers):
    for model, inputs in _family_models():
        check_delegate(model, vulkan_workers, inputs, seed=9, precision="fp16")


def test_indexing_gles(gles_worker):
    for model, inputs in _family_models():
        check_delegate(model, [gles_worker], inputs, seed=10)
