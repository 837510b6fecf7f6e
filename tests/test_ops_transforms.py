"""CUSTOM:Resampler, Landmarks2TransformMatrix (v1, v2), TransformTensorBilinear (v1, v2) and
TransformLandmarks (v1, v2) on the reference path (ops/transforms/ gives the semantics).

LiteRT 2.3 runs none of them (its builtin, reference and XNNPACK resolvers all report an
unresolved custom op: test_litert_has_no_kernel keeps that fact checked), so the reference is
held to a second formulation written here from the published definitions, in float64 and by
another route: the resampler and the tensor warp as per-pixel loops with weights
1 - |distance|, v2's corner alignment as the matrix product S T A it stands for, the
matrices as the chain of point maps (to [-1, 1], scale, rotate, back to pixels) evaluated at
three points rather than as matrix products; and to hand-checked cases (identity, a pure
translation, a 90-degree rotation, a scale, a square of landmarks). Tolerances:
tflite_taichi.testing (FLOAT_RTOL of the largest magnitude, with `floor` the size of the
operands where a result can cancel; 1 unit for int8)."""
import math

import numpy as np
import pytest
from hypothesis import given

from tflite_taichi.errors import ModelError
from tflite_taichi.ops.transforms import flex_options
from tflite_taichi.testing import (Const, Input, Output, assert_float_close, assert_quantized_close,
                                   one_op_model, quantize_array, run_litert, run_ours)
from cases.transforms import LANDMARKS, MATRIX, PIPELINE, RESAMPLER, S, SQUARE, TENSOR, _data, _pipeline_options, _v2, affine_matrix, edge_samples, landmarks_case, landmarks_model, matrix_model, pipeline_inputs, pipeline_model, resampler_case, resampler_model, sample_points, tensor_case, tensor_model, tensor_options, translation, v1_case, v2_case, warp_values


# -- independent formulations ----------------------------------------------------------------
def bilinear_zero(image, x, y):
    """image [H, W, C] at (x, y): the pixels around it, weighted by 1 - |distance| along each
    axis, those outside the image counting as 0."""
    h, w, c = image.shape
    out = np.zeros(c)
    for j in (math.floor(y), math.floor(y) + 1):
        for i in (math.floor(x), math.floor(x) + 1):
            if 0 <= i < w and 0 <= j < h:
                out += (1 - abs(x - i)) * (1 - abs(y - j)) * image[j, i].astype(np.float64)
    return out


def loop_resampler(data, warp):
    """tensorflow addons' resampler, point by point: -1 < x < W and -1 < y < H sample."""
    n, h, w, c = data.shape
    points = np.asarray(warp, np.float64).reshape(n, -1, 2)
    out = np.zeros((n, points.shape[1], c))
    for b in range(n):
        for p, (x, y) in enumerate(points[b]):
            if -1 < x < w and -1 < y < h:
                out[b, p] = bilinear_zero(data[b], x, y)
    return out.reshape((n, *np.shape(warp)[1:-1], c)).astype(np.float32)


def loop_transform_tensor(data, matrix, out_h, out_w, align_corners):
    """Output pixel (X, Y) samples the data at M (X, Y, 0, 1); v2 (align_corners) uses
    S M A, A moving pixel corners to centres (+1/2) and S back (-1/2). Outside [0, W - 1] x
    [0, H - 1]: 0."""
    return _loop_transform_tensor(data, matrix, out_h, out_w, align_corners)[0]


def _loop_transform_tensor(data, matrix, out_h, out_w, align_corners):
    """(output, where a sample lies within EDGE_AMBIGUITY of the edge: cases.transforms)."""
    points_x, points_y = sample_points(matrix, (out_h, out_w), align_corners)
    _, h, w, c = data.shape
    out = np.zeros((1, out_h, out_w, c))
    for Y in range(out_h):
        for X in range(out_w):
            tx, ty = points_x[Y, X], points_y[Y, X]
            if 0 <= tx <= w - 1 and 0 <= ty <= h - 1:
                out[0, Y, X] = bilinear_zero(data[0], tx, ty)
    edges = edge_samples(matrix, data.shape, (out_h, out_w), align_corners)
    return out.astype(np.float32), np.broadcast_to(edges[None, :, :, None], out.shape)


def expected_transform_tensor(actual, data, case):
    """The loop's output, taking the op's value where the sample sits on the edge."""
    expected, ambiguous = _loop_transform_tensor(data, case["matrix"], *case["out"],
                                                 case["version"] == 2)
    return np.where(ambiguous, actual, expected)


def rotate(angle, p):
    c, s = math.cos(angle), math.sin(angle)
    return np.array([c * p[0] - s * p[1], s * p[0] + c * p[1]])


def matrix_of_point_map(f):
    """The 4x4 matrix of an affine map f of the output's (u, v), from three points."""
    origin = np.asarray(f(0.0, 0.0))
    ex, ey = np.asarray(f(1.0, 0.0)) - origin, np.asarray(f(0.0, 1.0)) - origin
    return np.array([[ex[0], ey[0], 0, origin[0]], [ex[1], ey[1], 0, origin[1]],
                     [0, 0, 1, 0], [0, 0, 0, 1]])


def subset_points(landmarks, subset):
    idx = list(subset) + ([subset[-1]] if len(subset) % 2 else [])
    return [np.asarray(landmarks[i, :2], np.float64) for i in idx]


def box(points):
    """(min corner, max corner) of points."""
    return np.min(points, axis=0), np.max(points, axis=0)


def rotation_landmarks(o, landmarks):
    return landmarks[o["left_rotation_idx"], :2], landmarks[o["right_rotation_idx"], :2]


def v1_matrix(o, landmarks):
    """Landmarks2TransformMatrix v1: output pixel -> [-1, 1] -> scaled by the rotated box
    (over landmarks_range) -> rotated back about the box centre (in [-1, 1] units) ->
    input pixels."""
    landmarks = np.asarray(landmarks, np.float64).reshape(-1, 3)
    (lx, ly), (rx, ry) = rotation_landmarks(o, landmarks)
    alpha = -math.atan((ry - ly) / (rx - lx))
    lo, hi = box([rotate(alpha, p) for p in subset_points(landmarks, o["subset"])])
    size = (hi - lo) * o["bbox_size_multiplier"] / o["landmarks_range"]
    centre = rotate(-alpha, (lo + hi) / 2) / o["landmarks_range"] * 2 - 1
    (in_h, in_w), (out_h, out_w) = o["input_hw"], o["output_hw"]

    def f(u, v):
        relative = np.array([2 * u / (out_w - 1) - 1, 2 * v / (out_h - 1) - 1])
        p = rotate(-alpha, relative * size) + centre
        return (p[0] + 1) * (in_w - 1) / 2, (p[1] + 1) * (in_h - 1) / 2
    return matrix_of_point_map(f)


def v2_matrix(o, landmarks):
    """Landmarks2TransformMatrix v2: output pixel (u, v) -> the crop centre plus its offset
    from the output's centre, scaled by the crop size and turned by -rotation."""
    landmarks = np.asarray(landmarks, np.float64).reshape(-1, 3)
    (lx, ly), (rx, ry) = rotation_landmarks(o, landmarks)
    rotation = o["target_rotation_radians"] - math.atan2(ry - ly, rx - lx)
    lo, hi = box([rotate(rotation, p) for p in subset_points(landmarks, o["subset_idxs"])])
    centre = rotate(-rotation, (lo + hi) / 2)
    w, h = o["output_width"], o["output_height"]
    scale = np.array([o["scale_x"] * (hi - lo)[0] / w, o["scale_y"] * (hi - lo)[1] / h])
    return matrix_of_point_map(
        lambda u, v: centre + rotate(-rotation, scale * np.array([u - w / 2, v - h / 2])))


def loop_transform_landmarks(points, matrix, dimensions, scale=1.0):
    m = np.asarray(matrix, np.float64).reshape(4, 4)
    out = np.array(points, np.float64).reshape(-1, dimensions)
    for p in out:
        x, y = p[0], p[1]
        p[0] = m[0, 0] * x + m[0, 1] * y + m[0, 3] * scale
        p[1] = m[1, 0] * x + m[1, 1] * y + m[1, 3] * scale
    return out.reshape(np.shape(points)).astype(np.float32)


# -- LiteRT ----------------------------------------------------------------------------------
@pytest.mark.parametrize("kernels", ["reference", "builtin", "xnnpack"])
def test_litert_has_no_kernel(kernels):
    """The fact the module docstring states: LiteRT 2.3 resolves none of these ops."""
    models = [resampler_model((1, 3, 3, 1), (1, 3, 3, 2)),
              tensor_model((1, 3, 3, 1), (2, 2), 2),
              matrix_model(dict(subset_idxs=[0, 1], left_rotation_idx=0, right_rotation_idx=1,
                                target_rotation_radians=0.0, output_height=2, output_width=2,
                                scale_x=1.0, scale_y=1.0), (1, 2, 3), 2),
              landmarks_model((1, 2, 3), 2)]
    for model in models:
        inputs = [np.zeros(d, np.float32) for d in _input_shapes(model)]
        with pytest.raises(RuntimeError, match="unresolved custom op"):
            run_litert(model, inputs, kernels)


def _input_shapes(model):
    from tflite_taichi.interpreter import Interpreter
    return [tuple(d["shape"]) for d in Interpreter(model_content=model).get_input_details()]


# -- Resampler -------------------------------------------------------------------------------
@given(case=resampler_case(), seed=S.seeds())
def test_resampler_matches_loop(case, seed):
    rng = np.random.default_rng(seed)
    data, warp = _data(rng, case["data"]), warp_values(rng, case)
    (out,) = run_ours(resampler_model(case["data"], case["warp"]), [data, warp])
    assert_float_close(out, loop_resampler(data, warp), floor=float(np.abs(data).max()))


@given(case=resampler_case(), q=S.quant_params(), seed=S.seeds())
def test_resampler_int8_matches_loop(case, q, seed):
    """int8 data, the float view: the loop on the dequantized data, quantized: 1 unit."""
    rng = np.random.default_rng(seed)
    codes = rng.integers(-128, 128, case["data"]).astype(np.int8)
    warp = warp_values(rng, case)
    (out,) = run_ours(resampler_model(case["data"], case["warp"], np.int8, q), [codes, warp])
    real = (codes.astype(np.float32) - q[1]) * np.float32(q[0])
    assert_quantized_close(out, quantize_array(loop_resampler(real, warp), q))


def test_resampler_hand_cases():
    data = np.arange(1, 7, dtype=np.float32).reshape(1, 2, 3, 1)       # [[1 2 3] [4 5 6]]
    grid = np.stack(np.meshgrid(np.arange(3), np.arange(2)), -1)[None].astype(np.float32)
    model = resampler_model((1, 2, 3, 1), (1, 2, 3, 2))
    identity, = run_ours(model, [data, grid])
    np.testing.assert_array_equal(identity, data)
    shifted, = run_ours(model, [data, grid + np.float32([0.5, 0])])     # between columns
    np.testing.assert_allclose(shifted[0, :, :, 0], [[1.5, 2.5, 1.5], [4.5, 5.5, 3.0]])
    points = np.array([[[-1, 0], [-0.5, 0], [3, 1], [2.5, 1], [2, 2], [1, 1.5], [np.nan, 0],
                        [np.inf, 0], [0, -np.inf]]], np.float32)
    out, = run_ours(resampler_model((1, 2, 3, 1), (1, 9, 2)), [data, points])
    # x = -1 and x = W do not sample; half a pixel out is half the edge pixel
    np.testing.assert_allclose(out[0, :, 0], [0, 0.5, 0, 3, 0, 2.5, 0, 0, 0])


def test_empty_images_sample_nothing():
    """An image with no rows has no pixel inside: zeros (and an empty batch, nothing)."""
    (out,) = run_ours(resampler_model((1, 0, 3, 2), (1, 4, 2)),
                      [np.zeros((1, 0, 3, 2), np.float32), np.zeros((1, 4, 2), np.float32)])
    np.testing.assert_array_equal(out, np.zeros((1, 4, 2), np.float32))
    (out,) = run_ours(resampler_model((0, 3, 3, 2), (0, 4, 2)),
                      [np.zeros((0, 3, 3, 2), np.float32), np.zeros((0, 4, 2), np.float32)])
    assert out.shape == (0, 4, 2)
    (out,) = run_ours(tensor_model((1, 3, 0, 2), (2, 2), 2),
                      [np.zeros((1, 3, 0, 2), np.float32), np.eye(4, dtype=np.float32)[None]])
    np.testing.assert_array_equal(out, np.zeros((1, 2, 2, 2), np.float32))


# -- TransformTensorBilinear -----------------------------------------------------------------
@given(case=tensor_case(), seed=S.seeds())
def test_transform_tensor_matches_loop(case, seed):
    rng = np.random.default_rng(seed)
    data = _data(rng, case["data"])
    (out,) = run_ours(tensor_model(case["data"], case["out"], case["version"]),
                      [data, case["matrix"][None]])
    assert_float_close(out, expected_transform_tensor(out, data, case),
                       floor=float(np.abs(data).max()))


@given(case=tensor_case(), q=S.quant_params(), seed=S.seeds())
def test_transform_tensor_int8_matches_loop(case, q, seed):
    rng = np.random.default_rng(seed)
    codes = rng.integers(-128, 128, case["data"]).astype(np.int8)
    (out,) = run_ours(tensor_model(case["data"], case["out"], case["version"], np.int8, q),
                      [codes, case["matrix"][None]])
    real = (codes.astype(np.float32) - q[1]) * np.float32(q[0])
    real_out = (out.astype(np.float32) - q[1]) * np.float32(q[0])
    expected = expected_transform_tensor(real_out, real, case)
    assert_quantized_close(out, quantize_array(expected, q))


def _warp(data, matrix, out_hw, version):
    (out,) = run_ours(tensor_model(data.shape, out_hw, version, matrix=matrix), [data])
    return out[0, :, :, 0]


def test_transform_tensor_hand_cases():
    rng = np.random.default_rng(1)
    data = rng.standard_normal((1, 6, 6, 1)).astype(np.float32)
    image = data[0, :, :, 0]
    for version in (1, 2):       # the identity is the identity, corners aligned or not
        np.testing.assert_array_equal(_warp(data, np.eye(4), (4, 5), version), image[:4, :5])
    # a pure translation by (1, 2): what falls beyond the last row/column is 0
    shifted = np.zeros((6, 6), np.float32)
    shifted[:4, :5] = image[2:, 1:]
    np.testing.assert_array_equal(_warp(data, translation(1, 2), (6, 6), 1), shifted)
    # a 90-degree rotation: (X, Y) -> (5 - Y, X) is numpy's rot90
    turn = np.array([[0, -1, 0, 5], [1, 0, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]])
    np.testing.assert_array_equal(_warp(data, turn, (6, 6), 1), np.rot90(image))
    # a scale by 2: v1 takes every other pixel, v2 (pixel centres) the mean of 2x2 blocks
    scale = np.diag([2.0, 2.0, 1.0, 1.0])
    np.testing.assert_array_equal(_warp(data, scale, (3, 3), 1), image[::2, ::2])
    blocks = image.reshape(3, 2, 3, 2).mean(axis=(1, 3))
    np.testing.assert_allclose(_warp(data, scale, (3, 3), 2), blocks, rtol=1e-6, atol=1e-6)
    # a one-row image: only samples on the row are inside
    row = data[:, :1]
    np.testing.assert_array_equal(_warp(row, np.eye(4), (2, 6), 1), [image[0], np.zeros(6)])
    # half a pixel to the right: the mean of horizontal neighbours
    np.testing.assert_allclose(_warp(data, translation(0.5, 0), (6, 5), 1),
                               (image[:, :-1] + image[:, 1:]) / 2, rtol=1e-6, atol=1e-6)


def test_transform_tensor_non_finite_matrix_gives_zeros():
    data = np.ones((1, 3, 3, 2), np.float32)
    for bad in (np.nan, np.inf):
        m = np.eye(4, dtype=np.float32)
        m[0, 3] = bad
        (out,) = run_ours(tensor_model(data.shape, (2, 2), 2), [data, m[None]])
        np.testing.assert_array_equal(out, np.zeros((1, 2, 2, 2), np.float32))


def test_transform_tensor_v1_name_alias():
    """CUSTOM:TransformTensor, the GPU delegate's v1 name, is the same op."""
    data = _data(np.random.default_rng(2), (1, 4, 4, 2))
    m = translation(0.5, 0.25).astype(np.float32)
    model = one_op_model("CUSTOM:TransformTensor", [Input((1, 4, 4, 2)), Input((1, 4, 4))],
                         [Output((1, 3, 3, 2))], custom_options=tensor_options(1, 3, 3))
    (out,) = run_ours(model, [data, m[None]])
    assert_float_close(out, loop_transform_tensor(data, m, 3, 3, False),
                       floor=float(np.abs(data).max()))


# -- Landmarks2TransformMatrix ---------------------------------------------------------------
@given(case=v1_case())
def test_matrix_v1_matches_point_maps(case):
    o, points = case
    (out,) = run_ours(matrix_model(o, points.shape, 1), [points])
    expected = v1_matrix(o, points).astype(np.float32)[None]
    assert_float_close(out, expected)


@given(case=v2_case())
def test_matrix_v2_matches_point_maps(case):
    o, points = case
    (out,) = run_ours(matrix_model(o, points.shape, 2), [points])
    assert_float_close(out, v2_matrix(o, points).astype(np.float32)[None])


def test_matrix_v2_hand_cases():
    """A 20x20 square centred on (20, 20) cropped to 8x8: 2.5 input pixels per output pixel;
    output (0, 0) lands on the crop's corner."""
    (m,) = run_ours(matrix_model(_v2(), SQUARE.shape, 2), [SQUARE])
    np.testing.assert_allclose(m[0], [[2.5, 0, 0, 10], [0, 2.5, 0, 10], [0, 0, 1, 0],
                                      [0, 0, 0, 1]], atol=1e-5)
    # a target of 90 degrees: rotation pi/2, the crop turned a quarter
    (m,) = run_ours(matrix_model(_v2(target_rotation_radians=float(np.float32(math.pi / 2))),
                                 SQUARE.shape, 2), [SQUARE])
    np.testing.assert_allclose(m[0], [[0, 2.5, 0, 10], [-2.5, 0, 0, 30], [0, 0, 1, 0],
                                      [0, 0, 0, 1]], atol=1e-5)
    # scale_x 2 doubles the crop's width; a lone subset index pairs with itself
    (m,) = run_ours(matrix_model(_v2(scale_x=2.0, subset_idxs=[0, 2, 3]), SQUARE.shape, 2),
                    [SQUARE])
    np.testing.assert_allclose(m[0, :2], [[5, 0, 0, 0], [0, 2.5, 0, 10]], atol=1e-5)


def test_matrix_v1_hand_case():
    """The square (25..75)^2 in landmarks_range 100, output 17x17, input 101x101: output 0 and
    16 land on the square's sides, 3.125 input pixels apart per output pixel."""
    points = np.array([25, 25, 0, 75, 25, 0, 75, 75, 0, 25, 75, 0], np.float32).reshape(1, 1, 1, 12)
    o = dict(input_hw=[101, 101], output_hw=[17, 17], dimensions=3, landmarks_range=100,
             bbox_size_multiplier=1.0, left_rotation_idx=0, right_rotation_idx=1,
             subset=[0, 1, 2, 3])
    (m,) = run_ours(matrix_model(o, points.shape, 1), [points])
    np.testing.assert_allclose(m[0], [[3.125, 0, 0, 25], [0, 3.125, 0, 25], [0, 0, 1, 0],
                                      [0, 0, 0, 1]], atol=1e-5)


def test_matrix_v1_output_side_of_one_divides_by_zero():
    """As the C++: 2 / (1 - 1) is inf, and the matrix carries it (no error)."""
    points = np.array([0, 0, 0, 10, 5, 0], np.float32).reshape(1, 1, 1, 6)
    o = dict(input_hw=[9, 9], output_hw=[1, 4], dimensions=3, landmarks_range=10,
             bbox_size_multiplier=1.0, left_rotation_idx=0, right_rotation_idx=1, subset=[0, 1])
    (m,) = run_ours(matrix_model(o, points.shape, 1), [points])
    assert not np.all(np.isfinite(m[0, :2]))
    assert np.all(np.isfinite(m[0, :2, 0]))       # the x column stays finite


def test_matrix_v2_name_alias():
    (m,) = run_ours(one_op_model("CUSTOM:Landmarks2TransformMatrixV2", [Input(SQUARE.shape)],
                                 [Output((1, 4, 4))], version=2,
                                 custom_options=flex_options(**_v2())), [SQUARE])
    np.testing.assert_allclose(m[0, 0], [2.5, 0, 0, 10], atol=1e-5)


@given(case=landmarks_case(), matrix=affine_matrix(), seed=S.seeds())
def test_transform_landmarks_matches_loop(case, matrix, seed):
    version, shape, options = case
    points = np.random.default_rng(seed).uniform(-50, 250, shape).astype(np.float32)
    (out,) = run_ours(landmarks_model(shape, version, options), [points, matrix[None]])
    d = options["dimensions"] if options else shape[-1] if version == 2 else 3
    scale = options["scale"] if options else 1.0
    expected = loop_transform_landmarks(points, matrix, d, scale)
    assert_float_close(out, expected, floor=float(np.abs(points).max() * np.abs(matrix).max()))


def test_transform_landmarks_hand_cases():
    points = np.array([[[1, 2, 7], [3, -4, 8]]], np.float32)
    model = landmarks_model((1, 2, 3), 2)
    (same,) = run_ours(model, [points, np.eye(4, dtype=np.float32)[None]])
    np.testing.assert_array_equal(same, points)
    turn = np.array([[0, -1, 0, 10], [1, 0, 0, 20], [0, 0, 1, 0], [0, 0, 0, 1]], np.float32)
    (turned,) = run_ours(model, [points, turn[None]])            # z is copied
    np.testing.assert_array_equal(turned, [[[8, 21, 7], [14, 23, 8]]])
    # v1: the translation times scale; 2-D landmarks, two per pixel
    flat = np.array([1, 2, 3, -4], np.float32).reshape(1, 1, 1, 4)
    (moved,) = run_ours(landmarks_model((1, 1, 1, 4), 1, dict(dimensions=2, scale=2.0)),
                        [flat, translation(10, 20).astype(np.float32)[None]])
    np.testing.assert_array_equal(moved.ravel(), [21, 42, 23, 36])


def test_pipeline_matches_independent_chain():
    """Reference path vs the point-map matrix, the loop warp and LiteRT's CONV_2D."""
    rng = np.random.default_rng(11)
    model, weights, bias = pipeline_model(rng)
    landmarks, image = pipeline_inputs(rng)
    features, moved = run_ours(model, [landmarks, image])
    m = v2_matrix(_pipeline_options(), landmarks)
    crop = loop_transform_tensor(image, m, *PIPELINE["crop"], True)
    assert np.all(crop != 0), "the crop should lie inside the image"
    conv = one_op_model("CONV_2D", [Input(crop.shape), Const(weights), Const(bias)],
                        [Output((1, *PIPELINE["crop"], PIPELINE["conv_out"]))], padding="SAME",
                        stride_h=1, stride_w=1)
    (expected,) = run_litert(conv, [crop])
    assert_float_close(features, expected, floor=float(np.abs(weights).sum(axis=(1, 2, 3)).max()))
    assert_float_close(moved, loop_transform_landmarks(landmarks, m, 3),
                       floor=float(np.abs(landmarks).max() * 4))


# -- invalid models --------------------------------------------------------------------------
def _raises(model, op, match, inputs):
    with pytest.raises(ModelError, match=match) as info:
        run_ours(model, inputs)
    assert op in str(info.value)


def test_resampler_bad_models():
    d, w = np.zeros((1, 3, 3, 2), np.float32), np.zeros((1, 3, 3, 2), np.float32)
    _raises(resampler_model((3, 3, 2), (1, 3, 3, 2)), "Resampler", "rank 4",
            [np.zeros((3, 3, 2), np.float32), w])
    _raises(resampler_model((1, 3, 3, 2), (1, 3, 3, 3)), "Resampler", r"\[batch, \.\.\., 2\]",
            [d, np.zeros((1, 3, 3, 3), np.float32)])
    _raises(resampler_model((1, 3, 3, 2), (2,)), "Resampler", "warp",
            [d, np.zeros((2,), np.float32)])
    _raises(resampler_model((1, 3, 3, 2), (2, 3, 3, 2)), "Resampler", "batch 2",
            [d, np.zeros((2, 3, 3, 2), np.float32)])
    _raises(resampler_model((1, 3, 3, 2), (1, 3, 3, 2), np.int32), "Resampler", "int32",
            [d.astype(np.int32), w])
    warp_q = one_op_model(RESAMPLER, [Input((1, 3, 3, 2)), Input((1, 3, 3, 2), np.int8, (0.1, 0))],
                          [Output((1, 3, 3, 2))])
    _raises(warp_q, "Resampler", "warp", [d, w.astype(np.int8)])


def test_transform_tensor_bad_models():
    d, m = np.zeros((1, 4, 4, 2), np.float32), np.eye(4, dtype=np.float32)[None]

    def model(options, version=2, data=(1, 4, 4, 2), matrix=(1, 4, 4)):
        return one_op_model(TENSOR, [Input(data), Input(matrix)], [Output((1, 2, 2, 2))],
                            version=version, custom_options=options)
    ok = tensor_options(2, 2, 2)
    _raises(model(None), "TransformTensorBilinear", "custom_options", [d, m])
    _raises(model(b"\x07\x00\x01"), "TransformTensorBilinear", "custom_options", [d, m])
    _raises(model(flex_options(output_height=2)), "TransformTensorBilinear", "output_width",
            [d, m])
    _raises(model(flex_options(output_height=2, output_width="2")), "TransformTensorBilinear",
            "integer", [d, m])
    _raises(model(flex_options(output_height=0, output_width=2)), "TransformTensorBilinear",
            "positive", [d, m])
    _raises(model(flex_options(mode="nearest", output_size=[2, 2]), 1), "TransformTensor",
            "bilinear", [d, m])
    _raises(model(flex_options(mode="bilinear", output_size=[2]), 1), "TransformTensor",
            "2 entries", [d, m])
    _raises(model(ok, 3), "TransformTensorBilinear", "v3", [d, m])
    _raises(model(ok, data=(2, 4, 4, 2)), "TransformTensorBilinear", "batch 2",
            [np.zeros((2, 4, 4, 2), np.float32), m])
    _raises(model(ok, data=(4, 4, 2)), "TransformTensorBilinear", "rank 4",
            [np.zeros((4, 4, 2), np.float32), m])
    _raises(model(ok, matrix=(1, 3, 3)), "TransformTensorBilinear", "4x4",
            [d, np.zeros((1, 3, 3), np.float32)])


def test_landmarks_matrix_bad_models():
    x2, x1 = np.zeros((1, 4, 3), np.float32), np.zeros((1, 1, 1, 12), np.float32)
    _raises(matrix_model(_v2(), (1, 4, 2), 2), "Landmarks2TransformMatrix", r"\[1, landmarks, 3\]",
            [np.zeros((1, 4, 2), np.float32)])
    _raises(matrix_model(_v2(subset_idxs=[0, 4]), (1, 4, 3), 2), "Landmarks2TransformMatrix",
            "subset index 4", [x2])
    _raises(matrix_model(_v2(subset_idxs=[]), (1, 4, 3), 2), "Landmarks2TransformMatrix",
            "empty", [x2])
    _raises(matrix_model(_v2(right_rotation_idx=-1), (1, 4, 3), 2), "Landmarks2TransformMatrix",
            "right_rotation_idx", [x2])
    _raises(matrix_model(_v2(scale_x=0.0), (1, 4, 3), 2), "Landmarks2TransformMatrix",
            "scale_x", [x2])
    _raises(matrix_model(_v2(output_width=0), (1, 4, 3), 2), "Landmarks2TransformMatrix",
            "output_width", [x2])
    options = _v2()
    del options["target_rotation_radians"]
    _raises(matrix_model(options, (1, 4, 3), 2), "Landmarks2TransformMatrix",
            "target_rotation_radians", [x2])
    v1 = dict(input_hw=[9, 9], output_hw=[4, 4], dimensions=3, landmarks_range=10,
              bbox_size_multiplier=1.0, left_rotation_idx=0, right_rotation_idx=1, subset=[0, 1])
    for change, match in ((dict(dimensions=2), "dimensions"),
                          (dict(landmarks_range=0), "landmarks_range"),
                          (dict(bbox_size_multiplier=0.0), "bbox_size_multiplier"),
                          (dict(input_hw=[0, 9]), "input_hw"), (dict(output_hw=[4]), "output_hw")):
        _raises(matrix_model(dict(v1, **change), (1, 1, 1, 12), 1), "Landmarks2TransformMatrix",
                match, [x1])
    _raises(matrix_model(v1, (1, 4, 3), 1), "Landmarks2TransformMatrix", r"\[1, 1, 1, 3", [x2])
    _raises(one_op_model(MATRIX, [Input((1, 4, 3), np.int32)], [Output((1, 4, 4))], version=2,
                         custom_options=flex_options(**_v2())), "Landmarks2TransformMatrix",
            "int32", [x2.astype(np.int32)])
    _raises(one_op_model(MATRIX, [Input((1, 4, 3))], [Output((1, 4, 4))], version=2,
                         custom_options=flex_options(a=1)[:-1]), "Landmarks2TransformMatrix",
            "flexbuffer", [x2])


def test_transform_landmarks_bad_models():
    m = np.eye(4, dtype=np.float32)[None]
    _raises(landmarks_model((1, 4, 4), 2), "TransformLandmarks", "2 or 3",
            [np.zeros((1, 4, 4), np.float32), m])
    _raises(landmarks_model((2, 4, 3), 2), "TransformLandmarks", "batch 2",
            [np.zeros((2, 4, 3), np.float32), m])
    _raises(landmarks_model((1, 1, 2, 4), 1, dict(dimensions=3)), "TransformLandmarks",
            "multiple of dimensions", [np.zeros((1, 1, 2, 4), np.float32), m])
    _raises(landmarks_model((1, 1, 2, 6), 1, dict(dimensions=4)), "TransformLandmarks",
            "dimensions is 4", [np.zeros((1, 1, 2, 6), np.float32), m])
    _raises(landmarks_model((1, 1, 2, 6), 1, dict(scale=0.0)), "TransformLandmarks",
            "scale", [np.zeros((1, 1, 2, 6), np.float32), m])
    _raises(landmarks_model((1, 4, 3), 1), "TransformLandmarks", "rank 4",
            [np.zeros((1, 4, 3), np.float32), m])
    _raises(one_op_model(LANDMARKS, [Input((1, 4, 3)), Input((4, 3))], [Output((1, 4, 3))],
                         version=2), "TransformLandmarks", "4x4",
            [np.zeros((1, 4, 3), np.float32), np.zeros((4, 3), np.float32)])
