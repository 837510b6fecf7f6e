"""Binary element-wise ops with numpy broadcasting and fused activations."""

from dataclasses import dataclass

import numpy as np

from .compare import infer_logical
from .base import Fusion
from .common import apply_activation, broadcast_shapes, check_activation, register_binary, unbroadcast_inputs
from .kit import BroadcastBinaryStep, activation, ti


@dataclass(frozen=True)
class ActivationOptions:
    fused_activation_function: int = 0


def _parse_activation(opts) -> ActivationOptions:
    return ActivationOptions(int(opts.FusedActivationFunction()))


def _infer_broadcast(node):
    if node.options is not None:
        check_activation(node, node.options.fused_activation_function)
    return [broadcast_shapes(node, *(s.shape for s in node.inputs))]


# -- Taichi ----------------------------------------------------------------------------------
_CODES = {"ADD": 0, "SUB": 1, "MUL": 2, "DIV": 3, "MAXIMUM": 4, "MINIMUM": 5,
          "SQUARED_DIFFERENCE": 6, "LOGICAL_AND": 7}


@ti.func
def _apply(x, y, code: ti.template()):
    r = 0.0
    if ti.static(code == 0):
        r = x + y
    elif ti.static(code == 1):
        r = x - y
    elif ti.static(code == 2):
        r = x * y
    elif ti.static(code == 3):
        r = x / y
    elif ti.static(code == 4):          # LiteRT: x > y ? x : y, so a NaN in x gives y (nested
        # selects: GLSL has no `|` of bools)
        r = ti.select(ti.math.isnan(x), y, ti.select(ti.math.isnan(y), y, ti.max(x, y)))
    elif ti.static(code == 5):          # LiteRT: x < y ? x : y
        r = ti.select(ti.math.isnan(x), y, ti.select(ti.math.isnan(y), y, ti.min(x, y)))
    elif ti.static(code == 6):
        r = (x - y) * (x - y)
    else:
        # nested selects, not `&` of comparisons: Taichi's GLSL backend miscompiles that
        r = ti.select(x != 0.0, ti.select(y != 0.0, 1.0, 0.0), 0.0)
    return r


@ti.data_oriented
class BinaryStep(BroadcastBinaryStep):
    """ADD, SUB, MUL, DIV, MAXIMUM, MINIMUM, SQUARED_DIFFERENCE, LOGICAL_AND with their fused
    activation, inputs broadcast (the kit's template)."""

    def __init__(self, code, a, b, out, act):
        super().__init__(a, b, out)
        self.code, self.act = code, act

    @ti.func
    def formula(self, x, y):
        return activation(_apply(x, y, self.code), self.act)


def _binary_taichi(node, io):
    act = node.options.fused_activation_function if node.options is not None else 0
    return BinaryStep(_CODES[node.op], io.inputs[0], io.inputs[1], io.outputs[0], act)


def _binary(name, fn, options_class=None, has_activation=True, **fields):
    """A binary op's OpDef, registered: broadcasting numpy `fn` as its reference, BinaryStep as
    its Taichi part, fused as an epilogue or at its reader's load; `fields` override any OpDef
    field (LOGICAL_AND: its own infer, no fusion)."""
    def reference(node, inputs):
        a, b = inputs
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            out = fn(a, b)
        if has_activation:
            out = apply_activation(out, node.options.fused_activation_function)
        return [out]

    infer = fields.pop("infer", _infer_broadcast)
    return register_binary(name, infer, reference, _binary_taichi, **{
        "parse": _parse_activation if has_activation else (lambda _o: None),
        "options_class": options_class if options_class else None,
        "fusion": Fusion(stores_once=True, epilogue_inputs=unbroadcast_inputs, computed_at_load=True),
        **fields})


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
def _litert_max_min(fn):
    """LiteRT's MAXIMUM/MINIMUM are `a > b ? a : b` / `a < b ? a : b` (every kernel of LiteRT
    2.3, measured): a NaN in either operand gives b."""
    def apply(a, b):
        out = fn(a, b)
        if out.dtype.kind == "f":
            out = np.where(np.isnan(a) | np.isnan(b), b, out).astype(out.dtype, copy=False)
        return out
    return apply


MAXIMUM = _binary("MAXIMUM", _litert_max_min(np.maximum), has_activation=False)
MINIMUM = _binary("MINIMUM", _litert_max_min(np.minimum), has_activation=False)
SQUARED_DIFFERENCE = _binary("SQUARED_DIFFERENCE", lambda a, b: np.square(a - b), has_activation=False)
# bool in and out, as LiteRT requires (its infer shared with LOGICAL_OR)
LOGICAL_AND = _binary("LOGICAL_AND", np.logical_and, has_activation=False, infer=infer_logical,
                      fusion=Fusion(stores_once=True))
