"""Cases for the resizes: their case space (sizes and each op's flags) and one-op model (used
by test_ops_resize.py), and the delegate's case table's rows: one strategy of check_op cases per
op and dtype (test_taichi_reduce.py)."""
import numpy as np
from hypothesis import strategies as st
from tflite_taichi.testing import Const, Input, Output, one_op_model, strategies
from cases.table import Row

S = strategies()


OPS = ["RESIZE_BILINEAR", "RESIZE_NEAREST_NEIGHBOR"]


# (align_corners, half_pixel_centers). LiteRT refuses both for RESIZE_BILINEAR; its
# RESIZE_NEAREST_NEIGHBOR runs them together, and so do we.
FLAGS = {"RESIZE_BILINEAR": [(False, False), (True, False), (False, True)],
         "RESIZE_NEAREST_NEIGHBOR": [(False, False), (True, False), (False, True), (True, True)]}


@st.composite
def resize_case(draw, op):
    """(input shape, [new_h, new_w], align_corners, half_pixel_centers). Sizes reach 12 -> 32
    so that coordinate rounding (e.g. int8's 10-bit scale) shows in the result."""
    n, c = draw(st.integers(1, 2)), draw(st.integers(1, 3))
    h, w = draw(st.integers(1, 12)), draw(st.integers(1, 12))
    new_h, new_w = draw(st.integers(1, 32)), draw(st.integers(1, 32))
    align, half = draw(st.sampled_from(FLAGS[op]))
    return (n, h, w, c), (new_h, new_w), align, half


def _model(op, shape, size, align, half, dtype=np.float32, q=None):
    out = (shape[0], size[0], size[1], shape[3])
    return one_op_model(op, [Input(shape, dtype, q), Const(np.array(size, np.int32))],
                        [Output(out, dtype, q)], align_corners=align, half_pixel_centers=half)


# -- the delegate's case table ----------------------------------------------------------------
@st.composite
def resize_cases(draw, op, dtype=None, quant=None):
    """`op`'s case space; int8 bilinear: the 10-bit fixed-point coordinates of LiteRT's kernel."""
    case = draw(resize_case(op))
    quantized = () if dtype is None else (dtype, draw(quant))
    return _model(op, *case, *quantized), None, {"seed": draw(S.seeds())}


RESIZE_ROWS = (
    [Row(f"{op}-float32", resize_cases(op), "align_corners, half_pixel_centers") for op in OPS]
    + [Row(f"{op}-int8", resize_cases(op, np.int8, S.quant_params())) for op in OPS]
    + [Row("RESIZE_BILINEAR-int16", resize_cases("RESIZE_BILINEAR", np.int16,
                                                 S.quant_params(np.int16)))]
)
