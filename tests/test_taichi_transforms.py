"""CUSTOM:Resampler, Landmarks2TransformMatrix, TransformTensorBilinear and TransformLandmarks
on the delegate (cpu, vulkan, opengl workers; fp16 on vulkan; gles) vs the reference path, over
the cases of tests/cases/transforms.py (the LiteRT tests') (float32, and int8 data in the float
view), and the landmark pipeline (matrix -> warp -> CONV_2D, landmarks mapped back) in one
partition. One case table (TRANSFORM_ROWS, tests/cases/transforms.py: a row per op) drives one
property test; the pipeline, fp16, GLES and what stays on the CPU have their own tests.

Tolerances: tflite_taichi.testing.TAICHI_RTOL (1 unit for int8 outputs); `floor` where a
result can cancel (bilinear mixes of signed data, matrices whose entries differ in size)."""
import numpy as np
import pytest

from tflite_taichi.ops.transforms import MAX_UNROLLED_LANDMARKS
from tflite_taichi.testing import check_delegate, check_op
from cases.transforms import (SQUARE, TRANSFORM_ROWS, _v2, edge_samples, matrix_model,
                              off_the_edges, pipeline_inputs, pipeline_model, tensor_model)
from cases.table import row_id


@pytest.mark.parametrize("row", TRANSFORM_ROWS, ids=row_id)
def test_op_on_the_delegate(taichi_workers, row):
    check_op(row.cases, workers=taichi_workers)


# Matrices whose samples land exactly on the image's edges in every order of float32 sums
# (small integers and halves): an edge sample is inside, on the delegate as on the reference.
FLIP = np.array([[-1, 0, 0, 4], [0, -1, 0, 3], [0, 0, 1, 0], [0, 0, 0, 1]])
EXACT_EDGE_WARPS = {"identity-v1": (np.eye(4), 1), "identity-v2": (np.eye(4), 2),
                    "flip-v1": (FLIP, 1), "flip-v2": (FLIP, 2),
                    "scale-v1": (np.diag([2.0, 1.5, 1.0, 1.0]), 1)}


@pytest.mark.parametrize("matrix, version", EXACT_EDGE_WARPS.values(), ids=EXACT_EDGE_WARPS)
def test_samples_exactly_on_the_edges(taichi_workers, matrix, version):
    """The random draws keep off the edges (off_the_edges); these land on them exactly."""
    data = np.random.default_rng(14).uniform(1, 2, (1, 4, 5, 2)).astype(np.float32)
    matrix = matrix.astype(np.float32)
    assert edge_samples(matrix, data.shape, (4, 5), version == 2).any()
    check_delegate(tensor_model(data.shape, (4, 5), version), taichi_workers,
                   [data, matrix[None]])
    if version == 1 and matrix[0, 0] == 1:        # the identity: every edge sample is kept
        check_delegate(tensor_model(data.shape, (4, 5), version, matrix=matrix),
                       taichi_workers, [data])


def test_draws_keep_off_the_edges():
    """A drawn v2 warp whose last sample was an exact float32 tie at H - 1: the C++ (double)
    kept it, the x64 kernel (fast math reordering float32 sums) put it one ulp past the edge
    and zeroed it. The delegate's draws move such matrices a few thousandths of a pixel."""
    m = np.array([[0.6666667, 0, 0, 0.5], [0, 0.6666667, 0, -0.16666667],
                  [0, 0, 1, 0], [0, 0, 0, 1]], np.float32)
    case = dict(data=(1, 2, 2, 1), out=(3, 1), version=2, matrix=m)
    assert edge_samples(m, case["data"], case["out"], True).any()
    moved = off_the_edges(case)["matrix"]
    assert not edge_samples(moved, case["data"], case["out"], True).any()
    assert 0 < np.abs(moved - m).max() < 0.05
    np.testing.assert_array_equal(off_the_edges(dict(case, matrix=moved))["matrix"], moved)


def test_pipeline_delegate_matches_reference(taichi_workers):
    """Landmarks2TransformMatrix -> TransformTensorBilinear -> CONV_2D, and TransformLandmarks,
    all in one partition: the matrix passes through the arena."""
    rng = np.random.default_rng(11)
    model, weights, _ = pipeline_model(rng)
    summaries = check_delegate(model, taichi_workers, pipeline_inputs(rng),
                               floor=float(np.abs(weights).sum(axis=(1, 2, 3)).max()))
    for summary in summaries.values():
        assert summary["ops_delegated"] == 4


def test_pipeline_fp16_on_vulkan(vulkan_workers):
    rng = np.random.default_rng(12)
    model, weights, _ = pipeline_model(rng)
    check_delegate(model, vulkan_workers, pipeline_inputs(rng), precision="fp16",
                   floor=float(np.abs(weights).sum(axis=(1, 2, 3)).max()))


def test_gles(gles_worker):
    rng = np.random.default_rng(13)
    model, weights, _ = pipeline_model(rng)
    check_delegate(model, [gles_worker], pipeline_inputs(rng),
                   floor=float(np.abs(weights).sum(axis=(1, 2, 3)).max()))


def test_what_stays_on_the_cpu(taichi_workers):
    """Beyond MAX_UNROLLED_LANDMARKS subset reads, and v1 with an output side of 1 (a division
    by zero), Landmarks2TransformMatrix runs on the CPU, with the reason."""
    many = _v2(subset_idxs=[0, 1, 2, 3] * (MAX_UNROLLED_LANDMARKS // 4 + 1))
    v1 = dict(input_hw=[9, 9], output_hw=[1, 4], dimensions=3, landmarks_range=10,
              bbox_size_multiplier=1.0, left_rotation_idx=0, right_rotation_idx=1,
              subset=[0, 1])
    points_v1 = np.array([0, 0, 0, 10, 5, 0], np.float32).reshape(1, 1, 1, 6)
    for model, inputs, reason in ((matrix_model(many, SQUARE.shape, 2), [SQUARE], "unrolls"),
                                  (matrix_model(v1, points_v1.shape, 1), [points_v1],
                                   "divides by zero")):
        summaries = check_delegate(model, taichi_workers, inputs, expect_all_delegated=False)
        for summary in summaries.values():
            assert summary["ops_delegated"] == 0
            assert reason in summary["fallback"][0]["reason"]

