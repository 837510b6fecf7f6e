"""EMBEDDING_LOOKUP, SCATTER_ND, SEGMENT_SUM, UNSORTED_SEGMENT_SUM vs LiteRT through one-op
models (ops/scatter.py), float32, int32 and 8-bit, ids given at run time or constant; the cases
where LiteRT is off (a uint8 hybrid table's codes >= 128, 8-bit SCATTER_ND's code arithmetic,
quantized segment sums LiteRT has no kernel for) held to the float view's numpy formula; error
cases; and an embedding + mean-pooling text classifier, float and int8, vs LiteRT.
SEGMENT_SUM: LiteRT 2.3 runs it only with its builtin resolver (no reference kernel)."""
import numpy as np
import pytest
from hypothesis import assume, given, strategies as st

from tflite_taichi.errors import InputError, ModelError, TfliteTaichiError
from tflite_taichi.testing import (Const, Input, Output, assert_quantized_close,
                                   check_against_litert, one_op_model, run_litert, run_ours)
from cases.scatter import CLASSES, I32, LOGITS_Q, S, _rng, _scatter_data, embedding_case, embedding_model, scatter_case, scatter_model, segment_sum_model, sorted_segment_ids, text_classifier, token_ids, unsorted_case, unsorted_model


@given(case=embedding_case(), const_table=st.booleans(), const_ids=st.booleans(),
       seed=S.seeds())
def test_embedding_float_matches_litert(case, const_table, const_ids, seed):
    n, shape = case
    assume(not (const_table and const_ids))          # all-constant: XNNPACK-free, but folded
    rng = _rng(seed)
    table = rng.uniform(-3, 3, shape).astype(np.float32)
    ids = rng.integers(0, shape[0], n).astype(I32)
    model = embedding_model(n, shape, table if const_table else None,
                            ids if const_ids else None)
    inputs = ([] if const_ids else [ids]) + ([] if const_table else [table])
    check_against_litert(model, inputs)


@given(case=embedding_case(), per_channel=st.booleans(), dtype=st.sampled_from([np.int8, np.uint8]),
       seed=S.seeds())
def test_embedding_hybrid_matches_litert(case, per_channel, dtype, seed):
    """A quantized table read into float32 (q * scale, zero point 0), one scale or one per row.
    uint8 codes below 128: LiteRT reads a uint8 table as int8 (see the next test)."""
    n, shape = case
    rng = _rng(seed)
    scales = np.exp(rng.uniform(np.log(1e-3), np.log(0.5), shape[0] if per_channel else 1))
    q = ((scales.astype(np.float32), np.zeros(shape[0], np.int64), 0) if per_channel
         else (float(np.float32(scales[0])), 0))
    lo, hi = (-128, 128) if dtype == np.int8 else (0, 128)
    codes = rng.integers(lo, hi, shape).astype(dtype)
    model = embedding_model(n, shape, codes, table_q=q)
    check_against_litert(model, [rng.integers(0, shape[0], n).astype(I32)])


def test_embedding_uint8_hybrid_codes_above_127_are_unsigned():
    """LiteRT reads a uint8 table as int8 (code 200 -> -56); here code 200 is 200 * scale."""
    codes = np.array([[0, 127, 128, 255], [200, 1, 2, 3]], np.uint8)
    model = embedding_model(3, codes.shape, codes, table_q=(0.5, 0))
    ids = np.array([1, 0, 1], I32)
    actual = run_ours(model, [ids])[0]
    np.testing.assert_array_equal(actual, codes[ids].astype(np.float32) * np.float32(0.5))
    assert run_litert(model, [ids])[0][0, 0] == -28.0        # LiteRT's int8 reading


@given(case=embedding_case(), dtype=st.sampled_from([np.int8, np.uint8]), seed=S.seeds(),
       data=st.data())
def test_embedding_8bit_output_matches_litert(case, dtype, seed, data):
    """An 8-bit table into an output of its type and quantization: LiteRT copies the codes."""
    n, shape = case
    rng = _rng(seed)
    q = data.draw(S.quant_params(dtype))
    info = np.iinfo(dtype)
    codes = rng.integers(info.min, int(info.max) + 1, shape).astype(dtype)
    model = embedding_model(n, shape, codes, table_q=q, out_dtype=dtype, out_q=q)
    check_against_litert(model, [rng.integers(0, shape[0], n).astype(I32)])


def test_embedding_8bit_output_with_its_own_grid_requantizes():
    """Where the output's quantization differs from the table's, LiteRT still copies codes;
    the float view snaps the real values to the output's grid."""
    table_q, out_q = (0.5, 3), (0.25, -10)
    codes = np.array([[-128, 0, 3], [50, 127, -3]], np.int8)
    model = embedding_model(2, codes.shape, codes, table_q=table_q, out_dtype=np.int8, out_q=out_q)
    ids = np.array([1, 0], I32)
    real = (codes[ids].astype(np.float32) - 3) * np.float32(0.5)
    expected = np.clip(np.round(real / 0.25) - 10, -128, 127).astype(np.int8)
    np.testing.assert_array_equal(run_ours(model, [ids])[0], expected)


def test_embedding_id_out_of_range_at_invoke_names_the_op_and_id():
    model = embedding_model(3, (4, 2), np.ones((4, 2), np.float32))
    for bad in (4, -1):
        with pytest.raises(InputError, match=rf"EMBEDDING_LOOKUP.*id {bad} at \[1\]"):
            run_ours(model, [np.array([0, bad, 1], I32)])


def test_embedding_constant_id_out_of_range_is_a_model_error():
    model = embedding_model(2, (4, 2), ids=[1, 9])
    with pytest.raises(ModelError, match=r"EMBEDDING_LOOKUP.*id 9"):
        run_ours(model, [np.ones((4, 2), np.float32)])


@pytest.mark.parametrize("model, match", [
    (one_op_model("EMBEDDING_LOOKUP", [Input((2, 1), I32), Const(np.ones((3, 2), np.float32))],
                  [Output((2, 1, 2))]), "ids.*rank 1"),
    (one_op_model("EMBEDDING_LOOKUP", [Input((2,)), Const(np.ones((3, 2), np.float32))],
                  [Output((2, 2))]), "ids.*int32"),
    (one_op_model("EMBEDDING_LOOKUP", [Input((2,), I32, (1.0, 0)),
                                       Const(np.ones((3, 2), np.float32))],
                  [Output((2, 2))]), "ids.*plain int32"),
    (one_op_model("EMBEDDING_LOOKUP", [Input((2,), I32), Const(np.ones(3, np.float32))],
                  [Output((2,))]), "rank >= 2"),
    (one_op_model("EMBEDDING_LOOKUP", [Input((2,), I32), Const(np.ones((3, 2), I32))],
                  [Output((2, 2), I32)]), "float32, int8 or uint8"),
    (one_op_model("EMBEDDING_LOOKUP", [Input((2,), I32), Const(np.ones((3, 2), np.int8),
                                                             quantization=(0.5, 2))],
                  [Output((2, 2))]), "zero point 0"),
    (one_op_model("EMBEDDING_LOOKUP", [Input((2,), I32),
                                       Const(np.ones((3, 2), np.int8),
                                             quantization=(np.ones(2, np.float32),
                                                           np.zeros(2, np.int64), 1))],
                  [Output((2, 2))]), "one scale per row"),
    (one_op_model("EMBEDDING_LOOKUP", [Input((2,), I32), Const(np.ones((3, 2), np.int8))],
                  [Output((2, 2))]), "needs a quantization scale"),
    (one_op_model("EMBEDDING_LOOKUP", [Input((2,), I32), Const(np.ones((3, 2), np.float32))],
                  [Output((2, 2), np.int8, (0.1, 0))]), "output.*int8"),
])
def test_embedding_refuses_bad_tensors(model, match):
    with pytest.raises(ModelError, match="EMBEDDING_LOOKUP.*" + match):
        run_ours(model, [np.zeros(2, I32) if "rank 1" not in match else np.zeros((2, 1), I32)])


@given(case=scatter_case(), dtype=st.sampled_from([np.float32, np.int32, np.int64]),
       const_indices=st.booleans(), seed=S.seeds())
def test_scatter_nd_matches_litert(case, dtype, const_indices, seed):
    shape, outer, m = case
    indices, updates = _scatter_data(_rng(seed), shape, outer, m, dtype)
    model = scatter_model(shape, outer, m, dtype, indices=indices if const_indices else None)
    check_against_litert(model, ([] if const_indices else [indices]) + [updates])


@given(case=scatter_case(), dtype=st.sampled_from([np.int8, np.uint8]), seed=S.seeds(),
       scale=S.scales())
def test_scatter_nd_8bit_matches_litert(case, dtype, scale, seed):
    """Where LiteRT's code arithmetic and the float view agree: zero point 0, no duplicate
    rows (LiteRT adds codes with wrap-around), the output's quantization the updates'."""
    shape, outer, m = case
    assume(np.prod(outer) <= np.prod(shape[:m]))
    rng = _rng(seed)
    indices, _ = _scatter_data(rng, shape, outer, m, unique=True)
    info = np.iinfo(dtype)
    codes = rng.integers(max(info.min, 0 if dtype == np.uint8 else -128), int(info.max) + 1,
                         tuple(outer) + tuple(shape[m:])).astype(dtype)
    check_against_litert(scatter_model(shape, outer, m, dtype, (scale, 0)), [indices, codes])


def test_scatter_nd_8bit_float_view_with_zero_point_and_duplicates():
    """The float view: zeros are real 0 (code zp), duplicates add real values, the sum
    saturates to the grid (LiteRT: code 0 where nothing lands, codes added with wrap-around)."""
    q = (0.5, 3)
    indices = np.array([[0], [2], [0]], I32)
    codes = np.array([10, 20, 120], np.int8)
    actual = run_ours(scatter_model((4,), (3,), 1, np.int8, q), [indices, codes])[0]
    real = (codes.astype(np.float32) - 3) * 0.5
    sums = np.array([real[0] + real[2], 0, real[1], 0], np.float32)
    expected = np.clip(np.round(sums / 0.5) + 3, -128, 127).astype(np.int8)
    np.testing.assert_array_equal(actual, expected)
    np.testing.assert_array_equal(expected, [127, 3, 20, 3])


def test_scatter_nd_run_time_shape_matches_litert():
    """A shape given at run time: the output shape is inferred at invoke."""
    model = one_op_model("SCATTER_ND", [Input((3, 1), I32), Input((3, 2)), Input((2,), I32)],
                         [Output((4, 2))])
    inputs = [np.array([[0], [3], [0]], I32), np.arange(6, dtype=np.float32).reshape(3, 2),
              np.array([5, 2], I32)]
    check_against_litert(model, inputs)


@pytest.mark.parametrize("bad", [[[0, 1], [2, 0]], [[0, 0], [0, -1]]])
def test_scatter_nd_index_out_of_range(bad):
    model = scatter_model((2, 3), (2,), 2)
    with pytest.raises(InputError, match=r"SCATTER_ND.*index \(dimension \d\) -?\d+ at"):
        run_ours(model, [np.array(bad, I32), np.ones(2, np.float32)])
    const = scatter_model((2, 3), (2,), 2, indices=bad)
    with pytest.raises(ModelError, match=r"SCATTER_ND.*out of range"):
        run_ours(const, [np.ones(2, np.float32)])


@pytest.mark.parametrize("inputs, out, match", [
    ([Input((2, 1), I32), Input((3,)), Const(np.array([4], I32))], Output((4,)), "do not fit"),
    ([Input((2, 3), I32), Input((2,)), Const(np.array([4, 4], I32))], Output((4, 4)),
     "exceed the output's rank"),
    ([Input((2, 1), I32), Input((2,)), Const(np.array([4], np.int64))], Output((4,)),
     "shape.*int32"),
    ([Input((2, 1)), Input((2,)), Const(np.array([4], I32))], Output((4,)), "indices.*int32"),
    ([Input((2, 1), I32), Input((2,), np.int16), Const(np.array([4], I32))],
     Output((4,), np.int16), "LiteRT's kernel takes"),
    ([Input((2, 1), I32), Input((2,)), Const(np.array([4], I32))], Output((4,), I32),
     "output.*int32"),
    ([Input((2, 1), I32), Input((2,)), Const(np.array([-4], I32))], Output((4,)), "negative"),
])
def test_scatter_nd_refuses_bad_tensors(inputs, out, match):
    model = one_op_model("SCATTER_ND", inputs, [out])
    with pytest.raises(ModelError, match="SCATTER_ND.*" + match):
        run_ours(model, [np.zeros(spec.shape, spec.dtype) for spec in inputs
                         if isinstance(spec, Input)])


@given(ids=sorted_segment_ids(), inner=S.shapes(0, 3, 1, 4),
       dtype=st.sampled_from([np.float32, np.int32]),
       const_ids=st.booleans(), seed=S.seeds())
def test_segment_sum_matches_litert(ids, inner, dtype, const_ids, seed):
    shape = (ids.size,) + tuple(inner)
    rng = _rng(seed)
    data = (rng.uniform(-3, 3, shape).astype(np.float32) if dtype == np.float32
            else rng.integers(-100, 101, shape).astype(I32))
    model = segment_sum_model(shape, ids if const_ids else None, dtype,
                              rows=int(ids[-1]) + 1 if const_ids else None)
    check_against_litert(model, [data] + ([] if const_ids else [ids]), kernels="builtin")


def test_quantized_segment_sums_follow_the_float_view():
    """LiteRT has no 8-bit segment sums; here the real values are summed and snapped."""
    q = (0.25, -5)
    codes = np.array([[-128, 7], [100, 127], [3, -4]], np.int8)
    real = (codes.astype(np.float32) + 5) * 0.25

    def snapped(x):
        return np.clip(np.round(x / 0.25) - 5, -128, 127).astype(np.int8)

    ids = np.array([0, 0, 1], I32)
    seg = run_ours(segment_sum_model((3, 2), None, np.int8, q), [codes, ids])[0]
    np.testing.assert_array_equal(seg, snapped(np.stack([real[0] + real[1], real[2]])))
    model = unsorted_model((3, 2), (3,), 3, np.int8, q)
    uns = run_ours(model, [codes, np.array([2, -1, 2], I32)])[0]
    np.testing.assert_array_equal(uns, snapped(np.stack([0 * real[0], 0 * real[0],
                                                         real[0] + real[2]])))


@pytest.mark.parametrize("ids, match", [([1, 1, 2], "start at 0"), ([0, 2, 2], "rise by 0 or 1"),
                                        ([0, 1, 0], "rise by 0 or 1")])
def test_segment_sum_ids_must_rise_from_0_by_steps_of_1(ids, match):
    for model, inputs in ((segment_sum_model((3, 2)), [np.ones((3, 2), np.float32),
                                                       np.array(ids, I32)]),
                          (segment_sum_model((3, 2), ids), [np.ones((3, 2), np.float32)])):
        with pytest.raises(TfliteTaichiError, match="SEGMENT_SUM.*" + match):
            run_ours(model, inputs)


@pytest.mark.parametrize("data, ids, match", [
    (Input((3, 2)), Input((2,), I32), "3 rows"),
    (Input((3, 2)), Input((3, 1), I32), "rank 1"),
    (Input((3, 2)), Input((3,), np.int64), "int32"),
    (Input((3, 2), np.float16), Input((3,), I32), "float32/int32"),
    (Input((3, 2), np.int8), Input((3,), I32), "float32/int32 or quantized"),
])
def test_segment_sum_refuses_bad_tensors(data, ids, match):
    model = one_op_model("SEGMENT_SUM", [data, ids], [Output((3, 2), data.dtype)])
    with pytest.raises(ModelError, match="SEGMENT_SUM.*" + match):
        run_ours(model, [np.zeros(data.shape, data.dtype), np.zeros(ids.shape, ids.dtype)])


@given(case=unsorted_case(), dtype=st.sampled_from([np.float32, np.int32]),
       const_ids=st.booleans(), scalar_n=st.booleans(), seed=S.seeds())
def test_unsorted_segment_sum_matches_litert(case, dtype, const_ids, scalar_n, seed):
    """Ids in [-2, num_segments): negative ones dropped, as LiteRT."""
    shape, ids_rank, n = case
    rng = _rng(seed)
    ids = rng.integers(-2, n, shape[:ids_rank]).astype(I32)
    data = (rng.uniform(-3, 3, shape).astype(np.float32) if dtype == np.float32
            else rng.integers(-100, 101, shape).astype(I32))
    model = unsorted_model(shape, ids.shape, n, dtype, ids=ids if const_ids else None,
                           n_shape=() if scalar_n else (1,))
    check_against_litert(model, [data] + ([] if const_ids else [ids]))


def test_unsorted_segment_id_too_large():
    model = unsorted_model((3, 2), (3,), 2)
    with pytest.raises(InputError, match=r"UNSORTED_SEGMENT_SUM.*segment id 2 at \[1\].*below "
                                         "num_segments 2"):
        run_ours(model, [np.ones((3, 2), np.float32), np.array([0, 2, -7], I32)])
    with pytest.raises(ModelError, match=r"UNSORTED_SEGMENT_SUM.*segment id 5"):
        run_ours(unsorted_model((3, 2), (3,), 2, ids=[0, 5, 1]), [np.ones((3, 2), np.float32)])


@pytest.mark.parametrize("ids_shape, n_value, match", [
    ((2,), np.array([2], I32), "leading shape"),
    ((3, 3), np.array([2], I32), "leading shape"),
    ((3,), np.array([2, 3], I32), "one value"),
    ((3,), np.array([-1], I32), ">= 0"),
    ((3,), np.array([2], np.int64), "num_segments.*int32"),
])
def test_unsorted_segment_sum_refuses_bad_tensors(ids_shape, n_value, match):
    model = one_op_model("UNSORTED_SEGMENT_SUM",
                         [Input((3, 2)), Input(ids_shape, I32), Const(n_value)], [Output((2, 2))])
    with pytest.raises(ModelError, match="UNSORTED_SEGMENT_SUM.*" + match):
        run_ours(model, [np.zeros((3, 2), np.float32), np.zeros(ids_shape, I32)])


@pytest.mark.parametrize("kind", ["float", "hybrid"])
def test_text_classifier_matches_litert(kind):
    model = text_classifier(kind)
    for seed in range(3):
        out = check_against_litert(model, [token_ids(seed)])[0]
        assert abs(float(out.sum()) - 1.0) < 1e-5


def _all_tensors(it, ids) -> dict:
    it.allocate_tensors()
    it.set_tensor(it.get_input_details()[0]["index"], ids)
    it.invoke()
    return {d["name"]: it.get_tensor(d["index"]) for d in it.get_tensor_details()
            if d["name"] in ("embedded", "pooled", "logits", "probs")}


def test_int8_text_classifier_matches_litert_op_by_op():
    """The int8 classifier, every tensor within one unit of LiteRT's (the lookup exactly: a copy
    of codes). Held op by op: int8 MEAN rounds one unit away from LiteRT's at times, which
    FULLY_CONNECTED keeps within a unit but SOFTMAX's 1/256 grid turns into 3 (seen), so the
    SOFTMAX output is held to LiteRT's SOFTMAX of the same logits."""
    from ai_edge_litert.interpreter import Interpreter as LiteRT, OpResolverType
    from tflite_taichi.interpreter import Interpreter
    model = text_classifier("int8")
    softmax = one_op_model("SOFTMAX", [Input((1, CLASSES), np.int8, LOGITS_Q)],
                           [Output((1, CLASSES), np.int8, (1 / 256, -128))], beta=1.0)
    for seed in range(4):
        ids = token_ids(seed)
        theirs = _all_tensors(LiteRT(model_content=model, experimental_preserve_all_tensors=True,
                                     experimental_op_resolver_type=OpResolverType.BUILTIN_REF), ids)
        ours = _all_tensors(Interpreter(model_content=model, backend="reference",
                                        experimental_preserve_all_tensors=True), ids)
        np.testing.assert_array_equal(ours["embedded"], theirs["embedded"])
        for name in ("pooled", "logits"):
            assert_quantized_close(ours[name], theirs[name], what=name)
        assert_quantized_close(ours["probs"], run_litert(softmax, [ours["logits"]])[0],
                               what="probs")
