"""What goes into a batch run: finding the inputs, and turning each into the model's input arrays.

An input is an *item* keyed by a string: a file's path (`.npy`, `.npz`, an image), or a table's
path and row (`table.parquet#17`) for a Parquet/Arrow table with one column per model input.
Items are found on the driver (`discover`); their bytes are read where they run (`load_payload`
in the local pool; Ray Data's readers under Ray), and decoded there (`decode`) against an
`InputSpec`, plain data built once from the model. An item that cannot be decoded raises
`ItemError` with the reason; the run writes it to the errors file and goes on.
"""
from __future__ import annotations

import io
import os
import re
from dataclasses import dataclass, field
from typing import Optional, Sequence

import numpy as np

from tflite_taichi.errors import BatchError
from tflite_taichi.metadata import Normalization, input_normalizations

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff")
ARRAY_SUFFIXES = (".npy", ".npz")
TABLE_SUFFIXES = (".parquet", ".arrow", ".feather", ".ipc")
ROW_SEPARATOR = "#"

# --preprocess presets: what float input the model's training fed it, from 8-bit pixels x
PRESETS = {
    "unit": Normalization([0.0], [255.0]),                      # x / 255: [0, 1]
    "signed": Normalization([127.5], [127.5]),                  # [-1, 1]
    "raw": Normalization([0.0], [1.0]),                         # 0..255 as floats
    "imagenet": Normalization([123.675, 116.28, 103.53], [58.395, 57.12, 57.375]),
}


class ItemError(Exception):
    """One input cannot be used (the reason is the message); the run records it and goes on."""


@dataclass(frozen=True)
class Item:
    key: str                     # the input's path, or "table#row"
    source: str                  # the file to read
    row: Optional[int] = None    # the row of a table, else None


@dataclass
class InputSpec:
    """The model's inputs as a decoder needs them (picklable, built on the driver)."""
    names: list                  # tensor name per input
    aliases: list                # per input: every name an .npz array or table column may use
    item_shapes: list            # per input: the shape of one item (the batch dimension dropped)
    batch_dims: list             # per input: whether its first dimension is a batch of 1
    dtypes: list                 # per input: numpy dtype name
    quantization: list           # per input: (scale, zero_point) or None
    normalization: list = field(default_factory=list)   # per input: Normalization or None
    normalization_source: str = ""                    # "metadata", "--preprocess X", or ""

    @property
    def count(self) -> int:
        return len(self.names)


# -- options --------------------------------------------------------------------------------------
__all__ = ["BatchError", "InputSpec", "Item", "ItemError", "PRESETS", "TableCache", "check_images",
           "decode", "discover", "input_spec", "load_payload", "parse_preprocess"]


def parse_preprocess(text: Optional[str]) -> Optional[Normalization]:
    """--preprocess: a preset name (unit, signed, raw, imagenet) or "mean=M[,M,M];std=S[,S,S]"."""
    if text is None or text == "":
        return None
    if text in PRESETS:
        return PRESETS[text]
    match = re.fullmatch(r"\s*mean=([^;]+);\s*std=(.+)", text)
    if not match:
        raise BatchError(f"--preprocess takes one of {', '.join(PRESETS)} or "
                         f"'mean=M[,M,M];std=S[,S,S]', got {text!r}")
    try:
        mean = [float(v) for v in match.group(1).split(",")]
        std = [float(v) for v in match.group(2).split(",")]
        return Normalization(mean, std)
    except ValueError as e:
        raise BatchError(f"--preprocess {text!r}: {e}") from None


def input_spec(interpreter, preprocess: Optional[Normalization] = None) -> InputSpec:
    """The InputSpec of an interpreter's main graph (no tensors allocated), with each input's
    normalization for images: `preprocess` if given, else the model's metadata."""
    details = interpreter.get_input_details()
    aliases = [[d["name"]] for d in details]
    by_index = {d["index"]: i for i, d in enumerate(details)}
    for sig in interpreter.model.signatures:
        if sig.subgraph_index == interpreter.model.main.index:
            for name, t in sig.inputs.items():
                if t in by_index and name not in aliases[by_index[t]]:
                    aliases[by_index[t]].append(name)
    spec = InputSpec(
        names=[d["name"] for d in details], aliases=aliases,
        item_shapes=[item_shape(d["shape"]) for d in details],
        batch_dims=[has_batch_dim(d["shape"]) for d in details],
        dtypes=[np.dtype(d["dtype"]).name for d in details],
        quantization=[(float(d["quantization"][0]), int(d["quantization"][1]))
                      if d["quantization"][0] else None for d in details])
    if preprocess is not None:
        spec.normalization, spec.normalization_source = [preprocess] * spec.count, "--preprocess"
    else:
        found, problem = input_normalizations(interpreter.model)
        if len(found) == spec.count and any(n is not None for n in found):
            spec.normalization, spec.normalization_source = found, "the model's metadata"
        elif problem:
            spec.normalization_source = f"none: {problem}"
    return spec


def has_batch_dim(shape) -> bool:
    return len(shape) > 0 and int(shape[0]) == 1


def item_shape(shape) -> tuple:
    """One item's shape: without the leading batch dimension of 1 where there is one."""
    return tuple(int(s) for s in (shape[1:] if has_batch_dim(shape) else shape))


# -- finding the inputs ---------------------------------------------------------------------------
def _suffix(path: str) -> str:
    return os.path.splitext(path)[1].lower()


def _table_rows(path: str) -> int:
    from tflite_taichi.batch.outputs import require_pyarrow
    pa = require_pyarrow(f"reading the table {path}")
    if _suffix(path) == ".parquet":
        import pyarrow.parquet as pq
        return pq.ParquetFile(path).metadata.num_rows
    with pa.memory_map(path) as source:
        return pa.ipc.open_file(source).read_all().num_rows


def discover(inputs: Sequence[str], exclude: Optional[str] = None) -> tuple:
    """(items, problems): the items of `inputs` (files, and folders searched recursively in
    name order; hidden files skipped; `exclude`, the output folder, skipped), and
    [(path, reason)] for files that are not inputs (an unknown suffix, an unreadable table),
    which go to the errors file. A path that does not exist is a BatchError."""
    files = []
    skip = os.path.realpath(exclude) if exclude else None
    for given in inputs:
        if os.path.isdir(given):
            for root, dirs, names in os.walk(given):
                dirs[:] = sorted(d for d in dirs if not d.startswith(".")
                                 and os.path.realpath(os.path.join(root, d)) != skip)
                files += [os.path.join(root, n) for n in sorted(names) if not n.startswith(".")]
        elif os.path.exists(given):
            files.append(given)
        else:
            raise BatchError(f"no such file or folder: {given}")
    items, problems, seen = [], [], set()
    for path in files:
        if path in seen:
            continue
        seen.add(path)
        suffix = _suffix(path)
        if suffix in TABLE_SUFFIXES:
            try:
                rows = _table_rows(path)
            except BatchError:
                raise
            except Exception as e:     # a truncated or foreign file: pyarrow's many errors
                problems.append((path, f"not a readable {suffix[1:]} table ({type(e).__name__}: {e})"))
                continue
            items += [Item(f"{path}{ROW_SEPARATOR}{row}", path, row) for row in range(rows)]
        elif suffix in ARRAY_SUFFIXES or suffix in IMAGE_SUFFIXES:
            items.append(Item(path, path))
        else:
            problems.append((path, f"not an input file (suffix {suffix or 'none'}; inputs are "
                                   f"{', '.join(ARRAY_SUFFIXES + IMAGE_SUFFIXES + TABLE_SUFFIXES)})"))
    return items, problems


# -- reading --------------------------------------------------------------------------------------
class TableCache:
    """The last table read, kept while a worker reads its rows (items arrive in file order)."""

    def __init__(self):
        self.path, self.table = None, None

    def row(self, path: str, row: int) -> dict:
        if path != self.path:
            from tflite_taichi.batch.outputs import require_pyarrow
            pa = require_pyarrow(f"reading the table {path}")
            if _suffix(path) == ".parquet":
                import pyarrow.parquet as pq
                table = pq.read_table(path, memory_map=True)
            else:
                with pa.memory_map(path) as source:
                    table = pa.ipc.open_file(source).read_all()
            self.path, self.table = path, table
        return {name: self.table.column(name)[row].as_py() for name in self.table.column_names}


def load_payload(item: Item, tables: TableCache):
    """The item's raw content: a file's bytes, or a table row as {column: value}."""
    try:
        if item.row is not None:
            return tables.row(item.source, item.row)
        with open(item.source, "rb") as f:
            return f.read()
    except OSError as e:
        raise ItemError(f"cannot read {item.source}: {e.strerror or e}") from None
    except Exception as e:     # pyarrow's errors for a table that changed under us
        raise ItemError(f"cannot read row {item.row} of {item.source}: {e}") from None


# -- decoding -------------------------------------------------------------------------------------
def decode(spec: InputSpec, key: str, payload) -> list:
    """[array of item shape and the input's dtype] per model input, from an item's payload
    (bytes of a file named `key`, or a table row dict); ItemError says what is wrong."""
    if isinstance(payload, dict):
        return _from_row(spec, payload)
    suffix = _suffix(key)
    if suffix == ".npy":
        return _from_npy(spec, payload)
    if suffix == ".npz":
        return _from_npz(spec, payload)
    if suffix in IMAGE_SUFFIXES:
        return _from_image(spec, payload)
    raise ItemError(f"not an input file (suffix {suffix or 'none'})")


def _conform(spec: InputSpec, i: int, value: np.ndarray, what: str) -> np.ndarray:
    """`value` as input i of one item: its shape (with or without a leading batch dimension of
    1) and dtype (a lossless cast, or float64 -> float32), else an ItemError."""
    want_shape, want_dtype = spec.item_shapes[i], np.dtype(spec.dtypes[i])
    shape = tuple(value.shape)
    if shape == (1,) + want_shape:
        value = value.reshape(want_shape)
    elif shape != want_shape:
        raise ItemError(f"{what} has shape {list(shape)}; input '{spec.names[i]}' takes "
                        f"{list(want_shape)} per item")
    if value.dtype != want_dtype:
        lossless = np.can_cast(value.dtype, want_dtype, "safe")
        float_narrowing = value.dtype.kind == "f" and want_dtype.kind == "f"
        if not (lossless or float_narrowing):
            raise ItemError(f"{what} is {value.dtype}; input '{spec.names[i]}' is {want_dtype}")
        value = value.astype(want_dtype)
    return np.ascontiguousarray(value)


def _single_input(spec: InputSpec, what: str) -> None:
    if spec.count != 1:
        raise ItemError(f"{what} holds one array, but the model has {spec.count} inputs "
                        f"({', '.join(spec.names)}): give an .npz with one array per input name")


def _from_npy(spec: InputSpec, data: bytes) -> list:
    _single_input(spec, "a .npy file")
    if not data.startswith(np.lib.format.MAGIC_PREFIX):
        raise ItemError("not a .npy file (no numpy header)")
    try:
        value = np.load(io.BytesIO(data), allow_pickle=False)
    except (ValueError, EOFError, OSError) as e:
        raise ItemError(f"not a readable .npy file ({e})") from None
    return [_conform(spec, 0, value, "the array")]


def _match_names(spec: InputSpec, names: Sequence[str], what: str) -> list:
    """The name in `names` for each input (tensor or signature name; with one input and one
    name, that name), else an ItemError listing what is missing."""
    names = list(names)
    if spec.count == 1 and len(names) == 1:
        return names
    chosen, missing = [], []
    for i in range(spec.count):
        found = [n for n in spec.aliases[i] if n in names]
        if found:
            chosen.append(found[0])
        else:
            missing.append(" or ".join(repr(a) for a in spec.aliases[i]))
    if missing:
        raise ItemError(f"{what} has no {', '.join(missing)} (it has {', '.join(map(repr, names))})")
    return chosen


def _from_npz(spec: InputSpec, data: bytes) -> list:
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as archive:
            arrays = {name: archive[name] for name in archive.files}
    except (ValueError, EOFError, OSError) as e:
        raise ItemError(f"not a readable .npz archive ({e})") from None
    except Exception as e:     # zipfile.BadZipFile and other archive damage
        raise ItemError(f"not a readable .npz archive ({type(e).__name__}: {e})") from None
    names = _match_names(spec, arrays, "the archive")
    return [_conform(spec, i, arrays[n], f"array {n!r}") for i, n in enumerate(names)]


def _from_row(spec: InputSpec, row: dict) -> list:
    columns = [c for c in row if c != "path"]
    names = _match_names(spec, columns, "the table")
    arrays = []
    for i, name in enumerate(names):
        value, want = row[name], np.dtype(spec.dtypes[i])
        if value is None:
            raise ItemError(f"column {name!r} is null")
        if isinstance(value, (bytes, bytearray)):
            array = np.frombuffer(bytes(value), dtype=want) \
                if len(value) % want.itemsize == 0 else np.zeros(0, want)
            if array.size != int(np.prod(spec.item_shapes[i])):
                raise ItemError(f"column {name!r} holds {len(value)} bytes; input "
                                f"'{spec.names[i]}' takes {list(spec.item_shapes[i])} {want}")
            array = array.reshape(spec.item_shapes[i])
        else:
            try:
                array = np.asarray(value)
            except ValueError as e:       # ragged nested lists
                raise ItemError(f"column {name!r} is not a rectangular array ({e})") from None
            if array.dtype == object:
                raise ItemError(f"column {name!r} is not a rectangular array of numbers")
            if array.ndim == 1 and len(spec.item_shapes[i]) != 1 and \
                    array.size == int(np.prod(spec.item_shapes[i])):
                array = array.reshape(spec.item_shapes[i])    # a flat list of the item's values
        arrays.append(_conform(spec, i, array, f"column {name!r}"))
    return arrays


def _from_image(spec: InputSpec, data: bytes) -> list:
    _single_input(spec, "an image")
    shape, dtype = spec.item_shapes[0], np.dtype(spec.dtypes[0])
    if len(shape) != 3 or shape[2] not in (1, 3):
        raise ItemError(f"input '{spec.names[0]}' has item shape {list(shape)}, not an image "
                        "(height, width, 1 or 3 channels)")
    try:
        from PIL import Image, UnidentifiedImageError
    except ImportError:
        raise BatchError("image inputs need Pillow: pip install 'tflite-taichi[batch]'") from None
    try:
        with Image.open(io.BytesIO(data)) as image:
            image = image.convert("RGB" if shape[2] == 3 else "L")
            if image.size != (shape[1], shape[0]):
                image = image.resize((shape[1], shape[0]), Image.Resampling.BILINEAR)
            pixels = np.asarray(image, dtype=np.uint8).reshape(shape)
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as e:
        raise ItemError(f"not a readable image ({type(e).__name__}: {e})") from None
    norm = spec.normalization[0] if spec.normalization else None
    if dtype.kind == "f":
        if norm is None:
            raise BatchError(  # found before any worker starts: see check_images
                "image inputs of a float model need a normalization")
        return [norm.apply(pixels).astype(dtype)]
    if norm is None:     # 8-bit models take pixels as they are (int8: shifted by 128)
        if dtype == np.uint8:
            return [pixels]
        if dtype == np.int8:
            return [(pixels.astype(np.int16) - 128).astype(np.int8)]
        raise ItemError(f"input '{spec.names[0]}' is {dtype}; images feed float, uint8 or int8 inputs")
    values = norm.apply(pixels)
    q = spec.quantization[0]
    if q is None:
        raise ItemError(f"input '{spec.names[0]}' is {dtype} without quantization parameters, "
                        "so the normalised image cannot be quantized to it")
    info = np.iinfo(dtype)
    return [np.clip(np.round(values / q[0]) + q[1], info.min, info.max).astype(dtype)]


def check_images(spec: InputSpec, items: Sequence[Item]) -> None:
    """A BatchError before the run when there are images and no Pillow to decode them, or
    they would need a normalization nobody gave."""
    if not any(_suffix(i.key) in IMAGE_SUFFIXES for i in items) or spec.count != 1:
        return
    try:
        import PIL.Image  # noqa: F401 - only whether the workers will have it
    except ImportError:
        raise BatchError("the inputs include images, which need Pillow: "
                         "pip install 'tflite-taichi[batch]'") from None
    if np.dtype(spec.dtypes[0]).kind == "f" and not spec.normalization:
        why = f" ({spec.normalization_source})" if spec.normalization_source else ""
        raise BatchError(
            "the inputs include images, and the model's float input has no normalization in its "
            f"metadata{why}: say how pixels map to its input with --preprocess "
            f"({', '.join(PRESETS)}, or 'mean=M;std=S')")
