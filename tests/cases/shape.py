"""Cases for shape ops shared by the tests: hypothesis strategies, one-op model builders and
their helpers, used by test_ops_shape.py and the delegate's tests; and the delegate's case
table's rows (OpCase, below): what each shape or slicing op's one-op model draws."""
from dataclasses import dataclass
from typing import Callable

import numpy as np
import pytest
from hypothesis import assume, strategies as st
from tflite_taichi.errors import ModelError
from tflite_taichi.testing import (Const, Input, Output, model_inputs, one_op_model, quantize_array,
                                   run_ours, strategies)
from cases.slicing import (numpy_index, offset_case, pad_case, slice_case, split_case, split_v_case,
                           strided_spec)


S = strategies()


DTYPES = ["float32", "int8", "int32"]


@st.composite
def tensor_type(draw, dtype):
    """(numpy dtype, quantization) of a tensor of `dtype` ('float32', 'int8', 'int32')."""
    if dtype == "int8":
        return np.int8, draw(S.quant_params())
    return np.dtype(dtype).type, None


def _i32(values):
    return Const(np.array(values, np.int32))


def _expect_error(model, *words):
    with pytest.raises(ModelError) as info:
        run_ours(model, model_inputs(model))
    for w in words:
        assert w in str(info.value), str(info.value)


# -- RESHAPE ----------------------------------------------------------------------------------
@st.composite
def reshape_case(draw):
    """An input shape and a new shape with the same element count (maybe with one -1)."""
    shape = draw(S.shapes(0, 4, 1, 5))
    count = int(np.prod(shape))
    factors = []                       # split count into random factors
    rest = count
    for _ in range(draw(st.integers(0, 4))):
        divisors = [d for d in range(1, rest + 1) if rest % d == 0]
        f = draw(st.sampled_from(divisors))
        factors.append(f)
        rest //= f
    if rest != 1 or not factors:
        factors.append(rest)
    factors = draw(st.permutations(factors))
    new_shape = list(factors)
    if draw(st.booleans()):
        new_shape[draw(st.integers(0, len(new_shape) - 1))] = -1
    return shape, new_shape, tuple(factors)


@st.composite
def squeeze_case(draw):
    shape = tuple(draw(st.lists(st.sampled_from([1, 1, 2, 3]), min_size=1, max_size=5)))
    ones = [d for d, s in enumerate(shape) if s == 1]
    dims = draw(st.lists(st.sampled_from(ones), unique=True)) if ones else []
    dims = [d - len(shape) if draw(st.booleans()) else d for d in dims]
    drop = {d % len(shape) for d in dims} if dims else set(ones)
    out = tuple(s for d, s in enumerate(shape) if d not in drop)
    return shape, dims, out


# -- CONCATENATION ----------------------------------------------------------------------------
@st.composite
def concat_case(draw):
    shape = draw(S.shapes(1, 4, 1, 4))
    axis = draw(st.integers(-len(shape), len(shape) - 1))
    a = axis % len(shape)
    sizes = draw(st.lists(st.integers(1, 4), min_size=1, max_size=4))
    shapes = [shape[:a] + (s,) + shape[a + 1:] for s in sizes]
    out = shape[:a] + (sum(sizes),) + shape[a + 1:]
    return shapes, axis, out


# -- DEPTH_TO_SPACE / SPACE_TO_DEPTH ----------------------------------------------------------
@st.composite
def depth_to_space_case(draw):
    """(input shape, block_size, output shape) of a DEPTH_TO_SPACE; swapped, a SPACE_TO_DEPTH."""
    b, h, w = draw(st.integers(1, 2)), draw(st.integers(1, 4)), draw(st.integers(1, 4))
    bs, c = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    return (b, h, w, bs * bs * c), bs, (b, h * bs, w * bs, c)


# -- the delegate's case table ----------------------------------------------------------------
# One row per op: its name and how its one-op model's tensors and options are drawn, given the
# IoTypes the dtype asks for. delegate_case turns a row into check_op's strategy. Every row keeps
# check_delegate's tolerances (TAICHI_RTOL; int8: one unit): these ops move values and do no
# arithmetic, so only a quantized output's snap onto its own grid can differ, by one step.
@dataclass(frozen=True)
class IoTypes:
    """How a case's tensors are typed: float32, or int8 with the input on one grid and the output
    on its own (the delegate's store must snap the moved float view onto the output's grid
    exactly as the reference's fake-quant does)."""
    dtype: type
    q_in: object = None
    q_out: object = None

    def input(self, shape) -> Input:
        return Input(tuple(shape), self.dtype, self.q_in)

    def output(self, shape) -> Output:
        return Output(tuple(shape), self.dtype, self.q_out)


@st.composite
def io_types(draw, dtype):
    if dtype == "int8":
        return IoTypes(np.int8, draw(S.quant_params()), draw(S.quant_params()))
    return IoTypes(np.float32)


@st.composite
def own_grid(draw, t: IoTypes):
    """Quantization for one more tensor with its own grid, when the case is quantized."""
    return draw(S.quant_params()) if t.q_in is not None else None


@dataclass(frozen=True)
class OpCase:
    """A row: `io(types)` is a strategy drawing (inputs, outputs, options) of `op`'s one-op
    model; `covers` says what the draws reach beyond plain shapes; `variant` names a second row
    of the same op."""
    op: str
    io: Callable
    covers: str = ""
    variant: str = ""

    @property
    def id(self) -> str:
        return f"{self.op}-{self.variant}" if self.variant else self.op


@st.composite
def delegate_case(draw, row: OpCase, dtype: str):
    """check_op's (model, inputs, options) for `row` in `dtype`: seeded inputs."""
    inputs, outputs, options = draw(row.io(draw(io_types(dtype))))
    return one_op_model(row.op, inputs, outputs, **options), None, {"seed": draw(S.seeds())}


@st.composite
def reshape_io(draw, t):
    shape, new_shape, out = draw(reshape_case())
    how = draw(st.sampled_from(["input", "options", "both"]))
    inputs = [t.input(shape)] + ([_i32(new_shape)] if how != "options" else [])
    return inputs, [t.output(out)], ({"new_shape": new_shape} if how != "input" else {})


@st.composite
def expand_dims_io(draw, t):
    shape = draw(S.shapes(0, 4, 1, 5))
    axis = draw(st.integers(-len(shape) - 1, len(shape)))
    out = np.expand_dims(np.empty(shape), axis).shape
    return [t.input(shape), _i32(axis)], [t.output(out)], {}


@st.composite
def squeeze_io(draw, t):
    shape, dims, out = draw(squeeze_case())
    return [t.input(shape)], [t.output(out)], ({"squeeze_dims": dims} if dims else {})


@st.composite
def transpose_io(draw, t):
    shape = draw(S.shapes(1, 5, 1, 4))
    perm = draw(st.permutations(range(len(shape))))
    return [t.input(shape), _i32(perm)], [t.output([shape[p] for p in perm])], {}


@st.composite
def concatenation_io(draw, t):
    """Each input on its own grid (int8); maybe one a constant (packed in the weights)."""
    shapes, axis, out = draw(concat_case())
    const_index = draw(st.integers(-1, 3)) if len(shapes) > 1 else -1
    rng = np.random.default_rng(draw(S.seeds()))
    inputs = []
    for i, s in enumerate(shapes):
        q = draw(own_grid(t))
        if i == const_index:
            value = rng.uniform(-3, 3, s).astype(np.float32)
            inputs.append(Const(quantize_array(value, q) if q else value, quantization=q))
        else:
            inputs.append(Input(s, t.dtype, q))
    options = {"axis": axis, "fused_activation_function": draw(S.activations())}
    return inputs, [t.output(out)], options


@st.composite
def pack_io(draw, t):
    shape = draw(S.shapes(0, 4, 1, 4))
    n = draw(st.integers(1, 4))
    axis = draw(st.integers(-len(shape) - 1, len(shape)))
    a = axis % (len(shape) + 1)
    out = shape[:a] + (n,) + shape[a:]
    return [t.input(shape)] * n, [t.output(out)], {"values_count": n, "axis": axis}


@st.composite
def unpack_io(draw, t):
    """Several outputs, all written by the one step."""
    shape = draw(S.shapes(1, 4, 1, 4))
    axis = draw(st.integers(-len(shape), len(shape) - 1))
    a = axis % len(shape)
    outputs = [t.output(shape[:a] + shape[a + 1:])] * shape[a]
    return [t.input(shape)], outputs, {"num": shape[a], "axis": axis}


@st.composite
def depth_space_io(draw, t, to_depth=False):
    """DEPTH_TO_SPACE's case; to_depth: the same shapes swapped, a SPACE_TO_DEPTH."""
    deep, bs, wide = draw(depth_to_space_case())
    shape, out = (wide, deep) if to_depth else (deep, wide)
    return [t.input(shape)], [t.output(out)], {"block_size": bs}


@st.composite
def pad_io(draw, t):
    """int8: pads with the real value 0 (the input's zero point), snapped to the output grid."""
    shape, pads, out = draw(pad_case())
    return [t.input(shape), Const(pads)], [t.output(out)], {}


@st.composite
def padv2_io(draw, t):
    """The pad value a constant (packed in the weights) or a run-time input, on its own grid."""
    shape, pads, out = draw(pad_case())
    value = draw(st.floats(-4, 4))
    where = draw(st.sampled_from(["const", "input"]))
    q = draw(own_grid(t))
    if where == "input":
        pad_value = Input((1,), t.dtype, q)
    elif q:
        pad_value = Const(quantize_array(np.full((1,), value), q), quantization=q)
    else:
        pad_value = Const(np.full((1,), value, np.float32))
    return [t.input(shape), Const(pads), pad_value], [t.output(out)], {}


@st.composite
def slice_io(draw, t):
    shape, begin, size, out = draw(slice_case())
    return [t.input(shape), _i32(begin), _i32(size)], [t.output(out)], {}


@st.composite
def strided_slice_io(draw, t):
    """Every spec (masks, ellipsis, new axes, shrinks, negative strides), as numpy indexes."""
    shape = draw(S.shapes(1, 4, 1, 6))
    begin, end, strides, masks, kinds = draw(strided_spec(shape))
    out = np.empty(shape)[numpy_index(begin, end, strides, masks, kinds)].shape
    assume(0 not in out)    # an empty output stays on the CPU (partition.delegate_reason)
    return [t.input(shape), _i32(begin), _i32(end), _i32(strides)], [t.output(out)], masks


@st.composite
def strided_slice_offset_io(draw, t):
    """offset=True: end holds the extent from begin."""
    shape, begin, size, strides = draw(offset_case())
    out = tuple(max(-(-s // stride), 0) for s, stride in zip(size, strides))
    assume(0 not in out)    # an empty output stays on the CPU (partition.delegate_reason)
    inputs = [t.input(shape), _i32(begin), _i32(size), _i32(strides)]
    return inputs, [t.output(out)], {"offset": True}


@st.composite
def split_io(draw, t):
    shape, axis, num, out = draw(split_case())
    return [_i32(axis), t.input(shape)], [t.output(out)] * num, {"num_splits": num}


@st.composite
def split_v_io(draw, t):
    """Each output on its own grid (int8)."""
    shape, axis, size_splits, outs = draw(split_v_case())
    outputs = [Output(o, t.dtype, draw(own_grid(t))) for o in outs]
    inputs = [t.input(shape), _i32(size_splits), _i32(axis)]
    return inputs, outputs, {"num_splits": len(outs)}
