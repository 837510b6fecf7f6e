"""Row-wise normalizations over the last axis: LOG_SOFTMAX, L2_NORMALIZATION,
LOCAL_RESPONSE_NORMALIZATION.

On the float view a quantized input arrives holding real values and the runtime snaps the
output to its grid, so each reference is the float formula of LiteRT's float kernel:
- LOG_SOFTMAX: x - max - log(sum(exp(x - max))). LiteRT's int8/uint8 kernels need the output
  quantized with scale 16/256 and zero point 127 (int8) / 255 (uint8) and compute in fixed
  point (tests/test_ops_normalization.py states the measured distance).
- L2_NORMALIZATION: x / max(sqrt(sum(x^2)), 1e-6); input rank <= 4, no fused activation;
  int8/uint8 outputs quantized with scale 1/128 and zero point 0 (int8) / 128 (uint8), as
  LiteRT's Prepare enforces. Its int8 kernel uses a fixed-point inverse square root.
- LOCAL_RESPONSE_NORMALIZATION: x * (bias + alpha * sum of x^2 over the channels c - radius ..
  c + radius)^-beta, 4-D float32 only (LiteRT has no quantized kernel). The window is
  symmetric as in TensorFlow and LiteRT's optimized and XNNPACK kernels; LiteRT 2.3's reference
  kernel (BUILTIN_REF) stops one channel short (c - radius .. c + radius - 1), so the tests hold
  it to the optimized kernel.

Taichi (delegate): one `RowNormStep` for the first two: one thread per row computes the row's
statistic (max and log-sum-exp, or the clamped norm) into scratch, then one thread per element
writes its output. LRN is a `LocalResponseNormStep`: one thread per element sums its window of
squares. No `from __future__ import annotations` here: Taichi reads the ti.func annotations.
"""
from dataclasses import dataclass

import numpy as np

from .base import OpDef, register_op
from .common import ACTIVATION_NAMES, ACT_NONE, check_activation
from .kit import ti

# Output quantization LiteRT's quantized kernels require (their Prepare checks these exactly).
LOG_SOFTMAX_SCALE = 16.0 / 256
LOG_SOFTMAX_ZERO_POINTS = {np.dtype(np.int8): 127, np.dtype(np.uint8): 255}
L2_NORM_SCALE = 1.0 / 128
L2_NORM_ZERO_POINTS = {np.dtype(np.int8): 0, np.dtype(np.uint8): 128}
L2_NORM_EPSILON = np.float32(1e-6)       # LiteRT's hard-coded epsilon (l2norm.cc)

_FLOAT_AND_8BIT = (np.dtype(np.float32), np.dtype(np.int8), np.dtype(np.uint8))


def _check_dtypes(node, allowed):
    """Input and output share a dtype LiteRT has a kernel for."""
    x, out = node.inputs[0], node.outputs[0]
    names = ", ".join(np.dtype(d).name for d in allowed)
    for spec, what in ((x, "input"), (out, "output")):
        if spec.dtype is not None and np.dtype(spec.dtype) not in allowed:
            raise node.fail(f"{what} '{spec.name}' has dtype {np.dtype(spec.dtype).name}; "
                            f"expected {names}")
    if x.dtype is not None and out.dtype is not None and np.dtype(x.dtype) != np.dtype(out.dtype):
        raise node.fail(f"input dtype {np.dtype(x.dtype).name} and output dtype "
                        f"{np.dtype(out.dtype).name} differ")


def _check_fixed_output_quantization(node, scale, zero_points):
    """An 8-bit output must carry the fixed quantization LiteRT's kernel is written for."""
    out = node.outputs[0]
    if out.dtype is None or np.dtype(out.dtype) not in zero_points:
        return
    zp = zero_points[np.dtype(out.dtype)]
    q = out.quantization
    if q is None or q.per_channel or float(q.scale[0]) != scale or int(q.zero_point[0]) != zp:
        have = ("none" if q is None else
                f"scale {[float(s) for s in q.scale]}, zero point {[int(z) for z in q.zero_point]}")
        raise node.fail(f"a {np.dtype(out.dtype).name} output must be quantized with scale "
                        f"{scale:g} and zero point {zp} (LiteRT's kernel requires it); has {have}")


def _require_rank(node, lo, hi):
    rank = node.inputs[0].rank
    if not lo <= rank <= hi:
        want = f"{lo}" if lo == hi else f"{lo} to {hi}"
        raise node.fail(f"input must have rank {want}, has shape {list(node.inputs[0].shape)}")


# -- Taichi ----------------------------------------------------------------------------------
_LOG_SOFTMAX, _L2 = 0, 1


@ti.data_oriented
class RowNormStep:
    """Rows of the last axis. Task 1, one thread per row: LOG_SOFTMAX's max and log(sum(exp(x -
    max))), or L2's max(sqrt(sum(x^2)), eps), into scratch. Task 2, one thread per element:
    (x - max) - log_sum, or x / norm, rounded as the reference rounds."""

    def __init__(self, code, x, out, scratch):
        self.code, self.x, self.out, self.stats = code, x, out, scratch
        self.n = out.shape[-1]
        self.rows = out.size // self.n
        self.size = out.size
        self.eps = float(L2_NORM_EPSILON)

    @ti.func
    def run(self, arena: ti.template(), weights: ti.template(), io: ti.template()):
        for r in range(self.rows):
            base = r * self.n
            if ti.static(self.code == _LOG_SOFTMAX):
                m = self.x.load(arena, weights, io, base)
                for k in range(1, self.n):
                    m = ti.max(m, self.x.load(arena, weights, io, base + k))
                s = 0.0
                for k in range(self.n):
                    s += ti.exp(self.x.load(arena, weights, io, base + k) - m)
                self.stats.store(arena, io, 2 * r, m)
                self.stats.store(arena, io, 2 * r + 1, ti.log(s))
            else:
                s = 0.0
                for k in range(self.n):
                    v = self.x.load(arena, weights, io, base + k)
                    s += v * v
                self.stats.store(arena, io, 2 * r, ti.max(ti.sqrt(s), self.eps))
        for i in range(self.size):
            r = i // self.n
            v = self.x.load(arena, weights, io, i)
            if ti.static(self.code == _LOG_SOFTMAX):
                m = self.stats.load(arena, weights, io, 2 * r)
                v = (v - m) - self.stats.load(arena, weights, io, 2 * r + 1)
            else:
                v = v / self.stats.load(arena, weights, io, 2 * r)
            self.out.store(arena, io, i, v)


def _row_scratch(node) -> int:
    """Two float32 statistics per row."""
    shape = node.outputs[0].shape
    return 2 * (int(np.prod(shape, dtype=np.int64)) // max(shape[-1], 1) if shape else 1)


def _row_taichi(code):
    def build(node, io):
        return RowNormStep(code, io.inputs[0], io.outputs[0], io.scratch)
    return build


# -- LOG_SOFTMAX -----------------------------------------------------------------------------
def _infer_log_softmax(node):
    _check_dtypes(node, _FLOAT_AND_8BIT)
    _require_rank(node, 1, 1 << 30)
    _check_fixed_output_quantization(node, LOG_SOFTMAX_SCALE, LOG_SOFTMAX_ZERO_POINTS)
    return [tuple(node.inputs[0].shape)]


def _reference_log_softmax(node, inputs):
    x = np.asarray(inputs[0], np.float32)
    if x.shape[-1] == 0:
        return [x.copy()]
    with np.errstate(over="ignore", under="ignore", invalid="ignore", divide="ignore"):
        z = x - np.max(x, axis=-1, keepdims=True)
        return [(z - np.log(np.sum(np.exp(z), axis=-1, keepdims=True))).astype(np.float32)]


LOG_SOFTMAX = register_op(OpDef(
    name="LOG_SOFTMAX", infer=_infer_log_softmax, reference=_reference_log_softmax,
    options_class="LogSoftmaxOptions", taichi=_row_taichi(_LOG_SOFTMAX), scratch=_row_scratch,
    min_inputs=1, max_inputs=1))


# -- L2_NORMALIZATION ------------------------------------------------------------------------
@dataclass(frozen=True)
class L2NormOptions:
    fused_activation_function: int = ACT_NONE


def _parse_l2(opts) -> L2NormOptions:
    return L2NormOptions(int(opts.FusedActivationFunction()))


def _infer_l2(node):
    act = check_activation(node, node.options.fused_activation_function)
    if act != ACT_NONE:
        raise node.fail(f"fused activation {ACTIVATION_NAMES[act]} is not supported "
                        "(LiteRT's kernels take NONE only)")
    _check_dtypes(node, _FLOAT_AND_8BIT)
    _require_rank(node, 1, 4)
    _check_fixed_output_quantization(node, L2_NORM_SCALE, L2_NORM_ZERO_POINTS)
    return [tuple(node.inputs[0].shape)]


def _reference_l2(node, inputs):
    x = np.asarray(inputs[0], np.float32)
    if x.shape[-1] == 0:
        return [x.copy()]
    with np.errstate(over="ignore", invalid="ignore"):
        norm = np.sqrt(np.sum(np.square(x, dtype=np.float64), axis=-1, keepdims=True))
        norm = np.maximum(norm.astype(np.float32), L2_NORM_EPSILON)
        return [(x / norm).astype(np.float32)]


L2_NORMALIZATION = register_op(OpDef(
    name="L2_NORMALIZATION", infer=_infer_l2, reference=_reference_l2, parse=_parse_l2,
    options_class="L2NormOptions", taichi=_row_taichi(_L2), scratch=_row_scratch,
    min_inputs=1, max_inputs=1))


# -- LOCAL_RESPONSE_NORMALIZATION ------------------------------------------------------------
@dataclass(frozen=True)
class LocalResponseNormalizationOptions:
    radius: int = 0
    bias: float = 0.0
    alpha: float = 0.0
    beta: float = 0.0


def _parse_lrn(opts) -> LocalResponseNormalizationOptions:
    return LocalResponseNormalizationOptions(int(opts.Radius()), float(opts.Bias()),
                                             float(opts.Alpha()), float(opts.Beta()))


def _infer_lrn(node):
    o = node.options
    if o.radius < 0:
        raise node.fail(f"radius must be >= 0, got {o.radius}")
    for name in ("bias", "alpha", "beta"):
        if not np.isfinite(getattr(o, name)):
            raise node.fail(f"{name} must be finite, got {getattr(o, name)}")
    _check_dtypes(node, (np.dtype(np.float32),))
    _require_rank(node, 4, 4)
    return [tuple(node.inputs[0].shape)]


def _reference_lrn(node, inputs):
    o = node.options
    x = np.asarray(inputs[0], np.float32)
    depth = x.shape[-1]
    sq = np.square(x)
    # window sums of squares as differences of a running sum along the channels
    csum = np.concatenate([np.zeros(x.shape[:-1] + (1,), np.float64),
                           np.cumsum(sq, axis=-1, dtype=np.float64)], axis=-1)
    c = np.arange(depth)
    lo = np.maximum(c - o.radius, 0)
    hi = np.minimum(c + o.radius + 1, depth)
    accum = (csum[..., hi] - csum[..., lo]).astype(np.float32)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        base = np.float32(o.bias) + np.float32(o.alpha) * accum
        return [(x * np.power(base, np.float32(-o.beta))).astype(np.float32)]


@ti.data_oriented
class LocalResponseNormStep:
    """One thread per element: x * (bias + alpha * sum of squares in its channel window)^-beta."""

    def __init__(self, x, out, o):
        self.x, self.out = x, out
        self.depth = out.shape[-1]
        self.size = out.size
        self.radius = int(o.radius)
        self.bias, self.alpha = float(np.float32(o.bias)), float(np.float32(o.alpha))
        self.neg_beta = float(-np.float32(o.beta))

    @ti.func
    def run(self, arena: ti.template(), weights: ti.template(), io: ti.template()):
        for i in range(self.size):
            c = i % self.depth
            base = i - c
            acc = 0.0
            for k in range(ti.max(c - self.radius, 0), ti.min(c + self.radius + 1, self.depth)):
                v = self.x.load(arena, weights, io, base + k)
                acc += v * v
            v = self.x.load(arena, weights, io, i)
            self.out.store(arena, io, i, v * ti.pow(self.bias + self.alpha * acc, self.neg_beta))


def _lrn_taichi(node, io):
    return LocalResponseNormStep(io.inputs[0], io.outputs[0], node.options)


LOCAL_RESPONSE_NORMALIZATION = register_op(OpDef(
    name="LOCAL_RESPONSE_NORMALIZATION", infer=_infer_lrn, reference=_reference_lrn,
    parse=_parse_lrn, options_class="LocalResponseNormalizationOptions", taichi=_lrn_taichi,
    min_inputs=1, max_inputs=1))

__all__ = ["LOG_SOFTMAX", "L2_NORMALIZATION", "LOCAL_RESPONSE_NORMALIZATION"]
