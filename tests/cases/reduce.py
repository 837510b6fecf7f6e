"""Cases for the reductions: their case space, input generators that keep products in range
and bools mixed, the rounding floor of a cancelling sum (used by test_ops_reduce.py), a one-op
reduction model, and the delegate's case table's rows: one strategy of check_op cases per op and
dtype, or ops drawn together (test_taichi_reduce.py)."""
import numpy as np
from hypothesis import assume, strategies as st
from tflite_taichi.testing import Const, Input, Output, model_inputs, one_op_model, strategies
from cases.table import Row


S = strategies()


OPS = ["MEAN", "SUM", "REDUCE_MAX"]


@st.composite
def reduction(draw):
    """(input shape, axes array, keep_dims, output shape); axes may repeat and be negative."""
    shape = draw(S.shapes(1, 4, 1, 6))
    rank = len(shape)
    axes = draw(st.lists(st.integers(-rank, rank - 1), min_size=1, max_size=rank + 1))
    if len(axes) == 1 and draw(st.booleans()):
        axes = np.array(axes[0], np.int32)          # a scalar axes tensor
    else:
        axes = np.array(axes, np.int32)
    keep_dims = draw(st.booleans())
    reduced = {int(a) % rank for a in axes.reshape(-1)}
    if keep_dims:
        out = tuple(1 if i in reduced else d for i, d in enumerate(shape))
    else:
        out = tuple(d for i, d in enumerate(shape) if i not in reduced)
    return shape, axes, keep_dims, out


def rounding_floor(op: str, x: np.ndarray, axes) -> float:
    """The scale a float32 SUM's or MEAN's rounding has: its terms' magnitudes, not its result.
    Two runtimes add in different orders (numpy pairwise, LiteRT and the split reductions
    left to right), and a sum that cancels differs by the terms' ulps (seen: SUM of [3] terms
    to -0.0074, 9.7e-8 apart; 0.028 from 60 terms up to 3). 0 for the ops that do not add."""
    if op not in ("SUM", "MEAN"):
        return 0.0
    reduced = tuple(sorted({int(a) % x.ndim for a in np.atleast_1d(axes)}))
    magnitudes = np.abs(x).sum(axis=reduced) if op == "SUM" else np.abs(x).mean(axis=reduced)
    return float(np.max(magnitudes))


def prod_inputs(shape, seed):
    """Float inputs for REDUCE_PROD: magnitudes in [0.7, 1.4] with random signs, so products of
    up to 6^4 terms stay far from float32 overflow and denormals (where LiteRT's float32 loop
    and any other multiplication order part ways)."""
    rng = np.random.default_rng(seed)
    mag = rng.uniform(0.7, 1.4, shape)
    return (np.where(rng.random(shape) < 0.5, -mag, mag)).astype(np.float32)


def any_inputs(shape, seed):
    """Bool inputs with few True values (about one per reduced slice), so ANY is not always True."""
    rng = np.random.default_rng(seed)
    p = rng.choice([0.0, 0.05, 0.2, 0.5])
    return rng.random(shape) < p


# -- REDUCE_ALL ------------------------------------------------------------------------------
def all_inputs(shape, seed):
    """Bool inputs with few False values (about one per reduced slice), so ALL is not always
    False: any_inputs negated."""
    return ~any_inputs(shape, seed)


# -- the delegate's case table ----------------------------------------------------------------
# Each row's strategy draws check_op's (model, inputs[, options]; inputs None: seeded from the
# model). Tolerances are check_delegate's: TAICHI_RTOL (a cancelling float sum: its terms'
# magnitudes, the floor below); quantized outputs within one step.
def _reduce_model(op, case, dtype=np.float32, qi=None, qo=None):
    shape, axes, keep_dims, out = case
    return one_op_model(op, [Input(shape, dtype, qi), Const(axes)], [Output(out, dtype, qo)],
                        keep_dims=keep_dims)


@st.composite
def reduce_float32_cases(draw, op):
    case = draw(reduction())
    model = _reduce_model(op, case)
    inputs = model_inputs(model, draw(S.seeds()))
    # the split reduction and numpy add in different orders: a sum that cancels (0.028 from
    # 60 terms up to 3: seed 55, axes [1, -1, 2]) is held to its terms' magnitudes
    return model, inputs, {"floor": rounding_floor(op, inputs[0], case[1])}


@st.composite
def reduce_int8_cases(draw, op):
    case, qi, qo = draw(reduction()), draw(S.quant_params()), draw(S.quant_params())
    # REDUCE_MAX keeps the input's quantization (LiteRT's constraint); MEAN/SUM rescale.
    qo = qi if op == "REDUCE_MAX" else qo
    return _reduce_model(op, case, np.int8, qi, qo), None, {"seed": draw(S.seeds())}


# REDUCE_MIN, REDUCE_PROD, REDUCE_ANY: the op drawn in one row each (one compile per example).
NEW_REDUCE_OPS = ["REDUCE_MIN", "REDUCE_PROD", "REDUCE_ANY"]


def _new_reduce_inputs(op, shape, seed):
    if op == "REDUCE_ANY":
        return [any_inputs(shape, seed)]
    if op == "REDUCE_PROD":
        return [prod_inputs(shape, seed)]
    return None


@st.composite
def min_prod_any_cases(draw):
    op, case, seed = draw(st.sampled_from(NEW_REDUCE_OPS)), draw(reduction()), draw(S.seeds())
    dtype = np.bool_ if op == "REDUCE_ANY" else np.float32
    return _reduce_model(op, case, dtype), _new_reduce_inputs(op, case[0], seed), {"seed": seed}


@st.composite
def min_prod_int8_cases(draw):
    op, case = draw(st.sampled_from(["REDUCE_MIN", "REDUCE_PROD"])), draw(reduction())
    qi, widen, seed = draw(S.quant_params()), draw(st.floats(1.0, 2.0)), draw(S.seeds())
    # REDUCE_MIN keeps the input's quantization (LiteRT's constraint); REDUCE_PROD's output
    # quantization covers its products (as in the LiteRT test).
    shape, axes, _, _ = case
    x = np.random.default_rng(seed).integers(-128, 128, shape).astype(np.int8)
    qo = qi
    if op == "REDUCE_PROD":
        reduced = tuple(sorted({int(a) % len(shape) for a in axes.reshape(-1)}))
        prods = np.prod((x.astype(np.float64) - qi[1]) * qi[0], axis=reduced)
        lo, hi = min(float(prods.min()), 0.0), max(float(prods.max()), 0.0)
        assume(1e-30 < hi - lo < 1e30)
        scale = float(np.float32((hi - lo) / 240 * widen))
        qo = (scale, int(np.clip(round(-(lo + hi) / 2 / scale), -100, 100)))
    return _reduce_model(op, case, np.int8, qi, qo), [x]


@st.composite
def reduce_all_cases(draw):
    """REDUCE_ALL: bool carried as 0/1, the minimum."""
    case = draw(reduction())
    return _reduce_model("REDUCE_ALL", case, np.bool_), [all_inputs(case[0], draw(S.seeds()))]


REDUCE_ROWS = (
    [Row(f"{op}-float32", reduce_float32_cases(op), "the split reduction's cancelling sums")
     for op in OPS]
    + [Row(f"{op}-int8", reduce_int8_cases(op), "REDUCE_MAX on its input's grid") for op in OPS]
    + [Row("MIN-PROD-ANY", min_prod_any_cases(), "REDUCE_MIN, REDUCE_PROD (float32), REDUCE_ANY"),
       Row("MIN-PROD-int8", min_prod_int8_cases(), "REDUCE_PROD's grid covers its products"),
       Row("REDUCE_ALL", reduce_all_cases())]
)
