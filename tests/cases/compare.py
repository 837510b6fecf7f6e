"""Cases for comparisons, logical ops, SELECT/SELECT_V2 and CAST: value generators, quantized
pairs (rounding ties, every stored pair), SELECT's shapes and model, CAST's values (used by
test_ops_compare.py), and the delegate's case table's rows: strategies of check_op cases that
draw the op inside each example (test_taichi_compare.py)."""
import numpy as np
from hypothesis import strategies as st
from tflite_taichi.ops.compare import COMPARISONS
from tflite_taichi.testing import Const, Input, Output, one_op_model, strategies
from cases.elementwise import broadcast_pair
from cases.table import Row


S = strategies()


# Scales of quantized comparison inputs: below 1/256 LiteRT's rescaling merges neighbouring
# values; up to 0.99 its multiplier needs no right shift.
COMPARE_SCALES = (1e-4, 0.99)


# 257/512 * 2^-4 has a fixed-point multiplier that is an odd multiple of 2^22, so an odd
# |q - zp| lands exactly halfway in SaturatingRoundingDoublingHighMul, which rounds such ties up
# (-x is not the negation of x there); 121/256 gives exact integer values next to them.
TIE_SCALES = ((0.0313720703125, 3), (0.47265625, -2))


def float_values(rng, shape):
    """Half-integers in [-2, 2] (so equal pairs are common) mixed with uniform reals, and the
    odd NaN or infinity."""
    grid = rng.integers(-4, 5, shape) * 0.5
    x = np.where(rng.random(shape) < 0.6, grid, rng.uniform(-2, 2, shape))
    x = np.where(rng.random(shape) < 0.04, rng.choice([np.nan, np.inf, -np.inf], shape), x)
    return x.astype(np.float32)


def quantized_pair(rng, a_shape, b_shape, dtype, qa, qb):
    """int data for two quantized inputs; about half of b's elements are a's real values
    requantized to b's grid, give or take one step, so near-equal pairs are common."""
    info = np.iinfo(dtype)
    a = rng.integers(info.min, int(info.max) + 1, a_shape)
    real_a = (a - qa[1]) * qa[0]
    picked = rng.choice(real_a.reshape(-1), b_shape) if a.size else np.zeros(b_shape)
    near = np.round(picked / qb[0]) + qb[1] + rng.integers(-1, 2, b_shape)
    b = np.where(rng.random(b_shape) < 0.5, near, rng.integers(info.min, int(info.max) + 1, b_shape))
    return [np.clip(a, info.min, info.max).astype(dtype), np.clip(b, info.min, info.max).astype(dtype)]


@st.composite
def float_compare_case(draw, op):
    """(model, inputs): float32 inputs broadcast against each other, the second maybe constant."""
    a_shape, b_shape, out_shape = draw(broadcast_pair())
    rng = np.random.default_rng(draw(S.seeds()))
    a, b = float_values(rng, a_shape), float_values(rng, b_shape)
    if draw(st.booleans()):
        model = one_op_model(op, [Input(a_shape), Const(b)], [Output(out_shape, np.bool_)])
        return model, [a]
    model = one_op_model(op, [Input(a_shape), Input(b_shape)], [Output(out_shape, np.bool_)])
    return model, [a, b]


@st.composite
def quantized_compare_case(draw, op, dtype=None):
    """(model, inputs): int8 or uint8 inputs with random (often equal) scales and zero points."""
    dtype = dtype or draw(st.sampled_from([np.int8, np.uint8]))
    a_shape, b_shape, out_shape = draw(broadcast_pair())
    qa = draw(S.quant_params(dtype, scale_range=COMPARE_SCALES))
    qb = qa if draw(st.booleans()) else draw(S.quant_params(dtype, scale_range=COMPARE_SCALES))
    rng = np.random.default_rng(draw(S.seeds()))
    model = one_op_model(op, [Input(a_shape, dtype, qa), Input(b_shape, dtype, qb)],
                         [Output(out_shape, np.bool_)])
    return model, quantized_pair(rng, a_shape, b_shape, dtype, qa, qb)


SWEEP_SCALES = [((0.001, 0), (0.001, 0)), ((0.0037, 5), (0.011, -7)), ((0.6, 3), (0.2, -2)),
                ((2e-5, 0), (0.003, 1)), ((0.5, 0), (0.25, 0)), TIE_SCALES]


def every_pair(dtype):
    """Every stored value against every other: two (65536,) arrays."""
    info = np.iinfo(dtype)
    values = np.arange(info.min, int(info.max) + 1).astype(dtype)
    return [np.repeat(values, values.size), np.tile(values, values.size)]


# -- SELECT, SELECT_V2 ----------------------------------------------------------------------------
@st.composite
def select_shapes(draw, op):
    """(condition, x, y, output) shapes LiteRT accepts: SELECT's condition is x's shape, a
    scalar or 1-D along x's first dimension (x and y alike); SELECT_V2's three broadcast."""
    out = draw(S.shapes(0, 4, 1, 4))
    if op == "SELECT":
        kind = draw(st.sampled_from(["same", "scalar", "rank_one"] if out else ["same", "scalar"]))
        cond = {"same": out, "scalar": (), "rank_one": out[:1]}[kind]
        return cond, out, out, out

    def operand():
        shape = tuple(draw(st.sampled_from([d, 1])) for d in out)
        return shape[draw(st.integers(0, len(shape))):]
    cond, x, y = operand(), operand(), operand()
    return cond, x, y, tuple(np.broadcast_shapes(cond, x, y))


def select_model(op, shapes, dtype=np.float32, q=None):
    """q: quantization of x, y and the output (int8), one shared or three."""
    cond, x, y, out = shapes
    qx, qy, qo = (q, q, q) if q is None or not isinstance(q[0], tuple) else q
    return one_op_model(op, [Input(cond, np.bool_), Input(x, dtype, qx), Input(y, dtype, qy)],
                        [Output(out, dtype, qo)])


@st.composite
def cast_values_of(draw, dtype, shape):
    """Random values of `dtype`: floats over many magnitudes (specials included), integers
    over the whole range."""
    rng = np.random.default_rng(draw(S.seeds()))
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return rng.integers(0, 2, shape).astype(bool)
    if dtype.kind == "f":
        magnitude = 10.0 ** rng.uniform(-9, 11 if dtype == np.float32 else 4.8, shape)
        x = rng.choice([-1, 1], shape) * magnitude
        x = np.where(rng.random(shape) < 0.3, np.round(x), x)
        x = np.where(rng.random(shape) < 0.05, rng.choice([np.inf, -np.inf, np.nan], shape), x)
        return x.astype(dtype)
    info = np.iinfo(dtype)
    return rng.integers(info.min, int(info.max) + 1, shape, dtype=np.int64).astype(dtype)


# -- the delegate's case table ----------------------------------------------------------------
# Each row's strategy draws check_op's (model, inputs[, options]; inputs None: seeded from the
# model). Bool outputs must match exactly (LiteRT's fixed-point rescaling of quantized
# comparisons included); float outputs within TAICHI_RTOL (check_delegate's rule).
CARRIED = [np.float32, np.float16, np.bool_]      # CAST's types the delegate carries


@st.composite
def bool_cases(draw):
    op = draw(st.sampled_from(["LOGICAL_OR", "LOGICAL_NOT", "EQUAL", "NOT_EQUAL"]))
    a_shape, b_shape, out_shape = draw(broadcast_pair())
    if op == "LOGICAL_NOT":
        model = one_op_model(op, [Input(a_shape, np.bool_)], [Output(a_shape, np.bool_)])
    else:
        model = one_op_model(op, [Input(a_shape, np.bool_), Input(b_shape, np.bool_)],
                             [Output(out_shape, np.bool_)])
    return model, None, {"seed": draw(S.seeds())}


@st.composite
def select_cases(draw):
    op = draw(st.sampled_from(["SELECT", "SELECT_V2"]))
    shapes = draw(select_shapes(op))
    dtype, q = draw(st.sampled_from([np.float32, np.int8, np.bool_])), draw(S.quant_params())
    model = select_model(op, shapes, dtype, q if dtype == np.int8 else None)
    return model, None, {"seed": draw(S.seeds())}


@st.composite
def cast_cases(draw):
    src, dst = draw(st.sampled_from(CARRIED)), draw(st.sampled_from(CARRIED))
    shape = draw(S.shapes(0, 3))
    x = draw(cast_values_of(src, shape))
    return one_op_model("CAST", [Input(shape, src)], [Output(shape, dst)]), [x]


COMPARE_ROWS = [
    Row("comparisons-float32", st.sampled_from(COMPARISONS).flatmap(float_compare_case)),
    Row("comparisons-quantized", st.sampled_from(COMPARISONS).flatmap(quantized_compare_case),
        "int8 and uint8, equal grids or not"),
    Row("logical-and-bool-comparisons", bool_cases(), "LOGICAL_OR, LOGICAL_NOT, EQUAL, NOT_EQUAL"),
    Row("SELECT", select_cases(), "SELECT and SELECT_V2; float32, int8, bool"),
    Row("CAST", cast_cases(), "float32, float16, bool to each other"),
]
