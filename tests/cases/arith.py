"""Cases for the math ops: the ops' lists, their options and data generators (each op's
domain, special values, ATAN2's specials; used by test_ops_arith.py), and the delegate's case
table's rows: strategies of check_op cases that draw the op inside each example, so every op is
covered without a test (and its compiles) per op (test_taichi_arith.py)."""
import numpy as np
from hypothesis import strategies as st
from tflite_taichi.testing import Const, Input, Output, one_op_model, strategies
from cases.elementwise import broadcast_pair
from cases.table import Row

S = strategies()


UNARY = ["ABS", "NEG", "SQRT", "RSQRT", "SQUARE", "LOG", "SIN", "COS", "FLOOR", "CEIL", "ROUND",
         "SIGN", "ELU", "GELU"]


BINARY = ["POW", "FLOOR_DIV", "FLOOR_MOD"]


POSITIVE = {"SQRT", "RSQRT", "LOG"}                 # real-valued on x > 0 only


def unary_options(op, approximate):
    return {"approximate": approximate} if op == "GELU" else {}


def unary_data(op, rng, shape, magnitude):
    """Float inputs for `op`: positive where it is real-valued only there; half of the values
    of FLOOR/CEIL/ROUND on integers and halves (ROUND's ties). GELU's first value is positive:
    its tanh form at x < -3 is 0.5 x (1 + tanh(u)) with tanh(u) near -1, which no float32
    evaluation gets to 1e-5 of itself (LiteRT's Eigen tanh and numpy's differ by an ulp
    there, 3% of an output of 0.003), so a value of the input's own size sets the scale.
    SIN/COS reach |x| of 900 (positional encodings; GPUs' native sin needs a reduction there)."""
    if op in ("SIN", "COS"):
        magnitude *= 30
    if op in POSITIVE:
        return rng.uniform(magnitude * 1e-3, magnitude, shape).astype(np.float32)
    x = rng.uniform(-magnitude, magnitude, shape)
    if op in ("FLOOR", "CEIL", "ROUND"):
        x = np.where(rng.random(shape) < 0.5, np.round(x * 2) / 2, x)
    if op == "GELU":
        x = np.array(x)
        x.flat[0] = abs(x.flat[0]) + magnitude / 4
    return x.astype(np.float32)


def binary_data(op, rng, a_shape, b_shape, decimals=False):
    """Float (a, b): POW with positive bases, or any base and integer exponents; FLOOR_DIV/MOD
    with divisors away from 0, or (decimals) tenths whose float32 quotients sit next to
    integers (1 // 0.1 is 9: the quotient is computed in double)."""
    if op == "POW":
        if decimals:
            a = rng.uniform(-4, 4, a_shape)
            b = rng.integers(-3, 5, b_shape)
        else:
            a = rng.uniform(0.05, 4, a_shape)
            b = rng.uniform(-3, 3, b_shape)
    elif decimals:
        a = rng.integers(-60, 61, a_shape) / 10
        b = rng.choice([0.1, -0.1, 0.2, 0.3, -0.3, 0.7, 1.1, -2.5], b_shape)
    else:
        a = rng.uniform(-10, 10, a_shape)
        b = rng.uniform(0.2, 4, b_shape) * rng.choice([-1, 1], b_shape)
    return a.astype(np.float32), np.asarray(b, np.float32).reshape(b_shape)


# -- ATAN2 -------------------------------------------------------------------------------------
ATAN2_SPECIALS = np.array([0.0, -0.0, 1.0, -1.0, 2.5, -1e-3, np.inf, -np.inf, np.nan, 1e-30],
                          np.float32)


def atan2_data(rng, shape, magnitude, dtype=np.float32):
    """Values up to `magnitude`, a fifth of them +-0 (the axes' special cases)."""
    v = rng.uniform(-magnitude, magnitude, shape)
    v = np.where(rng.random(shape) < 0.2, np.where(rng.random(shape) < 0.5, 0.0, -0.0), v)
    return np.asarray(v, dtype).reshape(shape)


# -- the delegate's case table ----------------------------------------------------------------
# Each row's strategy draws check_op's (model, inputs[, options]; inputs None: seeded from the
# model: the whole int8 range). Tolerances are check_delegate's for every row: TAICHI_RTOL; a
# quantized output within one unit. int8 runs every op, LiteRT's int8 kernels or not: on the
# float view each is the float formula with the output snapped to its grid.
UNARY_VARIANTS = [(op, False) for op in UNARY] + [("GELU", True)]   # GELU's erfc and tanh forms


@st.composite
def unary_float32_cases(draw):
    op, approximate = draw(st.sampled_from(UNARY_VARIANTS))
    shape, magnitude = draw(S.shapes(0, 4)), draw(st.sampled_from([1.0, 4.0, 30.0]))
    rng = np.random.default_rng(draw(S.seeds()))
    model = one_op_model(op, [Input(shape)], [Output(shape)], **unary_options(op, approximate))
    return model, [unary_data(op, rng, shape, magnitude)]


@st.composite
def unary_int8_cases(draw):
    op, approximate = draw(st.sampled_from(UNARY_VARIANTS))
    shape, qi, qo = draw(S.shapes(0, 4)), draw(S.quant_params()), draw(S.quant_params())
    model = one_op_model(op, [Input(shape, np.int8, qi)], [Output(shape, np.int8, qo)],
                         **unary_options(op, approximate))
    return model, None, {"seed": draw(S.seeds())}


@st.composite
def binary_float32_cases(draw):
    op, (a_shape, b_shape, out_shape) = draw(st.sampled_from(BINARY)), draw(broadcast_pair())
    const_rhs, decimals = draw(st.booleans()), draw(st.booleans())
    rng = np.random.default_rng(draw(S.seeds()))
    a, b = binary_data(op, rng, a_shape, b_shape, decimals)
    model = one_op_model(op, [Input(a_shape), Const(b) if const_rhs else Input(b_shape)],
                         [Output(out_shape)])
    return model, [a] + ([] if const_rhs else [b])


@st.composite
def binary_int8_cases(draw, op=None):
    op = op or draw(st.sampled_from(BINARY))
    a_shape, b_shape, out_shape = draw(broadcast_pair())
    qa, qb, qo = draw(S.quant_params()), draw(S.quant_params()), draw(S.quant_params())
    model = one_op_model(op, [Input(a_shape, np.int8, qa), Input(b_shape, np.int8, qb)],
                         [Output(out_shape, np.int8, qo)])
    return model, None, {"seed": draw(S.seeds())}


@st.composite
def add_n_cases(draw):
    n, shape = draw(st.integers(2, 5)), draw(S.shapes(0, 4))
    consts = draw(st.lists(st.booleans(), min_size=5, max_size=5))
    quantized, q, seed = draw(st.booleans()), draw(S.quant_params()), draw(S.seeds())
    consts[0] = False
    if quantized:
        ins = [Input(shape, np.int8, q)] * n
        return one_op_model("ADD_N", ins, [Output(shape, np.int8, q)]), None, {"seed": seed}
    rng = np.random.default_rng(seed)
    values = [rng.uniform(-3, 3, shape).astype(np.float32) for _ in range(n)]
    ins = [Const(v) if c else Input(shape) for v, c in zip(values, consts)]
    model = one_op_model("ADD_N", ins, [Output(shape)])
    return model, [v for v, c in zip(values, consts) if not c]


@st.composite
def atan2_float32_cases(draw):
    (a_shape, b_shape, out_shape), magnitude = draw(broadcast_pair()), draw(
        st.sampled_from([1e-3, 1.0, 1e4]))
    const_rhs = draw(st.booleans())
    rng = np.random.default_rng(draw(S.seeds()))
    y, x = atan2_data(rng, a_shape, magnitude), atan2_data(rng, b_shape, magnitude)
    model = one_op_model("ATAN2", [Input(a_shape), Const(x) if const_rhs else Input(b_shape)],
                         [Output(out_shape)])
    return model, [y] + ([] if const_rhs else [x])


ARITH_ROWS = [
    Row("unary-float32", unary_float32_cases(), "every unary op, each in its domain"),
    Row("unary-int8", unary_int8_cases(),
        "full int8 range: negatives under LOG (-inf: the lowest value), SQRT and RSQRT (NaN: "
        "the zero point), zero under RSQRT (inf: the highest value)"),
    Row("binary-float32", binary_float32_cases(), "broadcasting, a constant right-hand side"),
    Row("binary-int8", binary_int8_cases(),
        "random grids: zero divisors (IEEE, then snapped: inf to the grid's end, NaN to the "
        "zero point), POW of negative bases"),
    Row("ADD_N", add_n_cases(), "2 to 5 terms, some constant; float32 or int8"),
    Row("ATAN2-float32", atan2_float32_cases(), "broadcasting, magnitudes 1e-3 to 1e4"),
    Row("ATAN2-int8", binary_int8_cases("ATAN2"), "broadcasting, own grids"),
]
