"""Cases for shape ops shared by the tests (moved from test_ops_shape.py): hypothesis
strategies, one-op model builders and their helpers, used by test_ops_shape.py and the
delegate's tests."""
import numpy as np
import pytest
from hypothesis import strategies as st
from tflite_taichi.errors import ModelError
from tflite_taichi.testing import Const, model_inputs, run_ours, strategies


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
