"""The one piece of TFLite model metadata the batch runner reads: the normalization of each input.

Models made with TFLite's metadata writers (image classifiers, detectors, segmenters) carry a
"TFLITE_METADATA" entry, a flatbuffer of tflite-support's metadata_schema.fbs (file identifier
"M001"). Its input tensors may hold a NormalizationOptions process unit, `(x - mean) / std` per
channel, which says how to turn decoded pixels into the model's input. That schema's Python
bindings are not in the `tflite` package, so the few tables needed are read here with the
flatbuffers runtime, by field slot (the schema's field order):

    ModelMetadata.subgraph_metadata       slot 3   [SubGraphMetadata]
    SubGraphMetadata.input_tensor_metadata slot 2  [TensorMetadata]
    TensorMetadata.process_units           slot 4  [ProcessUnit]
    ProcessUnit.options (union)            slots 0 (type), 1 (table)   NormalizationOptions = 1
    NormalizationOptions.mean, .std        slots 0, 1   [float]

`normalization_metadata` writes the same tables, for models built with tflite_taichi.builder.
"""
from __future__ import annotations

from typing import Optional, Sequence

import flatbuffers
import numpy as np
from flatbuffers import number_types as N
from flatbuffers.table import Table

METADATA_NAME = "TFLITE_METADATA"
FILE_IDENTIFIER = b"M001"
_NORMALIZATION_OPTIONS = 1          # ProcessUnitOptions union: its first member


class Normalization:
    """`(x - mean) / std`, per channel (a single value applies to every channel)."""

    def __init__(self, mean: Sequence[float], std: Sequence[float]):
        self.mean = np.asarray(mean, np.float32).reshape(-1)
        self.std = np.asarray(std, np.float32).reshape(-1)
        if self.mean.size == 0 or self.std.size == 0:
            raise ValueError("a normalization needs at least one mean and one std")
        if np.any(self.std == 0) or not (np.all(np.isfinite(self.std)) and np.all(np.isfinite(self.mean))):
            raise ValueError(f"a normalization's std must be finite and non-zero, got "
                             f"mean={self.mean.tolist()} std={self.std.tolist()}")

    def apply(self, pixels: np.ndarray) -> np.ndarray:
        """float32 `(pixels - mean) / std` over the last (channel) axis."""
        channels = pixels.shape[-1]
        for what, values in (("mean", self.mean), ("std", self.std)):
            if values.size not in (1, channels):
                raise ValueError(f"the normalization has {values.size} {what} values for "
                                 f"{channels} channels")
        return ((pixels.astype(np.float32) - self.mean) / self.std).astype(np.float32)

    def __eq__(self, other):
        return (isinstance(other, Normalization) and np.array_equal(self.mean, other.mean)
                and np.array_equal(self.std, other.std))

    def __repr__(self):
        return f"Normalization(mean={self.mean.tolist()}, std={self.std.tolist()})"


# -- reading -------------------------------------------------------------------------------------
def _field(table: Table, slot: int) -> int:
    return table.Offset(4 + 2 * slot)


def _tables(buf, table: Table, slot: int) -> list:
    o = _field(table, slot)
    if not o:
        return []
    start = table.Vector(o)
    return [Table(buf, table.Indirect(start + 4 * i)) for i in range(table.VectorLen(o))]


def _floats(table: Table, slot: int) -> np.ndarray:
    o = _field(table, slot)
    if not o:
        return np.zeros(0, np.float32)
    return table.GetVectorAsNumpy(N.Float32Flags, o).astype(np.float32)


def _parse_normalizations(buf: bytes) -> list:
    if len(buf) < 8 or buf[4:8] != FILE_IDENTIFIER:
        raise ValueError("not a metadata flatbuffer (file identifier M001)")
    root = Table(buf, flatbuffers.encode.Get(N.UOffsetTFlags.packer_type, buf, 0))
    subgraphs = _tables(buf, root, 3)
    if not subgraphs:
        return []
    found = []
    for tensor in _tables(buf, subgraphs[0], 2):
        norm = None
        for unit in _tables(buf, tensor, 4):
            o_type = _field(unit, 0)
            kind = unit.Get(N.Uint8Flags, unit.Pos + o_type) if o_type else 0
            o_options = _field(unit, 1)
            if kind == _NORMALIZATION_OPTIONS and o_options:
                options = Table(buf, unit.Indirect(unit.Pos + o_options))
                norm = Normalization(_floats(options, 0), _floats(options, 1))
        found.append(norm)
    return found


def input_normalizations(model) -> tuple:
    """([Normalization or None] per input of the main graph, problem or None), from the model's
    TFLITE_METADATA entry (`model`: a tflite_taichi Model). ([], None) when there is no such
    entry; a malformed one gives ([], why): the metadata is advice, and the batch runner then
    asks for --preprocess and says why."""
    data = model.metadata.get(METADATA_NAME)
    if data is None:
        return [], None
    try:
        return _parse_normalizations(bytes(data)), None
    except Exception as e:     # any malformed flatbuffer (struct.error, IndexError, ...)
        return [], f"its {METADATA_NAME} entry is unreadable ({type(e).__name__}: {e})"


# -- writing (for built models and tests) --------------------------------------------------------
def _vector(b: flatbuffers.Builder, offsets: list) -> int:
    b.StartVector(4, len(offsets), 4)
    for off in reversed(offsets):
        b.PrependUOffsetTRelative(off)
    return b.EndVector()


def _float_vector(b: flatbuffers.Builder, values) -> int:
    values = [float(v) for v in values]
    b.StartVector(4, len(values), 4)
    for v in reversed(values):
        b.PrependFloat32(v)
    return b.EndVector()


def normalization_metadata(per_input: Sequence[Optional[Normalization]]) -> bytes:
    """A TFLITE_METADATA flatbuffer whose main graph's inputs carry these normalizations
    (None: no process unit), as tflite-support's metadata writers write it."""
    b = flatbuffers.Builder(256)
    tensors = []
    for norm in per_input:
        units = None
        if norm is not None:
            mean, std = _float_vector(b, norm.mean), _float_vector(b, norm.std)
            b.StartObject(2)
            b.PrependUOffsetTRelativeSlot(0, mean, 0)
            b.PrependUOffsetTRelativeSlot(1, std, 0)
            options = b.EndObject()
            b.StartObject(2)
            b.PrependUint8Slot(0, _NORMALIZATION_OPTIONS, 0)
            b.PrependUOffsetTRelativeSlot(1, options, 0)
            units = _vector(b, [b.EndObject()])
        b.StartObject(7)
        if units is not None:
            b.PrependUOffsetTRelativeSlot(4, units, 0)
        tensors.append(b.EndObject())
    inputs = _vector(b, tensors)
    b.StartObject(7)
    b.PrependUOffsetTRelativeSlot(2, inputs, 0)
    subgraphs = _vector(b, [b.EndObject()])
    b.StartObject(8)
    b.PrependUOffsetTRelativeSlot(3, subgraphs, 0)
    b.Finish(b.EndObject(), file_identifier=FILE_IDENTIFIER)
    return bytes(b.Output())
