"""Cases for MediaPipe's CUSTOM:Resampler, Landmarks2TransformMatrix, TransformTensorBilinear and
TransformLandmarks: one-op models, case spaces (warps, affine matrices, landmark sets, both
versions' options), data, and the landmark pipeline (matrix -> warp -> CONV_2D, landmarks mapped
back) (test_ops_transforms.py and test_taichi_transforms.py)."""
import math
import numpy as np
from hypothesis import strategies as st
from tflite_taichi.builder import ModelBuilder
from tflite_taichi.ops.transforms import flex_options, landmarks_matrix_error
from tflite_taichi.testing import TAICHI_RTOL, Const, Input, Output, one_op_model, strategies
from cases.table import Row


S = strategies()


RESAMPLER = "CUSTOM:Resampler"


TENSOR = "CUSTOM:TransformTensorBilinear"


MATRIX = "CUSTOM:Landmarks2TransformMatrix"


LANDMARKS = "CUSTOM:TransformLandmarks"


# -- models ----------------------------------------------------------------------------------
def resampler_model(data_shape, warp_shape, dtype=np.float32, q=None):
    out = (data_shape[0], *warp_shape[1:-1], data_shape[-1])
    return one_op_model(RESAMPLER, [Input(data_shape, dtype, q), Input(warp_shape)],
                        [Output(out, dtype, q)])


def tensor_options(version, out_h, out_w):
    if version == 1:
        return flex_options(mode="bilinear", output_size=[out_h, out_w])
    return flex_options(output_height=out_h, output_width=out_w)


def tensor_model(data_shape, out_hw, version, dtype=np.float32, q=None, matrix=None):
    """TransformTensorBilinear; `matrix`: a constant, else a run-time input."""
    m = (Input((1, 4, 4)) if matrix is None
         else Const(np.asarray(matrix, np.float32).reshape(1, 4, 4)))
    return one_op_model(TENSOR, [Input(data_shape, dtype, q), m],
                        [Output((1, *out_hw, data_shape[3]), dtype, q)],
                        version=version, custom_options=tensor_options(version, *out_hw))


def matrix_model(options, landmarks_shape, version):
    return one_op_model(MATRIX, [Input(landmarks_shape)], [Output((1, 4, 4))], version=version,
                        custom_options=flex_options(**options))


def landmarks_model(shape, version, options=None):
    return one_op_model(LANDMARKS, [Input(shape), Input((1, 4, 4))], [Output(shape)],
                        version=version,
                        custom_options=None if options is None else flex_options(**options))


# -- strategies ------------------------------------------------------------------------------
@st.composite
def resampler_case(draw):
    n, h, w, c = (draw(st.integers(1, 2)), draw(st.integers(1, 6)), draw(st.integers(1, 6)),
                  draw(st.integers(1, 4)))
    points = tuple(draw(st.lists(st.integers(1, 5), min_size=0, max_size=2)))
    kind = draw(st.sampled_from(["uniform", "integers", "halves"]))
    return dict(data=(n, h, w, c), warp=(n, *points, 2), kind=kind)


def warp_values(rng, case):
    """Coordinates around the image: beyond it, on pixels, between them; -1 and W, H (which
    do not sample) among the integers."""
    _, h, w, _ = case["data"]
    shape = case["warp"]
    limit = np.array([w, h], np.float64)
    if case["kind"] == "integers":
        v = rng.integers(-2, np.maximum(limit, 1) + 2, shape)
    elif case["kind"] == "halves":
        v = rng.integers(-4, 2 * limit + 4, shape) / 2
    else:
        v = rng.uniform(-2, limit + 1, shape)
    return v.astype(np.float32)


@st.composite
def affine_matrix(draw, centre_from=(0.0, 0.0), centre_to=(0.0, 0.0), zoom=1.0):
    """A 4x4 matrix, rows 2-3 as converters write them: `centre_from` maps near `centre_to`,
    with a rotation, a scale about `zoom` and a shear; column 2, which the op multiplies by 0,
    holds arbitrary values."""
    angle = draw(st.floats(-math.pi, math.pi))
    sx, sy = (zoom * draw(st.floats(0.5, 1.5)) for _ in range(2))
    shear = draw(st.floats(-0.5, 0.5))
    c, s = math.cos(angle), math.sin(angle)
    linear = np.array([[c, -s], [s, c]]) @ np.array([[sx, shear], [0, sy]])
    jitter = zoom * np.array([draw(st.floats(-0.5, 0.5)), draw(st.floats(-0.5, 0.5))])
    m = np.eye(4)
    m[:2, :2] = linear
    m[:2, 3] = np.asarray(centre_to) + jitter - linear @ np.asarray(centre_from)
    m[:2, 2] = draw(st.floats(-2, 2)), draw(st.floats(-2, 2))
    return m.astype(np.float32)


@st.composite
def tensor_case(draw):
    """Data, output size and a matrix taking the output's centre near the data's, at a zoom
    that makes the output cover about the data: most samples inside, some beyond the edges."""
    h, w, c = draw(st.integers(2, 7)), draw(st.integers(2, 7)), draw(st.integers(1, 4))
    out_h, out_w = draw(st.integers(1, 6)), draw(st.integers(1, 6))
    matrix = draw(affine_matrix(((out_w - 1) / 2, (out_h - 1) / 2), ((w - 1) / 2, (h - 1) / 2),
                                zoom=max(h, w) / max(out_h, out_w)))
    return dict(data=(1, h, w, c), out=(out_h, out_w), version=draw(st.sampled_from([1, 2])),
                matrix=matrix)


# A sample this close to the edge of [0, W - 1] x [0, H - 1], where the value jumps to 0, is
# decided by float32 rounding of its coordinates: the op's C++ adds the corner alignment in
# double, MediaPipe's GPU shader and our kernels in float32, and LLVM's fast math may reorder
# those float32 sums (on the x64 backend an exact tie rounded the other way and put a sample
# one ulp past H - 1, zeroing it). Either answer is the op's; the tests take samples exactly
# on an edge from exact arithmetic only (identity, integer flips: test_taichi_transforms).
EDGE_AMBIGUITY = 1e-4


def translation(dx, dy):
    m = np.eye(4)
    m[0, 3], m[1, 3] = dx, dy
    return m


def sample_points(matrix, out_hw, align_corners):
    """(tx, ty) of every output pixel, in float64: M (X, Y, 0, 1), v2's alignment as the
    matrix product S M A it stands for."""
    m = np.asarray(matrix, np.float64).reshape(4, 4)
    if align_corners:
        m = translation(-0.5, -0.5) @ m @ translation(0.5, 0.5)
    out_h, out_w = out_hw
    Y, X = np.mgrid[0:out_h, 0:out_w].astype(np.float64)
    return m[0, 0] * X + m[0, 1] * Y + m[0, 3], m[1, 0] * X + m[1, 1] * Y + m[1, 3]


def edge_samples(matrix, data_shape, out_hw, align_corners):
    """[out_h, out_w]: where a sample lies within EDGE_AMBIGUITY of the image's edge."""
    _, h, w, _ = data_shape
    tx, ty = sample_points(matrix, out_hw, align_corners)
    gap = np.minimum.reduce([abs(tx), abs(tx - (w - 1)), abs(ty), abs(ty - (h - 1))])
    return gap < EDGE_AMBIGUITY


def off_the_edges(case):
    """The case with its matrix moved by a few thousandths of a pixel, as often as needed,
    until no sample sits within rounding of an edge (the delegate's draws: a one-ulp
    difference there zeroes a whole sample)."""
    matrix = np.array(case["matrix"], np.float32)
    for _ in range(64):
        if not edge_samples(matrix, case["data"], case["out"], case["version"] == 2).any():
            return dict(case, matrix=matrix)
        matrix[0, 3] += np.float32(0.00237)
        matrix[1, 3] += np.float32(0.00311)
    raise AssertionError(f"no nudge takes the samples off the edges: {case}")


@st.composite
def landmark_set(draw, spread):
    """(landmarks [K, 3], left, right, subset): left and right apart in x (v1 divides by
    their x distance) and in y."""
    k = draw(st.integers(2, 8))
    seed = draw(S.seeds())
    points = np.random.default_rng(seed).uniform(0, spread, (k, 3)).astype(np.float32)
    left, right = draw(st.permutations(range(k)))[:2]
    if abs(points[right, 0] - points[left, 0]) < spread / 20:
        points[right, 0] = points[left, 0] + np.float32(spread / 10)
    subset = draw(st.lists(st.integers(0, k - 1), min_size=1, max_size=9))
    return points, int(left), int(right), subset


@st.composite
def v1_case(draw):
    rng_ = draw(st.integers(1, 300))
    points, left, right, subset = draw(landmark_set(rng_))
    o = dict(input_hw=[draw(st.integers(1, 300)), draw(st.integers(1, 300))],
             output_hw=[draw(st.integers(2, 64)), draw(st.integers(2, 64))],
             dimensions=3, landmarks_range=rng_,
             bbox_size_multiplier=float(np.float32(draw(st.floats(0.5, 2.5)))),
             left_rotation_idx=left, right_rotation_idx=right, subset=subset)
    return o, points.reshape(1, 1, 1, -1)


@st.composite
def v2_case(draw):
    points, left, right, subset = draw(landmark_set(200.0))
    o = dict(subset_idxs=subset, left_rotation_idx=left, right_rotation_idx=right,
             target_rotation_radians=float(np.float32(draw(st.floats(-math.pi, math.pi)))),
             output_height=draw(st.integers(1, 64)), output_width=draw(st.integers(1, 64)),
             scale_x=float(np.float32(draw(st.floats(0.5, 3)))),
             scale_y=float(np.float32(draw(st.floats(0.5, 3)))))
    return o, points.reshape(1, -1, 3)


def _data(rng, shape):
    return rng.standard_normal(shape).astype(np.float32)


SQUARE = np.array([[10, 10, 0], [30, 10, 0], [30, 30, 0], [10, 30, 0]], np.float32)[None]


def _v2(**changes):
    return dict(dict(subset_idxs=[0, 1, 2, 3], left_rotation_idx=0, right_rotation_idx=1,
                     target_rotation_radians=0.0, output_height=8, output_width=8,
                     scale_x=1.0, scale_y=1.0), **changes)


# -- TransformLandmarks ----------------------------------------------------------------------
@st.composite
def landmarks_case(draw):
    version = draw(st.sampled_from([1, 2]))
    if version == 1:        # options absent: the defaults, dimensions 3 and scale 1
        options = draw(st.none() | st.builds(
            lambda d, s: dict(dimensions=d, scale=float(np.float32(s))),
            st.sampled_from([2, 3]), st.floats(0.25, 4)))
        d = options["dimensions"] if options else 3
        shape = (1, draw(st.integers(1, 3)), draw(st.integers(1, 3)), d * draw(st.integers(1, 3)))
        return version, shape, options
    return version, (1, draw(st.integers(1, 8)), draw(st.sampled_from([2, 3]))), None


# -- a landmark pipeline ---------------------------------------------------------------------
def smooth_image(shape, rng):
    """Low-frequency data, so that float32 coordinate rounding moves samples by little."""
    _, h, w, c = shape
    yy, xx = np.mgrid[0:h, 0:w]
    phase = rng.uniform(0, 2 * np.pi, (c, 2))
    return np.stack([np.sin(xx / 5 + p[0]) * np.cos(yy / 7 + p[1]) for p in phase],
                    -1)[None].astype(np.float32)


PIPELINE = dict(image=(1, 24, 20, 3), crop=(8, 8), conv_out=4)


def pipeline_model(rng):
    """Landmarks2TransformMatrix v2 -> TransformTensorBilinear v2 -> CONV_2D (the crop a
    landmark network reads), and TransformLandmarks v2 of the landmarks by the same matrix."""
    image, (ch, cw), co = PIPELINE["image"], PIPELINE["crop"], PIPELINE["conv_out"]
    b = ModelBuilder()
    g = b.subgraph()
    lm = g.input("landmarks", (1, 5, 3))
    img = g.input("image", image)
    matrix, crop = g.tensor("matrix", (1, 4, 4)), g.tensor("crop", (1, ch, cw, image[3]))
    feat, moved = g.tensor("features", (1, ch, cw, co)), g.tensor("moved", (1, 5, 3))
    g.op(MATRIX, [lm], [matrix], version=2, custom_options=flex_options(**_pipeline_options()))
    g.op(TENSOR, [img, matrix], [crop], version=2, custom_options=tensor_options(2, ch, cw))
    weights = rng.uniform(-1, 1, (co, 3, 3, image[3])).astype(np.float32)
    bias = rng.uniform(-1, 1, co).astype(np.float32)
    g.op("CONV_2D", [crop, g.const("w", weights), g.const("b", bias)], [feat], padding="SAME",
         stride_h=1, stride_w=1)
    g.op(LANDMARKS, [lm, matrix], [moved], version=2)
    g.output(feat, moved)
    return b.finish(), weights, bias


def _pipeline_options():
    return _v2(subset_idxs=[0, 1, 2, 3, 4], target_rotation_radians=0.3, scale_x=1.2,
               scale_y=1.2)


def pipeline_inputs(rng):
    """Landmarks well inside the image, so the crop stays inside it."""
    landmarks = np.array([[[7, 9, 0], [13, 10, 0], [12, 15, 0], [8, 14, 0], [10, 12, 1]]],
                         np.float32) + rng.uniform(-1, 1, (1, 5, 3)).astype(np.float32)
    return [landmarks, smooth_image(PIPELINE["image"], rng)]


# -- the delegate's case table ----------------------------------------------------------------
# Each row's strategy draws check_op's (model, inputs[, options]): float32, or int8 data in the
# float view. Tolerances are check_delegate's: TAICHI_RTOL (1 unit for int8 outputs), with a
# `floor` where a result can cancel (bilinear mixes of signed data, matrices whose entries
# differ in size).
def _int8_data(rng, shape):
    return rng.integers(-128, 128, shape).astype(np.int8)


@st.composite
def resampler_cases(draw):
    case, int8 = draw(resampler_case()), draw(st.booleans())
    q, seed = draw(S.quant_params()), draw(S.seeds())
    rng = np.random.default_rng(seed)
    warp = warp_values(rng, case)
    if int8:
        model = resampler_model(case["data"], case["warp"], np.int8, q)
        return model, [_int8_data(rng, case["data"]), warp]
    data = _data(rng, case["data"])
    return (resampler_model(case["data"], case["warp"]), [data, warp],
            {"floor": float(np.abs(data).max())})


@st.composite
def transform_tensor_cases(draw):
    """The matrix at run time (in io) or constant (in the weights); no sample within rounding
    of an edge (off_the_edges)."""
    case, int8, constant = draw(tensor_case()), draw(st.booleans()), draw(st.booleans())
    case = off_the_edges(case)
    q, seed = draw(S.quant_params()), draw(S.seeds())
    rng = np.random.default_rng(seed)
    matrix = case["matrix"] if constant else None
    inputs = [] if constant else [case["matrix"][None]]
    if int8:
        model = tensor_model(case["data"], case["out"], case["version"], np.int8, q, matrix)
        return model, [_int8_data(rng, case["data"])] + inputs
    data = _data(rng, case["data"])
    model = tensor_model(case["data"], case["out"], case["version"], matrix=matrix)
    return model, [data] + inputs, {"floor": float(np.abs(data).max())}


@st.composite
def landmarks_matrix_delegate_matches_reference_cases(draw):
    v1 = draw(v1_case())
    v2 = draw(v2_case())
    version = draw(st.sampled_from([1, 2]))
    o, points = v1 if version == 1 else v2
    # the bound of ops/transforms/reference.py's error model (float32 trig and roundings propagated
    # through the matrix entries) as the floor: tolerance max(rtol max|expected|, bound)
    bound = landmarks_matrix_error(version, o, points)
    return (matrix_model(o, points.shape, version), [points],
            {"floor": bound / TAICHI_RTOL["fp32"]})


@st.composite
def transform_landmarks_delegate_matches_reference_cases(draw):
    case = draw(landmarks_case())
    matrix = draw(affine_matrix())
    seed = draw(S.seeds())
    version, shape, options = case
    points = np.random.default_rng(seed).uniform(-50, 250, shape).astype(np.float32)
    floor = float(np.abs(points).max() * np.abs(matrix).max())
    return landmarks_model(shape, version, options), [points, matrix[None]], {"floor": floor}


TRANSFORM_ROWS = [
    Row("Resampler", resampler_cases(), "float32 and int8"),
    Row("TransformTensorBilinear", transform_tensor_cases(),
        "the matrix at run time (in io) or constant (in the weights); float32 and int8"),
    Row("Landmarks2TransformMatrix", landmarks_matrix_delegate_matches_reference_cases(),
        "v1 and v2; one thread, float32 (v1's reference works in float64, as the C++ mixes it "
        "in): within landmarks_matrix_error's bound (a draw on vulkan was off by 1.08e-05, "
        "1.04 x the 1e-5 of the largest entry: the translation's terms cancel, the trig error "
        "does not)"),
    Row("TransformLandmarks", transform_landmarks_delegate_matches_reference_cases(),
        "v1 and v2"),
]
