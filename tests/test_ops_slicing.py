"""PAD, PADV2, SLICE, STRIDED_SLICE, SPLIT, SPLIT_V vs LiteRT through one-op models: float32, int8 (input and
output share their quantization, as LiteRT requires) and int32. STRIDED_SLICE cases where
LiteRT is wrong (docs/ops.md, "The oracle's own caveats") are checked against numpy indexing.
Tolerances: tflite_taichi.testing."""
import numpy as np
import pytest
from hypothesis import assume, given, strategies as st

from tflite_taichi.testing import (Const, Input, Output, check_against_litert, one_op_model,
                                   quantize_array, run_ours)

# shared with the shape family's tests: tensor dtypes, int32 constants, the ModelError check
from cases.shape import DTYPES, _expect_error, _i32, tensor_type  # noqa: E402
from cases.slicing import S, _litert_is_wrong, numpy_index, offset_case, pad_case, slice_case, split_case, split_v_case, strided_spec


@pytest.mark.parametrize("dtype", DTYPES)
@given(case=pad_case(), data=st.data(), int64_pads=st.booleans(), seed=S.seeds())
def test_pad_matches_litert(dtype, case, data, int64_pads, seed):
    shape, pads, out = case
    t, q = data.draw(tensor_type(dtype))
    pads = pads.astype(np.int64 if int64_pads else np.int32)
    model = one_op_model("PAD", [Input(shape, t, q), Const(pads)], [Output(out, t, q)])
    check_against_litert(model, seed=seed)


@pytest.mark.parametrize("dtype", DTYPES)
@given(case=pad_case(), data=st.data(), value=st.floats(-4, 4), scalar=st.booleans(),
       seed=S.seeds())
def test_padv2_matches_litert(dtype, case, data, value, scalar, seed):
    shape, pads, out = case
    t, q = data.draw(tensor_type(dtype))
    vshape = () if scalar else (1,)
    if dtype == "int8":
        # LiteRT requires the pad value to share the output's quantization.
        const = Const(quantize_array(np.full(vshape, value), q), quantization=q)
    else:
        const = Const(np.full(vshape, value).astype(t))
    model = one_op_model("PADV2", [Input(shape, t, q), Const(pads), const], [Output(out, t, q)])
    check_against_litert(model, seed=seed)


def test_pad_int8_pads_with_the_zero_point():
    q = (0.05, 17)
    model = one_op_model("PAD", [Input((2,), np.int8, q), _i32([[1, 2]])], [Output((5,), np.int8, q)])
    out, = run_ours(model, [np.array([-5, 100], np.int8)])
    np.testing.assert_array_equal(out, [17, -5, 100, 17, 17])


def test_pad_errors():
    _expect_error(one_op_model("PAD", [Input((2, 3)), _i32([[1, 1], [-1, 0]])], [Output((4, 2))]),
                  "PAD", "negative padding")
    _expect_error(one_op_model("PAD", [Input((2, 3)), _i32([[1, 1]])], [Output((4, 3))]),
                  "PAD", "[2, 2]")
    _expect_error(one_op_model("PADV2", [Input((2, 3)), _i32([[1, 1], [0, 0]]),
                                         Const(np.zeros(2, np.float32))], [Output((4, 3))]),
                  "PADV2", "one element")


@pytest.mark.parametrize("dtype", DTYPES)
@given(case=slice_case(), data=st.data(), index_dtype=st.sampled_from([np.int32, np.int64]),
       seed=S.seeds())
def test_slice_matches_litert(dtype, case, data, index_dtype, seed):
    shape, begin, size, out = case
    t, q = data.draw(tensor_type(dtype))
    model = one_op_model("SLICE", [Input(shape, t, q), Const(np.array(begin, index_dtype)),
                                   Const(np.array(size, index_dtype))], [Output(out, t, q)])
    check_against_litert(model, seed=seed)


def test_slice_errors():
    x = Input((4, 5))
    _expect_error(one_op_model("SLICE", [x, _i32([2, 0]), _i32([3, -1])], [Output((3, 5))]),
                  "SLICE", "do not fit")
    _expect_error(one_op_model("SLICE", [x, _i32([-1, 0]), _i32([1, 1])], [Output((1, 1))]),
                  "SLICE", "do not fit")
    _expect_error(one_op_model("SLICE", [x, _i32([0]), _i32([1])], [Output((1, 5))]),
                  "SLICE", "begin has 1 entries")


def _strided_model(shape, t, q, begin, end, strides, out_shape, **options):
    return one_op_model("STRIDED_SLICE", [Input(shape, t, q), _i32(begin), _i32(end), _i32(strides)],
                        [Output(out_shape, t, q)], **options)


@pytest.mark.parametrize("dtype", DTYPES)
@given(shape=S.shapes(1, 4, 1, 6), data=st.data(), seed=S.seeds())
def test_strided_slice_matches_litert(dtype, shape, data, seed):
    t, q = data.draw(tensor_type(dtype))
    begin, end, strides, masks, kinds = data.draw(strided_spec(shape, litert_safe=True))
    assume(not _litert_is_wrong(shape, kinds, strides, masks))
    expected_shape = np.empty(shape)[numpy_index(begin, end, strides, masks, kinds)].shape
    model = _strided_model(shape, t, q, begin, end, strides, expected_shape, **masks)
    out, = check_against_litert(model, seed=seed)
    assert out.shape == expected_shape


@pytest.mark.parametrize("dtype", ["float32", "int8"])
@given(shape=S.shapes(1, 4, 1, 6), data=st.data(), seed=S.seeds())
def test_strided_slice_matches_numpy(dtype, shape, data, seed):
    """Every spec, the ones LiteRT gets wrong included, against numpy indexing."""
    t, q = data.draw(tensor_type(dtype))
    begin, end, strides, masks, kinds = data.draw(strided_spec(shape))
    index = numpy_index(begin, end, strides, masks, kinds)
    rng = np.random.default_rng(seed)
    x = (rng.integers(-128, 128, shape).astype(np.int8) if q
         else rng.uniform(-3, 3, shape).astype(np.float32))
    model = _strided_model(shape, t, q, begin, end, strides, x[index].shape, **masks)
    out, = run_ours(model, [x])
    np.testing.assert_array_equal(out, x[index])


@pytest.mark.parametrize("index_text, shape", [
    ("[..., None, 1:3]", (2, 3, 4)),
    ("[None, ..., 0]", (2, 3, 4)),
    ("[1, None, ..., None, ::-1]", (2, 3, 4, 5)),
    ("[..., 0:1, 1:2, 2:3]", (2, 3, 4)),      # the ellipsis covers nothing and is not last
    ("[0, ..., 1:2, ::2]", (2, 3, 4)),
    ("[1:, ..., 2, None]", (2, 3)),
])
def test_strided_slice_litert_caveats_follow_numpy(index_text, shape):
    """Hand-written index expressions from docs/ops.md's caveats, as the converter encodes them."""
    index = eval(f"np.s_{index_text}")
    begin, end, strides, masks = [], [], [], dict(begin_mask=0, end_mask=0, ellipsis_mask=0,
                                                  new_axis_mask=0, shrink_axis_mask=0)
    for i, item in enumerate(index):
        b, e, s = 0, 0, 1
        if item is Ellipsis:
            masks["ellipsis_mask"] |= 1 << i
        elif item is None:
            masks["new_axis_mask"] |= 1 << i
        elif isinstance(item, int):
            b, e = item, item + 1
            masks["shrink_axis_mask"] |= 1 << i
        else:
            s = item.step or 1
            if item.start is None:
                masks["begin_mask"] |= 1 << i
            else:
                b = item.start
            if item.stop is None:
                masks["end_mask"] |= 1 << i
            else:
                e = item.stop
        begin.append(b)
        end.append(e)
        strides.append(s)
    x = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
    model = _strided_model(shape, np.float32, None, begin, end, strides, x[index].shape, **masks)
    out, = run_ours(model, [x])
    np.testing.assert_array_equal(out, x[index])


@pytest.mark.parametrize("dtype", DTYPES)
@given(case=offset_case(), data=st.data(), seed=S.seeds())
def test_strided_slice_offset_matches_litert(dtype, case, data, seed):
    shape, begin, size, strides = case
    t, q = data.draw(tensor_type(dtype))
    out_shape = tuple(max(-(-s // st_), 0) for s, st_ in zip(size, strides))
    model = _strided_model(shape, t, q, begin, size, strides, out_shape, offset=True)
    out, = check_against_litert(model, seed=seed)
    assert out.shape == out_shape


def test_strided_slice_offset_with_a_begin_known_only_at_run_time():
    """offset=True: the output shape needs only end and strides; begin may be an input. A start
    that would run past the end is clamped to keep the window inside (XLA dynamic_slice)."""
    model = one_op_model("STRIDED_SLICE", [Input((6, 4)), Input((2,), np.int32),
                                           _i32([3, 2]), _i32([1, 1])], [Output((3, 2))],
                         offset=True)
    x = np.arange(24, dtype=np.float32).reshape(6, 4)
    out, = run_ours(model, [x, np.array([1, 1], np.int32)])
    np.testing.assert_array_equal(out, x[1:4, 1:3])
    out, = run_ours(model, [x, np.array([5, 3], np.int32)])
    np.testing.assert_array_equal(out, x[3:6, 2:4])
    # a reversed window down to element 0 (LiteRT returns garbage for this one)
    model = one_op_model("STRIDED_SLICE", [Input((4,)), _i32([2]), _i32([-3]), _i32([-1])],
                         [Output((3,))], offset=True)
    x = np.arange(4, dtype=np.float32)
    np.testing.assert_array_equal(run_ours(model, [x])[0], x[2::-1])


def test_strided_slice_errors():
    x = Input((4, 5))
    _expect_error(_strided_model((4, 5), np.float32, None, [0, 0], [2, 2], [1, 0], (2, 2)),
                  "STRIDED_SLICE", "stride 1 is 0")
    _expect_error(_strided_model((4, 5), np.float32, None, [0, 0], [2, 2], [1, 1], (4, 5),
                                 ellipsis_mask=3), "STRIDED_SLICE", "more than one ellipsis")
    _expect_error(_strided_model((4, 5), np.float32, None, [4, 0], [5, 2], [1, 1], (2,),
                                 shrink_axis_mask=1), "STRIDED_SLICE", "out of range")
    _expect_error(_strided_model((4, 5), np.float32, None, [0, 0, 0], [1, 1, 1], [1, 1, 1], (1, 1)),
                  "STRIDED_SLICE", "indexes 3 dimensions")
    _expect_error(one_op_model("STRIDED_SLICE", [x, _i32([0, 0]), _i32([1, 1, 1]), _i32([1, 1])],
                               [Output((1, 1))]), "STRIDED_SLICE", "expected 3")
    _expect_error(_strided_model((4, 5), np.float32, None, [0, 0], [5, 2], [1, 1], (5, 2),
                                 offset=True), "STRIDED_SLICE", "does not fit")


# -- SPLIT / SPLIT_V --------------------------------------------------------------------------
def _axis_const(axis, scalar):
    return _i32(axis if scalar else [axis])


@pytest.mark.parametrize("dtype", DTYPES)
@given(case=split_case(), data=st.data(), scalar_axis=st.booleans(), seed=S.seeds())
def test_split_matches_litert(dtype, case, data, scalar_axis, seed):
    shape, axis, num, out = case
    t, q = data.draw(tensor_type(dtype))
    model = one_op_model("SPLIT", [_axis_const(axis, scalar_axis), Input(shape, t, q)],
                         [Output(out, t, q) for _ in range(num)], num_splits=num)
    results = check_against_litert(model, seed=seed)
    assert len(results) == num


@pytest.mark.parametrize("dtype", DTYPES)
@given(case=split_v_case(), data=st.data(), scalar_axis=st.booleans(),
       sizes_dtype=st.sampled_from([np.int32, np.int64]), seed=S.seeds())
def test_split_v_matches_litert(dtype, case, data, scalar_axis, sizes_dtype, seed):
    shape, axis, size_splits, outs = case
    t, q = data.draw(tensor_type(dtype))
    model = one_op_model("SPLIT_V", [Input(shape, t, q), Const(np.array(size_splits, sizes_dtype)),
                                     _axis_const(axis, scalar_axis)],
                         [Output(o, t, q) for o in outs], num_splits=len(outs))
    results = check_against_litert(model, seed=seed)
    assert [r.shape for r in results] == outs


def test_split_errors():
    x = Input((4, 6))
    _expect_error(one_op_model("SPLIT", [_i32(1), x], [Output((4, 6 // 4))] * 4, num_splits=4),
                  "SPLIT", "does not split into 4 equal parts")
    _expect_error(one_op_model("SPLIT", [_i32(2), x], [Output((4, 3))] * 2, num_splits=2),
                  "SPLIT", "axis 2 is out of range")
    _expect_error(one_op_model("SPLIT", [_i32(1), x], [Output((4, 3))] * 2, num_splits=3),
                  "SPLIT", "num_splits is 3 but the op has 2 outputs")
    _expect_error(one_op_model("SPLIT", [_i32([0, 1]), x], [Output((2, 6))] * 2, num_splits=2),
                  "SPLIT", "one value")


def test_split_v_errors():
    x = Input((4, 6))
    two = [Output((4, 3))] * 2
    _expect_error(one_op_model("SPLIT_V", [x, _i32([-1, -1]), _i32(1)], two, num_splits=2),
                  "SPLIT_V", "more than one -1")
    _expect_error(one_op_model("SPLIT_V", [x, _i32([2, 3]), _i32(1)], two, num_splits=2),
                  "SPLIT_V", "add up to 5")
    _expect_error(one_op_model("SPLIT_V", [x, _i32([7, -1]), _i32(1)], two, num_splits=2),
                  "SPLIT_V", "add up to more than")
    _expect_error(one_op_model("SPLIT_V", [x, _i32([3, 3]), _i32(1)], two, num_splits=3),
                  "SPLIT_V", "num_splits is 3 but size_splits has 2")
    _expect_error(one_op_model("SPLIT_V", [x, _i32([3, 3]), _i32(-3)], two, num_splits=2),
                  "SPLIT_V", "axis -3 is out of range")
    _expect_error(one_op_model("SPLIT_V", [x, _i32([3, -2]), _i32(1)], two, num_splits=2),
                  "SPLIT_V", "negative size")


# -- DYNAMIC_UPDATE_SLICE ---------------------------------------------------------------------
@st.composite
def dynamic_update_case(draw):
    shape = draw(S.shapes(1, 4, 1, 5))
    update = tuple(draw(st.integers(1, n)) for n in shape)
    # starts beyond either end are clamped (LiteRT and XLA), so draw some there too
    starts = [draw(st.integers(-2, n + 1)) for n in shape]
    return shape, update, starts


@given(case=dynamic_update_case(), dtype=st.sampled_from(["float32", "int8", "int32"]),
       index_dtype=st.sampled_from([np.int32, np.int64]), seed=S.seeds(), data=st.data())
def test_dynamic_update_slice_matches_litert(case, dtype, index_dtype, seed, data):
    shape, update_shape, starts = case
    if dtype == "int8":
        q = data.draw(S.quant_params())
        np_dtype = np.int8
    else:
        q, np_dtype = None, np.dtype(dtype).type
    model = one_op_model("DYNAMIC_UPDATE_SLICE", [Input(shape, np_dtype, q), Input(update_shape, np_dtype, q),
                                                  Input((len(shape),), index_dtype)],
                         [Output(shape, np_dtype, q)])
    rng = np.random.default_rng(seed)
    if np_dtype == np.float32:
        operand, update = (rng.uniform(-3, 3, s).astype(np.float32) for s in (shape, update_shape))
    else:
        lo, hi = (-128, 127) if np_dtype == np.int8 else (-1000, 1000)
        operand, update = (rng.integers(lo, hi + 1, s).astype(np_dtype) for s in (shape, update_shape))
    out = check_against_litert(model, [operand, update, np.array(starts, index_dtype)], units=0)
    assert out[0].dtype == np.dtype(np_dtype)


def test_dynamic_update_slice_refuses_a_second_grid():
    a, b = (0.1, 0), (0.2, 0)
    model = one_op_model("DYNAMIC_UPDATE_SLICE", [Input((4,), np.int8, a), Input((2,), np.int8, b),
                                                  Input((1,), np.int32)], [Output((4,), np.int8, a)])
    _expect_error(model, "DYNAMIC_UPDATE_SLICE", "share one quantization")
