"""Sparse constants (the TFLite sparsity format) and DENSIFY, against LiteRT's reference
kernels: random sparse matrices in every format LiteRT reads (CSR levels, 1x4 / 4x1 / 2x2
blocks, a transposed traversal, uint8/uint16/int32 index vectors), consumed by DENSIFY and by
FULLY_CONNECTED directly; float32, int8 and float16; a 4-D convolution filter; malformed
metadata as ModelErrors naming the tensor; and on the delegate, DENSIFY -> FULLY_CONNECTED
fully delegated (DENSIFY of a constant is folded at prepare)."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tflite_taichi import Interpreter
from tflite_taichi.builder import ModelBuilder
from tflite_taichi.errors import ModelError
from tflite_taichi.ops.sparse import DENSE, SPARSE_CSR, DimMetadata, Sparsity, densify, sparsify
from tflite_taichi.testing import TAICHI_EXAMPLES, check_against_litert, check_delegate, strategies

litert = pytest.importorskip("ai_edge_litert.interpreter")
S = strategies()

# (formats per level, block_map, block_size, traversal_order) for a matrix (rows, cols); the
# block sizes need rows / cols divisible by them.
MATRIX_FORMATS = [
    (("DENSE", "SPARSE_CSR"), (), (), None),                 # LiteRT's "random sparse"
    (("SPARSE_CSR", "SPARSE_CSR"), (), (), None),
    (("SPARSE_CSR", "DENSE"), (), (), None),
    (("DENSE", "SPARSE_CSR"), (), (), (1, 0)),               # column-major traversal
    (("DENSE", "SPARSE_CSR", "DENSE"), (1,), (4,), None),    # 1x4 blocks (LiteRT's fast path)
    (("DENSE", "SPARSE_CSR", "DENSE"), (0,), (4,), None),    # 4x1 blocks
    (("SPARSE_CSR", "DENSE", "DENSE"), (1,), (2,), None),
    (("DENSE", "SPARSE_CSR", "DENSE", "DENSE"), (0, 1), (2, 2), None),   # 2x2 blocks
]
INDEX_DTYPES = [np.int32, np.uint16, np.uint8]


@st.composite
def sparse_matrices(draw, dtype=np.float32):
    """(dense matrix, format kwargs for sparsify)."""
    formats, block_map, block_size, order = draw(st.sampled_from(MATRIX_FORMATS))
    blocks = dict(zip(block_map, block_size))
    rows = draw(st.integers(1, 4)) * blocks.get(0, 1)
    cols = draw(st.integers(1, 5)) * blocks.get(1, 1)
    density = draw(st.sampled_from([0.0, 0.1, 0.3, 0.6, 1.0]))
    rng = np.random.default_rng(draw(S.seeds()))
    dense = rng.uniform(-2, 2, (rows, cols)) * (rng.random((rows, cols)) < density)
    if np.dtype(dtype) == np.int8:
        dense = rng.integers(-127, 128, (rows, cols)) * (rng.random((rows, cols)) < density)
    if not dense.any():         # no stored values at all: an empty buffer, which LiteRT refuses
        dense[rng.integers(rows), rng.integers(cols)] = 1   # ("lacks data"; here too, see below)
    kwargs = dict(formats=formats, block_map=block_map, block_size=block_size,
                  traversal_order=order, index_dtype=draw(st.sampled_from(INDEX_DTYPES)))
    return dense.astype(dtype), kwargs


def fc_model(dense, kwargs, through_densify, batch=2, quantized=None):
    """FULLY_CONNECTED(x, W) with W stored sparse, read through DENSIFY or directly.
    quantized: (q_x, q_w, q_y) for int8 (W's integers are `dense`)."""
    rows, cols = dense.shape
    b = ModelBuilder()
    g = b.subgraph()
    dt = np.int8 if quantized else np.float32
    qx, qw, qy = quantized or (None, None, None)
    x = g.input("x", (batch, cols), dt, qx)
    w = g.sparse_const("w", dense, quantization=qw, **kwargs)
    if through_densify:
        dense_w = g.tensor("w_dense", (rows, cols), dt, qw)
        g.op("DENSIFY", [w], [dense_w])
        w = dense_w
    y = g.tensor("y", (batch, rows), dt, qy)
    g.op("FULLY_CONNECTED", [x, w, -1], [y])
    g.output(y)
    return b.finish()


@given(case=sparse_matrices(), through_densify=st.booleans(), batch=st.integers(1, 3), seed=S.seeds())
def test_float32_sparse_weights_match_litert(case, through_densify, batch, seed):
    dense, kwargs = case
    model = fc_model(dense, kwargs, through_densify, batch)
    check_against_litert(model, seed=seed)
    values, sparsity = sparsify(dense, **kwargs)             # and the reader densified exactly
    np.testing.assert_array_equal(Interpreter(model_content=model, backend="reference").model
                                  .main.tensors[1].data, densify(dense.shape, sparsity, values, "w"))


# LiteRT's int8 FULLY_CONNECTED reads sparse weights only in 1x16 blocks (it refuses the
# other formats at invoke: "Unsupported sparse fully-connected weight format"); through
# DENSIFY every format works. Here both paths read every format.
INT8_FC_FORMAT = dict(formats=("DENSE", "SPARSE_CSR", "DENSE"), block_map=(1,), block_size=(16,))


@given(case=sparse_matrices(np.int8), through_densify=st.booleans(), qx=S.quant_params(),
       w_scale=S.scales(), qy=S.quant_params(), seed=S.seeds())
def test_int8_sparse_weights_match_litert(case, through_densify, qx, w_scale, qy, seed):
    dense, kwargs = case
    if not through_densify:
        dense = np.tile(dense, (1, 16))[:, :16 * ((dense.shape[1] + 15) // 16)]
        kwargs = dict(INT8_FC_FORMAT, index_dtype=kwargs["index_dtype"])
    model = fc_model(dense, kwargs, through_densify, quantized=(qx, (w_scale, 0), qy))
    check_against_litert(model, seed=seed)


@given(case=sparse_matrices(np.float16), seed=S.seeds())
def test_float16_densify_then_dequantize_matches_litert(case, seed):
    """The converter's float16 sparse weights: DENSIFY (float16) -> DEQUANTIZE -> FC."""
    dense, kwargs = case
    rows, cols = dense.shape
    b = ModelBuilder()
    g = b.subgraph()
    x = g.input("x", (1, cols))
    w16 = g.tensor("w16", (rows, cols), np.float16)
    g.op("DENSIFY", [g.sparse_const("w", dense, **kwargs)], [w16])
    w = g.tensor("w32", (rows, cols))
    g.op("DEQUANTIZE", [w16], [w])
    y = g.tensor("y", (1, rows))
    g.op("FULLY_CONNECTED", [x, w, -1], [y])
    g.output(y)
    check_against_litert(b.finish(), seed=seed)


@st.composite
def sparse_filters(draw):
    """A CONV_2D filter (out, kh, kw, in) with a random format per level, maybe blocked along
    the input channels, maybe with the channel levels traversed first."""
    cout, kh, kw = draw(st.integers(1, 3)), draw(st.integers(1, 3)), draw(st.integers(1, 3))
    block = draw(st.sampled_from([1, 2]))
    cin = draw(st.integers(1, 2)) * block
    rng = np.random.default_rng(draw(S.seeds()))
    dense = (rng.uniform(-1, 1, (cout, kh, kw, cin)) * (rng.random((cout, kh, kw, cin)) < 0.4)).astype(np.float32)
    dense[0, 0, 0, 0] = 0.5                 # some stored value (see sparse_matrices)
    order = draw(st.sampled_from([(0, 1, 2, 3), (3, 0, 1, 2), (1, 2, 0, 3)]))
    formats = [draw(st.sampled_from(["DENSE", "SPARSE_CSR"])) for _ in range(4)]
    if block > 1:
        return dense, dict(formats=formats + ["DENSE"], block_map=(3,), block_size=(block,),
                           traversal_order=order + (4,))
    return dense, dict(formats=formats, traversal_order=order)


@given(case=sparse_filters(), seed=S.seeds())
def test_densify_of_a_conv_filter_matches_litert(case, seed):
    dense, kwargs = case
    cout, kh, kw, cin = dense.shape
    b = ModelBuilder()
    g = b.subgraph()
    x = g.input("x", (1, 5, 5, cin))
    f = g.tensor("filter", dense.shape)
    g.op("DENSIFY", [g.sparse_const("filter_sparse", dense, **kwargs)], [f])
    y = g.tensor("y", (1, 5, 5, cout))
    g.op("CONV_2D", [x, f, g.const("bias", np.zeros(cout, np.float32))], [y], padding="SAME",
         stride_h=1, stride_w=1)
    g.output(y)
    check_against_litert(b.finish(), seed=seed)


@given(dense=st.integers(1, 4).flatmap(lambda r: st.lists(
           st.lists(st.sampled_from([0.0, 0.0, 1.5, -2.0]), min_size=6, max_size=6),
           min_size=r, max_size=r)).map(lambda v: np.array(v, np.float32)),
       fmt=st.sampled_from(MATRIX_FORMATS[:4]))
def test_sparsify_then_densify_round_trips(dense, fmt):
    formats, block_map, block_size, order = fmt
    values, sparsity = sparsify(dense, formats, block_map, block_size, order)
    np.testing.assert_array_equal(densify(dense.shape, sparsity, values, "t"), dense)


def test_tensor_details_carry_the_sparsity_parameters_like_litert():
    rng = np.random.default_rng(0)
    dense = (rng.uniform(-1, 1, (4, 8)) * (rng.random((4, 8)) < 0.4)).astype(np.float32)
    model = fc_model(dense, dict(formats=("DENSE", "SPARSE_CSR", "DENSE"), block_map=(1,),
                                 block_size=(4,), index_dtype=np.uint16), through_densify=False)
    ours = Interpreter(model_content=model, backend="reference")
    theirs = litert.Interpreter(model_content=model)
    for it in (ours, theirs):
        it.allocate_tensors()
    a, e = ours.get_tensor_details()[1]["sparsity_parameters"], theirs.get_tensor_details()[1]["sparsity_parameters"]
    assert a.keys() == e.keys()
    for key in ("traversal_order", "block_map"):
        np.testing.assert_array_equal(a[key], e[key])
    assert len(a["dim_metadata"]) == len(e["dim_metadata"]) == 3
    for da, de in zip(a["dim_metadata"], e["dim_metadata"]):
        assert da.keys() == de.keys()
        for key in da:
            np.testing.assert_array_equal(da[key], de[key])
    assert ours.get_tensor_details()[0]["sparsity_parameters"] == {}


# -- malformed metadata -----------------------------------------------------------------------
def _csr(segments, indices, dtype=np.int32):
    return DimMetadata(SPARSE_CSR, segments=np.array(segments, dtype), indices=np.array(indices, dtype))


def _raw_model(values, sparsity, shape=(3, 4)):
    b = ModelBuilder()
    g = b.subgraph()
    x = g.input("x", (1, shape[1]))
    w = g.raw_sparse_const("weights", shape, np.array(values, np.float32), sparsity)
    y = g.tensor("y", (1, shape[0]))
    g.op("FULLY_CONNECTED", [x, w, -1], [y])
    g.output(y)
    return b.finish()


def _random_sparse():
    """A valid 3x4 DENSE/CSR encoding: row 0 has columns 1, 3; row 1 none; row 2 column 0."""
    return Sparsity((0, 1), (), (DimMetadata(DENSE, dense_size=3), _csr([0, 2, 2, 3], [1, 3, 0])))


def test_a_hand_written_sparse_tensor_reads_like_litert():
    model = _raw_model([1.0, 2.0, 3.0], _random_sparse())
    w = Interpreter(model_content=model, backend="reference").model.main.tensors[1].data
    np.testing.assert_array_equal(w, [[0, 1, 0, 2], [0, 0, 0, 0], [3, 0, 0, 0]])
    check_against_litert(model)


@pytest.mark.parametrize("sparsity, values, message", [
    (Sparsity((0, 1), (), (DimMetadata(DENSE, dense_size=3), _csr([0, 2, 1, 3], [1, 3, 0]))),
     [1, 2, 3], r"level 1: array_segments must rise monotonically from 0 to the 3 array_indices \(got \[0, 2, 1, 3\]\)"),
    (Sparsity((0, 1), (), (DimMetadata(DENSE, dense_size=3), _csr([0, 2, 2, 3], [1, 4, 0]))),
     [1, 2, 3], r"level 1: array_indices must lie in 0..3 \(expanded dimension 1\), got \[1, 4, 0\]"),
    (Sparsity((0, 1), (), (DimMetadata(DENSE, dense_size=3), _csr([0, 2, 3], [1, 3, 0]))),
     [1, 2, 3], r"level 1: array_segments has 3 entries, expected 4"),
    (Sparsity((0, 1), (), (DimMetadata(DENSE, dense_size=3), _csr([0, 2, 2, 4], [1, 3, 0]))),
     [1, 2, 3], r"level 1: array_segments must rise monotonically from 0 to the 3 array_indices"),
    (_random_sparse(), [1, 2], r"the buffer holds 2 values, the metadata describes 3"),
    (Sparsity((0, 1), (), (DimMetadata(DENSE, dense_size=2), _csr([0, 2, 2], [1, 3]))),
     [1, 2], r"level 0 is DENSE of size 2, but expanded dimension 0 has 3 entries"),
    (Sparsity((0, 1), (), (DimMetadata(DENSE, dense_size=3), _csr([0, 2, 2, 3], [1, 1, 0]))),
     [1, 2, 3], r"two stored values land on the same element"),
    (Sparsity((0, 2), (), (DimMetadata(DENSE, dense_size=3), _csr([0, 2, 2, 3], [1, 3, 0]))),
     [1, 2, 3], r"traversal_order \[0, 2\] must list dimensions 0..1 first"),
    (Sparsity((0, 1, 2), (1,), (DimMetadata(DENSE, dense_size=3), _csr([0, 1, 1, 1], [0]),
                                DimMetadata(DENSE, dense_size=3))),
     [1, 2, 3], r"block size 3 along dimension 1 does not divide its size 4"),
    (Sparsity((0, 1), (), (DimMetadata(DENSE, dense_size=3),)),
     [1, 2, 3], r"dim_metadata has 1 entries, traversal_order 2"),
    (Sparsity((0, 1), (), (DimMetadata(DENSE, dense_size=3), DimMetadata(SPARSE_CSR))),
     [1, 2, 3], r"level 1 is SPARSE_CSR without array_segments/array_indices"),
], ids=["segments not monotonic", "index out of range", "segments too short",
        "segments end past the indices", "too few values", "dense size", "duplicate index",
        "traversal order", "block size", "metadata count", "no index vectors"])
def test_malformed_sparsity_is_a_model_error_naming_the_tensor(sparsity, values, message):
    with pytest.raises(ModelError, match=r"tensor 1 \('weights'\): sparsity: " + message):
        Interpreter(model_content=_raw_model(values, sparsity), backend="reference")


def test_a_sparse_shape_too_large_for_its_file_is_a_model_error():
    """A mutated shape must not make the reader allocate 40 GB."""
    sparsity = Sparsity((0, 1), (), (DimMetadata(DENSE, dense_size=100_000), _csr([0] + [1] * 100_000, [7])))
    with pytest.raises(ModelError, match=r"tensor 1 \('weights'\): a sparse tensor of shape "
                                         r"\[100000, 100000\] would densify to 40000000000 bytes"):
        Interpreter(model_content=_raw_model([1.0], sparsity, shape=(100_000, 100_000)), backend="reference")


def test_a_sparse_tensor_without_stored_values_is_a_model_error():
    """All zeros with only sparse levels stores no value: an empty buffer, which LiteRT also
    refuses (\"Input tensor 1 lacks data\")."""
    b = ModelBuilder()
    g = b.subgraph()
    x = g.input("x", (1, 3))
    w = g.sparse_const("w", np.zeros((2, 3), np.float32), ("DENSE", "SPARSE_CSR"))
    y = g.tensor("y", (1, 2))
    g.op("FULLY_CONNECTED", [x, w, -1], [y])
    g.output(y)
    with pytest.raises(ModelError, match=r"tensor 1 \('w'\) .*sparse tensor with no stored values"):
        Interpreter(model_content=b.finish(), backend="reference")


def test_densify_of_a_run_time_tensor_is_a_model_error():
    b = ModelBuilder()
    g = b.subgraph()
    x = g.input("x", (2, 3))
    y = g.tensor("y", (2, 3))
    g.op("DENSIFY", [x], [y])
    g.output(y)
    it = Interpreter(model_content=b.finish(), backend="reference")
    with pytest.raises(ModelError, match=r"op #0 \(DENSIFY\): input 'x' must be a constant"):
        it.allocate_tensors()


# -- on the delegate --------------------------------------------------------------------------
@settings(max_examples=max(TAICHI_EXAMPLES // 4, 3))   # folding, not kernels
@given(case=sparse_matrices(), through_densify=st.booleans(), seed=S.seeds())
def test_sparse_weights_are_fully_delegated(taichi_workers, case, through_densify, seed):
    """DENSIFY of a constant folds at prepare, so DENSIFY -> FULLY_CONNECTED (and FC on a
    sparse constant) is one delegated FC, as the official GPU delegate takes it."""
    dense, kwargs = case
    model = fc_model(dense, kwargs, through_densify)
    summaries = check_delegate(model, taichi_workers, seed=seed)       # no op left on the CPU
    for summary in summaries.values():
        assert summary["ops_delegated"] == 1
        assert [f["op"] for f in summary["folded"]] == (["DENSIFY"] if through_densify else [])
