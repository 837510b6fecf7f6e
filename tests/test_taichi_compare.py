"""Comparisons, LOGICAL_OR/NOT, SELECT/SELECT_V2 and CAST on the delegate (cpu, vulkan, opengl
workers; fp16 on vulkan; gles) vs the reference path, over the LiteRT tests' case space. Bool
outputs must match exactly (LiteRT's fixed-point rescaling of quantized comparisons included);
float outputs within tflite_taichi.testing.TAICHI_RTOL. One case table (COMPARE_ROWS,
tests/cases/compare.py: each row draws its ops inside each example) drives one property test;
every int8 pair, int16 extremes, single elements, float16 rounding, a chain, fp16 and GLES have
their own tests; what stays on the CPU is a table too (REFUSED: cases.table.Refused), one test."""
import numpy as np
import pytest

from tflite_taichi.builder import ModelBuilder
from tflite_taichi.testing import Input, Output, check_delegate, check_op, one_op_model
from cases.compare import COMPARE_ROWS, SWEEP_SCALES, every_pair, select_model
from cases.table import Refused, check_refused, refused_id, row_id


@pytest.mark.parametrize("row", COMPARE_ROWS, ids=row_id)
def test_ops_on_the_delegate(taichi_workers, row):
    check_op(row.cases, workers=taichi_workers)


def _sweep_model(dtype, pairs, n):
    """EQUAL, LESS and GREATER_EQUAL of each pair of quantized inputs, all in one partition."""
    b = ModelBuilder()
    g = b.subgraph()
    outs = []
    for i, (qa, qb) in enumerate(pairs):
        x, y = g.input(f"x{i}", (n,), dtype, qa), g.input(f"y{i}", (n,), dtype, qb)
        for op in ("EQUAL", "LESS", "GREATER_EQUAL"):
            outs.append(g.tensor(f"{op.lower()}{i}", (n,), np.bool_))
            g.op(op, [x, y], [outs[-1]])
    g.output(*outs)
    return b.finish()


def test_every_int8_pair_delegate(taichi_workers):
    """The int32 rescaling (CompareKey) of every pair of stored values, at scales with and
    without merging, with rounding ties, one at or above 1."""
    scales = [SWEEP_SCALES[1], SWEEP_SCALES[3], SWEEP_SCALES[-1], ((1.5, 0), (0.02, 4))]
    check_delegate(_sweep_model(np.int8, scales, 65536), taichi_workers,
                   every_pair(np.int8) * len(scales))


def test_int16_extremes_delegate(taichi_workers):
    """|q - zp| up to 2^15 through the rescaling (EQUAL) and raw integers (LESS & co.)."""
    rng = np.random.default_rng(5)
    a = np.concatenate([[-32768, 32767, -32768, 32767, 0, 1], rng.integers(-32768, 32768, 250)])
    bb = np.concatenate([[-32768, 32767, 32767, -32767, 0, 0], a[6:] + rng.integers(-2, 3, 250)])
    a, bb = (np.clip(v, -32768, 32767).astype(np.int16) for v in (a, bb))
    check_delegate(_sweep_model(np.int16, [((0.0007, 0), (0.003, 0)), ((0.0002, 0), (0.0002, 0))],
                                256), taichi_workers, [a, bb, a, bb])


def test_select_of_single_elements_delegate(taichi_workers):
    """Every tensor one element: the output keeps its declared shape, ranks differ."""
    for op in ("SELECT", "SELECT_V2"):
        check_delegate(select_model(op, ((1, 1), (1,), (), (1, 1, 1))), taichi_workers, seed=2)


def test_cast_to_float16_rounds_inside_a_partition(taichi_workers):
    """float32 -> float16 -> float32: the float16 tensor lives in the (float32) arena, so the
    rounding is the step's own (round_to_f16), not the download's; must be exact."""
    rng = np.random.default_rng(3)
    x = np.concatenate([
        rng.choice([-1, 1], 400) * 10.0 ** rng.uniform(-9, 5, 400),
        [65504, 65519.99, 65520, -65520, 1e6, 2.0**-24, 2.0**-25, 3 * 2.0**-26, 2.0**-25 + 2.0**-40,
         1.5 * 2.0**-24, 2.5 * 2.0**-24, 6.1e-5, 2.0**-14, 2.0**-14 - 2.0**-30, 1 + 2.0**-11,
         1 + 3 * 2.0**-11, 2049, 2051, 0.0, -0.0, np.inf, -np.inf],
        # ties: exactly halfway between two float16 values
        (rng.integers(1024, 2048, 40) * 2 + 1) * 2.0 ** rng.integers(-25, 4, 40)]).astype(np.float32)
    b = ModelBuilder()
    g = b.subgraph()
    inp = g.input("x", x.shape)
    half, back = g.tensor("half", x.shape, np.float16), g.tensor("back", x.shape)
    g.op("CAST", [inp], [half])
    g.op("CAST", [half], [back])
    g.output(back)
    model = b.finish()
    expected = x.astype(np.float16).astype(np.float32)
    for w in taichi_workers:
        (got,), summary = w.run(model, [x])
        assert not summary["fallback"], summary["fallback"]
        np.testing.assert_array_equal(got, expected, err_msg=w.backend)


def _chain_model():
    """x (2, 3, 4), y (4,), flag (2, 1, 1) bool -> GREATER, LESS_EQUAL, LOGICAL_OR, LOGICAL_NOT,
    NOT_EQUAL of bools, SELECT_V2, CAST to float16 and back, CAST of bool to float, SELECT with
    a constant rank-1 condition: bools and float16 live in the arena."""
    b = ModelBuilder()
    g = b.subgraph()
    x, y, flag = g.input("x", (2, 3, 4)), g.input("y", (4,)), g.input("flag", (2, 1, 1), np.bool_)

    def op(name, inputs, shape=(2, 3, 4), dtype=np.bool_):
        out = g.tensor(f"{name.lower()}_{len(g.tensors)}", shape, dtype)
        g.op(name, inputs, [out])
        return out

    gt = op("GREATER", [x, g.const("half", np.array(0.5, np.float32))])
    le = op("LESS_EQUAL", [y, x])
    neither = op("LOGICAL_NOT", [op("LOGICAL_OR", [gt, le])])
    differ = op("NOT_EQUAL", [neither, flag])
    picked = op("SELECT_V2", [differ, x, y], dtype=np.float32)
    back = op("CAST", [op("CAST", [picked], dtype=np.float16)], dtype=np.float32)
    as_float = op("CAST", [differ], dtype=np.float32)
    rows = op("SELECT", [g.const("rows", np.array([True, False])), back, as_float],
              dtype=np.float32)
    g.output(rows, neither)
    return b.finish()


def test_chain_delegate(taichi_workers):
    summaries = check_delegate(_chain_model(), taichi_workers, seed=4)
    for summary in summaries.values():
        assert summary["ops_delegated"] == summary["ops_total"] == 10


def test_fp16_on_vulkan(vulkan_workers):
    check_delegate(_chain_model(), vulkan_workers, seed=5, precision="fp16")
    model = one_op_model("GREATER_EQUAL", [Input((3, 4), np.int8, (0.003, 2)),
                                           Input((4,), np.int8, (0.0041, -3))],
                         [Output((3, 4), np.bool_)])
    check_delegate(model, vulkan_workers, seed=6, precision="fp16")


def test_gles(gles_worker):
    check_delegate(_chain_model(), [gles_worker], seed=6)
    check_delegate(_sweep_model(np.int8, SWEEP_SCALES[-2:], 65536), [gles_worker],
                   every_pair(np.int8) * 2)


# -- what stays on the CPU ---------------------------------------------------------------------
def _comparison(op, n, dtype, q_a=None, q_b=None):
    return one_op_model(op, [Input((n,), dtype, q_a), Input((n,), dtype, q_b)],
                        [Output((n,), np.bool_)])


def _cast(n, in_dtype, out_dtype, q_in=None, q_out=None):
    return one_op_model("CAST", [Input((n,), in_dtype, q_in)], [Output((n,), out_dtype, q_out)])


REFUSED = [
    Refused("int32-quantized LESS",
            _comparison("LESS", 4, np.int32, (0.5, 3), (0.5, 3)), "LESS", "int32-quantized",
            [np.array([1, 2**30, -5, 7], np.int32), np.array([2, 2**30 + 1, -5, 6], np.int32)]),
    Refused("int32-quantized SELECT_V2",
            select_model("SELECT_V2", ((3,), (3,), (3,), (3,)), np.int32, (0.5, 0)),
            "SELECT_V2", "int32-quantized",
            [np.array([True, False, True]), np.array([1, 2**30, 3], np.int32),
             np.array([4, 5, 6], np.int32)]),
    Refused("CAST of quantized int8 to float", _cast(4, np.int8, np.float32, q_in=(0.5, 3)),
            "CAST", "raw integers", [np.array([-128, 0, 3, 127], np.int8)]),
    Refused("CAST of float to quantized int8", _cast(4, np.float32, np.int8, q_out=(0.5, 3)),
            "CAST", "raw integers", [np.array([-300, 0.4, 3.9, 127], np.float32)]),
    # not supports(): partition.delegate_reason refuses the int32 / plain int8 tensors
    Refused("int32 EQUAL", _comparison("EQUAL", 3, np.int32), "EQUAL", "int32",
            [np.array([1, 2, 3], np.int32)] * 2),
    Refused("CAST of float to plain int8", _cast(3, np.float32, np.int8), "CAST", "int8",
            [np.array([1.5, -2.5, 300], np.float32)]),
    Refused("int16 EQUAL with a zero point",
            _comparison("EQUAL", 3, np.int16, (0.001, 5), (0.002, 0)), "EQUAL",
            "nonzero zero point",
            [np.array([-32768, 5, 32767], np.int16), np.array([-16384, 0, 16383], np.int16)]),
]


@pytest.mark.parametrize("case", REFUSED, ids=refused_id)
def test_what_stays_on_the_cpu(taichi_workers, case):
    check_refused(case, taichi_workers)
