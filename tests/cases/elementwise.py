"""Cases for elementwise ops shared by the tests (moved from test_ops_elementwise.py): hypothesis
strategies, one-op model builders and their helpers, used by test_ops_elementwise.py and the
delegate's tests."""
import numpy as np
from hypothesis import strategies as st
from tflite_taichi.testing import strategies


S = strategies()


WITH_ACTIVATION = ["ADD", "SUB", "MUL", "DIV"]


WITHOUT_ACTIVATION = ["MAXIMUM", "MINIMUM", "SQUARED_DIFFERENCE"]


# LiteRT's int8 kernels: DIV has none (uint8 only), the others do.
INT8_OPS = ["ADD", "SUB", "MUL", "MAXIMUM", "MINIMUM", "SQUARED_DIFFERENCE"]


@st.composite
def broadcast_pair(draw, max_rank=4):
    """Two shapes that broadcast: dims of the second are 1 or equal, ranks may differ."""
    shape = draw(S.shapes(1, max_rank, 1, 5))
    other = tuple(draw(st.sampled_from([d, 1])) for d in shape)
    other = other[draw(st.integers(0, len(other) - 1)):]
    if draw(st.booleans()):
        shape, other = other, shape
    out = tuple(np.broadcast_shapes(shape, other))
    return shape, other, out
