"""Layout and value-generating ops: TILE, BROADCAST_TO, FILL, ZEROS_LIKE, RANGE, REVERSE_V2,
MIRROR_PAD (REFLECT, SYMMETRIC), BATCH_TO_SPACE_ND, SPACE_TO_BATCH_ND, MATRIX_DIAG,
MATRIX_SET_DIAG, REVERSE_SEQUENCE.

Every attribute tensor (multiples, shape, dims, axes, paddings, block shape, crops) must be known
at prepare (a constant, or folded from constants and shapes): the output shape depends on it.
RANGE's three scalars likewise, so a RANGE is always folded at prepare. TFLite has no ONES_LIKE
builtin (the schema lists none; the converter writes tf.ones_like as a constant, or as FILL of
SHAPE with the value 1, which is what runs here).

The data movers work on the float view: a quantized tensor keeps its real values and the
runtime's fake-quant snaps the output to its own grid (LiteRT copies the int8 bytes and requires
one quantization for input and output, where the two agree). Padding (SPACE_TO_BATCH_ND) and
ZEROS_LIKE write the real value 0, i.e. the zero point of a quantized output, as LiteRT does.

Semantics beyond LiteRT's kernels (TensorFlow's, tested against numpy): REVERSE_V2 takes any set
of axes (LiteRT: contiguous axes only), BATCH_TO_SPACE_ND / SPACE_TO_BATCH_ND any number M >= 1
of spatial dimensions followed by any number of remaining ones (LiteRT: rank 3 or 4 inputs with
M = rank - 2).

Taichi: TILE, BROADCAST_TO and REVERSE_V2 are affine gathers (ops/shape.py's `Move`, one thread
per output element); MIRROR_PAD, BATCH_TO_SPACE_ND and SPACE_TO_BATCH_ND are one loop over the
output computing the source element per dimension (static block sizes, paddings, crops);
ZEROS_LIKE and FILL (whose value is a run-time scalar: with a constant value it is folded) store
one value everywhere. RANGE has no Taichi part (always folded).

MATRIX_DIAG, MATRIX_SET_DIAG (the main diagonal only, as LiteRT's kernels; TF's _V2/_V3 with
diagonal offsets are other ops): a batch of matrices in the last two dimensions.
MATRIX_DIAG [..., N] -> [..., N, N] with the input on the diagonal and the real value 0
elsewhere; MATRIX_SET_DIAG (input [..., M, N], diagonal [..., min(M, N)]) replaces the
diagonal. float32, int8 (raw or quantized), uint8, int16, int32, int64, bool. Where LiteRT
differs: it writes the raw integer 0 off the diagonal of a quantized MATRIX_DIAG (the real value
-zero_point * scale; here the zero point, the real 0), and moves raw codes where the
quantizations differ (here the real values, re-snapped); it copies bool as 4-byte floats, which
reads past its input (garbage: bool is held to numpy here); it never checks MATRIX_SET_DIAG's
diagonal shape (here: a ModelError unless it is [..., min(M, N)]).

REVERSE_SEQUENCE (ReverseSequenceOptions seq_dim, batch_dim; seq_lengths int32 or int64 with
one entry per batch_dim slice): in slice b along batch_dim, the first seq_lengths[b] entries
along seq_dim are reversed, the rest copied; a length of 0 or 1 copies. seq_dim and batch_dim
must differ and lie in [0, rank) (LiteRT's rule: no negative dims); a length above the
seq_dim's size is a ModelError as in LiteRT (which checks only the first entry, then writes out
of bounds), a negative one too (TensorFlow's rule; LiteRT copies). LiteRT takes float32, uint8,
int16, int32, int64; here also int8 and bool (as numpy).

Taichi: MATRIX_DIAG and MATRIX_SET_DIAG are index maps, one thread per output element
(`DiagStep`); REVERSE_SEQUENCE with constant seq_lengths is one gather (`ReverseSequenceStep`)
whose lengths are compiled into the kernel as arithmetic runs (ops/indexing.py's RunTable;
more than MAX_RUNS runs stay on the CPU). Run-time seq_lengths stay on the CPU: the delegate
carries no int32 tensors.
(No `from __future__ import annotations` here: Taichi reads the ti.func annotations.)
"""
from dataclasses import dataclass

import numpy as np

from .base import Fusion, OpDef, register_op
from .tables import RunTable, arithmetic_runs, runs_reason
from .shape import Move, MoveStep, gather_move
from .kit import ti

_REFLECT, _SYMMETRIC = 0, 1       # tflite.MirrorPadMode
_MODE_NAMES = {_REFLECT: "REFLECT", _SYMMETRIC: "SYMMETRIC"}


def _int_tensor(node, i: int, what: str, shape=None) -> np.ndarray:
    """A constant integer attribute tensor (int32/int64) as int64, its shape checked."""
    spec = node.inputs[i] if i < len(node.inputs) else None
    if spec is None:
        raise node.fail(f"{what} (input {i}) is missing")
    if not np.issubdtype(np.dtype(spec.dtype), np.integer) or spec.is_quantized:
        raise node.fail(f"{what} must be an int32 or int64 tensor, got {np.dtype(spec.dtype).name}")
    if shape is not None and tuple(spec.shape) != tuple(shape):
        raise node.fail(f"{what} must have shape {list(shape)}, has {list(spec.shape)}")
    return np.asarray(node.input_value(i, what), dtype=np.int64).reshape(spec.shape)


def _vector(node, i: int, what: str) -> list:
    spec = node.inputs[i] if i < len(node.inputs) else None
    if spec is not None and len(spec.shape) != 1:
        raise node.fail(f"{what} must be 1-D, has shape {list(spec.shape)}")
    return [int(v) for v in _int_tensor(node, i, what).reshape(-1).tolist()]


def _scalar_input(node, i: int, what: str):
    spec = node.inputs[i]
    if spec is None:
        raise node.fail(f"{what} (input {i}) is missing")
    if int(np.prod(spec.shape, dtype=np.int64)) != 1:
        raise node.fail(f"{what} must be a scalar, has shape {list(spec.shape)}")
    return spec


# -- TILE -------------------------------------------------------------------------------------
def _multiples(node) -> list:
    rank = len(node.inputs[0].shape)
    multiples = _vector(node, 1, "the multiples")
    if len(multiples) != rank:
        raise node.fail(f"the multiples {multiples} must have one entry per input dimension "
                        f"(rank {rank})")
    if any(m < 0 for m in multiples):
        raise node.fail(f"the multiples {multiples} must be >= 0")
    return multiples


def _infer_tile(node):
    return [tuple(d * m for d, m in zip(node.inputs[0].shape, _multiples(node)))]


def _tile(node, inputs):
    return [np.tile(inputs[0], _multiples(node)) if node.inputs[0].shape else inputs[0]]


def _tile_taichi(node, io):
    """Output dimension d as (repeat m_d, position i_d): source i_d, destination m_d*n_d + i_d."""
    x, out = io.inputs[0], io.outputs[0]
    loop, src, dst = [], [], []
    for m, n, s, o in zip(_multiples(node), x.shape, x.strides, out.strides):
        loop += [m, n]
        src += [0, s]
        dst += [n * o, o]
    return MoveStep([Move(x, out, loop, 0, src, 0, dst)])


TILE = register_op(OpDef(name="TILE", infer=_infer_tile, reference=_tile, taichi=_tile_taichi,
                         fusion=Fusion(moves_values=True), min_inputs=2, max_inputs=2))


# -- BROADCAST_TO -----------------------------------------------------------------------------
def _target_shape(node) -> tuple:
    shape = tuple(node.inputs[0].shape)
    target = _vector(node, 1, "the shape")
    if any(d < 0 for d in target):
        raise node.fail(f"the shape {target} has a negative dimension")
    ok = len(target) >= len(shape) and all(
        s == 1 or s == t for s, t in zip(shape, target[len(target) - len(shape):]))
    if not ok:
        raise node.fail(f"the input shape {list(shape)} does not broadcast to {target}")
    return tuple(target)


def _infer_broadcast_to(node):
    return [_target_shape(node)]


def _broadcast_to(node, inputs):
    return [np.array(np.broadcast_to(inputs[0], _target_shape(node)))]


def _broadcast_to_taichi(node, io):
    x, out = io.inputs[0], io.outputs[0]
    lead = out.rank - x.rank
    coefs = [0] * lead + [0 if n == 1 else s for n, s in zip(x.shape, x.strides)]
    return MoveStep([gather_move(x, out, 0, coefs)])


BROADCAST_TO = register_op(OpDef(name="BROADCAST_TO", infer=_infer_broadcast_to,
                                 reference=_broadcast_to, taichi=_broadcast_to_taichi,
                                 min_inputs=2, max_inputs=2))


# -- FILL, ZEROS_LIKE -------------------------------------------------------------------------
@ti.data_oriented
class FillStep:
    """Every output element := a constant, or element 0 of `value_ref` (a run-time scalar)."""

    def __init__(self, out, value: float = 0.0, value_ref=None):
        self.out, self.value, self.value_ref = out, float(value), value_ref
        self.has_value_ref = value_ref is not None

    @ti.func
    def run(self, arena: ti.template(), weights: ti.template(), io: ti.template()):
        for i in range(self.out.size):
            v = self.value
            if ti.static(self.has_value_ref):
                v = self.value_ref.load(arena, weights, io, 0)
            self.out.store(arena, io, i, v)


def _fill_dims(node) -> tuple:
    dims = _vector(node, 0, "the dims")
    if any(d < 0 for d in dims):
        raise node.fail(f"the dims {dims} must be >= 0")
    return tuple(dims)


def _infer_fill(node):
    _scalar_input(node, 1, "the value")
    return [_fill_dims(node)]


def _fill(node, inputs):
    value = np.asarray(inputs[1]).reshape(())
    return [np.full(node.outputs[0].shape, value, dtype=value.dtype)]


def _fill_taichi(node, io):
    if io.inputs[1] is not None:
        return FillStep(io.outputs[0], value_ref=io.inputs[1])
    # a constant value the planner does not pack (the op is normally folded then)
    value = np.asarray(node.input_value(1, "the value")).reshape(-1)[0]
    return FillStep(io.outputs[0], float(value))


FILL = register_op(OpDef(name="FILL", infer=_infer_fill, reference=_fill, taichi=_fill_taichi,
                         min_inputs=2, max_inputs=2))


def _infer_zeros_like(node):
    return [tuple(node.inputs[0].shape)]


def _zeros_like(node, inputs):
    return [np.zeros_like(inputs[0])]


def _zeros_like_taichi(node, io):
    return FillStep(io.outputs[0], 0.0)


ZEROS_LIKE = register_op(OpDef(name="ZEROS_LIKE", infer=_infer_zeros_like, reference=_zeros_like,
                               taichi=_zeros_like_taichi, min_inputs=1, max_inputs=1))


# -- RANGE ------------------------------------------------------------------------------------
_RANGE_DTYPES = (np.dtype(np.int32), np.dtype(np.int64), np.dtype(np.float32))


def _range_args(node) -> tuple:
    """(start, limit, delta) as numpy scalars of the op's dtype, checked as LiteRT does."""
    names = ("start", "limit", "delta")
    specs = [_scalar_input(node, i, n) for i, n in enumerate(names)]
    dtype = np.dtype(specs[0].dtype)
    if dtype not in _RANGE_DTYPES or any(s.is_quantized for s in specs):
        raise node.fail(f"start, limit and delta must be int32, int64 or float32, got {dtype.name}")
    for s, n in zip(specs[1:], names[1:]):
        if np.dtype(s.dtype) != dtype:
            raise node.fail(f"{n} is {np.dtype(s.dtype).name} but start is {dtype.name}")
    start, limit, delta = (np.asarray(node.input_value(i, n), dtype).reshape(())[()]
                           for i, n in enumerate(names))
    if delta == 0:
        raise node.fail("delta must not be 0")
    if (start > limit and delta > 0) or (start < limit and delta < 0):
        raise node.fail(f"delta {delta} never takes start {start} to limit {limit}")
    return start, limit, delta


def _range_size(start, limit, delta) -> int:
    """LiteRT's count: ceil(|limit - start| / |delta|), in float32 for float ranges."""
    if isinstance(start, np.floating):
        with np.errstate(over="ignore"):
            return int(np.ceil(np.abs((limit - start) / delta)))
    span, step = abs(int(limit) - int(start)), abs(int(delta))
    return (span + step - 1) // step


def _infer_range(node):
    return [(_range_size(*_range_args(node)),)]


def _range(node, inputs):
    start, limit, delta = _range_args(node)
    n = _range_size(start, limit, delta)
    if isinstance(start, np.floating):
        # LiteRT accumulates (value += delta): a running float32 sum, not start + i * delta
        steps = np.full(n, delta, np.float32)
        if n:
            steps[0] = start
        return [np.cumsum(steps, dtype=np.float32)]
    return [(int(start) + np.arange(n, dtype=np.int64) * int(delta)).astype(start.dtype)]


RANGE = register_op(OpDef(name="RANGE", infer=_infer_range, reference=_range,
                          min_inputs=3, max_inputs=3))


# -- REVERSE_V2 -------------------------------------------------------------------------------
def _reverse_axes(node) -> tuple:
    rank = len(node.inputs[0].shape)
    axes = _vector(node, 1, "the axes")
    for a in axes:
        if not -rank <= a < rank:
            raise node.fail(f"axis {a} is out of range for rank {rank} "
                            f"(valid: {-rank}..{rank - 1})")
    norm = [a % rank for a in axes]
    if len(set(norm)) != len(norm):
        raise node.fail(f"the axes {axes} name a dimension more than once")
    return tuple(sorted(norm))


def _infer_reverse(node):
    _reverse_axes(node)
    return [tuple(node.inputs[0].shape)]


def _reverse(node, inputs):
    axes = _reverse_axes(node)
    return [np.flip(inputs[0], axes) if axes else inputs[0]]


def _reverse_taichi(node, io):
    x = io.inputs[0]
    axes = _reverse_axes(node)
    base = sum((x.shape[a] - 1) * x.strides[a] for a in axes)
    coefs = [-s if d in axes else s for d, s in enumerate(x.strides)]
    return MoveStep([gather_move(x, io.outputs[0], base, coefs)])


REVERSE_V2 = register_op(OpDef(name="REVERSE_V2", infer=_infer_reverse, reference=_reverse,
                               taichi=_reverse_taichi, min_inputs=2, max_inputs=2))


# -- MIRROR_PAD -------------------------------------------------------------------------------
@dataclass(frozen=True)
class MirrorPadOptions:
    mode: int = _REFLECT


def _parse_mirror_pad(opts) -> MirrorPadOptions:
    return MirrorPadOptions(int(opts.Mode()))


def _mirror_paddings(node) -> list:
    """[(before, after)] per dimension, checked: REFLECT repeats no edge, so it pads at most
    size - 1; SYMMETRIC at most size."""
    mode = node.options.mode
    if mode not in _MODE_NAMES:
        raise node.fail(f"unknown mode {mode} (REFLECT = 0, SYMMETRIC = 1)")
    shape = node.inputs[0].shape
    rank = len(shape)
    pads = _int_tensor(node, 1, "the paddings", (rank, 2)).tolist()
    if any(p < 0 for pair in pads for p in pair):
        raise node.fail(f"negative padding in {pads}")
    offset = 1 if mode == _REFLECT else 0
    for d, (n, (lo, hi)) in enumerate(zip(shape, pads)):
        if max(lo, hi) > n - offset:
            raise node.fail(f"{_MODE_NAMES[mode]} padding {[lo, hi]} of dimension {d} is larger "
                            f"than its size {n}{' - 1' if offset else ''} allows")
    return [(int(lo), int(hi)) for lo, hi in pads]


def _infer_mirror_pad(node):
    return [tuple(n + lo + hi for n, (lo, hi) in zip(node.inputs[0].shape, _mirror_paddings(node)))]


def _mirror_pad(node, inputs):
    pads = _mirror_paddings(node)
    mode = "reflect" if node.options.mode == _REFLECT else "symmetric"
    return [np.pad(inputs[0], pads, mode=mode) if pads else inputs[0]]


@ti.data_oriented
class MirrorPadStep:
    """One thread per output element; per padded dimension, a position before the input
    mirrors to -i (REFLECT) or -i - 1 (SYMMETRIC), one after it to 2n - 2 - i or 2n - 1 - i
    (the paddings are checked to need one reflection at most)."""

    def __init__(self, x, out, pads, mode):
        self.x, self.out = x, out
        self.lo = tuple(lo for lo, _ in pads)
        self.padded = tuple(lo > 0 or hi > 0 for lo, hi in pads)
        self.shift = 0 if mode == _REFLECT else 1
        self.loop = out.shape or (1,)
        self.rank = out.rank

    @ti.func
    def run(self, arena: ti.template(), weights: ti.template(), io: ti.template()):
        for I in ti.grouped(ti.ndrange(*self.loop)):
            src = 0
            for d in ti.static(range(self.rank)):
                i = I[d] - self.lo[d]
                if ti.static(self.padded[d]):
                    n = self.x.shape[d]
                    if i < 0:
                        i = -i - self.shift
                    if i >= n:
                        i = 2 * n - 2 + self.shift - i
                src += i * self.x.strides[d]
            self.out.store(arena, io, self.out.flat_index(I), self.x.load(arena, weights, io, src))


def _mirror_pad_taichi(node, io):
    return MirrorPadStep(io.inputs[0], io.outputs[0], _mirror_paddings(node), node.options.mode)


MIRROR_PAD = register_op(OpDef(name="MIRROR_PAD", infer=_infer_mirror_pad, reference=_mirror_pad,
                               parse=_parse_mirror_pad, options_class="MirrorPadOptions",
                               taichi=_mirror_pad_taichi, min_inputs=2, max_inputs=2))


# -- BATCH_TO_SPACE_ND / SPACE_TO_BATCH_ND ----------------------------------------------------
# An input [batch] + spatial (M dims) + remaining. SPACE_TO_BATCH_ND pads the spatial dims, cuts
# each into blocks of block_shape[i] and moves the position inside the block to the batch:
# out[(k_1..k_M) * batch + b, q_1..q_M, r] = padded[b, q_1*b_1 + k_1, .., q_M*b_M + k_M, r]
# with (k_1..k_M) flattened row-major. BATCH_TO_SPACE_ND is its inverse, then crops.
def _block_args(node, what: str) -> tuple:
    """(block_shape, [(before, after)] per spatial dim) of either op, checked."""
    shape = node.inputs[0].shape
    block = _vector(node, 1, "the block shape")
    m = len(block)
    if m < 1:
        raise node.fail("the block shape is empty")
    if len(shape) < m + 1:
        raise node.fail(f"the input shape {list(shape)} has no batch dimension plus {m} spatial "
                        f"dimensions for the block shape {block}")
    if any(b < 1 for b in block):
        raise node.fail(f"the block shape {block} must be >= 1")
    pairs = _int_tensor(node, 2, what, (m, 2)).tolist()
    if any(p < 0 for pair in pairs for p in pair):
        raise node.fail(f"negative {what[4:]} in {pairs}")
    return block, [(int(lo), int(hi)) for lo, hi in pairs]


def _split_shape(shape, m: int) -> tuple:
    return shape[0], tuple(shape[1:1 + m]), tuple(shape[1 + m:])


def _infer_space_to_batch(node):
    block, pads = _block_args(node, "the paddings")
    batch, spatial, rest = _split_shape(node.inputs[0].shape, len(block))
    out = []
    for d, (n, b, (lo, hi)) in enumerate(zip(spatial, block, pads)):
        if (n + lo + hi) % b:
            raise node.fail(f"spatial dimension {d + 1}: size {n} padded by {[lo, hi]} is not a "
                            f"multiple of the block size {b}")
        out.append((n + lo + hi) // b)
    return [(batch * int(np.prod(block)),) + tuple(out) + rest]


def _space_to_batch(node, inputs):
    block, pads = _block_args(node, "the paddings")
    m = len(block)
    x = np.pad(inputs[0], [(0, 0)] + pads + [(0, 0)] * (inputs[0].ndim - 1 - m))
    batch, spatial, rest = _split_shape(x.shape, m)
    split = [batch]
    for n, b in zip(spatial, block):
        split += [n // b, b]
    y = x.reshape(split + list(rest))
    perm = ([2 + 2 * i for i in range(m)] + [0] + [1 + 2 * i for i in range(m)]
            + list(range(1 + 2 * m, y.ndim)))
    return [y.transpose(perm).reshape(node.outputs[0].shape)]


def _infer_batch_to_space(node):
    block, crops = _block_args(node, "the crops")
    batch, spatial, rest = _split_shape(node.inputs[0].shape, len(block))
    count = int(np.prod(block))
    if batch % count:
        raise node.fail(f"the batch {batch} is not a multiple of the block shape's product "
                        f"{count} ({block})")
    out = []
    for d, (n, b, (lo, hi)) in enumerate(zip(spatial, block, crops)):
        if lo + hi > n * b:
            raise node.fail(f"spatial dimension {d + 1}: crops {[lo, hi]} exceed its size {n * b} "
                            f"after the block")
        out.append(n * b - lo - hi)
    return [(batch // count,) + tuple(out) + rest]


def _batch_to_space(node, inputs):
    block, crops = _block_args(node, "the crops")
    m = len(block)
    x = inputs[0]
    batch, spatial, rest = _split_shape(x.shape, m)
    y = x.reshape(list(block) + [batch // int(np.prod(block))] + list(spatial) + list(rest))
    perm = [m]
    for i in range(m):
        perm += [m + 1 + i, i]
    perm += list(range(2 * m + 1, y.ndim))
    y = y.transpose(perm).reshape([batch // int(np.prod(block))]
                                  + [n * b for n, b in zip(spatial, block)] + list(rest))
    index = (slice(None),) + tuple(slice(lo, n * b - hi) for n, b, (lo, hi)
                                   in zip(spatial, block, crops))
    return [y[index]]


@ti.data_oriented
class BlockStep:
    """One thread per output element of SPACE_TO_BATCH_ND (to_batch) or BATCH_TO_SPACE_ND.

    to_batch: output (o_b, q, r) with o_b = k * B + b; the padded position q_i*b_i + k_i minus
    the padding before is the input's, or outside it: the real value 0.
    to space: output (b, o, r); p_i = o_i + crop_i = s_i*b_i + k_i; input (k * B_out + b, s, r).
    k is the flattened position inside the block (row-major over block_shape)."""

    def __init__(self, x, out, block, before, to_batch: bool):
        self.x, self.out, self.to_batch = x, out, bool(to_batch)
        self.block = tuple(int(b) for b in block)
        self.before = tuple(int(v) for v in before)      # paddings (to_batch) or crops before
        self.m = len(self.block)
        self.batch = out.shape[0] if not to_batch else x.shape[0]   # the smaller batch
        # row-major strides of the block position k
        kstr, acc = [], 1
        for b in reversed(self.block):
            kstr.append(acc)
            acc *= b
        self.kstrides = tuple(reversed(kstr))
        self.rank = out.rank

    @ti.func
    def run(self, arena: ti.template(), weights: ti.template(), io: ti.template()):
        for I in ti.grouped(ti.ndrange(*self.out.shape)):
            src = 0
            inside = 1
            if ti.static(self.to_batch):
                k = I[0] // self.batch
                src = (I[0] % self.batch) * self.x.strides[0]
                for i in ti.static(range(self.m)):
                    ki = (k // self.kstrides[i]) % self.block[i]
                    p = I[1 + i] * self.block[i] + ki - self.before[i]
                    # plain branches: GLSL (OpenGL/GLES) rejects & between comparisons
                    if p < 0:
                        inside = 0
                    if p >= self.x.shape[1 + i]:
                        inside = 0
                    src += p * self.x.strides[1 + i]
            else:
                k = 0
                for i in ti.static(range(self.m)):
                    p = I[1 + i] + self.before[i]
                    k += (p % self.block[i]) * self.kstrides[i]
                    src += (p // self.block[i]) * self.x.strides[1 + i]
                src += (k * self.batch + I[0]) * self.x.strides[0]
            for d in ti.static(range(1 + self.m, self.rank)):
                src += I[d] * self.x.strides[d]
            v = 0.0
            if inside != 0:
                v = self.x.load(arena, weights, io, src)
            self.out.store(arena, io, self.out.flat_index(I), v)


def _space_to_batch_taichi(node, io):
    block, pads = _block_args(node, "the paddings")
    return BlockStep(io.inputs[0], io.outputs[0], block, [lo for lo, _ in pads], True)


def _batch_to_space_taichi(node, io):
    block, crops = _block_args(node, "the crops")
    return BlockStep(io.inputs[0], io.outputs[0], block, [lo for lo, _ in crops], False)


SPACE_TO_BATCH_ND = register_op(OpDef(name="SPACE_TO_BATCH_ND", infer=_infer_space_to_batch,
                                      reference=_space_to_batch, taichi=_space_to_batch_taichi,
                                      min_inputs=3, max_inputs=3))
BATCH_TO_SPACE_ND = register_op(OpDef(name="BATCH_TO_SPACE_ND", infer=_infer_batch_to_space,
                                      reference=_batch_to_space, taichi=_batch_to_space_taichi,
                                      min_inputs=3, max_inputs=3))


# -- MATRIX_DIAG / MATRIX_SET_DIAG ------------------------------------------------------------
_DIAG_DTYPES = tuple(np.dtype(t) for t in (np.float32, np.int8, np.uint8, np.int16, np.int32,
                                            np.int64, np.bool_))


def _same_types(node, specs, what: str):
    """Every spec of one dtype from _DIAG_DTYPES, quantized alike (LiteRT: output = input)."""
    for spec in specs:
        if spec.dtype is None or np.dtype(spec.dtype) not in _DIAG_DTYPES:
            name = np.dtype(spec.dtype).name if spec.dtype is not None else "opaque"
            raise node.fail(f"tensor '{spec.name}' has dtype {name}; {what} takes float32, int8, "
                            "uint8, int16, int32, int64 or bool")
    kinds = {(np.dtype(s.dtype), s.is_quantized) for s in specs}
    if len(kinds) > 1:
        raise node.fail("inputs and output must have one dtype, got " + ", ".join(
            f"'{s.name}' {'quantized ' if s.is_quantized else ''}{np.dtype(s.dtype).name}"
            for s in specs))


def _infer_matrix_diag(node):
    x = node.inputs[0]
    _same_types(node, [x, node.outputs[0]], "MATRIX_DIAG")
    if x.rank < 1:
        raise node.fail(f"the diagonal '{x.name}' must have rank >= 1, has shape {list(x.shape)}")
    return [tuple(x.shape) + (x.shape[-1],)]


def _matrix_diag(node, inputs):
    d = np.asarray(inputs[0])
    n = d.shape[-1]
    out = np.zeros(d.shape + (n,), d.dtype)
    out[..., np.arange(n), np.arange(n)] = d
    return [out]


def _set_diag_shapes(node) -> tuple:
    """(input shape, diagonal length): TensorFlow's rule, diagonal [..., min(M, N)]."""
    x, d = node.inputs[0], node.inputs[1]
    if x.rank < 2:
        raise node.fail(f"input '{x.name}' must have rank >= 2, has shape {list(x.shape)}")
    k = min(x.shape[-2:])
    want = tuple(x.shape[:-2]) + (k,)
    if tuple(d.shape) != want:
        raise node.fail(f"diagonal '{d.name}' has shape {list(d.shape)}; input {list(x.shape)} "
                        f"needs {list(want)}")
    return tuple(x.shape), k


def _infer_matrix_set_diag(node):
    _same_types(node, [node.inputs[0], node.inputs[1], node.outputs[0]], "MATRIX_SET_DIAG")
    return [_set_diag_shapes(node)[0]]


def _matrix_set_diag(node, inputs):
    _, k = _set_diag_shapes(node)
    out = np.array(inputs[0], copy=True)
    out[..., np.arange(k), np.arange(k)] = inputs[1]
    return [out]


@ti.data_oriented
class DiagStep:
    """One thread per output element of a batch of [rows, cols] matrices: the diagonal's entry
    where row == col, else the base matrix's element (MATRIX_SET_DIAG) or the real 0."""

    def __init__(self, diag, out, base=None):
        self.diag, self.out, self.base = diag, out, base
        self.has_base = base is not None
        self.rows, self.cols = out.shape[-2], out.shape[-1]
        self.k = min(self.rows, self.cols)          # diagonal entries per matrix

    @ti.func
    def run(self, arena: ti.template(), weights: ti.template(), io: ti.template()):
        for f in range(self.out.size):
            col = f % self.cols
            row = (f // self.cols) % self.rows
            v = 0.0
            if ti.static(self.has_base):
                v = self.base.load(arena, weights, io, f)
            if row == col:
                v = self.diag.load(arena, weights, io, f // (self.rows * self.cols) * self.k + row)
            self.out.store(arena, io, f, v)


def _matrix_diag_taichi(node, io):
    return DiagStep(io.inputs[0], io.outputs[0])


def _matrix_set_diag_taichi(node, io):
    return DiagStep(io.inputs[1], io.outputs[0], base=io.inputs[0])


MATRIX_DIAG = register_op(OpDef(name="MATRIX_DIAG", infer=_infer_matrix_diag,
                                reference=_matrix_diag, options_class="MatrixDiagOptions",
                                taichi=_matrix_diag_taichi, fusion=Fusion(stores_once=True),
                                min_inputs=1, max_inputs=1))
MATRIX_SET_DIAG = register_op(OpDef(name="MATRIX_SET_DIAG", infer=_infer_matrix_set_diag,
                                    reference=_matrix_set_diag,
                                    options_class="MatrixSetDiagOptions",
                                    taichi=_matrix_set_diag_taichi, fusion=Fusion(stores_once=True),
                                    min_inputs=2, max_inputs=2))


# -- REVERSE_SEQUENCE -------------------------------------------------------------------------
@dataclass(frozen=True)
class ReverseSequenceOptions:
    seq_dim: int = 0
    batch_dim: int = 0


def _parse_reverse_sequence(opts) -> ReverseSequenceOptions:
    return ReverseSequenceOptions(int(opts.SeqDim()), int(opts.BatchDim()))


def _sequence_dims(node) -> tuple:
    """(seq_dim, batch_dim), checked as LiteRT does: distinct, in [0, rank)."""
    rank = node.inputs[0].rank
    seq, batch = node.options.seq_dim, node.options.batch_dim
    for what, d in (("seq_dim", seq), ("batch_dim", batch)):
        if not 0 <= d < rank:
            raise node.fail(f"{what} {d} is out of range for the input's rank {rank} "
                            f"(valid: 0..{rank - 1})")
    if seq == batch:
        raise node.fail(f"seq_dim and batch_dim are both {seq}")
    return seq, batch


def _check_lengths(node, lengths) -> list:
    """The lengths as ints, each in [0, size of seq_dim]."""
    seq, _ = _sequence_dims(node)
    size = node.inputs[0].shape[seq]
    values = [int(v) for v in np.asarray(lengths).reshape(-1).tolist()]
    bad = [v for v in values if not 0 <= v <= size]
    if bad:
        raise node.fail(f"seq_lengths {values} must lie in [0, {size}] (the size of seq_dim "
                        f"{seq}); {bad[0]} does not")
    return values


def _infer_reverse_sequence(node):
    x, lengths, out = node.inputs[0], node.inputs[1], node.outputs[0]
    _, batch = _sequence_dims(node)
    if lengths.dtype is None or np.dtype(lengths.dtype) not in (np.int32, np.int64) \
            or lengths.is_quantized:
        raise node.fail(f"seq_lengths '{lengths.name}' must be int32 or int64")
    if tuple(lengths.shape) != (x.shape[batch],):
        raise node.fail(f"seq_lengths '{lengths.name}' has shape {list(lengths.shape)}; "
                        f"batch_dim {batch} needs [{x.shape[batch]}]")
    if out.dtype is not None and (np.dtype(out.dtype), out.is_quantized) != (
            np.dtype(x.dtype), x.is_quantized):
        raise node.fail(f"output '{out.name}' must have the input's dtype")
    if lengths.value is not None:       # run-time lengths are checked at invoke
        _check_lengths(node, lengths.value)
    return [tuple(x.shape)]


def _reverse_sequence(node, inputs):
    seq, batch = _sequence_dims(node)
    x = np.asarray(inputs[0])
    out = np.array(x, copy=True)
    for b, length in enumerate(_check_lengths(node, inputs[1])):
        index = [slice(None)] * x.ndim
        index[batch] = b
        index[seq] = slice(0, length)
        out[tuple(index)] = np.flip(x[tuple(index)], axis=seq - (batch < seq))
    return [out]


@ti.data_oriented
class ReverseSequenceStep:
    """One thread per output element: position q < L along seq_dim (L its batch slice's
    length, from the compiled table) reads position L - 1 - q, every other reads itself."""

    def __init__(self, x, out, lengths: RunTable, seq: int, batch: int):
        self.x, self.out, self.lengths = x, out, lengths
        self.seq_stride, self.seq_size = x.strides[seq], x.shape[seq]
        self.batch_stride, self.batch_size = x.strides[batch], x.shape[batch]

    @ti.func
    def run(self, arena: ti.template(), weights: ti.template(), io: ti.template()):
        for f in range(self.out.size):
            q = (f // self.seq_stride) % self.seq_size
            length = self.lengths.at((f // self.batch_stride) % self.batch_size)
            src = f
            if q < length:
                src = f + (length - 1 - 2 * q) * self.seq_stride
            self.out.store(arena, io, f, self.x.load(arena, weights, io, src))


def _reverse_sequence_supports(node):
    if node.inputs[1].value is None:
        return "seq_lengths are known only at run time (the delegate carries no int32 tensors)"
    return runs_reason(node.inputs[1].value, "seq_lengths")


def _reverse_sequence_taichi(node, io):
    seq, batch = _sequence_dims(node)
    lengths = _check_lengths(node, node.input_value(1, "seq_lengths"))
    return ReverseSequenceStep(io.inputs[0], io.outputs[0], RunTable(arithmetic_runs(lengths)),
                               seq, batch)


REVERSE_SEQUENCE = register_op(OpDef(name="REVERSE_SEQUENCE", infer=_infer_reverse_sequence,
                                     reference=_reverse_sequence, parse=_parse_reverse_sequence,
                                     options_class="ReverseSequenceOptions",
                                     taichi=_reverse_sequence_taichi,
                                     supports=_reverse_sequence_supports, fusion=Fusion(stores_once=True),
                                     min_inputs=2, max_inputs=2))
