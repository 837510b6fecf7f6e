"""Cases for MediaPipe's CUSTOM:MaxPoolingWithArgmax2D and CUSTOM:MaxUnpooling2D: their case
spaces (every stride, padding and activation), data with ties, indices inside each window, the
one-op models and a pool -> unpool chain (used by test_ops_mediapipe.py), and the delegate's case
table's rows: one strategy of check_op cases per op (test_taichi_mediapipe.py)."""
import numpy as np
from hypothesis import strategies as st
from tflite_taichi.builder import ModelBuilder
from tflite_taichi.ops.mediapipe import pool_params_bytes
from tflite_taichi.testing import Input, Output, one_op_model, strategies
from cases.table import Row

S = strategies()


POOL = "CUSTOM:MaxPoolingWithArgmax2D"


UNPOOL = "CUSTOM:MaxUnpooling2D"


PADDINGS = st.sampled_from(["SAME", "VALID"])


INDEX_DTYPES = {"float32": (np.float32, None), "int32": (np.int32, None),
                "int32_q": (np.int32, (1.0, 0))}


def pool_out_size(padding, size, f, s):
    return -(-size // s) if padding == "SAME" else (size - f + s) // s


@st.composite
def pool_case(draw, xnnpack=False):
    """Pooling geometry; XNNPACK needs stride == filter. With `xnnpack`, padding before may be
    non-zero (see the module docstring)."""
    padding = draw(PADDINGS)
    f = (draw(st.integers(1, 4)), draw(st.integers(1, 4)))
    s = f if xnnpack else (draw(st.integers(1, 4)), draw(st.integers(1, 4)))
    size = tuple(draw(st.integers(ff if padding == "VALID" else 1, 9)) for ff in f)
    n, c = draw(st.integers(1, 2)), draw(st.integers(1, 5))
    out = tuple(pool_out_size(padding, sz, ff, ss) for sz, ff, ss in zip(size, f, s))
    act = 0 if xnnpack else draw(st.integers(0, 6))
    return dict(padding=padding, f=f, s=s, in_shape=(n, *size, c), out_shape=(n, *out, c),
                act=act)


def pool_model(case, index_dtype="float32"):
    dtype, q = INDEX_DTYPES[index_dtype]
    return one_op_model(POOL, [Input(case["in_shape"])],
                        [Output(case["out_shape"]), Output(case["out_shape"], dtype, q)],
                        custom_options=pool_params_bytes(case["padding"], case["s"], case["f"],
                                                         case["act"]))


def unpool_model(in_shape, f, s, padding="VALID", act=0, index_dtype="float32"):
    dtype, q = INDEX_DTYPES[index_dtype]
    out_shape = (in_shape[0], in_shape[1] * f[0], in_shape[2] * f[1], in_shape[3])
    return one_op_model(UNPOOL, [Input(in_shape), Input(in_shape, dtype, q)], [Output(out_shape)],
                        custom_options=pool_params_bytes(padding, s, f, act))


def chain_model(case):
    """MaxPoolingWithArgmax2D -> MaxUnpooling2D (VALID: XNNPACK's unpooling takes no other)."""
    n, oh, ow, c = case["out_shape"]
    b = ModelBuilder()
    g = b.subgraph()
    x = g.input("x", case["in_shape"])
    v, i = g.tensor("values", case["out_shape"]), g.tensor("indices", case["out_shape"])
    y = g.tensor("y", (n, oh * case["f"][0], ow * case["f"][1], c))
    g.op(POOL, [x], [v, i], custom_options=pool_params_bytes(case["padding"], case["s"], case["f"]))
    g.op(UNPOOL, [v, i], [y], custom_options=pool_params_bytes("VALID", case["s"], case["f"]))
    g.output(y)
    return b.finish()


def _data(rng, shape, ties=False):
    if ties:     # few distinct values: ties inside windows
        return (rng.integers(-3, 4, shape) / 2).astype(np.float32)
    return rng.standard_normal(shape).astype(np.float32)


# -- MaxUnpooling2D ---------------------------------------------------------------------------
@st.composite
def unpool_case(draw, xnnpack=False):
    f = (draw(st.integers(1, 4)), draw(st.integers(1, 4)))
    s = f if xnnpack else (draw(st.integers(1, 5)), draw(st.integers(1, 5)))
    shape = (draw(st.integers(1, 2)), draw(st.integers(1, 6)), draw(st.integers(1, 6)),
             draw(st.integers(1, 4)))
    return dict(f=f, s=s, in_shape=shape,
                padding="VALID" if xnnpack else draw(PADDINGS),
                act=0 if xnnpack else draw(st.integers(0, 6)))


def _window_indices(rng, case):
    return rng.integers(0, case["f"][0] * case["f"][1], case["in_shape"])


# -- the delegate's case table ----------------------------------------------------------------
# Each row's strategy draws check_op's (model, inputs); tolerances are check_delegate's:
# TAICHI_RTOL (the values are copies: exact in fp32).
@st.composite
def pool_delegate_matches_reference_cases(draw):
    case = draw(pool_case())
    ties = draw(st.booleans())
    seed = draw(S.seeds())
    x = _data(np.random.default_rng(seed), case["in_shape"], ties)
    return pool_model(case), [x]


@st.composite
def unpool_delegate_matches_reference_cases(draw):
    case = draw(unpool_case())
    overlap = draw(st.booleans())
    fractional = draw(st.booleans())
    seed = draw(S.seeds())
    if overlap:
        case = dict(case, s=(1, 1))
    rng = np.random.default_rng(seed)
    x = _data(rng, case["in_shape"])
    index = _window_indices(rng, case).astype(np.float32)
    if fractional:       # truncated toward zero: -0.5 is index 0
        index = index + rng.uniform(-0.9 * (index == 0), 0.99, index.shape).astype(np.float32)
    return unpool_model(case["in_shape"], case["f"], case["s"], case["padding"],
                        case["act"]), [x, index]


MEDIAPIPE_ROWS = [
    Row("MaxPoolingWithArgmax2D", pool_delegate_matches_reference_cases(), "ties in the window"),
    Row("MaxUnpooling2D", unpool_delegate_matches_reference_cases(),
        "every stride: gaps, padding before, overlapping windows (stride 1: several elements "
        "often land on one place, where the last in NHWC order wins); fractional indices"),
]
