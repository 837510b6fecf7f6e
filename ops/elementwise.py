"""Binary element-wise ops with numpy broadcasting and fused activations."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .base import OpDef, register_op
from .common import apply_activation, broadcast_shapes, check_activation


@dataclass(frozen=True)
class ActivationOptions:
    fused_activation_function: int = 0


def _parse_activation(opts) -> ActivationOptions:
    return ActivationOptions(int(opts.FusedActivationFunction()))


def _infer_broadcast(node):
    if node.options is not None:
        check_activation(node, node.options.fused_activation_function)
    return [broadcast_shapes(node, *(s.shape for s in node.inputs))]


def _binary(name, fn, options_class=None, has_activation=True):
    def reference(node, inputs):
        a, b = inputs
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            out = fn(a, b)
        if has_activation:
            out = apply_activation(out, node.options.fused_activation_function)
        return [out]

    return register_op(OpDef(
        name=name, infer=_infer_broadcast, reference=reference,
        parse=_parse_activation if has_activation else (lambda _o: None),
        options_class=options_class if options_class else None,
        min_inputs=2, max_inputs=2))


def _divide(a, b):
    if np.issubdtype(np.result_type(a, b), np.integer):
        # TFLite's integer DIV truncates toward zero; a zero divisor is an error there, 0 here.
        safe = np.where(b == 0, 1, b)
        return np.where(b == 0, 0, np.trunc(a / safe)).astype(np.result_type(a, b))
    return a / b


ADD = _binary("ADD", np.add, "AddOptions")
SUB = _binary("SUB", np.subtract, "SubOptions")
MUL = _binary("MUL", np.multiply, "MulOptions")
DIV = _binary("DIV", _divide, "DivOptions")
MAXIMUM = _binary("MAXIMUM", np.maximum, has_activation=False)
MINIMUM = _binary("MINIMUM", np.minimum, has_activation=False)
SQUARED_DIFFERENCE = _binary("SQUARED_DIFFERENCE", lambda a, b: np.square(a - b), has_activation=False)
LOGICAL_AND = _binary("LOGICAL_AND", np.logical_and, has_activation=False)
