"""Cases for the layout ops: each op's case space (TILE, BROADCAST_TO, REVERSE_V2, MIRROR_PAD,
the block ops, MATRIX_SET_DIAG, REVERSE_SEQUENCE; used by test_ops_layout.py), and the
delegate's case table's rows: one strategy of check_op cases per op, each drawing float32, int8
(the output on its own grid) or bool (test_taichi_layout.py)."""
import numpy as np
from hypothesis import strategies as st
from tflite_taichi.testing import Const, Input, Output, one_op_model, strategies
from cases.table import Row


S = strategies()


# -- TILE -------------------------------------------------------------------------------------
@st.composite
def tile_case(draw, max_multiple=3, min_multiple=1):
    shape = draw(S.shapes(0, 4, 1, 4))
    multiples = [draw(st.integers(min_multiple, max_multiple)) for _ in shape]
    return shape, multiples, tuple(d * m for d, m in zip(shape, multiples))


# -- BROADCAST_TO -----------------------------------------------------------------------------
@st.composite
def broadcast_case(draw):
    """An input shape and a target it broadcasts to (extra leading dims, size-1 dims)."""
    target = draw(S.shapes(0, 5, 1, 4))
    rank = draw(st.integers(0, len(target)))
    shape = tuple(1 if draw(st.booleans()) else n for n in target[len(target) - rank:])
    return shape, target


# -- REVERSE_V2 -------------------------------------------------------------------------------
@st.composite
def reverse_case(draw, contiguous=True):
    """A shape and axes to reverse: a contiguous run (what LiteRT takes) in any order, maybe
    negative; or (contiguous=False) any distinct set, maybe empty."""
    shape = draw(S.shapes(1, 5, 1, 4))
    rank = len(shape)
    if contiguous:
        lo = draw(st.integers(0, rank - 1))
        axes = list(range(lo, draw(st.integers(lo + 1, rank))))
    else:
        axes = draw(st.lists(st.integers(0, rank - 1), unique=True, max_size=rank))
    axes = draw(st.permutations(axes))
    return shape, [a - rank if draw(st.booleans()) else a for a in axes]


# -- MIRROR_PAD -------------------------------------------------------------------------------
@st.composite
def mirror_pad_case(draw):
    """(shape, paddings, mode, output shape): every padding within what the mode allows
    (REFLECT: size - 1, SYMMETRIC: size), often at that limit."""
    mode = draw(st.sampled_from(["REFLECT", "SYMMETRIC"]))
    offset = 1 if mode == "REFLECT" else 0
    shape = draw(S.shapes(1, 4, 1, 5))
    pads = []
    for n in shape:
        most = n - offset
        pads.append([draw(st.integers(0, most) | st.just(most)) for _ in range(2)])
    out = tuple(n + lo + hi for n, (lo, hi) in zip(shape, pads))
    return shape, np.array(pads, np.int32), mode, out


@st.composite
def block_case(draw, litert=True):
    """(block shape, per spatial dim (before, after), input shape of SPACE_TO_BATCH_ND, its
    output shape). litert: rank 3 or 4 with M = rank - 2 (LiteRT's kernels); else any
    M >= 1 spatial dims and 0..2 remaining dims."""
    if litert:
        m = draw(st.integers(1, 2))
        rest = 1
    else:
        m = draw(st.integers(1, 3))
        rest = draw(st.integers(0, 2))
    block = [draw(st.integers(1, 3)) for _ in range(m)]
    batch = draw(st.integers(1, 2))
    spatial, pads, out_spatial = [], [], []
    for b in block:
        q = draw(st.integers(1, 3))
        total = q * b
        lo = draw(st.integers(0, min(total - 1, 3)))
        hi = draw(st.integers(0, min(total - 1 - lo, 3)))
        spatial.append(total - lo - hi)
        pads.append([lo, hi])
        out_spatial.append(q)
    tail = tuple(draw(st.integers(1, 3)) for _ in range(rest))
    shape = (batch,) + tuple(spatial) + tail
    out = (batch * int(np.prod(block)),) + tuple(out_spatial) + tail
    return block, pads, shape, out


@st.composite
def set_diag_case(draw):
    """(input shape [..., M, N], diagonal shape [..., min(M, N)])."""
    shape = draw(S.shapes(2, 4, 1, 5))
    return shape, tuple(shape[:-2]) + (min(shape[-2:]),)


@st.composite
def reverse_sequence_case(draw):
    """(shape, seq_dim, batch_dim, lengths): rank 2 to 4, lengths in [0, the seq_dim's size]."""
    shape = draw(S.shapes(2, 4, 1, 5))
    seq, batch = draw(st.permutations(range(len(shape))))[:2]
    lengths = [draw(st.integers(0, shape[seq])) for _ in range(shape[batch])]
    return shape, seq, batch, lengths


# -- the delegate's case table ----------------------------------------------------------------
# Each row's strategy draws check_op's (model, None, {"seed"}): inputs seeded from the model.
# Tolerances are check_delegate's for every row (TAICHI_RTOL; int8: one unit): these ops move
# values, so only a quantized output's snap onto its own grid can differ.
@st.composite
def types(draw, dtypes=("float32", "int8", "bool")):
    """(numpy type, input quantization, output quantization); int8 outputs get their own grid."""
    dtype = draw(st.sampled_from(dtypes))
    if dtype == "int8":
        return np.int8, draw(S.quant_params()), draw(S.quant_params())
    return (np.bool_ if dtype == "bool" else np.float32), None, None


def _i32(values):
    return Const(np.array(values, np.int32))


# -- affine gathers: TILE, BROADCAST_TO, REVERSE_V2 -------------------------------------------
@st.composite
def gather_model(draw, op):
    t, qi, qo = draw(types())
    if op == "TILE":
        shape, multiples, out = draw(tile_case())
        return one_op_model("TILE", [Input(shape, t, qi), _i32(multiples)], [Output(out, t, qo)])
    if op == "BROADCAST_TO":
        shape, target = draw(broadcast_case())
        return one_op_model("BROADCAST_TO", [Input(shape, t, qi), _i32(target)],
                            [Output(target, t, qo)], version=2)
    shape, axes = draw(reverse_case(contiguous=False))
    return one_op_model("REVERSE_V2", [Input(shape, t, qi), _i32(axes)], [Output(shape, t, qo)])


@st.composite
def gathers_delegate_cases(draw, op):
    seed = draw(S.seeds())
    return draw(gather_model(op)), None, {"seed": seed}


# -- MIRROR_PAD -------------------------------------------------------------------------------
@st.composite
def mirror_pad_delegate_cases(draw):
    case = draw(mirror_pad_case())
    seed = draw(S.seeds())
    shape, pads, mode, out = case
    t, qi, qo = draw(types())
    model = one_op_model("MIRROR_PAD", [Input(shape, t, qi), Const(pads)], [Output(out, t, qo)],
                         mode=mode)
    return model, None, {"seed": seed}


# -- SPACE_TO_BATCH_ND, BATCH_TO_SPACE_ND -----------------------------------------------------
@st.composite
def block_ops_delegate_cases(draw, op):
    case = draw(block_case(litert=False))
    seed = draw(S.seeds())
    block, pads, shape, out = case
    if op == "BATCH_TO_SPACE_ND":
        shape, out = out, shape
    t, qi, qo = draw(types())
    model = one_op_model(op, [Input(shape, t, qi), _i32(block), _i32(pads)], [Output(out, t, qo)])
    return model, None, {"seed": seed}


# -- FILL, ZEROS_LIKE -------------------------------------------------------------------------
@st.composite
def fill_and_zeros_like_delegate_cases(draw, op):
    shape = draw(S.shapes(0, 4, 1, 5))
    seed = draw(S.seeds())
    t, qi, qo = draw(types())
    if op == "FILL":
        model = one_op_model("FILL", [_i32(shape), Input((), t, qi)], [Output(shape, t, qo)])
    else:
        model = one_op_model("ZEROS_LIKE", [Input(shape, t, qi)], [Output(shape, t, qo)])
    return model, None, {"seed": seed}


# -- MATRIX_DIAG, MATRIX_SET_DIAG, REVERSE_SEQUENCE -------------------------------------------
@st.composite
def diag_or_sequence_model(draw, op):
    """A one-op model of `op` in a drawn type; int8 inputs and output on their own grids."""
    t, qi, qo = draw(types())
    if op == "MATRIX_DIAG":
        shape = draw(S.shapes(1, 3, 1, 5))
        return one_op_model(op, [Input(shape, t, qi)], [Output(shape + (shape[-1],), t, qo)])
    if op == "MATRIX_SET_DIAG":
        shape, diag_shape = draw(set_diag_case())
        qd = draw(S.quant_params()) if qi is not None else None
        return one_op_model(op, [Input(shape, t, qi), Input(diag_shape, t, qd)],
                            [Output(shape, t, qo)])
    shape, seq, batch, lengths = draw(reverse_sequence_case())
    return one_op_model(op, [Input(shape, t, qi), _i32(lengths)], [Output(shape, t, qo)],
                        seq_dim=seq, batch_dim=batch)


@st.composite
def diag_and_reverse_sequence_delegate_cases(draw):
    op = draw(st.sampled_from(["MATRIX_DIAG", "MATRIX_SET_DIAG", "REVERSE_SEQUENCE"]))
    seed = draw(S.seeds())
    return draw(diag_or_sequence_model(op)), None, {"seed": seed}


LAYOUT_ROWS = (
    [Row(op, gathers_delegate_cases(op)) for op in ["TILE", "BROADCAST_TO", "REVERSE_V2"]]
    + [Row("MIRROR_PAD", mirror_pad_delegate_cases(), "both modes, paddings up to what each allows")]
    + [Row(op, block_ops_delegate_cases(op),
           "any number of spatial and remaining dims; SPACE_TO_BATCH_ND pads with the real 0 (an "
           "int8 output's zero point), BATCH_TO_SPACE_ND takes the paddings as crops")
       for op in ["SPACE_TO_BATCH_ND", "BATCH_TO_SPACE_ND"]]
    + [Row(op, fill_and_zeros_like_delegate_cases(op),
           "FILL's value a run-time scalar (a constant one is folded at prepare); an int8 output "
           "with its own grid snaps it (ZEROS_LIKE: to its zero point)")
       for op in ["FILL", "ZEROS_LIKE"]]
    + [Row("MATRIX_DIAG-MATRIX_SET_DIAG-REVERSE_SEQUENCE", diag_and_reverse_sequence_delegate_cases(),
           "the op drawn in each example; constant seq_lengths")]
)
