"""Cases for activations ops shared by the tests (moved from test_ops_activations.py): hypothesis
strategies, one-op model builders and their helpers, used by test_ops_activations.py and the
delegate's tests."""
import numpy as np
from hypothesis import strategies as st
from tflite_taichi.testing import Const, Input, Output, one_op_model, quantize_array, strategies


S = strategies()


UNARY = ["RELU", "RELU6", "RELU_N1_TO_1", "RELU_0_TO_1", "LOGISTIC", "TANH", "EXP", "HARD_SWISH"]


# Output quantization LiteRT's int8 kernels insist on (None: any).
FIXED_OUTPUT_QUANT = {"LOGISTIC": (1 / 256, -128), "SOFTMAX": (1 / 256, -128)}


@st.composite
def prelu_shapes(draw):
    """(input shape, alpha shape): alpha is a suffix of the input's dims, some of them 1, so
    broadcasting keeps the input's shape (LiteRT's requirement)."""
    shape = draw(S.shapes(1, 4, 1, 5))
    alpha = tuple(draw(st.sampled_from([d, 1])) for d in shape)
    return shape, alpha[draw(st.integers(0, len(alpha))):]


def prelu_int8_case(shapes, const_alpha, qi, qa, qo, seed):
    """(model, inputs): int8 PRELU with a constant or run-time alpha (also the delegate's test)."""
    shape, alpha_shape = shapes
    rng = np.random.default_rng(seed)
    alpha = quantize_array(rng.uniform(-1, 2, alpha_shape), qa)
    alpha_in = Const(alpha, qa) if const_alpha else Input(alpha_shape, np.int8, qa)
    model = one_op_model("PRELU", [Input(shape, np.int8, qi), alpha_in],
                         [Output(shape, np.int8, qo)])
    x = rng.integers(-128, 128, shape).astype(np.int8)
    return model, [x] + ([] if const_alpha else [alpha])
