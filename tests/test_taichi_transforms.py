"""CUSTOM:Resampler, Landmarks2TransformMatrix, TransformTensorBilinear and TransformLandmarks
on the delegate (cpu, vulkan, opengl workers; fp16 on vulkan; gles) vs the reference path, over
the cases of tests/cases/transforms.py (the LiteRT tests') (float32, and int8 data in the float view), and the
landmark pipeline (matrix -> warp -> CONV_2D, landmarks mapped back) in one partition.

Tolerances: tflite_taichi.testing.TAICHI_RTOL (1 unit for int8 outputs); `floor` where a
result can cancel (bilinear mixes of signed data, matrices whose entries differ in size)."""
import numpy as np
from hypothesis import given, settings, strategies as st

from tflite_taichi.ops.transforms import MAX_UNROLLED_LANDMARKS, landmarks_matrix_error
from tflite_taichi.testing import TAICHI_EXAMPLES, TAICHI_RTOL, check_delegate, check_op, strategies
from cases.transforms import (_data, _v2, landmarks_case, landmarks_model, matrix_model,
                              affine_matrix, pipeline_inputs, pipeline_model, resampler_case,
                              resampler_model, tensor_case, tensor_model, v1_case, v2_case,
                              warp_values, SQUARE)

S = strategies()


def _int8_data(rng, shape):
    return rng.integers(-128, 128, shape).astype(np.int8)


@settings(max_examples=TAICHI_EXAMPLES)
@given(case=resampler_case(), int8=st.booleans(), q=S.quant_params(), seed=S.seeds())
def test_resampler_delegate_matches_reference(taichi_workers, case, int8, q, seed):
    rng = np.random.default_rng(seed)
    warp = warp_values(rng, case)
    if int8:
        model = resampler_model(case["data"], case["warp"], np.int8, q)
        check_delegate(model, taichi_workers, [_int8_data(rng, case["data"]), warp])
    else:
        data = _data(rng, case["data"])
        check_delegate(resampler_model(case["data"], case["warp"]), taichi_workers,
                       [data, warp], floor=float(np.abs(data).max()))


@settings(max_examples=TAICHI_EXAMPLES)
@given(case=tensor_case(), int8=st.booleans(), constant=st.booleans(), q=S.quant_params(),
       seed=S.seeds())
def test_transform_tensor_delegate_matches_reference(taichi_workers, case, int8, constant, q,
                                                     seed):
    """The matrix at run time (in io) or constant (in the weights)."""
    rng = np.random.default_rng(seed)
    matrix = case["matrix"] if constant else None
    inputs = [] if constant else [case["matrix"][None]]
    if int8:
        model = tensor_model(case["data"], case["out"], case["version"], np.int8, q, matrix)
        check_delegate(model, taichi_workers, [_int8_data(rng, case["data"])] + inputs)
    else:
        data = _data(rng, case["data"])
        model = tensor_model(case["data"], case["out"], case["version"], matrix=matrix)
        check_delegate(model, taichi_workers, [data] + inputs, floor=float(np.abs(data).max()))


@st.composite
def landmarks_matrix_delegate_matches_reference_cases(draw):
    v1 = draw(v1_case())
    v2 = draw(v2_case())
    version = draw(st.sampled_from([1, 2]))
    o, points = v1 if version == 1 else v2
    # the bound of ops/transforms.py's error model (float32 trig and roundings propagated
    # through the matrix entries) as the floor: tolerance max(rtol max|expected|, bound)
    bound = landmarks_matrix_error(version, o, points)
    return (matrix_model(o, points.shape, version), [points],
            {"floor": bound / TAICHI_RTOL["fp32"]})


def test_landmarks_matrix_delegate_matches_reference(taichi_workers):
    """One thread, float32 (v1's reference works in float64, as the C++ mixes it in): within
    landmarks_matrix_error's bound (a draw on vulkan was off by 1.08e-05, 1.04 x the 1e-5 of
    the largest entry: the translation's terms cancel, the trig error does not)."""
    check_op(landmarks_matrix_delegate_matches_reference_cases(), workers=taichi_workers)


@st.composite
def transform_landmarks_delegate_matches_reference_cases(draw):
    case = draw(landmarks_case())
    matrix = draw(affine_matrix())
    seed = draw(S.seeds())
    version, shape, options = case
    points = np.random.default_rng(seed).uniform(-50, 250, shape).astype(np.float32)
    return landmarks_model(shape, version, options), [points, matrix[None]], {"floor": float(np.abs(points).max() * np.abs(matrix).max())}


def test_transform_landmarks_delegate_matches_reference(taichi_workers):
    check_op(transform_landmarks_delegate_matches_reference_cases(), workers=taichi_workers)


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

