"""Warps of images and landmarks: CUSTOM:Resampler (the official GPU delegate's fourth custom op,
tensorflow addons' resampler) and MediaPipe's CUSTOM:Landmarks2TransformMatrix,
CUSTOM:TransformTensorBilinear and CUSTOM:TransformLandmarks, which MediaPipe's landmark
pipelines chain (landmarks -> a crop matrix -> the cropped image -> a network -> landmarks
mapped back). Aliases, as the GPU delegate's custom parsers accept them: CUSTOM:TransformTensor
(TransformTensorBilinear's v1 name) and CUSTOM:Landmarks2TransformMatrixV2.

LiteRT 2.3 runs none of them (no kernel in its builtin or reference resolvers, none in XNNPACK:
"Encountered unresolved custom op"), so the semantics here are those of MediaPipe's own CPU
kernels (mediapipe/util/tflite/operations/*.cc), with the official GPU delegate's options
parsers (tensorflow/lite/delegates/gpu/common/mediapipe/) and its kernels (tasks/) where those
decide; tests/test_ops_transforms.py holds the reference to independent numpy formulations and
hand-checked cases.

Options. Resampler and TransformLandmarks v2 have none (custom_options are ignored). The
others are a flexbuffer map; every key the kernels read unconditionally is required here (the
C++ reads a missing key as 0, which it then mostly refuses); integer vectors may be typed (what
converters write) or untyped:
- TransformTensorBilinear v1: output_size [h, w]; mode, when present, must be "bilinear".
  v2: output_height, output_width.
- Landmarks2TransformMatrix v1: input_hw [h, w], output_hw [h, w], dimensions (must be 3),
  landmarks_range (> 0), bbox_size_multiplier (!= 0), left_rotation_idx, right_rotation_idx,
  subset (landmark indices, read in pairs; an odd last one pairs with itself).
  v2: subset_idxs (the same), left_rotation_idx, right_rotation_idx, target_rotation_radians,
  output_height, output_width, scale_x, scale_y (> 0).
- TransformLandmarks v1: dimensions (2 or 3, default 3), scale (!= 0, default 1).

Semantics (float32, C's order of operations; M is a 4x4 matrix, row-major, whose first two rows
r0, r1 map (x, y, 0, 1) to (r0 . v, r1 . v)):
- Resampler: data [N, H, W, C], warp [N, d..., 2] of (x, y) pixel coordinates -> [N, d..., C]
  (MediaPipe's CPU kernel assumes warp's spatial shape is data's; addons and the GPU delegate
  take any). A point with -1 < x < W and -1 < y < H (NaN is not) mixes the four pixels
  around it, those outside the image counting as 0:
  dx = floor(x) + 1 - x, dy = floor(y) + 1 - y,
  out = dx dy I(fx, fy) + (1-dx)(1-dy) I(cx, cy) + dx (1-dy) I(fx, cy) + (1-dx) dy I(cx, fy);
  any other point gives 0.
- TransformTensorBilinear: data [1, H, W, C] (the kernels read only the first image, so a
  batch is refused), matrix [1, 4, 4] -> [1, out_h, out_w, C]: output pixel (X, Y) samples the
  data at (tx, ty) = (r0 . (X, Y, 0, 1), r1 . (X, Y, 0, 1)); v2 aligns corners first,
  r[3] += r[0] / 2 + r[1] / 2 - 1/2 (pixel centres), v1 does not. A sample with tx outside
  [0, W - 1] or ty outside [0, H - 1] is 0 (NaN too: the GPU kernel's in-bounds test; the
  CPU kernel's out-of-bounds test lets NaN through to an undefined cast); inside, the four
  pixels floor(t) and floor(t) + 1 (0 beyond the image, which only a zero weight meets) mix
  with weights t - floor(t). The CPU kernel does part of that mix in double precision; float32
  here, as the GPU kernel.
- Landmarks2TransformMatrix, landmarks as (x, y, z) triplets (z unused):
  v1, input [1, 1, 1, 3K]: alpha = -atan((ry - ly) / (rx - lx)) from the left and right
  rotation landmarks (atan of the ratio, not atan2); the subset's landmarks rotated by alpha,
  their box (max/min starting from -/+100000) scaled by bbox_size_multiplier; with range =
  landmarks_range, M3 = A R S T where T = [[2/(out_w-1), 0, -1], [0, 2/(out_h-1), -1]] (to
  [-1, 1]), S = diag(box_w / range, box_h / range), R the rotation by -alpha with translation
  (the box centre rotated back) / range * 2 - 1, A = [[(in_w-1)/2, 0, (in_w-1)/2], [0,
  (in_h-1)/2, (in_h-1)/2]] (back to pixels); the output is [[m00, m01, 0, m02], [m10, m11, 0,
  m12], [m20, m21, m22, 0], [0, 0, 0, 1]]. The C++ mixes in double precision: float64 here,
  rounded once. out_h or out_w of 1 divides by zero (inf/NaN entries, as the C++).
  v2, input [1, K, 3]: rotation = target_rotation_radians - atan2(ry - ly, rx - lx); the
  subset's landmarks rotated by it, their box (from the first landmark, strict comparisons),
  its centre rotated back; M = Shift(centre) R(-rotation) Scale(scale_x box_w / out_w,
  scale_y box_h / out_h) Shift(-out_w / 2, -out_h / 2), in float32.
- TransformLandmarks: landmarks of `dimensions` values (x, y[, z]); x and y become
  (r0 . (x, y, 0, s), r1 . (x, y, 0, s)), z is copied. v1: landmarks [1, H, W, C], C a multiple
  of dimensions, s = scale; v2: [1, K, D], D (2 or 3) the dimensions, s = 1. Only the first
  batch entry is transformed by the kernels, so a batch is refused.

Data (Resampler's and TransformTensorBilinear's image and output) may be quantized: the float
view, as the GPU delegate computes them; warps, matrices and landmarks are float32, as the
kernels take them. A landmark index outside the input is a ModelError (the C++ reads out of
bounds).

The family reads in four parts: here the OpDefs (shapes, types, what the delegate takes);
options.py the custom options (flexbuffer maps); reference.py the numpy reference (MediaPipe's
semantics above, and the error bound of the Taichi matrix against it); kernels.py the Taichi
steps. Names other modules import from `ops.transforms` are re-exported here.
"""
import numpy as np

from tflite_taichi.quant import is_float_view

from ..base import Fusion, OpDef, register_op
from .kernels import (LandmarksMatrixStep, ResamplerStep, TransformLandmarksStep,  # noqa: F401
                      TransformTensorStep)
from .options import (LandmarksMatrixV1, LandmarksMatrixV2, TransformLandmarksOptions,  # noqa: F401
                      TransformTensorOptions, flex_options, parse_landmarks_matrix,
                      parse_transform_landmarks, parse_transform_tensor)
from .reference import (TRIG_ULPS, V1_BOX_START, landmark_dimensions,  # noqa: F401
                        landmarks_matrix_error, reference_landmarks_matrix,
                        reference_resampler, reference_transform_landmarks,
                        reference_transform_tensor)

# Landmarks2TransformMatrix's Taichi part unrolls its subset: beyond this many landmark reads
# the kernel would be very long to compile, and the op stays on the CPU.
MAX_UNROLLED_LANDMARKS = 512


# -- shape and type checks -------------------------------------------------------------------
def _dtype_name(spec) -> str:
    return np.dtype(spec.dtype).name if spec.dtype is not None else "untyped"


def _require_float32(node, spec, what):
    if spec.dtype is None or np.dtype(spec.dtype) != np.float32 or spec.quantization is not None:
        raise node.fail(f"{what} ('{spec.name}') is {_dtype_name(spec)}; the op takes float32")


def _require_float_view(node, spec, what):
    """float32, or quantized 8/16-bit (the float view)."""
    if spec.dtype is not None and (np.dtype(spec.dtype) == np.float32 and spec.quantization is None
                                   or is_float_view(spec.dtype, spec.quantization)):
        return
    raise node.fail(f"{what} ('{spec.name}') is {_dtype_name(spec)}; the op takes float32 or "
                    "quantized 8/16-bit data")


def _require_rank(node, spec, what, rank, layout):
    if spec.rank != rank:
        raise node.fail(f"{what} ('{spec.name}') must have rank {rank} ({layout}), has shape "
                        f"{list(spec.shape)}")


def _require_single_batch(node, spec, what):
    if spec.shape[0] != 1:
        raise node.fail(f"{what} ('{spec.name}') has batch {spec.shape[0]}; the op's kernels "
                        "read only the first batch entry, so it takes batch 1")


def _check_matrix(node, i):
    spec = node.inputs[i]
    _require_float32(node, spec, f"input {i} (matrix)")
    if int(np.prod(spec.shape)) != 16 or tuple(spec.shape[-2:]) != (4, 4):
        raise node.fail(f"input {i} (matrix, '{spec.name}') must be a 4x4 matrix ([1, 4, 4]), "
                        f"has shape {list(spec.shape)}")


# -- Resampler -------------------------------------------------------------------------------
def _infer_resampler(node):
    data, warp = node.inputs
    _require_rank(node, data, "input 0 (data)", 4, "NHWC")
    _require_float_view(node, data, "input 0 (data)")
    _require_float32(node, warp, "input 1 (warp)")
    _require_float_view(node, node.outputs[0], "the output")
    if warp.rank < 2 or warp.shape[-1] != 2:
        raise node.fail(f"input 1 (warp, '{warp.name}') must be [batch, ..., 2] (x, y "
                        f"coordinates), has shape {list(warp.shape)}")
    if warp.shape[0] != data.shape[0]:
        raise node.fail(f"input 1 (warp, '{warp.name}') has batch {warp.shape[0]}, the data "
                        f"{data.shape[0]}")
    return [(data.shape[0], *warp.shape[1:-1], data.shape[3])]


def _resampler_taichi(node, io):
    return ResamplerStep(io.inputs[0], io.inputs[1], io.outputs[0])


RESAMPLER = register_op(OpDef(
    name="CUSTOM:Resampler", infer=_infer_resampler, reference=reference_resampler,
    taichi=_resampler_taichi, versions=(1, 1), min_inputs=2, max_inputs=2, fusion=Fusion(stores_once=True)))


# -- TransformTensorBilinear -----------------------------------------------------------------
def _infer_transform_tensor(node):
    o = node.options
    if o.output_h < 1 or o.output_w < 1:
        raise node.fail(f"output size must be positive, custom_options give "
                        f"{o.output_h}x{o.output_w}")
    data = node.inputs[0]
    _require_rank(node, data, "input 0 (data)", 4, "NHWC")
    _require_single_batch(node, data, "input 0 (data)")
    _require_float_view(node, data, "input 0 (data)")
    _check_matrix(node, 1)
    _require_float_view(node, node.outputs[0], "the output")
    return [(1, o.output_h, o.output_w, data.shape[3])]


def _transform_tensor_taichi(node, io):
    return TransformTensorStep(io.inputs[0], io.inputs[1], io.outputs[0],
                               node.options.align_corners)


_TRANSFORM_TENSOR = dict(
    infer=_infer_transform_tensor, reference=reference_transform_tensor,
    parse=parse_transform_tensor, taichi=_transform_tensor_taichi, versions=(1, 2),
    min_inputs=2, max_inputs=2, fusion=Fusion(stores_once=True))
TRANSFORM_TENSOR_BILINEAR = register_op(OpDef(name="CUSTOM:TransformTensorBilinear",
                                              **_TRANSFORM_TENSOR))
TRANSFORM_TENSOR = register_op(OpDef(name="CUSTOM:TransformTensor", **_TRANSFORM_TENSOR))


# -- Landmarks2TransformMatrix ---------------------------------------------------------------
def _landmark_count(node) -> int:
    return int(np.prod(node.inputs[0].shape)) // 3


def _check_landmark_indices(node, count):
    o = node.options
    for what, idx in (("left_rotation_idx", o.left), ("right_rotation_idx", o.right)):
        if not 0 <= idx < count:
            raise node.fail(f"{what} {idx} is outside the input's {count} landmarks")
    if not o.subset:
        raise node.fail("the subset of landmarks in custom_options is empty")
    bad = [i for pair in o.subset for i in pair if not 0 <= i < count]
    if bad:
        raise node.fail(f"subset index {bad[0]} is outside the input's {count} landmarks")


def _check_v1_options(node):
    o = node.options
    if o.dimensions != 3:
        raise node.fail(f"dimensions is {o.dimensions}; the op takes 3")
    if o.landmarks_range <= 0:
        raise node.fail(f"landmarks_range must be positive, is {o.landmarks_range}")
    if o.bbox_size_multiplier == 0:
        raise node.fail("bbox_size_multiplier must not be 0")
    for what, hw in (("input_hw", o.input_hw), ("output_hw", o.output_hw)):
        if min(hw) <= 0:
            raise node.fail(f"{what} must be positive, is {list(hw)}")


def _check_v2_options(node):
    o = node.options
    if o.output_h <= 0 or o.output_w <= 0:
        raise node.fail(f"output_height and output_width must be positive, are "
                        f"{o.output_h}, {o.output_w}")
    if not (o.scale_x > 0 and o.scale_y > 0):
        raise node.fail(f"scale_x and scale_y must be positive, are {o.scale_x}, {o.scale_y}")


def _infer_landmarks_matrix(node):
    x = node.inputs[0]
    _require_float32(node, x, "input 0 (landmarks)")
    _require_float32(node, node.outputs[0], "the output")
    if isinstance(node.options, LandmarksMatrixV1):
        _check_v1_options(node)
        if x.rank != 4 or tuple(x.shape[:3]) != (1, 1, 1) or x.shape[3] % 3:
            raise node.fail(f"input 0 (landmarks, '{x.name}') must be [1, 1, 1, 3 x landmarks] "
                            f"(v1), has shape {list(x.shape)}")
    else:
        _check_v2_options(node)
        if x.rank != 3 or x.shape[2] != 3:
            raise node.fail(f"input 0 (landmarks, '{x.name}') must be [1, landmarks, 3] (v2), "
                            f"has shape {list(x.shape)}")
    _check_landmark_indices(node, _landmark_count(node))
    return [(1, 4, 4)]


def _landmarks_matrix_taichi(node, io):
    return LandmarksMatrixStep(node, io.inputs[0], io.outputs[0])


def _landmarks_matrix_supports(node):
    o = node.options
    reads = 2 * len(o.subset)
    if reads > MAX_UNROLLED_LANDMARKS:
        return (f"a subset of {reads} landmarks: the delegate unrolls at most "
                f"{MAX_UNROLLED_LANDMARKS}")
    if isinstance(o, LandmarksMatrixV1) and min(o.output_hw) == 1:
        return (f"output_hw {list(o.output_hw)}: a side of 1 divides by zero (the matrix is "
                "inf/NaN), computed on the CPU")
    return None


_LANDMARKS_MATRIX = dict(
    infer=_infer_landmarks_matrix, reference=reference_landmarks_matrix,
    parse=parse_landmarks_matrix, taichi=_landmarks_matrix_taichi,
    supports=_landmarks_matrix_supports, versions=(1, 2), min_inputs=1, max_inputs=1,
    fusion=Fusion(stores_once=True))
LANDMARKS_TO_TRANSFORM_MATRIX = register_op(OpDef(name="CUSTOM:Landmarks2TransformMatrix",
                                                  **_LANDMARKS_MATRIX))
LANDMARKS_TO_TRANSFORM_MATRIX_V2 = register_op(OpDef(name="CUSTOM:Landmarks2TransformMatrixV2",
                                                     **_LANDMARKS_MATRIX))


# -- TransformLandmarks ----------------------------------------------------------------------
def _infer_transform_landmarks(node):
    x = node.inputs[0]
    _require_float32(node, x, "input 0 (landmarks)")
    _check_matrix(node, 1)
    _require_float32(node, node.outputs[0], "the output")
    if node.version == 1:
        o = node.options
        if o.dimensions not in (2, 3):
            raise node.fail(f"dimensions is {o.dimensions}; landmarks have 2 or 3")
        if o.scale == 0:
            raise node.fail("scale must not be 0")
        _require_rank(node, x, "input 0 (landmarks)", 4, "[1, H, W, C] (v1)")
        if x.shape[3] % o.dimensions:
            raise node.fail(f"input 0 (landmarks, '{x.name}') has {x.shape[3]} channels, not a "
                            f"multiple of dimensions {o.dimensions}")
    else:
        _require_rank(node, x, "input 0 (landmarks)", 3, "[1, landmarks, 2 or 3] (v2)")
        if x.shape[2] not in (2, 3):
            raise node.fail(f"input 0 (landmarks, '{x.name}') has {x.shape[2]} values per "
                            "landmark; v2 takes 2 or 3")
    _require_single_batch(node, x, "input 0 (landmarks)")
    return [tuple(x.shape)]


def _transform_landmarks_taichi(node, io):
    return TransformLandmarksStep(io.inputs[0], io.inputs[1], io.outputs[0],
                                  landmark_dimensions(node), node.options.scale)


TRANSFORM_LANDMARKS = register_op(OpDef(
    name="CUSTOM:TransformLandmarks", infer=_infer_transform_landmarks,
    reference=reference_transform_landmarks, parse=parse_transform_landmarks,
    taichi=_transform_landmarks_taichi, versions=(1, 2), min_inputs=2, max_inputs=2,
    fusion=Fusion(stores_once=True)))

__all__ = ["RESAMPLER", "TRANSFORM_TENSOR_BILINEAR", "TRANSFORM_TENSOR",
           "LANDMARKS_TO_TRANSFORM_MATRIX", "LANDMARKS_TO_TRANSFORM_MATRIX_V2",
           "TRANSFORM_LANDMARKS", "flex_options", "MAX_UNROLLED_LANDMARKS"]

