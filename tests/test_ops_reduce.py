"""MEAN, SUM, REDUCE_MAX vs LiteRT through one-op models: float32 and int8, ranks 1-4,
keep_dims both ways, axes scalar or 1-D, negative and repeated. Tolerances: tflite_taichi.testing."""
import numpy as np
import pytest
from hypothesis import given, strategies as st

from tflite_taichi.errors import ModelError
from tflite_taichi.ops.base import Node, TensorSpec, lookup
from tflite_taichi.ops.reduce import ReducerOptions
from tflite_taichi.testing import (Const, Input, Output, check_against_litert, one_op_model,
                                   run_ours, strategies)

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


@pytest.mark.parametrize("op", OPS)
@given(case=reduction(), seed=S.seeds())
def test_float32_matches_litert(op, case, seed):
    shape, axes, keep_dims, out = case
    model = one_op_model(op, [Input(shape), Const(axes)], [Output(out)], keep_dims=keep_dims)
    check_against_litert(model, seed=seed)


@given(case=reduction(), qi=S.quant_params(), qo=S.quant_params(), same=st.booleans(),
       seed=S.seeds())
def test_int8_mean_matches_litert(case, qi, qo, same, seed):
    # Same quantization takes LiteRT's integer-mean path (truncating); different, its requantizing one.
    shape, axes, keep_dims, out = case
    qo = qi if same else qo
    model = one_op_model("MEAN", [Input(shape, np.int8, qi), Const(axes)],
                         [Output(out, np.int8, qo)], keep_dims=keep_dims)
    check_against_litert(model, seed=seed)


@given(case=reduction(), qi=S.quant_params(), widen=st.floats(1.0, 2.0), slack=st.floats(0, 1),
       seed=S.seeds())
def test_int8_sum_matches_litert(case, qi, widen, slack, seed):
    # LiteRT's int8 SUM neither clamps nor widens: a sum outside the output's range wraps, and
    # with the input's own quantization it adds raw int8 values (zero points included) in int8.
    # So the output quantization covers the sums, as a calibrated converter's would.
    # Oracle: the builtin kernels. LiteRT 2.3's reference (BUILTIN_REF) int8 SUM with rescaling
    # returns garbage (e.g. -1 for a sum of 103 units, where builtin and XNNPACK give 103).
    shape, axes, keep_dims, out = case
    rng = np.random.default_rng(seed)
    x = rng.integers(-128, 128, shape).astype(np.int8)
    real = (x.astype(np.float64) - qi[1]) * qi[0]
    reduced = tuple(sorted({int(a) % len(shape) for a in axes.reshape(-1)}))
    sums = real.sum(axis=reduced)
    lo, hi = min(float(sums.min()), 0.0), max(float(sums.max()), 0.0)
    scale = float(np.float32(max(hi - lo, qi[0]) / 240 * widen))
    zp_lo, zp_hi = int(np.ceil(-124 - lo / scale)), int(np.floor(124 - hi / scale))
    zp = zp_lo + int(round(slack * (zp_hi - zp_lo)))
    if (scale, zp) == (qi[0], qi[1]):
        scale = float(np.float32(scale * 1.5))
    model = one_op_model("SUM", [Input(shape, np.int8, qi), Const(axes)],
                         [Output(out, np.int8, (scale, zp))], keep_dims=keep_dims)
    check_against_litert(model, [x], kernels="builtin")


@given(case=reduction(), q=S.quant_params(), seed=S.seeds())
def test_int8_reduce_max_matches_litert(case, q, seed):
    # LiteRT's int8 REDUCE_MAX requires the output to share the input's quantization.
    shape, axes, keep_dims, out = case
    model = one_op_model("REDUCE_MAX", [Input(shape, np.int8, q), Const(axes)],
                         [Output(out, np.int8, q)], keep_dims=keep_dims)
    check_against_litert(model, seed=seed)


@pytest.mark.parametrize("op", OPS)
def test_int32_matches_litert(op):
    x = np.array([[7, -7, 3], [-1, -2, 2], [100, 5, -9]], np.int32).reshape(3, 3, 1)
    model = one_op_model(op, [Input((3, 3, 1), np.int32), Const(np.array([1, -1], np.int32))],
                         [Output((3,), np.int32)])
    check_against_litert(model, [x])


@pytest.mark.parametrize("op", OPS)
def test_scalar_input_is_copied(op):
    model = one_op_model(op, [Input(()), Const(np.array([0], np.int32))], [Output(())])
    check_against_litert(model, [np.array(1.5, np.float32)])


def _node(op, x_shape, axes, keep_dims=False, out_shape=None):
    axes = np.asarray(axes, np.int32)
    return Node(index=0, op=op, version=1, options=ReducerOptions(keep_dims),
                inputs=(TensorSpec(0, "x", tuple(x_shape), np.dtype(np.float32)),
                        TensorSpec(1, "axes", axes.shape, np.dtype(np.int32), value=axes)),
                outputs=(TensorSpec(2, "y", tuple(out_shape or ()), np.dtype(np.float32)),))


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("keep_dims", [False, True])
def test_no_axes_copies(op, keep_dims):
    # An empty axes tensor cannot go through a one-op model: the model reader takes a
    # zero-element constant (no buffer bytes) for a non-constant tensor. So: the op directly.
    opdef = lookup(op)
    node = _node(op, (2, 3), np.zeros(0, np.int32), keep_dims)
    assert [tuple(s) for s in opdef.infer(node)] == [(2, 3)]
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    node = _node(op, (2, 3), np.zeros(0, np.int32), keep_dims, (2, 3))
    np.testing.assert_array_equal(opdef.reference(node, [x, None])[0], x)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("axes", [[3], [-4], [0, 5]])
def test_axis_out_of_range_is_refused(op, axes):
    model = one_op_model(op, [Input((2, 3, 4)), Const(np.array(axes, np.int32))], [Output((2,))])
    with pytest.raises(ModelError, match=op):
        run_ours(model, [np.zeros((2, 3, 4), np.float32)])


@pytest.mark.parametrize("op", OPS)
def test_non_constant_axes_are_refused(op):
    model = one_op_model(op, [Input((2, 3)), Input((1,), np.int32)], [Output((2,))])
    with pytest.raises(ModelError, match=op):
        run_ours(model, [np.zeros((2, 3), np.float32), np.array([1], np.int32)])


def test_float_axes_are_refused():
    model = one_op_model("MEAN", [Input((2, 3)), Const(np.array([1.0], np.float32))],
                         [Output((2,))])
    with pytest.raises(ModelError, match="MEAN"):
        run_ours(model, [np.zeros((2, 3), np.float32)])
