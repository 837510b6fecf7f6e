"""Cases for layout ops shared by the tests (moved from test_ops_layout.py): hypothesis
strategies, one-op model builders and their helpers, used by test_ops_layout.py and the
delegate's tests."""
import numpy as np
from hypothesis import strategies as st
from tflite_taichi.testing import strategies


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
