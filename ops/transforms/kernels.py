"""The transform ops' Taichi steps (the delegate's part). Resampler, TransformTensorBilinear and
TransformLandmarks are one thread per output element (the matrix is read by every thread: eight
loads); Landmarks2TransformMatrix is one thread computing the 16 entries, the subset unrolled (at
most MAX_UNROLLED_LANDMARKS), v1 in float32. NaN landmarks or NaN/inf in a matrix are defined on the reference only (Taichi's
min/max and comparisons differ from C's with NaN on some backends). No `from __future__ import
annotations` here: Taichi reads the annotations of the ti.func methods below.
"""
from ..kit import ti
from .options import LandmarksMatrixV1
from .reference import V1_BOX_START


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

