"""Reductions over constant axes: MEAN, SUM, REDUCE_MAX, REDUCE_MIN, REDUCE_PROD, REDUCE_ANY,
REDUCE_ALL (ReducerOptions.keep_dims).

The axes are the second input, a constant int32 tensor (scalar or 1-D); entries may be
negative (counted from the end) or repeated (counted once). An empty axes tensor reduces
nothing: the output is a copy. A rank-0 input gives a rank-0 copy whatever the axes (LiteRT
skips axis resolution for scalars).

Quantized tensors arrive as float32 real values (the float view), so MEAN/SUM compute the
real mean/sum and the runtime snaps it to the output's grid; LiteRT's int8 kernels requantize
from the input to the output scale in integer/float32 arithmetic (within one unit of this).
"""
from dataclasses import dataclass

import math

import numpy as np

from .base import OpDef, register_op
from .common import normalize_axes
from .kit import activation, nan_max, nan_min, split_count, ti


@dataclass(frozen=True)
class ReducerOptions:
    keep_dims: bool = False


def _parse(opts) -> ReducerOptions:
    return ReducerOptions(bool(opts.KeepDims()))


def _axes(node) -> tuple:
    """The node's reduction axes: sorted, non-negative, without repeats (validated)."""
    spec = node.inputs[1]
    if not np.issubdtype(np.dtype(spec.dtype), np.integer):
        raise node.fail(f"axes must be an int32 tensor, got {np.dtype(spec.dtype).name}")
    if len(spec.shape) > 1:
        raise node.fail(f"axes must be a scalar or 1-D tensor, got shape {list(spec.shape)}")
    value = node.input_value(1, "axes")
    rank = node.inputs[0].rank
    if rank == 0:
        return ()
    return normalize_axes(node, value, rank)


def _infer(node):
    shape = node.inputs[0].shape
    axes = _axes(node)
    if node.options.keep_dims:
        return [tuple(1 if i in axes else d for i, d in enumerate(shape))]
    return [tuple(d for i, d in enumerate(shape) if i not in axes)]


def _lowest(dtype) -> object:
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return False
    if np.issubdtype(dtype, np.integer):
        return np.iinfo(dtype).min
    return np.finfo(dtype).min          # std::numeric_limits<float>::lowest(), LiteRT's init


def _mean(x, axes):
    if np.issubdtype(x.dtype, np.integer):
        # LiteRT's integer MEAN: int64 sum, then C++ division (truncates toward zero).
        total = np.sum(x, axis=axes, dtype=np.int64, keepdims=True)
        count = int(np.prod([x.shape[a] for a in axes], dtype=np.int64))
        if count == 0:
            return np.zeros(total.shape, x.dtype)
        return (np.sign(total) * (np.abs(total) // count)).astype(x.dtype)
    if x.size == 0:
        shape = tuple(1 if i in axes else d for i, d in enumerate(x.shape))
        return np.full(shape, np.nan, x.dtype)   # LiteRT fills an empty MEAN with NaN
    return np.mean(x, axis=axes, dtype=np.float64, keepdims=True).astype(x.dtype)


def _sum(x, axes):
    if np.issubdtype(x.dtype, np.integer) or x.dtype == np.bool_:
        # Accumulate wide, then wrap to the input type as LiteRT's T-typed accumulator does.
        return np.sum(x, axis=axes, dtype=np.int64, keepdims=True).astype(x.dtype)
    return np.sum(x, axis=axes, dtype=np.float64, keepdims=True).astype(x.dtype)


def _highest(dtype) -> object:
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return True
    if np.issubdtype(dtype, np.integer):
        return np.iinfo(dtype).max
    return np.finfo(dtype).max


def _max(x, axes):
    return np.max(x, axis=axes, keepdims=True, initial=_lowest(x.dtype))


def _min(x, axes):
    return np.min(x, axis=axes, keepdims=True, initial=_highest(x.dtype))


def _prod(x, axes):
    if x.dtype == np.bool_:
        return np.all(x, axis=axes, keepdims=True)      # LiteRT's bool product: in && current
    if np.issubdtype(x.dtype, np.integer):
        # a product mod 2^64 reduced mod 2^32 is the int32 product LiteRT's T-typed loop wraps to
        return np.prod(x, axis=axes, dtype=np.int64, keepdims=True).astype(x.dtype)
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        return np.prod(x, axis=axes, dtype=np.float64, keepdims=True).astype(x.dtype)


def _any(x, axes):
    return np.any(x, axis=axes, keepdims=True)


def _all(x, axes):
    return np.all(x, axis=axes, keepdims=True)


# -- Taichi ----------------------------------------------------------------------------------
# One thread per output element; each walks the reduced elements of its input slice serially.
# Dimensions are grouped statically: size-1 dims dropped and neighbours of the same kind
# (kept/reduced) merged when contiguous, so a reduction over H and W of NHWC is one loop.
_SUM, _MEAN, _MAX, _MIN, _PROD = 0, 1, 2, 3, 4
MEAN_CODE, MAX_CODE = _MEAN, _MAX             # for pooling.py's global pools
# REDUCE_ANY / REDUCE_ALL: bool arrives as 0/1, and any of 0/1 values is their maximum, all
# their minimum
_CODES = {"SUM": _SUM, "MEAN": _MEAN, "REDUCE_MAX": _MAX, "REDUCE_MIN": _MIN, "REDUCE_PROD": _PROD,
          "REDUCE_ANY": _MAX, "REDUCE_ALL": _MIN}
_BOOL_REDUCERS = ("REDUCE_ANY", "REDUCE_ALL")


def _merged(dims):
    """[(size, stride)] in row-major order -> the same walk with contiguous neighbours merged."""
    out = []
    for size, stride in dims:
        if size == 1:
            continue
        if out and out[-1][1] == size * stride:
            out[-1] = (out[-1][0] * size, stride)
        else:
            out.append((size, stride))
    return tuple(out)


# Few outputs over a long reduction (a global average pool: 1024 outputs of 49 terms) leave a
# GPU mostly idle with one thread per output: split the reduction into partial results in
# scratch, then combine them (as conv's split-K).
SPLIT_MIN_TERMS = 8


def _reduce_splits(n_out: int, count: int) -> int:
    # at most sqrt(count) shares: the combining thread then walks no more shares than a share
    # has terms (a 128x128 global pool of 16 channels: 128 shares of 128, not 2048 of 8)
    return min(split_count(n_out, count, SPLIT_MIN_TERMS), max(1, math.isqrt(count)))


def reduce_scratch_size(n_out: int, count: int) -> int:
    """Scratch floats a split reduction of n_out outputs over `count` terms needs (0: none)."""
    splits = _reduce_splits(n_out, count)
    return splits * n_out if splits > 1 else 0


def _reduce_scratch(node) -> int:
    n_out = max(int(np.prod(node.outputs[0].shape)), 1)
    return reduce_scratch_size(n_out, int(np.prod(node.inputs[0].shape)) // n_out)


@ti.data_oriented
class ReduceStep:
    """One thread per output walks its reduction; or, split, SPLITS threads per output each walk
    a contiguous share of it into scratch, and one thread per output combines the shares."""

    def __init__(self, code, x, out, axes, scratch=None, act=0):
        self.code, self.x, self.out, self.act = code, x, out, act     # act: a fused activation
        kept = [(d, s) for i, (d, s) in enumerate(zip(x.shape, x.strides)) if i not in axes]
        reduced = [(d, s) for i, (d, s) in enumerate(zip(x.shape, x.strides)) if i in axes]
        kept, reduced = _merged(kept), _merged(reduced)
        # innermost first: the order in which a flat position is peeled into digits
        self.kept_sizes = tuple(d for d, _ in reversed(kept))
        self.kept_strides = tuple(s for _, s in reversed(kept))
        self.red_sizes = tuple(d for d, _ in reversed(reduced))
        self.red_strides = tuple(s for _, s in reversed(reduced))
        self.n_out = max(out.size, 1)
        self.count = int(np.prod([d for d, _ in reduced], dtype=np.int64))
        self.inv_count = 1.0 / max(self.count, 1)
        splits = _reduce_splits(self.n_out, self.count)
        usable = scratch is not None and splits > 1
        self.splits = splits if usable else 1
        self.scratch = scratch if usable else out
        self.chunk = -(-self.count // self.splits)
        self.splits = -(-self.count // self.chunk)      # no empty share: MAX/MIN have no identity

    @ti.func
    def _combine(self, acc, v):
        r = acc + v
        if ti.static(self.code == _MAX):
            r = nan_max(acc, v)             # NaN propagates, as np.max
        elif ti.static(self.code == _MIN):
            r = nan_min(acc, v)
        elif ti.static(self.code == _PROD):
            r = acc * v
        return r

    @ti.func
    def _walk(self, arena: ti.template(), weights: ti.template(), io: ti.template(), base, lo, hi):
        acc = self.x.load(arena, weights, io, base + self._offset(lo, self.red_sizes, self.red_strides))
        for r in range(lo + 1, hi):
            acc = self._combine(acc, self.x.load(arena, weights, io,
                                                 base + self._offset(r, self.red_sizes, self.red_strides)))
        return acc

    @ti.func
    def _offset(self, flat, sizes: ti.template(), strides: ti.template()):
        off = 0
        rem = flat
        for d in ti.static(range(len(sizes))):
            off += (rem % sizes[d]) * strides[d]
            rem = rem // sizes[d]
        return off

    @ti.func
    def run(self, arena: ti.template(), weights: ti.template(), io: ti.template()):
        if ti.static(self.splits == 1):
            for i in range(self.n_out):
                acc = self._walk(arena, weights, io, self._offset(i, self.kept_sizes, self.kept_strides),
                                 0, self.count)
                if ti.static(self.code == _MEAN):
                    acc = acc * self.inv_count
                self.out.store(arena, io, i, activation(acc, self.act))
        else:
            for s, i in ti.ndrange(self.splits, self.n_out):
                lo = s * self.chunk
                self.scratch.store(arena, io, s * self.n_out + i, self._walk(
                    arena, weights, io, self._offset(i, self.kept_sizes, self.kept_strides),
                    lo, ti.min(lo + self.chunk, self.count)))
            for i in range(self.n_out):
                acc = self.scratch.load(arena, weights, io, i)
                for s in range(1, self.splits):
                    acc = self._combine(acc, self.scratch.load(arena, weights, io, s * self.n_out + i))
                if ti.static(self.code == _MEAN):
                    acc = acc * self.inv_count
                self.out.store(arena, io, i, activation(acc, self.act))


def _reduce_taichi(node, io):
    return ReduceStep(_CODES[node.op], io.inputs[0], io.outputs[0], _axes(node), io.scratch)


def _reduce_supports(node):
    if np.dtype(node.inputs[0].dtype) == np.bool_ and node.op not in _BOOL_REDUCERS:
        return "a reduction of a bool tensor"
    return None


def _infer_bool(node):
    """REDUCE_ANY, REDUCE_ALL: bool in and out (LiteRT's PrepareAllOrAny)."""
    for spec, what in ((node.inputs[0], "input"), (node.outputs[0], "output")):
        if spec.dtype is not None and np.dtype(spec.dtype) != np.bool_:
            raise node.fail(f"{what} '{spec.name}' has dtype {np.dtype(spec.dtype).name}; "
                            f"{node.op} takes and gives bool")
    return _infer(node)


def _reducer(name, fn, infer=_infer):
    def reference(node, inputs):
        x = np.asarray(inputs[0])
        axes = _axes(node)
        if not axes:
            return [x.reshape(node.outputs[0].shape).copy()]
        return [fn(x, axes).reshape(node.outputs[0].shape)]

    return register_op(OpDef(name=name, infer=infer, reference=reference, parse=_parse,
                             options_class="ReducerOptions", taichi=_reduce_taichi,
                             supports=_reduce_supports, scratch=_reduce_scratch,
                             min_inputs=2, max_inputs=2))


MEAN = _reducer("MEAN", _mean)
SUM = _reducer("SUM", _sum)
REDUCE_MAX = _reducer("REDUCE_MAX", _max)
REDUCE_MIN = _reducer("REDUCE_MIN", _min)
REDUCE_PROD = _reducer("REDUCE_PROD", _prod)
REDUCE_ANY = _reducer("REDUCE_ANY", _any, infer=_infer_bool)
REDUCE_ALL = _reducer("REDUCE_ALL", _all, infer=_infer_bool)
