"""BATCH_MATMUL: out[..., i, j] = sum_k lhs[..., i, k] * rhs[..., k, j], with adj_x / adj_y
transposing the last two dimensions of the LHS / RHS first and the batch dimensions (all but
the last two) broadcast as numpy does.

LiteRT's Prepare, enforced here: ranks 2 to 5; float32 x float32, int8 x int8 or int16 x int16
(zero points 0), or float32 x int8 (a hybrid op: a dynamic-range quantized constant RHS);
batch dimensions broadcast; the contracted dimensions agree. On the float view a quantized
operand arrives as real values and the output is snapped to its grid, so the reference is a
float matmul; a hybrid op runs as the float op with its dequantized RHS (as the official GPU
delegate runs it; LiteRT's hybrid kernel quantizes the LHS rows on the fly instead, and in
LiteRT 2.3 gets outputs with two or more batch dimensions wrong). An int8 op with an int32
output (LiteRT: raw integer products, zero points ignored) is refused.

Taichi (delegate): one thread per output element, a serial loop over the contraction; a
constant RHS is packed [..., K, N] (N innermost, so a warp's threads read consecutive
weights); few outputs over a long contraction split it into partial sums in scratch (split-K,
as FULLY_CONNECTED). No `from __future__ import annotations` here: Taichi reads the ti.func
annotations.
"""
from dataclasses import dataclass

import numpy as np

from .base import OpDef, register_op
from .common import broadcast_shapes
from .kit import split_count, ti

MIN_RANK, MAX_RANK = 2, 5           # LiteRT's limits on each operand
SPLIT_K_MIN_TERMS = 64              # split the contraction into chunks of at least this many


@dataclass(frozen=True)
class BatchMatMulOptions:
    adj_x: bool = False
    adj_y: bool = False
    asymmetric_quantize_inputs: bool = False


def _parse(opts) -> BatchMatMulOptions:
    return BatchMatMulOptions(bool(opts.AdjX()), bool(opts.AdjY()),
                              bool(opts.AsymmetricQuantizeInputs()))


_F32, _I8, _I16 = np.dtype(np.float32), np.dtype(np.int8), np.dtype(np.int16)


def _check_dtypes(node):
    lhs, rhs, out = node.inputs[0], node.inputs[1], node.outputs[0]
    if lhs.dtype is None or rhs.dtype is None:
        return
    lt, rt = np.dtype(lhs.dtype), np.dtype(rhs.dtype)
    if not ((lt == rt and lt in (_F32, _I8, _I16)) or (lt == _F32 and rt == _I8)):
        raise node.fail(f"operand dtypes {lt.name} x {rt.name} are not supported (float32, "
                        "int8 or int16 for both, or float32 x int8)")
    if lt == rt == _F32 and out.dtype is not None and np.dtype(out.dtype) != _F32:
        raise node.fail(f"a float32 matmul gives float32, the output is {np.dtype(out.dtype).name}")
    if lt == _F32 and rt == _I8:
        if rhs.quantization is None:
            raise node.fail("the int8 RHS of a float32 x int8 (hybrid) matmul must be quantized")
        if out.dtype is not None and np.dtype(out.dtype) != _F32:
            raise node.fail(f"a float32 x int8 (hybrid) matmul gives float32, the output is "
                            f"{np.dtype(out.dtype).name}")
    if lt == rt and lt in (_I8, _I16):
        if out.dtype is not None and np.dtype(out.dtype) != lt:
            raise node.fail(f"an {lt.name} matmul with an {np.dtype(out.dtype).name} output "
                            f"is not supported (only {lt.name} out)")
        for spec, what in ((lhs, "LHS"), (rhs, "RHS"), (out, "output")):
            q = spec.quantization
            if q is None:
                raise node.fail(f"the {lt.name} {what} '{spec.name}' must be quantized")
            if q.per_channel:
                raise node.fail(f"the {what} '{spec.name}' has per-channel quantization "
                                "(only per-tensor)")
            if lt == _I16 and int(q.zero_point[0]) != 0:
                raise node.fail(f"the int16 {what} '{spec.name}' must have zero point 0")


def _geometry(node):
    """(lhs shape, rhs shape, batch shape, M, K, N), validated."""
    o = node.options
    ls, rs = tuple(node.inputs[0].shape), tuple(node.inputs[1].shape)
    for shape, what in ((ls, "LHS"), (rs, "RHS")):
        if not MIN_RANK <= len(shape) <= MAX_RANK:
            raise node.fail(f"{what} must have rank {MIN_RANK} to {MAX_RANK}, has shape "
                            f"{list(shape)}")
    m, k = (ls[-1], ls[-2]) if o.adj_x else (ls[-2], ls[-1])
    k2, n = (rs[-1], rs[-2]) if o.adj_y else (rs[-2], rs[-1])
    if k != k2:
        raise node.fail(f"the LHS {list(ls)}{' (adj_x)' if o.adj_x else ''} and the RHS "
                        f"{list(rs)}{' (adj_y)' if o.adj_y else ''} contract dimensions of "
                        f"different sizes ({k} and {k2})")
    batch = broadcast_shapes(node, ls[:-2], rs[:-2])
    return ls, rs, batch, m, k, n


def _infer(node):
    _check_dtypes(node)
    _, _, batch, m, _, n = _geometry(node)
    return [batch + (m, n)]


def _reference(node, inputs):
    o = node.options
    a = np.asarray(inputs[0], np.float32)
    b = np.asarray(inputs[1], np.float32)
    if o.adj_x:
        a = np.swapaxes(a, -1, -2)
    if o.adj_y:
        b = np.swapaxes(b, -1, -2)
    return [np.matmul(a, b).astype(np.float32, copy=False)]


# -- Taichi ----------------------------------------------------------------------------------
def _batch_strides(shape, batch):
    """Per output batch dimension (innermost first), the stride of an operand of `shape` in it:
    0 where the operand is broadcast (missing or size 1)."""
    own = shape[:-2]
    mat = shape[-1] * shape[-2]
    strides, acc = [], mat
    for d in reversed(own):
        strides.append(acc if d != 1 else 0)
        acc *= d
    strides += [0] * (len(batch) - len(own))
    return tuple(strides)


def _splits(node) -> int:
    _, _, batch, m, k, n = _geometry(node)
    return split_count(int(np.prod(batch, dtype=np.int64)) * m * n, k, SPLIT_K_MIN_TERMS)


def _scratch(node) -> int:
    splits = _splits(node)
    return splits * int(np.prod(node.outputs[0].shape, dtype=np.int64)) if splits > 1 else 0


def _pack(node, i, value):
    """A constant RHS with adj_y ([..., N, K]) -> [..., K, N]: N innermost, as threads run."""
    if i == 1 and node.options.adj_y:
        return np.ascontiguousarray(np.swapaxes(value, -1, -2))
    return None


@ti.data_oriented
class BatchMatMulStep:
    """out[b, i, j] = sum_k lhs[lb + i*l_i + k*l_k] * rhs[rb + k*r_k + j*r_j], where lb and rb are
    the operands' offsets for output batch b (broadcast dimensions stride 0)."""

    def __init__(self, lhs, rhs, out, geometry, adj_x, rhs_layout_adj, scratch=None, splits=1):
        ls, rs, batch, m, k, n = geometry
        self.lhs, self.rhs, self.out = lhs, rhs, out
        self.m, self.k, self.n = m, k, n
        self.batch = int(np.prod(batch, dtype=np.int64))
        self.batch_sizes = tuple(reversed(batch))          # innermost first
        self.l_batch = _batch_strides(ls, batch)
        self.r_batch = _batch_strides(rs, batch)
        self.l_i, self.l_k = (1, m) if adj_x else (k, 1)
        self.r_k, self.r_j = (1, k) if rhs_layout_adj else (n, 1)
        self.n_out = self.batch * m * n
        usable = scratch is not None and splits > 1
        self.splits = splits if usable else 1
        self.scratch = scratch if usable else out
        self.chunk = -(-k // self.splits)

    @ti.func
    def _offsets(self, b):
        lo, ro, rem = 0, 0, b
        for d in ti.static(range(len(self.batch_sizes))):
            digit = rem % self.batch_sizes[d]
            rem = rem // self.batch_sizes[d]
            lo += digit * self.l_batch[d]
            ro += digit * self.r_batch[d]
        return lo, ro

    @ti.func
    def partial(self, arena: ti.template(), weights: ti.template(), io: ti.template(),
                b, i, j, lo, hi):
        lb, rb = self._offsets(b)
        acc = 0.0
        for k in range(lo, hi):
            acc += (self.lhs.load(arena, weights, io, lb + i * self.l_i + k * self.l_k)
                    * self.rhs.load(arena, weights, io, rb + k * self.r_k + j * self.r_j))
        return acc

    @ti.func
    def run(self, arena: ti.template(), weights: ti.template(), io: ti.template()):
        if ti.static(self.splits == 1):
            for b, i, j in ti.ndrange(self.batch, self.m, self.n):
                self.out.store(arena, io, (b * self.m + i) * self.n + j,
                               self.partial(arena, weights, io, b, i, j, 0, self.k))
        else:
            for s, b, i, j in ti.ndrange(self.splits, self.batch, self.m, self.n):
                lo = s * self.chunk
                flat = (b * self.m + i) * self.n + j
                self.scratch.store(arena, io, s * self.n_out + flat, self.partial(
                    arena, weights, io, b, i, j, lo, ti.min(lo + self.chunk, self.k)))
            for flat in range(self.n_out):
                acc = 0.0
                for s in range(self.splits):
                    acc += self.scratch.load(arena, weights, io, s * self.n_out + flat)
                self.out.store(arena, io, flat, acc)


def _taichi(node, io):
    o = node.options
    packed = node.inputs[1].value is not None       # constants are laid out by _pack
    splits = _splits(node)
    return BatchMatMulStep(io.inputs[0], io.inputs[1], io.outputs[0], _geometry(node),
                           o.adj_x, o.adj_y and not packed,
                           io.scratch if splits > 1 else None, splits)


BATCH_MATMUL = register_op(OpDef(
    name="BATCH_MATMUL", infer=_infer, reference=_reference, parse=_parse,
    options_class="BatchMatMulOptions", taichi=_taichi, pack=_pack, scratch=_scratch,
    min_inputs=2, max_inputs=2))

__all__ = ["BATCH_MATMUL"]
