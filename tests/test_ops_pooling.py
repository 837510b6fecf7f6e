"""AVERAGE_POOL_2D and MAX_POOL_2D vs LiteRT's reference kernels through one-op models:
float32 and int8, filter sizes, strides, SAME/VALID padding (the average counts only the
window's elements inside the input), fused activations.
Tolerances: tflite_taichi.testing (1e-5 of the largest magnitude; 1 unit). Float inputs are
multiples of 1/8, so window sums are exact in float32 whatever the summation order (a sum that
cancels to a tiny average would otherwise differ by more than 1e-5 of it between two correct
orders)."""
import numpy as np
import pytest
from hypothesis import given, strategies as st

from tflite_taichi.errors import ModelError
from tflite_taichi.testing import (Input, Output, check_against_litert, one_op_model, run_ours,
                                   strategies)

S = strategies()
OPS = ["AVERAGE_POOL_2D", "MAX_POOL_2D"]


@st.composite
def pool_case(draw):
    padding = draw(st.sampled_from(["SAME", "VALID"]))
    k = (draw(st.integers(1, 5)), draw(st.integers(1, 5)))
    s = (draw(st.integers(1, 4)), draw(st.integers(1, 4)))
    size = [draw(st.integers(kk if padding == "VALID" else 1, 12)) for kk in k]
    out = [-(-n // st_) if padding == "SAME" else (n - kk) // st_ + 1
           for n, kk, st_ in zip(size, k, s)]
    n, c = draw(st.integers(1, 2)), draw(st.integers(1, 8))
    return dict(in_shape=(n, *size, c), out_shape=(n, *out, c),
                options=dict(padding=padding, filter_height=k[0], filter_width=k[1],
                             stride_h=s[0], stride_w=s[1],
                             fused_activation_function=draw(S.activations())))


@pytest.mark.parametrize("op", OPS)
@given(case=pool_case(), seed=S.seeds())
def test_float32_matches_litert(op, case, seed):
    model = one_op_model(op, [Input(case["in_shape"])], [Output(case["out_shape"])],
                         **case["options"])
    rng = np.random.default_rng(seed)
    x = (rng.integers(-24, 25, case["in_shape"]) / 8).astype(np.float32)
    check_against_litert(model, [x])


@pytest.mark.parametrize("op", OPS)
@given(case=pool_case(), q=S.quant_params(), seed=S.seeds())
def test_int8_matches_litert(op, case, q, seed):
    # LiteRT's int8 pooling works on the raw integers: the converter gives input and output
    # one quantization, and LiteRT silently computes nonsense if they differ.
    model = one_op_model(op, [Input(case["in_shape"], np.int8, q)],
                         [Output(case["out_shape"], np.int8, q)], **case["options"])
    check_against_litert(model, seed=seed)


def test_average_counts_only_the_input():
    """A 3x3 SAME average over all-ones is 1 everywhere, corners included."""
    model = one_op_model("AVERAGE_POOL_2D", [Input((1, 4, 5, 2))], [Output((1, 4, 5, 2))],
                         padding="SAME", filter_height=3, filter_width=3, stride_h=1, stride_w=1)
    out = run_ours(model, [np.ones((1, 4, 5, 2), np.float32)])[0]
    np.testing.assert_array_equal(out, np.ones((1, 4, 5, 2), np.float32))


POOL = dict(padding="SAME", filter_height=2, filter_width=2, stride_h=1, stride_w=1)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("options,match", [
    (dict(POOL, stride_w=0), "strides"),
    (dict(POOL, filter_height=0), "filter size"),
    (dict(POOL, padding=3), "padding"),
    (dict(POOL, fused_activation_function=8), "activation"),
    (dict(POOL, padding="VALID", filter_height=5), "does not fit"),
])
def test_bad_options(op, options, match):
    model = one_op_model(op, [Input((1, 4, 4, 2))], [Output((1, 4, 4, 2))], **options)
    with pytest.raises(ModelError, match=match) as info:
        run_ours(model, [np.ones((1, 4, 4, 2), np.float32)])
    assert op in str(info.value)


@pytest.mark.parametrize("op", OPS)
def test_input_must_be_4d(op):
    model = one_op_model(op, [Input((4, 4, 2))], [Output((4, 4, 2))], **POOL)
    with pytest.raises(ModelError, match="rank 4") as info:
        run_ours(model, [np.ones((4, 4, 2), np.float32)])
    assert op in str(info.value)
