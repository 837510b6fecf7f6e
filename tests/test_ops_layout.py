"""TILE, BROADCAST_TO, FILL, ZEROS_LIKE, RANGE, REVERSE_V2, MIRROR_PAD, BATCH_TO_SPACE_ND,
SPACE_TO_BATCH_ND vs LiteRT through one-op models: float32, int8 (input and output share their
quantization, as LiteRT requires for these ops), int32 and bool where LiteRT has them. Where our
semantics go beyond LiteRT's kernels (REVERSE_V2 with non-contiguous axes, the block ops with
other ranks than 3 and 4, ZEROS_LIKE of int8/bool) they are checked against numpy and
element-wise definitions. TFLite has no ONES_LIKE builtin: its converted form (FILL of SHAPE with
1) is checked instead. MATRIX_DIAG, MATRIX_SET_DIAG and REVERSE_SEQUENCE vs LiteRT in the types
where it moves the same values (see ops/layout.py), and against their element-wise definitions
for bool, int8 on any grids (MATRIX_DIAG's off-diagonal zero point) and REVERSE_SEQUENCE's int8
and bool, which LiteRT lacks. Tolerances: tflite_taichi.testing."""
import numpy as np
import pytest
from hypothesis import given, strategies as st

from tflite_taichi.builder import ModelBuilder
from tflite_taichi.errors import ModelError
from tflite_taichi.testing import (Const, Input, Output, check_against_litert, model_inputs,
                                   one_op_model, quantize_array, random_input, run_ours)
from cases.shape import _expect_error, _i32, tensor_type
from cases.layout import S, block_case, broadcast_case, mirror_pad_case, reverse_case, reverse_sequence_case, set_diag_case, tile_case

MOVE_DTYPES = ["float32", "int8", "int32", "bool"]


def _index_const(values, int64: bool):
    return Const(np.array(values, np.int64 if int64 else np.int32))


def _typed(data, dtype):
    """(numpy type, quantization) for 'float32', 'int8', 'int32' or 'bool'."""
    if dtype == "bool":
        return np.bool_, None
    return data.draw(tensor_type(dtype))


@pytest.mark.parametrize("dtype", MOVE_DTYPES)
@given(case=tile_case(min_multiple=0), data=st.data(), int64=st.booleans(), seed=S.seeds())
def test_tile_matches_litert(dtype, case, data, int64, seed):
    shape, multiples, out = case
    t, q = _typed(data, dtype)
    model = one_op_model("TILE", [Input(shape, t, q), _index_const(multiples, int64)],
                         [Output(out, t, q)])
    check_against_litert(model, seed=seed)


def test_tile_errors():
    _expect_error(one_op_model("TILE", [Input((2, 3)), _i32([2, -1])], [Output((4, 3))]),
                  "TILE", "must be >= 0")
    _expect_error(one_op_model("TILE", [Input((2, 3)), _i32([2])], [Output((4, 3))]),
                  "TILE", "one entry per input dimension")
    _expect_error(one_op_model("TILE", [Input((2, 3)), Const(np.array([2.0, 1.0], np.float32))],
                               [Output((4, 3))]), "TILE", "int32 or int64")


@pytest.mark.parametrize("dtype", MOVE_DTYPES)
@given(case=broadcast_case(), data=st.data(), int64=st.booleans(), seed=S.seeds())
def test_broadcast_to_matches_litert(dtype, case, data, int64, seed):
    """Version 2: LiteRT's reference resolver registers BROADCAST_TO from version 2 on."""
    shape, target = case
    t, q = _typed(data, dtype)
    model = one_op_model("BROADCAST_TO", [Input(shape, t, q), _index_const(target, int64)],
                         [Output(target, t, q)], version=2)
    check_against_litert(model, seed=seed)


def test_broadcast_to_errors():
    _expect_error(one_op_model("BROADCAST_TO", [Input((2, 3)), _i32([4, 2, 4])], [Output((4, 2, 4))],
                               version=2), "BROADCAST_TO", "does not broadcast")
    _expect_error(one_op_model("BROADCAST_TO", [Input((2, 3)), _i32([3])], [Output((3,))],
                               version=2), "BROADCAST_TO", "does not broadcast")
    _expect_error(one_op_model("BROADCAST_TO", [Input((1, 3)), _i32([-2, 3])], [Output((2, 3))],
                               version=2), "BROADCAST_TO", "negative dimension")
    _expect_error(one_op_model("BROADCAST_TO", [Input((1, 3)), _i32([[2, 3]])], [Output((2, 3))],
                               version=2), "BROADCAST_TO", "1-D")


# -- FILL, ZEROS_LIKE, ONES_LIKE --------------------------------------------------------------
@pytest.mark.parametrize("dtype", MOVE_DTYPES)
@given(dims=S.shapes(0, 4, 1, 5), data=st.data(), where=st.sampled_from(["input", "const"]),
       int64=st.booleans(), seed=S.seeds())
def test_fill_matches_litert(dtype, dims, data, where, int64, seed):
    """The value as a run-time scalar or a constant (then folded at prepare); int8: LiteRT
    requires the value and the output to share their quantization."""
    t, q = _typed(data, dtype)
    if where == "input":
        value = Input((), t, q)
    else:
        v = np.random.default_rng(seed).uniform(-3, 3)
        v = quantize_array(np.array(v), q) if q else np.array(v).astype(t)
        value = Const(v, quantization=q)
    model = one_op_model("FILL", [_index_const(dims, int64), value], [Output(dims, t, q)])
    check_against_litert(model, seed=seed)


def test_fill_errors():
    _expect_error(one_op_model("FILL", [_i32([2, -3]), Input(())], [Output((2, 3))]),
                  "FILL", "must be >= 0")
    _expect_error(one_op_model("FILL", [_i32([2, 3]), Input((2,))], [Output((2, 3))]),
                  "FILL", "must be a scalar")
    _expect_error(one_op_model("FILL", [Const(np.array([2.0, 3.0], np.float32)), Input(())],
                               [Output((2, 3))]), "FILL", "int32 or int64")


@pytest.mark.parametrize("dtype", ["float32", "int32", "int64"])
@given(shape=S.shapes(0, 4, 1, 5), seed=S.seeds())
def test_zeros_like_matches_litert(dtype, shape, seed):
    """LiteRT's ZEROS_LIKE has float32, int32 and int64 only."""
    t = np.dtype(dtype).type
    model = one_op_model("ZEROS_LIKE", [Input(shape, t)], [Output(shape, t)])
    check_against_litert(model, seed=seed)


@given(shape=S.shapes(0, 4, 1, 5), q=S.quant_params(), bool_input=st.booleans(), seed=S.seeds())
def test_zeros_like_int8_and_bool(shape, q, bool_input, seed):
    """Beyond LiteRT: an int8 output holds its zero point (the real value 0), a bool one False."""
    t, qq, zero = (np.bool_, None, False) if bool_input else (np.int8, q, q[1])
    model = one_op_model("ZEROS_LIKE", [Input(shape, t, qq)], [Output(shape, t, qq)])
    out, = run_ours(model, model_inputs(model, seed))
    assert out.dtype == t and out.shape == shape
    np.testing.assert_array_equal(out, np.full(shape, zero, t))


def _ones_like_model(shape, dtype, q):
    """tf.ones_like(x) as the converter writes it for a shape it cannot fold: FILL(SHAPE(x), 1)
    (TFLite has no ONES_LIKE builtin)."""
    b = ModelBuilder()
    g = b.subgraph()
    x = g.input("x", shape, dtype, q)
    dims = g.tensor("dims", (len(shape),), np.int32)
    g.op("SHAPE", [x], [dims], out_type="INT32")
    one = quantize_array(np.array(1.0), q) if q else np.array(1, dtype)
    one = g.const("one", one, quantization=q)
    y = g.tensor("y", shape, dtype, q)
    g.op("FILL", [dims, one], [y])
    g.output(y)
    return b.finish()


@pytest.mark.parametrize("dtype", MOVE_DTYPES)
@given(shape=S.shapes(1, 4, 1, 5), data=st.data(), seed=S.seeds())
def test_ones_like_as_converted_matches_litert(dtype, shape, data, seed):
    t, q = _typed(data, dtype)
    if q is not None:
        q = (data.draw(S.scales(0.01, 0.2)), q[1])     # a grid that holds 1.0
    check_against_litert(_ones_like_model(shape, t, q), seed=seed)


# -- RANGE ------------------------------------------------------------------------------------
@st.composite
def range_case(draw, dtype):
    if dtype == "float32":
        f = st.floats(-50, 50, width=32)
        start, delta = draw(f), draw(st.floats(0.0625, 8, width=32))
        n = draw(st.integers(1, 60))
        limit = float(np.float32(start + n * delta * draw(st.floats(0.7, 1.0))))
    else:
        start, delta = draw(st.integers(-100, 100)), draw(st.integers(1, 9))
        limit = start + draw(st.integers(1, 100))
    if draw(st.booleans()):          # counting down
        start, limit, delta = limit, start, -delta
    return start, limit, delta


@pytest.mark.parametrize("dtype", ["float32", "int32", "int64"])
@given(data=st.data())
def test_range_matches_litert(dtype, data):
    """Constant scalars (RANGE is folded at prepare: its output shape depends on them)."""
    start, limit, delta = data.draw(range_case(dtype))
    t = np.dtype(dtype).type
    model = one_op_model("RANGE", [Const(np.array(v, t)) for v in (start, limit, delta)],
                         [Output((1,), t)])
    out, = check_against_litert(model)
    assert out.dtype == t


def test_range_accumulates_in_float32_like_litert():
    """A long float range drifts from start + i * delta; LiteRT adds delta step by step."""
    model = one_op_model("RANGE", [Const(np.array(v, np.float32)) for v in (0.1, 1000.3, 0.7)],
                         [Output((1,))])
    out, = check_against_litert(model)
    assert out.shape == (1429,)


def test_range_errors():
    def model(start, limit, delta, t=np.int32):
        return one_op_model("RANGE", [Const(np.array(v, t)) for v in (start, limit, delta)],
                            [Output((1,), t)])
    _expect_error(model(0, 5, 0), "RANGE", "delta must not be 0")
    _expect_error(model(0, 5, -1), "RANGE", "never takes start")
    _expect_error(model(5.0, 0.0, 1.0, np.float32), "RANGE", "never takes start")
    _expect_error(one_op_model("RANGE", [Const(np.array(0, np.int32)), Const(np.array(5.0, np.float32)),
                                         Const(np.array(1, np.int32))], [Output((5,), np.int32)]),
                  "RANGE", "limit is float32 but start is int32")
    _expect_error(one_op_model("RANGE", [Const(np.array([0, 1], np.int32)), Const(np.array(5, np.int32)),
                                         Const(np.array(1, np.int32))], [Output((5,), np.int32)]),
                  "RANGE", "must be a scalar")


@pytest.mark.parametrize("dtype", MOVE_DTYPES)
@given(case=reverse_case(), data=st.data(), seed=S.seeds())
def test_reverse_v2_matches_litert(dtype, case, data, seed):
    shape, axes = case
    t, q = _typed(data, dtype)
    model = one_op_model("REVERSE_V2", [Input(shape, t, q), _i32(axes)], [Output(shape, t, q)])
    check_against_litert(model, seed=seed)


@given(case=reverse_case(contiguous=False), seed=S.seeds())
def test_reverse_v2_any_axes_matches_numpy(case, seed):
    """LiteRT refuses non-contiguous axes (and crashes on none): numpy's flip defines them."""
    shape, axes = case
    model = one_op_model("REVERSE_V2", [Input(shape), _i32(axes)], [Output(shape)])
    x, = model_inputs(model, seed)
    out, = run_ours(model, [x])
    np.testing.assert_array_equal(out, np.flip(x, [a % len(shape) for a in axes]))


def test_reverse_v2_errors():
    _expect_error(one_op_model("REVERSE_V2", [Input((2, 3)), _i32([2])], [Output((2, 3))]),
                  "REVERSE_V2", "axis 2 is out of range")
    _expect_error(one_op_model("REVERSE_V2", [Input((2, 3)), _i32([1, -1])], [Output((2, 3))]),
                  "REVERSE_V2", "more than once")
    _expect_error(one_op_model("REVERSE_V2", [Input((2, 3)), _i32(1)], [Output((2, 3))]),
                  "REVERSE_V2", "1-D")


@pytest.mark.parametrize("dtype", MOVE_DTYPES)
@given(case=mirror_pad_case(), data=st.data(), int64=st.booleans(), seed=S.seeds())
def test_mirror_pad_matches_litert(dtype, case, data, int64, seed):
    shape, pads, mode, out = case
    t, q = _typed(data, dtype)
    model = one_op_model("MIRROR_PAD", [Input(shape, t, q), _index_const(pads, int64)],
                         [Output(out, t, q)], mode=mode)
    check_against_litert(model, seed=seed)


def test_mirror_pad_errors():
    def model(pads, mode, shape=(3, 4)):
        out = tuple(n + max(lo, 0) + max(hi, 0) for n, (lo, hi) in zip(shape, pads))
        return one_op_model("MIRROR_PAD", [Input(shape), _i32(pads)], [Output(out)], mode=mode)
    _expect_error(model([[3, 0], [0, 0]], "REFLECT"), "MIRROR_PAD",
                  "REFLECT padding [3, 0] of dimension 0")
    _expect_error(model([[0, 0], [0, 5]], "SYMMETRIC"), "MIRROR_PAD",
                  "SYMMETRIC padding [0, 5] of dimension 1")
    _expect_error(model([[-1, 0], [0, 0]], "REFLECT"), "MIRROR_PAD", "negative padding")
    _expect_error(model([[1, 1]], "REFLECT"), "MIRROR_PAD", "shape [2, 2]")
    _expect_error(one_op_model("MIRROR_PAD", [Input((3, 4)), _i32([[1, 1], [1, 1]])], [Output((5, 6))],
                               mode=2), "MIRROR_PAD", "unknown mode 2")


# -- SPACE_TO_BATCH_ND / BATCH_TO_SPACE_ND ----------------------------------------------------
def space_to_batch_by_definition(x, block, pads):
    """out[k * B + b, q.., r..] = padded[b, q_i * block_i + k_i.., r..], with
    k = (k_1..k_M) flattened row-major."""
    m = len(block)
    xp = np.pad(x, [(0, 0)] + [tuple(p) for p in pads] + [(0, 0)] * (x.ndim - 1 - m))
    batch = x.shape[0]
    spatial = [n // b for n, b in zip(xp.shape[1:1 + m], block)]
    out = np.zeros((batch * int(np.prod(block)),) + tuple(spatial) + x.shape[1 + m:], x.dtype)
    for k, ks in enumerate(np.ndindex(*block)):
        for b in range(batch):
            for q in np.ndindex(*spatial):
                src = tuple(qi * bi + ki for qi, bi, ki in zip(q, block, ks))
                out[(k * batch + b,) + q] = xp[(b,) + src]
    return out


@pytest.mark.parametrize("dtype", MOVE_DTYPES)
@given(case=block_case(), data=st.data(), seed=S.seeds())
def test_space_to_batch_nd_matches_litert(dtype, case, data, seed):
    """int8: the padding is the zero point (the real value 0)."""
    block, pads, shape, out = case
    t, q = _typed(data, dtype)
    model = one_op_model("SPACE_TO_BATCH_ND", [Input(shape, t, q), _i32(block), _i32(pads)],
                         [Output(out, t, q)])
    check_against_litert(model, seed=seed)


@pytest.mark.parametrize("dtype", MOVE_DTYPES)
@given(case=block_case(), data=st.data(), seed=S.seeds())
def test_batch_to_space_nd_matches_litert(dtype, case, data, seed):
    """The inverse shapes, the paddings as crops."""
    block, crops, out, shape = case
    t, q = _typed(data, dtype)
    model = one_op_model("BATCH_TO_SPACE_ND", [Input(shape, t, q), _i32(block), _i32(crops)],
                         [Output(out, t, q)])
    check_against_litert(model, seed=seed)


@given(case=block_case(litert=False), int64=st.booleans(), seed=S.seeds())
def test_block_ops_any_rank_follow_their_definition(case, int64, seed):
    """Any number of spatial and remaining dims (beyond LiteRT's rank 3/4): SPACE_TO_BATCH_ND
    by its element-wise definition, BATCH_TO_SPACE_ND as its inverse (crops = paddings)."""
    block, pads, shape, out = case
    to_batch = one_op_model("SPACE_TO_BATCH_ND", [Input(shape), _index_const(block, int64),
                                                  _index_const(pads, int64)], [Output(out)])
    x, = model_inputs(to_batch, seed)
    y, = run_ours(to_batch, [x])
    np.testing.assert_array_equal(y, space_to_batch_by_definition(x, block, pads))
    back = one_op_model("BATCH_TO_SPACE_ND", [Input(out), _index_const(block, int64),
                                              _index_const(pads, int64)], [Output(shape)])
    np.testing.assert_array_equal(run_ours(back, [y])[0], x)


def test_block_ops_errors():
    def s2b(shape, block, pads):
        return one_op_model("SPACE_TO_BATCH_ND", [Input(shape), _i32(block), _i32(pads)],
                            [Output(shape)])

    def b2s(shape, block, crops):
        return one_op_model("BATCH_TO_SPACE_ND", [Input(shape), _i32(block), _i32(crops)],
                            [Output(shape)])
    _expect_error(s2b((1, 3, 4, 1), [2, 2], [[0, 0], [0, 0]]), "SPACE_TO_BATCH_ND",
                  "not a multiple of the block size 2")
    _expect_error(s2b((1, 4, 4, 1), [0, 2], [[0, 0], [0, 0]]), "SPACE_TO_BATCH_ND", "must be >= 1")
    _expect_error(s2b((1, 4, 4, 1), [2, 2], [[-2, 2], [0, 0]]), "SPACE_TO_BATCH_ND", "negative paddings")
    _expect_error(s2b((1, 4, 4, 1), [2, 2], [[0, 0]]), "SPACE_TO_BATCH_ND", "shape [2, 2]")
    _expect_error(s2b((4, 4), [2, 2], [[0, 0], [0, 0]]), "SPACE_TO_BATCH_ND", "no batch dimension")
    _expect_error(s2b((1, 4, 4, 1), [], np.zeros((0, 2))), "SPACE_TO_BATCH_ND", "block shape is empty")
    _expect_error(b2s((6, 2, 2, 1), [2, 2], [[0, 0], [0, 0]]), "BATCH_TO_SPACE_ND",
                  "batch 6 is not a multiple")
    _expect_error(b2s((4, 2, 2, 1), [2, 2], [[-1, 0], [0, 0]]), "BATCH_TO_SPACE_ND", "negative crops")
    _expect_error(b2s((4, 2, 2, 1), [2, 2], [[3, 2], [0, 0]]), "BATCH_TO_SPACE_ND", "crops [3, 2] exceed")


# -- MATRIX_DIAG / MATRIX_SET_DIAG ------------------------------------------------------------
# LiteRT moves raw values: it agrees with the float view where the tensors share one quantization
# with zero point 0 (MATRIX_DIAG writes the raw 0 off the diagonal) or any zero point
# (MATRIX_SET_DIAG writes no new value). Its bool kernels copy 4-byte floats: numpy instead.
DIAG_LITERT_DTYPES = ["float32", "int8", "int32", "int16", "int64", "uint8"]


def _diag_type(data, dtype, zero_point_0=False):
    if dtype == "int8":
        scale, zp = data.draw(S.quant_params())
        return np.int8, (scale, 0 if zero_point_0 else zp)
    return np.dtype(dtype).type, None


def diag_by_definition(d):
    """[..., N] -> [..., N, N]: out[..., i, j] = d[..., i] if i == j else 0."""
    n = d.shape[-1]
    out = np.zeros(d.shape + (n,), d.dtype)
    for index in np.ndindex(*d.shape):
        out[index + (index[-1],)] = d[index]
    return out


def set_diag_by_definition(x, d):
    out = x.copy()
    for index in np.ndindex(*d.shape):
        out[index + (index[-1],)] = d[index]
    return out


def _random_data(shape, t, q, rng):
    """Data of this type as model_inputs draws it for an input (for a constant)."""
    scales = np.ones(1) if q is not None else np.zeros(0)
    return random_input({"shape": shape, "dtype": t, "quantization_parameters": {"scales": scales}},
                        rng)


@pytest.mark.parametrize("dtype", DIAG_LITERT_DTYPES)
@given(shape=S.shapes(1, 3, 1, 5), data=st.data(), seed=S.seeds())
def test_matrix_diag_matches_litert(dtype, shape, data, seed):
    t, q = _diag_type(data, dtype, zero_point_0=True)
    model = one_op_model("MATRIX_DIAG", [Input(shape, t, q)],
                         [Output(tuple(shape) + (shape[-1],), t, q)])
    check_against_litert(model, seed=seed)


@pytest.mark.parametrize("dtype", DIAG_LITERT_DTYPES)
@given(case=set_diag_case(), data=st.data(), const_diag=st.booleans(), seed=S.seeds())
def test_matrix_set_diag_matches_litert(dtype, case, data, const_diag, seed):
    shape, diag_shape = case
    t, q = _diag_type(data, dtype)
    diag = _random_data(diag_shape, t, q, np.random.default_rng(seed))
    model = one_op_model("MATRIX_SET_DIAG", [Input(shape, t, q),
                                             Const(diag, q) if const_diag else Input(diag_shape, t, q)],
                         [Output(shape, t, q)])
    inputs = model_inputs(model, seed)
    check_against_litert(model, inputs if const_diag else inputs[:1] + [diag])


@given(shape=S.shapes(1, 3, 1, 5), qi=S.quant_params(), qo=S.quant_params(), seed=S.seeds())
def test_matrix_diag_bool_and_int8_follow_their_definition(shape, qi, qo, seed):
    """bool (LiteRT: garbage); int8 with any grids: the real values on the diagonal, the real 0
    (the output's zero point) elsewhere, snapped to the output's grid."""
    rng = np.random.default_rng(seed)
    d = rng.random(shape) < 0.5
    model = one_op_model("MATRIX_DIAG", [Input(shape, np.bool_)],
                         [Output(tuple(shape) + (shape[-1],), np.bool_)])
    np.testing.assert_array_equal(run_ours(model, [d])[0], diag_by_definition(d))
    q = rng.integers(-128, 128, shape).astype(np.int8)
    model = one_op_model("MATRIX_DIAG", [Input(shape, np.int8, qi)],
                         [Output(tuple(shape) + (shape[-1],), np.int8, qo)])
    real = (q.astype(np.float32) - qi[1]) * np.float32(qi[0])
    expected = quantize_array(diag_by_definition(real), qo)
    np.testing.assert_array_equal(run_ours(model, [q])[0], expected)


@given(case=set_diag_case(), qs=st.lists(S.quant_params(), min_size=3, max_size=3),
       seed=S.seeds())
def test_matrix_set_diag_bool_and_int8_follow_their_definition(case, qs, seed):
    shape, diag_shape = case
    rng = np.random.default_rng(seed)
    x, d = rng.random(shape) < 0.5, rng.random(diag_shape) < 0.5
    model = one_op_model("MATRIX_SET_DIAG", [Input(shape, np.bool_), Input(diag_shape, np.bool_)],
                         [Output(shape, np.bool_)])
    np.testing.assert_array_equal(run_ours(model, [x, d])[0], set_diag_by_definition(x, d))
    qx, qd, qo = qs
    x = rng.integers(-128, 128, shape).astype(np.int8)
    d = rng.integers(-128, 128, diag_shape).astype(np.int8)
    model = one_op_model("MATRIX_SET_DIAG", [Input(shape, np.int8, qx),
                                             Input(diag_shape, np.int8, qd)],
                         [Output(shape, np.int8, qo)])
    real_x = (x.astype(np.float32) - qx[1]) * np.float32(qx[0])
    real_d = (d.astype(np.float32) - qd[1]) * np.float32(qd[0])
    expected = quantize_array(set_diag_by_definition(real_x, real_d), qo)
    np.testing.assert_array_equal(run_ours(model, [x, d])[0], expected)


def test_matrix_diag_errors():
    _expect_error(one_op_model("MATRIX_DIAG", [Input(())], [Output((1, 1))]),
                  "MATRIX_DIAG", "rank >= 1")
    _expect_error(one_op_model("MATRIX_DIAG", [Input((3,))], [Output((3, 3), np.int32)]),
                  "MATRIX_DIAG", "one dtype")
    _expect_error(one_op_model("MATRIX_DIAG", [Input((3,), np.float16)], [Output((3, 3), np.float16)]),
                  "MATRIX_DIAG", "float16")
    _expect_error(one_op_model("MATRIX_SET_DIAG", [Input((3,)), Input((3,))], [Output((3,))]),
                  "MATRIX_SET_DIAG", "rank >= 2")
    _expect_error(one_op_model("MATRIX_SET_DIAG", [Input((2, 3, 4)), Input((2, 4))],
                               [Output((2, 3, 4))]), "MATRIX_SET_DIAG", "needs [2, 3]")
    _expect_error(one_op_model("MATRIX_SET_DIAG", [Input((3, 4)), Input((3,), np.int8, (0.1, 0))],
                               [Output((3, 4))]), "MATRIX_SET_DIAG", "one dtype")


# -- REVERSE_SEQUENCE -------------------------------------------------------------------------
REVERSE_SEQUENCE_LITERT_DTYPES = ["float32", "int32", "int64", "int16", "uint8"]


def reverse_sequence_by_definition(x, seq, batch, lengths):
    out = np.empty_like(x)
    for index in np.ndindex(*x.shape):
        q, length = index[seq], lengths[index[batch]]
        src = list(index)
        if q < length:
            src[seq] = length - 1 - q
        out[index] = x[tuple(src)]
    return out


def reverse_sequence_model(shape, seq, batch, lengths, t=np.float32, q=None, const=True,
                           int64=False):
    lengths_dtype = np.int64 if int64 else np.int32
    lengths_in = (Const(np.array(lengths, lengths_dtype)) if const
                  else Input((len(lengths),), lengths_dtype))
    return one_op_model("REVERSE_SEQUENCE", [Input(shape, t, q), lengths_in], [Output(shape, t, q)],
                        seq_dim=seq, batch_dim=batch)


@pytest.mark.parametrize("dtype", REVERSE_SEQUENCE_LITERT_DTYPES)
@given(case=reverse_sequence_case(), data=st.data(), const=st.booleans(), int64=st.booleans(),
       seed=S.seeds())
def test_reverse_sequence_matches_litert(dtype, case, data, const, int64, seed):
    shape, seq, batch, lengths = case
    t, q = np.dtype(dtype).type, None
    if dtype == "uint8":             # quantized, one grid in and out (LiteRT moves raw bytes)
        q = data.draw(S.quant_params(np.uint8))
    model = reverse_sequence_model(shape, seq, batch, lengths, t, q, const, int64)
    inputs = model_inputs(model, seed)
    if not const:
        inputs[1] = np.array(lengths, inputs[1].dtype)
    check_against_litert(model, inputs)


@given(case=reverse_sequence_case(), qi=S.quant_params(), qo=S.quant_params(), seed=S.seeds())
def test_reverse_sequence_int8_and_bool_follow_their_definition(case, qi, qo, seed):
    """LiteRT has no int8 or bool kernel: held to the element-wise definition."""
    shape, seq, batch, lengths = case
    rng = np.random.default_rng(seed)
    x = rng.random(shape) < 0.5
    model = reverse_sequence_model(shape, seq, batch, lengths, np.bool_)
    np.testing.assert_array_equal(run_ours(model, [x])[0],
                                  reverse_sequence_by_definition(x, seq, batch, lengths))
    x = rng.integers(-128, 128, shape).astype(np.int8)
    model = one_op_model("REVERSE_SEQUENCE", [Input(shape, np.int8, qi),
                                              Const(np.array(lengths, np.int32))],
                         [Output(shape, np.int8, qo)], seq_dim=seq, batch_dim=batch)
    real = (x.astype(np.float32) - qi[1]) * np.float32(qi[0])
    expected = quantize_array(reverse_sequence_by_definition(real, seq, batch, lengths), qo)
    np.testing.assert_array_equal(run_ours(model, [x])[0], expected)


@pytest.mark.parametrize("lengths", [[2, 5], [-1, 2]])
def test_reverse_sequence_lengths_out_of_range_are_refused(lengths):
    # LiteRT refuses the first entry above 4 and checks no other (writing out of bounds)
    _expect_error(reverse_sequence_model((2, 4), 1, 0, lengths), "REVERSE_SEQUENCE",
                  "must lie in [0, 4]")
    model = reverse_sequence_model((2, 4), 1, 0, lengths, const=False)
    with pytest.raises(ModelError, match=r"REVERSE_SEQUENCE.*must lie in \[0, 4\]"):
        run_ours(model, [np.zeros((2, 4), np.float32), np.array(lengths, np.int32)])


def test_reverse_sequence_errors():
    _expect_error(reverse_sequence_model((2, 4), 1, 1, [1, 1]), "REVERSE_SEQUENCE", "both 1")
    _expect_error(reverse_sequence_model((2, 4), 2, 0, [1, 1]), "REVERSE_SEQUENCE",
                  "seq_dim 2 is out of range")
    _expect_error(reverse_sequence_model((2, 4), 1, -1, [1, 1, 1, 1]), "REVERSE_SEQUENCE",
                  "batch_dim -1 is out of range")
    _expect_error(reverse_sequence_model((2, 4), 1, 0, [1, 1, 1]), "REVERSE_SEQUENCE",
                  "needs [2]")
    _expect_error(one_op_model("REVERSE_SEQUENCE", [Input((2, 4)), Const(np.ones(2, np.float32))],
                               [Output((2, 4))], seq_dim=1, batch_dim=0),
                  "REVERSE_SEQUENCE", "int32 or int64")
    _expect_error(one_op_model("REVERSE_SEQUENCE", [Input((2, 4)), _i32([1, 1])],
                               [Output((2, 4), np.int32)], seq_dim=1, batch_dim=0),
                  "REVERSE_SEQUENCE", "the input's dtype")
