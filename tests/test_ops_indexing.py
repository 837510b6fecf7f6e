"""GATHER, GATHER_ND, ONE_HOT, ARG_MAX, ARG_MIN, TOPK_V2, WHERE, CUMSUM vs LiteRT through one-op
models: float32, int8 (same quantization in and out, as converters write these ops), int32 and
bool where the ops are used that way; constant and run-time indices; out-of-range indices;
invalid attributes. Tolerances: tflite_taichi.testing."""
import numpy as np
import pytest
from hypothesis import given, strategies as st

from tflite_taichi.errors import InputError, ModelError, TfliteTaichiError
from tflite_taichi.testing import (Const, Input, Output, check_against_litert, one_op_model,
                                   quantize_array, run_litert, run_ours)
from cases.indexing import S, cumsum_case, cumsum_model, gather_case, gather_indices, gather_model, gather_nd_case, gather_nd_indices, gather_nd_model, one_hot_case, one_hot_indices

INDEX_DTYPES = [np.int32, np.int64]


def _values(rng, shape, dtype, levels=None):
    """Input data of `dtype`; `levels`: draw from that many distinct values (ties)."""
    shape = tuple(shape)
    if dtype == np.bool_:
        return rng.integers(0, 2, shape).astype(np.bool_)
    if levels is not None:
        v = rng.integers(-(levels // 2), levels - levels // 2, shape)
        if np.issubdtype(np.dtype(dtype), np.integer):
            return (v * 3).astype(dtype)
        return (v * 0.75).astype(dtype)
    if dtype == np.int8:
        return rng.integers(-128, 128, shape).astype(np.int8)
    if np.issubdtype(np.dtype(dtype), np.integer):
        return rng.integers(-100, 101, shape).astype(dtype)
    return rng.uniform(-3, 3, shape).astype(dtype)


@given(case=gather_case(), const=st.booleans(), idt=st.sampled_from(INDEX_DTYPES),
       seed=S.seeds())
def test_gather_float32_matches_litert(case, const, idt, seed):
    indices = gather_indices(case, seed, idt)
    x = _values(np.random.default_rng(seed), case[0], np.float32)
    model = gather_model(case, indices, const)
    check_against_litert(model, [x] if const else [x, indices])


@given(case=gather_case(), const=st.booleans(), q=S.quant_params(), seed=S.seeds())
def test_gather_int8_matches_litert(case, const, q, seed):
    indices = gather_indices(case, seed)
    x = _values(np.random.default_rng(seed), case[0], np.int8)
    model = gather_model(case, indices, const, np.int8, q)
    check_against_litert(model, [x] if const else [x, indices])


@given(case=gather_case(), dtype=st.sampled_from([np.int32, np.bool_]), seed=S.seeds())
def test_gather_int32_and_bool_match_litert(case, dtype, seed):
    indices = gather_indices(case, seed)
    x = _values(np.random.default_rng(seed), case[0], dtype)
    check_against_litert(gather_model(case, indices, False, dtype), [x, indices])


def test_gather_runtime_index_out_of_range_is_an_error():
    model = one_op_model("GATHER", [Input((4, 3)), Input((2,), np.int32)], [Output((2, 3))])
    x = np.ones((4, 3), np.float32)
    for bad in (4, -1):
        indices = np.array([0, bad], np.int32)
        with pytest.raises(RuntimeError, match="out of bounds|positive"):
            run_litert(model, [x, indices])              # LiteRT refuses it at invoke
        with pytest.raises(InputError, match=r"GATHER.*index -?\d+ at \[1\] is out of range"):
            run_ours(model, [x, indices])


def test_gather_constant_index_out_of_range_is_a_model_error():
    model = one_op_model("GATHER", [Input((2, 4, 3)), Const(np.array([0, 3], np.int32))],
                         [Output((2, 4, 2))], axis=-1)
    with pytest.raises(ModelError, match=r"GATHER.*index 3 .*\[0, 3\)"):
        run_ours(model, [np.ones((2, 4, 3), np.float32)])


@pytest.mark.parametrize("axis, batch_dims, ishape, message", [
    (2, 0, (2,), "axis 2 is out of range"),
    (-3, 0, (2,), "axis -3 is out of range"),
    (0, 1, (2, 2), "batch_dims 1 must not exceed the axis 0"),
    (1, 1, (3, 2), "batch dimension 0 differs"),
    (1, 3, (2, 2), "batch_dims 3 is out of range"),
])
def test_gather_invalid_attributes(axis, batch_dims, ishape, message):
    model = one_op_model("GATHER", [Input((2, 4)), Const(np.zeros(ishape, np.int32))],
                         [Output((2,))], axis=axis, batch_dims=batch_dims)
    with pytest.raises(ModelError, match=f"GATHER.*{message}"):
        run_ours(model, [np.ones((2, 4), np.float32)])


def test_gather_float_indices_are_refused():
    model = one_op_model("GATHER", [Input((4,)), Const(np.array([1.0], np.float32))],
                         [Output((1,))])
    with pytest.raises(ModelError, match="GATHER.*indices must be"):
        run_ours(model, [np.ones(4, np.float32)])


@given(case=gather_nd_case(), const=st.booleans(), idt=st.sampled_from(INDEX_DTYPES),
       seed=S.seeds())
def test_gather_nd_float32_matches_litert(case, const, idt, seed):
    indices = gather_nd_indices(case, seed, idt)
    x = _values(np.random.default_rng(seed), case[0], np.float32)
    check_against_litert(gather_nd_model(case, indices, const), [x] if const else [x, indices])


@given(case=gather_nd_case(), dtype=st.sampled_from([np.int8, np.int32]), q=S.quant_params(),
       seed=S.seeds())
def test_gather_nd_int8_and_int32_match_litert(case, dtype, q, seed):
    indices = gather_nd_indices(case, seed)
    x = _values(np.random.default_rng(seed), case[0], dtype)
    model = gather_nd_model(case, indices, True, dtype, q if dtype == np.int8 else None)
    check_against_litert(model, [x])


@pytest.mark.parametrize("row", [[3, 0], [0, 5], [1, -1]])
def test_gather_nd_runtime_index_out_of_range_is_an_error(row):
    # [0, 5] would be in range of the flattened params: still out of range per dimension
    model = one_op_model("GATHER_ND", [Input((3, 5)), Input((1, 2), np.int32)], [Output((1,))])
    x, indices = np.ones((3, 5), np.float32), np.array([row], np.int32)
    with pytest.raises(RuntimeError, match="out of bounds|positive"):
        run_litert(model, [x, indices])
    with pytest.raises(InputError, match="GATHER_ND.*out of range"):
        run_ours(model, [x, indices])


def test_gather_nd_constant_index_out_of_range_is_a_model_error():
    model = one_op_model("GATHER_ND", [Input((3, 5)), Const(np.array([[2, 5]], np.int32))],
                         [Output((1,))])
    with pytest.raises(ModelError, match=r"GATHER_ND.*index \(dimension 1\) 5"):
        run_ours(model, [np.ones((3, 5), np.float32)])


@pytest.mark.parametrize("ishape, message", [((2, 3), "exceed the params' rank 2"),
                                             ((2, 0), "index rows are empty"),
                                             ((), "at least one dimension")])
def test_gather_nd_invalid_indices(ishape, message):
    model = one_op_model("GATHER_ND", [Input((3, 5)), Const(np.zeros(ishape, np.int32))],
                         [Output((2,))])
    with pytest.raises(ModelError, match=f"GATHER_ND.*{message}"):
        run_ours(model, [np.ones((3, 5), np.float32)])


def one_hot_model(case, indices, on, off, const_indices=False, runtime_values=False, q=None):
    ishape, depth, axis, out = case
    dtype = np.asarray(on).dtype
    ind = Const(indices) if const_indices else Input(ishape, np.int32)
    if runtime_values:
        values = [Input((), dtype, q), Input((), dtype, q)]
    else:
        values = [Const(np.asarray(on), q), Const(np.asarray(off), q)]
    return one_op_model("ONE_HOT", [ind, Const(np.array(depth, np.int32))] + values,
                        [Output(out, dtype, q)], axis=axis)


@given(case=one_hot_case(), const_indices=st.booleans(), on=st.floats(-5, 5, width=32),
       off=st.floats(-5, 5, width=32), seed=S.seeds())
def test_one_hot_float32_matches_litert(case, const_indices, on, off, seed):
    indices = one_hot_indices(case, seed)
    on, off = np.float32(on), np.float32(off)
    # constant indices with constant values would fold: then on/off come at run time
    model = one_hot_model(case, indices, on, off, const_indices, runtime_values=const_indices)
    inputs = [np.array(on), np.array(off)] if const_indices else [indices]
    check_against_litert(model, inputs)


@given(case=one_hot_case(), dtype=st.sampled_from([np.int8, np.int32, np.bool_]),
       q=S.quant_params(), seed=S.seeds())
def test_one_hot_int8_int32_bool_match_litert(case, dtype, q, seed):
    rng = np.random.default_rng(seed)
    on, off = _values(rng, (2,), dtype)
    model = one_hot_model(case, None, on, off, q=q if dtype == np.int8 else None)
    check_against_litert(model, [one_hot_indices(case, seed)])


@pytest.mark.parametrize("axis, depth, off, message", [
    (-2, 3, np.float32(0), "axis -2 is out of range"),
    (2, 3, np.float32(0), "axis 2 is out of range"),
    (0, -1, np.float32(0), "depth must be >= 0"),
    (0, 3, np.int32(0), "off_value is int32, the output is float32"),
])
def test_one_hot_invalid_attributes(axis, depth, off, message):
    model = one_op_model("ONE_HOT", [Input((2,), np.int32), Const(np.array(depth, np.int32)),
                                     Const(np.array(1, np.float32)), Const(np.array(off))],
                         [Output((2, 3))], axis=axis)
    with pytest.raises(ModelError, match=f"ONE_HOT.*{message}"):
        run_ours(model, [np.zeros(2, np.int32)])


def test_one_hot_runtime_depth_matches_litert():
    # a run-time depth: the op is inferred at invoke, as LiteRT's dynamic output
    model = one_op_model("ONE_HOT", [Input((2,), np.int32), Input((), np.int32),
                                     Const(np.array(1, np.float32)),
                                     Const(np.array(0, np.float32))],
                         [Output((2, 3))])
    check_against_litert(model, [np.array([2, 0], np.int32), np.array(3, np.int32)])


# -- ARG_MAX / ARG_MIN ------------------------------------------------------------------------
ARG_OPS = ["ARG_MAX", "ARG_MIN"]


@st.composite
def arg_case(draw):
    """(input shape, axis tensor, output shape); the axis scalar or [1], int32 or int64."""
    shape = draw(S.shapes(1, 4, 1, 6))
    rank = len(shape)
    axis = draw(st.integers(-rank, rank - 1))
    value = np.array(axis if draw(st.booleans()) else [axis],
                     draw(st.sampled_from(INDEX_DTYPES)))
    return shape, value, tuple(d for i, d in enumerate(shape) if i != axis % rank)


def arg_model(op, case, dtype=np.float32, q=None, out_dtype=np.int32):
    shape, axis, out = case
    return one_op_model(op, [Input(shape, dtype, q), Const(axis)], [Output(out, out_dtype)],
                        output_type="INT32" if out_dtype == np.int32 else "INT64")


@pytest.mark.parametrize("op", ARG_OPS)
@given(case=arg_case(), dtype=st.sampled_from([np.float32, np.int8, np.int32, np.uint8, np.bool_]),
       out_dtype=st.sampled_from([np.int32, np.int64]), q=S.quant_params(),
       ties=st.booleans(), seed=S.seeds())
def test_arg_matches_litert(op, case, dtype, out_dtype, q, ties, seed):
    # `ties`: a few distinct values, so that equal extremes are common (LiteRT: the first one)
    rng = np.random.default_rng(seed)
    x = _values(rng, case[0], dtype, levels=3 if ties else None)
    if dtype == np.uint8:
        x = rng.integers(0, 3 if ties else 256, case[0]).astype(np.uint8)
    model = arg_model(op, case, dtype, q if dtype == np.int8 else None, out_dtype)
    check_against_litert(model, [x])


@pytest.mark.parametrize("op", ARG_OPS)
def test_arg_ties_give_the_first_index(op):
    x = np.array([[1.0, 3.0, 3.0, -2.0, -2.0], [0.0, -0.0, 0.0, 0.0, 0.0]], np.float32)
    model = arg_model(op, ((2, 5), np.array(1, np.int32), (2,)))
    out = check_against_litert(model, [x])[0]
    np.testing.assert_array_equal(out, [1, 0] if op == "ARG_MAX" else [3, 0])


@pytest.mark.parametrize("op", ARG_OPS)
@pytest.mark.parametrize("axis, output_type, out_dtype, message", [
    (2, "INT32", np.int32, "axis 2 is out of range"),
    (-3, "INT32", np.int32, "axis -3 is out of range"),
    (0, "INT64", np.int32, "output_type int64 does not match"),
    (0, "FLOAT32", np.float32, "output must be int32 or int64"),
])
def test_arg_invalid_attributes(op, axis, output_type, out_dtype, message):
    model = one_op_model(op, [Input((2, 3)), Const(np.array([axis], np.int32))],
                         [Output((3,), out_dtype)], output_type=output_type)
    with pytest.raises(ModelError, match=f"{op}.*{message}"):
        run_ours(model, [np.zeros((2, 3), np.float32)])


@pytest.mark.parametrize("op", ARG_OPS)
def test_arg_runtime_axis_matches_litert(op):
    model = one_op_model(op, [Input((2, 3)), Input((1,), np.int32)], [Output((3,), np.int32)],
                         output_type="INT32")
    x = np.random.default_rng(1).uniform(-1, 1, (2, 3)).astype(np.float32)
    for axis in (0, 1):
        check_against_litert(model, [x, np.array([axis], np.int32)])


# -- TOPK_V2 ----------------------------------------------------------------------------------
@st.composite
def topk_case(draw):
    """(input shape, k, output shape)."""
    shape = draw(S.shapes(1, 3, 1, 8))
    k = draw(st.integers(0, shape[-1]))
    return shape, k, tuple(shape[:-1]) + (k,)


def topk_model(case, dtype=np.float32, q=None):
    shape, k, out = case
    return one_op_model("TOPK_V2", [Input(shape, dtype, q), Const(np.array(k, np.int32))],
                        [Output(out, dtype, q), Output(out, np.int32)])


@given(case=topk_case(), dtype=st.sampled_from([np.float32, np.int8, np.int32]),
       q=S.quant_params(), ties=st.booleans(), seed=S.seeds())
def test_topk_matches_litert(case, dtype, q, ties, seed):
    x = _values(np.random.default_rng(seed), case[0], dtype, levels=3 if ties else None)
    check_against_litert(topk_model(case, dtype, q if dtype == np.int8 else None), [x])


def test_topk_ties_keep_index_order():
    x = np.array([[1, 5, 5, 0, 5], [0, 0, -3, 0, 0]], np.float32)
    values, indices = check_against_litert(topk_model(((2, 5), 3, (2, 3))), [x])
    np.testing.assert_array_equal(indices, [[1, 2, 4], [0, 1, 3]])
    np.testing.assert_array_equal(values, [[5, 5, 5], [0, 0, 0]])


@pytest.mark.parametrize("k, message", [(6, "k = 6 is out of range"),
                                        (-1, "k = -1 is out of range")])
def test_topk_invalid_k(k, message):
    model = topk_model(((2, 5), k, (2, 5)))
    with pytest.raises(ModelError, match=f"TOPK_V2.*{message}"):
        run_ours(model, [np.zeros((2, 5), np.float32)])


def test_topk_runtime_k_matches_litert():
    model = one_op_model("TOPK_V2", [Input((2, 5)), Input((), np.int32)],
                         [Output((2, 2)), Output((2, 2), np.int32)])
    x = np.random.default_rng(2).permutation(10).reshape(2, 5).astype(np.float32)   # no ties
    for k in (1, 3):
        check_against_litert(model, [x, np.array(k, np.int32)])


# -- WHERE ------------------------------------------------------------------------------------
# A known condition folds at prepare (those one-op models have no inputs); a run-time one gives
# a data-dependent output shape.
@given(shape=S.shapes(1, 4, 1, 5), dtype=st.sampled_from([np.bool_, np.float32, np.int32, np.int8]),
       q=S.quant_params(), seed=S.seeds())
def test_where_constant_condition_matches_litert(shape, dtype, q, seed):
    rng = np.random.default_rng(seed)
    cond = _values(rng, shape, dtype, levels=None if dtype == np.bool_ else 3)
    q = q if dtype == np.int8 else None
    if dtype == np.int8:        # raw values near the zero point: LiteRT tests the stored value
        cond = (rng.integers(-1, 2, shape) + q[1]).clip(-128, 127).astype(np.int8)
    n = int(np.count_nonzero(cond))
    model = one_op_model("WHERE", [Const(cond, q)], [Output((n, len(shape)), np.int64)])
    check_against_litert(model, [])


def test_where_scalar_condition_is_refused():
    model = one_op_model("WHERE", [Const(np.array(True))], [Output((1, 0), np.int64)])
    with pytest.raises(RuntimeError, match="rank > 0"):
        run_litert(model, [])
    with pytest.raises(ModelError, match="WHERE.*at least one dimension"):
        run_ours(model, [])


@given(shape=S.shapes(1, 4, 1, 5), dtype=st.sampled_from([np.bool_, np.float32, np.int32, np.int8]),
       q=S.quant_params(), seed=S.seeds())
def test_where_runtime_condition_matches_litert(shape, dtype, q, seed):
    """A run-time condition: the output's shape is inferred again at each invoke (graph.run_step,
    a data-dependent shape); the declared [1, rank] is a placeholder, as converters write it."""
    rng = np.random.default_rng(seed)
    cond = _values(rng, shape, dtype, levels=None if dtype == np.bool_ else 3)
    q = q if dtype == np.int8 else None
    if dtype == np.int8:
        cond = (rng.integers(-1, 2, shape) + q[1]).clip(-128, 127).astype(np.int8)
    model = one_op_model("WHERE", [Input(shape, dtype, q)], [Output((1, len(shape)), np.int64)])
    if np.count_nonzero(cond) == 0:     # (int8: the stored integers, which LiteRT tests)
        # no true element: LiteRT's get_tensor fails on the empty output ("Invalid tensor size")
        (out,) = run_ours(model, [cond])
        assert out.shape == (0, len(shape)) and out.dtype == np.int64
        return
    check_against_litert(model, [cond])


@given(case=cumsum_case(), dtype=st.sampled_from([np.float32, np.int32]),
       const_axis=st.booleans(), seed=S.seeds())
def test_cumsum_matches_litert(case, dtype, const_axis, seed):
    x = _values(np.random.default_rng(seed), case[0], dtype)
    model = cumsum_model(case, dtype, const_axis=const_axis)
    check_against_litert(model, [x] if const_axis else [x, case[1]])


def test_cumsum_int32_wraps_as_litert():
    x = np.array([2**30, 2**30, 2**30, -5], np.int32)
    out = check_against_litert(cumsum_model(((4,), np.array(0, np.int32), False, False), np.int32),
                               [x])[0]
    assert out[1] == -2**31


@given(case=cumsum_case(), qi=S.quant_params(), qo=S.quant_params(scale_range=(0.02, 0.5)),
       seed=S.seeds())
def test_cumsum_int8_is_the_real_sum_on_the_output_grid(case, qi, qo, seed):
    # LiteRT has no int8 CUMSUM (its Prepare refuses it); ours sums the real values (float
    # view) and snaps them to the output's grid: checked against that numpy formula.
    shape, axis, exclusive, reverse = case
    x = _values(np.random.default_rng(seed), shape, np.int8)
    real = ((x.astype(np.float32) - qi[1]) * np.float32(qi[0])).astype(np.float32)
    a = int(axis.reshape(-1)[0]) % len(shape)
    r = np.flip(real, a) if reverse else real
    s = np.cumsum(r, axis=a, dtype=np.float32)
    if exclusive:
        s = np.concatenate([np.zeros_like(np.take(s, [0], axis=a)), np.delete(s, -1, axis=a)],
                           axis=a)
    s = np.flip(s, a) if reverse else s
    expected = quantize_array(s, qo)
    out = run_ours(cumsum_model(case, np.int8, qi, qo), [x])[0]
    np.testing.assert_array_equal(out, expected)


@pytest.mark.parametrize("axis, message", [(np.array(2, np.int32), "axis 2 is out of range"),
                                           (np.array([0, 1], np.int32), "must hold one value"),
                                           (np.array(0.0, np.float32), "axis must be a int32")])
def test_cumsum_invalid_axis(axis, message):
    model = one_op_model("CUMSUM", [Input((2, 3)), Const(axis)], [Output((2, 3))])
    with pytest.raises(ModelError, match=f"CUMSUM.*{message}"):
        run_ours(model, [np.zeros((2, 3), np.float32)])


def test_cumsum_of_bool_is_refused():
    model = one_op_model("CUMSUM", [Input((2, 3), np.bool_), Const(np.array(0, np.int32))],
                         [Output((2, 3), np.bool_)])
    with pytest.raises(ModelError, match="CUMSUM.*cannot sum a bool tensor"):
        run_ours(model, [np.zeros((2, 3), bool)])


def test_cumsum_runtime_axis_out_of_range_is_an_error():
    model = one_op_model("CUMSUM", [Input((2, 3)), Input((), np.int32)], [Output((2, 3))])
    with pytest.raises(InputError, match="CUMSUM.*axis 5 is out of range"):
        run_ours(model, [np.zeros((2, 3), np.float32), np.array(5, np.int32)])


def test_errors_are_never_bare_index_errors():
    # every refusal above is one of the package's errors, never an IndexError from numpy
    model = one_op_model("GATHER", [Input((4,)), Input((3,), np.int32)], [Output((3,))])
    with pytest.raises(TfliteTaichiError) as info:
        run_ours(model, [np.ones(4, np.float32), np.array([0, 1, 99], np.int32)])
    assert not isinstance(info.value, IndexError)
