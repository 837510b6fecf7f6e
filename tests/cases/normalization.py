"""Cases for LOG_SOFTMAX, L2_NORMALIZATION and LOCAL_RESPONSE_NORMALIZATION: row and LRN case
spaces, row inputs (spread, zero rows), one-op models (used by test_ops_normalization.py), and
the delegate's case table's rows: strategies of check_op cases that draw the op inside each
example (test_taichi_normalization.py)."""
import numpy as np
from hypothesis import strategies as st
from tflite_taichi.testing import Input, Output, one_op_model, strategies
from cases.table import Row


S = strategies()


ROW_OPS = ["LOG_SOFTMAX", "L2_NORMALIZATION"]


MAX_RANK = {"LOG_SOFTMAX": 5, "L2_NORMALIZATION": 4}


# the output quantization LiteRT's kernels require: dtype -> (scale, zero point)
FIXED_OUTPUT = {"LOG_SOFTMAX": {np.int8: (16 / 256, 127), np.uint8: (16 / 256, 255)},
                "L2_NORMALIZATION": {np.int8: (1 / 128, 0), np.uint8: (1 / 128, 128)}}


@st.composite
def row_case(draw, op):
    """(shape, input spread): the spread scales uniform [-1, 1] inputs, so rows range from
    near-constant to widely spread (LOG_SOFTMAX's exp underflows; L2's norms vary)."""
    shape = draw(S.shapes(1, MAX_RANK[op], 1, 7))
    spread = draw(st.sampled_from([0.01, 1.0, 5.0, 40.0]))
    return shape, spread


def row_inputs(shape, spread, seed, zero_rows=False):
    rng = np.random.default_rng(seed)
    x = (rng.uniform(-1, 1, shape) * spread).astype(np.float32)
    if zero_rows and len(shape) > 1:
        x[..., ::2, :] = 0.0          # whole rows of zeros: L2's epsilon
    return [x]


def row_model(op, shape, dtype=np.float32, qi=None):
    qo = FIXED_OUTPUT[op][dtype] if dtype in (np.int8, np.uint8) else None
    return one_op_model(op, [Input(shape, dtype, qi)], [Output(shape, dtype, qo)])


@st.composite
def lrn_case(draw):
    """(shape, options): 4-D inputs, radius up to past the depth, bias > 0 and alpha >= 0 so
    the base stays positive (TensorFlow's domain)."""
    shape = draw(S.shapes(4, 4, 1, 6))
    radius = draw(st.integers(0, 7))
    bias = draw(st.sampled_from([1e-2, 0.5, 1.0, 2.0]))
    alpha = draw(st.sampled_from([0.0, 1e-4, 0.1, 1.0]))
    beta = draw(st.sampled_from([0.0, 0.25, 0.5, 0.75, 1.5]))
    return shape, dict(radius=radius, bias=bias, alpha=alpha, beta=beta)


def lrn_model(shape, options):
    return one_op_model("LOCAL_RESPONSE_NORMALIZATION", [Input(shape)], [Output(shape)], **options)


# -- the delegate's case table ----------------------------------------------------------------
# Each row's strategy draws check_op's cases; tolerances are check_delegate's: TAICHI_RTOL;
# quantized outputs within one step.
@st.composite
def float32_cases(draw):
    """Any of the three ops, drawn in the example: one compile per example for the family."""
    seed = draw(S.seeds())
    op = draw(st.sampled_from(ROW_OPS + ["LOCAL_RESPONSE_NORMALIZATION"]))
    if op == "LOCAL_RESPONSE_NORMALIZATION":
        shape, options = draw(lrn_case())
        return lrn_model(shape, options), None, {"seed": seed}
    shape, spread = draw(row_case(op))
    zero_rows = op == "L2_NORMALIZATION" and draw(st.booleans())
    return row_model(op, shape), row_inputs(shape, spread, seed, zero_rows)


@st.composite
def row_ops_int8_cases(draw):
    seed = draw(S.seeds())
    op = draw(st.sampled_from(ROW_OPS))
    dtype = draw(st.sampled_from([np.int8, np.uint8]))
    shape, _ = draw(row_case(op))
    qi = draw(S.quant_params(dtype, scale_range=(1e-3, 0.5)))
    return row_model(op, shape, dtype, qi), None, {"seed": seed}


NORMALIZATION_ROWS = [
    Row("float32", float32_cases(), "LOG_SOFTMAX, L2_NORMALIZATION (zero rows too), LRN"),
    Row("row-ops-int8", row_ops_int8_cases(), "LOG_SOFTMAX, L2_NORMALIZATION; int8 and uint8"),
]
