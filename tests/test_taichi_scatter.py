"""EMBEDDING_LOOKUP, SCATTER_ND, SEGMENT_SUM, UNSORTED_SEGMENT_SUM on the delegate (cpu, vulkan,
opengl workers; fp16 on vulkan) vs the reference path, and the embedding text classifier of
tests/test_ops_scatter.py, float, hybrid and int8, wholly delegated.

Run-time int32 ids and indices enter the delegate as exact float32 (OpDef.index_inputs): the
host checks their range before it writes them, so an out-of-range id on the delegate raises the
reference path's InputError. Constant ones are compiled into the kernel. Every op is a gather
that sums in the reference's order: TAICHI_RTOL (fp32) holds, duplicates included."""
import numpy as np
import pytest
from hypothesis import assume, strategies as st

from tflite_taichi.testing import check_delegate, check_op, strategies
from cases.scatter import (I32, _scatter_data, embedding_case, embedding_model, scatter_case,
                           scatter_model, segment_sum_model, sorted_segment_ids, text_classifier,
                           token_ids, unsorted_case, unsorted_model)

S = strategies()


def _rng(seed):
    return np.random.default_rng(seed)


@st.composite
def embedding_delegate_matches_reference_cases(draw):
    case = draw(embedding_case())
    kind = draw(st.sampled_from(["float", "per_row_int8", "int8_out",
                                                     "runtime_table"]))
    seed = draw(S.seeds())
    n, shape = case
    rng = _rng(seed)
    ids = rng.integers(0, shape[0], n).astype(I32)
    table = rng.uniform(-3, 3, shape).astype(np.float32)
    codes = rng.integers(-128, 128, shape).astype(np.int8)
    if kind == "float":
        model, inputs = embedding_model(n, shape, table), [ids]
    elif kind == "per_row_int8":
        scales = rng.uniform(0.01, 0.5, shape[0]).astype(np.float32)
        model = embedding_model(n, shape, codes, table_q=(scales, np.zeros(shape[0], np.int64), 0))
        inputs = [ids]
    elif kind == "int8_out":
        q = (0.05, 7)
        model = embedding_model(n, shape, codes, table_q=q, out_dtype=np.int8, out_q=q)
        inputs = [ids]
    else:
        model, inputs = embedding_model(n, shape, ids=ids), [table]
    return model, inputs


def test_embedding_delegate_matches_reference(taichi_workers):
    """Run-time ids into a constant table (float32; int8 with a scale per row read into float;
    int8 into int8), or constant ids into a run-time table."""
    check_op(embedding_delegate_matches_reference_cases(), workers=taichi_workers)


@st.composite
def scatter_nd_delegate_matches_reference_cases(draw):
    case = draw(scatter_case())
    const_indices = draw(st.booleans())
    int8 = draw(st.booleans())
    seed = draw(S.seeds())
    shape, outer, m = case
    rng = _rng(seed)
    indices, updates = _scatter_data(rng, shape, outer, m)
    q = (0.05, -3) if int8 else None
    if int8:
        updates = rng.integers(-128, 128, updates.shape).astype(np.int8)
    model = scatter_model(shape, outer, m, np.int8 if int8 else np.float32, q,
                          indices=indices if const_indices else None)
    return model, ([] if const_indices else [indices]) + [updates]


def test_scatter_nd_delegate_matches_reference(taichi_workers):
    """Duplicate rows add in row order on both paths; int8: the float view on both."""
    check_op(scatter_nd_delegate_matches_reference_cases(), workers=taichi_workers)


@st.composite
def segment_sum_delegate_matches_reference_cases(draw):
    ids = draw(sorted_segment_ids())
    inner = draw(S.shapes(0, 2, 1, 4))
    seed = draw(S.seeds())
    shape = (ids.size,) + tuple(inner)
    data = _rng(seed).uniform(-3, 3, shape).astype(np.float32)
    return segment_sum_model(shape, ids, rows=int(ids[-1]) + 1), [data]


def test_segment_sum_delegate_matches_reference(taichi_workers):
    """Constant ids (run-time ones make the shape data-dependent: CPU, see below)."""
    check_op(segment_sum_delegate_matches_reference_cases(), workers=taichi_workers)


@st.composite
def unsorted_segment_sum_delegate_matches_reference_cases(draw):
    case = draw(unsorted_case())
    const_ids = draw(st.booleans())
    seed = draw(S.seeds())
    shape, ids_rank, n = case
    rng = _rng(seed)
    ids = rng.integers(-2, n, shape[:ids_rank]).astype(I32)
    data = rng.uniform(-3, 3, shape).astype(np.float32)
    assume(int(np.prod(shape[ids_rank:])) * n > 0)
    model = unsorted_model(shape, ids.shape, n, ids=ids if const_ids else None)
    return model, [data] + ([] if const_ids else [ids])


def test_unsorted_segment_sum_delegate_matches_reference(taichi_workers):
    check_op(unsorted_segment_sum_delegate_matches_reference_cases(), workers=taichi_workers)


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


def test_segment_sum_with_run_time_ids_stays_on_the_cpu(taichi_workers):
    model = segment_sum_model((3, 2))
    summaries = check_delegate(model, taichi_workers[:1],
                               [np.ones((3, 2), np.float32), np.array([0, 0, 1], I32)],
                               expect_all_delegated=False)
    (summary,) = summaries.values()
    assert summary["ops_delegated"] == 0
    assert "data-dependent" in summary["fallback"][0]["reason"]


@pytest.mark.parametrize("model, inputs, reason", [
    # 8192 cells x 8193 index rows: more loads than WORK_LIMIT for the gather
    (scatter_model((8192,), (8193,), 1), [np.zeros((8193, 1), I32), np.ones(8193, np.float32)],
     "loads"),
    # constant indices whose offsets form more than MAX_RUNS arithmetic runs
    (scatter_model((301,), (200,), 1, indices=(np.arange(200) ** 2 % 301).reshape(200, 1)),
     [np.ones(200, np.float32)], "arithmetic runs"),
    # int32 updates: the delegate carries no int32 results
    (scatter_model((4,), (2,), 1, np.int32), [np.zeros((2, 1), I32), np.ones(2, I32)], "int32"),
])
def test_what_the_delegate_refuses(taichi_workers, model, inputs, reason):
    summaries = check_delegate(model, taichi_workers[:1], inputs, expect_all_delegated=False)
    (summary,) = summaries.values()
    assert summary["ops_delegated"] == 0
    assert reason in summary["fallback"][0]["reason"]
