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
from cases.transforms import (SQUARE, TRANSFORM_ROWS, _v2, matrix_model, pipeline_inputs,
                              pipeline_model)
from cases.table import row_id


@pytest.mark.parametrize("row", TRANSFORM_ROWS, ids=row_id)
def test_op_on_the_delegate(taichi_workers, row):
    check_op(row.cases, workers=taichi_workers)


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

