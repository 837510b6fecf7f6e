"""Activation ops (ops/activations.py) and QUANTIZE / DEQUANTIZE (ops/quantize.py) on the
delegate (cpu, vulkan, opengl workers; fp16 on vulkan; gles) vs the reference path, through
one-op models (and one QUANTIZE -> op -> DEQUANTIZE chain). Tolerances:
tflite_taichi.testing.TAICHI_RTOL; a quantized output within 1 unit.

One case table (ACTIVATION_ROWS, tests/cases/activations.py: a row per op and dtype) drives one
property test. The attribute space is the LiteRT tests' (test_ops_activations.py,
test_ops_quantize.py), with LiteRT's int8 constraints relaxed where only LiteRT needs them (any
output quantization for LOGISTIC, SOFTMAX, HARD_SWISH here), and input magnitudes that reach
LOGISTIC's cut-offs and TANH's saturation. A quantized model input is dequantized on the CPU,
so QUANTIZE of a float input, int8 -> int8 requantization and DEQUANTIZE of an int8 input all
run inside the partition, as a snap to the output's grid or an identity. Cut-off regions, long
rows, broadcast alphas, chains, fp16 (a fixed model per op: SMALL) and GLES have their own
tests; what stays on the CPU is a table too (REFUSED: cases.table.Refused), one test."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from tflite_taichi.builder import ModelBuilder
from tflite_taichi.testing import (TAICHI_EXAMPLES, Const, Input, Output, check_delegate, check_op,
                                   one_op_model, quantize_array, strategies)
from cases.activations import ACTIVATION_ROWS, uniform_data as _data
from cases.quantize import _real_range
from cases.table import Refused, check_refused, refused_id, row_id

S = strategies()


@pytest.mark.parametrize("row", ACTIVATION_ROWS, ids=row_id)
def test_op_on_the_delegate(taichi_workers, row):
    check_op(row.cases, workers=taichi_workers)


def test_logistic_cut_off_regions_delegate_matches_reference(taichi_workers):
    """Every input below -9 (exp(x) there, as LiteRT) or above 16.6 (exactly 1): the outputs'
    own magnitude sets the tolerance, so a formula switched at the wrong place would show."""
    model = one_op_model("LOGISTIC", [Input((2, 16))], [Output((2, 16))])
    below = -np.geomspace(9.0001, 80.0, 32, dtype=np.float32).reshape(2, 16)
    above = np.geomspace(16.62, 90.0, 32, dtype=np.float32).reshape(2, 16)
    check_delegate(model, taichi_workers, [below])
    check_delegate(model, taichi_workers, [above])


# -- SOFTMAX ---------------------------------------------------------------------------------------
def test_softmax_long_rows_delegate_matches_reference(taichi_workers):
    """One thread per row: a classifier-like 2 x 1001 row and many short rows."""
    rng = np.random.default_rng(5)
    for shape in [(2, 1001), (257, 3)]:
        model = one_op_model("SOFTMAX", [Input(shape)], [Output(shape)], beta=1.0)
        check_delegate(model, taichi_workers, [_data(rng, shape, 8.0)])


# -- PRELU -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("alpha_shape", [(3, 1), (2, 1, 4), (1, 3, 1), (4,), ()])
def test_prelu_broadcast_alpha_delegate_matches_reference(taichi_workers, alpha_shape):
    """alpha with size-1 dims inside (repeated along them) or a scalar alpha."""
    rng = np.random.default_rng(len(alpha_shape))
    alpha = rng.uniform(-1, 2, alpha_shape).astype(np.float32)
    for alpha_in in (Const(alpha), Input(alpha_shape)):
        model = one_op_model("PRELU", [Input((2, 3, 4)), alpha_in], [Output((2, 3, 4))])
        inputs = [_data(rng, (2, 3, 4), 3.0)] + ([alpha] if isinstance(alpha_in, Input) else [])
        check_delegate(model, taichi_workers, inputs)


# -- QUANTIZE / DEQUANTIZE -------------------------------------------------------------------------
def _chain_model(op, shape, q8, q_mid, **options):
    """float -> QUANTIZE (int8) -> op (int8) -> DEQUANTIZE -> float: a quantized model's
    boundary ops around one int8 op, all in one partition (quantized tensors in the arena)."""
    b = ModelBuilder()
    g = b.subgraph()
    x = g.input("x", shape)
    xq = g.tensor("x_q", shape, np.int8, q8)
    yq = g.tensor("y_q", shape, np.int8, q_mid)
    y = g.tensor("y", shape)
    g.op("QUANTIZE", [x], [xq])
    g.op(op, [xq], [yq], **options)
    g.op("DEQUANTIZE", [yq], [y])
    g.output(y)
    return b.finish()


@settings(max_examples=TAICHI_EXAMPLES)
@given(op=st.sampled_from(["SOFTMAX", "LOGISTIC", "TANH", "HARD_SWISH", "RELU6"]),
       shape=S.shapes(1, 4), q8=S.quant_params(), qo=S.quant_params(), seed=S.seeds())
def test_quantize_op_dequantize_chain_delegate_matches_reference(taichi_workers, op, shape, q8,
                                                                 qo, seed):
    rng = np.random.default_rng(seed)
    lo, hi = _real_range(np.int8, q8)
    options = {"beta": 1.0} if op == "SOFTMAX" else {}
    model = _chain_model(op, shape, q8, qo, **options)
    summaries = check_delegate(model, taichi_workers,
                               [rng.uniform(lo, hi, shape).astype(np.float32)])
    for summary in summaries.values():
        assert [p["ops"] for p in summary["partitions"]] == [[0, 1, 2]]


def test_dequantize_of_a_constant_is_folded_not_delegated(taichi_workers):
    """An int8 weight behind DEQUANTIZE feeding PRELU: folded at prepare; PRELU delegated."""
    rng = np.random.default_rng(3)
    q = (0.02, -5)
    b = ModelBuilder()
    g = b.subgraph()
    x = g.input("x", (2, 3, 4))
    w = g.const("alpha_q", quantize_array(rng.uniform(-1, 1, (3, 4)), q), quantization=q)
    w32, y = g.tensor("alpha", (3, 4)), g.tensor("y", (2, 3, 4))
    g.op("DEQUANTIZE", [w], [w32])
    g.op("PRELU", [x, w32], [y])
    g.output(y)
    summaries = check_delegate(b.finish(), taichi_workers, [_data(rng, (2, 3, 4), 3.0)])
    for summary in summaries.values():
        assert summary["folded"] == [{"index": 0, "op": "DEQUANTIZE"}]
        assert summary["partitions"][0]["ops"] == [1]


# -- fp16 (vulkan), GLES ---------------------------------------------------------------------------
def _small_models():
    """A fixed one-op model per op, for the fp16 and GLES runs."""
    shape = (2, 5, 6)

    def plain(op):
        return one_op_model(op, [Input(shape)], [Output(shape)])

    alpha = np.linspace(-1, 1, 6, dtype=np.float32)
    return {
        "SOFTMAX": one_op_model("SOFTMAX", [Input((3, 17))], [Output((3, 17))], beta=0.7),
        "LOGISTIC": plain("LOGISTIC"),
        "TANH": plain("TANH"),
        "EXP": plain("EXP"),
        "HARD_SWISH": plain("HARD_SWISH"),
        "LEAKY_RELU": one_op_model("LEAKY_RELU", [Input(shape)], [Output(shape)], alpha=0.2),
        "PRELU": one_op_model("PRELU", [Input(shape), Const(alpha)], [Output(shape)]),
        "QUANTIZE": one_op_model("QUANTIZE", [Input(shape)], [Output(shape, np.int8, (0.03, 4))]),
        "DEQUANTIZE": one_op_model("DEQUANTIZE", [Input(shape, np.float16)], [Output(shape)]),
    }


SMALL = _small_models()


@pytest.mark.parametrize("op", list(SMALL))
def test_fp16_on_vulkan(vulkan_workers, op):
    check_delegate(SMALL[op], vulkan_workers, seed=11, precision="fp16")


@pytest.mark.parametrize("op", ["SOFTMAX", "LOGISTIC", "PRELU", "QUANTIZE"])
def test_gles(gles_worker, op):
    check_delegate(SMALL[op], [gles_worker], seed=4)


def test_gles_int8_chain(gles_worker):
    model = _chain_model("TANH", (2, 9), (0.05, 3), (1 / 128, 0))
    check_delegate(model, [gles_worker], [np.linspace(-7, 7, 18, dtype=np.float32).reshape(2, 9)])


# -- what stays on the CPU -------------------------------------------------------------------------
REFUSED = [
    # the arena carries per-tensor grids only: a per-channel quantized run-time input is refused
    # by the generic check, with the reason
    Refused("per-channel DEQUANTIZE input",
            one_op_model("DEQUANTIZE", [Input((2, 3), np.int8, ([0.1, 0.2, 0.3], [0, 1, -1], 1))],
                         [Output((2, 3))]),
            "DEQUANTIZE", "per-channel", seed=2),
]


@pytest.mark.parametrize("case", REFUSED, ids=refused_id)
def test_what_stays_on_the_cpu(taichi_workers, case):
    check_refused(case, taichi_workers)


# -- fusion ------------------------------------------------------------------------------------
@pytest.mark.parametrize("producer", ["L2_POOL_2D", "ADD"])
def test_relu_0_to_1_runs_in_its_producers_store(taichi_workers, producer):
    """RELU_0_TO_1 declares itself element-wise (stores_once, epilogue_inputs) as the other
    RELUs do: after a pool (or an ADD, quantized) it runs inside the producer's store, one
    step for both ops."""
    quantized = producer == "ADD"
    dtype, q = (np.int8, (0.01, -20)) if quantized else (np.float32, None)
    b = ModelBuilder()
    g = b.subgraph()
    x = g.input("x", (1, 5, 6, 3), dtype, q)
    shape = (1, 5, 6, 3) if quantized else (1, 3, 3, 3)
    t = g.tensor("t", shape, dtype, (0.008, -100) if quantized else None)
    if quantized:
        g.op("ADD", [x, g.const("k", np.full((3,), 40, np.int8), quantization=q)], [t])
    else:
        g.op("L2_POOL_2D", [x], [t], padding="SAME", filter_height=3, filter_width=2,
             stride_h=2, stride_w=2)
    y = g.tensor("y", shape, dtype, (1 / 250, -128) if quantized else None)
    g.op("RELU_0_TO_1", [t], [y])
    g.output(y)
    # inputs near 0..1, so the clamp cuts some of the outputs and leaves others
    rng = np.random.default_rng(1)
    inputs = None if quantized else [rng.uniform(-1.2, 1.2, (1, 5, 6, 3)).astype(np.float32)]
    for backend, s in check_delegate(b.finish(), taichi_workers, inputs, seed=3).items():
        [p] = s["partitions"]
        assert p["fused"] == [[0, 1]] or p["computed_at_load"] == [[0, 1]], (backend, p)
        assert s["runtime"]["steps_per_invoke"] == 1, (backend, s["runtime"])
