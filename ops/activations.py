"""Activation ops: SOFTMAX, LOGISTIC, TANH, EXP, RELU, RELU6, RELU_N1_TO_1, PRELU, LEAKY_RELU,
HARD_SWISH.

All are element-wise except SOFTMAX (over the last axis) and PRELU (alpha broadcast against the
input). On the float view a quantized input arrives holding real values and the runtime
fake-quantizes the output, so each reference is the plain float formula; LiteRT's int8 lookup
tables and fixed-point kernels approximate exactly these formulas.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .base import OpDef, register_op
from .common import broadcast_shapes

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


def _unary(name, fn, parse=None, options_class=None, infer=_infer_same_shape):
    def reference(node, inputs):
        x = np.asarray(inputs[0], np.float32)
        with np.errstate(over="ignore", under="ignore", invalid="ignore"):
            return [fn(node, x).astype(np.float32, copy=False)]

    return register_op(OpDef(name=name, infer=infer, reference=reference,
                             parse=parse if parse is not None else (lambda _o: None),
                             options_class=options_class, min_inputs=1, max_inputs=1))


# -- element-wise ------------------------------------------------------------------------------
# TFLite's float LOGISTIC (reference_ops::Logistic, and Eigen's scalar_logistic_op) is
# piecewise: 1 above this cutoff, exp(x) below -9 (where 1/(1+exp(-x)) differs from exp(x) by a
# relative exp(x) < 1.3e-4), else 1/(1+exp(-x)). Mirrored so tiny outputs agree to 1e-5 too.
_LOGISTIC_CUTOFF_UPPER = np.float32(16.619047164916992188)
_LOGISTIC_CUTOFF_LOWER = np.float32(-9.0)


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
                 infer=_infer_softmax)


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
                          min_inputs=2, max_inputs=2))
