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
- Nothing in the folder is trusted that another user could have put there: the folder must be
  ours alone (owned by our euid, writable by nobody else, its parents as the kernel cache's
  are), and every file a run reads, writes or removes there is reached through the folder's
  descriptor without following a link and must be a regular file of ours. _outputs.json and the
  part files are still checked as input: prefixes of the form a run writes, parts that hold
  only this run's inputs, once each, with the outputs the manifest lists.
"""
from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import secrets
import stat
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from tflite_taichi.batch.outputs import (_O_FOLDER, ERROR_PARTS, ERROR_PART_RE, ERRORS_FILE,
                                         INFO_FILE, LOCK_FILE, TMP_PREFIX, OutFolder, is_part,
                                         not_ours, part_names, part_prefixes, read_manifest,
                                         read_part, write_manifest)
from tflite_taichi.errors import BatchError
from tflite_taichi.runtime.cache import foreign_link, open_from_root

_O_LOCK = (os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
           | getattr(os, "O_NONBLOCK", 0))


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


# -- the folder: ours alone, opened from / -----------------------------------------------------
def open_out(out_dir: str) -> OutFolder:
    """--out as an OutFolder (made if absent, with its missing parents, writable by us only):
    opened one name at a time from /, each parent checked as it is opened (owned by root or us,
    writable by nobody else unless sticky like /tmp: else another user could put another folder
    in its place), and the folder itself ours alone; BatchError otherwise."""
    given = os.path.abspath(out_dir)
    _check_links(out_dir, given)
    real = os.path.realpath(given)
    fd = open_from_root(real, _open_child, lambda problem: BatchError(f"--out {out_dir}: {problem}"))
    try:
        problem = not_ours(os.fstat(fd), real, folder=True)
        if problem is not None:
            raise BatchError(f"--out {out_dir}: {problem}: a batch run reads, writes and removes "
                             "files there, so it must be a folder of yours that nobody else can "
                             "write; choose another --out")
    except BaseException:
        os.close(fd)
        raise
    return OutFolder(real, fd)


def _check_links(out_dir: str, given: str) -> None:
    """A symbolic link on the way to --out must be root's or ours: another user's link could
    point the run's removals anywhere (cache.foreign_link)."""
    found = foreign_link(given)
    if found is not None:
        raise BatchError(f"--out {out_dir}: {found[0]} is a symbolic link owned by uid "
                         f"{found[1]}, not by you: refusing to follow it")


def _open_child(parent_fd: int, name: str, where: str) -> int:
    """The folder `name` in `parent_fd`, not through a link; made if absent (writable by us
    only, whatever the umask)."""
    try:
        os.mkdir(name, 0o755, dir_fd=parent_fd)
        made = True
    except FileExistsError:
        made = False
    except OSError as e:
        raise BatchError(f"cannot make the folder {where}: {e.strerror or e}") from None
    try:
        fd = os.open(name, _O_FOLDER, dir_fd=parent_fd)
    except OSError as e:
        why = ("a symbolic link, replaced since it was resolved" if e.errno == errno.ELOOP
               else e.strerror or str(e))
        raise BatchError(f"cannot open the folder {where}: {why}") from None
    if made:
        os.fchmod(fd, stat.S_IMODE(os.fstat(fd).st_mode) & ~0o022)
    return fd


class Claim:
    """The folder's lock, held while `with Claim(out_dir) as claim:` runs; claim.folder is the
    folder, open and checked (open_out)."""

    def __init__(self, out_dir: str):
        self.out_dir = out_dir
        self.folder: Optional[OutFolder] = None
        self.lock_fd: Optional[int] = None

    def __enter__(self):
        import fcntl
        self.folder = open_out(self.out_dir)
        try:
            self.lock_fd = self._open_lock()
            try:
                fcntl.flock(self.lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                owner = os.pread(self.lock_fd, 64, 0).decode(errors="replace").strip()
                raise BatchError(f"{self.out_dir} is in use by another batch run (process "
                                 f"{owner or '?'} holds the lock {self.folder.where(LOCK_FILE)}): "
                                 "wait for it, or choose another --out") from None
            os.ftruncate(self.lock_fd, 0)
            os.pwrite(self.lock_fd, f"{os.getpid()}\n".encode(), 0)
        except BaseException:
            self.__exit__()
            raise
        return self

    def _open_lock(self) -> int:
        """The lock file, never through a link (one planted there would have the PID written
        over whatever it points at), and a regular file of ours."""
        where = self.folder.where(LOCK_FILE)
        try:
            # 0600: no umask can make it group-writable, which the next run would refuse
            fd = os.open(LOCK_FILE, _O_LOCK, 0o600, dir_fd=self.folder.fd)
        except OSError as e:
            why = ("it is a symbolic link, and nothing in a batch output folder is followed"
                   if e.errno == errno.ELOOP else e.strerror or str(e))
            raise BatchError(f"cannot open the lock {where}: {why}") from None
        problem = not_ours(os.fstat(fd), where)
        if problem is not None:
            os.close(fd)
            raise BatchError(f"the lock {problem}: a batch run trusts nothing in its output "
                             "folder that is not its own")
        return fd

    def __exit__(self, *exc):
        if self.lock_fd is not None:
            os.close(self.lock_fd)       # closing the file drops the lock
            self.lock_fd = None
        if self.folder is not None:
            self.folder.close()


def prepare(folder: OutFolder, ident: dict, keys: set, *, overwrite: bool,
            resume: bool) -> RunRecord:
    """Make the locked folder ready for a run of the inputs keyed `keys` and record it; returns
    the run's record."""
    if overwrite and resume:
        raise BatchError("--resume keeps a previous run's outputs and --overwrite removes "
                         "them: choose one")
    _check_error_parts(folder)
    manifest = read_manifest(folder)
    if manifest is None:
        _refuse_strangers(folder)
        parts, done = [], set()
    elif resume:
        parts = _resumable(folder, manifest, ident)
        done = _kept_keys(folder, parts, ident["outputs"], keys)
        _remove(folder, _leftovers(folder))         # its errors are found again: run again
    elif overwrite:
        _remove(folder, _leftovers(folder) + part_names(folder, part_prefixes(manifest))
                + [INFO_FILE])
        parts, done = [], set()
    else:
        raise BatchError(f"{folder.path} already holds a batch run's outputs: choose another "
                         "--out, --overwrite to replace them, or --resume to finish that run")
    prefix = f"part-{secrets.token_hex(4)}"
    record = RunRecord(prefix=prefix, parts=parts + [prefix], identity=ident, done=done)
    write_manifest(folder.path, ident["outputs"], record.manifest(finished=False), summary=None)
    return record


def _check_error_parts(folder: OutFolder) -> None:
    """_errors, where the workers write and --overwrite removes: if there, a folder of ours and
    not a link (else BatchError, from OutFolder.subfolder)."""
    parts = folder.subfolder(ERROR_PARTS)
    if parts is not None:
        parts.close()


def _refuse_strangers(folder: OutFolder) -> None:
    """Files a run writes, in a folder without _outputs.json: a run of an older version, killed
    before its summary; which files were its own is not known, so none is taken over."""
    ours = [n for n in folder.names() if n == ERRORS_FILE or is_part(n, None)]
    errors = folder.subfolder(ERROR_PARTS)
    if errors is not None:
        with errors:
            ours += [os.path.join(ERROR_PARTS, n) for n in errors.names() if ERROR_PART_RE.match(n)]
    if ours:
        raise BatchError(f"{folder.path} holds {', '.join(sorted(ours)[:3])} but no {INFO_FILE}: "
                         "not a run this version can tell apart from other files; choose "
                         "another --out, or remove them")


def _resumable(folder: OutFolder, manifest: dict, ident: dict) -> list:
    run = manifest.get("run")
    if run is None:
        raise BatchError(f"{folder.path} holds a run of an older version, which cannot be "
                         "resumed: --overwrite")
    for what in ("model_sha256", "format", "inputs", "outputs"):
        if run.get(what) != ident[what]:
            raise BatchError(f"--resume: the run in {folder.path} {_differs(what, run.get(what), ident[what])}; "
                             "resume it with the same model, inputs and --format, or --overwrite")
    return list(run["parts"])


def _differs(what: str, had, given) -> str:
    if what == "inputs":
        return f"had other inputs ({had}, not {given})"
    if what == "format":
        return f"had another --format ({had}, not {given})"
    if what == "model_sha256":
        return "had another model"
    return "had other outputs (another model)"


def _kept_keys(folder: OutFolder, prefixes: list, info: list, keys: set) -> set:
    """The inputs the interrupted run's part files hold. Ours appear whole or not at all, but
    Ray Data's writer writes in place: a file it was writing when the run died is unreadable,
    and is removed (its inputs run again). A part that is readable but is not this run's (an
    input it holds is not one of this run's, or is in another part too, or its outputs are not
    the manifest's) refuses the resumption: taking it would skip inputs that never ran."""
    done = set()
    for name in part_names(folder, prefixes):
        try:
            held, columns = read_part(folder, name, info)
        except BatchError:
            raise                        # a link, another user's file: not ours to remove
        except Exception:                # noqa: BLE001 - pyarrow's or zipfile's, for a torn file
            folder.remove(name)
            continue
        problem = _part_problem(held, columns, info, keys, done)
        if problem is not None:
            raise BatchError(f"--resume: {folder.where(name)} is not a part this run wrote "
                             f"({problem}); --overwrite to run every input again")
        done.update(held)
    return done


def _part_problem(held: list, columns: dict, info: list, keys: set, done: set) -> Optional[str]:
    """Why a part's content is not what this run writes (None: it is)."""
    strange = [k for k in held if k not in keys]
    if strange:
        return f"it holds {strange[0]!r}, not an input of this run"
    seen = set(done)
    for key in held:
        if key in seen:
            return f"it holds {key!r} twice, or another part holds it too"
        seen.add(key)
    if sorted(columns) != sorted(spec["column"] for spec in info):
        return f"its outputs are {sorted(columns)}, not {sorted(s['column'] for s in info)}"
    for spec in info:
        value = np.asarray(columns[spec["column"]])
        if list(value.shape) != [len(held), *spec["shape"]] or value.dtype != np.dtype(spec["dtype"]):
            return (f"output {spec['column']!r} is {value.dtype} {list(value.shape)}, not "
                    f"{spec['dtype']} {[len(held), *spec['shape']]}")
    return None


def _leftovers(folder: OutFolder) -> list:
    """Of a run's files, those a resumption writes again: the errors (merged and not), and the
    temporaries of writers that were killed."""
    names = [n for n in folder.names() if n.startswith(TMP_PREFIX) or n == ERRORS_FILE]
    errors = folder.subfolder(ERROR_PARTS)
    if errors is not None:
        with errors:
            names += [os.path.join(ERROR_PARTS, n) for n in errors.names()
                      if ERROR_PART_RE.match(n) or n.startswith(TMP_PREFIX)]
    return names


def _remove(folder: OutFolder, names: list) -> None:
    """Unlink these files where they are regular files of ours (never a folder, never a link's
    target: a run writes no folder but _errors, which stays for this run's workers)."""
    errors = folder.subfolder(ERROR_PARTS)
    with contextlib.ExitStack() as stack:
        if errors is not None:
            stack.enter_context(errors)
        for name in names:
            where, base = (errors, name[len(ERROR_PARTS) + 1:]) \
                if name.startswith(ERROR_PARTS + os.sep) else (folder, name)
            if where is not None:
                where.remove(base)
