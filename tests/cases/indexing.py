"""Cases for GATHER, GATHER_ND, ONE_HOT and CUMSUM: each op's case space, index generators and
one-op model (used by test_ops_indexing.py), and the delegate's case table's rows: one strategy
of check_op cases per op (test_taichi_indexing.py)."""
import numpy as np
from hypothesis import assume, strategies as st
from tflite_taichi.ops.tables import MAX_RUNS, arithmetic_runs
from tflite_taichi.testing import Const, Input, Output, one_op_model, strategies
from cases.table import Row


S = strategies()


# -- GATHER -----------------------------------------------------------------------------------
@st.composite
def gather_case(draw):
    """(params shape, axis option, batch_dims option, indices shape, output shape)."""
    shape = draw(S.shapes(1, 4, 1, 5))
    rank = len(shape)
    axis = draw(st.integers(0, rank - 1))
    batch_dims = draw(st.integers(0, axis))
    extra = draw(S.shapes(0, 2, 1, 4))
    ishape = tuple(shape[:batch_dims]) + extra
    out = tuple(shape[:axis]) + tuple(ishape[batch_dims:]) + tuple(shape[axis + 1:])
    axis_opt = axis - rank if draw(st.booleans()) else axis
    bd_opt = batch_dims - len(ishape) if batch_dims and draw(st.booleans()) else batch_dims
    return shape, axis_opt, bd_opt, ishape, out


def gather_indices(case, seed, dtype=np.int32):
    shape, axis, _, ishape, _ = case
    rng = np.random.default_rng(seed)
    return rng.integers(0, shape[axis % len(shape)], ishape).astype(dtype)


def gather_model(case, indices, const=True, dtype=np.float32, q=None):
    shape, axis, batch_dims, ishape, out = case
    ind = Const(indices) if const else Input(ishape, indices.dtype)
    return one_op_model("GATHER", [Input(shape, dtype, q), ind], [Output(out, dtype, q)],
                        axis=axis, batch_dims=batch_dims)


# -- GATHER_ND --------------------------------------------------------------------------------
@st.composite
def gather_nd_case(draw):
    """(params shape, indices shape, output shape)."""
    shape = draw(S.shapes(1, 4, 1, 5))
    m = draw(st.integers(1, len(shape)))
    batch = draw(S.shapes(0, 2, 1, 4))
    return shape, batch + (m,), batch + tuple(shape[m:])


def gather_nd_indices(case, seed, dtype=np.int32):
    shape, ishape, _ = case
    rng = np.random.default_rng(seed)
    m = ishape[-1]
    return np.stack([rng.integers(0, shape[d], ishape[:-1]) for d in range(m)],
                    axis=-1).astype(dtype)


def gather_nd_model(case, indices, const=True, dtype=np.float32, q=None):
    shape, ishape, out = case
    ind = Const(indices) if const else Input(ishape, indices.dtype)
    return one_op_model("GATHER_ND", [Input(shape, dtype, q), ind], [Output(out, dtype, q)])


# -- ONE_HOT ----------------------------------------------------------------------------------
@st.composite
def one_hot_case(draw):
    """(indices shape, depth, axis option, output shape)."""
    ishape = draw(S.shapes(0, 3, 1, 4))
    depth = draw(st.integers(1, 6))
    axis = draw(st.integers(-1, len(ishape)))
    at = len(ishape) if axis == -1 else axis
    return ishape, depth, axis, tuple(ishape[:at]) + (depth,) + tuple(ishape[at:])


def one_hot_indices(case, seed):
    """In [-1, depth]: out-of-range entries give a row of off_value."""
    ishape, depth = case[0], case[1]
    return np.random.default_rng(seed).integers(-1, depth + 1, ishape).astype(np.int32)


# -- CUMSUM -----------------------------------------------------------------------------------
@st.composite
def cumsum_case(draw):
    """(shape, axis tensor, exclusive, reverse)."""
    shape = draw(S.shapes(1, 4, 1, 6))
    axis = draw(st.integers(-len(shape), len(shape) - 1))
    axis = np.array(axis if draw(st.booleans()) else [axis], np.int32)
    return shape, axis, draw(st.booleans()), draw(st.booleans())


def cumsum_model(case, dtype=np.float32, q=None, qo=None, const_axis=True):
    shape, axis, exclusive, reverse = case
    ax = Const(axis) if const_axis else Input(axis.shape, np.int32)
    return one_op_model("CUMSUM", [Input(shape, dtype, q), ax], [Output(shape, dtype, qo or q)],
                        exclusive=exclusive, reverse=reverse)


# -- the delegate's case table ----------------------------------------------------------------
# Each row's strategy draws check_op's cases; float32 and int8 drawn inside a row. Tolerances are
# check_delegate's: TAICHI_RTOL; quantized outputs within one quantization step.
DTYPES = [np.float32, np.int8]


@st.composite
def gather_delegate_matches_reference_cases(draw):
    case = draw(gather_case())
    dtype = draw(st.sampled_from(DTYPES))
    q = draw(S.quant_params())
    seed = draw(S.seeds())
    indices = gather_indices(case, seed)
    # tables of more than MAX_RUNS runs stay on the CPU, by design (test_taichi_indexing.py): seen with 144
    # random indices, a case the strategy draws now and then
    assume(arithmetic_runs(indices) is not None)
    model = gather_model(case, indices, True, dtype, q if dtype == np.int8 else None)
    return model, None, {"seed": seed}


@st.composite
def gather_nd_delegate_matches_reference_cases(draw):
    case = draw(gather_nd_case())
    dtype = draw(st.sampled_from(DTYPES))
    q = draw(S.quant_params())
    seed = draw(S.seeds())
    indices = gather_nd_indices(case, seed)
    assume(indices.size // max(indices.shape[-1], 1) <= MAX_RUNS)   # its offsets fit a run table
    model = gather_nd_model(case, indices, True, dtype, q if dtype == np.int8 else None)
    return model, None, {"seed": seed}


@st.composite
def one_hot_delegate_matches_reference_cases(draw):
    case = draw(one_hot_case())
    on_const = draw(st.booleans())
    values = draw(st.lists(st.floats(-5, 5, width=32),
       min_size=2, max_size=2))
    seed = draw(S.seeds())
    ishape, depth, axis, out = case
    on, off = (np.array(v, np.float32) for v in values)
    assume(arithmetic_runs(one_hot_indices(case, seed)) is not None)     # else on the CPU, by design
    model = one_op_model("ONE_HOT", [Const(one_hot_indices(case, seed)),
                                     Const(np.array(depth, np.int32)),
                                     Const(on) if on_const else Input(()), Input(())],
                         [Output(out)], axis=axis)
    return model, [off] if on_const else [on, off]


@st.composite
def cumsum_delegate_matches_reference_cases(draw):
    case = draw(cumsum_case())
    dtype = draw(st.sampled_from(DTYPES))
    qi = draw(S.quant_params())
    qo = draw(S.quant_params(scale_range=(0.02, 0.5)))
    seed = draw(S.seeds())
    int8 = dtype == np.int8
    model = cumsum_model(case, dtype, qi if int8 else None, qo if int8 else None)
    return model, None, {"seed": seed}


INDEXING_ROWS = [
    Row("GATHER", gather_delegate_matches_reference_cases(), "constant indices; float32, int8"),
    Row("GATHER_ND", gather_nd_delegate_matches_reference_cases(), "constant indices; float32, int8"),
    Row("ONE_HOT", one_hot_delegate_matches_reference_cases(), "on value a constant or an input"),
    Row("CUMSUM", cumsum_delegate_matches_reference_cases(), "constant axis; float32, int8"),
]
