"""RESHAPE, SHAPE, PACK, UNPACK, EXPAND_DIMS, SQUEEZE, TRANSPOSE, CONCATENATION, DEPTH_TO_SPACE,
SPACE_TO_DEPTH vs LiteRT through one-op models: float32, int8 (inputs and outputs share their quantization, as LiteRT requires
for these ops) and int32. Tolerances: tflite_taichi.testing.
BROADCAST_ARGS (int32/int64, constant or run-time shapes) and BITCAST (every pair of 13 dtypes,
arbitrary bytes, quantized int8 -> uint8) vs LiteRT too, BITCAST byte for byte; the cases where
LiteRT aborts (shapes that do not broadcast) are errors here."""
import numpy as np
import pytest
from hypothesis import given, strategies as st

from tflite_taichi.builder import ModelBuilder
from tflite_taichi.errors import ModelError
from tflite_taichi.quant import round_half_away
from tflite_taichi.testing import (Const, Input, Output, check_against_litert, model_inputs,
                                   one_op_model, run_litert, run_ours)
from cases.shape import DTYPES, S, _expect_error, _i32, concat_case, depth_to_space_case, reshape_case, squeeze_case, tensor_type


@pytest.mark.parametrize("dtype", DTYPES)
@given(case=reshape_case(), data=st.data(), how=st.sampled_from(["input", "options", "both"]),
       seed=S.seeds())
def test_reshape_matches_litert(dtype, case, data, how, seed):
    shape, new_shape, out = case
    t, q = data.draw(tensor_type(dtype))
    inputs = [Input(shape, t, q)]
    options = {}
    if how in ("input", "both"):
        inputs.append(_i32(new_shape))
    if how in ("options", "both"):
        options["new_shape"] = new_shape
    model = one_op_model("RESHAPE", inputs, [Output(out, t, q)], **options)
    result, = check_against_litert(model, seed=seed)
    assert result.shape == out


def _chain_model(shape_from_input_shape: bool):
    """x (2, 3, 4) -> RESHAPE to [-1 or 6, 4]; the shape is built by ops, not stored.

    shape_from_input_shape: SHAPE(x) -> STRIDED_SLICE -> CONCATENATION; else CONCATENATION of
    constants. (1-element vectors, not PACK of scalars: the builder stores a scalar constant
    with shape [1], see the report.)"""
    b = ModelBuilder()
    g = b.subgraph()
    x = g.input("x", (2, 3, 4))
    if shape_from_input_shape:
        shp = g.tensor("shape_of_x", (3,), np.int32)
        g.op("SHAPE", [x], [shp], out_type="INT32")
        last = g.tensor("last", (1,), np.int32)
        g.op("STRIDED_SLICE", [shp, g.const("b0", np.array([2], np.int32)),
                               g.const("e0", np.array([3], np.int32)),
                               g.const("s0", np.array([1], np.int32))], [last])
        first = g.const("minus_one", np.array([-1], np.int32))
    else:
        first = g.const("six", np.array([6], np.int32))
        last = g.const("four", np.array([4], np.int32))
    new_shape = g.tensor("new_shape", (2,), np.int32)
    g.op("CONCATENATION", [first, last], [new_shape], axis=0)
    y = g.tensor("y", (6, 4))
    g.op("RESHAPE", [x, new_shape], [y])
    g.output(y)
    return b.finish()


def test_reshape_with_a_shape_computed_from_constants():
    check_against_litert(_chain_model(shape_from_input_shape=False))


def test_reshape_with_a_shape_computed_from_the_input_shape():
    check_against_litert(_chain_model(shape_from_input_shape=True))


def test_reshape_errors():
    _expect_error(one_op_model("RESHAPE", [Input((2, 3)), _i32([4, 2])], [Output((4, 2))]),
                  "RESHAPE", "cannot reshape")
    _expect_error(one_op_model("RESHAPE", [Input((2, 3)), _i32([-1, -1])], [Output((3, 2))]),
                  "RESHAPE", "more than one -1")
    _expect_error(one_op_model("RESHAPE", [Input((2, 3)), _i32([-1, 4])], [Output((3, 2))]),
                  "RESHAPE", "cannot reshape")
    _expect_error(one_op_model("RESHAPE", [Input((2, 3)), _i32([-2, -3])], [Output((2, 3))]),
                  "RESHAPE", "negative dimension")
    _expect_error(one_op_model("RESHAPE", [Input((2, 3))], [Output((3, 2))], new_shape=[5]),
                  "RESHAPE", "cannot reshape")


# -- SHAPE ------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ["float32", "int8"])
@pytest.mark.parametrize("out_type", ["INT32", "INT64"])
@given(shape=S.shapes(1, 5, 1, 6), data=st.data(), seed=S.seeds())
def test_shape_matches_litert(dtype, out_type, shape, data, seed):
    t, q = data.draw(tensor_type(dtype))
    out_dtype = np.int32 if out_type == "INT32" else np.int64
    model = one_op_model("SHAPE", [Input(shape, t, q)], [Output((len(shape),), out_dtype)],
                         out_type=out_type)
    result, = check_against_litert(model, seed=seed)
    np.testing.assert_array_equal(result, shape)


@pytest.mark.parametrize("out_type, dtype", [("INT32", np.int32), ("INT64", np.int64)])
def test_shape_of_a_scalar(out_type, dtype):
    """(LiteRT's Python API cannot return the empty output, so no oracle here.)"""
    model = one_op_model("SHAPE", [Input(())], [Output((0,), dtype)], out_type=out_type)
    out, = run_ours(model, [np.float32(1.0)])
    assert out.shape == (0,) and out.dtype == dtype


def test_shape_errors():
    _expect_error(one_op_model("SHAPE", [Input((2, 3))], [Output((2,), np.int32)],
                               out_type="INT64"), "SHAPE", "does not match")
    _expect_error(one_op_model("SHAPE", [Input((2, 3))], [Output((2,), np.int32)],
                               out_type="INT8"), "SHAPE", "INT32 or INT64")


# -- PACK / UNPACK ----------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
@given(shape=S.shapes(0, 4, 1, 5), n=st.integers(1, 4), data=st.data(), seed=S.seeds())
def test_pack_matches_litert(dtype, shape, n, data, seed):
    t, q = data.draw(tensor_type(dtype))
    axis = data.draw(st.integers(-len(shape) - 1, len(shape)))
    a = axis % (len(shape) + 1)
    out = shape[:a] + (n,) + shape[a:]
    model = one_op_model("PACK", [Input(shape, t, q) for _ in range(n)], [Output(out, t, q)],
                         values_count=n, axis=axis)
    check_against_litert(model, seed=seed)


@pytest.mark.parametrize("dtype", DTYPES)
@given(shape=S.shapes(1, 4, 1, 4), data=st.data(), seed=S.seeds())
def test_unpack_matches_litert(dtype, shape, data, seed):
    t, q = data.draw(tensor_type(dtype))
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    n = shape[axis]
    out = shape[:axis % len(shape)] + shape[axis % len(shape) + 1:]
    model = one_op_model("UNPACK", [Input(shape, t, q)], [Output(out, t, q) for _ in range(n)],
                         num=n, axis=axis)
    check_against_litert(model, seed=seed)


def test_pack_unpack_errors():
    _expect_error(one_op_model("PACK", [Input((2, 3)), Input((2, 3))], [Output((2, 2, 3))],
                               values_count=2, axis=3), "PACK", "axis 3 is out of range")
    _expect_error(one_op_model("PACK", [Input((2, 3)), Input((2, 3))], [Output((2, 2, 3))],
                               values_count=3, axis=0), "PACK", "values_count")
    _expect_error(one_op_model("PACK", [Input((2, 3)), Input((3, 2))], [Output((2, 2, 3))],
                               values_count=2, axis=0), "PACK", "input 1 has shape")
    _expect_error(one_op_model("UNPACK", [Input((2, 3))], [Output((2,))] * 3, num=3, axis=-3),
                  "UNPACK", "axis -3 is out of range")
    _expect_error(one_op_model("UNPACK", [Input((2, 3))], [Output((3,))] * 3, num=3, axis=0),
                  "UNPACK", "num is 3")


# -- EXPAND_DIMS / SQUEEZE --------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
@given(shape=S.shapes(0, 4, 1, 5), data=st.data(), scalar_axis=st.booleans(),
       axis_dtype=st.sampled_from([np.int32, np.int64]), seed=S.seeds())
def test_expand_dims_matches_litert(dtype, shape, data, scalar_axis, axis_dtype, seed):
    t, q = data.draw(tensor_type(dtype))
    axis = data.draw(st.integers(-len(shape) - 1, len(shape)))
    out = np.expand_dims(np.empty(shape), axis).shape
    axis_value = np.array(axis if scalar_axis else [axis], axis_dtype)
    model = one_op_model("EXPAND_DIMS", [Input(shape, t, q), Const(axis_value)], [Output(out, t, q)])
    check_against_litert(model, seed=seed)


@pytest.mark.parametrize("dtype", DTYPES)
@given(case=squeeze_case(), data=st.data(), seed=S.seeds())
def test_squeeze_matches_litert(dtype, case, data, seed):
    shape, dims, out = case
    t, q = data.draw(tensor_type(dtype))
    options = {"squeeze_dims": dims} if dims or data.draw(st.booleans()) else {}
    model = one_op_model("SQUEEZE", [Input(shape, t, q)], [Output(out, t, q)], **options)
    check_against_litert(model, seed=seed)


def test_expand_dims_squeeze_errors():
    _expect_error(one_op_model("EXPAND_DIMS", [Input((2, 3)), _i32(3)], [Output((2, 3, 1))]),
                  "EXPAND_DIMS", "axis 3 is out of range")
    _expect_error(one_op_model("EXPAND_DIMS", [Input((2, 3)), _i32([0, 1])], [Output((1, 2, 3))]),
                  "EXPAND_DIMS", "one value")
    _expect_error(one_op_model("SQUEEZE", [Input((2, 1))], [Output((2,))], squeeze_dims=[0]),
                  "SQUEEZE", "cannot squeeze dimension 0")
    _expect_error(one_op_model("SQUEEZE", [Input((2, 1))], [Output((2,))], squeeze_dims=[2]),
                  "SQUEEZE", "out of range")


# -- TRANSPOSE --------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
@given(shape=S.shapes(1, 5, 1, 4), data=st.data(), seed=S.seeds())
def test_transpose_matches_litert(dtype, shape, data, seed):
    t, q = data.draw(tensor_type(dtype))
    perm = data.draw(st.permutations(range(len(shape))))
    out = tuple(shape[p] for p in perm)
    model = one_op_model("TRANSPOSE", [Input(shape, t, q), _i32(perm)], [Output(out, t, q)])
    check_against_litert(model, seed=seed)


def test_transpose_errors():
    _expect_error(one_op_model("TRANSPOSE", [Input((2, 3)), _i32([0, 0])], [Output((2, 2))]),
                  "TRANSPOSE", "not a permutation")
    _expect_error(one_op_model("TRANSPOSE", [Input((2, 3)), _i32([1, 0, 2])], [Output((3, 2))]),
                  "TRANSPOSE", "not a permutation")


@pytest.mark.parametrize("dtype", DTYPES)
@given(case=concat_case(), data=st.data(), const_index=st.integers(-1, 3), seed=S.seeds())
def test_concatenation_matches_litert(dtype, case, data, const_index, seed):
    """LiteRT 2.3 refuses a fused activation on CONCATENATION (activation != NONE fails its
    Prepare); activations are checked against numpy below."""
    shapes, axis, out = case
    t, q = data.draw(tensor_type(dtype))       # int8: one scale and zero point for all
    rng = np.random.default_rng(seed)
    inputs = []
    for i, s in enumerate(shapes):
        if i == const_index and len(shapes) > 1:
            if t is np.float32:
                inputs.append(Const(rng.uniform(-3, 3, s).astype(np.float32)))
            else:
                inputs.append(Const(rng.integers(-100, 100, s).astype(t), quantization=q))
        else:
            inputs.append(Input(s, t, q))
    model = one_op_model("CONCATENATION", inputs, [Output(out, t, q)], axis=axis)
    check_against_litert(model, seed=seed)


@pytest.mark.parametrize("dtype", ["float32", "int8"])
@given(case=concat_case(), data=st.data(), act=S.activations(), seed=S.seeds())
def test_concatenation_activation_matches_numpy(dtype, case, data, act, seed):
    shapes, axis, out = case
    t, q = data.draw(tensor_type(dtype))
    model = one_op_model("CONCATENATION", [Input(s, t, q) for s in shapes], [Output(out, t, q)],
                         axis=axis, fused_activation_function=act)
    xs = model_inputs(model, seed)
    result, = run_ours(model, xs)
    lo, hi = {"NONE": (-np.inf, np.inf), "RELU": (0, np.inf), "RELU_N1_TO_1": (-1, 1),
              "RELU6": (0, 6)}[act]
    if q is None:
        expected = np.clip(np.concatenate(xs, axis=axis), lo, hi)
    else:
        scale, zp = q    # clamp in the integer domain: the real bounds rounded onto the grid
        qlo = -128 if lo == -np.inf else zp + round_half_away(np.float32(lo) / np.float32(scale))
        qhi = 127 if hi == np.inf else zp + round_half_away(np.float32(hi) / np.float32(scale))
        expected = np.clip(np.concatenate(xs, axis=axis), max(qlo, -128), min(qhi, 127))
        expected = expected.astype(np.int8)
    np.testing.assert_array_equal(result, expected)


def test_concatenation_errors():
    _expect_error(one_op_model("CONCATENATION", [Input((2, 3)), Input((2, 3))], [Output((2, 6))],
                               axis=2), "CONCATENATION", "axis 2 is out of range")
    _expect_error(one_op_model("CONCATENATION", [Input((2, 3)), Input((3, 3))], [Output((2, 6))],
                               axis=1), "CONCATENATION", "does not match")
    _expect_error(one_op_model("CONCATENATION", [Input((2, 3)), Input((2, 3, 1))], [Output((2, 6))],
                               axis=1), "CONCATENATION", "does not match")


@pytest.mark.parametrize("dtype", DTYPES)
@given(case=depth_to_space_case(), data=st.data(), seed=S.seeds())
def test_depth_to_space_matches_litert(dtype, case, data, seed):
    shape, bs, out = case
    t, q = data.draw(tensor_type(dtype))
    model = one_op_model("DEPTH_TO_SPACE", [Input(shape, t, q)], [Output(out, t, q)], block_size=bs)
    check_against_litert(model, seed=seed)


@pytest.mark.parametrize("dtype", DTYPES)
@given(case=depth_to_space_case(), data=st.data(), seed=S.seeds())
def test_space_to_depth_matches_litert(dtype, case, data, seed):
    out, bs, shape = case
    t, q = data.draw(tensor_type(dtype))
    model = one_op_model("SPACE_TO_DEPTH", [Input(shape, t, q)], [Output(out, t, q)], block_size=bs)
    check_against_litert(model, seed=seed)


def test_depth_to_space_follows_its_definition():
    """out[b, h*bs + i, w*bs + j, c] = in[b, h, w, (i*bs + j)*C_out + c], and back."""
    x = np.arange(2 * 2 * 3 * 8, dtype=np.float32).reshape(2, 2, 3, 8)
    model = one_op_model("DEPTH_TO_SPACE", [Input(x.shape)], [Output((2, 4, 6, 2))], block_size=2)
    y, = run_ours(model, [x])
    for b, h, w, i, j, c in np.ndindex(2, 2, 3, 2, 2, 2):
        assert y[b, h * 2 + i, w * 2 + j, c] == x[b, h, w, (i * 2 + j) * 2 + c]
    back = one_op_model("SPACE_TO_DEPTH", [Input(y.shape)], [Output(x.shape)], block_size=2)
    np.testing.assert_array_equal(run_ours(back, [y])[0], x)


def test_depth_to_space_errors():
    _expect_error(one_op_model("DEPTH_TO_SPACE", [Input((2, 3, 8))], [Output((4, 6, 2))],
                               block_size=2), "DEPTH_TO_SPACE", "4-D")
    _expect_error(one_op_model("DEPTH_TO_SPACE", [Input((1, 2, 3, 8))], [Output((1, 2, 3, 8))],
                               block_size=0), "DEPTH_TO_SPACE", "block_size must be >= 1")
    _expect_error(one_op_model("DEPTH_TO_SPACE", [Input((1, 2, 3, 6))], [Output((1, 4, 6, 1))],
                               block_size=2), "DEPTH_TO_SPACE", "not a multiple")
    _expect_error(one_op_model("SPACE_TO_DEPTH", [Input((1, 3, 4, 2))], [Output((1, 1, 2, 8))],
                               block_size=2), "SPACE_TO_DEPTH", "multiples of block_size 2")
    _expect_error(one_op_model("SPACE_TO_DEPTH", [Input((1, 4, 4, 2))], [Output((1, 4, 4, 2))],
                               block_size=-1), "SPACE_TO_DEPTH", "block_size must be >= 1")


# -- BROADCAST_ARGS ---------------------------------------------------------------------------
@st.composite
def broadcast_args_case(draw):
    """Two shapes that broadcast: a target shape (sides 0 to 5), each operand its trailing dims
    with some of them 1."""
    target = draw(S.shapes(0, 5, 0, 5))

    def operand():
        n = draw(st.integers(0, len(target)))
        dims = list(target[len(target) - n:])
        return [1 if draw(st.booleans()) else d for d in dims]
    return operand(), operand()


def broadcast_args_model(a, b, dtype, constant):
    def spec(v):
        return Const(np.array(v, dtype)) if constant else Input((len(v),), dtype)
    return one_op_model("BROADCAST_ARGS", [spec(a), spec(b)],
                        [Output((max(len(a), len(b)),), dtype)])


@given(case=broadcast_args_case(), dtype=st.sampled_from([np.int32, np.int64]),
       constant=st.booleans())
def test_broadcast_args_matches_litert(case, dtype, constant):
    a, b = case
    model = broadcast_args_model(a, b, dtype, constant)
    inputs = [] if constant else [np.array(a, dtype), np.array(b, dtype)]
    actual = check_against_litert(model, inputs)[0]
    np.testing.assert_array_equal(actual, np.broadcast_shapes(tuple(a), tuple(b)))


@pytest.mark.parametrize("constant", [True, False])
def test_broadcast_args_refuses_shapes_that_do_not_broadcast(constant):
    # LiteRT aborts the process here (TFLITE_CHECK_EQ): an error, not a crash
    model = broadcast_args_model([2, 3], [4, 1, 2], np.int32, constant)
    with pytest.raises(ModelError, match="BROADCAST_ARGS.*do not broadcast"):
        run_ours(model, [] if constant else [np.array([2, 3], np.int32),
                                             np.array([4, 1, 2], np.int32)])


def test_broadcast_args_refuses_negative_dimensions():
    model = broadcast_args_model([-1, 3], [1, 3], np.int32, True)
    with pytest.raises(ModelError, match="BROADCAST_ARGS.*negative"):
        run_ours(model, [])


def test_broadcast_args_errors():
    # mixed dtypes, float shapes, a 2-D shape
    _expect_error(one_op_model("BROADCAST_ARGS", [Input((2,), np.int32), Input((2,), np.int64)],
                               [Output((2,), np.int32)]), "BROADCAST_ARGS", "one dtype")
    _expect_error(one_op_model("BROADCAST_ARGS", [Input((2,)), Input((2,))], [Output((2,))]),
                  "BROADCAST_ARGS", "int32 or int64")
    _expect_error(one_op_model("BROADCAST_ARGS", [Input((1, 2), np.int32), Input((2,), np.int32)],
                               [Output((2,), np.int32)]), "BROADCAST_ARGS", "1-D")


# -- BITCAST ----------------------------------------------------------------------------------
BITCAST_DTYPES = [np.float32, np.float16, np.float64, np.int8, np.uint8, np.int16, np.uint16,
                  np.int32, np.uint32, np.int64, np.uint64, np.bool_, np.complex64]


@st.composite
def bitcast_case(draw):
    """(input shape, input dtype, output dtype, output shape): tf.bitcast's shape rule."""
    src = np.dtype(draw(st.sampled_from(BITCAST_DTYPES)))
    dst = np.dtype(draw(st.sampled_from(BITCAST_DTYPES)))
    shape = draw(S.shapes(0, 3, 1, 4))
    if src.itemsize < dst.itemsize:
        shape = shape + (dst.itemsize // src.itemsize,)
    out = (shape + (src.itemsize // dst.itemsize,) if src.itemsize > dst.itemsize
           else shape[:-1] if src.itemsize < dst.itemsize else shape)
    return shape, src, dst, out


def random_bytes(shape, dtype, seed):
    """Arbitrary bytes as `dtype` (NaNs with payloads included), bools 0/1."""
    rng = np.random.default_rng(seed)
    if np.dtype(dtype) == np.bool_:
        return rng.integers(0, 2, shape).astype(np.bool_)
    count = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
    return rng.integers(0, 256, count, dtype=np.uint8).view(dtype).reshape(shape)


def assert_same_bytes(actual, expected):
    assert actual.shape == expected.shape and actual.dtype == expected.dtype, (
        f"{actual.dtype} {actual.shape} != {expected.dtype} {expected.shape}")
    if actual.dtype == np.bool_:        # LiteRT's bools keep the input's bytes
        np.testing.assert_array_equal(actual, expected)
    else:
        np.testing.assert_array_equal(actual.reshape(-1).view(np.uint8),
                                      expected.reshape(-1).view(np.uint8))


@given(case=bitcast_case(), constant=st.booleans(), seed=S.seeds())
def test_bitcast_matches_litert(case, constant, seed):
    shape, src, dst, out = case
    x = random_bytes(shape, src, seed)
    model = one_op_model("BITCAST", [Const(x) if constant else Input(shape, src)],
                         [Output(out, dst)])
    inputs = [] if constant else [x]
    expected = run_litert(model, inputs)[0]
    actual = run_ours(model, inputs)[0]
    assert_same_bytes(actual, expected)


@given(shape=S.shapes(1, 3, 1, 4), qi=S.quant_params(), qo=S.quant_params(np.uint8),
       seed=S.seeds())
def test_bitcast_quantized_int8_to_uint8_matches_litert(shape, qi, qo, seed):
    # the stored integers move, whatever the two quantizations say they mean
    model = one_op_model("BITCAST", [Input(shape, np.int8, qi)], [Output(shape, np.uint8, qo)])
    x = np.random.default_rng(seed).integers(-128, 128, shape).astype(np.int8)
    expected = run_litert(model, [x])[0]
    actual = run_ours(model, [x])[0]
    assert_same_bytes(actual, expected)
    np.testing.assert_array_equal(actual, x.view(np.uint8))


def test_bitcast_errors():
    # narrower to wider needs the last dimension to hold one output element
    _expect_error(one_op_model("BITCAST", [Input((2, 3), np.int8)], [Output((2,), np.int32)]),
                  "BITCAST", "dimension of 4")
    _expect_error(one_op_model("BITCAST", [Input((), np.int16)], [Output((), np.int32)]),
                  "BITCAST", "dimension of 2")
