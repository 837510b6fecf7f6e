"""Cases for the element-wise binary ops: their lists (with or without a fused activation, int8),
broadcast shape pairs (used by test_ops_elementwise.py and other families' broadcasting ops), a
one-op model builder, and the delegate's case table's rows: one strategy of check_op cases per
op and dtype (test_taichi_elementwise.py)."""
import numpy as np
from hypothesis import strategies as st
from tflite_taichi.testing import Const, Input, Output, one_op_model, strategies
from cases.table import Row


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


# -- the delegate's case table ----------------------------------------------------------------
# Each row's strategy draws check_op's (model, inputs[, options]); tolerances are
# check_delegate's: TAICHI_RTOL; a quantized output within one unit.
def binary_model(op, shapes, act, const_rhs, seed, dtype=np.float32, q=None):
    a_shape, b_shape, out_shape = shapes
    rng = np.random.default_rng(seed)
    rhs = rng.uniform(-3, 3, b_shape).astype(np.float32)
    if op == "DIV":
        rhs = np.where(np.abs(rhs) < 0.1, 0.5, rhs).astype(np.float32)
    options = {"fused_activation_function": act} if op in WITH_ACTIVATION else {}
    if dtype == np.int8:
        qa, qb, qo = q
        model = one_op_model(op, [Input(a_shape, np.int8, qa), Input(b_shape, np.int8, qb)],
                             [Output(out_shape, np.int8, qo)], **options)
        return model, None
    model = one_op_model(op, [Input(a_shape), Const(rhs) if const_rhs else Input(b_shape)],
                         [Output(out_shape)], **options)
    inputs = [rng.uniform(-3, 3, a_shape).astype(np.float32)] + ([] if const_rhs else [rhs])
    return model, inputs


@st.composite
def float32_cases(draw, op):
    return binary_model(op, draw(broadcast_pair()), draw(S.activations()), draw(st.booleans()),
                        draw(S.seeds()))


@st.composite
def int8_cases(draw, op):
    seed = draw(S.seeds())
    q = (draw(S.quant_params()), draw(S.quant_params()), draw(S.quant_params()))
    model, _ = binary_model(op, draw(broadcast_pair()), draw(S.activations()), False, seed,
                            np.int8, q)
    return model, None, {"seed": seed}


@st.composite
def logical_and_cases(draw):
    a_shape, b_shape, out_shape = draw(broadcast_pair())
    model = one_op_model("LOGICAL_AND", [Input(a_shape, np.bool_), Input(b_shape, np.bool_)],
                         [Output(out_shape, np.bool_)])
    return model, None, {"seed": draw(S.seeds())}


ELEMENTWISE_ROWS = (
    [Row(f"{op}-float32", float32_cases(op), "broadcasting, a constant right-hand side")
     for op in WITH_ACTIVATION + WITHOUT_ACTIVATION]
    + [Row(f"{op}-int8", int8_cases(op), "broadcasting, own grids") for op in INT8_OPS]
    + [Row("LOGICAL_AND", logical_and_cases(), "bool, broadcasting")]
)
