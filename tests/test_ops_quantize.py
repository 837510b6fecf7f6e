"""DEQUANTIZE and QUANTIZE vs LiteRT through one-op models. Tolerances: tflite_taichi.testing
(1e-5 of the largest magnitude; 1 unit).

DEQUANTIZE: float16, int8, uint8, int16 -> float32. QUANTIZE: float32 -> int8, uint8, int16, and
the requantizations LiteRT's kernel has: int8 -> int8 / uint8, uint8 -> int8 / uint8,
int16 -> int16 / int8 (int16 zero point 0). Random scales and zero points throughout."""
import numpy as np
import pytest
from hypothesis import given, strategies as st

from tflite_taichi.builder import ModelBuilder
from tflite_taichi.errors import ModelError
from tflite_taichi.interpreter import Interpreter
from tflite_taichi.testing import Input, Output, check_against_litert, one_op_model
from cases.quantize import INTS, REQUANTIZE, S, _real_range, quant_params


# -- DEQUANTIZE --------------------------------------------------------------------------------
@given(shape=S.shapes(0, 4), magnitude=st.sampled_from([1.0, 100.0, 60000.0]), seed=S.seeds())
def test_dequantize_float16_matches_litert(shape, magnitude, seed):
    rng = np.random.default_rng(seed)
    x = rng.uniform(-magnitude, magnitude, shape).astype(np.float16)
    model = one_op_model("DEQUANTIZE", [Input(shape, np.float16)], [Output(shape)])
    check_against_litert(model, [x])


def test_dequantize_float16_constant_is_folded_and_matches_litert():
    """A float16 weight behind DEQUANTIZE feeding ADD: folded at prepare, same result."""
    w = np.random.default_rng(0).normal(size=(3, 4)).astype(np.float16)
    b = ModelBuilder()
    g = b.subgraph()
    x = g.input("x", (3, 4))
    w32, y = g.tensor("w32", (3, 4)), g.tensor("y", (3, 4))
    g.op("DEQUANTIZE", [g.const("w16", w)], [w32])
    g.op("ADD", [x, w32], [y], fused_activation_function="NONE")
    g.output(y)
    model = b.finish()
    it = Interpreter(model_content=model, backend="reference")
    it.allocate_tensors()
    assert [row["folded"] for row in it.op_table()] == [True, False]
    check_against_litert(model, seed=1)


@given(shape=S.shapes(1, 4), data=st.data(), seed=S.seeds())
def test_dequantize_per_channel_int8_constant_matches_litert(shape, data, seed):
    """A per-channel int8 weight behind DEQUANTIZE (folded at prepare) feeding ADD."""
    dim = data.draw(st.integers(0, len(shape) - 1), label="quantized dimension")
    scales = data.draw(st.lists(S.scales(), min_size=shape[dim], max_size=shape[dim]), label="scales")
    zps = data.draw(st.lists(st.integers(-128, 127), min_size=shape[dim], max_size=shape[dim]),
                    label="zero points")
    rng = np.random.default_rng(seed)
    b = ModelBuilder()
    g = b.subgraph()
    x = g.input("x", shape)
    w = g.const("w8", rng.integers(-128, 128, shape).astype(np.int8), quantization=(scales, zps, dim))
    w32, y = g.tensor("w32", shape), g.tensor("y", shape)
    g.op("DEQUANTIZE", [w], [w32])
    g.op("ADD", [x, w32], [y], fused_activation_function="NONE")
    g.output(y)
    check_against_litert(b.finish(), seed=seed)


@pytest.mark.parametrize("dtype", list(INTS))
@given(data=st.data(), shape=S.shapes(0, 4), seed=S.seeds())
def test_dequantize_int_matches_litert(dtype, data, shape, seed):
    q = data.draw(quant_params(INTS[dtype]), label="quantization")
    model = one_op_model("DEQUANTIZE", [Input(shape, INTS[dtype], q)], [Output(shape)])
    check_against_litert(model, seed=seed)


# -- QUANTIZE ----------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", list(INTS))
@given(data=st.data(), shape=S.shapes(0, 4), seed=S.seeds())
def test_quantize_float32_matches_litert(dtype, data, shape, seed):
    q = data.draw(quant_params(INTS[dtype]), label="quantization")
    rng = np.random.default_rng(seed)
    lo, hi = _real_range(INTS[dtype], q)
    x = rng.uniform(lo, hi, shape).astype(np.float32)
    model = one_op_model("QUANTIZE", [Input(shape)], [Output(shape, INTS[dtype], q)])
    check_against_litert(model, [x], units=0)   # both round(x / scale) + zp in float32


@given(data=st.data(), shape=S.shapes(1, 3))
def test_quantize_float32_half_way_values_match_litert(data, shape):
    """Reals exactly between two grid points round away from zero, as in TFLite."""
    q = data.draw(S.quant_params(np.int8), label="quantization")
    steps = data.draw(st.lists(st.integers(-140, 140), min_size=int(np.prod(shape)),
                               max_size=int(np.prod(shape))), label="steps")
    x = ((np.array(steps, np.float32) + np.float32(0.5)) * np.float32(q[0])).reshape(shape)
    model = one_op_model("QUANTIZE", [Input(shape)], [Output(shape, np.int8, q)])
    check_against_litert(model, [x], units=0)


@pytest.mark.parametrize("src,dst", REQUANTIZE)
@given(data=st.data(), shape=S.shapes(0, 4), seed=S.seeds())
def test_requantize_matches_litert(src, dst, data, shape, seed):
    qi = data.draw(quant_params(INTS[src]), label="input quantization")
    qo = data.draw(quant_params(INTS[dst]), label="output quantization")
    model = one_op_model("QUANTIZE", [Input(shape, INTS[src], qi)], [Output(shape, INTS[dst], qo)])
    check_against_litert(model, seed=seed)


@given(shape=S.shapes(0, 4), qi=S.quant_params(np.uint8), seed=S.seeds())
def test_uint8_to_int8_with_same_scale_is_exact_shift(shape, qi, seed):
    """The common uint8 -> int8 conversion: same scale, zero point - 128 (exact in LiteRT)."""
    qo = (qi[0], qi[1] - 128)
    model = one_op_model("QUANTIZE", [Input(shape, np.uint8, qi)], [Output(shape, np.int8, qo)])
    check_against_litert(model, seed=seed, units=0)


# -- invalid models ----------------------------------------------------------------------------
def _prepare(model):
    Interpreter(model_content=model, backend="reference").allocate_tensors()


def test_quantize_to_an_unquantized_output_is_refused():
    with pytest.raises(ModelError, match="QUANTIZE.*quantization"):
        _prepare(one_op_model("QUANTIZE", [Input((2, 3))], [Output((2, 3), np.int8)]))


def test_quantize_to_float_is_refused():
    with pytest.raises(ModelError, match="QUANTIZE.*dtype"):
        _prepare(one_op_model("QUANTIZE", [Input((2, 3))], [Output((2, 3), np.float32, (0.1, 0))]))


def test_dequantize_from_float32_is_refused():
    with pytest.raises(ModelError, match="DEQUANTIZE.*dtype"):
        _prepare(one_op_model("DEQUANTIZE", [Input((2, 3))], [Output((2, 3))]))


def test_dequantize_of_unquantized_int8_is_refused():
    with pytest.raises(ModelError, match="DEQUANTIZE.*quantization"):
        _prepare(one_op_model("DEQUANTIZE", [Input((2, 3), np.int8)], [Output((2, 3))]))


def test_float_view_quantize_saturates_infinities_after_the_zero_point():
    """-inf is qmin and +inf qmax whatever the zero point (LiteRT's kernels and the delegate's
    store saturate); NaN becomes the zero point. Per tensor and per channel."""
    from tflite_taichi.ops.base import Quantization
    from tflite_taichi.quant.floatview import quantize
    x = np.array([-np.inf, np.inf, np.nan, 1.0], np.float32)
    for zp in (100, -100, 0):
        q = quantize(x, Quantization(np.array([0.1], np.float32), np.array([zp])), np.int8)
        assert q.tolist() == [-128, 127, zp, min(zp + 10, 127)]
    per_channel = Quantization(np.array([0.1, 0.2], np.float32), np.array([100, -100]), 1)
    q = quantize(np.array([[-np.inf, np.inf], [np.nan, np.nan]], np.float32), per_channel, np.int8)
    assert q.tolist() == [[-128, 127], [100, -100]]


@given(dtype=st.sampled_from([np.int8, np.uint8, np.int16]), data=st.data(),
       per_channel=st.booleans(), seed=S.seeds())
def test_dequantize_in_float32_is_the_float64_formula_bit_for_bit(dtype, data, per_channel, seed):
    """quant.dequantize computes 8/16-bit data in float32 (faster); it must equal (q - zp) *
    scale in float64 rounded once, for any scale float32 has (subnormal products, overflow)."""
    from tflite_taichi.ops.base import Quantization
    from tflite_taichi.quant import dequantize
    rng = np.random.default_rng(seed)
    info = np.iinfo(dtype)
    q = rng.integers(info.min, info.max, (3, 5), endpoint=True).astype(dtype)
    n = 5 if per_channel else 1
    scales = np.array(data.draw(st.lists(st.floats(float(np.finfo(np.float32).smallest_subnormal),
                                                  float(np.finfo(np.float32).max), width=32), min_size=n, max_size=n)),
                      np.float32)
    lo, hi = (0, 0) if dtype == np.int16 else (info.min, info.max)
    zps = np.array(data.draw(st.lists(st.integers(lo, hi), min_size=n, max_size=n)), np.int64)
    quant = Quantization(scale=scales, zero_point=zps, quantized_dimension=1)
    s, z = quant.broadcastable(2)
    with np.errstate(over="ignore"):
        expected = ((q.astype(np.float64) - z) * s.astype(np.float64)).astype(np.float32)
        actual = dequantize(q, quant)
    assert actual.dtype == np.float32
    np.testing.assert_array_equal(actual, expected)


@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.int16])
@pytest.mark.parametrize("per_channel", [False, True])
def test_host_quantize_equals_the_float64_formula(dtype, per_channel):
    """quantize()'s in-place float32 path (the IO of int8 models) against TFLite's formula
    computed directly: round half away from zero of x / scale in float32, plus the zero point,
    clamped; NaN to the zero point. Ties, +-inf, -0 and values far outside the range included."""
    from tflite_taichi.ops.base import Quantization
    from tflite_taichi.quant.floatview import quantize, quantized_range
    rng = np.random.default_rng(7)
    lo, hi = quantized_range(dtype)
    for trial in range(40):
        if per_channel:
            q = Quantization(scale=rng.uniform(1e-4, 2, 5).astype(np.float32),
                             zero_point=rng.integers(-20, 20, 5), quantized_dimension=3)
        else:
            q = Quantization(scale=np.array([rng.uniform(1e-4, 2)], np.float32),
                             zero_point=np.array([rng.integers(-100, 100)]))
        x = (rng.standard_normal((2, 3, 4, 5)) * [0.01, 1, 100, 1e6, 1e30][trial % 5]).astype(np.float32)
        x.ravel()[:6] = np.float32(q.scale[0]) * np.array([0.5, -0.5, 1.5, -1.5, 2.5, -2.5], np.float32)
        x.ravel()[6:10] = [np.nan, np.inf, -np.inf, -0.0]
        scale, zp = q.broadcastable(4)
        with np.errstate(invalid="ignore", over="ignore"):
            y = (x / scale.astype(np.float32)).astype(np.float64)
            expected = np.sign(y) * np.floor(np.abs(y) + 0.5) + zp
        expected = np.clip(np.where(np.isnan(expected), np.broadcast_to(zp, x.shape), expected), lo, hi)
        np.testing.assert_array_equal(quantize(x, q, dtype), expected.astype(dtype))
