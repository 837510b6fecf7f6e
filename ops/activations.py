"""Activation ops: SOFTMAX, LOGISTIC, TANH, EXP, RELU, RELU6, RELU_N1_TO_1, RELU_0_TO_1, PRELU,
LEAKY_RELU, HARD_SWISH.

All are element-wise except SOFTMAX (over the last axis) and PRELU (alpha broadcast against the
input). On the float view a quantized input arrives holding real values and the runtime
fake-quantizes the output, so each reference is the plain float formula; LiteRT's int8 lookup
tables and fixed-point kernels approximate exactly these formulas.

RELU_0_TO_1 (litert-torch writes it for hardsigmoid-like clamps) is min(max(x, 0), 1), NaN
kept; LiteRT has it for float32, int8 and uint8 (kernels/activations.cc: its int8 kernel
requantizes into the output's scale and clamps to the quantized 0 and 1).

Taichi: the element-wise ops are one `UnaryStep` (one thread per element, the formula chosen at
compile time), PRELU a `PreluStep` (alpha broadcast like the reference), SOFTMAX a
`SoftmaxStep` (one thread per row of the last axis: max, then the sum of exponentials, then
the writes). Each mirrors its reference's float32 formula, cut-offs included; the store snaps a
quantized output to its grid.
"""
from dataclasses import dataclass

import numpy as np

from .base import ELEMENTWISE_UNARY, NO_FUSION, OpDef, register_op
from .common import TANH_SATURATION, broadcast_shapes
from .kit import BroadcastBinaryStep, ElementwiseStep, keep_nan, ti

_ACTIVATION_DTYPES = {np.dtype(np.float32), np.dtype(np.int8), np.dtype(np.uint8),
                      np.dtype(np.int16)}


def _check_same_dtype(node):
    """Input and output dtypes must agree (LiteRT's GenericPrepare) and be ones it computes in."""
    x, out = node.inputs[0], node.outputs[0]
    if x.dtype is not None and np.dtype(x.dtype) not in _ACTIVATION_DTYPES:
        raise node.fail(f"input '{x.name}' has dtype {np.dtype(x.dtype).name}; "
                        "expected float32, int8, uint8 or int16")
    if x.dtype is not None and out.dtype is not None and np.dtype(x.dtype) != np.dtype(out.dtype):
        raise node.fail(f"input dtype {np.dtype(x.dtype).name} and output dtype "
                        f"{np.dtype(out.dtype).name} differ")


def _infer_same_shape(node):
    _check_same_dtype(node)
    return [tuple(node.inputs[0].shape)]


def _unary(name, fn, parse=None, options_class=None, infer=_infer_same_shape, taichi=None,
           scratch=None):
    def reference(node, inputs):
        x = np.asarray(inputs[0], np.float32)
        with np.errstate(over="ignore", under="ignore", invalid="ignore"):
            return [fn(node, x).astype(np.float32, copy=False)]

    elementwise = taichi is None        # a UnaryStep: one store per element, fusable
    return register_op(OpDef(name=name, infer=infer, reference=reference,
                             parse=parse if parse is not None else (lambda _o: None),
                             options_class=options_class, min_inputs=1, max_inputs=1,
                             taichi=taichi if taichi is not None else _unary_taichi,
                             scratch=scratch,
                             fusion=ELEMENTWISE_UNARY if elementwise else NO_FUSION))


# -- Taichi ------------------------------------------------------------------------------------
_UNARY_CODES = {"RELU": 0, "RELU6": 1, "RELU_N1_TO_1": 2, "LOGISTIC": 3, "TANH": 4, "EXP": 5,
                "HARD_SWISH": 6, "LEAKY_RELU": 7, "RELU_0_TO_1": 8}
# The reference's LOGISTIC cut-offs (defined with it below), as Python floats for the kernel.
_LOGISTIC_UPPER, _LOGISTIC_LOWER = 16.619047164916992188, -9.0


@ti.func
def _unary_formula(x, code: ti.template(), alpha: ti.template()):
    r = x
    if ti.static(code == 0):
        r = keep_nan(x, ti.max(x, 0.0))
    elif ti.static(code == 1):
        r = keep_nan(x, ti.min(ti.max(x, 0.0), 6.0))
    elif ti.static(code == 2):
        r = keep_nan(x, ti.min(ti.max(x, -1.0), 1.0))
    elif ti.static(code == 3):
        # the reference's LiteRT-compatible piecewise logistic
        if x > _LOGISTIC_UPPER:
            r = 1.0
        elif x < _LOGISTIC_LOWER:
            r = ti.exp(x)
        else:
            r = 1.0 / (1.0 + ti.exp(-x))
    elif ti.static(code == 4):
        if x > TANH_SATURATION:
            r = 1.0
        elif x < -TANH_SATURATION:
            r = -1.0
        else:
            r = ti.tanh(x)
    elif ti.static(code == 5):
        r = ti.exp(x)
    elif ti.static(code == 6):
        r = x * ti.min(ti.max(x + 3.0, 0.0), 6.0) / 6.0
    elif ti.static(code == 7):
        r = ti.select(x > 0.0, x, x * alpha)
    elif ti.static(code == 8):
        r = keep_nan(x, ti.min(ti.max(x, 0.0), 1.0))
    if ti.static(code == 3 or code == 4):
        r = keep_nan(x, r)      # the cut-offs compare x: with NaN, true on OpenGL (llvmpipe)
    return r


@ti.data_oriented
class UnaryStep(ElementwiseStep):
    """An activation, element by element (the kit's template)."""

    def __init__(self, code, x, out, alpha=0.0):
        super().__init__(x, out)
        self.code = code
        self.alpha = float(np.float32(alpha))

    @ti.func
    def formula(self, v):
        return _unary_formula(v, self.code, self.alpha)


def _unary_taichi(node, io):
    alpha = node.options.alpha if node.op == "LEAKY_RELU" else 0.0
    return UnaryStep(_UNARY_CODES[node.op], io.inputs[0], io.outputs[0], alpha)


# A softmax row walked by one thread (a classifier's 1000 logits: three serial passes) is the
# slowest step of a small model on a GPU. With few rows, each row is cut into chunks: one task
# computes every chunk's max and sum of exp (scratch), a second combines a row's chunks into its
# max and sum (the online-softmax rescaling), a third writes every element in parallel.
SOFTMAX_SPLIT_ROWS, SOFTMAX_CHUNK = 4096, 32


def _softmax_chunks(node) -> int:
    n = node.outputs[0].shape[-1] if node.outputs[0].shape else 1
    rows = int(np.prod(node.outputs[0].shape)) // max(n, 1)
    return -(-n // SOFTMAX_CHUNK) if rows < SOFTMAX_SPLIT_ROWS and n >= 2 * SOFTMAX_CHUNK else 1


def _softmax_scratch(node) -> int:
    chunks = _softmax_chunks(node)
    rows = int(np.prod(node.outputs[0].shape)) // max(node.outputs[0].shape[-1], 1)
    return 2 * rows * (chunks + 1) if chunks > 1 else 0


@ti.data_oriented
class SoftmaxStep:
    """max of x * beta, sum of exp(x * beta - max), then each exp(x * beta - max) / sum: one
    thread per row, or (few long rows) chunked as described above."""

    def __init__(self, x, out, beta, chunks=1, scratch=None):
        self.x, self.out = x, out
        self.beta = float(np.float32(beta))
        self.n = out.shape[-1]
        self.rows = out.size // self.n
        usable = scratch is not None and chunks > 1
        self.chunks = chunks if usable else 1
        self.scratch = scratch if usable else out
        self.stats = 2 * self.rows * self.chunks       # scratch: chunk (max, sum) pairs, then rows'

    @ti.func
    def run(self, arena: ti.template(), weights: ti.template(), io: ti.template()):
        if ti.static(self.chunks == 1):
            for r in range(self.rows):
                base = r * self.n
                m = self.x.load(arena, weights, io, base) * self.beta
                for k in range(1, self.n):
                    m = ti.max(m, self.x.load(arena, weights, io, base + k) * self.beta)
                s = 0.0
                for k in range(self.n):
                    s += ti.exp(self.x.load(arena, weights, io, base + k) * self.beta - m)
                for k in range(self.n):
                    e = ti.exp(self.x.load(arena, weights, io, base + k) * self.beta - m)
                    self.out.store(arena, io, base + k, e / s)
        else:
            for r, c in ti.ndrange(self.rows, self.chunks):
                base = r * self.n
                lo = c * SOFTMAX_CHUNK
                hi = ti.min(lo + SOFTMAX_CHUNK, self.n)
                m = self.x.load(arena, weights, io, base + lo) * self.beta
                for k in range(lo + 1, hi):
                    m = ti.max(m, self.x.load(arena, weights, io, base + k) * self.beta)
                s = 0.0
                for k in range(lo, hi):
                    s += ti.exp(self.x.load(arena, weights, io, base + k) * self.beta - m)
                slot = 2 * (r * self.chunks + c)
                self.scratch.store(arena, io, slot, m)
                self.scratch.store(arena, io, slot + 1, s)
            for r in range(self.rows):
                m = self.scratch.load(arena, weights, io, 2 * r * self.chunks)
                for c in range(1, self.chunks):
                    m = ti.max(m, self.scratch.load(arena, weights, io, 2 * (r * self.chunks + c)))
                s = 0.0
                for c in range(self.chunks):
                    slot = 2 * (r * self.chunks + c)
                    s += (self.scratch.load(arena, weights, io, slot + 1)
                          * ti.exp(self.scratch.load(arena, weights, io, slot) - m))
                self.scratch.store(arena, io, self.stats + 2 * r, m)
                self.scratch.store(arena, io, self.stats + 2 * r + 1, s)
            for r, k in ti.ndrange(self.rows, self.n):
                m = self.scratch.load(arena, weights, io, self.stats + 2 * r)
                s = self.scratch.load(arena, weights, io, self.stats + 2 * r + 1)
                e = ti.exp(self.x.load(arena, weights, io, r * self.n + k) * self.beta - m)
                self.out.store(arena, io, r * self.n + k, e / s)


def _softmax_taichi(node, io):
    return SoftmaxStep(io.inputs[0], io.outputs[0], node.options.beta, _softmax_chunks(node),
                       io.scratch)


@ti.data_oriented
class PreluStep(BroadcastBinaryStep):
    """x >= 0 ? x : x * alpha, alpha broadcast against x (the kit's binary template; x has the
    output's shape, so its producer may hand it over: epilogue input 0)."""

    @ti.func
    def formula(self, v, a):
        return ti.select(v >= 0.0, v, v * a)


def _prelu_taichi(node, io):
    return PreluStep(io.inputs[0], io.inputs[1], io.outputs[0])


# -- element-wise ------------------------------------------------------------------------------
# TFLite's float LOGISTIC (reference_ops::Logistic, and Eigen's scalar_logistic_op) is
# piecewise: 1 above this cutoff, exp(x) below -9 (where 1/(1+exp(-x)) differs from exp(x) by a
# relative exp(x) < 1.3e-4), else 1/(1+exp(-x)). Mirrored so tiny outputs agree to 1e-5 too.
_LOGISTIC_CUTOFF_UPPER = np.float32(_LOGISTIC_UPPER)
_LOGISTIC_CUTOFF_LOWER = np.float32(_LOGISTIC_LOWER)


def _logistic(_node, x):
    mid = np.clip(x, _LOGISTIC_CUTOFF_LOWER, _LOGISTIC_CUTOFF_UPPER)   # exp never overflows
    out = np.float32(1.0) / (np.float32(1.0) + np.exp(-mid))
    out = np.where(x < _LOGISTIC_CUTOFF_LOWER, np.exp(np.minimum(x, 0)), out)
    return np.where(x > _LOGISTIC_CUTOFF_UPPER, np.float32(1.0), out)


def _hard_swish(_node, x):
    return x * np.clip(x + 3.0, 0.0, 6.0) / 6.0


RELU = _unary("RELU", lambda _n, x: np.maximum(x, 0.0))
RELU6 = _unary("RELU6", lambda _n, x: np.clip(x, 0.0, 6.0))
RELU_N1_TO_1 = _unary("RELU_N1_TO_1", lambda _n, x: np.clip(x, -1.0, 1.0))
RELU_0_TO_1 = _unary("RELU_0_TO_1", lambda _n, x: np.clip(x, 0.0, 1.0))
LOGISTIC = _unary("LOGISTIC", _logistic)
TANH = _unary("TANH", lambda _n, x: np.tanh(x))
EXP = _unary("EXP", lambda _n, x: np.exp(x))
HARD_SWISH = _unary("HARD_SWISH", _hard_swish)


# -- LEAKY_RELU --------------------------------------------------------------------------------
@dataclass(frozen=True)
class LeakyReluOptions:
    alpha: float = 0.0


def _parse_leaky(opts) -> LeakyReluOptions:
    return LeakyReluOptions(float(opts.Alpha()))


def _infer_leaky(node):
    if not np.isfinite(node.options.alpha):
        raise node.fail(f"alpha must be finite, got {node.options.alpha}")
    return _infer_same_shape(node)


LEAKY_RELU = _unary("LEAKY_RELU",
                    lambda n, x: np.where(x > 0, x, x * np.float32(n.options.alpha)),
                    parse=_parse_leaky, options_class="LeakyReluOptions", infer=_infer_leaky)


# -- SOFTMAX -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class SoftmaxOptions:
    beta: float = 0.0


def _parse_softmax(opts) -> SoftmaxOptions:
    return SoftmaxOptions(float(opts.Beta()))


def _infer_softmax(node):
    if node.inputs[0].rank < 1:
        raise node.fail("input must have at least one dimension (softmax runs over the last)")
    if not np.isfinite(node.options.beta):
        raise node.fail(f"beta must be finite, got {node.options.beta}")
    return _infer_same_shape(node)


def _softmax(node, x):
    z = x.astype(np.float32) * np.float32(node.options.beta)
    if z.shape[-1] == 0:
        return z
    z = z - np.max(z, axis=-1, keepdims=True)        # numerically stable: exp(<= 0)
    e = np.exp(z)
    return e / np.sum(e, axis=-1, keepdims=True)


SOFTMAX = _unary("SOFTMAX", _softmax, parse=_parse_softmax, options_class="SoftmaxOptions",
                 infer=_infer_softmax, taichi=_softmax_taichi, scratch=_softmax_scratch)


# -- PRELU -------------------------------------------------------------------------------------
def _infer_prelu(node):
    _check_same_dtype(node)
    x, alpha = node.inputs[0], node.inputs[1]
    if x.dtype is not None and alpha.dtype is not None and np.dtype(x.dtype) != np.dtype(alpha.dtype):
        raise node.fail(f"alpha dtype {np.dtype(alpha.dtype).name} differs from the input's "
                        f"{np.dtype(x.dtype).name}")
    shape = broadcast_shapes(node, x.shape, alpha.shape)
    if shape != tuple(x.shape):
        raise node.fail(f"alpha shape {list(alpha.shape)} broadcasts the input "
                        f"{list(x.shape)} to {list(shape)}; it must keep the input's shape")
    return [shape]


def _prelu_reference(node, inputs):
    x = np.asarray(inputs[0], np.float32)
    alpha = np.asarray(inputs[1], np.float32)
    return [np.where(x >= 0, x, x * alpha).astype(np.float32, copy=False)]


PRELU = register_op(OpDef(name="PRELU", infer=_infer_prelu, reference=_prelu_reference,
                          taichi=_prelu_taichi, min_inputs=2, max_inputs=2,
                          fusion=ELEMENTWISE_UNARY))
