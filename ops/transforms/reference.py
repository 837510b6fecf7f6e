"""The transform ops' numpy reference (the CPU fallback and the ground truth the Taichi steps are
held to), as MediaPipe's CPU kernels compute them (the package's __init__ states the semantics),
and `landmarks_matrix_error`, the bound the float32 Taichi matrix is held to against it.
"""
import numpy as np

from .options import LandmarksMatrixV1

# v1's box starts from these (MediaPipe's kernel)
V1_BOX_START = 100000.0


def _matrix_rows(value):
    """The first two rows of the 4x4 matrix, float32."""
    m = np.asarray(value, np.float32).reshape(-1)
    return m[0:4].copy(), m[4:8].copy()


def _gather_zero_outside(image, ix, iy, batch=0):
    """image[batch, iy, ix, :] (index arrays broadcast together), 0 where (ix, iy) is outside
    the image."""
    _, h, w, c = image.shape
    inside = (ix >= 0) & (ix < w) & (iy >= 0) & (iy < h)
    if h == 0 or w == 0:            # an empty image: nothing is inside
        return np.zeros((*np.broadcast(batch, ix, iy).shape, c), np.float32)
    values = image[batch, np.clip(iy, 0, h - 1), np.clip(ix, 0, w - 1)]
    return np.where(inside[..., None], values, np.float32(0))


def reference_resampler(node, inputs):
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


def _aligned_rows(node, matrix):
    """The matrix's first two rows, v2's corner alignment applied (the C++ adds in double)."""
    rows = _matrix_rows(matrix)
    if node.options.align_corners:
        for r in rows:
            r[3] = np.float32(np.float64(r[3]) + (np.float64(r[0]) * 0.5
                                                 + np.float64(r[1]) * 0.5 - 0.5))
    return rows


def reference_transform_tensor(node, inputs):
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


def reference_landmarks_matrix(node, inputs):
    landmarks = np.asarray(inputs[0], np.float32).reshape(-1, 3)
    with np.errstate(all="ignore"):
        if isinstance(node.options, LandmarksMatrixV1):
            m = _matrix_v1(node, landmarks)
        else:
            m = _matrix_v2(node, landmarks)
    return [m.astype(np.float32).reshape(1, 4, 4)]


# -- TransformLandmarks ----------------------------------------------------------------------
def landmark_dimensions(node) -> int:
    return node.options.dimensions if node.version == 1 else node.inputs[0].shape[-1]


def reference_transform_landmarks(node, inputs):
    d = landmark_dimensions(node)
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

