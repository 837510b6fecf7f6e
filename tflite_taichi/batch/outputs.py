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

import hashlib
import json
import os
import re
import tempfile
from typing import Optional

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


def atomic_write(path: str, write) -> None:
    """write(temporary path) then rename onto `path`: readers see the whole file or none."""
    folder = os.path.dirname(path) or "."
    fd, tmp = tempfile.mkstemp(prefix=TMP_PREFIX, suffix=os.path.splitext(path)[1], dir=folder)
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


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


def save_npz(path, arrays: dict) -> None:
    """{name: array} as an .npz that np.load reads back under exactly those names. Not
    np.savez(path, **arrays): its own parameters take names like `file` (a TypeError) and
    `allow_pickle` (the array silently dropped)."""
    import zipfile
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED, allowZip64=True) as archive:
        for name, value in arrays.items():
            with archive.open(name + ".npy", "w", force_zip64=True) as member:
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
    path = os.path.join(out_dir, f"{part}.{fmt}")
    if fmt == "parquet":
        import pyarrow.parquet as pq
        table = arrow_table(keys, outputs, info)
        atomic_write(path, lambda tmp: pq.write_table(table, tmp))
    else:
        arrays = {"path": np.asarray(keys, dtype=str)}
        arrays.update({spec["column"]: values for spec, values in zip(info, outputs)})
        atomic_write(path, lambda tmp: save_npz(tmp, arrays))
    return path


def error_part_name(keys: list) -> str:
    """A name for a batch's error records that is the same when the batch is retried."""
    return hashlib.sha1("\n".join(keys).encode()).hexdigest()[:20]


def write_error_part(out_dir: str, keys: list, errors: list) -> None:
    """The batch's [(path, reason)] under _errors/ (merged into errors.jsonl at the end)."""
    if not errors:
        return
    folder = os.path.join(out_dir, ERROR_PARTS)
    os.makedirs(folder, exist_ok=True)
    text = "".join(json.dumps({"path": p, "reason": r}) + "\n" for p, r in errors)

    def save(tmp):
        with open(tmp, "w") as f:
            f.write(text)
    atomic_write(os.path.join(folder, error_part_name(keys) + ".jsonl"), save)


def merge_errors(out_dir: str, extra: list) -> list:
    """errors.jsonl from the batches' error parts and `extra` [(path, reason)] (inputs the run
    found unusable before running them), sorted by path; returns the records."""
    records = [{"path": p, "reason": r} for p, r in extra]
    folder = os.path.join(out_dir, ERROR_PARTS)
    merged = []                          # only the batches' records: _errors may hold others
    if os.path.isdir(folder):
        merged = [os.path.join(folder, n) for n in sorted(os.listdir(folder))
                  if ERROR_PART_RE.match(n)]
        for path in merged:
            with open(path) as f:
                records += [json.loads(line) for line in f if line.strip()]
    records.sort(key=lambda r: r["path"])
    text = "".join(json.dumps(r) + "\n" for r in records)

    def save(tmp):
        with open(tmp, "w") as f:
            f.write(text)
    atomic_write(os.path.join(out_dir, ERRORS_FILE), save)
    for path in merged:
        os.unlink(path)
    if merged:
        try:
            os.rmdir(folder)
        except OSError:
            pass                         # it holds files that are not ours
    return records


def write_manifest(out_dir: str, info: list, run: dict, summary: Optional[dict]) -> None:
    """_outputs.json: the outputs, the run ("parts": its part files' prefixes; what --resume
    must match) and, once it has ended, its summary."""
    text = json.dumps({"outputs": info, "run": run, "summary": summary}, indent=2) + "\n"

    def save(tmp):
        with open(tmp, "w") as f:
            f.write(text)
    atomic_write(os.path.join(out_dir, INFO_FILE), save)


# -- which files are a run's, and reading them back ---------------------------------------------
def read_manifest(out_dir: str) -> Optional[dict]:
    path = os.path.join(out_dir, INFO_FILE)
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        return json.load(f)


def part_prefixes(manifest: Optional[dict]) -> Optional[list]:
    """The prefixes of a run's part files; None for a run of a version before prefixes."""
    run = (manifest or {}).get("run")
    return list(run["parts"]) if run else None


def is_part(name: str, prefixes: Optional[list]) -> bool:
    """Whether file `name` is a part file of the run whose prefixes these are (Ray Data's
    writer names them PREFIX-ray_..., ours PREFIX-000017)."""
    if name.startswith(".") or not name.endswith((".parquet", ".npz")):
        return False
    if prefixes is None:
        return bool(LEGACY_PART_RE.match(name))
    return any(name.startswith(prefix + "-") for prefix in prefixes)


def part_files(out_dir: str, prefixes: Optional[list] = None) -> list:
    """The paths of the run's part files in `out_dir` (its _outputs.json's prefixes by
    default), in name order; a user's other .parquet and .npz files are not among them."""
    if prefixes is None:
        prefixes = part_prefixes(read_manifest(out_dir))
    return [os.path.join(out_dir, n) for n in sorted(os.listdir(out_dir))
            if is_part(n, prefixes) and os.path.isfile(os.path.join(out_dir, n))]


def part_keys(path: str) -> list:
    """The input keys one part file holds."""
    if path.endswith(".npz"):
        with np.load(path, allow_pickle=False) as archive:
            return archive["path"].tolist()
    import pyarrow.parquet as pq
    return pq.read_table(path, columns=["path"]).column("path").to_pylist()


def count_written(out_dir: str) -> int:
    """Rows in the run's part files (the run reads them all: an input twice counts twice)."""
    total = 0
    for path in part_files(out_dir):
        if path.endswith(".parquet"):
            import pyarrow.parquet as pq
            total += pq.ParquetFile(path).metadata.num_rows
        else:
            total += len(part_keys(path))
    return total


def _info(out_dir: str) -> Optional[list]:
    manifest = read_manifest(out_dir)
    return manifest["outputs"] if manifest else None


def read_outputs(out_dir: str) -> dict:
    """{input key: {output column: array of one item's shape}} of a finished run's folder (an
    output's column is its tensor name unless that collides: _outputs.json's `column`). A key
    found in two part files is a BatchError (the run wrote it twice)."""
    info = _info(out_dir)
    found = {}

    def add(key, values):
        if key in found:
            raise BatchError(f"{key} is written twice in {out_dir}")
        found[key] = values

    for path in part_files(out_dir):
        if path.endswith(".npz"):
            with np.load(path, allow_pickle=False) as archive:
                keys = archive["path"].tolist()
                outputs = {n: archive[n] for n in archive.files if n != "path"}
            for i, key in enumerate(keys):
                add(key, {n: v[i] for n, v in outputs.items()})
        else:
            import pyarrow.parquet as pq
            table = pq.read_table(path)
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
            for i, key in enumerate(keys):
                add(key, {n: v[i] for n, v in columns.items()})
    return found


def read_errors(out_dir: str) -> list:
    """[{"path", "reason"}] of a finished run's errors.jsonl."""
    with open(os.path.join(out_dir, ERRORS_FILE)) as f:
        return [json.loads(line) for line in f if line.strip()]
