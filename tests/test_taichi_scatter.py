"""EMBEDDING_LOOKUP, SCATTER_ND, SEGMENT_SUM, UNSORTED_SEGMENT_SUM on the delegate (cpu, vulkan,
opengl workers; fp16 on vulkan) vs the reference path, and the embedding text classifier of
tests/test_ops_scatter.py, float, hybrid and int8, wholly delegated.

Run-time int32 ids and indices enter the delegate as exact float32 (OpDef.index_inputs): the
host checks their range before it writes them, so an out-of-range id on the delegate raises the
reference path's InputError. Constant ones are compiled into the kernel. Every op is a gather
that sums in the reference's order: TAICHI_RTOL (fp32) holds, duplicates included. One case
table (SCATTER_ROWS, tests/cases/scatter.py: a row per op) drives one property test; the text
classifier, fp16 and out-of-range ids have their own tests; what the delegate refuses is a table
too (REFUSED: cases.table.Refused), one test."""
import numpy as np
import pytest

from tflite_taichi.testing import check_delegate, check_op
from cases.scatter import (I32, SCATTER_ROWS, embedding_model, scatter_model, segment_sum_model,
                           text_classifier, token_ids, unsorted_model)
from cases.table import Refused, check_refused, refused_id, row_id


@pytest.mark.parametrize("row", SCATTER_ROWS, ids=row_id)
def test_op_on_the_delegate(taichi_workers, row):
    check_op(row.cases, workers=taichi_workers)


@pytest.mark.parametrize("kind", ["float", "hybrid", "int8"])
def test_text_classifier_on_the_delegate(taichi_workers, kind):
    """The token ids are the model's int32 input: the whole classifier is one partition."""
    summaries = check_delegate(text_classifier(kind), taichi_workers, [token_ids(1)])
    for summary in summaries.values():
        assert summary["ops_delegated"] == 4


def test_text_classifier_fp16(vulkan_workers):
    check_delegate(text_classifier("float"), vulkan_workers, [token_ids(2)], precision="fp16")


def test_out_of_range_ids_raise_on_the_delegate(taichi_workers):
    """The host's check before it writes the ids: the reference path's InputError, per backend."""
    model = embedding_model(3, (4, 2), np.ones((4, 2), np.float32))
    for w in taichi_workers:
        w.run(model, [np.array([0, 3, 1], I32)])       # in range: delegated, runs
        with pytest.raises(RuntimeError, match=r"InputError.*EMBEDDING_LOOKUP.*id 4 at \[1\]"):
            w.run(model, [np.array([0, 4, 1], I32)])
    model = scatter_model((3,), (2,), 1)
    with pytest.raises(RuntimeError, match=r"InputError.*SCATTER_ND.*index \(dimension 0\) -1"):
        taichi_workers[0].run(model, [np.array([[0], [-1]], I32), np.ones(2, np.float32)])
    model = unsorted_model((2,), (2,), 2)
    with pytest.raises(RuntimeError, match=r"InputError.*UNSORTED_SEGMENT_SUM.*segment id 2"):
        taichi_workers[0].run(model, [np.ones(2, np.float32), np.array([2, 0], I32)])


# -- what stays on the CPU (checked on the first worker only) --------------------------------
REFUSED = [
    Refused("SEGMENT_SUM with run-time ids", segment_sum_model((3, 2)), "SEGMENT_SUM",
            "data-dependent", [np.ones((3, 2), np.float32), np.array([0, 0, 1], I32)],
            one_worker=True),
    # 8192 cells x 8193 index rows: more loads than WORK_LIMIT for the gather
    Refused("SCATTER_ND with too many loads", scatter_model((8192,), (8193,), 1), "SCATTER_ND",
            "loads", [np.zeros((8193, 1), I32), np.ones(8193, np.float32)], one_worker=True),
    # constant indices whose offsets form more than MAX_RUNS arithmetic runs
    Refused("SCATTER_ND with too many runs",
            scatter_model((301,), (200,), 1, indices=(np.arange(200) ** 2 % 301).reshape(200, 1)),
            "SCATTER_ND", "arithmetic runs", [np.ones(200, np.float32)], one_worker=True),
    # int32 updates: the delegate carries no int32 results
    Refused("SCATTER_ND of int32 updates", scatter_model((4,), (2,), 1, np.int32), "SCATTER_ND",
            "int32", [np.zeros((2, 1), I32), np.ones(2, I32)], one_worker=True),
]


@pytest.mark.parametrize("case", REFUSED, ids=refused_id)
def test_what_stays_on_the_cpu(taichi_workers, case):
    check_refused(case, taichi_workers)
