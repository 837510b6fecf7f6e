"""Layout ops (ops/layout.py) on the delegate (cpu, vulkan, opengl workers; fp16 on vulkan; gles)
vs the reference path: TILE, BROADCAST_TO, REVERSE_V2, MIRROR_PAD, SPACE_TO_BATCH_ND,
BATCH_TO_SPACE_ND, FILL (a run-time value; a constant one is folded), ZEROS_LIKE. float32, int8
(the output with its own scale and zero point: the delegate's store must snap the moved float
view onto the output's grid as the reference's fake-quant does) and bool (carried as 0/1). The
attribute space is the LiteRT tests' (test_ops_layout.py), with the block ops at any rank and
REVERSE_V2 with any axes. RANGE is always folded at prepare and has no Taichi part.
MATRIX_DIAG, MATRIX_SET_DIAG and REVERSE_SEQUENCE (constant seq_lengths; run-time ones stay on
the CPU), in the same three types. One case table (LAYOUT_ROWS, tests/cases/layout.py: a row per
op, each drawing its type) drives one property test; chains, fusion, fp16 and GLES have their
own tests; what stays on the CPU is a table too (REFUSED: cases.table.Refused), one test.
Tolerances: tflite_taichi.testing.TAICHI_RTOL."""
import numpy as np
import pytest

from tflite_taichi.builder import ModelBuilder
from tflite_taichi.testing import Input, Output, check_delegate, check_op, one_op_model
from cases.layout import LAYOUT_ROWS
from cases.table import Refused, check_refused, refused_id, row_id


@pytest.mark.parametrize("row", LAYOUT_ROWS, ids=row_id)
def test_op_on_the_delegate(taichi_workers, row):
    check_op(row.cases, workers=taichi_workers)


# -- every op in one partition; fp16; GLES ----------------------------------------------------
def _chain_model(quantized: bool = False):
    """x (1, 4, 6, 2) -> MIRROR_PAD (REFLECT) -> SPACE_TO_BATCH_ND -> REVERSE_V2 ->
    BATCH_TO_SPACE_ND (with crops) -> TILE -> BROADCAST_TO (an output); ZEROS_LIKE of the tile
    (an output); FILL of a run-time scalar (an output); MIRROR_PAD (SYMMETRIC) of the fill."""
    q = (0.05, -3) if quantized else None
    t = np.int8 if quantized else np.float32
    b = ModelBuilder()
    g = b.subgraph()

    def tensor(name, shape):
        return g.tensor(name, shape, t, q)

    x = g.input("x", (1, 4, 6, 2), t, q)
    v = g.input("v", (), t, q)
    padded = tensor("padded", (1, 6, 9, 2))
    g.op("MIRROR_PAD", [x, g.const("pads", np.array([[0, 0], [1, 1], [2, 1], [0, 0]], np.int32))],
         [padded], mode="REFLECT")
    batched = tensor("batched", (6, 3, 3, 2))
    g.op("SPACE_TO_BATCH_ND", [padded, g.const("block", np.array([2, 3], np.int32)),
                               g.const("zero_pads", np.zeros((2, 2), np.int32))], [batched])
    flipped = tensor("flipped", (6, 3, 3, 2))
    g.op("REVERSE_V2", [batched, g.const("axes", np.array([2, 1], np.int32))], [flipped])
    spaced = tensor("spaced", (1, 8, 4, 2))
    g.op("BATCH_TO_SPACE_ND", [flipped, g.const("block2", np.array([3, 2], np.int32)),
                               g.const("crops", np.array([[1, 0], [0, 2]], np.int32))], [spaced])
    tiled = tensor("tiled", (2, 8, 4, 4))
    g.op("TILE", [spaced, g.const("multiples", np.array([2, 1, 1, 2], np.int32))], [tiled])
    wide = tensor("wide", (3, 2, 8, 4, 4))
    g.op("BROADCAST_TO", [tiled, g.const("target", np.array([3, 2, 8, 4, 4], np.int32))], [wide],
         version=2)
    zeros = tensor("zeros", (2, 8, 4, 4))
    g.op("ZEROS_LIKE", [tiled], [zeros])
    filled = tensor("filled", (2, 3))
    g.op("FILL", [g.const("dims", np.array([2, 3], np.int32)), v], [filled])
    mirrored = tensor("mirrored", (4, 6))
    g.op("MIRROR_PAD", [filled, g.const("pads2", np.array([[1, 1], [2, 1]], np.int32))],
         [mirrored], mode="SYMMETRIC")
    g.output(wide, zeros, mirrored)
    return b.finish()


@pytest.mark.parametrize("quantized", [False, True])
def test_a_chain_of_ops_in_one_partition(taichi_workers, quantized):
    summaries = check_delegate(_chain_model(quantized), taichi_workers)
    for summary in summaries.values():
        assert summary["ops_delegated"] == summary["ops_total"] == 9


def test_fp16_on_vulkan(vulkan_workers):
    check_delegate(_chain_model(), vulkan_workers, precision="fp16")


def test_gles(gles_worker):
    check_delegate(_chain_model(), [gles_worker])


# -- what stays on the CPU --------------------------------------------------------------------
def _int32_fill_and_zeros_like_and_a_range():
    """The ops have no refusals of their own (every attribute is read at build time): an int32
    FILL value, ZEROS_LIKE of an int32 tensor and the like are refused by
    partition.delegate_reason; a RANGE (and a FILL of constants) is folded at prepare."""
    b = ModelBuilder()
    g = b.subgraph()
    n = g.input("n", (), np.int32)
    filled = g.tensor("filled", (2, 3), np.int32)
    g.op("FILL", [g.const("dims", np.array([2, 3], np.int32)), n], [filled])
    zeros = g.tensor("zeros", (2, 3), np.int32)
    g.op("ZEROS_LIKE", [filled], [zeros])
    ramp = g.tensor("ramp", (4,))
    g.op("RANGE", [g.const(k, np.array(v, np.float32)) for k, v in
                   [("start", 0.5), ("limit", 2.5), ("delta", 0.5)]], [ramp])
    g.output(zeros, ramp)
    return b.finish()


REFUSED = [
    Refused("int32 FILL and ZEROS_LIKE with a folded RANGE",
            _int32_fill_and_zeros_like_and_a_range(),
            ("FILL", "ZEROS_LIKE"), "int32", [np.array(7, np.int32)], folded=1),
    Refused("REVERSE_SEQUENCE with run-time lengths",
            one_op_model("REVERSE_SEQUENCE", [Input((2, 4)), Input((2,), np.int32)],
                         [Output((2, 4))], seq_dim=1, batch_dim=0),
            "REVERSE_SEQUENCE", "int32",
            [np.arange(8, dtype=np.float32).reshape(2, 4), np.array([3, 1], np.int32)]),
]


@pytest.mark.parametrize("case", REFUSED, ids=refused_id)
def test_what_stays_on_the_cpu(taichi_workers, case):
    check_refused(case, taichi_workers)


def _diag_sequence_model():
    """MATRIX_DIAG, MATRIX_SET_DIAG and REVERSE_SEQUENCE (seq_dim 2 before batch_dim 3, lengths
    0 to the full 5), each feeding an ABS through its store (epilogue fusion)."""
    b = ModelBuilder()
    g = b.subgraph()
    d, m = g.input("d", (2, 4)), g.input("m", (2, 3, 4))
    x = g.input("x", (2, 1, 5, 6))
    outs = []
    for i, (op, ins, shape, options) in enumerate([
            ("MATRIX_DIAG", [d], (2, 4, 4), {}),
            ("MATRIX_SET_DIAG", [m, g.const("diag", np.arange(6, dtype=np.float32).reshape(2, 3))],
             (2, 3, 4), {}),
            ("REVERSE_SEQUENCE", [x, g.const("lengths", np.array([0, 5, 2, 1, 3, 5], np.int32))],
             (2, 1, 5, 6), {"seq_dim": 2, "batch_dim": 3})]):
        y, z = g.tensor(f"{op}", shape), g.tensor(f"abs{i}", shape)
        g.op(op, ins, [y], **options)
        g.op("ABS", [y], [z])
        outs.append(z)
    g.output(*outs)
    return b.finish()


def test_diag_and_reverse_sequence_fuse_into_their_readers(taichi_workers):
    summaries = check_delegate(_diag_sequence_model(), taichi_workers, seed=4)
    for backend, summary in summaries.items():
        (partition,) = summary["partitions"]
        assert partition["fused"] == [[0, 1], [2, 3], [4, 5]], (backend, partition)


def test_diag_and_reverse_sequence_fp16_on_vulkan(vulkan_workers):
    check_delegate(_diag_sequence_model(), vulkan_workers, seed=5, precision="fp16")


def test_diag_and_reverse_sequence_gles(gles_worker):
    check_delegate(_diag_sequence_model(), [gles_worker], seed=6)


def test_reverse_sequence_supports_names_its_reasons():
    # run-time lengths (the partitioner's int32 rule answers first) and too many runs
    from tflite_taichi.ops.base import Node, TensorSpec, lookup
    from tflite_taichi.ops.tables import MAX_RUNS
    from tflite_taichi.ops.layout import ReverseSequenceOptions

    def node(lengths_value, n):
        return Node(0, "REVERSE_SEQUENCE", 1, ReverseSequenceOptions(1, 0),
                    (TensorSpec(0, "x", (n, 4), np.dtype(np.float32)),
                     TensorSpec(1, "lengths", (n,), np.dtype(np.int32), value=lengths_value)),
                    (TensorSpec(2, "y", (n, 4), np.dtype(np.float32)),))
    supports = lookup("REVERSE_SEQUENCE").supports
    assert "run time" in supports(node(None, 2))
    zigzag = np.tile(np.array([0, 4], np.int32), MAX_RUNS + 1)
    assert "arithmetic runs" in supports(node(zigzag, zigzag.size))
    assert supports(node(np.array([4, 3, 2, 1], np.int32), 4)) is None
