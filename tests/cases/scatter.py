"""Cases for EMBEDDING_LOOKUP, SCATTER_ND, SEGMENT_SUM and UNSORTED_SEGMENT_SUM: each op's case
space, data and one-op model, token ids and an embedding text classifier (used by
test_ops_scatter.py), and the delegate's case table's rows: one strategy of check_op cases per op
(test_taichi_scatter.py)."""
import numpy as np
from hypothesis import assume, strategies as st
from tflite_taichi.builder import ModelBuilder
from tflite_taichi.testing import Const, Input, Output, one_op_model, quantize_array, strategies
from cases.table import Row


S = strategies()


I32 = np.int32


def _rng(seed):
    return np.random.default_rng(seed)


# -- EMBEDDING_LOOKUP -------------------------------------------------------------------------
@st.composite
def embedding_case(draw):
    """(number of ids, table shape [V, ...] of rank 2 to 4)."""
    rows = draw(st.integers(1, 7))
    return draw(st.integers(1, 8)), (rows,) + draw(S.shapes(1, 3, 1, 5))


def embedding_model(n, table_shape, table=None, ids=None, table_q=None, out_dtype=np.float32,
                    out_q=None, table_dtype=np.float32):
    ids_spec = Input((n,), I32) if ids is None else Const(np.asarray(ids, I32))
    table_spec = (Input(table_shape, table_dtype, table_q) if table is None
                  else Const(table, quantization=table_q))
    return one_op_model("EMBEDDING_LOOKUP", [ids_spec, table_spec],
                        [Output((n,) + tuple(table_shape[1:]), out_dtype, out_q)])


# -- SCATTER_ND -------------------------------------------------------------------------------
@st.composite
def scatter_case(draw):
    """(output shape, index rows K, index length M); K up to 7 rows, duplicates likely."""
    shape = draw(S.shapes(1, 3, 1, 5))
    m = draw(st.integers(1, len(shape)))
    outer = draw(S.shapes(1, 2, 1, 4))
    return shape, outer, m


def scatter_model(shape, outer, m, updates_dtype=np.float32, q=None, indices=None, updates=None):
    indices_spec = (Input(tuple(outer) + (m,), I32) if indices is None
                    else Const(np.asarray(indices, I32)))
    u_shape = tuple(outer) + tuple(shape[m:])
    updates_spec = (Input(u_shape, updates_dtype, q) if updates is None
                    else Const(updates, quantization=q))
    return one_op_model("SCATTER_ND", [indices_spec, updates_spec, Const(np.array(shape, I32))],
                        [Output(shape, updates_dtype, q)])


def _scatter_data(rng, shape, outer, m, dtype=np.float32, unique=False):
    cells = int(np.prod(shape[:m]))
    k = int(np.prod(outer))
    flat = (rng.permutation(cells)[:k] if unique and k <= cells
            else rng.integers(0, cells, k))
    indices = np.stack(np.unravel_index(flat, shape[:m]), axis=-1).reshape(tuple(outer) + (m,))
    u_shape = tuple(outer) + tuple(shape[m:])
    if np.dtype(dtype) == np.float32:
        updates = rng.uniform(-3, 3, u_shape).astype(np.float32)
    else:
        updates = rng.integers(-100, 101, u_shape).astype(dtype)
    return indices.astype(I32), updates


# -- SEGMENT_SUM ------------------------------------------------------------------------------
@st.composite
def sorted_segment_ids(draw, max_rows=8):
    steps = draw(st.lists(st.integers(0, 1), min_size=0, max_size=max_rows - 1))
    return np.concatenate([[0], np.cumsum(steps)]).astype(I32)


def segment_sum_model(data_shape, ids=None, dtype=np.float32, q=None, rows=None):
    ids_spec = Input((data_shape[0],), I32) if ids is None else Const(np.asarray(ids, I32))
    rows = rows if rows is not None else data_shape[0]
    return one_op_model("SEGMENT_SUM", [Input(data_shape, dtype, q), ids_spec],
                        [Output((rows,) + tuple(data_shape[1:]), dtype, q)])


# -- UNSORTED_SEGMENT_SUM ---------------------------------------------------------------------
@st.composite
def unsorted_case(draw):
    """(data shape, ids rank, num_segments)."""
    shape = draw(S.shapes(1, 4, 1, 4))
    return shape, draw(st.integers(1, len(shape))), draw(st.integers(1, 6))


def unsorted_model(data_shape, ids_shape, n, dtype=np.float32, q=None, ids=None,
                   n_shape=(1,)):
    ids_spec = Input(tuple(ids_shape), I32) if ids is None else Const(np.asarray(ids, I32))
    out = (n,) + tuple(data_shape[len(ids_shape):])
    return one_op_model("UNSORTED_SEGMENT_SUM",
                        [Input(data_shape, dtype, q), ids_spec,
                         Const(np.array(n, I32).reshape(n_shape))], [Output(out, dtype, q)])


# -- a text classifier: embedding -> mean over the sequence -> dense -> softmax ---------------
VOCAB, DIM, CLASSES, TOKENS = 50, 8, 4, 12


def int8_grid(lo, hi):
    """(scale, zero point) of an int8 tensor spanning [lo, hi], as the converter picks them."""
    scale = (hi - lo) / 255.0
    return scale, int(round(-128 - lo / scale))


LOGITS_Q = int8_grid(-4.0, 4.0)


def text_classifier(kind: str, seed: int = 0) -> bytes:
    """ids [TOKENS] -> EMBEDDING_LOOKUP -> MEAN over tokens -> FULLY_CONNECTED -> SOFTMAX.
    kind: 'float'; 'hybrid' (an int8 table with one scale per row, read into float32, the rest
    float, as the converter's dynamic-range mode writes an embedding); 'int8' (everything int8,
    as full-integer quantization writes it: table and lookup share a grid, int32 bias,
    SOFTMAX's output on 1/256 with zero point -128)."""
    rng = _rng(seed)
    table = rng.normal(0, 1, (VOCAB, DIM)).astype(np.float32)
    weights = rng.normal(0, 0.5, (CLASSES, DIM)).astype(np.float32)
    bias = rng.normal(0, 0.1, CLASSES).astype(np.float32)
    b = ModelBuilder()
    g = b.subgraph()
    ids = g.input("ids", (TOKENS,), I32)
    axis = g.const("axis", np.array([0], I32))
    if kind == "int8":
        t_q, m_q, l_q = int8_grid(-3.5, 3.5), int8_grid(-1.5, 1.5), LOGITS_Q
        w_scale = float(np.abs(weights).max() / 127)
        table_t = g.const("table", quantize_array(table, t_q), quantization=t_q)
        emb = g.tensor("embedded", (TOKENS, DIM), np.int8, t_q)
        mean = g.tensor("pooled", (1, DIM), np.int8, m_q)
        w = g.const("dense/w", quantize_array(weights, (w_scale, 0)), quantization=(w_scale, 0))
        bias_scale = np.float32(m_q[0]) * np.float32(w_scale)
        bias_t = g.const("dense/b", np.round(bias / bias_scale).astype(I32),
                         quantization=(float(bias_scale), 0))
        logits = g.tensor("logits", (1, CLASSES), np.int8, l_q)
        probs = g.tensor("probs", (1, CLASSES), np.int8, (1 / 256, -128))
    else:
        if kind == "hybrid":
            scales = (np.abs(table).max(axis=1) / 127).astype(np.float32)
            tq = (scales, np.zeros(VOCAB, np.int64), 0)
            table_t = g.const("table", np.round(table / scales[:, None]).astype(np.int8),
                              quantization=tq)
        else:
            table_t = g.const("table", table)
        emb = g.tensor("embedded", (TOKENS, DIM))
        mean = g.tensor("pooled", (1, DIM))
        w = g.const("dense/w", weights)
        bias_t = g.const("dense/b", bias)
        logits = g.tensor("logits", (1, CLASSES))
        probs = g.tensor("probs", (1, CLASSES))
    g.op("EMBEDDING_LOOKUP", [ids, table_t], [emb])
    g.op("MEAN", [emb, axis], [mean], keep_dims=True)
    g.op("FULLY_CONNECTED", [mean, w, bias_t], [logits])
    g.op("SOFTMAX", [logits], [probs], beta=1.0)
    g.output(probs)
    return b.finish()


def token_ids(seed: int) -> np.ndarray:
    return _rng(seed).integers(0, VOCAB, TOKENS).astype(I32)


# -- the delegate's case table ----------------------------------------------------------------
# Each row's strategy draws check_op's (model, inputs). Every op is a gather that sums in the
# reference's order: check_delegate's TAICHI_RTOL holds, duplicates included.
def _rng(seed):
    return np.random.default_rng(seed)


@st.composite
def embedding_delegate_matches_reference_cases(draw):
    case = draw(embedding_case())
    kind = draw(st.sampled_from(["float", "per_row_int8", "int8_out", "runtime_table"]))
    seed = draw(S.seeds())
    n, shape = case
    rng = _rng(seed)
    ids = rng.integers(0, shape[0], n).astype(I32)
    table = rng.uniform(-3, 3, shape).astype(np.float32)
    codes = rng.integers(-128, 128, shape).astype(np.int8)
    if kind == "float":
        model, inputs = embedding_model(n, shape, table), [ids]
    elif kind == "per_row_int8":
        scales = rng.uniform(0.01, 0.5, shape[0]).astype(np.float32)
        model = embedding_model(n, shape, codes, table_q=(scales, np.zeros(shape[0], np.int64), 0))
        inputs = [ids]
    elif kind == "int8_out":
        q = (0.05, 7)
        model = embedding_model(n, shape, codes, table_q=q, out_dtype=np.int8, out_q=q)
        inputs = [ids]
    else:
        model, inputs = embedding_model(n, shape, ids=ids), [table]
    return model, inputs


@st.composite
def scatter_nd_delegate_matches_reference_cases(draw):
    case = draw(scatter_case())
    const_indices = draw(st.booleans())
    int8 = draw(st.booleans())
    seed = draw(S.seeds())
    shape, outer, m = case
    rng = _rng(seed)
    indices, updates = _scatter_data(rng, shape, outer, m)
    q = (0.05, -3) if int8 else None
    if int8:
        updates = rng.integers(-128, 128, updates.shape).astype(np.int8)
    model = scatter_model(shape, outer, m, np.int8 if int8 else np.float32, q,
                          indices=indices if const_indices else None)
    return model, ([] if const_indices else [indices]) + [updates]


@st.composite
def segment_sum_delegate_matches_reference_cases(draw):
    ids = draw(sorted_segment_ids())
    inner = draw(S.shapes(0, 2, 1, 4))
    seed = draw(S.seeds())
    shape = (ids.size,) + tuple(inner)
    data = _rng(seed).uniform(-3, 3, shape).astype(np.float32)
    return segment_sum_model(shape, ids, rows=int(ids[-1]) + 1), [data]


@st.composite
def unsorted_segment_sum_delegate_matches_reference_cases(draw):
    case = draw(unsorted_case())
    const_ids = draw(st.booleans())
    seed = draw(S.seeds())
    shape, ids_rank, n = case
    rng = _rng(seed)
    ids = rng.integers(-2, n, shape[:ids_rank]).astype(I32)
    data = rng.uniform(-3, 3, shape).astype(np.float32)
    assume(int(np.prod(shape[ids_rank:])) * n > 0)
    model = unsorted_model(shape, ids.shape, n, ids=ids if const_ids else None)
    return model, [data] + ([] if const_ids else [ids])


SCATTER_ROWS = [
    Row("EMBEDDING_LOOKUP", embedding_delegate_matches_reference_cases(),
        "run-time ids into a constant table (float32; int8 with a scale per row read into float; "
        "int8 into int8), or constant ids into a run-time table"),
    Row("SCATTER_ND", scatter_nd_delegate_matches_reference_cases(),
        "duplicate rows add in row order on both paths; int8: the float view on both"),
    Row("SEGMENT_SUM", segment_sum_delegate_matches_reference_cases(),
        "constant ids (run-time ones make the shape data-dependent: the CPU's)"),
    Row("UNSORTED_SEGMENT_SUM", unsorted_segment_sum_delegate_matches_reference_cases(),
        "ids a constant or an input, negative ids dropped"),
]
