"""What a batch run writes into its output folder, and reading it back.

    PREFIX-000017.parquet one row per input: `path` (the item's key) and one column per model
                          output, each row's values flattened (a fixed-size list; the shape is
                          in _outputs.json and in the Parquet schema's metadata)
    PREFIX-000017.npz     (--format npz) `path` and one array per output, items stacked
    errors.jsonl          one {"path", "reason"} per input that was not run
    _outputs.json         the outputs' names, columns, shapes and dtypes; the run (its part
                          files' prefixes, written before they are: folder.py); its summary

An output's column is its tensor name unless that collides (output_columns), so every output is
written whatever the model named it.

PREFIX is the run's (part-<8 hex digits>); under Ray, Ray Data's Parquet writer names the part
files PREFIX-ray_<uuid>_<task>.parquet. Every file of ours appears whole or not at all
(written beside its final name, then renamed), and a retried batch rewrites the same file, so an
input is never written twice.
"""
from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import secrets
import stat
from typing import Optional
from urllib.parse import unquote

import numpy as np

from tflite_taichi.batch.inputs import has_batch_dim, item_shape, require_pyarrow
from tflite_taichi.errors import BatchError

ERRORS_FILE = "errors.jsonl"
ERROR_PARTS = "_errors"
INFO_FILE = "_outputs.json"
FORMATS = ("parquet", "npz")
SCHEMA_KEY = b"tflite_taichi.outputs"
LOCK_FILE = ".tflite-taichi.lock"        # held by the run that owns the folder (folder.Claim)
TMP_PREFIX = ".tflite-taichi-tmp-"      # files being written: hidden, never read, ours to remove
ERROR_PART_RE = re.compile(r"[0-9a-f]{20}\.jsonl\Z")      # error_part_name's files
LEGACY_PART_RE = re.compile(r"part-[0-9]{6}\.(parquet|npz)\Z")   # before runs had prefixes
PREFIX_RE = re.compile(r"part-[0-9a-f]{8}\Z")                 # folder.prepare's prefixes
# after its prefix, a part's name: ours (pool.part_name), or Ray Data's writer's (ray_data.py)
PART_TAIL_RE = re.compile(r"-([0-9]{6}\.(parquet|npz)|ray_[0-9A-Za-z_-]+\.parquet)\Z")


# -- the output folder, through descriptors ------------------------------------------------------
# Everything in --out is opened relative to the folder's descriptor without following a link
# (O_NOFOLLOW), and checked on the open descriptor: a name checked and then opened again could
# have been swapped in between. For a run, the folder and every entry it reads, writes or
# removes must be ours alone (owned by our euid, writable by nobody else): what another user can
# write there could steer what a run removes, reads or skips.
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_O_FOLDER = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | _O_NOFOLLOW | _O_CLOEXEC
# O_NONBLOCK: a FIFO planted under a file's name must not block the open
_O_READ = os.O_RDONLY | _O_NOFOLLOW | _O_CLOEXEC | getattr(os, "O_NONBLOCK", 0)
_O_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_NOFOLLOW | _O_CLOEXEC


def _euid() -> Optional[int]:
    return os.geteuid() if hasattr(os, "geteuid") else None


def not_ours(st: os.stat_result, path: str, folder: bool = False) -> Optional[str]:
    """Why `path` (its fstat) is not a regular file (or folder) that only we can change; None
    when it is."""
    kind = "folder" if folder else "regular file"
    if not (stat.S_ISDIR if folder else stat.S_ISREG)(st.st_mode):
        return f"{path} is not a {kind}"
    uid = _euid()
    if uid is not None and st.st_uid != uid:
        return f"{path} is owned by uid {st.st_uid}, not by you (uid {uid})"
    if st.st_mode & 0o022:
        return (f"{path} is group- or world-writable (mode {stat.S_IMODE(st.st_mode):04o}): "
                "another user could change it (chmod go-w it)")
    return None


class OutFolder:
    """A folder of a batch run, open as a descriptor; its entries are reached through it only,
    never through a link. owned=True (a run's folder): the folder and every entry opened must be
    ours alone, else BatchError. owned=False (reading a finished run's results, which may be
    another user's): links are still not followed and only regular files are read."""

    def __init__(self, path: str, fd: int, owned: bool = True):
        self.path, self.fd, self.owned = path, fd, owned

    @classmethod
    def open(cls, path: str, owned: bool = True) -> "OutFolder":
        try:
            fd = os.open(path, _O_FOLDER)
        except OSError as e:
            raise BatchError(f"cannot open the folder {path}: {_why(e)}") from None
        folder = cls(path, fd, owned)
        folder._check(fd, path, is_folder=True)
        return folder

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def __enter__(self) -> "OutFolder":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _check(self, fd: int, path: str, is_folder: bool = False) -> None:
        st = os.fstat(fd)
        problem = not_ours(st, path, is_folder) if self.owned else \
            (None if (stat.S_ISDIR if is_folder else stat.S_ISREG)(st.st_mode)
             else f"{path} is not a {'folder' if is_folder else 'regular file'}")
        if problem:
            os.close(fd)
            raise BatchError(f"{problem}: a batch run trusts nothing in its output folder that "
                             "is not its own")

    def where(self, name: str) -> str:
        return os.path.join(self.path, name)

    def names(self) -> list:
        return sorted(os.listdir(self.fd))

    def exists(self, name: str) -> bool:
        try:
            os.stat(name, dir_fd=self.fd, follow_symlinks=False)
            return True
        except FileNotFoundError:
            return False

    def open_fd(self, name: str) -> int:
        """A descriptor on the regular file `name` (FileNotFoundError if absent)."""
        try:
            fd = os.open(name, _O_READ, dir_fd=self.fd)
        except FileNotFoundError:
            raise
        except OSError as e:
            raise BatchError(f"cannot read {self.where(name)}: {self._why(name, e)}") from None
        self._check(fd, self.where(name))
        return fd

    def reader(self, name: str):
        """`name` open for reading in binary (a file object the caller closes)."""
        return os.fdopen(self.open_fd(name), "rb")

    def subfolder(self, name: str, create: bool = False) -> Optional["OutFolder"]:
        """The folder `name` in this one (made if absent and `create`), or None if absent."""
        if create:
            with contextlib.suppress(FileExistsError):
                os.mkdir(name, 0o700, dir_fd=self.fd)
        try:
            fd = os.open(name, _O_FOLDER, dir_fd=self.fd)
        except FileNotFoundError:
            return None
        except OSError as e:
            raise BatchError(f"cannot open the folder {self.where(name)}: "
                             f"{self._why(name, e)}") from None
        self._check(fd, self.where(name), is_folder=True)
        return OutFolder(self.where(name), fd, self.owned)

    def remove(self, name: str) -> bool:
        """Unlink `name` if it is a regular file of ours (a link is never followed: a link is
        not removed either); whether it was."""
        try:
            st = os.stat(name, dir_fd=self.fd, follow_symlinks=False)
        except FileNotFoundError:
            return False
        if not_ours(st, self.where(name)):
            return False
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name, dir_fd=self.fd)
        return True

    def _why(self, name: str, error: OSError) -> str:
        """What an open that does not follow links met: O_NOFOLLOW says ELOOP for a link, or
        ENOTDIR for a link opened as a folder."""
        with contextlib.suppress(OSError):
            if stat.S_ISLNK(os.stat(name, dir_fd=self.fd, follow_symlinks=False).st_mode):
                return "it is a symbolic link, and nothing in a batch output folder is followed"
        return _why(error)

    def write(self, name: str, write) -> None:
        """write(binary file object) into a new hidden file, then rename it onto `name`:
        readers see the whole file or none."""
        tmp = f"{TMP_PREFIX}{secrets.token_hex(8)}{os.path.splitext(name)[1]}"
        fd = os.open(tmp, _O_CREATE, 0o600, dir_fd=self.fd)
        try:
            with os.fdopen(fd, "wb") as f:
                write(f)
            os.replace(tmp, name, src_dir_fd=self.fd, dst_dir_fd=self.fd)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp, dir_fd=self.fd)
            raise


def _why(error: OSError) -> str:
    if error.errno == errno.ELOOP:
        return "it is a symbolic link, and nothing in a batch output folder is followed"
    return error.strerror or str(error)


def output_info(interpreter) -> list:
    """[{"name", "shape" (one item's), "dtype", "batch_dim"}] of the main graph's outputs (an
    output whose first dimension is 1 has it dropped per item: batch_dim)."""
    details = interpreter.get_output_details()
    columns = output_columns([d["name"] for d in details], reserved=("path",))
    return [{"name": d["name"], "column": column, "shape": list(item_shape(d["shape"])),
             "dtype": np.dtype(d["dtype"]).name, "batch_dim": has_batch_dim(d["shape"])}
            for d, column in zip(details, columns)]


def output_columns(names: list, reserved=()) -> list:
    """The name each output is stored under (a Parquet column, an .npz array): its tensor name,
    unless that is empty, reserved (`path`, the inputs' keys) or already taken by an earlier
    output, in which case NAME#INDEX (INDEX its position among the outputs), again suffixed
    while taken. Two outputs of one name, or one named `path`, must both be written."""
    taken, columns = set(reserved), []
    for index, name in enumerate(names):
        column = name
        while not column or column in taken:
            column = f"{column}#{index}"
        taken.add(column)
        columns.append(column)
    return columns


def npz_member(name: str) -> str:
    """The .npz member name an array `name` is stored under: `%`, `/` and `\\` percent-encoded
    (`%25`, `%2F`, `%5C`), so a name such as `../x` or `/etc/x` is one member, never a path an
    unzip tool would write outside its folder; unquote (urllib.parse) gives the name back."""
    return name.replace("%", "%25").replace("/", "%2F").replace("\\", "%5C")


def npz_name(member: str) -> str:
    """The array name of an .npz member as np.load lists it (npz_member undone)."""
    return unquote(member)


def save_npz(file, arrays: dict) -> None:
    """{name: array} as an .npz (a path or a binary file object) that np.load reads back under
    those names escaped (npz_member). Not np.savez(path, **arrays): its own parameters take
    names like `file` (a TypeError) and `allow_pickle` (the array silently dropped)."""
    import zipfile
    with zipfile.ZipFile(file, "w", zipfile.ZIP_STORED, allowZip64=True) as archive:
        for name, value in arrays.items():
            with archive.open(npz_member(name) + ".npy", "w", force_zip64=True) as member:
                np.lib.format.write_array(member, np.asanyarray(value), allow_pickle=False)


def arrow_table(keys: list, outputs: list, info: list):
    """A pyarrow Table: `path` and a fixed-size list column per output (`outputs`: per output,
    the items stacked)."""
    pa = require_pyarrow("writing Parquet")
    columns = {"path": pa.array(keys, pa.string())}
    for spec, values in zip(info, outputs):
        size = int(np.prod(spec["shape"]))
        flat = np.ascontiguousarray(values).reshape(-1)
        columns[spec["column"]] = pa.FixedSizeListArray.from_arrays(pa.array(flat), size)
    schema = pa.schema([pa.field(k, v.type) for k, v in columns.items()],
                       metadata={SCHEMA_KEY: json.dumps(info).encode()})
    return pa.Table.from_arrays(list(columns.values()), schema=schema)


def empty_arrow_table(info: list):
    """The schema of arrow_table with no rows (a batch whose inputs all failed)."""
    return arrow_table([], [np.zeros((0, *s["shape"]), s["dtype"]) for s in info], info)


def write_part(out_dir: str, part: str, keys: list, outputs: list, info: list, fmt: str) -> str:
    """Write one batch's outputs as `part`.parquet or .npz; returns the path."""
    name = f"{part}.{fmt}"

    def write(f):
        if fmt == "parquet":
            import pyarrow.parquet as pq
            pq.write_table(arrow_table(keys, outputs, info), f)
        else:
            arrays = {"path": np.asarray(keys, dtype=str)}
            arrays.update({spec["column"]: values for spec, values in zip(info, outputs)})
            save_npz(f, arrays)
    with OutFolder.open(out_dir) as folder:
        folder.write(name, write)
    return os.path.join(out_dir, name)


def error_part_name(keys: list) -> str:
    """A name for a batch's error records that is the same when the batch is retried."""
    return hashlib.sha1("\n".join(keys).encode()).hexdigest()[:20]


def _jsonl(records: list) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in records).encode()


def write_error_part(out_dir: str, keys: list, errors: list) -> None:
    """The batch's [(path, reason)] under _errors/ (merged into errors.jsonl at the end)."""
    if not errors:
        return
    text = _jsonl([{"path": p, "reason": r} for p, r in errors])
    with OutFolder.open(out_dir) as folder, folder.subfolder(ERROR_PARTS, create=True) as parts:
        parts.write(error_part_name(keys) + ".jsonl", lambda f: f.write(text))


def merge_errors(out_dir: str, extra: list) -> list:
    """errors.jsonl from the batches' error parts and `extra` [(path, reason)] (inputs the run
    found unusable before running them), sorted by path; returns the records. Only error parts
    of ours are read and removed: _errors may hold others."""
    records = [{"path": p, "reason": r} for p, r in extra]
    with OutFolder.open(out_dir) as folder:
        parts = folder.subfolder(ERROR_PARTS)
        merged = _read_error_parts(parts, records) if parts is not None else []
        records.sort(key=lambda r: r["path"])
        folder.write(ERRORS_FILE, lambda f: f.write(_jsonl(records)))
        if parts is not None:
            with parts:
                for name in merged:
                    parts.remove(name)
            with contextlib.suppress(OSError):      # it holds files that are not ours
                os.rmdir(ERROR_PARTS, dir_fd=folder.fd)
    return records


def _read_error_parts(parts: OutFolder, records: list) -> list:
    """Add the records of the error parts of ours in `parts` to `records`; their names."""
    merged = []
    for name in parts.names():
        if ERROR_PART_RE.match(name) and _owned_file(parts, name):
            with parts.reader(name) as f:
                records += [json.loads(line) for line in f if line.strip()]
            merged.append(name)
    return merged


def _owned_file(folder: OutFolder, name: str) -> bool:
    try:
        st = os.stat(name, dir_fd=folder.fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return not_ours(st, folder.where(name)) is None


def write_manifest(out_dir: str, info: list, run: dict, summary: Optional[dict]) -> None:
    """_outputs.json: the outputs, the run ("parts": its part files' prefixes; what --resume
    must match) and, once it has ended, its summary."""
    text = (json.dumps({"outputs": info, "run": run, "summary": summary}, indent=2) + "\n").encode()
    with OutFolder.open(out_dir) as folder:
        folder.write(INFO_FILE, lambda f: f.write(text))


# -- which files are a run's, and reading them back ---------------------------------------------
def read_manifest(folder: OutFolder) -> Optional[dict]:
    """_outputs.json of `folder` (None if absent), checked for what the rest of a run takes from
    it: BatchError when it cannot be read or its run's part prefixes are not ones a run makes
    (a prefix such as `results` would make `results-x.npz` a part to read or remove)."""
    try:
        with folder.reader(INFO_FILE) as f:
            manifest = json.load(f)
    except FileNotFoundError:
        return None
    except ValueError as e:
        raise BatchError(f"{folder.where(INFO_FILE)} is not readable JSON ({e}): not a run's "
                         "record this version can trust") from None
    run = manifest.get("run") if isinstance(manifest, dict) else None
    parts = run.get("parts") if isinstance(run, dict) else None
    if not isinstance(manifest, dict) or (run is not None and not (
            isinstance(parts, list) and all(isinstance(p, str) and PREFIX_RE.match(p)
                                            for p in parts))):
        raise BatchError(f"{folder.where(INFO_FILE)} does not record a run as this version writes "
                         "it (its part prefixes are part-<8 hex digits>): not trusted; remove "
                         "the folder's run files by hand or choose another --out")
    return manifest


def part_prefixes(manifest: Optional[dict]) -> Optional[list]:
    """The prefixes of a run's part files; None for a run of a version before prefixes."""
    run = (manifest or {}).get("run")
    return list(run["parts"]) if run else None


def is_part(name: str, prefixes: Optional[list]) -> bool:
    """Whether file `name` is a part file of the run whose prefixes these are (ours are named
    PREFIX-000017.npz or .parquet, Ray Data's writer's PREFIX-ray_....parquet)."""
    if prefixes is None:
        return bool(LEGACY_PART_RE.match(name))
    return any(name.startswith(prefix) and PART_TAIL_RE.match(name, len(prefix))
               for prefix in prefixes)


def part_names(folder: OutFolder, prefixes: Optional[list] = None) -> list:
    """The names of the run's part files in `folder` (its _outputs.json's prefixes by
    default), in name order; a user's other .parquet and .npz files are not among them."""
    if prefixes is None:
        prefixes = part_prefixes(read_manifest(folder))
    return [n for n in folder.names() if is_part(n, prefixes)]


def read_part(folder: OutFolder, name: str, info: Optional[list]) -> tuple:
    """(keys, {column: [item, ...] array}) of one part file, read through `folder`."""
    with folder.reader(name) as f:
        if name.endswith(".npz"):
            with np.load(f, allow_pickle=False) as archive:
                arrays = {npz_name(n): archive[n] for n in archive.files}
            keys = arrays.pop("path").tolist()
            return keys, arrays
        import pyarrow.parquet as pq
        table = pq.read_table(f)
    meta = table.schema.metadata or {}
    specs = json.loads(meta[SCHEMA_KEY]) if SCHEMA_KEY in meta else info
    shapes = {s.get("column", s["name"]): (s["shape"], s["dtype"]) for s in specs or []}
    keys = table.column("path").to_pylist()
    columns = {}
    for column in table.column_names:
        if column == "path":
            continue
        shape, dtype = shapes.get(column, ([-1], None))
        flat = table.column(column).combine_chunks().flatten().to_numpy(zero_copy_only=False)
        columns[column] = flat.astype(dtype or flat.dtype).reshape(len(keys), *shape)
    return keys, columns


def count_written(out_dir: str) -> int:
    """Rows in the run's part files (the run reads them all: an input twice counts twice).
    Counted as read_outputs reads them (no link followed), ours or not: Ray Data's writer makes
    its files with the workers' umask, which may leave them group-writable."""
    total = 0
    with OutFolder.open(out_dir, owned=False) as folder:
        for name in part_names(folder):
            with folder.reader(name) as f:
                if name.endswith(".parquet"):
                    import pyarrow.parquet as pq
                    total += pq.ParquetFile(f).metadata.num_rows
                else:
                    with np.load(f, allow_pickle=False) as archive:
                        total += len(archive["path"])
    return total


def read_outputs(out_dir: str) -> dict:
    """{input key: {output column: array of one item's shape}} of a finished run's folder (an
    output's column is its tensor name unless that collides: _outputs.json's `column`). A key
    found in two part files is a BatchError (the run wrote it twice). The folder may be another
    user's; nothing in it is read through a link."""
    found = {}
    with OutFolder.open(out_dir, owned=False) as folder:
        manifest = read_manifest(folder)
        info = manifest["outputs"] if manifest else None
        for name in part_names(folder, part_prefixes(manifest)):
            keys, columns = read_part(folder, name, info)
            for i, key in enumerate(keys):
                if key in found:
                    raise BatchError(f"{key} is written twice in {out_dir}")
                found[key] = {n: v[i] for n, v in columns.items()}
    return found


def read_errors(out_dir: str) -> list:
    """[{"path", "reason"}] of a finished run's errors.jsonl."""
    with OutFolder.open(out_dir, owned=False) as folder, folder.reader(ERRORS_FILE) as f:
        return [json.loads(line) for line in f if line.strip()]
