"""MEAN, SUM, REDUCE_MAX, REDUCE_MIN, REDUCE_PROD, REDUCE_ANY, REDUCE_ALL vs LiteRT through
one-op models: float32 and int8 (bool for ANY and ALL), ranks 1-4, keep_dims both ways, axes
scalar or 1-D, negative and repeated. Tolerances: tflite_taichi.testing; int8 REDUCE_PROD: LiteRT's own rounding drift
(litert_prod_bound)."""
import numpy as np
import pytest
from hypothesis import assume, given, strategies as st

from tflite_taichi.errors import ModelError
from tflite_taichi.ops.base import Node, TensorSpec, lookup
from tflite_taichi.ops.reduce import ReducerOptions
from tflite_taichi.testing import (Const, Input, Output, check_against_litert, model_inputs,
                                   one_op_model, run_litert, run_ours)
from cases.reduce import OPS, S, all_inputs, any_inputs, prod_inputs, reduction, rounding_floor


@pytest.mark.parametrize("op", OPS)
@given(case=reduction(), seed=S.seeds())
def test_float32_matches_litert(op, case, seed):
    shape, axes, keep_dims, out = case
    model = one_op_model(op, [Input(shape), Const(axes)], [Output(out)], keep_dims=keep_dims)
    inputs = model_inputs(model, seed)
    check_against_litert(model, inputs, floor=rounding_floor(op, inputs[0], axes))


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
def test_axes_given_at_run_time_match_litert(op):
    model = one_op_model(op, [Input((2, 3)), Input((1,), np.int32)], [Output((2,))])
    x = np.random.default_rng(3).uniform(-1, 1, (2, 3)).astype(np.float32)
    for axis in (0, 1):
        check_against_litert(model, [x, np.array([axis], np.int32)])


def test_float_axes_are_refused():
    model = one_op_model("MEAN", [Input((2, 3)), Const(np.array([1.0], np.float32))],
                         [Output((2,))])
    with pytest.raises(ModelError, match="MEAN"):
        run_ours(model, [np.zeros((2, 3), np.float32)])


# -- REDUCE_MIN, REDUCE_PROD, REDUCE_ANY ---------------------------------------------------------
NEW_OPS = ["REDUCE_MIN", "REDUCE_PROD"]
BOOL_OPS = ["REDUCE_ANY"]


@pytest.mark.parametrize("op", NEW_OPS)
@given(case=reduction(), seed=S.seeds())
def test_min_prod_float32_matches_litert(op, case, seed):
    shape, axes, keep_dims, out = case
    model = one_op_model(op, [Input(shape), Const(axes)], [Output(out)], keep_dims=keep_dims)
    inputs = [prod_inputs(shape, seed)] if op == "REDUCE_PROD" else None
    check_against_litert(model, inputs, seed=seed)


@given(case=reduction(), q=S.quant_params(), seed=S.seeds())
def test_int8_reduce_min_matches_litert(case, q, seed):
    # LiteRT's int8 REDUCE_MIN, like REDUCE_MAX, requires the output to keep the input's
    # quantization.
    shape, axes, keep_dims, out = case
    model = one_op_model("REDUCE_MIN", [Input(shape, np.int8, q), Const(axes)],
                         [Output(out, np.int8, q)], keep_dims=keep_dims)
    check_against_litert(model, seed=seed)


def _litert_prod_terms(x, zero_point, axes):
    """Per output, the integer terms (q - zero_point) in the order LiteRT's Reduce visits them
    (row-major over the reduced axes): shape [outputs, terms]."""
    kept = [a for a in range(x.ndim) if a not in axes]
    t = np.transpose(x.astype(np.float64) - zero_point, kept + list(axes))
    n = int(np.prod([x.shape[a] for a in axes], dtype=np.int64))
    return t.reshape(-1, n)


def litert_prod_bound(x, qi, axes, out_scale):
    """How far LiteRT's int8 REDUCE_PROD may be from the exactly rounded real product, in
    output units, for each output. Its kernel (reference_ops::QuantizedReduceProd) keeps an
    integer partial product p_0 = d_0, p_k = round(p_{k-1} * d_k * m) with d_k = q_k - zp and
    m = in_scale / out_scale^(1/N), and outputs round(p_{N-1} * m) + out_zp. Each step's
    rounding error (<= 1/2) is carried through the later factors |d_j| m and the final m:
        |litert - exact| <= 1/2 + (m / 2) * sum_{k=1}^{N-1} prod_{j>k} |d_j| m;
    ours rounds the exact product once (<= 1/2). Also returns the largest |p_k| LiteRT forms,
    which must stay in int32 (beyond it LiteRT's partial product wraps)."""
    d = _litert_prod_terms(x, qi[1], axes)
    n = d.shape[1]
    m = qi[0] / out_scale ** (1.0 / n)
    f = np.abs(d) * m
    suffix = np.concatenate([np.cumprod(f[:, :0:-1], axis=1)[:, ::-1],
                             np.ones((d.shape[0], 1))], axis=1)      # prod_{j>k} f_j, k = 0..n-1
    bound = 1.0 + 0.5 * m * suffix[:, 1:].sum(axis=1)
    partial = np.abs(d[:, :1]) * np.concatenate([np.ones((d.shape[0], 1)),
                                                 np.cumprod(f[:, 1:], axis=1)], axis=1)
    return bound * (1 + 1e-6), float(partial.max())


@given(case=reduction(), qi=S.quant_params(), widen=st.floats(1.0, 2.0), seed=S.seeds())
def test_int8_reduce_prod_within_litert_rounding(case, qi, widen, seed):
    # LiteRT's int8 kernel rounds a rescaled partial product to an integer after every
    # multiplication, so over many terms it drifts from the real product (measured: up to 36
    # units for 27 terms); ours is the real product, rounded once. Each output must lie within
    # the drift LiteRT's own rounding allows (litert_prod_bound). The output quantization covers
    # the products, as a calibrated converter's would.
    shape, axes, keep_dims, out = case
    rng = np.random.default_rng(seed)
    x = rng.integers(-128, 128, shape).astype(np.int8)
    reduced = tuple(sorted({int(a) % len(shape) for a in axes.reshape(-1)}))
    prods = np.prod((x.astype(np.float64) - qi[1]) * qi[0], axis=reduced)
    lo, hi = min(float(prods.min()), 0.0), max(float(prods.max()), 0.0)
    assume(1e-30 < hi - lo < 1e30)          # products a float32 model can hold
    scale = float(np.float32((hi - lo) / 240 * widen))
    zp = int(np.clip(round(-(lo + hi) / 2 / scale), -100, 100))
    bound, largest = litert_prod_bound(x, qi, reduced, scale)
    assume(largest < 2**30)
    model = one_op_model("REDUCE_PROD", [Input(shape, np.int8, qi), Const(axes)],
                         [Output(out, np.int8, (scale, zp))], keep_dims=keep_dims)
    expected = run_litert(model, [x])[0]
    actual = run_ours(model, [x])[0]
    diff = np.abs(actual.astype(np.int64) - expected.astype(np.int64)).reshape(-1)
    assert np.all(diff <= bound), (f"{int((diff > bound).sum())} outputs beyond LiteRT's rounding "
                                   f"bound: diff {diff[diff > bound]}, bound {bound[diff > bound]}")


@pytest.mark.parametrize("op", NEW_OPS)
def test_min_prod_int32_matches_litert(op):
    # int32 REDUCE_PROD wraps like LiteRT's int32 loop: 100 * 5 * -9 * 46341^2 overflows
    x = np.array([[7, -7, 3], [-1, -2, 2], [100, 5, -9]], np.int32).reshape(3, 3, 1)
    model = one_op_model(op, [Input((3, 3, 1), np.int32), Const(np.array([1, -1], np.int32))],
                         [Output((3,), np.int32)])
    check_against_litert(model, [x])
    big = np.array([[46341, 46341, 3]], np.int32).reshape(1, 3, 1)
    model = one_op_model(op, [Input((1, 3, 1), np.int32), Const(np.array([1], np.int32))],
                         [Output((1, 1), np.int32)])
    check_against_litert(model, [big])


@given(case=reduction(), seed=S.seeds())
def test_reduce_any_matches_litert(case, seed):
    shape, axes, keep_dims, out = case
    model = one_op_model("REDUCE_ANY", [Input(shape, np.bool_), Const(axes)],
                         [Output(out, np.bool_)], keep_dims=keep_dims)
    check_against_litert(model, [any_inputs(shape, seed)])


@pytest.mark.parametrize("op", NEW_OPS + BOOL_OPS)
def test_new_scalar_input_is_copied(op):
    dtype = np.bool_ if op in BOOL_OPS else np.float32
    model = one_op_model(op, [Input((), dtype), Const(np.array([0], np.int32))],
                         [Output((), dtype)])
    check_against_litert(model, [np.array(True if op in BOOL_OPS else 1.5, dtype)])


@pytest.mark.parametrize("op", NEW_OPS + BOOL_OPS)
def test_new_no_axes_copies(op):
    opdef = lookup(op)
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    if op in BOOL_OPS:
        x = x % 2 == 0
    node = _node(op, (2, 3), np.zeros(0, np.int32), False, (2, 3))
    if op in BOOL_OPS:
        node = _bool_node(node)
    assert [tuple(s) for s in opdef.infer(node)] == [(2, 3)]
    np.testing.assert_array_equal(opdef.reference(node, [x, None])[0], x)


def _bool_node(node):
    from dataclasses import replace
    return replace(node, inputs=(replace(node.inputs[0], dtype=np.dtype(np.bool_)), node.inputs[1]),
                   outputs=(replace(node.outputs[0], dtype=np.dtype(np.bool_)),))


@pytest.mark.parametrize("op", NEW_OPS + BOOL_OPS)
@pytest.mark.parametrize("axes", [[3], [-4], [0, 5]])
def test_new_axis_out_of_range_is_refused(op, axes):
    dtype = np.bool_ if op in BOOL_OPS else np.float32
    model = one_op_model(op, [Input((2, 3, 4), dtype), Const(np.array(axes, np.int32))],
                         [Output((2,), dtype)])
    with pytest.raises(ModelError, match=op):
        run_ours(model, [np.zeros((2, 3, 4), dtype)])


@pytest.mark.parametrize("op", NEW_OPS + BOOL_OPS)
def test_new_axes_given_at_run_time_match_litert(op):
    dtype = np.bool_ if op in BOOL_OPS else np.float32
    model = one_op_model(op, [Input((2, 3), dtype), Input((1,), np.int32)], [Output((2,), dtype)])
    x = np.random.default_rng(4).uniform(0.5, 1.5, (2, 3))
    x = (x > 1.0) if dtype == np.bool_ else x.astype(np.float32)
    for axis in (0, 1):
        check_against_litert(model, [x, np.array([axis], np.int32)])


@pytest.mark.parametrize("in_dtype, out_dtype", [(np.float32, np.bool_), (np.bool_, np.float32)])
def test_reduce_any_needs_bool(in_dtype, out_dtype):
    model = one_op_model("REDUCE_ANY", [Input((2, 3), in_dtype), Const(np.array([1], np.int32))],
                         [Output((2,), out_dtype)])
    with pytest.raises(ModelError, match="REDUCE_ANY.*bool"):
        run_ours(model, [np.zeros((2, 3), in_dtype)])


@given(case=reduction(), seed=S.seeds())
def test_reduce_all_matches_litert(case, seed):
    shape, axes, keep_dims, out = case
    model = one_op_model("REDUCE_ALL", [Input(shape, np.bool_), Const(axes)],
                         [Output(out, np.bool_)], keep_dims=keep_dims)
    check_against_litert(model, [all_inputs(shape, seed)])


def test_reduce_all_of_an_empty_slice_is_true():
    # no elements to be False: True, as np.all and LiteRT's initial value
    model = one_op_model("REDUCE_ALL", [Input((2, 0, 3), np.bool_), Const(np.array([1], np.int32))],
                         [Output((2, 3), np.bool_)])
    actual = check_against_litert(model, [np.zeros((2, 0, 3), bool)])[0]
    assert actual.all()


def test_reduce_all_scalar_input_is_copied():
    model = one_op_model("REDUCE_ALL", [Input((), np.bool_), Const(np.array([0], np.int32))],
                         [Output((), np.bool_)])
    for value in (True, False):
        check_against_litert(model, [np.array(value)])


def test_reduce_all_no_axes_copies():
    node = _bool_node(_node("REDUCE_ALL", (2, 3), np.zeros(0, np.int32), True, (2, 3)))
    x = np.arange(6).reshape(2, 3) % 2 == 0
    assert [tuple(s) for s in lookup("REDUCE_ALL").infer(node)] == [(2, 3)]
    np.testing.assert_array_equal(lookup("REDUCE_ALL").reference(node, [x, None])[0], x)


def test_reduce_all_axes_given_at_run_time_match_litert():
    model = one_op_model("REDUCE_ALL", [Input((2, 3), np.bool_), Input((1,), np.int32)],
                         [Output((2,), np.bool_)])
    x = np.array([[True, True, False], [True, True, True]])
    for axis in (0, 1):
        check_against_litert(model, [x, np.array([axis], np.int32)])


@pytest.mark.parametrize("axes", [[2], [-3], [0, 4]])
def test_reduce_all_axis_out_of_range_is_refused(axes):
    model = one_op_model("REDUCE_ALL", [Input((2, 3), np.bool_), Const(np.array(axes, np.int32))],
                         [Output((2,), np.bool_)])
    with pytest.raises(ModelError, match="REDUCE_ALL.*axis"):
        run_ours(model, [np.zeros((2, 3), bool)])


@pytest.mark.parametrize("in_dtype, out_dtype", [(np.float32, np.bool_), (np.bool_, np.int32)])
def test_reduce_all_needs_bool(in_dtype, out_dtype):
    model = one_op_model("REDUCE_ALL", [Input((2, 3), in_dtype), Const(np.array([1], np.int32))],
                         [Output((2,), out_dtype)])
    with pytest.raises(ModelError, match="REDUCE_ALL.*bool"):
        run_ours(model, [np.zeros((2, 3), in_dtype)])


@given(case=reduction(), seed=S.seeds())
def test_bool_reduce_prod_is_all_as_litert(case, seed):
    """LiteRT's REDUCE_PROD takes bool (the product of 0/1 values: ALL); few False values, so
    the outputs are not all False."""
    shape, axes, keep_dims, out = case
    model = one_op_model("REDUCE_PROD", [Input(shape, np.bool_), Const(axes)],
                         [Output(out, np.bool_)], keep_dims=keep_dims)
    check_against_litert(model, [all_inputs(shape, seed)])
