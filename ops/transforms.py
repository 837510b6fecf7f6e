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

The Taichi parts: Resampler, TransformTensorBilinear and TransformLandmarks are one thread per
output element (the matrix is read by every thread: eight loads); Landmarks2TransformMatrix is
one thread computing the 16 entries, the subset unrolled (at most MAX_UNROLLED_LANDMARKS), v1 in
float32. NaN landmarks or NaN/inf in a matrix are defined on the reference only (Taichi's
min/max and comparisons differ from C's with NaN on some backends). No `from __future__ import
annotations` here: Taichi reads the annotations of the ti.func methods below.
"""
from dataclasses import dataclass

import numpy as np

from tflite_taichi.errors import ModelError
from tflite_taichi.quant import is_float_view

from .base import Fusion, OpDef, register_op
from .common import flexbuffer_map
from .kit import ti

# Landmarks2TransformMatrix's Taichi part unrolls its subset: beyond this many landmark reads
# the kernel would be very long to compile, and the op stays on the CPU.
MAX_UNROLLED_LANDMARKS = 512
# v1's box starts from these (MediaPipe's kernel)
V1_BOX_START = 100000.0


# -- options ---------------------------------------------------------------------------------
def _op_fail(op, message) -> ModelError:
    return ModelError(f"op #{op.index} ({op.name}): {message}")


def _int(op, options: dict, key: str, default=None) -> int:
    value = options.get(key, default)
    if value is None:
        raise _op_fail(op, f"custom_options lack '{key}'")
    if isinstance(value, bool) or not isinstance(value, int):
        raise _op_fail(op, f"custom_options '{key}' must be an integer, is {value!r}")
    if not -2 ** 31 <= value < 2 ** 31:
        raise _op_fail(op, f"custom_options '{key}' = {value} does not fit an int32")
    return value


def _float(op, options: dict, key: str, default=None) -> float:
    value = options.get(key, default)
    if value is None:
        raise _op_fail(op, f"custom_options lack '{key}'")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _op_fail(op, f"custom_options '{key}' must be a number, is {value!r}")
    return float(np.float32(value))


def _ints(op, options: dict, key: str, length=None) -> tuple:
    value = options.get(key)
    if value is None:
        raise _op_fail(op, f"custom_options lack '{key}'")
    if not isinstance(value, list) or any(isinstance(v, bool) or not isinstance(v, int)
                                          for v in value):
        raise _op_fail(op, f"custom_options '{key}' must be a vector of integers, is {value!r}")
    if length is not None and len(value) != length:
        raise _op_fail(op, f"custom_options '{key}' must have {length} entries, has {value}")
    return tuple(int(v) for v in value)


def _pairs(indices: tuple) -> tuple:
    """The subset as the kernels read it: pairs, an odd last index paired with itself."""
    pairs = [(indices[i], indices[i + 1]) for i in range(0, len(indices) - 1, 2)]
    if len(indices) % 2:
        pairs.append((indices[-1], indices[-1]))
    return tuple(pairs)


def flex_options(**fields) -> bytes:
    """A flexbuffer map as converters write these ops' custom_options: ints, floats, strings,
    and typed vectors of ints."""
    from flatbuffers import flexbuffers
    b = flexbuffers.Builder()
    with b.Map():
        for key in sorted(fields):
            value = fields[key]
            if isinstance(value, (list, tuple)):
                b.Key(key)
                b.TypedVectorFromElements([int(v) for v in value])
            elif isinstance(value, str):
                b.String(key, value)
            elif isinstance(value, float):
                b.Float(key, value)
            else:
                b.Int(key, int(value))
    return bytes(b.Finish())


@dataclass(frozen=True)
class TransformTensorOptions:
    output_h: int
    output_w: int
    align_corners: bool        # v2


def _parse_transform_tensor(op) -> TransformTensorOptions:
    if op.version == 1:
        o = flexbuffer_map(op, "v1: output_size [h, w], mode 'bilinear'")
        mode = o.get("mode", "bilinear")
        if mode != "bilinear":
            raise _op_fail(op, f"custom_options mode is {mode!r}; only 'bilinear' exists")
        h, w = _ints(op, o, "output_size", 2)
        return TransformTensorOptions(h, w, False)
    o = flexbuffer_map(op, "v2: output_height, output_width")
    return TransformTensorOptions(_int(op, o, "output_height"), _int(op, o, "output_width"), True)


@dataclass(frozen=True)
class LandmarksMatrixV1:
    input_hw: tuple
    output_hw: tuple
    dimensions: int
    landmarks_range: int
    bbox_size_multiplier: float
    left: int
    right: int
    subset: tuple              # pairs of landmark indices


@dataclass(frozen=True)
class LandmarksMatrixV2:
    subset: tuple              # pairs of landmark indices
    left: int
    right: int
    target_rotation: float
    output_h: int
    output_w: int
    scale_x: float
    scale_y: float


def _parse_landmarks_matrix(op):
    if op.version == 1:
        o = flexbuffer_map(op, "v1: input_hw, output_hw, dimensions, landmarks_range, "
                      "bbox_size_multiplier, left_rotation_idx, right_rotation_idx, subset")
        return LandmarksMatrixV1(
            input_hw=_ints(op, o, "input_hw", 2), output_hw=_ints(op, o, "output_hw", 2),
            dimensions=_int(op, o, "dimensions"), landmarks_range=_int(op, o, "landmarks_range"),
            bbox_size_multiplier=_float(op, o, "bbox_size_multiplier"),
            left=_int(op, o, "left_rotation_idx"), right=_int(op, o, "right_rotation_idx"),
            subset=_pairs(_ints(op, o, "subset")))
    o = flexbuffer_map(op, "v2: subset_idxs, left_rotation_idx, right_rotation_idx, "
                  "target_rotation_radians, output_height, output_width, scale_x, scale_y")
    return LandmarksMatrixV2(
        subset=_pairs(_ints(op, o, "subset_idxs")), left=_int(op, o, "left_rotation_idx"),
        right=_int(op, o, "right_rotation_idx"),
        target_rotation=_float(op, o, "target_rotation_radians"),
        output_h=_int(op, o, "output_height"), output_w=_int(op, o, "output_width"),
        scale_x=_float(op, o, "scale_x"), scale_y=_float(op, o, "scale_y"))


@dataclass(frozen=True)
class TransformLandmarksOptions:
    dimensions: int            # v1 (v2: the landmarks' last dimension)
    scale: float


def _parse_transform_landmarks(op) -> TransformLandmarksOptions:
    if op.version != 1:                # v2 reads no options
        return TransformLandmarksOptions(dimensions=0, scale=1.0)
    o = flexbuffer_map(op, "v1: dimensions, scale") if op.custom_options else {}
    return TransformLandmarksOptions(dimensions=_int(op, o, "dimensions", 3),
                                     scale=_float(op, o, "scale", 1.0))


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


def _matrix_rows(value):
    """The first two rows of the 4x4 matrix, float32."""
    m = np.asarray(value, np.float32).reshape(-1)
    return m[0:4].copy(), m[4:8].copy()


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


def _gather_zero_outside(image, ix, iy, batch=0):
    """image[batch, iy, ix, :] (index arrays broadcast together), 0 where (ix, iy) is outside
    the image."""
    _, h, w, c = image.shape
    inside = (ix >= 0) & (ix < w) & (iy >= 0) & (iy < h)
    if h == 0 or w == 0:            # an empty image: nothing is inside
        return np.zeros((*np.broadcast(batch, ix, iy).shape, c), np.float32)
    values = image[batch, np.clip(iy, 0, h - 1), np.clip(ix, 0, w - 1)]
    return np.where(inside[..., None], values, np.float32(0))


def _reference_resampler(node, inputs):
    data = np.asarray(inputs[0], np.float32)
    n, h, w, c = data.shape
    count = int(np.prod(node.inputs[1].shape[1:-1]))       # points per batch entry
    points = np.asarray(inputs[1], np.float32).reshape(n, count, 2)
    x, y = points[..., 0], points[..., 1]
    with np.errstate(invalid="ignore"):
        sampled = (x > -1) & (y > -1) & (x < w) & (y < h)       # NaN: not sampled
    x, y = np.where(sampled, x, 0), np.where(sampled, y, 0)
    fx, fy = np.floor(x), np.floor(y)
    one = np.float32(1)
    dx, dy = (fx + one - x)[..., None], (fy + one - y)[..., None]
    fx, fy = fx.astype(np.int64), fy.astype(np.int64)
    cx, cy = fx + 1, fy + 1
    batch = np.arange(n).reshape(-1, 1)

    def pixel(ix, iy):
        return _gather_zero_outside(data, ix, iy, batch)
    with np.errstate(invalid="ignore"):     # inf data times a zero weight is NaN, as in C
        out = (dx * dy * pixel(fx, fy) + (one - dx) * (one - dy) * pixel(cx, cy)
               + dx * (one - dy) * pixel(fx, cy) + (one - dx) * dy * pixel(cx, fy))
    out = np.where(sampled[..., None], out, np.float32(0))
    return [out.reshape(node.outputs[0].shape)]


@ti.func
def _sampled(x, y, w: ti.template(), h: ti.template()):
    """-1 < x < w and -1 < y < h (w, h: floats), NaN excluded (its comparisons are unreliable
    on OpenGL)."""
    return (not ti.math.isnan(x)) and (not ti.math.isnan(y)) and x > -1.0 and y > -1.0 \
        and x < w and y < h


@ti.data_oriented
class ResamplerStep:
    """One thread per output element (n, point, c)."""

    def __init__(self, data, warp, out):
        self.data, self.warp, self.out = data, warp, out
        self.n, self.h, self.w, self.c = data.shape
        self.points = warp.size // (2 * self.n)
        self.w_f, self.h_f = float(self.w), float(self.h)

    @ti.func
    def _pixel(self, arena: ti.template(), weights: ti.template(), io: ti.template(), n, x, y, c):
        v = 0.0
        if x >= 0 and x < self.w and y >= 0 and y < self.h:
            v = self.data.load(arena, weights, io, ((n * self.h + y) * self.w + x) * self.c + c)
        return v

    @ti.func
    def run(self, arena: ti.template(), weights: ti.template(), io: ti.template()):
        for n, p, c in ti.ndrange(self.n, self.points, self.c):
            at = (n * self.points + p) * 2
            x = self.warp.load(arena, weights, io, at)
            y = self.warp.load(arena, weights, io, at + 1)
            r = 0.0
            if _sampled(x, y, self.w_f, self.h_f):
                fx = ti.floor(x)
                fy = ti.floor(y)
                dx = fx + 1.0 - x
                dy = fy + 1.0 - y
                ix = ti.cast(fx, ti.i32)
                iy = ti.cast(fy, ti.i32)
                # the addons kernel's sum, term by term in its order
                ex, ey = 1.0 - dx, 1.0 - dy
                r = (dx * dy * self._pixel(arena, weights, io, n, ix, iy, c)
                     + ex * ey * self._pixel(arena, weights, io, n, ix + 1, iy + 1, c)
                     + dx * ey * self._pixel(arena, weights, io, n, ix, iy + 1, c)
                     + ex * dy * self._pixel(arena, weights, io, n, ix + 1, iy, c))
            self.out.store(arena, io, (n * self.points + p) * self.c + c, r)


def _resampler_taichi(node, io):
    return ResamplerStep(io.inputs[0], io.inputs[1], io.outputs[0])


RESAMPLER = register_op(OpDef(
    name="CUSTOM:Resampler", infer=_infer_resampler, reference=_reference_resampler,
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


def _aligned_rows(node, matrix):
    """The matrix's first two rows, v2's corner alignment applied (the C++ adds in double)."""
    rows = _matrix_rows(matrix)
    if node.options.align_corners:
        for r in rows:
            r[3] = np.float32(np.float64(r[3]) + (np.float64(r[0]) * 0.5
                                                 + np.float64(r[1]) * 0.5 - 0.5))
    return rows


def _reference_transform_tensor(node, inputs):
    data = np.asarray(inputs[0], np.float32)
    _, h, w, _ = data.shape
    x_row, y_row = _aligned_rows(node, inputs[1])
    _, out_h, out_w, _ = node.outputs[0].shape
    X = np.arange(out_w, dtype=np.float32).reshape(1, -1)
    Y = np.arange(out_h, dtype=np.float32).reshape(-1, 1)
    zero = np.float32(0)
    with np.errstate(invalid="ignore", over="ignore"):
        # the kernel's dot product of (X, Y, 0, 1), left to right
        tx = x_row[0] * X + x_row[1] * Y + x_row[2] * zero + x_row[3]
        ty = y_row[0] * X + y_row[1] * Y + y_row[2] * zero + y_row[3]
        sampled = (tx >= 0) & (tx <= w - 1) & (ty >= 0) & (ty <= h - 1)   # NaN: not sampled
    tx, ty = np.where(sampled, tx, zero), np.where(sampled, ty, zero)
    fx, fy = np.floor(tx), np.floor(ty)
    right, lower = (tx - fx)[..., None], (ty - fy)[..., None]
    fx, fy = fx.astype(np.int64), fy.astype(np.int64)
    q = {(dx, dy): _gather_zero_outside(data, fx + dx, fy + dy) for dx in (0, 1) for dy in (0, 1)}
    one = np.float32(1)
    with np.errstate(invalid="ignore"):
        upper = (one - right) * q[0, 0] + right * q[1, 0]
        below = (one - right) * q[0, 1] + right * q[1, 1]
        out = lower * below + (one - lower) * upper
    return [np.where(sampled[..., None], out, zero)[None]]


@ti.data_oriented
class TransformTensorStep:
    """One thread per output element (y, x, c); each reads the matrix's first two rows."""

    def __init__(self, data, matrix, out, align_corners):
        self.data, self.matrix, self.out = data, matrix, out
        _, self.h, self.w, self.c = data.shape
        _, self.out_h, self.out_w, _ = out.shape
        self.align = bool(align_corners)
        self.last_x, self.last_y = float(self.w - 1), float(self.h - 1)

    @ti.func
    def _row(self, arena: ti.template(), weights: ti.template(), io: ti.template(),
             r: ti.template()):
        m = ti.Vector([self.matrix.load(arena, weights, io, 4 * r + k)
                       for k in ti.static(range(4))])
        if ti.static(self.align):
            m[3] += m[0] * 0.5 + m[1] * 0.5 - 0.5
        return m

    @ti.func
    def _pixel(self, arena: ti.template(), weights: ti.template(), io: ti.template(), x, y, c):
        v = 0.0
        if x >= 0 and x < self.w and y >= 0 and y < self.h:
            v = self.data.load(arena, weights, io, (y * self.w + x) * self.c + c)
        return v

    @ti.func
    def run(self, arena: ti.template(), weights: ti.template(), io: ti.template()):
        for Y, X, c in ti.ndrange(self.out_h, self.out_w, self.c):
            xr = self._row(arena, weights, io, 0)
            yr = self._row(arena, weights, io, 1)
            fX, fY = ti.cast(X, ti.f32), ti.cast(Y, ti.f32)
            tx = xr[0] * fX + xr[1] * fY + xr[2] * 0.0 + xr[3]
            ty = yr[0] * fX + yr[1] * fY + yr[2] * 0.0 + yr[3]
            r = 0.0
            if ((not ti.math.isnan(tx)) and (not ti.math.isnan(ty)) and tx >= 0.0 and ty >= 0.0
                    and tx <= self.last_x and ty <= self.last_y):
                fx = ti.floor(tx)
                fy = ti.floor(ty)
                right = tx - fx
                lower = ty - fy
                ix = ti.cast(fx, ti.i32)
                iy = ti.cast(fy, ti.i32)
                upper = ((1.0 - right) * self._pixel(arena, weights, io, ix, iy, c)
                         + right * self._pixel(arena, weights, io, ix + 1, iy, c))
                below = ((1.0 - right) * self._pixel(arena, weights, io, ix, iy + 1, c)
                         + right * self._pixel(arena, weights, io, ix + 1, iy + 1, c))
                r = lower * below + (1.0 - lower) * upper
            self.out.store(arena, io, (Y * self.out_w + X) * self.c + c, r)


def _transform_tensor_taichi(node, io):
    return TransformTensorStep(io.inputs[0], io.inputs[1], io.outputs[0],
                               node.options.align_corners)


_TRANSFORM_TENSOR = dict(
    infer=_infer_transform_tensor, reference=_reference_transform_tensor,
    parse=_parse_transform_tensor, taichi=_transform_tensor_taichi, versions=(1, 2),
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


def _rotation(angle, dtype):
    c, s = dtype(np.cos(dtype(angle))), dtype(np.sin(dtype(angle)))
    return c, s


def _subset_points(node, landmarks):
    idx = np.array([i for pair in node.options.subset for i in pair])
    return landmarks[idx, 0], landmarks[idx, 1]


def _matrix_v1(node, landmarks):
    o = node.options
    f = np.float64
    lx, ly = landmarks[o.left, :2].astype(f)
    rx, ry = landmarks[o.right, :2].astype(f)
    alpha = -np.arctan((ry - ly) / (rx - lx))
    c, s = np.cos(alpha), np.sin(alpha)
    x, y = (v.astype(f) for v in _subset_points(node, landmarks))
    px, py = x * c - y * s, x * s + y * c
    max_x, min_x = _scan_box(px, -V1_BOX_START, V1_BOX_START)
    max_y, min_y = _scan_box(py, -V1_BOX_START, V1_BOX_START)
    rng = f(o.landmarks_range)
    box_w = (max_x - min_x) * f(o.bbox_size_multiplier)
    box_h = (max_y - min_y) * f(o.bbox_size_multiplier)
    mid_x, mid_y = (max_x + min_x) / 2, (max_y + min_y) / 2
    back_x, back_y = mid_x * c + mid_y * s, -mid_x * s + mid_y * c      # rotated by -alpha
    scale = np.diag([box_w / rng, box_h / rng, 1.0])
    rotation = np.array([[c, s, back_x / rng * 2 - 1], [-s, c, back_y / rng * 2 - 1], [0, 0, 1]])
    (in_h, in_w), (out_h, out_w) = o.input_hw, o.output_hw
    to_relative = np.array([[2 / f(out_w - 1), 0, -1], [0, 2 / f(out_h - 1), -1], [0, 0, 1]])
    to_absolute = np.array([[(in_w - 1) / 2, 0, (in_w - 1) / 2],
                            [0, (in_h - 1) / 2, (in_h - 1) / 2], [0, 0, 1]])
    m = to_absolute @ rotation @ scale @ to_relative
    return np.array([[m[0, 0], m[0, 1], 0, m[0, 2]], [m[1, 0], m[1, 1], 0, m[1, 2]],
                     [m[2, 0], m[2, 1], m[2, 2], 0], [0, 0, 0, 1]])


def _scan_box(values, hi, lo):
    """(max, min) of `values` scanned from (hi, lo) as C's std::max/std::min and the v2
    kernel's `if (max < v)` do: a NaN candidate never replaces the running value."""
    for v in values:
        if hi < v:
            hi = v
        if lo > v:
            lo = v
    return hi, lo


def _matrix_v2(node, landmarks):
    o = node.options
    f = np.float32
    lx, ly = landmarks[o.left, :2]
    rx, ry = landmarks[o.right, :2]
    rotation = f(o.target_rotation) - np.arctan2(ry - ly, rx - lx)
    c, s = _rotation(rotation, f)
    x, y = _subset_points(node, landmarks)
    px, py = c * x - s * y, s * x + c * y
    max_x, min_x = _scan_box(px, px[0], px[0])          # from the first landmark
    max_y, min_y = _scan_box(py, py[0], py[0])
    crop_w, crop_h = max_x - min_x, max_y - min_y
    mid_x, mid_y = (min_x + max_x) / f(2), (min_y + max_y) / f(2)
    ci, si = _rotation(-rotation, f)
    centre_x, centre_y = ci * mid_x - si * mid_y, si * mid_x + ci * mid_y
    shift = np.array([[1, 0, 0, centre_x], [0, 1, 0, centre_y], [0, 0, 1, 0], [0, 0, 0, 1]], f)
    turn = np.array([[ci, -si, 0, 0], [si, ci, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]], f)
    scale = np.diag([f(o.scale_x) * crop_w / f(o.output_w), f(o.scale_y) * crop_h / f(o.output_h),
                     f(1), f(1)]).astype(f)
    to_centre = np.array([[1, 0, 0, -(o.output_w / 2.0)], [0, 1, 0, -(o.output_h / 2.0)],
                          [0, 0, 1, 0], [0, 0, 0, 1]], f)
    return shift @ turn @ scale @ to_centre


# The float32 kernel against the reference: an error model, for the delegate tests' bound.
# TRIG_ULPS: the accuracy of a backend's float32 sin, cos and atan/atan2, in ulps of pi/2 (the
# error model below takes atan within 2 K u absolute, atan2 within 4 K u, sin and cos K u).
# Measured (bench/trig_accuracy.py, bench/results/trig_accuracy.md, 2^20 arguments): Taichi's cpu
# (LLVM's libm) 0.5 u on sin/cos and 4.1 u on atan2; Mesa's lavapipe and llvmpipe (Vulkan and
# OpenGL) 1.3 u on sin/cos but 56.6 u on atan2 and 55.6 u on atan, i.e. K = 28. K = 32 covers
# that with a margin for arguments not sampled. (Vulkan's spec allows atan 4096 ulps.)
TRIG_ULPS = 32


def landmarks_matrix_error(version: int, options: dict, landmarks) -> float:
    """An upper bound on |kernel - reference| over the 16 matrix entries of
    Landmarks2TransformMatrix (`options` as the model's flexbuffer fields, `landmarks` its
    float32 input). With u = 2^-24 (float32's unit roundoff), K = TRIG_ULPS and L the largest
    |x| + |y| of a landmark (bounding every rotated point, box side/2, centre):

    v1 (kernel float32, reference float64): alpha = -atan(dy / dx) with the ratio rounded 3
    times (alpha moves by |r| / (1 + r^2) 3u <= 1.5u) and atan within K ulps of |alpha| <=
    pi/2 (2Ku); cos and sin add Ku: d = (3K + 1.5)u on c and s, D = d + 5u with the roundings
    of the rotation, box, centre and scale. A rotated point is off by L(d + 2u), the box sides
    by twice that, so sx = box_w * mult / range by 2 L mult D / range (sy alike); the centre
    rotated back, bx, by 4 L D, tx = 2 bx / range - 1 by 8 L D / range + u(|tx| + 1). The
    entries: a = (in - 1) / 2 times [c sx rel, s sy rel, -c sx - s sy + tx + 1] (rel = 2 /
    (out - 1)), so with rel' = max(rel, 1) each entry is off by at most
        a rel' [(8 mult + 8) L D / range + 6u (2 L / range + 2)]
    (the last term: the float32 sums' roundings, relative to their terms, which can cancel).

    v2 (both float32, different trig): rotation = target - atan2 (atan2 within K ulps of a
    value up to pi, 4Ku; its arguments' rounding u; the difference's rounding, up to 2 pi,
    4u), c and s add Ku: d = (5K + 5)u per side, D = (5K + 10)u with the roundings. Entries
    c scale_x box_w / out_w and the translation -c sx w/2 + s sy h/2 + centre, whose terms
    reach scale_x L, scale_y L and L: per side (3 (scale_x + scale_y) + 4) L D +
    5u (scale_x + scale_y + 1) L, and the two sides' errors add."""
    u = 2.0 ** -24
    k = TRIG_ULPS
    xy = np.abs(np.asarray(landmarks, np.float64).reshape(-1, 3)[:, :2])
    big = float(xy.sum(axis=1).max())
    if version == 1:
        (in_h, in_w), (out_h, out_w) = options["input_hw"], options["output_hw"]
        d = (3 * k + 1.5) * u
        D = d + 5 * u
        a = max((in_w - 1) / 2, (in_h - 1) / 2, 1.0)
        rel = max(2 / (out_w - 1), 2 / (out_h - 1), 1.0)
        lr = big / options["landmarks_range"]
        return a * rel * ((8 * options["bbox_size_multiplier"] + 8) * lr * D
                          + 6 * u * (2 * lr + 2))
    D = (5 * k + 10) * u
    sxy = options["scale_x"] + options["scale_y"]
    return 2 * big * ((3 * sxy + 4) * D + 5 * u * (sxy + 1))


def _reference_landmarks_matrix(node, inputs):
    landmarks = np.asarray(inputs[0], np.float32).reshape(-1, 3)
    with np.errstate(all="ignore"):
        if isinstance(node.options, LandmarksMatrixV1):
            m = _matrix_v1(node, landmarks)
        else:
            m = _matrix_v2(node, landmarks)
    return [m.astype(np.float32).reshape(1, 4, 4)]


@ti.func
def _rotate(x, y, c, s):
    return x * c - y * s, x * s + y * c


@ti.func
def _mat3(a, b, c, d, e, f):
    """[[a, b, c], [d, e, f], [0, 0, 1]]"""
    return ti.Matrix([[a, b, c], [d, e, f], [0.0, 0.0, 1.0]])


@ti.func
def _mat4(a, b, c, d, e, f):
    """[[a, b, 0, c], [d, e, 0, f], [0, 0, 1, 0], [0, 0, 0, 1]]"""
    return ti.Matrix([[a, b, 0.0, c], [d, e, 0.0, f], [0.0, 0.0, 1.0, 0.0], [0.0, 0.0, 0.0, 1.0]])


@ti.data_oriented
class LandmarksMatrixStep:
    """One thread: the rotation, the subset's box (unrolled), the matrix product."""

    def __init__(self, node, landmarks, out):
        self.x, self.out = landmarks, out
        o = node.options
        self.v1 = isinstance(o, LandmarksMatrixV1)
        self.left, self.right = o.left, o.right
        self.subset = tuple(i for pair in o.subset for i in pair)
        if self.v1:
            (in_h, in_w), (out_h, out_w) = o.input_hw, o.output_hw
            self.rng = float(o.landmarks_range)
            self.mult = float(o.bbox_size_multiplier)
            self.rel = (2.0 / (out_w - 1), 2.0 / (out_h - 1))        # supports: out > 1
            self.absolute = ((in_w - 1) / 2.0, (in_h - 1) / 2.0)
        else:
            self.target = float(o.target_rotation)
            self.scale = (float(o.scale_x) / o.output_w, float(o.scale_y) / o.output_h)
            self.half = (o.output_w / 2.0, o.output_h / 2.0)

    @ti.func
    def _xy(self, arena: ti.template(), weights: ti.template(), io: ti.template(),
            i: ti.template()):
        return (self.x.load(arena, weights, io, 3 * i), self.x.load(arena, weights, io, 3 * i + 1))

    @ti.func
    def _v1(self, arena: ti.template(), weights: ti.template(), io: ti.template()):
        lx, ly = self._xy(arena, weights, io, self.left)
        rx, ry = self._xy(arena, weights, io, self.right)
        alpha = -ti.atan2((ry - ly) / (rx - lx), 1.0)       # atan of the ratio, as v1
        c, s = ti.cos(alpha), ti.sin(alpha)
        max_x, max_y = -V1_BOX_START, -V1_BOX_START
        min_x, min_y = V1_BOX_START, V1_BOX_START
        for k in ti.static(self.subset):
            x, y = self._xy(arena, weights, io, k)
            px, py = _rotate(x, y, c, s)
            max_x, max_y = ti.max(max_x, px), ti.max(max_y, py)
            min_x, min_y = ti.min(min_x, px), ti.min(min_y, py)
        sx = (max_x - min_x) * self.mult / self.rng
        sy = (max_y - min_y) * self.mult / self.rng
        bx, by = _rotate((max_x + min_x) / 2.0, (max_y + min_y) / 2.0, c, -s)
        rotation = _mat3(c, s, bx / self.rng * 2.0 - 1.0, -s, c, by / self.rng * 2.0 - 1.0)
        scale = _mat3(sx, 0.0, 0.0, 0.0, sy, 0.0)
        to_relative = _mat3(self.rel[0], 0.0, -1.0, 0.0, self.rel[1], -1.0)
        a = ti.static(self.absolute)
        to_absolute = _mat3(a[0], 0.0, a[0], 0.0, a[1], a[1])
        m = to_absolute @ rotation @ scale @ to_relative
        return ti.Matrix([[m[0, 0], m[0, 1], 0.0, m[0, 2]], [m[1, 0], m[1, 1], 0.0, m[1, 2]],
                          [m[2, 0], m[2, 1], m[2, 2], 0.0], [0.0, 0.0, 0.0, 1.0]])

    @ti.func
    def _v2(self, arena: ti.template(), weights: ti.template(), io: ti.template()):
        lx, ly = self._xy(arena, weights, io, self.left)
        rx, ry = self._xy(arena, weights, io, self.right)
        rotation = self.target - ti.atan2(ry - ly, rx - lx)
        c, s = ti.cos(rotation), ti.sin(rotation)
        x0, y0 = self._xy(arena, weights, io, self.subset[0])
        max_x, max_y = _rotate(x0, y0, c, s)
        min_x, min_y = max_x, max_y
        for k in ti.static(self.subset[1:]):
            x, y = self._xy(arena, weights, io, k)
            px, py = _rotate(x, y, c, s)
            max_x, max_y = ti.max(max_x, px), ti.max(max_y, py)
            min_x, min_y = ti.min(min_x, px), ti.min(min_y, py)
        ci, si = ti.cos(-rotation), ti.sin(-rotation)
        cx, cy = _rotate((min_x + max_x) / 2.0, (min_y + max_y) / 2.0, ci, si)
        shift = _mat4(1.0, 0.0, cx, 0.0, 1.0, cy)
        turn = _mat4(ci, -si, 0.0, si, ci, 0.0)
        scale = _mat4(self.scale[0] * (max_x - min_x), 0.0, 0.0,
                      0.0, self.scale[1] * (max_y - min_y), 0.0)
        to_centre = _mat4(1.0, 0.0, -self.half[0], 0.0, 1.0, -self.half[1])
        return shift @ turn @ scale @ to_centre

    @ti.func
    def run(self, arena: ti.template(), weights: ti.template(), io: ti.template()):
        for _ in range(1):
            m = ti.Matrix.zero(ti.f32, 4, 4)
            if ti.static(self.v1):
                m = self._v1(arena, weights, io)
            else:
                m = self._v2(arena, weights, io)
            for r in ti.static(range(4)):
                for k in ti.static(range(4)):
                    self.out.store(arena, io, 4 * r + k, m[r, k])


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
    infer=_infer_landmarks_matrix, reference=_reference_landmarks_matrix,
    parse=_parse_landmarks_matrix, taichi=_landmarks_matrix_taichi,
    supports=_landmarks_matrix_supports, versions=(1, 2), min_inputs=1, max_inputs=1,
    fusion=Fusion(stores_once=True))
LANDMARKS_TO_TRANSFORM_MATRIX = register_op(OpDef(name="CUSTOM:Landmarks2TransformMatrix",
                                                  **_LANDMARKS_MATRIX))
LANDMARKS_TO_TRANSFORM_MATRIX_V2 = register_op(OpDef(name="CUSTOM:Landmarks2TransformMatrixV2",
                                                     **_LANDMARKS_MATRIX))


# -- TransformLandmarks ----------------------------------------------------------------------
def _landmark_dimensions(node) -> int:
    return node.options.dimensions if node.version == 1 else node.inputs[0].shape[-1]


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


def _reference_transform_landmarks(node, inputs):
    d = _landmark_dimensions(node)
    points = np.asarray(inputs[0], np.float32).reshape(-1, d)
    x_row, y_row = _matrix_rows(inputs[1])
    s = np.float32(node.options.scale)
    x, y = points[:, 0], points[:, 1]
    out = points.copy()
    zero = np.float32(0)
    with np.errstate(invalid="ignore", over="ignore"):
        # the kernel's dot product with (x, y, 0, 1) and the translation times scale
        out[:, 0] = x_row[0] * x + x_row[1] * y + x_row[2] * zero + x_row[3] * s
        out[:, 1] = y_row[0] * x + y_row[1] * y + y_row[2] * zero + y_row[3] * s
    return [out.reshape(node.inputs[0].shape)]


@ti.data_oriented
class TransformLandmarksStep:
    """One thread per output value: x and y transformed, z copied."""

    def __init__(self, landmarks, matrix, out, dimensions, scale):
        self.x, self.matrix, self.out = landmarks, matrix, out
        self.d, self.scale = int(dimensions), float(scale)

    @ti.func
    def run(self, arena: ti.template(), weights: ti.template(), io: ti.template()):
        for i in range(self.out.size):
            j = i % self.d
            r = self.x.load(arena, weights, io, i)
            if j < 2:
                base = i - j
                x = self.x.load(arena, weights, io, base)
                y = self.x.load(arena, weights, io, base + 1)
                m = 4 * j
                r = (self.matrix.load(arena, weights, io, m) * x
                     + self.matrix.load(arena, weights, io, m + 1) * y
                     + self.matrix.load(arena, weights, io, m + 2) * 0.0
                     + self.matrix.load(arena, weights, io, m + 3) * self.scale)
            self.out.store(arena, io, i, r)


def _transform_landmarks_taichi(node, io):
    return TransformLandmarksStep(io.inputs[0], io.inputs[1], io.outputs[0],
                                  _landmark_dimensions(node), node.options.scale)


TRANSFORM_LANDMARKS = register_op(OpDef(
    name="CUSTOM:TransformLandmarks", infer=_infer_transform_landmarks,
    reference=_reference_transform_landmarks, parse=_parse_transform_landmarks,
    taichi=_transform_landmarks_taichi, versions=(1, 2), min_inputs=2, max_inputs=2,
    fusion=Fusion(stores_once=True)))

__all__ = ["RESAMPLER", "TRANSFORM_TENSOR_BILINEAR", "TRANSFORM_TENSOR",
           "LANDMARKS_TO_TRANSFORM_MATRIX", "LANDMARKS_TO_TRANSFORM_MATRIX_V2",
           "TRANSFORM_LANDMARKS", "flex_options", "MAX_UNROLLED_LANDMARKS"]
