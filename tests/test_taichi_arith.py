"""Math ops (ops/arith.py) on the delegate (cpu, vulkan, opengl workers; fp16 on vulkan; gles) vs
the reference path. Tolerances: tflite_taichi.testing.TAICHI_RTOL; a quantized output within 1
unit.

One case table (ARITH_ROWS, tests/cases/arith.py) drives one property test; each row draws the
op inside each example, so that every op is covered without a test (and its compiles) per op.
The attribute space is the LiteRT tests' (test_ops_arith.py: the same data generators).
int8 runs every op, LiteRT's int8 kernels or not: on the float view each is the float formula
with the output snapped to its grid. Special values (NaN, +-inf, zeros, negatives under LOG and
SQRT, ROUND's ties, FLOOR_DIV's near-integer quotients) go through one multi-op model: one
compile per backend. ATAN2 (its own polynomial and special-value branches) has its rows in the
table and its own tests: every special pair, fused into its producer's store. RIGHT_SHIFT has
no Taichi part (integers stay on the CPU): what stays there is a table (REFUSED:
cases.table.Refused), one test at the end."""
import numpy as np
import pytest

from tflite_taichi.builder import ModelBuilder
from tflite_taichi.testing import Const, Input, Output, check_delegate, check_op, one_op_model
from cases.arith import (ARITH_ROWS, ATAN2_SPECIALS, BINARY, UNARY_VARIANTS, atan2_data,
                         unary_options)
from cases.table import Refused, check_refused, refused_id, row_id


@pytest.mark.parametrize("row", ARITH_ROWS, ids=row_id)
def test_ops_on_the_delegate(taichi_workers, row):
    check_op(row.cases, workers=taichi_workers)


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


# -- ATAN2 -----------------------------------------------------------------------------------------
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


# -- what stays on the CPU -------------------------------------------------------------------------
def _integer_model(op, dtype, second):
    return one_op_model(op, [Input((4,), dtype), Const(np.array(second, dtype))],
                        [Output((4,), dtype)])


REFUSED = [
    Refused(f"int32 {op}", _integer_model(op, np.int32, [3, -3, 2, 1]), op, "int32",
            [np.array([7, 7, -7, 0], np.int32)])
    for op in ("FLOOR_DIV", "FLOOR_MOD", "POW")
] + [
    Refused(f"{name} RIGHT_SHIFT", _integer_model("RIGHT_SHIFT", np.dtype(name), [1, 2, 3, 9]),
            "RIGHT_SHIFT", name, [np.array([7, 100, 64, 3], name)])
    for name in ("int32", "int8", "uint16")
]


@pytest.mark.parametrize("case", REFUSED, ids=refused_id)
def test_what_stays_on_the_cpu(taichi_workers, case):
    check_refused(case, taichi_workers)
