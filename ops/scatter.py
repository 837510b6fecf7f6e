"""Lookups and scatters of text and recommendation models: EMBEDDING_LOOKUP, SCATTER_ND,
SEGMENT_SUM, UNSORTED_SEGMENT_SUM.

Semantics are LiteRT's (tensorflow/lite/kernels/embedding_lookup.cc, scatter_nd.cc,
segment_sum.cc, unsorted_segment.cc), measured against LiteRT 2.3:
- EMBEDDING_LOOKUP (ids, table): ids a plain int32 vector [N], the table [V, ...] of rank >= 2;
  out[n] = table[ids[n]], shape [N] + table.shape[1:]. An id outside [0, V) is an error (LiteRT:
  "Embedding Lookup: index out of bounds"). Tables:
  - float32, giving float32;
  - int8/uint8 quantized with a float32 output (hybrid: out = q * scale): zero points must be
    0 (LiteRT's Prepare checks only the first; here all) and per-channel scales are one per row
    (quantized_dimension 0, V scales), as LiteRT requires;
  - int8/uint8 with an output of the same type: LiteRT copies the bytes; here the real values
    are gathered and snapped to the output's grid (the float view), the same codes when the
    output has the table's quantization, as converters write it. Per tensor only (LiteRT).
    Table and output are both quantized or both plain.
  Where LiteRT is off: its hybrid kernel reads a uint8 table as int8, so a code >= 128 comes out
  as code - 256 (times the scale); here a uint8 code means what its dtype says, q * scale (the
  tests hold those codes to that formula). Other table dtypes LiteRT refuses: so does this op.
- SCATTER_ND (indices, updates, shape): zeros of `shape` (a constant int32 vector; a run-time
  one makes the output shape data-dependent) with each update slice added at its index row:
  indices [..., M] int32, updates indices.shape[:-1] + shape[M:]; duplicate rows add, in the
  order of the rows. An index outside [0, shape[d]) is an error (LiteRT: "scatter_nd index out
  of bounds"). Updates: float32, int32, int64, int8/uint8; the output has the updates' type.
  Quantized updates follow the float view (real values added, the sum snapped to the output's
  grid, zeros are real 0), where LiteRT adds the integer codes and wraps on overflow, and its
  zeros are code 0 (real -zp * scale): the two agree for zero point 0, the output's scale equal
  to the updates', no duplicate rows and no overflow - the tests hold other cases to the float
  view's formula.
- SEGMENT_SUM (data, segment_ids): ids a plain int32 vector of data.shape[0] entries that start
  at 0 and rise by 0 or 1 (LiteRT refuses gaps: "delta == 0 || delta == 1"; TensorFlow would
  leave zero rows); out[s] = the sum of the data rows with id s, shape [last id + 1] +
  data.shape[1:]: known at prepare only for constant ids (else the op is inferred again at each
  invoke, on the CPU: base.DataDependentShape). LiteRT 2.3 has no reference kernel for it (only
  its builtin resolver runs it): the tests compare with that one.
- UNSORTED_SEGMENT_SUM (data, segment_ids, num_segments): ids int32 of data's leading shape
  (any rank <= data's), num_segments a scalar or [1] int32; out = zeros [num_segments] +
  data.shape[ids.rank:], each data slice added at its id in row-major order; negative ids are
  dropped, an id >= num_segments is an error, as in LiteRT.
  Data of both segment sums: float32 or int32 (LiteRT's kernels), int32 sums wrapping as C's;
  here also int8/int16 quantized data in the float view (LiteRT refuses them; the tests hold
  them to the float view's formula), as CUMSUM.
Errors on values: a ModelError at prepare for constant ids/indices, an InputError naming the op
and the first bad entry at invoke (indexing.py's rule, GATHER's); SEGMENT_SUM's run-time ids
decide its output shape, so their check runs in its inference at invoke: a ModelError there.

Taichi (the delegate): every op is a gather, one thread per output element summing what lands
on it in the reference's order, so results are deterministic and equal to the reference's
float32 sums (no atomics):
- EMBEDDING_LOOKUP: out[n, j] = table[ids[n], j];
- SCATTER_ND: out[c, j] = the sum over index rows k, ascending, whose offset is c, of
  updates[k, j]: K loads per output element, so instances with more than WORK_LIMIT
  (output elements x index rows) stay on the CPU;
- SEGMENT_SUM (constant ids): out[s, j] = the data rows from start[s] to start[s + 1];
- UNSORTED_SEGMENT_SUM: out[s, j] = the sum over ids equal to s (WORK_LIMIT as SCATTER_ND).
Ids and indices: constant ones are compiled into the kernel as arithmetic runs (indexing.py's
RunTable, at most MAX_RUNS runs); run-time ones - an embedding's ids are usually a model input -
are carried as float32 (OpDef.index_inputs, partition.carried_index_inputs): the host casts
them when it writes the delegate's io buffer, exact below 2**24 (tables, shapes and segment
counts beyond that stay on the CPU), and checks them first with the op's own range check, so
an out-of-range id raises the same InputError as on the CPU and never reaches a kernel.
(No `from __future__ import annotations` here: Taichi reads the ti.func annotations.)
"""
import numpy as np

from .base import Fusion, OpDef, register_op
from .common import check_range, invoke_error
from .tables import RunTable, arithmetic_runs, runs_reason
from .kit import ti

INT32 = np.dtype(np.int32)
# float32 holds every integer up to 2**24 exactly: the largest id range carried as float32
MAX_EXACT_INDEX = 1 << 24
# loads a gather-formulated scatter may do (output elements x index rows) on the delegate
WORK_LIMIT = 1 << 26


def _dtype_name(spec) -> str:
    return np.dtype(spec.dtype).name if spec.dtype is not None else "untyped"


def _prod(shape) -> int:
    return int(np.prod(shape, dtype=np.int64))


def _require_int32(node, i: int, what: str, rank=None):
    """Input `i`: a plain int32 tensor (of `rank` dims when given)."""
    spec = node.inputs[i] if i < len(node.inputs) else None
    if spec is None:
        raise node.fail(f"{what} (input {i}) is missing")
    if spec.dtype is None or np.dtype(spec.dtype) != INT32 or spec.is_quantized:
        kind = "quantized " if spec.is_quantized else ""
        raise node.fail(f"{what} '{spec.name}' must be a plain int32 tensor, got "
                        f"{kind}{_dtype_name(spec)}")
    if rank is not None and spec.rank != rank:
        raise node.fail(f"{what} '{spec.name}' must have rank {rank}, has shape "
                        f"{list(spec.shape)}")
    return spec


def _require_same_type(node, src, what: str):
    """The output has `src`'s dtype, and is quantized exactly when `src` is."""
    out = node.outputs[0]
    if out.dtype is None or np.dtype(out.dtype) != np.dtype(src.dtype):
        raise node.fail(f"output '{out.name}' is {_dtype_name(out)}; {what} '{src.name}' is "
                        f"{_dtype_name(src)} and the output has its type")
    if out.is_quantized != src.is_quantized:
        raise node.fail(f"output '{out.name}' and {what} '{src.name}' must both be quantized or "
                        "both plain")
    if out.is_quantized and out.quantization.per_channel:
        raise node.fail(f"output '{out.name}' has per-channel quantization; it takes one scale")


_SUM_DTYPES = {np.dtype(np.float32), INT32}
_QUANTIZED_SUM_DTYPES = {np.dtype(np.int8), np.dtype(np.int16)}


def _require_summable(node, spec, what: str, plain=_SUM_DTYPES, quantized=_QUANTIZED_SUM_DTYPES):
    dtype = np.dtype(spec.dtype) if spec.dtype is not None else None
    ok = (dtype in quantized and spec.is_quantized) or (dtype in plain and not spec.is_quantized)
    if not ok:
        allowed = "/".join(sorted(d.name for d in plain))
        qs = "/".join(sorted(d.name for d in quantized))
        kind = "quantized " if spec.is_quantized else ""
        raise node.fail(f"{what} '{spec.name}' is {kind}{_dtype_name(spec)}; expected "
                        f"{allowed} or quantized {qs}")
    if spec.is_quantized and spec.quantization.per_channel:
        raise node.fail(f"{what} '{spec.name}' has per-channel quantization; it takes one scale")


# -- Taichi: where the ids come from ----------------------------------------------------------
@ti.data_oriented
class ConstantIds:
    """Constant integers compiled into the kernel (arithmetic runs)."""

    def __init__(self, values):
        self.table = RunTable(arithmetic_runs(values))

    @ti.func
    def at(self, arena: ti.template(), weights: ti.template(), io: ti.template(), j):
        return self.table.at(j)


@ti.data_oriented
class RuntimeIds:
    """Run-time int32 ids, in io as exact float32 integers (checked by the host first)."""

    def __init__(self, ref):
        self.ref = ref

    @ti.func
    def at(self, arena: ti.template(), weights: ti.template(), io: ti.template(), j):
        return ti.cast(self.ref.load(arena, weights, io, j), ti.i32)


def _ids_source(node, io, i: int, values=None):
    """How the kernel reads input `i`'s integers: `values` (or the constant) compiled in, or the
    run-time tensor."""
    spec = node.inputs[i]
    if values is None and spec.value is not None:
        values = spec.value
    if values is not None:
        return ConstantIds(np.asarray(values, np.int64).reshape(-1))
    return RuntimeIds(io.inputs[i])


def _exact_reason(bound: int, what: str):
    if bound > MAX_EXACT_INDEX:
        return (f"{what} {bound} exceeds 2**24: run-time ids travel to the delegate as float32, "
                "exact only up to there")
    return None


def _work_reason(n_out: int, rows: int, what: str):
    if n_out * rows > WORK_LIMIT:
        return (f"{n_out} output elements each looking at {rows} {what} (a gather, for "
                f"deterministic sums) exceed {WORK_LIMIT} loads")
    return None


# -- EMBEDDING_LOOKUP -------------------------------------------------------------------------
_TABLE_DTYPES = {np.dtype(np.float32), np.dtype(np.int8), np.dtype(np.uint8)}


def _check_hybrid_table(node, table):
    """An int8/uint8 table read into a float32 output: LiteRT's EvalHybrid, q * scale."""
    q = table.quantization
    if q is None:
        raise node.fail(f"table '{table.name}' is plain {_dtype_name(table)} and the output "
                        "float32: a table read as real values needs a quantization scale")
    if np.any(np.asarray(q.zero_point) != 0):
        raise node.fail(f"table '{table.name}' has zero points {np.asarray(q.zero_point).tolist()}"
                        "; a table read into a float32 output is symmetric (zero point 0)")
    if q.per_channel and (q.quantized_dimension != 0 or q.scale.size != table.shape[0]):
        raise node.fail(f"table '{table.name}' has {q.scale.size} scales along dimension "
                        f"{q.quantized_dimension}; per-channel tables have one scale per row "
                        f"(dimension 0, {table.shape[0]} scales)")


def _infer_embedding(node):
    ids = _require_int32(node, 0, "the ids", rank=1)
    table, out = node.inputs[1], node.outputs[0]
    if table is None:
        raise node.fail("the table (input 1) is missing")
    if table.dtype is None or np.dtype(table.dtype) not in _TABLE_DTYPES:
        raise node.fail(f"table '{table.name}' is {_dtype_name(table)}; LiteRT's kernel takes "
                        "float32, int8 or uint8 tables")
    if table.rank < 2:
        raise node.fail(f"table '{table.name}' must have rank >= 2, has shape "
                        f"{list(table.shape)}")
    out_dtype = np.dtype(out.dtype) if out.dtype is not None else None
    if np.dtype(table.dtype) != np.float32 and out_dtype == np.float32:
        if out.is_quantized:
            raise node.fail(f"output '{out.name}' is float32 and quantized")
        _check_hybrid_table(node, table)
    else:
        _require_same_type(node, table, "table")
    if ids.value is not None:
        check_range(node, ids.value, table.shape[0], "id", at_prepare=True)
    return [tuple(ids.shape) + tuple(table.shape[1:])]


def _check_ids(node):
    """The run-time range check of the ids (also run by the delegate's host, index_inputs)."""
    rows = node.inputs[1].shape[0]
    return lambda ids: check_range(node, np.asarray(ids), rows, "id", at_prepare=False)


def _reference_embedding(node, inputs):
    ids, table = np.asarray(inputs[0]), np.asarray(inputs[1])
    _check_ids(node)(ids)
    return [table[ids.astype(np.int64)].reshape(node.outputs[0].shape)]


@ti.data_oriented
class EmbeddingStep:
    """One thread per output element: out[n, j] = table[ids[n], j]."""

    def __init__(self, ids, table, out):
        self.ids, self.table, self.out = ids, table, out
        self.row = max(_prod(table.shape[1:]), 1)
        self.n = max(out.size, 1)

    @ti.func
    def run(self, arena: ti.template(), weights: ti.template(), io: ti.template()):
        for f in range(self.n):
            src = self.ids.at(arena, weights, io, f // self.row) * self.row + f % self.row
            self.out.store(arena, io, f, self.table.load(arena, weights, io, src))


def _embedding_supports(node):
    ids, table = node.inputs[0], node.inputs[1]
    if ids.value is not None:
        return runs_reason(ids.value, "ids")
    return _exact_reason(table.shape[0], "a table of rows numbering")


def _embedding_taichi(node, io):
    return EmbeddingStep(_ids_source(node, io, 0), io.inputs[1], io.outputs[0])


EMBEDDING_LOOKUP = register_op(OpDef(
    name="EMBEDDING_LOOKUP", infer=_infer_embedding, reference=_reference_embedding,
    taichi=_embedding_taichi, supports=_embedding_supports, fusion=Fusion(stores_once=True),
    index_inputs=lambda node: {0: _check_ids(node)},
    input_ranges=lambda node: {0: (0, node.inputs[1].shape[0])}, min_inputs=2, max_inputs=2))


# -- SCATTER_ND -------------------------------------------------------------------------------
_SCATTER_DTYPES = {np.dtype(np.float32), INT32, np.dtype(np.int64), np.dtype(np.int8),
                   np.dtype(np.uint8)}


def _scatter_check(node, shape) -> tuple:
    """Validates indices/updates against the output `shape` (LiteRT's CheckShapes); returns
    (rows K, index length M, slice size S)."""
    indices, updates = node.inputs[0], node.inputs[1]
    outer = indices.rank - 1
    m = indices.shape[-1]
    want = tuple(indices.shape[:-1]) + tuple(shape[m:])
    if m > len(shape) or tuple(updates.shape) != want:
        raise node.fail(f"updates '{updates.name}' {list(updates.shape)} do not fit indices "
                        f"{list(indices.shape)} and shape {list(shape)}: updates must have shape "
                        "indices.shape[:-1] + shape[indices.shape[-1]:]"
                        + (f" = {list(want)}" if m <= len(shape) else
                           f" (index rows of length {m} exceed the output's rank {len(shape)})"))
    return _prod(indices.shape[:outer]), m, _prod(shape[m:])


def _scatter_shape(node, value) -> tuple:
    shape = tuple(int(v) for v in np.asarray(value).reshape(-1))
    if any(d < 0 for d in shape):
        raise node.fail(f"shape {list(shape)} has a negative dimension")
    return shape


def _scatter_inputs(node):
    indices = _require_int32(node, 0, "the indices")
    updates = node.inputs[1]
    _require_int32(node, 2, "the shape", rank=1)
    if indices.rank < 1 or updates is None or updates.rank < 1:
        raise node.fail("the indices and updates must have rank >= 1 (LiteRT's Prepare)")
    if updates.dtype is None or np.dtype(updates.dtype) not in _SCATTER_DTYPES:
        raise node.fail(f"updates '{updates.name}' are {_dtype_name(updates)}; LiteRT's kernel "
                        "takes float32, int32, int64, int8 or uint8")
    if updates.is_quantized and updates.quantization.per_channel:
        raise node.fail(f"updates '{updates.name}' have per-channel quantization")
    _require_same_type(node, updates, "the updates")
    return indices


def _infer_scatter(node):
    indices = _scatter_inputs(node)
    shape = _scatter_shape(node, node.input_value(2, "the shape"))
    _scatter_check(node, shape)
    if indices.value is not None:
        _scatter_range(node, shape, at_prepare=True)(indices.value)
    return [shape]


def _scatter_range(node, shape, at_prepare=False):
    """A check of index rows against `shape`, per column."""
    def check(indices):
        indices = np.asarray(indices)
        for d in range(indices.shape[-1]):
            check_range(node, indices[..., d], shape[d], f"index (dimension {d})", at_prepare)
    return check


def _reference_scatter(node, inputs):
    indices, updates = np.asarray(inputs[0]).astype(np.int64), np.asarray(inputs[1])
    shape = _scatter_shape(node, inputs[2])
    k, m, s = _scatter_check(node, shape)
    _scatter_range(node, shape)(indices)
    out = np.zeros((_prod(shape[:m]), s), updates.dtype)
    cells = np.ravel_multi_index(tuple(indices.reshape(k, m).T), shape[:m]) if m else \
        np.zeros(k, np.int64)
    np.add.at(out, cells, updates.reshape(k, s))     # in row order, as LiteRT's loop
    return [out.reshape(shape)]


@ti.data_oriented
class RuntimeOffsets:
    """The output cell of index row k, from run-time index rows [K, M]."""

    def __init__(self, ref, m, strides):
        self.ref, self.m, self.strides = ref, int(m), tuple(int(v) for v in strides)

    @ti.func
    def at(self, arena: ti.template(), weights: ti.template(), io: ti.template(), k):
        c = 0
        for d in ti.static(range(self.m)):
            v = self.ref.load(arena, weights, io, k * self.m + d)
            c += ti.cast(v, ti.i32) * self.strides[d]
        return c


@ti.data_oriented
class GatherSumStep:
    """One thread per output element (c, j): the sum over rows k, ascending, whose target
    (targets.at(k)) is c, of src[k, j]. SCATTER_ND (target: the row's cell) and
    UNSORTED_SEGMENT_SUM (target: the id; negative ones match nothing)."""

    def __init__(self, targets, src, out, rows, slice_size):
        self.targets, self.src, self.out = targets, src, out
        self.K, self.S = int(rows), max(int(slice_size), 1)
        self.n = max(out.size, 1)

    @ti.func
    def run(self, arena: ti.template(), weights: ti.template(), io: ti.template()):
        for f in range(self.n):
            c = f // self.S
            j = f % self.S
            acc = 0.0
            for k in range(self.K):
                if self.targets.at(arena, weights, io, k) == c:
                    acc += self.src.load(arena, weights, io, k * self.S + j)
            self.out.store(arena, io, f, acc)


def _scatter_cells(node, shape, m):
    indices = np.asarray(node.input_value(0, "the indices"), np.int64)
    k = _prod(indices.shape[:-1])
    return (np.ravel_multi_index(tuple(indices.reshape(k, m).T), shape[:m]) if m
            else np.zeros(k, np.int64))


def _scatter_supports(node):
    shape = tuple(node.outputs[0].shape)
    k, m, s = _scatter_check(node, shape)
    if m == 0:
        return "index rows of length 0 (every update lands on the whole output)"
    reason = _work_reason(_prod(shape), k, "index rows")
    if reason is None and node.inputs[0].value is not None:
        return runs_reason(_scatter_cells(node, shape, m), "indices' offsets")
    return reason or _exact_reason(max(shape[:m]), "an output dimension of")


def _scatter_taichi(node, io):
    shape = tuple(node.outputs[0].shape)
    k, m, s = _scatter_check(node, shape)
    if node.inputs[0].value is not None:
        targets = ConstantIds(_scatter_cells(node, shape, m))
    else:
        strides = [_prod(shape[d + 1:m]) for d in range(m)]
        targets = RuntimeOffsets(io.inputs[0], m, strides)
    return GatherSumStep(targets, io.inputs[1], io.outputs[0], k, s)


def _scatter_index_inputs(node):
    shape = node.inputs[2].value
    if shape is None:
        return {}
    return {0: _scatter_range(node, _scatter_shape(node, shape))}


SCATTER_ND = register_op(OpDef(
    name="SCATTER_ND", infer=_infer_scatter, reference=_reference_scatter,
    taichi=_scatter_taichi, supports=_scatter_supports, fusion=Fusion(stores_once=True),
    index_inputs=_scatter_index_inputs, min_inputs=3, max_inputs=3))


# -- SEGMENT_SUM ------------------------------------------------------------------------------
def _segment_inputs(node):
    data = node.inputs[0]
    if data.rank < 1:
        raise node.fail(f"data '{data.name}' must have rank >= 1, has shape {list(data.shape)}")
    _require_summable(node, data, "data")
    _require_same_type(node, data, "data")
    return data


def _segment_count(node, ids, at_prepare: bool) -> int:
    """Rows of SEGMENT_SUM's output: the last id + 1, after LiteRT's checks (the ids start at 0
    and rise by 0 or 1)."""
    ids = np.asarray(ids, np.int64).reshape(-1)
    if ids.size == 0:
        return 0
    steps = np.diff(ids)
    bad = np.flatnonzero((steps != 0) & (steps != 1)) + 1
    message = None
    if ids[0] != 0:
        message = f"the first segment id is {int(ids[0])}; segment ids start at 0"
    elif bad.size:
        i = int(bad[0])
        message = (f"segment id {int(ids[i])} at [{i}] follows {int(ids[i - 1])}; sorted segment "
                   "ids rise by 0 or 1 (LiteRT refuses gaps)")
    if message is not None:
        raise node.fail(message) if at_prepare else invoke_error(node, message)
    return int(ids[-1]) + 1


def _infer_segment_sum(node):
    data = _segment_inputs(node)
    ids = _require_int32(node, 1, "the segment ids", rank=1)
    if ids.shape[0] != data.shape[0]:
        raise node.fail(f"segment ids '{ids.name}' have {ids.shape[0]} entries; data "
                        f"'{data.name}' has {data.shape[0]} rows")
    rows = _segment_count(node, node.input_value(1, "the segment ids"), at_prepare=True)
    return [(rows,) + tuple(data.shape[1:])]


def _reference_segment_sum(node, inputs):
    data, ids = np.asarray(inputs[0]), np.asarray(inputs[1]).astype(np.int64)
    rows = _segment_count(node, ids, at_prepare=False)
    out = np.zeros((rows,) + data.shape[1:], data.dtype)
    np.add.at(out, ids, data)           # in row order, as LiteRT's loop
    return [out]


@ti.data_oriented
class SegmentSumStep:
    """One thread per output element (s, j): data rows starts[s] .. starts[s + 1] - 1 summed
    in order (constant sorted ids)."""

    def __init__(self, starts, data, out):
        self.starts, self.data, self.out = RunTable(starts), data, out
        self.S = max(_prod(data.shape[1:]), 1)
        self.n = max(out.size, 1)

    @ti.func
    def run(self, arena: ti.template(), weights: ti.template(), io: ti.template()):
        for f in range(self.n):
            s = f // self.S
            j = f % self.S
            acc = 0.0
            for r in range(self.starts.at(s), self.starts.at(s + 1)):
                acc += self.data.load(arena, weights, io, r * self.S + j)
            self.out.store(arena, io, f, acc)


def _segment_starts(node):
    """The first data row of every segment, and the row count after the last."""
    ids = np.asarray(node.input_value(1, "the segment ids"), np.int64).reshape(-1)
    return np.searchsorted(ids, np.arange(int(ids[-1]) + 2), side="left")


def _segment_sum_supports(node):
    return runs_reason(_segment_starts(node), "segment starts")


SEGMENT_SUM = register_op(OpDef(
    name="SEGMENT_SUM", infer=_infer_segment_sum, reference=_reference_segment_sum,
    taichi=lambda node, io: SegmentSumStep(arithmetic_runs(_segment_starts(node)), io.inputs[0],
                                           io.outputs[0]),
    supports=_segment_sum_supports, fusion=Fusion(stores_once=True), min_inputs=2, max_inputs=2))


# -- UNSORTED_SEGMENT_SUM ---------------------------------------------------------------------
def _num_segments(node) -> int:
    spec = _require_int32(node, 2, "num_segments")
    if spec.shape not in ((), (1,)):
        raise node.fail(f"num_segments '{spec.name}' must hold one value (shape [] or [1]), has "
                        f"shape {list(spec.shape)}")
    n = int(np.asarray(node.input_value(2, "num_segments")).reshape(-1)[0])
    if n < 0:
        raise node.fail(f"num_segments is {n}; it must be >= 0")
    return n


def _unsorted_inputs(node):
    data = _segment_inputs(node)
    ids = _require_int32(node, 1, "the segment ids")
    if not 1 <= ids.rank <= data.rank or tuple(data.shape[:ids.rank]) != tuple(ids.shape):
        raise node.fail(f"segment ids '{ids.name}' {list(ids.shape)} must have the leading shape "
                        f"of data '{data.name}' {list(data.shape)} (rank >= 1)")
    return data, ids


def _check_segment_ids(node, n: int, at_prepare=False):
    """Ids below n; negative ones are dropped (LiteRT), so only the top is checked."""
    def check(ids):
        ids = np.asarray(ids)
        bad = ids >= n
        if bad.any():
            where = tuple(int(c) for c in np.argwhere(bad)[0])
            message = (f"segment id {int(ids[where])} at {list(where)} is not below "
                       f"num_segments {n}")
            raise node.fail(message) if at_prepare else invoke_error(node, message)
    return check


def _infer_unsorted(node):
    data, ids = _unsorted_inputs(node)
    n = _num_segments(node)
    if ids.value is not None:
        _check_segment_ids(node, n, at_prepare=True)(ids.value)
    return [(n,) + tuple(data.shape[ids.rank:])]


def _reference_unsorted(node, inputs):
    data, ids = np.asarray(inputs[0]), np.asarray(inputs[1]).astype(np.int64)
    n = int(np.asarray(inputs[2]).reshape(-1)[0])
    _check_segment_ids(node, n)(ids)
    rows = data.reshape((ids.size,) + data.shape[ids.ndim:])
    ids = ids.reshape(-1)
    kept = ids >= 0
    out = np.zeros((n,) + rows.shape[1:], data.dtype)
    np.add.at(out, ids[kept], rows[kept])      # in row-major order, as LiteRT's loop
    return [out]


def _unsorted_supports(node):
    ids = node.inputs[1]
    n_out = _prod(node.outputs[0].shape)
    reason = _work_reason(n_out, _prod(ids.shape), "segment ids")
    if reason is None and ids.value is not None:
        return runs_reason(ids.value, "segment ids")
    return reason or _exact_reason(node.outputs[0].shape[0], "num_segments")


def _unsorted_taichi(node, io):
    ids = node.inputs[1]
    s = _prod(node.inputs[0].shape[ids.rank:])
    return GatherSumStep(_ids_source(node, io, 1), io.inputs[0], io.outputs[0], _prod(ids.shape), s)


def _unsorted_index_inputs(node):
    spec = node.inputs[2]
    if spec is None or spec.value is None:
        return {}
    return {1: _check_segment_ids(node, int(np.asarray(spec.value).reshape(-1)[0]))}


UNSORTED_SEGMENT_SUM = register_op(OpDef(
    name="UNSORTED_SEGMENT_SUM", infer=_infer_unsorted, reference=_reference_unsorted,
    taichi=_unsorted_taichi, supports=_unsorted_supports, fusion=Fusion(stores_once=True),
    index_inputs=_unsorted_index_inputs, min_inputs=3, max_inputs=3))

__all__ = ["EMBEDDING_LOOKUP", "SCATTER_ND", "SEGMENT_SUM", "UNSORTED_SEGMENT_SUM"]
