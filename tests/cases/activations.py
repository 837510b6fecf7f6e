"""Cases for the activation ops (and QUANTIZE / DEQUANTIZE on the delegate): the ops' lists,
the output grids LiteRT's int8 kernels insist on, PRELU's shapes and int8 model (used by
test_ops_activations.py), and the delegate's case table's rows: one strategy of check_op cases
per op and dtype (test_taichi_activations.py)."""
import numpy as np
from hypothesis import strategies as st
from tflite_taichi.testing import Const, Input, Output, one_op_model, quantize_array, strategies
from cases.quantize import INTS, REQUANTIZE, _real_range, quant_params
from cases.table import Row


S = strategies()


UNARY = ["RELU", "RELU6", "RELU_N1_TO_1", "RELU_0_TO_1", "LOGISTIC", "TANH", "EXP", "HARD_SWISH"]


# Output quantization LiteRT's int8 kernels insist on (None: any).
FIXED_OUTPUT_QUANT = {"LOGISTIC": (1 / 256, -128), "SOFTMAX": (1 / 256, -128)}


@st.composite
def prelu_shapes(draw):
    """(input shape, alpha shape): alpha is a suffix of the input's dims, some of them 1, so
    broadcasting keeps the input's shape (LiteRT's requirement)."""
    shape = draw(S.shapes(1, 4, 1, 5))
    alpha = tuple(draw(st.sampled_from([d, 1])) for d in shape)
    return shape, alpha[draw(st.integers(0, len(alpha))):]


def prelu_int8_case(shapes, const_alpha, qi, qa, qo, seed):
    """(model, inputs): int8 PRELU with a constant or run-time alpha (also the delegate's test)."""
    shape, alpha_shape = shapes
    rng = np.random.default_rng(seed)
    alpha = quantize_array(rng.uniform(-1, 2, alpha_shape), qa)
    alpha_in = Const(alpha, qa) if const_alpha else Input(alpha_shape, np.int8, qa)
    model = one_op_model("PRELU", [Input(shape, np.int8, qi), alpha_in],
                         [Output(shape, np.int8, qo)])
    x = rng.integers(-128, 128, shape).astype(np.int8)
    return model, [x] + ([] if const_alpha else [alpha])


# -- the delegate's case table ----------------------------------------------------------------
# Each row's strategy draws check_op's (model, inputs[, options]; inputs None: seeded from the
# model). Tolerances are check_delegate's for every row: TAICHI_RTOL; a quantized output within
# one unit.
MAGNITUDES = [1.0, 4.0, 12.0, 20.0]     # 12: below LOGISTIC's -9 cut-off; 20: above 16.6


def uniform_data(rng, shape, magnitude):
    return rng.uniform(-magnitude, magnitude, shape).astype(np.float32)


@st.composite
def unary_float32_cases(draw, op):
    shape, magnitude = draw(S.shapes(0, 4)), draw(st.sampled_from(MAGNITUDES))
    rng = np.random.default_rng(draw(S.seeds()))
    return one_op_model(op, [Input(shape)], [Output(shape)]), [uniform_data(rng, shape, magnitude)]


@st.composite
def unary_int8_cases(draw, op):
    shape, qi = draw(S.shapes(0, 4)), draw(S.quant_params())
    fixed = FIXED_OUTPUT_QUANT.get(op)
    qo = draw(S.quant_params() if fixed is None else st.just(fixed) | S.quant_params())
    model = one_op_model(op, [Input(shape, np.int8, qi)], [Output(shape, np.int8, qo)])
    return model, None, {"seed": draw(S.seeds())}


@st.composite
def leaky_relu_float32_cases(draw):
    shape, alpha = draw(S.shapes(0, 4)), draw(st.floats(-2, 2))
    rng = np.random.default_rng(draw(S.seeds()))
    model = one_op_model("LEAKY_RELU", [Input(shape)], [Output(shape)], alpha=alpha)
    return model, [uniform_data(rng, shape, 3.0)]


@st.composite
def leaky_relu_int8_cases(draw):
    shape, alpha = draw(S.shapes(0, 4)), draw(st.floats(0, 1.5))
    qi, qo = draw(S.quant_params()), draw(S.quant_params())
    model = one_op_model("LEAKY_RELU", [Input(shape, np.int8, qi)], [Output(shape, np.int8, qo)],
                         alpha=alpha)
    return model, None, {"seed": draw(S.seeds())}


@st.composite
def softmax_float32_cases(draw):
    shape = draw(S.shapes(1, 4, 1, 7))
    beta = draw(st.sampled_from([1.0, 0.5, 2.0, 0.01]) | st.floats(-3, 3))
    magnitude = draw(st.sampled_from([1.0, 10.0, 60.0]))
    rng = np.random.default_rng(draw(S.seeds()))
    model = one_op_model("SOFTMAX", [Input(shape)], [Output(shape)], beta=beta)
    return model, [uniform_data(rng, shape, magnitude)]


@st.composite
def softmax_int8_cases(draw):
    shape = draw(S.shapes(1, 4, 1, 7))
    beta = draw(st.sampled_from([1.0, 0.5, 2.0]) | st.floats(0.05, 4))
    qi = draw(st.tuples(S.scales(1e-3, 0.5), st.integers(-128, 127)))
    qo = draw(st.just(FIXED_OUTPUT_QUANT["SOFTMAX"]) | S.quant_params())
    model = one_op_model("SOFTMAX", [Input(shape, np.int8, qi)], [Output(shape, np.int8, qo)],
                         beta=beta)
    return model, None, {"seed": draw(S.seeds())}


@st.composite
def prelu_float32_cases(draw):
    (shape, alpha_shape), const_alpha = draw(prelu_shapes()), draw(st.booleans())
    rng = np.random.default_rng(draw(S.seeds()))
    alpha = rng.uniform(-1, 2, alpha_shape).astype(np.float32)
    alpha_in = Const(alpha) if const_alpha else Input(alpha_shape)
    model = one_op_model("PRELU", [Input(shape), alpha_in], [Output(shape)])
    return model, [uniform_data(rng, shape, 3.0)] + ([] if const_alpha else [alpha])


@st.composite
def prelu_int8_cases(draw):
    shapes, const_alpha = draw(prelu_shapes()), draw(st.booleans())
    qi, qa, qo = draw(S.quant_params()), draw(S.quant_params()), draw(S.quant_params())
    return prelu_int8_case(shapes, const_alpha, qi, qa, qo, draw(S.seeds()))


@st.composite
def quantize_float32_cases(draw, dtype):
    q, shape = draw(quant_params(INTS[dtype])), draw(S.shapes(0, 4))
    rng = np.random.default_rng(draw(S.seeds()))
    lo, hi = _real_range(INTS[dtype], q)        # past both ends: the store's clamp is exercised
    x = rng.uniform(lo, hi, shape).astype(np.float32)
    return one_op_model("QUANTIZE", [Input(shape)], [Output(shape, INTS[dtype], q)]), [x]


@st.composite
def requantize_cases(draw, src, dst):
    qi, qo = draw(quant_params(INTS[src])), draw(quant_params(INTS[dst]))
    shape = draw(S.shapes(0, 4))
    model = one_op_model("QUANTIZE", [Input(shape, INTS[src], qi)], [Output(shape, INTS[dst], qo)])
    return model, None, {"seed": draw(S.seeds())}


@st.composite
def dequantize_int_cases(draw, dtype):
    q, shape = draw(quant_params(INTS[dtype])), draw(S.shapes(0, 4))
    model = one_op_model("DEQUANTIZE", [Input(shape, INTS[dtype], q)], [Output(shape)])
    return model, None, {"seed": draw(S.seeds())}


@st.composite
def dequantize_float16_cases(draw):
    shape, magnitude = draw(S.shapes(0, 4)), draw(st.sampled_from([1.0, 100.0, 60000.0]))
    rng = np.random.default_rng(draw(S.seeds()))
    x = rng.uniform(-magnitude, magnitude, shape).astype(np.float16)
    return one_op_model("DEQUANTIZE", [Input(shape, np.float16)], [Output(shape)]), [x]


ACTIVATION_ROWS = (
    [Row(f"{op}-float32", unary_float32_cases(op), "magnitudes past LOGISTIC's cut-offs")
     for op in UNARY]
    + [Row(f"{op}-int8", unary_int8_cases(op), "LiteRT's fixed output grid or any")
       for op in UNARY]
    + [Row("LEAKY_RELU-float32", leaky_relu_float32_cases(), "negative alphas"),
       Row("LEAKY_RELU-int8", leaky_relu_int8_cases()),
       Row("SOFTMAX-float32", softmax_float32_cases(), "any beta, magnitudes up to 60"),
       Row("SOFTMAX-int8", softmax_int8_cases()),
       Row("PRELU-float32", prelu_float32_cases(), "alpha a constant or an input, broadcast"),
       Row("PRELU-int8", prelu_int8_cases(), "alpha a constant or an input, on its own grid")]
    + [Row(f"QUANTIZE-float32-to-{dtype}", quantize_float32_cases(dtype),
           "values past both ends of the grid") for dtype in INTS]
    + [Row(f"QUANTIZE-{src}-to-{dst}", requantize_cases(src, dst)) for src, dst in REQUANTIZE]
    + [Row(f"DEQUANTIZE-{dtype}", dequantize_int_cases(dtype)) for dtype in INTS]
    + [Row("DEQUANTIZE-float16", dequantize_float16_cases(), "magnitudes up to 60000")]
)
