"""Shape, layout, padding, slicing and splitting ops (ops/shape.py, ops/slicing.py) on the delegate
(cpu, vulkan, opengl workers; fp16 on vulkan; gles) vs the reference path: RESHAPE, EXPAND_DIMS,
SQUEEZE, TRANSPOSE, CONCATENATION, PACK, UNPACK, DEPTH_TO_SPACE, SPACE_TO_DEPTH, PAD, PADV2,
SLICE, STRIDED_SLICE, SPLIT, SPLIT_V (SHAPE is always folded at prepare). float32 and int8; the
int8 cases give the output its own scale and zero point (the delegate's store must snap the
moved float view onto the output's grid exactly as the reference's fake-quant does).
One case table (SHAPE_OPS: an op and how its model is drawn, tests/cases/shape.py) drives one
property test; a chain in one partition, fp16 storage, bool tensors, GLES and what stays on the
CPU have their own tests. Tolerances: tflite_taichi.testing.TAICHI_RTOL for every case (these
ops move values and do no arithmetic; int8: one unit, check_delegate's)."""
import dataclasses
from functools import partial

import numpy as np
import pytest

from tflite_taichi.builder import ModelBuilder
from tflite_taichi.ops.base import Node, TensorSpec, lookup
from tflite_taichi.ops.slicing import StridedSliceOptions
from tflite_taichi.testing import (Const, Input, Output, check_delegate, check_op,
                                   one_op_model, quantize_array)
from cases.shape import (OpCase, concatenation_io, delegate_case, depth_space_io, expand_dims_io,
                         pack_io, pad_io, padv2_io, reshape_io, slice_io, split_io, split_v_io,
                         squeeze_io, strided_slice_io, strided_slice_offset_io, transpose_io,
                         unpack_io)

DTYPES = ["float32", "int8"]


def _i32(values):
    return Const(np.array(values, np.int32))


# -- one row per op: each is property-tested on every Taichi worker in float32 and int8 -------
SHAPE_OPS = [
    OpCase("RESHAPE", reshape_io, "new shape as an input, in the options, or both; one -1"),
    OpCase("EXPAND_DIMS", expand_dims_io, "rank 0 to 4, negative axes"),
    OpCase("SQUEEZE", squeeze_io, "listed dims (maybe negative) or every size-1 dim"),
    OpCase("TRANSPOSE", transpose_io, "every permutation up to rank 5"),
    OpCase("CONCATENATION", concatenation_io, "own grids, a constant input, fused activation"),
    OpCase("PACK", pack_io, "1 to 4 values, negative axes"),
    OpCase("UNPACK", unpack_io, "several outputs from one step"),
    OpCase("DEPTH_TO_SPACE", depth_space_io, "block sizes 1 to 3"),
    OpCase("SPACE_TO_DEPTH", partial(depth_space_io, to_depth=True), "block sizes 1 to 3"),
    OpCase("PAD", pad_io, "int8 pads with the input's zero point"),
    OpCase("PADV2", padv2_io, "pad value a constant or a run-time input"),
    OpCase("SLICE", slice_io, "size -1 or explicit"),
    OpCase("STRIDED_SLICE", strided_slice_io, "masks, ellipsis, new axes, shrinks, negative strides"),
    OpCase("STRIDED_SLICE", strided_slice_offset_io, "offset=True", variant="offset"),
    OpCase("SPLIT", split_io, "axis first, negative axes"),
    OpCase("SPLIT_V", split_v_io, "one size -1; own grids"),
]


@pytest.mark.parametrize("row", SHAPE_OPS, ids=lambda row: row.id)
@pytest.mark.parametrize("dtype", DTYPES)
def test_op_on_the_delegate(taichi_workers, dtype, row):
    check_op(delegate_case(row, dtype), workers=taichi_workers)


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


# fixed models: float16 storage on vulkan, and bool tensors (moved as 0 and 1) on every worker
FP16_MODELS = {
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
BOOL = np.bool_
BOOL_MODELS = {
    "transpose": lambda: one_op_model("TRANSPOSE", [Input((2, 3, 4), BOOL), _i32([2, 0, 1])],
                                      [Output((4, 2, 3), BOOL)]),
    "concat": lambda: one_op_model("CONCATENATION", [Input((2, 3), BOOL), Const(np.array([[True], [False]])),
                                                     Input((2, 1), BOOL)], [Output((2, 5), BOOL)], axis=1),
    "padv2": lambda: one_op_model("PADV2", [Input((2, 3), BOOL), _i32([[1, 0], [2, 1]]),
                                            Const(np.array([True]))], [Output((3, 6), BOOL)]),
    "split": lambda: one_op_model("SPLIT", [_i32(0), Input((4, 3), BOOL)], [Output((2, 3), BOOL)] * 2,
                                  num_splits=2),
}


@pytest.mark.parametrize("case", FP16_MODELS)
def test_fp16_on_vulkan(vulkan_workers, case):
    check_delegate(FP16_MODELS[case](), vulkan_workers, precision="fp16")


@pytest.mark.parametrize("case", BOOL_MODELS)
def test_bool_tensors_move_as_zero_and_one(taichi_workers, case):
    check_delegate(BOOL_MODELS[case](), taichi_workers)


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
