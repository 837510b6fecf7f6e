"""AVERAGE_POOL_2D, MAX_POOL_2D and L2_POOL_2D vs LiteRT's reference kernels through one-op
models: float32 and (average, max) int8, filter sizes, strides, SAME/VALID padding (the average
and L2 count only the window's elements inside the input), fused activations. L2_POOL_2D is
float32 only, in LiteRT as here: an int8 one is a ModelError.
Tolerances: tflite_taichi.testing (1e-5 of the largest magnitude; 1 unit). Float inputs are
multiples of 1/8, so window sums are exact in float32 whatever the summation order (a sum that
cancels to a tiny average would otherwise differ by more than 1e-5 of it between two correct
orders); their squares, multiples of 1/64, too, so an L2 pool differs only by the rounding of
its one division and root."""
import numpy as np
import pytest
from hypothesis import given

from tflite_taichi.errors import ModelError
from tflite_taichi.testing import Input, Output, check_against_litert, one_op_model, run_ours
from cases.pooling import S, pool_case

OPS = ["AVERAGE_POOL_2D", "MAX_POOL_2D"]          # float32 and int8
ALL_OPS = OPS + ["L2_POOL_2D"]                    # float32


@pytest.mark.parametrize("op", ALL_OPS)
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


def test_l2_pool_is_the_root_mean_square_of_the_taps_inside_the_input():
    """SAME 3x3 over a 2x2 input: every window holds all four taps (3, 4, 0, 0 -> 2.5), padding
    counted nowhere; then a fused RELU_N1_TO_1 clamps it to 1."""
    x = np.array([3.0, 4.0, 0.0, 0.0], np.float32).reshape(1, 2, 2, 1)
    for act, want in (("NONE", 2.5), ("RELU_N1_TO_1", 1.0)):
        model = one_op_model("L2_POOL_2D", [Input((1, 2, 2, 1))], [Output((1, 2, 2, 1))],
                             padding="SAME", filter_height=3, filter_width=3, stride_h=1,
                             stride_w=1, fused_activation_function=act)
        out = check_against_litert(model, [x])[0]
        np.testing.assert_array_equal(out, np.full((1, 2, 2, 1), want, np.float32))


@pytest.mark.parametrize("dtypes", [(np.int8, np.int8), (np.float32, np.int8)])
def test_l2_pool_of_other_than_float32_is_refused(dtypes):
    """LiteRT's L2 pool kernel has float32 only (pooling.cc); so has this one."""
    q = (0.05, 0)
    model = one_op_model("L2_POOL_2D", [Input((1, 4, 4, 2), dtypes[0], q if dtypes[0] == np.int8 else None)],
                         [Output((1, 2, 2, 2), dtypes[1], q)], padding="VALID", filter_height=2,
                         filter_width=2, stride_h=2, stride_w=2)
    with pytest.raises(ModelError, match=r"L2_POOL_2D.*int8; L2_POOL_2D takes and gives float32"):
        run_ours(model, [np.ones((1, 4, 4, 2), dtypes[0])])


POOL = dict(padding="SAME", filter_height=2, filter_width=2, stride_h=1, stride_w=1)


@pytest.mark.parametrize("op", ALL_OPS)
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


@pytest.mark.parametrize("op", ALL_OPS)
def test_input_must_be_4d(op):
    model = one_op_model(op, [Input((4, 4, 2))], [Output((4, 4, 2))], **POOL)
    with pytest.raises(ModelError, match="rank 4") as info:
        run_ours(model, [np.ones((4, 4, 2), np.float32)])
    assert op in str(info.value)
