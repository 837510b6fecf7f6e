"""Cases for matmul ops shared by the tests (moved from test_ops_matmul.py): hypothesis
strategies, one-op model builders and their helpers, used by test_ops_matmul.py and the
delegate's tests."""
import numpy as np
from hypothesis import strategies as st
from tflite_taichi.testing import Const, Input, Output, one_op_model


@st.composite
def matmul_case(draw, max_side=5, max_rank=5):
    """(lhs shape, rhs shape, adj_x, adj_y, output shape): ranks 2 to 5, batch dimensions that
    broadcast (size 1 or missing on either side)."""
    out_rank = draw(st.integers(2, max_rank))
    batch = draw(st.lists(st.integers(1, 3), min_size=out_rank - 2, max_size=out_rank - 2))
    m, k, n = (draw(st.integers(1, max_side)) for _ in range(3))

    def operand_batch():
        rank = draw(st.integers(0, len(batch)))
        own = batch[len(batch) - rank:]
        return [d if draw(st.booleans()) else 1 for d in own]

    lb, rb = operand_batch(), operand_batch()
    adj_x, adj_y = draw(st.booleans()), draw(st.booleans())
    lhs = tuple(lb) + ((k, m) if adj_x else (m, k))
    rhs = tuple(rb) + ((n, k) if adj_y else (k, n))
    out = tuple(int(d) for d in np.broadcast_shapes(tuple(lb), tuple(rb))) + (m, n)
    return lhs, rhs, adj_x, adj_y, out


def matmul_model(case, dtype=np.float32, qs=(None, None, None), rhs_const=None,
                 out_dtype=None):
    """A one-op model; `rhs_const` (the RHS as stored) makes the RHS a constant."""
    lhs, rhs, adj_x, adj_y, out = case
    ql, qr, qo = qs
    rhs_spec = Input(rhs, dtype, qr) if rhs_const is None else Const(rhs_const, qr)
    return one_op_model("BATCH_MATMUL", [Input(lhs, dtype, ql), rhs_spec],
                        [Output(out, out_dtype or dtype, qo)], adj_x=adj_x, adj_y=adj_y)


def output_scale(case, sl, sr, widen, qmax=127):
    """An output scale covering the sums of products of the operands' ranges (as calibrated);
    `widen` < 1 lets large sums saturate."""
    k = case[0][-2] if case[2] else case[0][-1]
    return float(np.float32(k * (qmax + 1) * sl * (qmax + 1) * sr / qmax * widen))


# -- hybrid: float32 LHS x int8 constant RHS ---------------------------------------------------
def _hybrid(case, seed, asymmetric=False, scale=0.02):
    w = np.random.default_rng(seed).integers(-127, 128, case[1]).astype(np.int8)
    lhs, rhs, adj_x, adj_y, out = case
    model = one_op_model("BATCH_MATMUL", [Input(lhs), Const(w, (scale, 0))], [Output(out)],
                         adj_x=adj_x, adj_y=adj_y, asymmetric_quantize_inputs=asymmetric)
    return model, w
