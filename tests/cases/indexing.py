"""Cases for indexing ops shared by the tests (moved from test_ops_indexing.py): hypothesis
strategies, one-op model builders and their helpers, used by test_ops_indexing.py and the
delegate's tests."""
import numpy as np
from hypothesis import strategies as st
from tflite_taichi.testing import Const, Input, Output, one_op_model, strategies


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
