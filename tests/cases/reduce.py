"""Cases for reduce ops shared by the tests (moved from test_ops_reduce.py): hypothesis
strategies, one-op model builders and their helpers, used by test_ops_reduce.py and the
delegate's tests."""
import numpy as np
from hypothesis import strategies as st
from tflite_taichi.testing import strategies


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
