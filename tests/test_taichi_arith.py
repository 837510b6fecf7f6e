"""Math ops (ops/arith.py) on the delegate (cpu, vulkan, opengl workers; fp16 on vulkan; gles) vs
the reference path. Tolerances: tflite_taichi.testing.TAICHI_RTOL; a quantized output within 1
unit.

The attribute space is the LiteRT tests' (test_ops_arith.py: the same data generators), the op
drawn inside each test so that every op is covered without a test (and its compiles) per op.
int8 runs every op, LiteRT's int8 kernels or not: on the float view each is the float formula
with the output snapped to its grid. Special values (NaN, +-inf, zeros, negatives under LOG and
SQRT, ROUND's ties, FLOOR_DIV's near-integer quotients) go through one multi-op model: one
compile per backend. ATAN2 (its own polynomial and special-value branches) has its own tests
at the end: float32 and int8 broadcasting, every special pair, fused into its producer's store.
RIGHT_SHIFT has no Taichi part (integers stay on the CPU)."""
import numpy as np
import pytest
from hypothesis import strategies as st

from tflite_taichi.builder import ModelBuilder
from tflite_taichi.testing import (Const, Input, Output, check_delegate, check_op, one_op_model,
                                   strategies)
from cases.arith import (ATAN2_SPECIALS, BINARY, UNARY, atan2_data, binary_data, unary_data,
                         unary_options)
from cases.elementwise import broadcast_pair

S = strategies()
# GELU twice: its erfc form and (approximate) its tanh form
UNARY_VARIANTS = [(op, False) for op in UNARY] + [("GELU", True)]


# The property tests go through check_op, the helper a user's op gets: a strategy of cases
# (model, inputs[, check_delegate's options]; inputs None: seeded from the model), each run on
# the reference path and on every worker's backend, delegated and matching.
@st.composite
def unary_float32_cases(draw):
    op, approximate = draw(st.sampled_from(UNARY_VARIANTS))
    shape, magnitude = draw(S.shapes(0, 4)), draw(st.sampled_from([1.0, 4.0, 30.0]))
    rng = np.random.default_rng(draw(S.seeds()))
    model = one_op_model(op, [Input(shape)], [Output(shape)], **unary_options(op, approximate))
    return model, [unary_data(op, rng, shape, magnitude)]


@st.composite
def unary_int8_cases(draw):
    op, approximate = draw(st.sampled_from(UNARY_VARIANTS))
    shape, qi, qo = draw(S.shapes(0, 4)), draw(S.quant_params()), draw(S.quant_params())
    model = one_op_model(op, [Input(shape, np.int8, qi)], [Output(shape, np.int8, qo)],
                         **unary_options(op, approximate))
    return model, None, {"seed": draw(S.seeds())}


@st.composite
def binary_float32_cases(draw):
    op, (a_shape, b_shape, out_shape) = draw(st.sampled_from(BINARY)), draw(broadcast_pair())
    const_rhs, decimals = draw(st.booleans()), draw(st.booleans())
    rng = np.random.default_rng(draw(S.seeds()))
    a, b = binary_data(op, rng, a_shape, b_shape, decimals)
    model = one_op_model(op, [Input(a_shape), Const(b) if const_rhs else Input(b_shape)],
                         [Output(out_shape)])
    return model, [a] + ([] if const_rhs else [b])


@st.composite
def binary_int8_cases(draw, op=None):
    op = op or draw(st.sampled_from(BINARY))
    a_shape, b_shape, out_shape = draw(broadcast_pair())
    qa, qb, qo = draw(S.quant_params()), draw(S.quant_params()), draw(S.quant_params())
    model = one_op_model(op, [Input(a_shape, np.int8, qa), Input(b_shape, np.int8, qb)],
                         [Output(out_shape, np.int8, qo)])
    return model, None, {"seed": draw(S.seeds())}


@st.composite
def add_n_cases(draw):
    n, shape = draw(st.integers(2, 5)), draw(S.shapes(0, 4))
    consts = draw(st.lists(st.booleans(), min_size=5, max_size=5))
    quantized, q, seed = draw(st.booleans()), draw(S.quant_params()), draw(S.seeds())
    consts[0] = False
    if quantized:
        ins = [Input(shape, np.int8, q)] * n
        return one_op_model("ADD_N", ins, [Output(shape, np.int8, q)]), None, {"seed": seed}
    rng = np.random.default_rng(seed)
    values = [rng.uniform(-3, 3, shape).astype(np.float32) for _ in range(n)]
    ins = [Const(v) if c else Input(shape) for v, c in zip(values, consts)]
    model = one_op_model("ADD_N", ins, [Output(shape)])
    return model, [v for v, c in zip(values, consts) if not c]


def test_unary_float32_delegate_matches_reference(taichi_workers):
    check_op(unary_float32_cases(), workers=taichi_workers)


def test_unary_int8_delegate_matches_reference(taichi_workers):
    """Full int8 input range: negatives under LOG (-inf: the lowest value), SQRT and RSQRT (NaN:
    the zero point), zero under RSQRT (inf: the highest value)."""
    check_op(unary_int8_cases(), workers=taichi_workers)


def test_binary_float32_delegate_matches_reference(taichi_workers):
    check_op(binary_float32_cases(), workers=taichi_workers)


def test_binary_int8_delegate_matches_reference(taichi_workers):
    """Random grids: zero divisors (IEEE here, then snapped: inf to the grid's end, NaN to the
    zero point) and POW of negative bases included."""
    check_op(binary_int8_cases(), workers=taichi_workers)


def test_add_n_delegate_matches_reference(taichi_workers):
    check_op(add_n_cases(), workers=taichi_workers)


# -- special values: one model, every op -----------------------------------------------------------
SPECIAL_X = np.array([-1.0, 0.0, -0.0, np.nan, np.inf, -np.inf, 2.0, 1e-30, 0.5, 1.5, 2.5, -2.5,
                      0.49999997, 8388609.0, -3.7, 100.0], np.float32)
SPECIAL_A = np.array([-2, -2, 0, 0, 0, np.nan, 1, -8, -0.0, 5, np.inf, 2, 1.0, 0.7, -1.0, 6.0,
                      7, -7, 3e38, 1e-38], np.float32)
SPECIAL_B = np.array([3, 0.5, -1, 0, 2, 0, np.nan, 1 / 3, -1, np.inf, 2, -np.inf, 0.1, 0.1, 0.1,
                      0.3, np.inf, -np.inf, 1e-30, 3e38], np.float32)


def _all_ops_model(n=SPECIAL_X.size, m=SPECIAL_A.size, q=None, qo=None):
    """x -> every unary op; (a, b) -> every binary op; ADD_N(x, x, x): one partition. With
    `q`, int8 inputs quantized so and outputs quantized `qo`."""
    dtype = np.float32 if q is None else np.int8
    b = ModelBuilder()
    g = b.subgraph()
    x = g.input("x", (n,), dtype, q)
    a, d = g.input("a", (m,), dtype, q), g.input("b", (m,), dtype, q)
    outs = []
    for op, approximate in UNARY_VARIANTS:
        y = g.tensor(f"{op}{'_tanh' if approximate else ''}", (n,), dtype, qo)
        g.op(op, [x], [y], **unary_options(op, approximate))
        outs.append(y)
    for op in BINARY:
        y = g.tensor(op, (m,), dtype, qo)
        g.op(op, [a, d], [y])
        outs.append(y)
    y = g.tensor("ADD_N", (n,), dtype, qo)
    g.op("ADD_N", [x, x, x], [y])
    g.output(*outs, y)
    return b.finish()


def test_special_values_delegate_matches_reference(taichi_workers):
    summaries = check_delegate(_all_ops_model(), taichi_workers, [SPECIAL_X, SPECIAL_A, SPECIAL_B])
    for summary in summaries.values():
        assert len(summary["partitions"]) == 1


def test_sin_cos_large_arguments_delegate_matches_reference(taichi_workers):
    """Each of the 2 pi reductions' ranges (ops/arith.py _REDUCTIONS): GPUs' native
    sin needs them; on these backends a wrong reduction would show against numpy."""
    rng = np.random.default_rng(9)
    x = np.concatenate([rng.uniform(-m, m, 256) for m in (10.0, 255.0, 16000.0, 2e6)])
    b = ModelBuilder()
    g = b.subgraph()
    xi = g.input("x", x.shape)
    outs = [g.tensor(op, x.shape) for op in ("SIN", "COS")]
    for op, y in zip(("SIN", "COS"), outs):
        g.op(op, [xi], [y])
    g.output(*outs)
    check_delegate(b.finish(), taichi_workers, [x.astype(np.float32)])


def test_int8_every_op_delegate_matches_reference(taichi_workers):
    """Every op on the whole int8 range once (the hypothesis tests draw one op per example)."""
    check_delegate(_all_ops_model(256, 256, (0.04, -3), (0.07, 5)), taichi_workers, seed=5)


def test_fp16_on_vulkan(vulkan_workers):
    rng = np.random.default_rng(3)
    x = rng.uniform(0.1, 3, 16).astype(np.float32)
    a, b = rng.uniform(0.2, 3, 20).astype(np.float32), rng.uniform(0.5, 2, 20).astype(np.float32)
    check_delegate(_all_ops_model(), vulkan_workers, [x, a, b], precision="fp16")


def test_gles(gles_worker):
    check_delegate(_all_ops_model(), [gles_worker], [SPECIAL_X, SPECIAL_A, SPECIAL_B])


# -- what stays on the CPU -------------------------------------------------------------------------
@pytest.mark.parametrize("op", ["FLOOR_DIV", "FLOOR_MOD", "POW"])
def test_int32_stays_on_the_cpu(taichi_workers, op):
    model = one_op_model(op, [Input((4,), np.int32), Const(np.array([3, -3, 2, 1], np.int32))],
                         [Output((4,), np.int32)])
    summaries = check_delegate(model, taichi_workers, [np.array([7, 7, -7, 0], np.int32)],
                               expect_all_delegated=False)
    for summary in summaries.values():
        assert summary["ops_delegated"] == 0
        assert "int32" in summary["fallback"][0]["reason"]


# -- ATAN2 -----------------------------------------------------------------------------------------
@st.composite
def atan2_float32_cases(draw):
    (a_shape, b_shape, out_shape), magnitude = draw(broadcast_pair()), draw(
        st.sampled_from([1e-3, 1.0, 1e4]))
    const_rhs = draw(st.booleans())
    rng = np.random.default_rng(draw(S.seeds()))
    y, x = atan2_data(rng, a_shape, magnitude), atan2_data(rng, b_shape, magnitude)
    model = one_op_model("ATAN2", [Input(a_shape), Const(x) if const_rhs else Input(b_shape)],
                         [Output(out_shape)])
    return model, [y] + ([] if const_rhs else [x])


def test_atan2_float32_delegate_matches_reference(taichi_workers):
    check_op(atan2_float32_cases(), workers=taichi_workers)


def test_atan2_int8_delegate_matches_reference(taichi_workers):
    check_op(binary_int8_cases("ATAN2"), workers=taichi_workers)


def _atan2_special_model(n):
    """ATAN2 of (y, x), and of (y + x, x): an ADD whose store hands the sum to the second
    ATAN2 (epilogue fusion), all in one partition."""
    b = ModelBuilder()
    g = b.subgraph()
    y, x = g.input("y", (n,)), g.input("x", (n,))
    direct, total, of_sum = (g.tensor(name, (n,)) for name in ("atan2", "sum", "of_sum"))
    g.op("ATAN2", [y, x], [direct])
    g.op("ADD", [y, x], [total])
    g.op("ATAN2", [total, x], [of_sum])
    g.output(direct, of_sum)
    return b.finish()


def _special_pairs():
    y, x = np.meshgrid(ATAN2_SPECIALS, ATAN2_SPECIALS)
    return [y.reshape(-1), x.reshape(-1)]


def test_atan2_special_values_delegate_matches_reference(taichi_workers):
    inputs = _special_pairs()
    summaries = check_delegate(_atan2_special_model(inputs[0].size), taichi_workers, inputs)
    for backend, summary in summaries.items():
        (partition,) = summary["partitions"]
        assert [1, 2] in partition["fused"], (backend, partition)
    # the signs of zeros, which the float comparison does not see (NaN's sign means nothing)
    expected = np.arctan2(*inputs)
    numbers = ~np.isnan(expected)
    for w in taichi_workers:
        outputs, _ = w.run(_atan2_special_model(inputs[0].size), inputs)
        np.testing.assert_array_equal(np.signbit(outputs[0][numbers]),
                                      np.signbit(expected[numbers]), err_msg=w.backend)


def test_atan2_gles(gles_worker):
    inputs = _special_pairs()
    check_delegate(_atan2_special_model(inputs[0].size), [gles_worker], inputs)


def test_atan2_fp16_on_vulkan(vulkan_workers):
    rng = np.random.default_rng(4)
    inputs = [atan2_data(rng, (100,), 3.0), atan2_data(rng, (100,), 3.0)]
    check_delegate(_atan2_special_model(100), vulkan_workers, inputs, precision="fp16")


@pytest.mark.parametrize("dtype", [np.int32, np.int8, np.uint16])
def test_right_shift_stays_on_the_cpu(taichi_workers, dtype):
    model = one_op_model("RIGHT_SHIFT", [Input((4,), dtype), Const(np.array([1, 2, 3, 9], dtype))],
                         [Output((4,), dtype)])
    summaries = check_delegate(model, taichi_workers, [np.array([7, 100, 64, 3], dtype)],
                               expect_all_delegated=False)
    for summary in summaries.values():
        assert summary["ops_delegated"] == 0
        assert np.dtype(dtype).name in summary["fallback"][0]["reason"]
