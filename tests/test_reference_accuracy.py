"""How far the numpy reference (the ground truth) may be from exact arithmetic and from LiteRT,
with each bound derived from the op's reduction length and the float32/float64 unit roundoff
rather than picked to pass; and RESHAPE's element count on shapes whose product overflows int64.

Error model. A sum of n float32 terms computed in float32 in any order (BLAS blocking, FMA or
not) is within gamma(n) * sum|terms| of the exact sum, gamma(n) = n*u / (1 - n*u), u = 2**-24
(Higham, Accuracy and Stability of Numerical Algorithms, 3.1). The reference's convolutions are
such sums (im2col + BLAS, n = taps * input channels + 1 for the bias). Its pools sum in float64
and round once: within half a float32 ulp of the exact mean, plus n * 2**-53 * mean|x| for the
float64 sum. Exact values come from float64 arithmetic (the same op evaluated on float64 inputs,
or math.fsum), whose own error is the same model with u = 2**-53.

Against LiteRT: |reference - LiteRT| <= |LiteRT - exact| + E_reference (triangle inequality):
the reference may be no further from LiteRT than exact arithmetic is, plus its own error bound.
A float32 running sum over a global pool's 128x128 taps (TFLite's reference kernel, and what
the reference did) drifts by ~60 ulps on positive data, where XNNPACK's blocked sum stays within
~15: the reference was then the furthest from LiteRT of every path, and fails these checks.
"""
import dataclasses
import math
import os

import numpy as np
import pytest

from tflite_taichi import Interpreter, graph
from tflite_taichi.errors import ModelError
from tflite_taichi.testing import Const, Input, Output, model_inputs, one_op_model, run_litert, run_ours

litert = pytest.importorskip("ai_edge_litert.interpreter")

U32 = 2.0 ** -24
U64 = 2.0 ** -53


def gamma(n: int, u: float = U32) -> float:
    return n * u / (1 - n * u)


def half_ulp32(values) -> np.ndarray:
    """Half the float32 spacing at each value: the error of rounding it to float32 once."""
    return 0.5 * np.spacing(np.abs(np.asarray(values)).astype(np.float32)).astype(np.float64)


def assert_within(actual, expected, bound, what: str):
    excess = np.abs(np.asarray(actual, np.float64) - expected) - bound
    worst = tuple(int(i) for i in np.unravel_index(np.argmax(excess), excess.shape))
    assert excess[worst] <= 0, (f"{what}: {float(np.asarray(actual)[worst])!r} vs {float(expected[worst])!r} "
                                f"at {worst}, beyond the bound {float(bound[worst]):.3e} by {float(excess[worst]):.3e}")


# -- the op the reference had least accurate: a global pool, through one-op models ------------
SIDE, CHANNELS = 128, 16            # selfie_segmentation's last squeeze-excite pool
TAPS = SIDE * SIDE                  # a power of two: the exact mean is fsum / TAPS, exactly


def _global_pool_model(op: str) -> bytes:
    return one_op_model(op, [Input((1, SIDE, SIDE, CHANNELS))], [Output((1, 1, 1, CHANNELS))],
                        padding="VALID", filter_height=SIDE, filter_width=SIDE, stride_h=1, stride_w=1)


def _post_relu_features(seed: int = 0) -> np.ndarray:
    """Positive values, as a pool after a ReLU sees: a running sum's partial sums then grow to
    the whole total, so each addition rounds at the total's ulp."""
    return np.random.default_rng(seed).uniform(0.0, 1.0, (1, SIDE, SIDE, CHANNELS)).astype(np.float32)


def _exact_channel_means(x: np.ndarray, of=lambda v: v) -> np.ndarray:
    """Per channel, fsum(of(x)) / TAPS in float64: within 2**-53 relative of the exact mean."""
    flat = x.astype(np.float64).reshape(-1, CHANNELS)
    return np.array([math.fsum(of(flat[:, c])) / TAPS for c in range(CHANNELS)]).reshape(1, 1, 1, CHANNELS)


def test_global_average_pool_is_the_correctly_rounded_mean():
    x = _post_relu_features()
    exact = _exact_channel_means(x)
    ours, = run_ours(_global_pool_model("AVERAGE_POOL_2D"), [x])
    # one rounding to float32, after a float64 sum of TAPS terms (x >= 0: sum|x| = TAPS * mean)
    bound = half_ulp32(exact) + gamma(TAPS, U64) * exact
    assert_within(ours, exact, bound, "AVERAGE_POOL_2D over 128x128 taps vs the exact mean")


def test_global_average_pool_is_no_further_from_litert_than_exact_arithmetic():
    x = _post_relu_features()
    model = _global_pool_model("AVERAGE_POOL_2D")
    exact = _exact_channel_means(x)
    ours, = run_ours(model, [x])
    theirs, = run_litert(model, [x], kernels="xnnpack")
    own_error = half_ulp32(exact) + gamma(TAPS, U64) * exact
    assert_within(ours, theirs.astype(np.float64), np.abs(theirs - exact) + own_error,
                  "AVERAGE_POOL_2D vs LiteRT (XNNPACK, its default)")


def test_global_l2_pool_is_the_correctly_rounded_root_mean_square():
    """Squares rounded (u each, relative), their float32-rounded mean (u more), the square root
    halving that relative error and adding its own rounding: within 2u of the exact value
    (a float32 running sum of the squares is ~20 ulps away)."""
    x = _post_relu_features(1)
    exact = np.sqrt(_exact_channel_means(x, of=np.square))
    ours, = run_ours(_global_pool_model("L2_POOL_2D"), [x])
    bound = (2 * U32 + gamma(TAPS, U64)) * exact
    assert_within(ours, exact, bound, "L2_POOL_2D over 128x128 taps vs the exact root mean square")


# -- selfie_segmentation, op by op ------------------------------------------------------------
# Ops whose float32 result is a sum: each held to the error model above on the very inputs
# LiteRT's ops saw (its intermediates, all tensors preserved), so no op inherits another's error.
def _reduction_length(node) -> int:
    """Terms per output element, the bias included."""
    if node.op == "AVERAGE_POOL_2D":
        return node.options.filter_h * node.options.filter_w
    _, kh, kw, cin = node.inputs[1].shape
    if node.op == "DEPTHWISE_CONV_2D":
        return kh * kw + 1
    return kh * kw * cin + 1        # CONV_2D; a transposed conv sums over at most as many taps


SUMS = ("CONV_2D", "DEPTHWISE_CONV_2D", "AVERAGE_POOL_2D", "CUSTOM:Convolution2DTransposeBias")


def _without_activation(node):
    """The node with no fused activation: sum|terms| must not be clipped (RELU6). The
    activations are 1-Lipschitz, so a bound on the sum bounds the activated result."""
    options = node.options
    if dataclasses.is_dataclass(options) and hasattr(options, "fused_activation_function"):
        options = dataclasses.replace(options, fused_activation_function=0)
    return dataclasses.replace(node, options=options)


def _reference_error_bound(node, exact, magnitude) -> np.ndarray:
    n = _reduction_length(node)
    if node.op == "AVERAGE_POOL_2D":        # float64 sum, one rounding to float32
        return half_ulp32(exact) + gamma(n, U64) * magnitude
    return gamma(n) * magnitude             # float32 BLAS, any summation order


@pytest.fixture(scope="module")
def selfie_ops(shared_models):
    """(node, opdef, LiteRT's inputs, LiteRT's output) for every summing op of
    selfie_segmentation on seeded uniform noise."""
    path = os.path.join(shared_models, "selfie_segmentation.tflite")
    ours = Interpreter(model_path=path, backend="reference")
    prepared = graph.prepare(ours.model.main, graph.resolve_ops(ours.model), {})
    with pytest.warns(UserWarning, match="preserve_all_tensors"):
        theirs = litert.Interpreter(model_path=path, experimental_preserve_all_tensors=True)
    theirs.allocate_tensors()
    rng = np.random.default_rng(0)
    for d in theirs.get_input_details():
        theirs.set_tensor(d["index"], rng.uniform(0.0, 1.0, d["shape"]).astype(np.float32))
    theirs.invoke()
    cases = []
    for step in prepared.steps:
        node = step.node
        if node.op not in SUMS:
            continue
        inputs = [None if spec is None else spec.value if spec.value is not None
                  else theirs.get_tensor(spec.index) for spec in node.inputs]
        cases.append((node, step.opdef, inputs, theirs.get_tensor(node.outputs[0].index)))
    return cases


def test_selfie_segmentation_reference_within_its_error_model_of_litert(selfie_ops):
    """Every conv, depthwise conv, pool and transposed conv of the model (65 ops): the
    reference's output on LiteRT's inputs within |LiteRT - exact| + the reference's bound.
    Exact: the op in float64 (its error, gamma(n, 2**-53) * sum|terms|, allowed too)."""
    assert {node.op for node, *_ in selfie_ops} == set(SUMS)
    for node, opdef, inputs, theirs in selfie_ops:
        ours = np.asarray(opdef.reference(node, inputs)[0])
        wide = [None if v is None else np.asarray(v, np.float64) for v in inputs]
        exact = np.asarray(opdef.reference(node, wide)[0], np.float64)
        magnitude = np.asarray(opdef.reference(_without_activation(node),
                                               [None if v is None else np.abs(v) for v in wide])[0])
        n = _reduction_length(node)
        bound = (np.abs(theirs - exact) + _reference_error_bound(node, exact, magnitude)
                 + gamma(n, U64) * magnitude)
        assert_within(ours, theirs.astype(np.float64), bound,
                      f"selfie_segmentation op #{node.index} ({node.op}, {n} terms) vs LiteRT")


# -- RESHAPE: element counts beyond int64 -----------------------------------------------------
@pytest.mark.parametrize("in_shape, new_shape, elements", [
    # 6 * 2**64 wraps to 0 in int64: the count reported must be the real one
    ((6,), [65536, 65536, 65536, 65536, 6], 6 * 2 ** 64),
    # 2**64 wraps to exactly the input's 0 elements: without exact counting the shape passes
    ((0,), [65536, 65536, 65536, 65536], 2 ** 64),
    ((2, 3), [2 ** 32, 2 ** 32, 6], 6 * 2 ** 64),          # an int64 shape input
])
def test_reshape_to_a_shape_whose_element_count_overflows_int64(in_shape, new_shape, elements):
    dtype = np.int64 if max(new_shape) >= 2 ** 31 else np.int32
    model = one_op_model("RESHAPE", [Input(in_shape), Const(np.array(new_shape, dtype))],
                         [Output(in_shape)])
    with pytest.raises(ModelError) as info:
        run_ours(model, model_inputs(model))
    message = str(info.value)
    assert "RESHAPE" in message and "op #0" in message, message
    count = math.prod(in_shape)
    assert (f"cannot reshape {list(in_shape)} ({count} elements) to {new_shape} "
            f"({elements} elements)") in message, message
