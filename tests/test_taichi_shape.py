"""Shape, layout, padding, slicing and splitting ops (ops/shape.py, ops/slicing.py) on the delegate
(cpu, vulkan, opengl workers; fp16 on vulkan; gles) vs the reference path: RESHAPE, EXPAND_DIMS,
SQUEEZE, TRANSPOSE, CONCATENATION, PACK, UNPACK, DEPTH_TO_SPACE, SPACE_TO_DEPTH, PAD, PADV2,
SLICE, STRIDED_SLICE, SPLIT, SPLIT_V (SHAPE is always folded at prepare). float32 and int8; the
int8 cases give the output its own scale and zero point (the delegate's store must snap the
moved float view onto the output's grid exactly as the reference's fake-quant does).
Tolerances: tflite_taichi.testing.TAICHI_RTOL."""
import dataclasses

import numpy as np
import pytest
from hypothesis import assume, strategies as st

from tflite_taichi.builder import ModelBuilder
from tflite_taichi.ops.base import Node, TensorSpec, lookup
from tflite_taichi.ops.slicing import StridedSliceOptions
from tflite_taichi.testing import (Const, Input, Output, check_delegate, check_op,
                                   one_op_model, quantize_array, strategies)
from cases.shape import concat_case, depth_to_space_case, reshape_case, squeeze_case
from cases.slicing import (numpy_index, offset_case, pad_case, slice_case, split_case, split_v_case,
                           strided_spec)

S = strategies()
DTYPES = ["float32", "int8"]


@st.composite
def types(draw, dtype):
    """(numpy type, input quantization, output quantization) for `dtype`; int8 outputs get
    their own grid."""
    if dtype == "int8":
        return np.int8, draw(S.quant_params()), draw(S.quant_params())
    return np.float32, None, None


def _i32(values):
    return Const(np.array(values, np.int32))


# -- copies: RESHAPE, EXPAND_DIMS, SQUEEZE ----------------------------------------------------
@st.composite
def reshape_delegate_cases(draw, dtype):
    case = draw(reshape_case())
    how = draw(st.sampled_from(["input", "options", "both"]))
    seed = draw(S.seeds())
    shape, new_shape, out = case
    t, qi, qo = draw(types(dtype))
    inputs, options = [Input(shape, t, qi)], {}
    if how in ("input", "both"):
        inputs.append(_i32(new_shape))
    if how in ("options", "both"):
        options["new_shape"] = new_shape
    return one_op_model("RESHAPE", inputs, [Output(out, t, qo)], **options), None, {"seed": seed}


@pytest.mark.parametrize("dtype", DTYPES)
def test_reshape_delegate(taichi_workers, dtype):
    check_op(reshape_delegate_cases(dtype), workers=taichi_workers)


@st.composite
def expand_dims_delegate_cases(draw, dtype):
    shape = draw(S.shapes(0, 4, 1, 5))
    seed = draw(S.seeds())
    t, qi, qo = draw(types(dtype))
    axis = draw(st.integers(-len(shape) - 1, len(shape)))
    out = np.expand_dims(np.empty(shape), axis).shape
    model = one_op_model("EXPAND_DIMS", [Input(shape, t, qi), _i32(axis)], [Output(out, t, qo)])
    return model, None, {"seed": seed}


@pytest.mark.parametrize("dtype", DTYPES)
def test_expand_dims_delegate(taichi_workers, dtype):
    check_op(expand_dims_delegate_cases(dtype), workers=taichi_workers)


@st.composite
def squeeze_delegate_cases(draw, dtype):
    case = draw(squeeze_case())
    seed = draw(S.seeds())
    shape, dims, out = case
    t, qi, qo = draw(types(dtype))
    options = {"squeeze_dims": dims} if dims else {}
    model = one_op_model("SQUEEZE", [Input(shape, t, qi)], [Output(out, t, qo)], **options)
    return model, None, {"seed": seed}


@pytest.mark.parametrize("dtype", DTYPES)
def test_squeeze_delegate(taichi_workers, dtype):
    check_op(squeeze_delegate_cases(dtype), workers=taichi_workers)


# -- TRANSPOSE, CONCATENATION, PACK, UNPACK ---------------------------------------------------
@st.composite
def transpose_delegate_cases(draw, dtype):
    shape = draw(S.shapes(1, 5, 1, 4))
    seed = draw(S.seeds())
    t, qi, qo = draw(types(dtype))
    perm = draw(st.permutations(range(len(shape))))
    out = tuple(shape[p] for p in perm)
    model = one_op_model("TRANSPOSE", [Input(shape, t, qi), _i32(perm)], [Output(out, t, qo)])
    return model, None, {"seed": seed}


@pytest.mark.parametrize("dtype", DTYPES)
def test_transpose_delegate(taichi_workers, dtype):
    check_op(transpose_delegate_cases(dtype), workers=taichi_workers)


@st.composite
def concatenation_delegate_cases(draw, dtype):
    case = draw(concat_case())
    act = draw(S.activations())
    const_index = draw(st.integers(-1, 3))
    seed = draw(S.seeds())
    shapes, axis, out = case
    t, _, qo = draw(types(dtype))
    rng = np.random.default_rng(seed)
    inputs = []
    for i, s in enumerate(shapes):
        q = draw(S.quant_params()) if dtype == "int8" else None
        if i == const_index and len(shapes) > 1:
            value = rng.uniform(-3, 3, s).astype(np.float32)
            inputs.append(Const(quantize_array(value, q) if q else value, quantization=q))
        else:
            inputs.append(Input(s, t, q))
    model = one_op_model("CONCATENATION", inputs, [Output(out, t, qo)], axis=axis,
                         fused_activation_function=act)
    return model, None, {"seed": seed}


@pytest.mark.parametrize("dtype", DTYPES)
def test_concatenation_delegate(taichi_workers, dtype):
    """Inputs with their own grids (int8) and a constant among them (packed in the weights)."""
    check_op(concatenation_delegate_cases(dtype), workers=taichi_workers)


@st.composite
def pack_delegate_cases(draw, dtype):
    shape = draw(S.shapes(0, 4, 1, 4))
    n = draw(st.integers(1, 4))
    seed = draw(S.seeds())
    t, qi, qo = draw(types(dtype))
    axis = draw(st.integers(-len(shape) - 1, len(shape)))
    a = axis % (len(shape) + 1)
    out = shape[:a] + (n,) + shape[a:]
    model = one_op_model("PACK", [Input(shape, t, qi) for _ in range(n)], [Output(out, t, qo)],
                         values_count=n, axis=axis)
    return model, None, {"seed": seed}


@pytest.mark.parametrize("dtype", DTYPES)
def test_pack_delegate(taichi_workers, dtype):
    check_op(pack_delegate_cases(dtype), workers=taichi_workers)


@st.composite
def unpack_delegate_cases(draw, dtype):
    shape = draw(S.shapes(1, 4, 1, 4))
    seed = draw(S.seeds())
    t, qi, qo = draw(types(dtype))
    axis = draw(st.integers(-len(shape), len(shape) - 1))
    a = axis % len(shape)
    out = shape[:a] + shape[a + 1:]
    model = one_op_model("UNPACK", [Input(shape, t, qi)],
                         [Output(out, t, qo) for _ in range(shape[a])], num=shape[a], axis=axis)
    return model, None, {"seed": seed}


@pytest.mark.parametrize("dtype", DTYPES)
def test_unpack_delegate(taichi_workers, dtype):
    """Several outputs, all written by the one step."""
    check_op(unpack_delegate_cases(dtype), workers=taichi_workers)


# -- DEPTH_TO_SPACE, SPACE_TO_DEPTH -----------------------------------------------------------
@st.composite
def depth_space_delegate_cases(draw, op, dtype):
    case = draw(depth_to_space_case())
    seed = draw(S.seeds())
    deep, bs, wide = case
    shape, out = (deep, wide) if op == "DEPTH_TO_SPACE" else (wide, deep)
    t, qi, qo = draw(types(dtype))
    model = one_op_model(op, [Input(shape, t, qi)], [Output(out, t, qo)], block_size=bs)
    return model, None, {"seed": seed}


@pytest.mark.parametrize("op", ["DEPTH_TO_SPACE", "SPACE_TO_DEPTH"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_depth_space_delegate(taichi_workers, op, dtype):
    check_op(depth_space_delegate_cases(op, dtype), workers=taichi_workers)


# -- PAD, PADV2 -------------------------------------------------------------------------------
@st.composite
def pad_delegate_cases(draw, dtype):
    case = draw(pad_case())
    seed = draw(S.seeds())
    shape, pads, out = case
    t, qi, qo = draw(types(dtype))
    model = one_op_model("PAD", [Input(shape, t, qi), Const(pads)], [Output(out, t, qo)])
    return model, None, {"seed": seed}


@pytest.mark.parametrize("dtype", DTYPES)
def test_pad_delegate(taichi_workers, dtype):
    """int8: pads with the real value 0 (the input's zero point), snapped to the output grid."""
    check_op(pad_delegate_cases(dtype), workers=taichi_workers)


@st.composite
def padv2_delegate_cases(draw, dtype):
    case = draw(pad_case())
    value = draw(st.floats(-4, 4))
    where = draw(st.sampled_from(["const", "input"]))
    seed = draw(S.seeds())
    shape, pads, out = case
    t, qi, qo = draw(types(dtype))
    qv = draw(S.quant_params()) if dtype == "int8" else None
    if where == "input":
        pad_value = Input((1,), t, qv)
    elif qv:
        pad_value = Const(quantize_array(np.full((1,), value), qv), quantization=qv)
    else:
        pad_value = Const(np.full((1,), value, np.float32))
    model = one_op_model("PADV2", [Input(shape, t, qi), Const(pads), pad_value], [Output(out, t, qo)])
    return model, None, {"seed": seed}


@pytest.mark.parametrize("dtype", DTYPES)
def test_padv2_delegate(taichi_workers, dtype):
    """The pad value as a constant (packed in the weights) or a run-time input."""
    check_op(padv2_delegate_cases(dtype), workers=taichi_workers)


# -- SLICE, STRIDED_SLICE ---------------------------------------------------------------------
@st.composite
def slice_delegate_cases(draw, dtype):
    case = draw(slice_case())
    seed = draw(S.seeds())
    shape, begin, size, out = case
    t, qi, qo = draw(types(dtype))
    model = one_op_model("SLICE", [Input(shape, t, qi), _i32(begin), _i32(size)], [Output(out, t, qo)])
    return model, None, {"seed": seed}


@pytest.mark.parametrize("dtype", DTYPES)
def test_slice_delegate(taichi_workers, dtype):
    check_op(slice_delegate_cases(dtype), workers=taichi_workers)


@st.composite
def strided_slice_delegate_cases(draw, dtype):
    shape = draw(S.shapes(1, 4, 1, 6))
    seed = draw(S.seeds())
    t, qi, qo = draw(types(dtype))
    begin, end, strides, masks, kinds = draw(strided_spec(shape))
    out = np.empty(shape)[numpy_index(begin, end, strides, masks, kinds)].shape
    assume(0 not in out)    # an empty output stays on the CPU (partition.delegate_reason)
    model = one_op_model("STRIDED_SLICE", [Input(shape, t, qi), _i32(begin), _i32(end),
                                           _i32(strides)], [Output(out, t, qo)], **masks)
    return model, None, {"seed": seed}


@pytest.mark.parametrize("dtype", DTYPES)
def test_strided_slice_delegate(taichi_workers, dtype):
    """Every spec (masks, ellipsis, new axes, shrinks, negative strides), as numpy indexes."""
    check_op(strided_slice_delegate_cases(dtype), workers=taichi_workers)


@st.composite
def strided_slice_offset_delegate_cases(draw, dtype):
    case = draw(offset_case())
    seed = draw(S.seeds())
    shape, begin, size, strides = case
    out = tuple(max(-(-s // st_), 0) for s, st_ in zip(size, strides))
    assume(0 not in out)    # an empty output stays on the CPU (partition.delegate_reason)
    t, qi, qo = draw(types(dtype))
    model = one_op_model("STRIDED_SLICE", [Input(shape, t, qi), _i32(begin), _i32(size),
                                           _i32(strides)], [Output(out, t, qo)], offset=True)
    return model, None, {"seed": seed}


@pytest.mark.parametrize("dtype", DTYPES)
def test_strided_slice_offset_delegate(taichi_workers, dtype):
    check_op(strided_slice_offset_delegate_cases(dtype), workers=taichi_workers)


# -- SPLIT, SPLIT_V ---------------------------------------------------------------------------
@st.composite
def split_delegate_cases(draw, dtype):
    case = draw(split_case())
    seed = draw(S.seeds())
    shape, axis, num, out = case
    t, qi, qo = draw(types(dtype))
    model = one_op_model("SPLIT", [_i32(axis), Input(shape, t, qi)],
                         [Output(out, t, qo) for _ in range(num)], num_splits=num)
    return model, None, {"seed": seed}


@pytest.mark.parametrize("dtype", DTYPES)
def test_split_delegate(taichi_workers, dtype):
    check_op(split_delegate_cases(dtype), workers=taichi_workers)


@st.composite
def split_v_delegate_cases(draw, dtype):
    case = draw(split_v_case())
    seed = draw(S.seeds())
    shape, axis, size_splits, outs = case
    t, qi, _ = draw(types(dtype))
    outputs = [Output(o, t, draw(S.quant_params()) if qi else None) for o in outs]
    model = one_op_model("SPLIT_V", [Input(shape, t, qi), _i32(size_splits), _i32(axis)],
                         outputs, num_splits=len(outs))
    return model, None, {"seed": seed}


@pytest.mark.parametrize("dtype", DTYPES)
def test_split_v_delegate(taichi_workers, dtype):
    check_op(split_v_delegate_cases(dtype), workers=taichi_workers)


# -- several ops in one partition; fp16; GLES -------------------------------------------------
def _chain_model(quantized: bool = False):
    """x (1, 4, 6, 2) -> PAD -> SPACE_TO_DEPTH -> TRANSPOSE -> SPLIT_V (3 outputs: one a model
    output, two read further on) -> CONCATENATION (with a constant) -> STRIDED_SLICE -> RESHAPE
    (shape from a SHAPE folded at prepare) -> DEPTH_TO_SPACE -> PACK -> UNPACK (one output never
    read); intermediates live in the arena."""
    q = (0.05, -3) if quantized else None
    t = np.int8 if quantized else np.float32
    b = ModelBuilder()
    g = b.subgraph()

    def tensor(name, shape):
        return g.tensor(name, shape, t, q)

    x = g.input("x", (1, 4, 6, 2), t, q)
    padded = tensor("padded", (1, 6, 8, 2))
    g.op("PAD", [x, g.const("pads", np.array([[0, 0], [1, 1], [0, 2], [0, 0]], np.int32))], [padded])
    deep = tensor("deep", (1, 3, 4, 8))
    g.op("SPACE_TO_DEPTH", [padded], [deep], block_size=2)
    moved = tensor("moved", (1, 8, 3, 4))
    g.op("TRANSPOSE", [deep, g.const("perm", np.array([0, 3, 1, 2], np.int32))], [moved])
    parts = [tensor(f"part{i}", s) for i, s in enumerate([(1, 3, 3, 4), (1, 1, 3, 4), (1, 4, 3, 4)])]
    g.op("SPLIT_V", [moved, g.const("sizes", np.array([3, 1, -1], np.int32)),
                     g.const("axis", np.array(1, np.int32))], parts, num_splits=3)
    extra = np.linspace(-1, 1, 12, dtype=np.float32).reshape(1, 1, 3, 4)
    extra_t = (g.const("extra", quantize_array(extra, q), quantization=q) if quantized
               else g.const("extra", extra))
    joined = tensor("joined", (1, 8, 3, 4))
    g.op("CONCATENATION", [parts[2], extra_t, parts[0]], [joined], axis=1,
         fused_activation_function="RELU6")
    cut = tensor("cut", (4, 3, 2))
    g.op("STRIDED_SLICE", [joined, g.const("b", np.array([0, 7, 0, 3], np.int32)),
                           g.const("e", np.array([1, 0, 3, 0], np.int32)),
                           g.const("s", np.array([1, -2, 1, -2], np.int32))], [cut],
         shrink_axis_mask=1)
    like = g.input("like", (1, 2, 3, 4), t, q)
    like_shape = g.tensor("like_shape", (4,), np.int32)
    g.op("SHAPE", [like], [like_shape], out_type="INT32")
    flat = tensor("flat", (1, 2, 3, 4))
    g.op("RESHAPE", [cut, like_shape], [flat])
    wide = tensor("wide", (1, 4, 6, 1))
    g.op("DEPTH_TO_SPACE", [flat], [wide], block_size=2)
    stacked = tensor("stacked", (2, 1, 4, 6, 1))
    g.op("PACK", [wide, wide], [stacked], values_count=2, axis=0)
    halves = [tensor(f"half{i}", (1, 4, 6, 1)) for i in range(2)]
    g.op("UNPACK", [stacked], halves, num=2, axis=0)
    g.output(halves[1], parts[1])
    return b.finish()


@pytest.mark.parametrize("quantized", [False, True])
def test_a_chain_of_ops_in_one_partition(taichi_workers, quantized):
    summaries = check_delegate(_chain_model(quantized), taichi_workers)
    for summary in summaries.values():
        assert summary["ops_folded"] == 1                 # SHAPE
        assert summary["ops_delegated"] == summary["ops_total"] - 1


@pytest.mark.parametrize("case", ["transpose", "concat", "pad", "strided", "depth", "split_v"])
def test_fp16_on_vulkan(vulkan_workers, case):
    models = {
        "transpose": lambda: one_op_model("TRANSPOSE", [Input((2, 3, 4, 5)), _i32([3, 1, 0, 2])],
                                          [Output((5, 3, 2, 4))]),
        "concat": lambda: one_op_model("CONCATENATION", [Input((2, 3)), Const(np.ones((2, 2), np.float32)),
                                                         Input((2, 1))], [Output((2, 6))], axis=-1,
                                       fused_activation_function="RELU_N1_TO_1"),
        "pad": lambda: one_op_model("PADV2", [Input((3, 4)), _i32([[1, 2], [0, 3]]),
                                              Const(np.array([1.5], np.float32))], [Output((6, 7))]),
        "strided": lambda: one_op_model("STRIDED_SLICE", [Input((5, 6)), _i32([4, 1]), _i32([0, 6]),
                                                          _i32([-2, 2])], [Output((2, 3))]),
        "depth": lambda: one_op_model("DEPTH_TO_SPACE", [Input((2, 2, 3, 12))], [Output((2, 4, 6, 3))],
                                      block_size=2),
        "split_v": lambda: one_op_model("SPLIT_V", [Input((4, 7)), _i32([2, -1, 1]), _i32(1)],
                                        [Output((4, 2)), Output((4, 4)), Output((4, 1))], num_splits=3),
    }
    check_delegate(models[case](), vulkan_workers, precision="fp16")


@pytest.mark.parametrize("case", ["transpose", "concat", "padv2", "split"])
def test_bool_tensors_move_as_zero_and_one(taichi_workers, case):
    B = np.bool_
    models = {
        "transpose": lambda: one_op_model("TRANSPOSE", [Input((2, 3, 4), B), _i32([2, 0, 1])],
                                          [Output((4, 2, 3), B)]),
        "concat": lambda: one_op_model("CONCATENATION", [Input((2, 3), B), Const(np.array([[True], [False]])),
                                                         Input((2, 1), B)], [Output((2, 5), B)], axis=1),
        "padv2": lambda: one_op_model("PADV2", [Input((2, 3), B), _i32([[1, 0], [2, 1]]),
                                                Const(np.array([True]))], [Output((3, 6), B)]),
        "split": lambda: one_op_model("SPLIT", [_i32(0), Input((4, 3), B)], [Output((2, 3), B)] * 2,
                                      num_splits=2),
    }
    check_delegate(models[case](), taichi_workers)


def test_gles(gles_worker):
    check_delegate(_chain_model(), [gles_worker])


# -- what stays on the CPU --------------------------------------------------------------------
def test_run_time_index_inputs_stay_on_the_cpu(taichi_workers):
    """A RESHAPE whose shape tensor is computed at run time (its options hold the shape) and a
    STRIDED_SLICE with offset whose begin comes at run time read int32 tensors at run time,
    which the delegate does not carry."""
    reshape = one_op_model("RESHAPE", [Input((2, 3)), Input((2,), np.int32)], [Output((3, 2))],
                           new_shape=[3, 2])
    strided = one_op_model("STRIDED_SLICE", [Input((6, 4)), Input((2,), np.int32), _i32([3, 2]),
                                             _i32([1, 1])], [Output((3, 2))], offset=True)
    x = np.arange(24, dtype=np.float32).reshape(6, 4)
    for model, inputs, op in [(reshape, [x[:2, :3], np.array([3, 2], np.int32)], "RESHAPE"),
                              (strided, [x, np.array([2, 1], np.int32)], "STRIDED_SLICE")]:
        summaries = check_delegate(model, taichi_workers, inputs, expect_all_delegated=False)
        for summary in summaries.values():
            assert summary["ops_delegated"] == 0
            fallback, = summary["fallback"]
            assert fallback["op"] == op and "int32" in fallback["reason"], fallback


def test_strided_slice_supports_refuses_a_run_time_begin():
    """STRIDED_SLICE's own refusal (reached when the run-time begin is a tensor the arena
    carries; today partition.delegate_reason already refuses its int32 first)."""
    f32 = np.dtype(np.float32)
    i32 = np.dtype(np.int32)
    node = Node(index=0, op="STRIDED_SLICE", version=1, options=StridedSliceOptions(offset=True),
                inputs=(TensorSpec(0, "x", (6, 4), f32), TensorSpec(1, "begin", (2,), i32),
                        TensorSpec(2, "end", (2,), i32, value=np.array([3, 2], np.int32)),
                        TensorSpec(3, "strides", (2,), i32, value=np.array([1, 1], np.int32))),
                outputs=(TensorSpec(4, "y", (3, 2), f32),))
    opdef = lookup("STRIDED_SLICE")
    assert opdef.supports(node) == "begin is known only at run time"
    begin = dataclasses.replace(node.inputs[1], value=np.array([0, 0], np.int32))
    inputs = (node.inputs[0], begin) + node.inputs[2:]
    assert opdef.supports(dataclasses.replace(node, inputs=inputs)) is None
