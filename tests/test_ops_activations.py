"""Activation ops vs LiteRT through one-op models: float32 and int8. Tolerances:
tflite_taichi.testing (1e-5 of the largest magnitude; 1 unit).

LiteRT's int8 constraints respected here (tflite/kernels/activations.cc, LiteRT 2.3):
LOGISTIC and SOFTMAX need output scale 1/256 and zero point -128; TANH takes any output
quantization (its int8 kernel is a lookup table) and is tested both with the canonical 1/128, 0
and with random parameters; HARD_SWISH needs input_scale / (128 * output_scale) <= 1.
LOGISTIC, TANH, EXP (lookup tables), SOFTMAX (lookup table of exp) and HARD_SWISH (16-bit fixed
point) all meet 1 unit. RELU_0_TO_1 (int8: requantized, then clamped to the quantized 0 and 1)
takes any input and output quantization."""
import numpy as np
import pytest
from hypothesis import given, strategies as st

from tflite_taichi.errors import ModelError
from tflite_taichi.interpreter import Interpreter
from tflite_taichi.testing import Const, Input, Output, check_against_litert, one_op_model
from cases.activations import FIXED_OUTPUT_QUANT, S, UNARY, prelu_int8_case, prelu_shapes


def _data(rng, shape, magnitude):
    return rng.uniform(-magnitude, magnitude, shape).astype(np.float32)


# -- float32 -----------------------------------------------------------------------------------
@pytest.mark.parametrize("op", UNARY)
@given(shape=S.shapes(0, 4), magnitude=st.sampled_from([1.0, 4.0, 12.0]), seed=S.seeds())
def test_unary_float32_matches_litert(op, shape, magnitude, seed):
    rng = np.random.default_rng(seed)
    model = one_op_model(op, [Input(shape)], [Output(shape)])
    check_against_litert(model, [_data(rng, shape, magnitude)])


@given(shape=S.shapes(1, 4, 1, 7), beta=st.sampled_from([1.0, 0.5, 2.0, 0.01]) | st.floats(-3, 3),
       magnitude=st.sampled_from([1.0, 10.0, 60.0]), seed=S.seeds())
def test_softmax_float32_matches_litert(shape, beta, magnitude, seed):
    rng = np.random.default_rng(seed)
    if beta < 0:
        # LiteRT computes exp((x - max(x)) * beta), which overflows to inf/inf = NaN once
        # (max - x) * -beta > 88; ours shifts by the max of x * beta and stays finite.
        magnitude = min(magnitude, 10.0)
    model = one_op_model("SOFTMAX", [Input(shape)], [Output(shape)], beta=beta)
    check_against_litert(model, [_data(rng, shape, magnitude)])


@given(shape=S.shapes(0, 4), alpha=st.floats(-2, 2), seed=S.seeds())
def test_leaky_relu_float32_matches_litert(shape, alpha, seed):
    rng = np.random.default_rng(seed)
    model = one_op_model("LEAKY_RELU", [Input(shape)], [Output(shape)], alpha=alpha)
    check_against_litert(model, [_data(rng, shape, 3.0)])


@given(shapes=prelu_shapes(), const_alpha=st.booleans(), seed=S.seeds())
def test_prelu_float32_matches_litert(shapes, const_alpha, seed):
    shape, alpha_shape = shapes
    rng = np.random.default_rng(seed)
    alpha = rng.uniform(-1, 2, alpha_shape).astype(np.float32)
    model = one_op_model("PRELU", [Input(shape), Const(alpha) if const_alpha else Input(alpha_shape)],
                         [Output(shape)])
    check_against_litert(model, [_data(rng, shape, 3.0)] + ([] if const_alpha else [alpha]))


# -- int8 --------------------------------------------------------------------------------------
@pytest.mark.parametrize("op", UNARY)
@given(shape=S.shapes(0, 4), qi=S.quant_params(), qo=S.quant_params(), seed=S.seeds())
def test_unary_int8_matches_litert(op, shape, qi, qo, seed):
    qo = FIXED_OUTPUT_QUANT.get(op, qo)
    if op == "HARD_SWISH":
        # LiteRT: output_multiplier = input_scale / 128 / output_scale must be <= 1.
        qo = (max(qo[0], qi[0] / 100), qo[1])
    model = one_op_model(op, [Input(shape, np.int8, qi)], [Output(shape, np.int8, qo)])
    check_against_litert(model, seed=seed)


@given(shape=S.shapes(0, 4), qi=S.quant_params(), seed=S.seeds())
def test_tanh_int8_canonical_output_matches_litert(shape, qi, seed):
    model = one_op_model("TANH", [Input(shape, np.int8, qi)], [Output(shape, np.int8, (1 / 128, 0))])
    check_against_litert(model, seed=seed)


@given(shape=S.shapes(1, 4, 1, 7), beta=st.sampled_from([1.0, 0.5, 2.0]) | st.floats(0.05, 4),
       qi=st.tuples(S.scales(1e-3, 0.5), st.integers(-128, 127)), seed=S.seeds())
def test_softmax_int8_matches_litert(shape, beta, qi, seed):
    model = one_op_model("SOFTMAX", [Input(shape, np.int8, qi)],
                         [Output(shape, np.int8, FIXED_OUTPUT_QUANT["SOFTMAX"])], beta=beta)
    check_against_litert(model, seed=seed)


@given(shape=S.shapes(0, 4), alpha=st.floats(0, 1.5), qi=S.quant_params(), qo=S.quant_params(),
       seed=S.seeds())
def test_leaky_relu_int8_matches_litert(shape, alpha, qi, qo, seed):
    model = one_op_model("LEAKY_RELU", [Input(shape, np.int8, qi)], [Output(shape, np.int8, qo)],
                         alpha=alpha)
    check_against_litert(model, seed=seed)


@given(shapes=prelu_shapes(), const_alpha=st.booleans(), qi=S.quant_params(),
       qa=S.quant_params(), qo=S.quant_params(), seed=S.seeds())
def test_prelu_int8_matches_litert(shapes, const_alpha, qi, qa, qo, seed):
    check_against_litert(*prelu_int8_case(shapes, const_alpha, qi, qa, qo, seed))


def test_relu_0_to_1_int8_clamps_at_the_quantized_0_and_1():
    """Every int8 code through an output grid whose 0 and 1 fall inside it: below 0 gives 0's
    code, above 1 gives 1's (an extreme code: round(1 / scale) + zero point), as LiteRT."""
    q_in, q_out = (0.02, 10), (1 / 200, -100)
    model = one_op_model("RELU_0_TO_1", [Input((256,), np.int8, q_in)],
                         [Output((256,), np.int8, q_out)])
    out = check_against_litert(model, [np.arange(-128, 128).astype(np.int8)])[0]
    assert out.min() == -100 and out.max() == 100


# -- invalid models ----------------------------------------------------------------------------
def _prepare(model):
    Interpreter(model_content=model, backend="reference").allocate_tensors()


def test_softmax_of_a_scalar_is_refused():
    with pytest.raises(ModelError, match="SOFTMAX"):
        _prepare(one_op_model("SOFTMAX", [Input(())], [Output(())], beta=1.0))


def test_softmax_non_finite_beta_is_refused():
    with pytest.raises(ModelError, match="SOFTMAX.*beta"):
        _prepare(one_op_model("SOFTMAX", [Input((2, 3))], [Output((2, 3))], beta=float("nan")))


def test_prelu_alpha_that_grows_the_input_is_refused():
    alpha = np.ones((4, 3), np.float32)
    with pytest.raises(ModelError, match="PRELU.*alpha"):
        _prepare(one_op_model("PRELU", [Input((1, 3)), Const(alpha)], [Output((4, 3))]))


def test_prelu_alpha_that_does_not_broadcast_is_refused():
    with pytest.raises(ModelError, match="PRELU"):
        _prepare(one_op_model("PRELU", [Input((2, 3)), Const(np.ones(2, np.float32))],
                              [Output((2, 3))]))


@pytest.mark.parametrize("op", ["TANH", "RELU_0_TO_1"])
def test_activation_dtype_mismatch_is_refused(op):
    with pytest.raises(ModelError, match=f"{op}.*dtype"):
        _prepare(one_op_model(op, [Input((2, 3))], [Output((2, 3), np.int8, (0.01, 0))]))


def test_activation_of_an_unsupported_dtype_is_refused():
    with pytest.raises(ModelError, match=r"RELU_0_TO_1.*'input_0' has dtype int32"):
        _prepare(one_op_model("RELU_0_TO_1", [Input((2,), np.int32)], [Output((2,), np.int32)]))


def test_leaky_relu_non_finite_alpha_is_refused():
    with pytest.raises(ModelError, match="LEAKY_RELU.*alpha"):
        _prepare(one_op_model("LEAKY_RELU", [Input((3,))], [Output((3,))], alpha=float("inf")))
