"""What a tensor is stored as, below every other layer: affine quantization and the TFLite
sparsity format (its types, `densify` and its inverse `sparsify`).

The model reader (model.py) builds these and the float view (quant/) and the ops read them, so
they live here rather than in ops/: nothing in this module imports the pipeline or the ops, and
model.py and quant/ depend on it instead of on ops/ (no import cycle through the ops). ops/base.py and ops/sparse.py
re-export the names, so `from tflite_taichi.ops.sparse import densify` keeps working.

The sparsity format (schema `SparsityParameters`, as LiteRT's FormatConverter reads it): a tensor
of rank r may be cut into blocks along the dimensions `block_map` (increasing), which gives an
"expanded" tensor of rank n = r + len(block_map): dimensions 0..r-1 count blocks (or
elements, where a dimension is not blocked) and r..n-1 index inside a block. `traversal_order`
lists the n expanded dimensions in storage order - the r outer ones first, then the block
ones - and `dim_metadata[level]` describes the level-th dimension of that order: DENSE (all
`dense_size` entries present) or SPARSE_CSR (for each entry of the level above, the indices
`array_indices[array_segments[p]:array_segments[p + 1]]` are present). The buffer holds the
values of the present leaves in that order; block levels are always DENSE. Malformed metadata
(wrong lengths, segments not monotonic, indices out of range, duplicate positions, a value
count that does not match) is a ModelError naming the tensor.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

from tflite_taichi.errors import ModelError


@dataclass(frozen=True)
class Quantization:
    """Affine quantization of a tensor: real = (q - zero_point) * scale.

    `scale` and `zero_point` have one entry (per-tensor) or one per slice along
    `quantized_dimension` (per-channel).
    """

    scale: np.ndarray
    zero_point: np.ndarray
    quantized_dimension: int = 0

    @property
    def per_channel(self) -> bool:
        return self.scale.size > 1

    def broadcastable(self, rank: int):
        """(scale, zero_point) shaped to broadcast against a tensor of `rank` dims."""
        if not self.per_channel:
            return self.scale.reshape(()), self.zero_point.reshape(())
        shape = [1] * rank
        shape[self.quantized_dimension] = -1
        return self.scale.reshape(shape), self.zero_point.reshape(shape)

    def float32_broadcastable(self, rank: int) -> tuple:
        """(scale, zero_point) of broadcastable(rank) as float32, and whether every zero point
        fits in 16 bits; made once per rank (converting them was ~2/3 of (de)quantizing a small
        tensor: a stateful int8 model's variables, every invoke)."""
        found = self._float32_terms.get(rank)
        if found is None:
            scale, zero_point = self.broadcastable(rank)
            found = self._float32_terms[rank] = (scale.astype(np.float32),
                                                 zero_point.astype(np.float32),
                                                 bool(np.all(np.abs(zero_point) < 2**16)))
        return found

    @functools.cached_property
    def _float32_terms(self) -> dict:      # rank -> float32_broadcastable(rank)
        return {}


# -- sparsity ---------------------------------------------------------------------------------
DENSE, SPARSE_CSR = 0, 1            # tflite.DimensionType
FORMAT_NAMES = {DENSE: "DENSE", SPARSE_CSR: "SPARSE_CSR"}


@dataclass(frozen=True)
class DimMetadata:
    """One level of the traversal: DENSE with `dense_size` entries, or SPARSE_CSR with
    `segments` (one more than the entries of the level above) and `indices`."""

    format: int
    dense_size: int = 0
    segments: Optional[np.ndarray] = None
    indices: Optional[np.ndarray] = None


@dataclass(frozen=True)
class Sparsity:
    traversal_order: tuple
    block_map: tuple
    dim_metadata: tuple          # DimMetadata per level (len(traversal_order) of them)

    def details(self) -> dict:
        """As LiteRT's get_tensor_details()['sparsity_parameters']."""
        dims = []
        for md in self.dim_metadata:
            if md.format == DENSE:
                dims.append({"format": DENSE, "dense_size": int(md.dense_size)})
            else:
                dims.append({"format": SPARSE_CSR,
                             "array_segments": np.asarray(md.segments, np.int32),
                             "array_indices": np.asarray(md.indices, np.int32)})
        return {"traversal_order": np.asarray(self.traversal_order, np.int32),
                "block_map": np.asarray(self.block_map, np.int32), "dim_metadata": dims}


def _layout(shape: Sequence[int], sparsity: Sparsity, fail) -> tuple:
    """Checks the structure; returns (expanded shape, level of each expanded dimension)."""
    rank, order, block_map = len(shape), list(sparsity.traversal_order), list(sparsity.block_map)
    n = rank + len(block_map)
    if len(order) != n:
        raise fail(f"traversal_order has {len(order)} entries; a rank-{rank} tensor with "
                   f"{len(block_map)} block dimension(s) needs {n}")
    if len(sparsity.dim_metadata) != n:
        raise fail(f"dim_metadata has {len(sparsity.dim_metadata)} entries, traversal_order {n}")
    if sorted(order[:rank]) != list(range(rank)) or sorted(order[rank:]) != list(range(rank, n)):
        raise fail(f"traversal_order {order} must list dimensions 0..{rank - 1} first, then the "
                   f"block dimensions {rank}..{n - 1}")
    if any(not 0 <= d < rank for d in block_map) or any(a >= b for a, b in zip(block_map, block_map[1:])):
        raise fail(f"block_map {block_map} must hold increasing dimensions of 0..{rank - 1}")
    level_of = {d: level for level, d in enumerate(order)}
    expanded = [int(d) for d in shape] + [0] * len(block_map)
    for b, d in enumerate(block_map):
        md = sparsity.dim_metadata[level_of[rank + b]]
        size = int(md.dense_size)
        if md.format != DENSE:
            raise fail(f"block dimension {rank + b} must be DENSE (LiteRT reads only dense blocks)")
        if size <= 0 or shape[d] % size:
            raise fail(f"block size {size} along dimension {d} does not divide its size {shape[d]}")
        expanded[d] = shape[d] // size
        expanded[rank + b] = size
    return expanded, level_of


def densify(shape: Sequence[int], sparsity: Sparsity, values: np.ndarray, what: str) -> np.ndarray:
    """The dense array of shape `shape` that `values` + `sparsity` encode (vectorised: one pass
    per level). `what` names the tensor in every error."""
    def fail(message):
        return ModelError(f"{what}: sparsity: {message}")

    shape = tuple(int(d) for d in shape)
    expanded, level_of = _layout(shape, sparsity, fail)
    order = sparsity.traversal_order
    coords = []                         # per level, the coordinate of every present entry
    count = 1                           # entries present after the levels walked so far
    for level, md in enumerate(sparsity.dim_metadata):
        size = expanded[order[level]]
        if md.format == DENSE:
            if int(md.dense_size) != size:
                raise fail(f"level {level} is DENSE of size {md.dense_size}, but expanded "
                           f"dimension {order[level]} has {size} entries")
            coords = [np.repeat(c, size) for c in coords] + [np.tile(np.arange(size, dtype=np.int64), count)]
            count *= size
        elif md.format == SPARSE_CSR:
            if md.segments is None or md.indices is None:
                raise fail(f"level {level} is SPARSE_CSR without array_segments/array_indices")
            seg = np.asarray(md.segments, np.int64).reshape(-1)
            idx = np.asarray(md.indices, np.int64).reshape(-1)
            if seg.size != count + 1:
                raise fail(f"level {level}: array_segments has {seg.size} entries, expected "
                           f"{count + 1} (one more than the {count} entries of the level above)")
            if seg[0] != 0 or np.any(np.diff(seg) < 0) or seg[-1] != idx.size:
                raise fail(f"level {level}: array_segments must rise monotonically from 0 to the "
                           f"{idx.size} array_indices (got {_short(seg)})")
            if idx.size and (idx.min() < 0 or idx.max() >= size):
                raise fail(f"level {level}: array_indices must lie in 0..{size - 1} (expanded "
                           f"dimension {order[level]}), got {_short(idx)}")
            coords = [np.repeat(c, np.diff(seg)) for c in coords] + [idx]
            count = int(idx.size)
        else:
            raise fail(f"level {level} has unknown format {md.format}")
    values = np.asarray(values).reshape(-1)
    if values.size != count:
        raise fail(f"the buffer holds {values.size} values, the metadata describes {count}")
    rank = len(shape)
    dense_index = []
    for d in range(rank):
        c = coords[level_of[d]]
        for b, mapped in enumerate(sparsity.block_map):
            if mapped == d:
                c = c * expanded[rank + b] + coords[level_of[rank + b]]
        dense_index.append(c)
    dense = np.zeros(int(np.prod(shape, dtype=np.int64)), dtype=values.dtype)
    if count:
        flat = np.ravel_multi_index(dense_index, shape) if rank else np.zeros(count, np.int64)
        if np.unique(flat).size != count:
            raise fail("two stored values land on the same element")
        dense[flat] = values
    return dense.reshape(shape)


def _short(a: np.ndarray) -> str:
    items = a.tolist()
    return str(items) if len(items) <= 12 else f"[{', '.join(map(str, items[:12]))}, ...]"


def sparsify(dense: np.ndarray, formats: Sequence, block_map: Sequence[int] = (),
             block_size: Sequence[int] = (), traversal_order: Optional[Sequence[int]] = None,
             index_dtype=np.int32):
    """(values, Sparsity) encoding `dense` as TFLite does. `formats`: per level of the
    traversal, "DENSE" or "SPARSE_CSR" (block levels must be DENSE); `block_map`/`block_size`:
    the blocked dimensions and their block sizes (e.g. (1,), (4,) for 1x4 blocks of a matrix);
    `traversal_order`: default 0..n-1. A SPARSE_CSR level keeps an entry only if its sub-block
    holds a non-zero; below it, DENSE levels keep every entry (zeros included). `index_dtype`:
    int32, uint16 or uint8 (one for all levels, or a sequence per level)."""
    dense = np.asarray(dense)
    rank, block_map, block_size = dense.ndim, [int(d) for d in block_map], [int(s) for s in block_size]
    if len(block_map) != len(block_size):
        raise ValueError("block_map and block_size need one entry per blocked dimension")
    n = rank + len(block_map)
    order = list(range(n)) if traversal_order is None else [int(d) for d in traversal_order]
    codes = [f if isinstance(f, int) else {"DENSE": DENSE, "SPARSE_CSR": SPARSE_CSR}[f] for f in formats]
    if len(codes) != n:
        raise ValueError(f"formats needs {n} entries (one per level), got {len(codes)}")
    # expanded tensor: each blocked dimension d split into (d / size, size), block dims last
    split, outer, inner = [], [], []
    for d in range(rank):
        if d in block_map:
            size = block_size[block_map.index(d)]
            if dense.shape[d] % size:
                raise ValueError(f"block size {size} does not divide dimension {d} ({dense.shape[d]})")
            outer.append(len(split))
            split += [dense.shape[d] // size, size]
        else:
            outer.append(len(split))
            split.append(dense.shape[d])
    inner = [outer[d] + 1 for d in block_map]
    expanded = dense.reshape(split).transpose(outer + inner)
    walk = expanded.transpose(order)                  # storage order
    sizes = walk.shape
    nonzero = walk != 0
    dtypes = list(index_dtype) if isinstance(index_dtype, (list, tuple)) else [index_dtype] * n
    paths = np.zeros(1, np.int64)                     # flat position among the levels walked
    metadata = []
    for level in range(n):
        candidates = (paths[:, None] * sizes[level] + np.arange(sizes[level])).reshape(-1)
        if codes[level] == DENSE:
            metadata.append(DimMetadata(DENSE, dense_size=int(sizes[level])))
            paths = candidates
            continue
        keep = nonzero.reshape(sizes[:level + 1] + (-1,)).any(axis=-1).reshape(-1)[candidates]
        keep = keep.reshape(len(paths), sizes[level])
        dtype = np.dtype(dtypes[level])
        indices = np.tile(np.arange(sizes[level]), len(paths))[keep.reshape(-1)]
        segments = np.concatenate([[0], np.cumsum(keep.sum(axis=1))])
        if indices.size and indices.max() > np.iinfo(dtype).max or segments[-1] > np.iinfo(dtype).max:
            raise ValueError(f"level {level}: indices or segments do not fit in {dtype.name}")
        metadata.append(DimMetadata(SPARSE_CSR, segments=segments.astype(dtype), indices=indices.astype(dtype)))
        paths = candidates[keep.reshape(-1)]
    values = walk.reshape(-1)[paths]
    return values, Sparsity(traversal_order=tuple(order), block_map=tuple(block_map),
                            dim_metadata=tuple(metadata))
