"""Cases for BATCH_MATMUL: its case space (adj_x / adj_y, broadcast batch dims), the one-op
model, an output scale that fits the products, a hybrid (int8 weights, float activations) model
(used by test_ops_matmul.py), and the delegate's case table's rows: one strategy of check_op
cases per dtype (test_taichi_matmul.py)."""
import numpy as np
from hypothesis import strategies as st
from tflite_taichi.testing import Const, Input, Output, one_op_model, strategies
from cases.table import Row

S = strategies()


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


# -- the delegate's case table ----------------------------------------------------------------
# Each row's strategy draws check_op's (model, None, {"seed"}): inputs seeded from the model.
# Tolerances are check_delegate's: TAICHI_RTOL; quantized outputs within one step.
@st.composite
def float32_delegate_matches_reference_cases(draw):
    case = draw(matmul_case())
    const = draw(st.booleans())
    seed = draw(S.seeds())
    rhs = (np.random.default_rng(seed).uniform(-3, 3, case[1]).astype(np.float32)
           if const else None)
    return matmul_model(case, rhs_const=rhs), None, {"seed": seed}


@st.composite
def int8_delegate_matches_reference_cases(draw):
    case = draw(matmul_case())
    const = draw(st.sampled_from(["input", "int8", "hybrid"]))
    ql = draw(S.quant_params())
    qr = draw(S.quant_params())
    zo = draw(st.integers(-20, 20))
    widen = draw(st.floats(0.05, 1.0))
    seed = draw(S.seeds())
    if const == "hybrid":
        model = _hybrid(case, seed)[0]
    else:
        qo = (output_scale(case, ql[0], qr[0], widen), zo)
        rhs = (np.random.default_rng(seed).integers(-128, 128, case[1]).astype(np.int8)
               if const == "int8" else None)
        model = matmul_model(case, np.int8, (ql, qr, qo), rhs)
    return model, None, {"seed": seed}


MATMUL_ROWS = [
    Row("BATCH_MATMUL-float32", float32_delegate_matches_reference_cases(),
        "run-time or constant RHS (packed for the kernel)"),
    Row("BATCH_MATMUL-int8", int8_delegate_matches_reference_cases(),
        "RHS a run-time input, an int8 constant, or hybrid (int8 weights, float activations)"),
]
