"""What goes into a batch run: finding the inputs, and turning each into the model's input arrays.

An input is an *item* keyed by a string: a file's path (`.npy`, `.npz`, an image), or a table's
path and row (`table.parquet#17`) for a Parquet/Arrow table with one column per model input.
Items are found on the driver (`discover`); their bytes are read where they run (`load_payload`
in the local pool; Ray Data's readers under Ray), and decoded there (`decode`) against an
`InputSpec`, plain data built once from the model. An item that cannot be decoded raises
`ItemError` with the reason; the run writes it to the errors file and goes on.

One input must never cost more than itself: only regular files are read (a FIFO would block, a
device never ends), no more of a file than the model's inputs can use, and arrays' headers are
checked against the model's inputs before their data is read (a 200-byte .npy may declare
400 GB; an .npz member may inflate a thousandfold), so a bad input is an ItemError, not a worker
that runs out of memory or waits forever.
"""
from __future__ import annotations

import io
import os
import re
import stat
import zipfile
from dataclasses import dataclass, field
from typing import Optional, Sequence

import numpy as np

from tflite_taichi.errors import BatchError
from tflite_taichi.metadata import Normalization, input_normalizations

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff")
ARRAY_SUFFIXES = (".npy", ".npz")
TABLE_SUFFIXES = (".parquet", ".arrow", ".feather", ".ipc")
ROW_SEPARATOR = "#"

# Bytes read of one input file at most: arrays may use 16 bytes per element of the model's inputs
# (complex128, the widest numbers) beside ARRAY_ROOM for headers and unused .npz members; images
# up to IMAGE_BYTES (an uncompressed BMP or TIFF at Pillow's pixel limit is about 270 MB).
ARRAY_ROOM = 64 << 20
IMAGE_BYTES = 512 << 20
NPY_HEADER_BYTES = 10000         # numpy's own limit on a .npy header it reads

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


def require_pyarrow(why: str):
    try:
        import pyarrow
        import pyarrow.parquet  # noqa: F401 - the writer and reader (outputs.py)
    except ImportError:
        raise BatchError(f"{why} needs pyarrow: pip install 'tflite-taichi[batch]' "
                         "(or write --format npz)") from None
    return pyarrow


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


def _require_regular(path: str) -> None:
    """An ItemError unless `path` is a regular file, checked on the open file (pyarrow opens
    tables by name: a FIFO would block it). What is read next is the file by that name."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        mode = os.fstat(fd).st_mode
    finally:
        os.close(fd)
    if not stat.S_ISREG(mode):
        raise ItemError(f"not a regular file ({_file_kind(mode)}): only regular files are read")


def _table_rows(path: str) -> int:
    _require_regular(path)
    pa = require_pyarrow(f"reading the table {path}")
    if _suffix(path) == ".parquet":
        import pyarrow.parquet as pq
        return pq.ParquetFile(path).metadata.num_rows
    with pa.memory_map(path) as source:
        return pa.ipc.open_file(source).read_all().num_rows


def key_of(path: str) -> str:
    """The item key of a file: its path, as text every writer takes. A name whose bytes are not
    UTF-8 reaches Python with those bytes as lone surrogates, which Parquet and JSON writers
    refuse; its key shows them as \\xNN instead (b"x\\xff.npy" is keyed "x\\\\xff.npy"), one
    string per file that says which bytes they were. The file is still read by its real name."""
    try:
        path.encode("utf-8")
        return path
    except UnicodeEncodeError:
        try:
            return os.fsencode(path).decode("utf-8", "backslashreplace")
        except UnicodeError:     # a surrogate that no file name decodes to
            return path.encode("utf-8", "backslashreplace").decode("utf-8")


def _file_kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISLNK, "a link")):
        if test(mode):
            return name
    return "not a regular file"


def _not_regular(path: str) -> Optional[str]:
    """Why `path` (links followed) is not a regular file to read, or None when it is one."""
    link = os.path.islink(path)
    target = f"a link to {key_of(os.readlink(path))}, " if link else ""
    try:
        mode = os.stat(path).st_mode
    except OSError as e:
        return f"{target}which cannot be read ({e.strerror or e})" if link \
            else f"cannot be read ({e.strerror or e})"
    if stat.S_ISREG(mode):
        return None
    return f"not a regular file ({target}{_file_kind(mode)}): only regular files are read"


def _walk(folder: str, skip: Optional[str], problems: list) -> list:
    """The files under `folder` in name order (hidden ones skipped). Links to folders inside
    `folder` are followed, each folder searched once: a link back to a folder above it (a loop),
    or to one searched already, is listed in `problems`, as is a link to a folder outside
    `folder` (not followed: one link to /usr would make the whole tree inputs) and a folder that
    cannot be listed."""
    files, searched = [], {}
    root = os.path.realpath(folder)

    def unlisted(error: OSError) -> None:
        problems.append((key_of(error.filename or folder),
                         f"a folder that cannot be listed ({error.strerror or error})"))

    for path, dirs, names in os.walk(folder, onerror=unlisted, followlinks=True):
        try:
            st = os.stat(path)
        except OSError as e:     # gone since it was listed
            unlisted(e)
            continue
        first = searched.setdefault((st.st_dev, st.st_ino), path)
        if first != path:        # a link to a folder searched already: its files are there
            problems.append((key_of(path), f"a link to a folder searched already ({key_of(first)}"
                                           f"{', a loop' if _is_within(path, first) else ''})"))
            dirs[:] = []
            continue
        dirs[:] = sorted(d for d in dirs if not d.startswith(".")
                         and os.path.realpath(os.path.join(path, d)) != skip
                         and _followed(os.path.join(path, d), root, problems))
        files += [os.path.join(path, n) for n in sorted(names) if not n.startswith(".")]
    return files


def _followed(path: str, root: str, problems: list) -> bool:
    """Whether the folder `path` found under the input folder `root` (a real path) is searched:
    a real folder is; a link is only when it leads to a folder inside `root`, else it is listed
    in `problems`."""
    if not os.path.islink(path):
        return True
    target = os.path.realpath(path)
    if target == root or _is_within(target, root):
        return True
    problems.append((key_of(path), f"a link to a folder outside the input folder "
                                   f"({key_of(target)}): not followed; give that folder as an "
                                   "input to run what it holds"))
    return False


def _is_within(path: str, folder: str) -> bool:
    return (path + os.sep).startswith(folder.rstrip(os.sep) + os.sep)


def discover(inputs: Sequence[str], exclude: Optional[str] = None) -> tuple:
    """(items, problems): the items of `inputs` (files, and folders searched recursively in
    name order, links to folders followed; hidden files skipped; `exclude`, the output folder,
    skipped), and [(key, reason)] for what was found and is not an input (an unknown suffix, an
    unreadable table, a FIFO, a device, a link to nothing, a folder reached twice), which go to
    the errors file: every file found is either an item or a problem. A path that does not
    exist is a BatchError."""
    files, problems = [], []
    skip = os.path.realpath(exclude) if exclude else None
    for given in inputs:
        if os.path.isdir(given):
            files += _walk(given, skip, problems)
        elif os.path.lexists(given):
            files.append(given)
        else:
            raise BatchError(f"no such file or folder: {given}")
    items, seen = [], {}
    for path in files:
        key = key_of(path)
        if key in seen:          # the same path given twice is one item
            if seen[key] != path:
                problems.append((key, f"its key is also that of another file ({seen[key]!r})"))
            continue
        seen[key] = path
        suffix = _suffix(path)
        why = _not_regular(path)
        if why:
            problems.append((key, why))
        elif suffix in TABLE_SUFFIXES:
            try:
                rows = _table_rows(path)
            except BatchError:
                raise
            except Exception as e:     # a truncated or foreign file: pyarrow's many errors
                problems.append((key, f"not a readable {suffix[1:]} table ({type(e).__name__}: {e})"))
                continue
            items += [Item(f"{key}{ROW_SEPARATOR}{row}", path, row) for row in range(rows)]
        elif suffix in ARRAY_SUFFIXES or suffix in IMAGE_SUFFIXES:
            items.append(Item(key, path))
        else:
            problems.append((key, f"not an input file (suffix {suffix or 'none'}; inputs are "
                                   f"{', '.join(ARRAY_SUFFIXES + IMAGE_SUFFIXES + TABLE_SUFFIXES)})"))
    return items, problems


# -- reading --------------------------------------------------------------------------------------
class TableCache:
    """The last table read, kept while a worker reads its rows (items arrive in file order)."""

    def __init__(self):
        self.path, self.table = None, None

    def row(self, path: str, row: int) -> dict:
        if path != self.path:
            _require_regular(path)
            pa = require_pyarrow(f"reading the table {path}")
            if _suffix(path) == ".parquet":
                import pyarrow.parquet as pq
                table = pq.read_table(path, memory_map=True)
            else:
                with pa.memory_map(path) as source:
                    table = pa.ipc.open_file(source).read_all()
            self.path, self.table = path, table
        return {name: self.table.column(name)[row].as_py() for name in self.table.column_names}


def read_regular(path: str, limit: Optional[int] = None) -> bytes:
    """The bytes of `path` if it is a regular file of at most `limit` bytes, else an ItemError.
    Checked on the open file (fstat), not the name: the file found may since have been
    replaced; O_NONBLOCK makes opening a FIFO return at once instead of waiting for a writer."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise ItemError(f"cannot read it: {e.strerror or e}") from None
    with open(fd, "rb", closefd=True) as f:
        st = os.fstat(fd)
        mode, size = st.st_mode, st.st_size
        if not stat.S_ISREG(mode):
            raise ItemError(f"not a regular file ({_file_kind(mode)}): only regular files are read")
        if limit is not None and size > limit:
            raise ItemError(f"{size} bytes, more than the {limit} an input of this model is read to")
        data = f.read() if limit is None else f.read(limit + 1)
    if limit is not None and len(data) > limit:
        raise ItemError(f"more than the {limit} bytes an input of this model is read to (it grew)")
    return data


def payload_limit(spec: Optional[InputSpec], key: str) -> Optional[int]:
    """The most bytes of the file `key` worth reading for this model (None: no spec)."""
    if spec is None:
        return None
    if _suffix(key) in IMAGE_SUFFIXES:
        return IMAGE_BYTES
    return 16 * sum(_elements(shape) for shape in spec.item_shapes) + ARRAY_ROOM


def _elements(shape) -> int:
    count = 1
    for s in shape:
        count *= int(s)
    return count


def load_payload(item: Item, tables: TableCache, spec: Optional[InputSpec] = None):
    """The item's raw content: a file's bytes (at most what `spec`'s inputs can use), or a table
    row as {column: value}; an ItemError with the reason when it cannot be had."""
    try:
        if item.row is not None:
            return tables.row(item.source, item.row)
        return read_regular(item.source, payload_limit(spec, item.key))
    except ItemError:
        raise
    except OSError as e:
        raise ItemError(f"cannot read {item.key}: {e.strerror or e}") from None
    except Exception as e:     # pyarrow's errors for a table that changed under us, MemoryError
        raise ItemError(f"cannot read row {item.row} of {key_of(item.source)}: "
                        f"{type(e).__name__}: {e}") from None


# -- decoding -------------------------------------------------------------------------------------
def decode(spec: InputSpec, key: str, payload) -> list:
    """[array of item shape and the input's dtype] per model input, from an item's payload
    (bytes of a file named `key`, or a table row dict); ItemError says what is wrong."""
    if isinstance(payload, dict):
        return _from_row(spec, payload)
    suffix = _suffix(key)
    if suffix == ".npy":
        return _from_npy(spec, payload, key)
    if suffix == ".npz":
        return _from_npz(spec, payload, key)
    if suffix in IMAGE_SUFFIXES:
        return _from_image(spec, payload)
    raise ItemError(f"not an input file (suffix {suffix or 'none'})")


def _conform(spec: InputSpec, i: int, value: np.ndarray, what: str,
             file: Optional[str] = None) -> np.ndarray:
    """`value` as input i of one item: its shape (with or without a leading batch dimension of
    1) and dtype (a lossless cast; a narrower float only for a table's numbers: _check_declared),
    else an ItemError."""
    _check_declared(spec, i, value.shape, value.dtype, what, file)
    want_shape, want_dtype = spec.item_shapes[i], np.dtype(spec.dtypes[i])
    if tuple(value.shape) != want_shape:
        value = value.reshape(want_shape)
    if value.dtype != want_dtype:
        value = value.astype(want_dtype)
    return np.ascontiguousarray(value)


def _check_declared(spec: InputSpec, i: int, shape, dtype: np.dtype, what: str,
                    file: Optional[str] = None) -> None:
    """An ItemError unless an array of `shape` and `dtype` can be input i of one item: checked
    on an array file's header too, before its data is read or memory given to it.

    `file`: the array file (.npy, .npz) that declares `dtype`. Float data wider than the
    input's (float64 for a float32 input) is refused, as `tflite-taichi run` refuses it: it would
    lose precision unsaid, so the message names the conversion. A table's numbers (file None)
    arrive as Python floats whatever the column held, so they are narrowed to the input's type."""
    want_shape, want_dtype = spec.item_shapes[i], np.dtype(spec.dtypes[i])
    shape = tuple(int(s) for s in shape)
    if shape != want_shape and shape != (1,) + want_shape:
        raise ItemError(f"{what} has shape {list(shape)}; input '{spec.names[i]}' takes "
                        f"{list(want_shape)} per item")
    if dtype != want_dtype:
        lossless = np.can_cast(dtype, want_dtype, "safe")
        float_narrowing = dtype.kind == "f" and want_dtype.kind == "f"
        if float_narrowing and file is not None and not lossless:
            raise ItemError(f"{what} in {file} is {dtype}; input '{spec.names[i]}' is "
                            f"{want_dtype}: write the array as {want_dtype} "
                            f"(array.astype(np.{want_dtype.name}))")
        if dtype.hasobject or not (lossless or float_narrowing):
            raise ItemError(f"{what} is {dtype}; input '{spec.names[i]}' is {want_dtype}")


def _read_npy(spec: InputSpec, i: int, stream, what: str, file: str) -> np.ndarray:
    """Input i from a .npy stream (a file's bytes, or an .npz member as it inflates): the header
    first, checked against the input (shape, dtype, so the byte count), then exactly the bytes
    it declares; a header declaring more than the input takes costs nothing to refuse."""
    try:
        version = np.lib.format.read_magic(stream)
        if version == (1, 0):
            header = np.lib.format.read_array_header_1_0(stream, NPY_HEADER_BYTES)
        elif version == (2, 0):
            header = np.lib.format.read_array_header_2_0(stream, NPY_HEADER_BYTES)
        else:
            raise ValueError(f"format version {version[0]}.{version[1]} is not read here")
    except (ValueError, EOFError, OSError, SyntaxError) as e:
        raise ItemError(f"{what} is not a readable .npy array ({e})") from None
    shape, fortran, dtype = header
    _check_declared(spec, i, shape, dtype, what, file)
    nbytes = _elements(shape) * dtype.itemsize
    data = stream.read(nbytes)
    if len(data) < nbytes:
        raise ItemError(f"{what} is truncated: {len(data)} bytes of the {nbytes} its header declares")
    # a writable array, as np.load gives (a view of `data`, bytes, would be read-only)
    value = np.frombuffer(bytearray(data), dtype=dtype).reshape(shape, order="F" if fortran else "C")
    return _conform(spec, i, value, what, file)


def _single_input(spec: InputSpec, what: str) -> None:
    if spec.count != 1:
        raise ItemError(f"{what} holds one array, but the model has {spec.count} inputs "
                        f"({', '.join(spec.names)}): give an .npz with one array per input name")


def _from_npy(spec: InputSpec, data: bytes, key: str) -> list:
    _single_input(spec, "a .npy file")
    if not data.startswith(np.lib.format.MAGIC_PREFIX):
        raise ItemError("not a .npy file (no numpy header)")
    return [_read_npy(spec, 0, io.BytesIO(data), "the array", key)]


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


def _from_npz(spec: InputSpec, data: bytes, key: str) -> list:
    """The model's inputs from an .npz: names matched on the archive's list, then only the
    matched members inflated, each through its .npy header (_read_npy), so neither an unused
    member nor one that inflates past its input's size is ever decompressed whole."""
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            members = {(n[:-4] if n.endswith(".npy") else n): n for n in archive.namelist()}
            names = _match_names(spec, members, "the archive")
            arrays = []
            for i, name in enumerate(names):
                with archive.open(members[name]) as stream:
                    arrays.append(_read_npy(spec, i, stream, f"array {name!r}", key))
            return arrays
    except ItemError:
        raise
    except Exception as e:     # zipfile.BadZipFile, a bad CRC, and other archive damage
        raise ItemError(f"not a readable .npz archive ({type(e).__name__}: {e})") from None


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
    except Image.DecompressionBombError as e:   # more than twice Image.MAX_IMAGE_PIXELS declared
        raise ItemError(f"an image too large to decode ({e})") from None
    except Exception as e:  # noqa: BLE001 - a decoder's own failures (MemoryError too): the item's
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
