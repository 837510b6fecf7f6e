"""Cases for resize ops shared by the tests (moved from test_ops_resize.py): hypothesis
strategies, one-op model builders and their helpers, used by test_ops_resize.py and the
delegate's tests."""
import numpy as np
from hypothesis import strategies as st
from tflite_taichi.testing import Const, Input, Output, one_op_model


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
