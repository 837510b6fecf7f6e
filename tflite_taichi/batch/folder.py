"""The output folder of a batch run: which run owns it, which of its files are a run's, and
finishing a run that was interrupted.

- A run holds an exclusive lock (flock on DIR/.tflite-taichi.lock) from before it looks at the
  folder until it has written its summary: a second run on the same --out is refused while the
  first lives, and the kernel drops the lock when its owner dies, even by SIGKILL.
- Before any worker starts, the run records in _outputs.json the prefix of the part files it will
  write (part-<8 hex digits>, a new one for each run and each resumption), the model's hash, the
  format and the inputs. So the files of a run are known even when it was killed before its
  summary: --overwrite removes those and nothing else (never a folder), and read_outputs reads
  those and nothing else.
- --resume keeps the complete part files of an interrupted run of the same model, inputs and
  format (a part file appears whole or not at all), and runs only the inputs none of them holds:
  keyed by input, not by task, so a different --batch (other tasks) writes nothing twice.
"""
from __future__ import annotations

import hashlib
import os
import secrets
from dataclasses import dataclass, field
from typing import Optional

from tflite_taichi.batch.outputs import (ERROR_PARTS, ERROR_PART_RE, ERRORS_FILE, INFO_FILE,
                                         LOCK_FILE, TMP_PREFIX, is_part, part_files, part_keys,
                                         part_prefixes, read_manifest, write_manifest)
from tflite_taichi.errors import BatchError


@dataclass
class RunRecord:
    """What _outputs.json says of the run while it runs ("run"): its parts' prefixes, the last
    being this run's, and what a resumption must match."""
    prefix: str                          # this run's part files: PREFIX-000017.parquet
    parts: list                          # every prefix whose parts are this run's outputs
    identity: dict                       # model_sha256, format, inputs, outputs
    done: set = field(default_factory=set)      # inputs an interrupted run wrote (--resume)

    def manifest(self, finished: bool) -> dict:
        return {"parts": self.parts, "finished": finished, **self.identity}


def check_out_dir(out_dir: str, inputs: list) -> None:
    """An --out that is an input, or holds one, is refused: outputs (and --overwrite's removals)
    go there. An input folder that holds --out is fine: discover skips it."""
    out = os.path.realpath(out_dir)
    for given in inputs:
        path = os.path.realpath(given)
        if path == out or os.path.commonpath([out, path]) == out:
            how = "is" if path == out else "holds"
            raise BatchError(f"--out {out_dir} {how} the input {given}: a run writes (and with "
                             "--overwrite removes) its outputs there; choose another --out")


def identity(model: bytes, fmt: str, inputs: list, info: list) -> dict:
    return {"model_sha256": hashlib.sha256(model).hexdigest(), "format": fmt,
            "inputs": [os.path.realpath(p) for p in inputs], "outputs": info}


class Claim:
    """The folder's lock, held while `with Claim(out_dir):` runs."""

    def __init__(self, out_dir: str):
        self.out_dir = out_dir
        self.file = None

    def __enter__(self):
        import fcntl
        os.makedirs(self.out_dir, exist_ok=True)
        path = os.path.join(self.out_dir, LOCK_FILE)
        f = open(path, "a+")
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            owner = f.read().strip()
            f.close()
            raise BatchError(f"{self.out_dir} is in use by another batch run (process "
                             f"{owner or '?'} holds the lock {path}): wait for it, or choose "
                             "another --out") from None
        f.seek(0)
        f.truncate()
        f.write(f"{os.getpid()}\n")
        f.flush()
        self.file = f
        return self

    def __exit__(self, *exc):
        self.file.close()                # closing the file drops the lock


def prepare(out_dir: str, ident: dict, *, overwrite: bool, resume: bool) -> RunRecord:
    """Make the locked folder ready for a run and record it; returns the run's record."""
    if overwrite and resume:
        raise BatchError("--resume keeps a previous run's outputs and --overwrite removes "
                         "them: choose one")
    manifest = read_manifest(out_dir)
    if manifest is None:
        _refuse_strangers(out_dir)
        parts, done = [], set()
    elif resume:
        parts = _resumable(out_dir, manifest, ident)
        done = _kept_keys(out_dir, parts)
        _remove(out_dir, _leftovers(out_dir))       # its errors are found again: run again
    elif overwrite:
        _remove(out_dir, _leftovers(out_dir) + _parts(out_dir, part_prefixes(manifest))
                + [INFO_FILE])
        parts, done = [], set()
    else:
        raise BatchError(f"{out_dir} already holds a batch run's outputs: choose another --out, "
                         "--overwrite to replace them, or --resume to finish that run")
    prefix = f"part-{secrets.token_hex(4)}"
    record = RunRecord(prefix=prefix, parts=parts + [prefix], identity=ident, done=done)
    write_manifest(out_dir, ident["outputs"], record.manifest(finished=False), summary=None)
    return record


def _refuse_strangers(out_dir: str) -> None:
    """Files a run writes, in a folder without _outputs.json: a run of an older version, killed
    before its summary; which files were its own is not known, so none is taken over."""
    ours = [n for n in os.listdir(out_dir) if n in (ERRORS_FILE, ERROR_PARTS) or is_part(n, None)]
    if ours:
        raise BatchError(f"{out_dir} holds {', '.join(sorted(ours)[:3])} but no {INFO_FILE}: "
                         "not a run this version can tell apart from other files; choose "
                         "another --out, or remove them")


def _resumable(out_dir: str, manifest: dict, ident: dict) -> list:
    run = manifest.get("run")
    if run is None:
        raise BatchError(f"{out_dir} holds a run of an older version, which cannot be resumed: "
                         "--overwrite")
    for what in ("model_sha256", "format", "inputs", "outputs"):
        if run.get(what) != ident[what]:
            name = {"model_sha256": "model", "format": "--format"}.get(what, what)
            raise BatchError(f"--resume: the run in {out_dir} had another {name}; resume it with "
                             "the same model, inputs and --format, or --overwrite")
    return list(run["parts"])


def _kept_keys(out_dir: str, prefixes: list) -> set:
    """The inputs the interrupted run's part files hold. Ours appear whole or not at all, but
    Ray Data's writer writes in place: a file it was writing when the run died is unreadable,
    and is removed (its inputs run again)."""
    done = set()
    for path in part_files(out_dir, prefixes):
        try:
            done.update(part_keys(path))
        except Exception:                # noqa: BLE001 - pyarrow's or zipfile's, for a torn file
            os.unlink(path)
    return done


def _leftovers(out_dir: str) -> list:
    """Of a run's files, those a resumption writes again: the errors (merged and not), and the
    temporaries of writers that were killed."""
    names = [n for n in os.listdir(out_dir) if n.startswith(TMP_PREFIX) or n == ERRORS_FILE]
    folder = os.path.join(out_dir, ERROR_PARTS)
    if os.path.isdir(folder) and not os.path.islink(folder):
        names += [os.path.join(ERROR_PARTS, n) for n in os.listdir(folder)
                  if ERROR_PART_RE.match(n) or n.startswith(TMP_PREFIX)]
    return names


def _parts(out_dir: str, prefixes: Optional[list]) -> list:
    return [n for n in os.listdir(out_dir) if is_part(n, prefixes)]


def _remove(out_dir: str, names: list) -> None:
    """Unlink these files (never a folder: a run writes none but _errors, removed when empty)."""
    for name in names:
        path = os.path.join(out_dir, name)
        if os.path.islink(path) or os.path.isfile(path):
            os.unlink(path)
    try:
        os.rmdir(os.path.join(out_dir, ERROR_PARTS))
    except OSError:
        pass                             # absent, or holds files of someone else's
