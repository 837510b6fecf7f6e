""".tflite bytes -> Model IR, validated.

Flatbuffer access goes through the `tflite` schema bindings. Those do no bounds checking, so
every vector length is checked against the file size before it is walked (a mutated length
must not turn into a 2^31-step loop), and any low-level decode failure becomes a ModelError.
Constant buffers are numpy views on the model bytes (an mmap for files), never copies.
"""
from __future__ import annotations

import contextlib
import functools
import importlib
import math
import mmap
import os
import re
import struct
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from tflite_taichi.errors import InputError, ModelError, TensorTooLargeError
from tflite_taichi.tensors import DENSE, SPARSE_CSR, DimMetadata, Quantization, Sparsity, densify

# tflite.TensorType -> numpy dtype (little-endian, as the file stores them)
TENSOR_TYPES = {
    0: np.dtype("<f4"), 1: np.dtype("<f2"), 2: np.dtype("<i4"), 3: np.dtype("u1"),
    4: np.dtype("<i8"), 6: np.dtype("bool"), 7: np.dtype("<i2"), 8: np.dtype("<c8"), 9: np.dtype("i1"),
    10: np.dtype("<f8"), 12: np.dtype("<u8"), 15: np.dtype("<u4"), 16: np.dtype("<u2"),
}
TENSOR_TYPE_NAMES = {0: "FLOAT32", 1: "FLOAT16", 2: "INT32", 3: "UINT8", 4: "INT64", 5: "STRING",
                     6: "BOOL", 7: "INT16", 8: "COMPLEX64", 9: "INT8", 10: "FLOAT64",
                     11: "COMPLEX128", 12: "UINT64", 13: "RESOURCE", 14: "VARIANT", 15: "UINT32",
                     16: "UINT16", 17: "INT4"}
RESOURCE_TYPE = 13
CUSTOM_CODE = 32
MAX_RANK = 16

# Memory: no tensor may take more than `max_tensor_bytes` (Interpreter keyword), by default
# 4x the model file's size (the float views of int8 constants are 4x their bytes) plus
# MEMORY_ALLOWANCE for the activations; and the whole model's tensors together (every subgraph
# prepared, called ones included; constants' float views and everything an invoke computes: the
# reference path keeps every intermediate) with the largest temporary of an op's reference no
# more than TOTAL_FACTOR times that (graph.ModelBudget). Checked on the declared shapes when the file is read, and
# on every shape inferred at allocate_tensors (after resizes and constant folding) and at invoke
# (data-dependent shapes), always before the memory is allocated.
MEMORY_ALLOWANCE = 256 << 20
TOTAL_FACTOR = 16


def default_max_tensor_bytes(file_size: int) -> int:
    return 4 * int(file_size) + MEMORY_ALLOWANCE


def tensor_bytes(shape, dtype, quantization=None) -> int:
    """Bytes a tensor of `shape` takes as this runtime holds it: its float view (float32) if
    it is quantized, else its dtype (1 byte per element for types without a numpy form).
    Exact for any shape (Python integers: no int64 overflow)."""
    count = math.prod(int(d) for d in shape)
    size = 1 if dtype is None else np.dtype(dtype).itemsize
    if quantization is not None and dtype is not None and np.dtype(dtype).kind in "iu":
        size = max(size, 4)
    return count * size


def check_tensor_bytes(limit: Optional[int], what: str, shape, dtype, quantization=None) -> int:
    """The tensor's bytes; a ModelError naming it (`what`) if they exceed `limit`."""
    nbytes = tensor_bytes(shape, dtype, quantization)
    if limit is not None and nbytes > limit:
        raise TensorTooLargeError(f"{what}: shape {list(shape)} would take {nbytes} bytes, above the limit of "
                         f"{limit} bytes per tensor (Interpreter(max_tensor_bytes=...); the default "
                         "is 4x the model file's size + 256 MiB)")
    return nbytes


@dataclass
class Tensor:
    index: int
    name: str
    shape: tuple
    shape_signature: tuple
    type_code: int                       # tflite.TensorType
    dtype: Optional[np.dtype]            # None for types without a numpy form (resource, string)
    buffer: int
    quantization: Optional[Quantization]
    is_variable: bool = False
    has_sparsity: bool = False
    data: Optional[np.ndarray] = None    # constant contents, a view on the model bytes
                                         # (a sparse constant: its densified copy)
    sparsity: Optional[Sparsity] = None  # the sparsity parameters it was stored with
    block_map_stored: bool = False       # they hold a block_map vector (an optional field,
                                         # which LiteRT's tensor details list only when stored)

    @property
    def type_name(self) -> str:
        return TENSOR_TYPE_NAMES.get(self.type_code, f"TYPE{self.type_code}")


@dataclass
class Operator:
    index: int
    name: str                  # BuiltinOperator name, or "CUSTOM:<code>"
    version: int
    inputs: tuple              # tensor indices; -1 marks an omitted optional input
    outputs: tuple
    intermediates: tuple
    options_type: int          # tflite.BuiltinOptions union type (0: none)
    options_table: object      # flatbuffers Table of the builtin options, or None
    custom_options: Optional[bytes]
    options_2_type: int = 0    # tflite.BuiltinOptions2 union type (0: none): the second options
    options_2_table: object = None  # union (StableHLOCompositeOptions, ...), as options_table

    @property
    def builtin_code(self) -> str:
        return self.name


@dataclass
class Subgraph:
    index: int
    name: str
    tensors: list
    operators: list
    inputs: tuple
    outputs: tuple
    max_tensor_bytes: Optional[int] = None  # the memory limit per tensor (see tensor_bytes)


@dataclass
class SignatureDef:
    key: str
    subgraph_index: int
    inputs: dict   # signature name -> tensor index
    outputs: dict


@dataclass
class Model:
    version: int
    description: str
    subgraphs: list
    signatures: list
    size: int = 0
    max_tensor_bytes: Optional[int] = None  # the memory limit per tensor (see tensor_bytes)
    metadata: dict = field(default_factory=dict)   # name -> bytes of the model's metadata entries
    # the buffer behind the constant views: the file's mmap, or the bytes given
    _keepalive: object = field(default=None, repr=False)

    @property
    def main(self) -> Subgraph:
        return self.subgraphs[0]


def _mod(name):
    return importlib.import_module(f"tflite.{name}")


@contextlib.contextmanager
def _numpy_found_once():
    """While the `tflite` bindings import: each of their ~190 modules asks flatbuffers'
    import_numpy(), which searches sys.path for numpy anew (a stat of every entry, each time):
    32-41% of a face model's first result after the import on the lent H100 machine, sampled
    (bench/results/auto_h100.md), for the numpy this process has imported already. Put back
    afterwards."""
    from flatbuffers import compat
    searching = compat.import_numpy
    compat.import_numpy = lambda: np
    try:
        yield
    finally:
        compat.import_numpy = searching


@functools.lru_cache(maxsize=None)
def _schema():
    """The `tflite` schema bindings and the union codes read from them, on first use: the
    package imports its ~200 generated modules at once, a third of `import tflite_taichi`."""
    with _numpy_found_once():
        import tflite
        from tflite.utils import BUILTIN_OPCODE2NAME
    options = {name: code for name, code in vars(tflite.BuiltinOptions).items()
               if not name.startswith("_") and isinstance(code, int)}
    # the schema's second options union (builtin_options_2: StableHLOCompositeOptions and the
    # other StableHLO ops' options); no table name is in both unions
    options_2 = {name: code for name, code in vars(tflite.BuiltinOptions2).items()
                 if not name.startswith("_") and isinstance(code, int) and code}
    return tflite, BUILTIN_OPCODE2NAME, options, options_2


class _Reader:
    """Walks the flatbuffer with every length and index checked against the file.

    file_name: the path the model came from (None for bytes); messages about the file as a
    whole name it, so that a user loading several models knows which one is broken."""

    def __init__(self, buf, max_tensor_bytes=None, file_name=None):
        self.buf = buf
        self.size = len(buf)
        self.max_tensor_bytes = (default_max_tensor_bytes(self.size) if max_tensor_bytes is None
                                 else max_tensor_bytes)
        self.subject = file_name if file_name is not None else "the model"
        self.holding = "the file has" if file_name is not None else "it has"

    def truncated(self, needed: int, what: str = "the flatbuffer", why: str = "") -> ModelError:
        return ModelError(f"{self.subject} is truncated: {what} needs at least {needed} bytes, "
                          f"{self.holding} {self.size}{why}")

    def length(self, n: int, what: str, elem_size: int = 4) -> int:
        if n < 0 or n * elem_size > self.size:
            raise ModelError(f"{what}: vector length {n} does not fit in a {self.size}-byte file")
        return n

    def string(self, raw, what: str) -> str:
        if raw is None:
            return ""
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise ModelError(f"{what}: not valid UTF-8") from None

    def int_vector(self, obj, field_name: str, what: str) -> tuple:
        n = self.length(getattr(obj, field_name + "Length")(), what)
        if n == 0:
            return ()
        return tuple(int(v) for v in getattr(obj, field_name + "AsNumpy")().tolist())


def read_model(source, max_tensor_bytes: Optional[int] = None) -> Model:
    """Parse and validate a model from a path, bytes, bytearray or memoryview.

    max_tensor_bytes: the most bytes one tensor may take (default: 4x the file's size + 256 MiB);
    a tensor declared larger is a ModelError naming it, before anything is allocated."""
    if max_tensor_bytes is not None and (isinstance(max_tensor_bytes, bool) or not isinstance(
            max_tensor_bytes, (int, np.integer)) or max_tensor_bytes <= 0):
        raise InputError(f"max_tensor_bytes must be a positive int (or None), got {max_tensor_bytes!r}")
    keepalive, file_name = None, None
    if isinstance(source, (str, os.PathLike)):
        file_name = os.fspath(source)
        try:
            with open(source, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                if size == 0:
                    raise ModelError(f"{file_name} is empty (0 bytes): not a TFLite model")
                buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except OSError as e:
            raise ModelError(f"cannot read model file {file_name}: {e.strerror}") from None
        keepalive = buf
    elif isinstance(source, (bytes, bytearray, memoryview)):
        buf = bytes(source) if not isinstance(source, bytes) else source
        keepalive = buf
    else:
        raise ModelError(f"model must be a path or bytes, got {type(source).__name__}")
    r = _Reader(buf, None if max_tensor_bytes is None else int(max_tensor_bytes), file_name)
    try:
        model = _parse(r)
    except ModelError:
        raise
    except (IndexError, struct.error, ValueError, OverflowError, TypeError, UnicodeDecodeError,
            AttributeError, RecursionError) as e:
        raise _decode_failure(r, e) from None
    model._keepalive = keepalive
    return model


# Python's struct says how far a read past the end of the buffer wanted to go (the text of
# CPython's unpack_from since 3.7); the flatbuffer bindings read everything through it
_STRUCT_READ_PAST_END = re.compile(r"requires a buffer of at least (\d+) bytes")


def _decode_failure(r: _Reader, error: Exception) -> ModelError:
    """A low-level decode failure in the user's terms. A read past the end of the data is what a
    cut-off download or copy gives: the file is truncated, and how much of it at least is
    missing is known; anything else is a corrupt flatbuffer (the decoder's text for a report)."""
    past_end = _STRUCT_READ_PAST_END.search(str(error)) if isinstance(error, struct.error) else None
    if past_end is not None and int(past_end.group(1)) > r.size:
        return r.truncated(int(past_end.group(1)))
    return ModelError(f"{r.subject} is corrupt: its flatbuffer is malformed (the decoder said: "
                      f"{error})")


def _looks_like(head: bytes) -> str:
    """What a file that is not a TFLite model seems to be, from its first bytes: the usual
    mix-ups (a Git LFS pointer checked out instead of the model, an archive or a Keras file,
    a web page saved by a download) get a hint at what to do."""
    if head.startswith(b"version https://git-lfs"):
        return "it is a Git LFS pointer: fetch the model itself with `git lfs pull`"
    if head.startswith(b"PK\x03\x04"):
        return "it is a zip archive (a MediaPipe .task bundle holds .tflite files inside)"
    if head.startswith(b"\x89HDF\r\n\x1a\n"):
        return "it is an HDF5 file (a Keras model: convert it with tf.lite.TFLiteConverter)"
    if head.lstrip().lower().startswith((b"<!doctype html", b"<html")):
        return "it looks like an HTML page (a download that returned a web page?)"
    if _is_text(head):
        return "it looks like text"
    return f"its identifier bytes are {head[4:8]!r}"


def _is_text(head: bytes) -> bool:
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError as e:
        if e.start < len(head) - 3:     # not a character cut off by the end of `head`
            return False
        text = head[:e.start].decode("utf-8")
    return all(c.isprintable() or c in "\t\r\n" for c in text)


def _check_header(r: _Reader) -> None:
    """The first 8 bytes: the root table's offset, then the identifier TFL3. The identifier is
    checked first: a file of another kind has no meaningful root offset."""
    if r.size < 8:
        raise ModelError(f"{r.subject} is too short to be a TFLite model: {r.size} bytes, a "
                         "flatbuffer has at least 8")
    if r.buf[4:8] != b"TFL3":
        raise ModelError(f"{r.subject} is not a TFLite model: it does not start with a flatbuffer "
                         f"of identifier TFL3 ({_looks_like(bytes(r.buf[:512]))})")
    root = struct.unpack_from("<I", r.buf, 0)[0]
    if root + 4 > r.size:
        raise r.truncated(root + 4, why=" (its root offset points past the end)")


def _parse(r: _Reader) -> Model:
    _check_header(r)
    tflite, builtin_names, _, _ = _schema()
    m = tflite.Model.GetRootAs(r.buf, 0)

    opcodes = []
    for i in range(r.length(m.OperatorCodesLength(), "operator_codes")):
        oc = m.OperatorCodes(i)
        code = max(int(oc.DeprecatedBuiltinCode()), int(oc.BuiltinCode()))
        if code == CUSTOM_CODE:
            name = "CUSTOM:" + r.string(oc.CustomCode(), f"operator_codes[{i}].custom_code")
        else:
            name = builtin_names.get(code, f"UNKNOWN_BUILTIN_{code}")
        opcodes.append((name, max(int(oc.Version()), 1)))

    buffers = [m.Buffers(i) for i in range(r.length(m.BuffersLength(), "buffers"))]
    subgraphs = [_parse_subgraph(r, m.Subgraphs(i), i, opcodes, buffers)
                 for i in range(r.length(m.SubgraphsLength(), "subgraphs"))]
    if not subgraphs:
        raise ModelError("model has no subgraphs")
    signatures = [_parse_signature(r, m.SignatureDefs(i), i, subgraphs)
                  for i in range(r.length(m.SignatureDefsLength(), "signature_defs"))]
    _check_entry_points(subgraphs, signatures)
    for sg in subgraphs:
        sg.max_tensor_bytes = r.max_tensor_bytes
    return Model(version=int(m.Version()), description=r.string(m.Description(), "description"),
                 subgraphs=subgraphs, signatures=signatures, size=r.size,
                 max_tensor_bytes=r.max_tensor_bytes, metadata=_metadata(r, m, buffers))


def _metadata(r: _Reader, m, buffers) -> dict:
    """{name: bytes} of the model's metadata entries ("min_runtime_version", "TFLITE_METADATA",
    ...), each a buffer of the model."""
    entries = {}
    for i in range(r.length(m.MetadataLength(), "metadata")):
        entry, what = m.Metadata(i), f"metadata[{i}]"
        name = r.string(entry.Name(), f"{what}.name")
        index = int(entry.Buffer())
        if not 0 <= index < len(buffers):
            raise ModelError(f"{what} ({name!r}) names buffer {index}, but the model has "
                             f"{len(buffers)} buffers")
        data = _buffer_data(r, buffers[index], f"{what} ({name!r}) buffer {index}")
        entries[name] = b"" if data is None else data.tobytes()
    return entries


def _check_entry_points(subgraphs, signatures):
    """The inputs and outputs of the subgraphs a user calls (the main one, and those of the
    signatures) must be tensors with data: a resource handle or a string there cannot be set
    or read. (Subgraphs called by IF/WHILE may pass resources.)"""
    for index in sorted({0} | {s.subgraph_index for s in signatures}):
        sg = subgraphs[index]
        for kind, indices in (("input", sg.inputs), ("output", sg.outputs)):
            for t in indices:
                tensor = sg.tensors[t]
                if tensor.dtype is None:
                    raise ModelError(f"subgraph {index} {kind} tensor {t} ('{tensor.name}') is of "
                                     f"type {tensor.type_name}, which cannot be set or read as a "
                                     "model input or output")


def _quantization(r: _Reader, q, what: str, rank: int, shape=None) -> Optional[Quantization]:
    if q is None:
        return None
    n_scale = r.length(q.ScaleLength(), f"{what} quantization scale")
    if n_scale == 0:
        return None
    scale = np.array(q.ScaleAsNumpy(), dtype=np.float32)
    n_zp = r.length(q.ZeroPointLength(), f"{what} quantization zero_point", 8)
    zp = np.array(q.ZeroPointAsNumpy(), dtype=np.int64) if n_zp else np.zeros(n_scale, np.int64)
    if zp.size != scale.size:
        if zp.size == 1:
            zp = np.repeat(zp, scale.size)
        else:
            raise ModelError(f"{what}: {scale.size} quantization scales but {zp.size} zero points")
    dim = int(q.QuantizedDimension())
    if scale.size > 1 and not 0 <= dim < max(rank, 1):
        raise ModelError(f"{what}: quantized_dimension {dim} out of range for rank {rank}")
    if scale.size > 1 and shape is not None and rank and shape[dim] != scale.size:
        raise ModelError(f"{what}: {scale.size} per-channel quantization scales, but dimension "
                         f"{dim} of shape {list(shape)} has {shape[dim]} channels")
    if not np.all(np.isfinite(scale)) or np.any(scale <= 0):
        raise ModelError(f"{what}: quantization scales must be finite and positive")
    return Quantization(scale=scale, zero_point=zp, quantized_dimension=dim)


def _buffer_data(r: _Reader, buf_obj, what: str):
    """The raw bytes of a buffer as a uint8 view, or None when empty.

    Large models (> 2 GB) keep buffer contents after the flatbuffer, addressed by an absolute
    (offset, size) pair; small ones inline them as a byte vector.
    """
    offset, size = int(buf_obj.Offset()), int(buf_obj.Size())
    if offset > 1:
        if offset + size > r.size:
            raise r.truncated(offset + size, f"{what} (data at offset {offset}, size {size})")
        return np.frombuffer(r.buf, dtype=np.uint8, count=size, offset=offset)
    n = buf_obj.DataLength()
    if n == 0:
        return None
    r.length(n, what, 1)
    start = buf_obj._tab.Vector(buf_obj._tab.Offset(4))
    if start + n > r.size:
        raise r.truncated(start + n, what)
    return np.frombuffer(r.buf, dtype=np.uint8, count=n, offset=start)


def _parse_tensor(r, t, i, sg_index, buffers) -> Tensor:
    name = r.string(t.Name(), f"subgraph {sg_index} tensor {i} name")
    what = f"tensor {i} ('{name}')"
    shape = r.int_vector(t, "Shape", f"{what} shape")
    if len(shape) > MAX_RANK:
        raise ModelError(f"{what}: rank {len(shape)} is above the supported {MAX_RANK}")
    if any(d < 0 for d in shape):
        raise ModelError(f"{what}: negative dimension in shape {list(shape)}")
    signature = r.int_vector(t, "ShapeSignature", f"{what} shape_signature") or shape
    if len(signature) != len(shape) or any(s != -1 and s != d for s, d in zip(signature, shape)):
        raise ModelError(f"{what}: shape_signature {list(signature)} does not match shape {list(shape)}")
    type_code = int(t.Type())
    if type_code not in TENSOR_TYPE_NAMES:
        raise ModelError(f"{what}: unknown tensor type {type_code}")
    dtype = TENSOR_TYPES.get(type_code)
    b = int(t.Buffer())
    if not 0 <= b < max(len(buffers), 1):
        raise ModelError(f"{what}: buffer index {b} out of range ({len(buffers)} buffers)")
    tensor = Tensor(index=i, name=name, shape=shape, shape_signature=signature,
                    type_code=type_code, dtype=dtype, buffer=b,
                    quantization=_quantization(r, t.Quantization(), what, len(shape), shape),
                    is_variable=bool(t.IsVariable()), has_sparsity=t.Sparsity() is not None)
    if not tensor.has_sparsity:     # (a sparse one: in _read_sparse_constant, before densifying)
        check_tensor_bytes(r.max_tensor_bytes, f"subgraph {sg_index} {what}", shape, dtype,
                           tensor.quantization)
    raw = _buffer_data(r, buffers[b], f"{what} buffer {b}") if buffers else None
    if tensor.has_sparsity:
        _read_sparse_constant(r, t.Sparsity(), tensor, raw, what)
    elif raw is not None:
        if dtype is None:
            raise ModelError(f"{what}: constant data of type {tensor.type_name} is not supported")
        expected = math.prod(shape) * dtype.itemsize
        if raw.size != expected:
            raise ModelError(f"{what}: buffer {b} holds {raw.size} bytes, but shape {list(shape)} "
                             f"of {tensor.type_name} needs {expected}")
        tensor.data = raw.view(dtype).reshape(shape) if raw.size else np.zeros(shape, dtype)
    return tensor


# SparseIndexVector union type -> (table class, element size)
_INDEX_VECTORS = {1: ("Int32Vector", 4), 2: ("Uint16Vector", 2), 3: ("Uint8Vector", 1)}


def _index_vector(r: _Reader, kind: int, table, what: str) -> Optional[np.ndarray]:
    if kind == 0 or table is None:
        return None
    if kind not in _INDEX_VECTORS:
        raise ModelError(f"{what}: unknown index vector type {kind}")
    name, size = _INDEX_VECTORS[kind]
    vec = getattr(_mod(name), name)()
    vec.Init(table.Bytes, table.Pos)
    n = r.length(vec.ValuesLength(), what, size)
    return np.array(vec.ValuesAsNumpy(), dtype=np.int64) if n else np.zeros(0, np.int64)


def _read_sparse_constant(r: _Reader, sp, tensor: Tensor, raw, what: str):
    """A constant stored in the TFLite sparsity format is densified here, once, so that every
    op (FULLY_CONNECTED, DENSIFY, any other) reads an ordinary dense constant; malformed
    metadata is a ModelError naming the tensor (see ops/sparse.py)."""
    if tensor.dtype is None:
        raise ModelError(f"{what}: sparse data of type {tensor.type_name} is not supported")
    dims = []
    for level in range(r.length(sp.DimMetadataLength(), f"{what} sparsity dim_metadata")):
        dm = sp.DimMetadata(level)
        where = f"{what} sparsity dim_metadata[{level}]"
        fmt = int(dm.Format())
        if fmt not in (DENSE, SPARSE_CSR):
            raise ModelError(f"{where}: unknown format {fmt}")
        dims.append(DimMetadata(
            format=fmt, dense_size=int(dm.DenseSize()),
            segments=_index_vector(r, int(dm.ArraySegmentsType()), dm.ArraySegments(), f"{where} array_segments"),
            indices=_index_vector(r, int(dm.ArrayIndicesType()), dm.ArrayIndices(), f"{where} array_indices")))
    sparsity = Sparsity(traversal_order=r.int_vector(sp, "TraversalOrder", f"{what} sparsity traversal_order"),
                        block_map=r.int_vector(sp, "BlockMap", f"{what} sparsity block_map"),
                        dim_metadata=tuple(dims))
    tensor.sparsity = sparsity
    tensor.block_map_stored = not sp.BlockMapIsNone()
    if raw is None:             # no stored values: not a constant (as LiteRT: an empty buffer
        check_tensor_bytes(r.max_tensor_bytes, what, tensor.shape, tensor.dtype, tensor.quantization)
        return                  # is no read-only data); its readers fail as for any unset tensor
    if raw.size % tensor.dtype.itemsize:
        raise ModelError(f"{what}: sparse buffer {tensor.buffer} holds {raw.size} bytes, not a whole "
                         f"number of {tensor.type_name} values")
    dense_bytes = math.prod(tensor.shape) * tensor.dtype.itemsize
    held = tensor_bytes(tensor.shape, tensor.dtype, tensor.quantization)   # its float view
    if held > r.max_tensor_bytes:                       # a mutated shape, not a model
        view = f" ({held} as its float view)" if held != dense_bytes else ""
        raise TensorTooLargeError(
            f"{what}: a sparse tensor of shape {list(tensor.shape)} would densify to {dense_bytes} "
            f"bytes{view} from a {r.size}-byte file, above the limit of {r.max_tensor_bytes} bytes "
            "per tensor (Interpreter(max_tensor_bytes=...); the default is 4x the model file's "
            "size + 256 MiB)")
    tensor.data = densify(tensor.shape, sparsity, raw.view(tensor.dtype), what)
    tensor.data.setflags(write=False)       # read-only, as the other constants' views


def _parse_subgraph(r, sg, sg_index, opcodes, buffers) -> Subgraph:
    what = f"subgraph {sg_index}"
    n_tensors = r.length(sg.TensorsLength(), f"{what} tensors")
    tensors = [_parse_tensor(r, sg.Tensors(i), i, sg_index, buffers) for i in range(n_tensors)]

    def check_indices(indices, where, allow_optional=False):
        for t in indices:
            if allow_optional and t == -1:
                continue
            if not 0 <= t < n_tensors:
                raise ModelError(f"{where}: tensor index {t} out of range ({n_tensors} tensors)")
        return indices

    inputs = check_indices(r.int_vector(sg, "Inputs", f"{what} inputs"), f"{what} inputs")
    outputs = check_indices(r.int_vector(sg, "Outputs", f"{what} outputs"), f"{what} outputs")
    operators = []
    for i in range(r.length(sg.OperatorsLength(), f"{what} operators")):
        o = sg.Operators(i)
        oc = int(o.OpcodeIndex())
        if not 0 <= oc < len(opcodes):
            raise ModelError(f"{what} op #{i}: opcode index {oc} out of range ({len(opcodes)} operator codes)")
        name, version = opcodes[oc]
        where = f"{what} op #{i} ({name})"
        custom = None
        if o.CustomOptionsLength():
            r.length(o.CustomOptionsLength(), f"{where} custom_options", 1)
            custom = bytes(o.CustomOptionsAsNumpy().tobytes())
        operators.append(Operator(
            index=i, name=name, version=version,
            inputs=check_indices(r.int_vector(o, "Inputs", f"{where} inputs"), where, True),
            outputs=check_indices(r.int_vector(o, "Outputs", f"{where} outputs"), where),
            intermediates=r.int_vector(o, "Intermediates", f"{where} intermediates"),
            options_type=int(o.BuiltinOptionsType()), options_table=o.BuiltinOptions(),
            custom_options=custom, options_2_type=int(o.BuiltinOptions2Type()),
            options_2_table=o.BuiltinOptions2()))
    _empty_constants(tensors, operators, inputs)
    sg_ir = Subgraph(index=sg_index, name=r.string(sg.Name(), f"{what} name"), tensors=tensors,
                     operators=operators, inputs=inputs, outputs=outputs)
    _check_graph_order(sg_ir)
    return sg_ir


def _empty_constants(tensors, operators, inputs):
    """A zero-element tensor that nothing writes is a constant with no bytes (an empty axes
    list, say): the converter stores no data for it, and LiteRT treats it as constant."""
    written = set(inputs)
    for op in operators:
        written.update(op.outputs)
    for t in tensors:
        if (t.data is None and t.dtype is not None and not t.is_variable and t.index not in written
                and 0 in t.shape):
            t.data = np.zeros(t.shape, t.dtype)


def _check_graph_order(sg: Subgraph):
    """Every op input must exist before the op runs: a subgraph input, a constant, a variable,
    or the output of an earlier op; and every tensor is written by at most one op."""
    ready = set(sg.inputs)
    ready.update(t.index for t in sg.tensors if t.data is not None or t.is_variable)
    first_writer = {}
    for op in reversed(sg.operators):
        first_writer.update({t: op.index for t in op.outputs})
    produced_by = {}
    for op in sg.operators:
        for t in op.inputs:
            if t != -1 and t not in ready:
                producer = first_writer.get(t)
                later = (f" (written later by op #{producer})" if producer is not None
                         else " (a sparse tensor with no stored values)" if sg.tensors[t].sparsity
                         else " (no op writes it and it is not an input or constant)")
                raise ModelError(f"subgraph {sg.index} op #{op.index} ({op.name}): input tensor {t} "
                                 f"('{sg.tensors[t].name}') is read before it is written{later}")
        for t in op.outputs:
            if t in produced_by:
                raise ModelError(f"subgraph {sg.index} op #{op.index} ({op.name}): tensor {t} "
                                 f"('{sg.tensors[t].name}') is already written by op #{produced_by[t]}")
            if sg.tensors[t].data is not None:
                raise ModelError(f"subgraph {sg.index} op #{op.index} ({op.name}): writes to constant "
                                 f"tensor {t} ('{sg.tensors[t].name}')")
            produced_by[t] = op.index
            ready.add(t)
    for t in sg.outputs:
        if t not in ready:
            raise ModelError(f"subgraph {sg.index}: output tensor {t} ('{sg.tensors[t].name}') "
                             "is never written")


def _parse_signature(r, s, i, subgraphs) -> SignatureDef:
    key = r.string(s.SignatureKey(), f"signature_defs[{i}].signature_key")
    sg_index = int(s.SubgraphIndex())
    if not 0 <= sg_index < len(subgraphs):
        raise ModelError(f"signature '{key}': subgraph index {sg_index} out of range")
    n_tensors = len(subgraphs[sg_index].tensors)

    def tensor_map(n, get, kind):
        out = {}
        for j in range(r.length(n, f"signature '{key}' {kind}")):
            tm = get(j)
            t = int(tm.TensorIndex())
            if not 0 <= t < n_tensors:
                raise ModelError(f"signature '{key}' {kind}: tensor index {t} out of range")
            out[r.string(tm.Name(), f"signature '{key}' {kind} name")] = t
        return out

    return SignatureDef(key=key, subgraph_index=sg_index,
                        inputs=tensor_map(s.InputsLength(), s.Inputs, "inputs"),
                        outputs=tensor_map(s.OutputsLength(), s.Outputs, "outputs"))


_EMPTY_TABLE = None


def _empty_table_bytes() -> bytes:
    """A flatbuffer holding one empty table: options read through it return their defaults."""
    global _EMPTY_TABLE
    if _EMPTY_TABLE is None:
        import flatbuffers
        b = flatbuffers.Builder(16)
        b.StartObject(0)
        b.Finish(b.EndObject())
        _EMPTY_TABLE = bytes(b.Output())
    return _EMPTY_TABLE


def read_options(op: Operator, class_name: str):
    """The builtin options of `op` as the `tflite` class `class_name` (defaults if absent),
    read from builtin_options_2 when `class_name` belongs to that union.

    A model whose options union holds another table type than the op expects is malformed.
    """
    cls = getattr(_mod(class_name), class_name)
    obj = cls()
    _, _, option_types, option_2_types = _schema()
    second = class_name in option_2_types
    table, kind = (op.options_2_table, op.options_2_type) if second else (op.options_table, op.options_type)
    if table is None or kind == 0:
        obj.Init(_empty_table_bytes(), struct.unpack_from("<I", _empty_table_bytes(), 0)[0])
        return obj
    expected = (option_2_types if second else option_types).get(class_name)
    if expected is not None and kind != expected:
        raise ModelError(f"op #{op.index} ({op.name}): builtin options{'_2' if second else ''} "
                         f"are of union type {kind}, expected {class_name} ({expected})")
    obj.Init(table.Bytes, table.Pos)
    return obj
