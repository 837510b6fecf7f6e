"""Cases for scatter ops shared by the tests (moved from test_ops_scatter.py): hypothesis
strategies, one-op model builders and their helpers, used by test_ops_scatter.py and the
delegate's tests."""
import numpy as np
from hypothesis import strategies as st
from tflite_taichi.builder import ModelBuilder
from tflite_taichi.testing import Const, Input, Output, one_op_model, quantize_array, strategies


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
