"""The kernel cache: compiled AOT modules on disk, so a model compiles once per machine.

`Interpreter(..., cache_dir=None, model_token=None)`: the official GPU delegate's
serialization (its `serialization_dir` and `model_token`), done for every backend. A program's
kernels (delegate.py) are compiled once by Taichi's Python frontend and saved as a Taichi AOT
module here; a later process loads the module through Taichi's C API in milliseconds and never
runs the frontend for that model (device.py).

- `cache_dir=None` (default): the per-user cache, `$TFLITE_TAICHI_CACHE_DIR`, else
  `$XDG_CACHE_HOME/tflite_taichi`, else `~/.cache/tflite_taichi`: the second run of a script
  is warm without asking. `cache_dir=False`: no cache (modules are built in a temporary folder
  and removed once loaded). A path: that folder.
- `model_token`: names the model's record (default: the sha256 fingerprint of everything the
  kernels depend on, `token_covers`).

DIR (created 0700, files 0600, missing parents 0700; an existing DIR must be owned by the user
and not group- or world-writable, and every parent owned by root or the user and writable by
nobody else unless sticky like /tmp; nothing found in it is trusted before it is checked):

    lock                 flock'ed around every module write, removal and eviction
    modules/KEY/         one AOT module: module.tcm (Vulkan, OpenGL/GLES, Metal) or module/
                         (a saved folder: the LLVM archs, cuda and cpu, load only those), and
                         meta.json: what it was built for, and the size and sha256 of every file
    models/TOKEN.json    one record per model token: what the token covers
    xdg/ mesa/ nvidia-gl/ cuda/   the GPU drivers' own caches (pipelines, shaders, PTX), pointed
                         here while a runtime starts (they check their own entries)

What is trusted, and why:
- KEY is the sha256 of the token's covers (the model bytes, backend, precision, options,
  package and Taichi versions), the subgraph, its input shapes and a digest of the programs'
  plans (every offset the kernels bake in). A module is loaded only for exactly that program: a
  token reused for another model gives a cold start, never another model's kernels.
- A module is read through descriptors opened from / down (no link followed, owner and mode
  checked with fstat on each) and loaded from exactly what was checked (open_root, _scan_fd,
  CheckedModule), under a shared lock that removals and evictions wait for.
- Before a module is loaded, every file under modules/KEY is checked against meta.json: a
  missing, extra, truncated or altered file, a symbolic link or other non-regular file, or a
  malformed meta.json -> a CacheWarning, the module removed and built again. A module that
  passes but that the C API refuses (another driver, device or Taichi build: Taichi checks the
  device capabilities a module needs) is rebuilt the same way.
- Modules are written into a temporary folder under modules/, hashed, then renamed into place
  under the lock: a process killed at any point leaves a complete module or none (stale
  temporary folders are removed). Processes may share DIR.
- The folder is capped (`max_bytes`, default 2 GiB, `$TFLITE_TAICHI_CACHE_MAX_MB`): the least
  recently used modules go first.
- backend='reference' compiles nothing: its cache arguments are validated, not used.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import glob
import hashlib
import importlib.util
import json
import os
import platform
import re
import shutil
import stat
import sys
import tempfile
import time
import uuid
import warnings
from typing import Optional

from tflite_taichi import switches
from tflite_taichi.errors import (BackendUnavailable, CacheError, CacheWarning,  # noqa: F401
                                  InputError)  # CacheError, CacheWarning: also read from here
from tflite_taichi.runtime.session import SESSION

try:
    import fcntl
except ImportError:          # Windows: no flock; a cache_dir is then for one process at a time
    fcntl = None

FORMAT = 2
TOKEN_PATTERN = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
KEY_PATTERN = re.compile(r"[0-9a-f]{64}")
LOCK = "lock"
MODULES = "modules"
MODELS = "models"
META = "meta.json"
DRIVER_ENV = {                               # variable -> folder under DIR
    "XDG_CACHE_HOME": "xdg",
    "MESA_SHADER_CACHE_DIR": "mesa",
    "__GL_SHADER_DISK_CACHE_PATH": "nvidia-gl",
    "CUDA_CACHE_PATH": "cuda",
}
SUBDIRS = (MODULES, MODELS, "taichi", "xdg", "mesa", "nvidia-gl", "cuda")
DEFAULT_MAX_BYTES = 2 << 30
STALE_TEMP_S = 3600.0            # a temporary module folder older than this was left by a crash


# -- arguments --------------------------------------------------------------------------------
def check_arguments(cache_dir, model_token) -> None:
    """Validate Interpreter(cache_dir=, model_token=) before anything starts (InputError)."""
    if cache_dir is False:
        if model_token is not None:
            raise InputError("model_token needs a cache: it names a record in cache_dir, and "
                             "cache_dir=False turns the cache off")
        return
    if cache_dir is not None and (not isinstance(cache_dir, (str, os.PathLike))
                                  or isinstance(os.fspath(cache_dir), bytes)
                                  or not os.fspath(cache_dir)):
        raise InputError(f"cache_dir must be None (the per-user cache), False (no cache) or a "
                         f"non-empty str or os.PathLike, got {cache_dir!r}")
    if model_token is not None:
        check_token(model_token)


def check_token(token) -> str:
    """A user-given token: 1-128 of [A-Za-z0-9_.-], not starting with '.' or '-' (InputError).
    It becomes a file name under DIR/models, so nothing that could be a path is accepted."""
    if not isinstance(token, str) or not TOKEN_PATTERN.fullmatch(token):
        raise InputError(f"model_token must be 1-128 characters of [A-Za-z0-9_.-] starting with "
                         f"a letter, digit or '_' (it names a file in the cache), got {token!r}")
    return token


def default_dir() -> str:
    """The per-user cache: $TFLITE_TAICHI_CACHE_DIR, $XDG_CACHE_HOME/tflite_taichi or
    ~/.cache/tflite_taichi."""
    given = switches.value("TFLITE_TAICHI_CACHE_DIR")
    if given:
        return given
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "tflite_taichi")


def resolve_path(cache_dir) -> str:
    return os.path.realpath(os.path.abspath(os.path.expanduser(os.fspath(cache_dir))))


def max_bytes() -> int:
    given = switches.value("TFLITE_TAICHI_CACHE_MAX_MB")
    return DEFAULT_MAX_BYTES if given is None else max(int(given * (1 << 20)), 0)


# -- versions and fingerprints ----------------------------------------------------------------

def _package_source_folders() -> list:
    """The folders of tflite_taichi, its runtime wing and its subpackages ops and quant with
    theirs (an op family's package: ops/conv/), the last two found by their import specs (which
    name a package's folders without running it): the cache sits below ops and quant and must
    not import them to hash them."""
    runtime = os.path.dirname(os.path.abspath(__file__))
    folders = [os.path.dirname(runtime), runtime]    # tflite_taichi/ (codegen.py...), runtime/
    for sub in ("ops", "quant"):
        spec = importlib.util.find_spec(f"tflite_taichi.{sub}")
        for top in (spec.submodule_search_locations or ()) if spec is not None else ():
            folders += [top] + sorted(os.path.join(top, name) for name in os.listdir(top)
                                      if os.path.isfile(os.path.join(top, name, "__init__.py")))
    return list(dict.fromkeys(os.path.realpath(f) for f in folders))


# a memo, not process state: the sources this process's kernels are generated from are those
# it imported, so their digest is read once and stands for the process
@functools.lru_cache(maxsize=1)
def _package_source_digest() -> str:
    """sha256 of this package's installed Python sources (kernels are generated from them): a
    checkout edited without a version bump still gets new default tokens. The files are read
    from the package's folders, not imported."""
    h = hashlib.sha256()
    for top in _package_source_folders():
        for name in sorted(os.listdir(top)):
            if name.endswith(".py"):
                path = os.path.join(top, name)
                h.update(os.path.basename(top).encode() + b"/" + name.encode() + b"\0")
                with open(path, "rb") as f:
                    h.update(f.read())
    return h.hexdigest()[:16]


# a memo, not process state: the Taichi this process runs is fixed when it starts (taichi_build.py)
@functools.lru_cache(maxsize=1)
def taichi_version() -> str:
    """The installed taichi's version, from the METADATA of its distribution beside the package
    when there is exactly one: importing importlib.metadata alone took 60 ms of a 0.5 s warm
    start on the 2-core machine. Anything else asks importlib.metadata."""
    from tflite_taichi.runtime import taichi_build
    if taichi_build.is_forge():              # its modules are the fork's (taichi_build.py)
        return taichi_build.version()
    spec = importlib.util.find_spec("taichi")          # finds the package, does not import it
    if spec is None:
        return "absent"
    for folder in spec.submodule_search_locations or ():
        found = glob.glob(os.path.join(os.path.dirname(folder), "taichi-*.dist-info", "METADATA"))
        if len(found) == 1:
            with open(found[0], encoding="utf-8", errors="replace") as f:
                for line in f:
                    if line.startswith("Version:"):
                        return line.split(":", 1)[1].strip()
                    if not line.strip():        # the headers end at the first empty line
                        break
    from importlib import metadata
    try:
        return metadata.version("taichi")
    except metadata.PackageNotFoundError:
        return "absent"


def versions() -> dict:
    """What a module depends on besides the model (a module built under others is not loaded)."""
    import numpy
    from tflite_taichi.version import __version__
    return {"format": FORMAT, "taichi": taichi_version(), "tflite_taichi": __version__,
            "tflite_taichi_source": _package_source_digest(), "numpy": numpy.__version__,
            "python": "%d.%d" % sys.version_info[:2], "machine": platform.machine(),
            "system": platform.system(),
            # the switches that change generated kernels (tflite_taichi/switches.py)
            "switches": switches.kernel_key()}


def _digest_source(source) -> tuple:
    """(sha256, size) of the model: a path (read in chunks) or bytes-like content."""
    h = hashlib.sha256()
    if isinstance(source, (str, os.PathLike)):
        size = 0
        with open(source, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
                size += len(chunk)
        return h.hexdigest(), size
    view = memoryview(source)
    h.update(view)
    return h.hexdigest(), view.nbytes


def token_covers(source, backend: str, precision: str, max_delegated_partitions: int = 1,
                 preserve_all_tensors: bool = False, reference_ops=()) -> dict:
    """Everything the default token is a fingerprint of (recorded with every token)."""
    sha, size = _digest_source(source)
    return {"model_sha256": sha, "model_size": size, "backend": backend, "precision": precision,
            "max_delegated_partitions": int(max_delegated_partitions),
            "preserve_all_tensors": bool(preserve_all_tensors),
            "reference_ops": sorted(reference_ops), **versions()}


def default_token(covers: dict) -> str:
    """model_token=None: the sha256 of what the token covers (64 hex digits)."""
    return hashlib.sha256(json.dumps(covers, sort_keys=True).encode()).hexdigest()


# -- the folder, and what may be trusted in it ------------------------------------------------
# A cached module is native code (cpu) or GPU code that runs in this process, so the decision to
# load it is made on what is actually read, at the moment it is read: every folder from / down to
# the module is opened by name relative to the folder above it, without following symbolic
# links, and checked with fstat on the open descriptor; the module is then read through those
# descriptors (gfx: its bytes, hashed and handed to the C API; LLVM archs: a /proc/self/fd path
# to the checked folder). A path that is checked and then opened again by name could be swapped
# in between; a descriptor cannot.
_POSIX = hasattr(os, "getuid") and hasattr(os, "O_NOFOLLOW") and hasattr(os, "O_DIRECTORY")
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_O_FOLDER = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_NOFOLLOW", 0) | _O_CLOEXEC
# O_NONBLOCK: a FIFO planted under a module's name must not block the open
_O_ENTRY = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | _O_CLOEXEC | getattr(os, "O_NONBLOCK", 0)
_FD_PATHS = "/proc/self/fd"      # a path through a descriptor: the folder opened, not its name


def _uid() -> int:
    return os.getuid() if hasattr(os, "getuid") else 0


def parent_problem(st: os.stat_result, path: str) -> Optional[str]:
    """Why a parent of DIR lets another user replace DIR (None: it does not). Safe: owned by
    root or you, and writable by nobody else, or sticky like /tmp (others may add entries there
    but cannot rename or remove yours)."""
    if st.st_uid not in (0, _uid()):
        return (f"its parent folder {path} is owned by uid {st.st_uid}: that user could put "
                "another folder in its place")
    if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
        return (f"its parent folder {path} is group- or world-writable (mode "
                f"{stat.S_IMODE(st.st_mode):04o}) without the sticky bit: anyone who can write "
                "there could put another folder in its place")
    return None


def _private_problem(st: os.stat_result, path: str, what: str = "cache_dir") -> Optional[str]:
    """Why a folder or file in DIR is not yours alone to change (None: it is)."""
    if _POSIX and st.st_uid != _uid():
        return (f"{what} {path} is owned by uid {st.st_uid}, not by you (uid {_uid()}): a cache "
                "another user controls is never trusted")
    if st.st_mode & 0o022:
        return (f"{what} {path} is group- or world-writable (mode {stat.S_IMODE(st.st_mode):04o}): "
                "anyone who can write there could plant kernels; chmod 700 it or choose another "
                "folder")
    return None


def _open_child(parent_fd: int, name: str, path: str, create: bool) -> int:
    """The folder `name` in `parent_fd`, opened without following a link (created 0700 whatever
    the umask if absent and `create`), or CacheError."""
    made = False
    while True:
        try:
            return _fchmod_if(os.open(name, _O_FOLDER, dir_fd=parent_fd), made)
        except FileNotFoundError:
            if not create or made:
                raise CacheError(f"cache_dir: {path} does not exist") from None
            try:
                os.mkdir(name, 0o700, dir_fd=parent_fd)
                made = True
            except FileExistsError:
                made = True              # made by another process meanwhile: opened and checked
            except OSError as e:
                raise CacheError(f"cannot create cache folder {path}: {e.strerror}") from None
        except NotADirectoryError:
            raise CacheError(f"cache_dir {path} exists and is not a directory") from None
        except OSError as e:
            if os.path.islink(path):     # ELOOP from O_NOFOLLOW
                raise CacheError(f"{path} is a symbolic link: the cache is opened without "
                                 "following links (give cache_dir as the real path)") from None
            raise CacheError(f"cannot open cache folder {path}: {e.strerror}") from None


def _fchmod_if(fd: int, made: bool) -> int:
    if made and os.fstat(fd).st_uid == _uid():
        os.fchmod(fd, 0o700)             # mkdir's mode passes through the umask
    return fd


def open_from_root(path: str, open_child, refuse) -> int:
    """A descriptor on the folder `path` (absolute, symbolic links resolved), opened one name
    at a time from /, every parent checked as it is opened (parent_problem: `refuse(problem)`
    is the exception raised), each name by `open_child(parent descriptor, name, its path)`.
    The folder itself is the caller's to check; the caller closes it. The kernel cache and a
    batch run's --out are opened so."""
    fd, where = os.open("/", _O_FOLDER), "/"
    try:
        for name in [n for n in path.split("/") if n]:
            problem = parent_problem(os.fstat(fd), where)
            if problem is not None:
                raise refuse(problem)
            where = os.path.join(where, name)
            child = open_child(fd, name, where)
            os.close(fd)
            fd = child
        return fd
    except BaseException:
        os.close(fd)
        raise


def open_root(root: str, create: bool = False) -> int:
    """A descriptor on the cache folder `root` (absolute, symbolic links resolved), opened from
    / with every parent checked (open_from_root) and `root` itself private (_private_problem);
    CacheError otherwise. The caller closes it."""
    fd = open_from_root(root, lambda parent, name, where: _open_child(parent, name, where, create),
                        lambda problem: CacheError(f"cache_dir {root}: {problem}"))
    try:
        problem = _private_problem(os.fstat(fd), root)
        if problem is not None:
            raise CacheError(problem)
        return fd
    except BaseException:
        os.close(fd)
        raise


def _open_subfolder(root_fd: int, root: str, sub: str, create: bool = False) -> int:
    """DIR/sub through DIR's descriptor, private (CacheError otherwise)."""
    fd = _open_child(root_fd, sub, os.path.join(root, sub), create)
    problem = _private_problem(os.fstat(fd), os.path.join(root, sub), "cache folder")
    if problem is not None:
        os.close(fd)
        raise CacheError(problem)
    return fd


def foreign_link(given: str) -> Optional[tuple]:
    """(path, owner's uid) of the first symbolic link on the way to the absolute path `given`
    that neither root nor you own, or None. Such a link could point your folder anywhere
    later: it is followed once, where it is checked, and the real path used from then on (the
    kernel cache and a batch run's --out). What does not exist yet is not looked at."""
    path = "/"
    for name in [n for n in given.split("/") if n]:
        path = os.path.join(path, name)
        try:
            st = os.lstat(path)
        except OSError:
            return None                     # absent from here on: made later
        if stat.S_ISLNK(st.st_mode) and st.st_uid not in (0, _uid()):
            return path, st.st_uid
    return None


def _check_links(given: str) -> None:
    """A symbolic link on the way to cache_dir must be root's or yours (foreign_link)."""
    found = foreign_link(given)
    if found is not None:
        raise CacheError(f"cache_dir {given}: {found[0]} is a symbolic link owned by uid "
                         f"{found[1]}, not by you: refusing to follow it")


def prepare_dir(cache_dir) -> str:
    """The absolute, checked cache folder (created 0700 with its subfolders, parents too), or
    CacheError: its parents must be safe (parent_problem) and it must be yours alone."""
    given = os.path.abspath(os.path.expanduser(os.fspath(cache_dir)))
    if not _POSIX:                  # no owners or descriptors to check (Windows): modes only
        os.makedirs(given, mode=0o700, exist_ok=True)
        for sub in SUBDIRS:
            os.makedirs(os.path.join(given, sub), mode=0o700, exist_ok=True)
        return given
    _check_links(given)
    root = resolve_path(given)
    root_fd = open_root(root, create=True)
    try:
        for sub in SUBDIRS:
            os.close(_open_subfolder(root_fd, root, sub, create=True))
    finally:
        os.close(root_fd)
    return root


@contextlib.contextmanager
def locked(root: str, shared: bool = False):
    """An flock on DIR/lock, exclusive (writes, removals, evictions) or shared (a module being
    checked and loaded: no other process removes it meanwhile); blocks while a conflicting one
    is held. Taking it checks DIR and its parents again (CacheError)."""
    if not _POSIX:
        yield
        return
    root_fd = open_root(root)
    try:
        fd = os.open(LOCK, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | _O_CLOEXEC, 0o600,
                     dir_fd=root_fd)
    except OSError as e:
        os.close(root_fd)
        raise CacheError(f"cannot open the cache's lock {os.path.join(root, LOCK)}: "
                         f"{e.strerror}") from None
    try:
        if fcntl is not None:
            fcntl.flock(fd, fcntl.LOCK_SH if shared else fcntl.LOCK_EX)
        yield root_fd
    finally:
        os.close(fd)                 # closing releases the flock
        os.close(root_fd)


def _write_json(path: str, obj) -> None:
    """Atomically: a 0600 temp file in the same folder, fsync'ed, then os.replace."""
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".json", dir=os.path.dirname(path))
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(obj, f, indent=1, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _read_json(path: str):
    """(object, None), (None, None) when absent, or (None, why) when unreadable."""
    try:
        with open(path, "rb") as f:
            return json.loads(f.read().decode("utf-8")), None
    except FileNotFoundError:
        return None, None
    except (OSError, ValueError) as e:
        return None, f"{os.path.basename(path)} is unreadable ({type(e).__name__})"


def _file_digest(path: str) -> dict:
    h = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
            size += len(chunk)
    return {"size": size, "sha256": h.hexdigest()}


def _read_fd(fd: int, keep: bool = False) -> tuple:
    """({size, sha256}, the bytes if `keep` else None) of the open file `fd`."""
    h = hashlib.sha256()
    size, chunks = 0, []
    while True:
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            break
        h.update(chunk)
        size += len(chunk)
        if keep:
            chunks.append(chunk)
    return {"size": size, "sha256": h.hexdigest()}, (b"".join(chunks) if keep else None)


def _scan_fd(folder_fd: int, folder: str, keep: str = "", prefix: str = "") -> tuple:
    """What is under the open folder `folder_fd`, read through descriptors: ({relative path:
    {size, sha256}} of its files but the top meta.json, [problems: what is not a regular file or
    folder, or not yours alone], the bytes of the file `keep`)."""
    files, problems, kept = {}, [], None
    for name in sorted(os.listdir(folder_fd)):
        rel = prefix + name
        if rel == META:
            continue
        try:
            fd = os.open(name, _O_ENTRY, dir_fd=folder_fd)
        except OSError:              # a symbolic link (ELOOP), or gone
            problems.append(f"{rel} is not a regular file")
            continue
        try:
            st = os.fstat(fd)
            owner = _private_problem(st, os.path.join(folder, rel), "cached file")
            if owner is not None:
                problems.append(owner)
            elif stat.S_ISDIR(st.st_mode):
                sub_files, sub_problems, sub_kept = _scan_fd(fd, folder, keep, rel + "/")
                files.update(sub_files)
                problems += sub_problems
                kept = kept if sub_kept is None else sub_kept
            elif stat.S_ISREG(st.st_mode):
                files[rel], data = _read_fd(fd, keep=rel == keep)
                kept = kept if data is None else data
            else:
                problems.append(f"{rel} is not a regular file")
        finally:
            os.close(fd)
    return files, problems, kept


def scan(folder: str) -> tuple:
    """({relative path: {size, sha256}} of the files under `folder` but meta.json,
    [relative paths of what is not a plain file or folder]): a module this process just built."""
    files, odd = {}, []
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames.sort()
        for name in list(dirnames):
            if os.path.islink(os.path.join(dirpath, name)):
                odd.append(os.path.relpath(os.path.join(dirpath, name), folder))
                dirnames.remove(name)
        for name in sorted(filenames):
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, folder).replace(os.sep, "/")
            if rel == META:
                continue
            if os.path.islink(path) or not os.path.isfile(path):
                odd.append(rel)
                continue
            files[rel] = _file_digest(path)
    return files, odd


def _chmod_private(folder: str) -> None:
    for dirpath, _dirnames, filenames in os.walk(folder):
        os.chmod(dirpath, 0o700)
        for name in filenames:
            os.chmod(os.path.join(dirpath, name), 0o600)


# -- one cache folder --------------------------------------------------------------------------
def taichi_offline_dir(root: Optional[str]) -> Optional[str]:
    """Where Taichi's Python frontend keeps its compilation manager's files (ticache.tcb and
    its lock) for a cache folder: inside it, not in ~/.cache/taichi, so a test run's temporary
    cache takes them along and a user's cache_dir holds everything that is ours."""
    return os.path.join(root, "taichi") if root else None


TAICHI_LOCK_FILE = "ticache.lock"
STALE_TAICHI_LOCK_S = 60.0   # Taichi holds it for a metadata read or write (milliseconds)


def remove_stale_taichi_lock(folder: Optional[str]) -> bool:
    """Remove Taichi's lock file in `folder` if a process killed mid-write left it: Taichi
    takes it with O_CREAT|O_EXCL and never times it out, so every later process prints
    "Lock ... failed" and skips the cache. True if one was removed."""
    if not folder:
        return False
    path = os.path.join(folder, TAICHI_LOCK_FILE)
    try:
        if time.time() - os.stat(path).st_mtime <= STALE_TAICHI_LOCK_S:
            return False
        os.remove(path)
        return True
    except OSError:              # absent, or removed by another process in between
        return False


@contextlib.contextmanager
def environment(values: dict):
    """os.environ with `values` set, restored after (variables that were unset are removed)."""
    saved = {var: os.environ.get(var) for var in values}
    try:
        os.environ.update(values)
        yield
    finally:
        for var, value in saved.items():
            if value is None:
                os.environ.pop(var, None)
            else:
                os.environ[var] = value


@contextlib.contextmanager
def driver_env(root: Optional[str]):
    """The GPU drivers' cache variables pointed into DIR while a runtime starts (the drivers
    read them once), restored after: child processes and other libraries keep their own."""
    if root is None:
        yield
        return
    with environment({var: os.path.join(root, sub) for var, sub in DRIVER_ENV.items()}):
        yield


# Eviction scans every module folder: done at a process's first commit to a folder, then after
# EVICT_EVERY commits or EVICT_AFTER_S seconds (a test run commits thousands of modules; a scan
# per commit made that quadratic: 6,700 modules, minutes of stat calls)
# (the counts are the session's: SESSION.evictions)
EVICT_EVERY, EVICT_AFTER_S = 64, 60.0


def _eviction_due(root: str) -> bool:
    evictions = SESSION.evictions
    commits, last = evictions.get(root, (EVICT_EVERY, 0.0))
    if commits + 1 >= EVICT_EVERY or time.time() - last >= EVICT_AFTER_S:
        evictions[root] = (0, time.time())
        return True
    evictions[root] = (commits + 1, last)
    return False


def _compare(files: dict, listed: dict) -> Optional[str]:
    """Why the files found differ from those meta.json lists (None: they match)."""
    for rel in sorted(set(listed) | set(files)):
        if rel not in files:
            return f"{rel} is missing"
        if rel not in listed:
            return f"{rel} is not in its {META}"
        got, want = files[rel], listed[rel]
        if not isinstance(want, dict) or got["size"] != want.get("size"):
            recorded = want.get("size") if isinstance(want, dict) else "?"
            return f"{rel} has {got['size']} bytes, {recorded} recorded (truncated?)"
        if got["sha256"] != want.get("sha256"):
            return f"{rel} does not match its recorded sha256 (corrupt)"
    return None


@dataclasses.dataclass
class CheckedModule:
    """A module whose files matched its meta.json when read through descriptors. `path` names
    the checked folder through its descriptor (/proc/self/fd/N/...), so renaming or replacing
    modules/KEY afterwards changes nothing here; `data` is the module's bytes when it is one file
    (gfx archs: what was hashed is what the C API gets). Valid until close()."""
    key: str
    meta: dict
    path: str
    data: Optional[bytes]
    fd: int

    def mark_used(self) -> None:
        """Recently used: evicted last (eviction goes by meta.json's mtime)."""
        with contextlib.suppress(OSError, NotImplementedError):
            if self.fd >= 0:
                os.utime(META, dir_fd=self.fd, follow_symlinks=False)
            else:
                os.utime(os.path.join(os.path.dirname(self.path), META))

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class ModuleStore:
    """The AOT modules of one cache folder."""

    def __init__(self, root: str):
        self.root = root
        self.modules = os.path.join(root, MODULES)

    def path(self, key: str) -> str:
        if not KEY_PATTERN.fullmatch(key):
            raise ValueError(f"not a module key: {key!r}")
        return os.path.join(self.modules, key)

    @contextlib.contextmanager
    def opened(self, key: str, arch: str):
        """Yields (CheckedModule, None) when modules/KEY checks out, under a shared lock so
        that no process evicts or replaces it while it is loaded; (None, why) when it does not
        (it is removed first, with a CacheWarning); (None, None) when absent. CacheError when DIR
        or a parent of it is no longer safe."""
        with locked(self.root, shared=True) as root_fd:
            found, problem = self._verify(root_fd, key, arch)
            if found is not None:
                with contextlib.closing(found):
                    found.mark_used()
                    yield found, None
                return
        if problem is not None:
            self.reject(key, problem)
        yield None, problem

    def check(self, key: str, arch: str) -> Optional[str]:
        """Why modules/KEY would not be loaded (None: it would; 'absent' when it is not there)."""
        with locked(self.root, shared=True) as root_fd:
            found, problem = self._verify(root_fd, key, arch)
            if found is not None:
                found.close()
                return None
            return problem or "absent"

    def info(self, key: str) -> dict:
        """The meta.json of modules/KEY ({} if unreadable)."""
        meta, _ = _read_json(os.path.join(self.path(key), META))
        return meta if isinstance(meta, dict) else {}

    def _verify(self, root_fd: Optional[int], key: str, arch: str) -> tuple:
        """(CheckedModule, None), (None, why) or (None, None) when absent."""
        self.path(key)                                   # the key is a key
        if root_fd is None:                              # no descriptors here (Windows)
            return self._verify_by_path(key, arch)
        modules_fd = _open_subfolder(root_fd, self.root, MODULES)
        try:
            try:
                fd = os.open(key, _O_ENTRY | getattr(os, "O_DIRECTORY", 0), dir_fd=modules_fd)
            except FileNotFoundError:
                return None, None
            except OSError:                              # a link, a file, a FIFO...
                return None, "it is not a folder"
        finally:
            os.close(modules_fd)
        folder = self.path(key)
        try:
            problem = _private_problem(os.fstat(fd), folder, "cached module")
            meta, problem = (None, problem) if problem else self._read_meta(fd, folder, key, arch)
            if problem is None:
                files, problems, data = _scan_fd(fd, folder, keep=meta["module"])
                problem = problems[0] if problems else _compare(files, meta["files"])
            if problem is not None:
                os.close(fd)
                return None, problem
        except BaseException:
            os.close(fd)
            raise
        fd_path = os.path.join(_FD_PATHS, str(fd))
        base = fd_path if os.path.isdir(fd_path) else folder
        return CheckedModule(key, meta, os.path.join(base, meta["module"]), data, fd), None

    @staticmethod
    def _read_meta(folder_fd: int, folder: str, key: str, arch: str) -> tuple:
        """(meta, None) or (None, why) for the meta.json in the open module folder `folder`:
        checked like every other file there (yours alone, a regular file), since it says which
        hashes the module's files must have."""
        try:
            fd = os.open(META, _O_ENTRY, dir_fd=folder_fd)
        except FileNotFoundError:
            return None, f"{META} is missing or malformed"
        except OSError as e:
            return None, f"{META} is unreadable ({type(e).__name__})"
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                return None, f"{META} is not a regular file"
            problem = _private_problem(st, os.path.join(folder, META), "cached file")
            if problem is not None:
                return None, problem
            try:
                meta = json.loads(_read_fd(fd, keep=True)[1].decode("utf-8"))
            except (OSError, ValueError) as e:
                return None, f"{META} is unreadable ({type(e).__name__})"
        finally:
            os.close(fd)
        if (not isinstance(meta, dict) or not isinstance(meta.get("files"), dict)
                or meta.get("format") != FORMAT or meta.get("key") != key
                or not isinstance(meta.get("module"), str)):
            return None, f"{META} is missing or malformed"
        if meta.get("arch") != arch:
            return None, f"it was built for {meta.get('arch')!r}, not {arch!r}"
        return meta, None

    def _verify_by_path(self, key: str, arch: str) -> tuple:
        folder = self.path(key)
        if not os.path.lexists(folder):
            return None, None
        if os.path.islink(folder) or not os.path.isdir(folder):
            return None, "it is not a folder"
        meta, unreadable = _read_json(os.path.join(folder, META))
        if unreadable:
            return None, unreadable
        if (not isinstance(meta, dict) or not isinstance(meta.get("files"), dict)
                or meta.get("format") != FORMAT or meta.get("key") != key
                or not isinstance(meta.get("module"), str) or meta.get("arch") != arch):
            return None, f"{META} is missing or malformed, or for another arch"
        files, odd = scan(folder)
        problem = f"{odd[0]} is not a regular file" if odd else _compare(files, meta["files"])
        if problem is not None:
            return None, problem
        return CheckedModule(key, meta, os.path.join(folder, meta["module"]), None, -1), None

    def reject(self, key: str, problem: str) -> None:
        """A module that cannot be trusted or loaded: warn, remove (it is built again)."""
        warnings.warn(CacheWarning(
            f"tflite_taichi: the cached kernels {key[:16]} in {self.modules} are not used "
            f"({problem}); they are compiled again"), stacklevel=4)
        with locked(self.root):
            self._remove(self.path(key))

    def _remove(self, folder: str) -> None:
        if os.path.islink(folder) or (os.path.lexists(folder) and not os.path.isdir(folder)):
            os.unlink(folder)
        else:
            shutil.rmtree(folder, ignore_errors=True)
        if os.path.lexists(folder):
            raise CacheError(f"cannot remove the untrusted cache entry {folder}")

    @contextlib.contextmanager
    def building(self):
        """A private temporary folder under modules/ to build a module in (removed after)."""
        folder = os.path.join(self.modules, f".tmp-{uuid.uuid4().hex}")
        os.mkdir(folder, 0o700)
        try:
            yield folder
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    def commit(self, key: str, built: str, module: str, arch: str, info: dict) -> str:
        """Move the module built in `built` (its file or folder `module`) into modules/KEY, with
        its meta.json; returns its path there. If another process committed KEY meanwhile, its
        module is kept (both are the same program's)."""
        _chmod_private(built)
        files, odd = scan(built)
        if odd:
            raise CacheError(f"the module built in {built} holds {odd[0]}, not a regular file")
        meta = {"format": FORMAT, "key": key, "arch": arch, "module": module, "files": files,
                "built": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **info}
        _write_json(os.path.join(built, META), meta)
        target = self.path(key)
        with locked(self.root) as root_fd:
            if os.path.lexists(target):
                found, _problem = self._verify(root_fd, key, arch)
                if found is not None:
                    found.close()
                    return os.path.join(target, module)
                self._remove(target)
            os.rename(built, target)
            os.mkdir(built, 0o700)          # building() removes the folder it made
            if _eviction_due(self.root):
                self._evict(keep=key)
        return os.path.join(target, module)

    def _evict(self, keep: str) -> None:
        """Least recently used modules out until the folder is under max_bytes(); temporary
        folders of crashed builds out."""
        limit = max_bytes()
        entries, total = [], 0
        now = time.time()
        for name in os.listdir(self.modules):
            folder = os.path.join(self.modules, name)
            if name.startswith(".tmp-"):
                with contextlib.suppress(OSError):
                    if now - os.lstat(folder).st_mtime > STALE_TEMP_S:
                        shutil.rmtree(folder, ignore_errors=True)
                continue
            size, used = 0, 0.0
            for dirpath, _dirs, filenames in os.walk(folder):
                for f in filenames:
                    with contextlib.suppress(OSError):
                        size += os.lstat(os.path.join(dirpath, f)).st_size
            with contextlib.suppress(OSError):
                used = os.lstat(os.path.join(folder, META)).st_mtime
            entries.append((used, name, size))
            total += size
        for _used, name, size in sorted(entries):
            if total <= limit:
                break
            if name == keep:
                continue
            shutil.rmtree(os.path.join(self.modules, name), ignore_errors=True)
            total -= size


# -- one model's record -----------------------------------------------------------------------
class ModelCache:
    """What the cache holds for one interpreter's model: its token, where, and for each
    program (subgraph and shapes) whether its kernels were loaded (warm) or built (cold), and
    why."""

    def __init__(self, root: Optional[str], token: str, token_given: bool, covers: dict):
        self.root = root
        self.token = token
        self.token_given = token_given
        self.covers = covers
        self.store = ModuleStore(root) if root is not None else None
        self.events = []                # (subgraph, "warm" | "cold", reason)
        self.record_reason = self._record_reason()

    def _record_reason(self) -> Optional[str]:
        """Why this token's record does not match what it covers now (None: it matches)."""
        if self.root is None:
            return "the cache is off (cache_dir=False)"
        record, unreadable = _read_json(self._record_path())
        if unreadable:
            return f"its record {unreadable}"
        if record is None:
            return "no record of this token: its kernels were never built here"
        covers = record.get("covers") if isinstance(record, dict) else None
        if not isinstance(covers, dict):
            return "its record is malformed"
        if covers != self.covers:
            diff = sorted(k for k in set(covers) | set(self.covers) if covers.get(k) != self.covers.get(k))
            return f"the token was recorded for something else (differs in {', '.join(diff)})"
        return None

    def _record_path(self) -> str:
        return os.path.join(self.root, MODELS, self.token + ".json")

    def module_key(self, subgraph: int, shapes, plan_digest: str) -> str:
        text = json.dumps({"covers": self.covers, "subgraph": subgraph,
                           "shapes": [[int(t), [int(d) for d in s]] for t, s in sorted(shapes.items())],
                           "plan": plan_digest}, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()

    def note(self, subgraph: int, state: str, reason: Optional[str]) -> None:
        """A program of this model loaded its module (warm) or built it (cold, and why); the
        token's record is (re)written when it did not say what the token covers now."""
        self.events.append((subgraph, state, reason))
        if self.record_reason is not None and self.root is not None:
            self.record_reason = None
            with contextlib.suppress(OSError):
                _write_json(self._record_path(), {
                    "format": FORMAT, "token": self.token, "token_given": self.token_given,
                    "covers": self.covers,
                    "written": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})

    def choice(self, subgraph: int):
        """What `auto` measured for subgraph `subgraph` of this model in an earlier process
        (auto_choice.Choice, how='cached'), or None: none recorded, the record is for something
        else, or what it holds is not well-formed (the folder is ours, its contents are still
        only data)."""
        from tflite_taichi.auto_choice import from_record
        if self.root is None or self.record_reason is not None:
            return None
        record, _unreadable = _read_json(self._record_path())
        choices = record.get("auto_choices") if isinstance(record, dict) else None
        return from_record(choices.get(str(subgraph))) if isinstance(choices, dict) else None

    def remember_choice(self, subgraph: int, choice) -> None:
        """Keep `auto`'s measured choice for subgraph `subgraph` in the token's record (written
        whole, atomically: a record another process wrote meanwhile keeps its other entries)."""
        if self.root is None:
            return
        record, _unreadable = _read_json(self._record_path())
        if not isinstance(record, dict) or record.get("covers") != self.covers:
            record = {"format": FORMAT, "token": self.token, "token_given": self.token_given,
                      "covers": self.covers,
                      "written": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        choices = record.get("auto_choices")
        record["auto_choices"] = {**(choices if isinstance(choices, dict) else {}),
                                  str(subgraph): choice.as_record()}
        with contextlib.suppress(OSError):
            _write_json(self._record_path(), record)
            self.record_reason = None

    @property
    def state(self) -> str:
        """'warm' when every program of the last allocate loaded its kernels from the cache."""
        if not self.events:
            return "cold"
        return "warm" if all(s == "warm" for _, s, _ in self.events) else "cold"

    def info(self) -> dict:
        """For summary() and bench: where, which token, warm or cold and why."""
        reasons = [r for _, s, r in self.events if s == "cold" and r]
        reason = reasons[0] if reasons else (None if self.events else self.record_reason)
        return {"dir": self.root, "token": self.token,
                "token_source": "given" if self.token_given else "fingerprint",
                "state": self.state, "reason": reason,
                "programs": [{"subgraph": g, "state": s, "reason": r} for g, s, r in self.events]}


def root_for(cache_dir) -> Optional[str]:
    """The checked cache folder for Interpreter(cache_dir=...): None -> the per-user cache,
    False -> None (no cache), a path -> that folder (created 0700; CacheError if unsafe). It is
    checked again for every interpreter, not once per process: folders and their owners change
    while a process runs (and every module load checks it once more, on descriptors)."""
    if cache_dir is False:
        return None
    return prepare_dir(default_dir() if cache_dir is None else cache_dir)


def open_model(root: Optional[str], model_token, source, backend: str, precision: str,
               max_delegated_partitions: int = 1, preserve_all_tensors: bool = False,
               reference_ops=()) -> ModelCache:
    """The model's token and record in the cache folder `root` (root_for; None: no cache)."""
    covers = token_covers(source, backend, precision, max_delegated_partitions,
                          preserve_all_tensors, reference_ops)
    token = check_token(model_token) if model_token is not None else default_token(covers)
    return ModelCache(root, token, model_token is not None, covers)


# -- probes: which backends work here, remembered per driver stack ----------------------------
PROBES = "probes.json"
PROBE_TTL_S = 7 * 86400.0
_DRIVER_FILES = ("/etc/ld.so.cache", "/proc/driver/nvidia/version")
_DRIVER_DIRS = ("/usr/share/vulkan/icd.d", "/etc/vulkan/icd.d", "/usr/local/share/vulkan/icd.d",
                "/usr/share/glvnd/egl_vendor.d", "/etc/glvnd/egl_vendor.d", "/dev/dri")
_DRIVER_ENV = ("DISPLAY", "WAYLAND_DISPLAY", "EGL_PLATFORM", "LD_LIBRARY_PATH", "VK_ICD_FILENAMES",
               "VK_DRIVER_FILES", "__EGL_VENDOR_LIBRARY_FILENAMES", "__EGL_VENDOR_LIBRARY_DIRS",
               "LIBGL_ALWAYS_SOFTWARE", "GALLIUM_DRIVER", "MESA_LOADER_DRIVER_OVERRIDE",
               "CUDA_VISIBLE_DEVICES", "TFLITE_TAICHI_CAPI_LIB")


def driver_fingerprint() -> str:
    """A digest of what decides whether a GPU backend starts here: the library cache (any
    driver or loader installed or removed rewrites /etc/ld.so.cache), NVIDIA's driver version,
    the Vulkan ICD and EGL vendor manifests, the device nodes, the variables the loaders read,
    and Taichi's version. A probe's result is reused only under the same fingerprint."""
    parts = [sys.platform, taichi_version()]
    for name in _DRIVER_ENV:
        parts.append(f"{name}={os.environ.get(name)}")
    paths = list(_DRIVER_FILES)
    for folder in _DRIVER_DIRS:
        with contextlib.suppress(OSError):
            paths.extend(os.path.join(folder, f) for f in sorted(os.listdir(folder)))
    for path in paths:
        try:
            st = os.stat(path)
        except OSError:
            parts.append(f"{path}:absent")
            continue
        parts.append(f"{path}:{st.st_size}:{st.st_mtime_ns}:{st.st_ino}")
        if path.startswith("/proc/"):
            with contextlib.suppress(OSError), open(path, "rb") as f:
                parts.append(hashlib.sha256(f.read()).hexdigest())
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


# what a probe's answer means: 2 = an unnamed GL/Vulkan device counts as software (answers of
# earlier versions called llvmpipe a GPU where libGL was missing: not reused); 3 = the Vulkan
# device's whole name (version 2 cut "NVIDIA H200" to "NVIDIA H2": backend._device_name)
PROBE_VERSION = 3


def _fresh_entry(root: Optional[str], name: str, key: str) -> Optional[dict]:
    """root/name's entry for `key` where it was written under this driver stack (the
    fingerprint), by this probe version, within PROBE_TTL_S; else None."""
    if root is None:
        return None
    record, _ = _read_json(os.path.join(root, name))
    entry = record.get(key) if isinstance(record, dict) else None
    if (not isinstance(entry, dict) or entry.get("fingerprint") != driver_fingerprint()
            or entry.get("probe") != PROBE_VERSION
            or not isinstance(entry.get("time"), (int, float))
            or not 0 <= time.time() - entry["time"] <= PROBE_TTL_S):
        return None
    return entry


def _store_entry(root: Optional[str], name: str, key: str, **fields) -> None:
    if root is None:
        return
    path = os.path.join(root, name)
    with contextlib.suppress(OSError), locked(root):
        record, _ = _read_json(path)
        record = record if isinstance(record, dict) else {}
        record[key] = {"fingerprint": driver_fingerprint(), "probe": PROBE_VERSION,
                       "time": time.time(), **fields}
        _write_json(path, record)


def stored_probe(root: Optional[str], backend: str) -> Optional[tuple]:
    """The probe result recorded in root/probes.json for this driver stack, if recent."""
    entry = _fresh_entry(root, PROBES, backend)
    result = entry.get("result") if entry is not None else None
    if (not isinstance(result, list) or len(result) != 3 or not isinstance(result[0], bool)
            or not isinstance(result[1], bool) or not isinstance(result[2], str)):
        return None
    return tuple(result)


def remember_probe(root: Optional[str], backend: str, result: tuple, keep: bool = True) -> None:
    """A probe's result for this process and (keep) for the folder's later processes:
    backend.probe()'s, or a device's start where `auto` took the backend at a glance
    (device._start_capi)."""
    SESSION.probes[backend] = result
    if keep:
        store_probe(root, backend, result)


def store_probe(root: Optional[str], backend: str, result: tuple) -> None:
    _store_entry(root, PROBES, backend, result=[bool(result[0]), bool(result[1]), str(result[2])])


# A glance (backend.GLANCES: the CUDA driver asked in the process, 0.1-0.16 s on an H100, most of
# a LiteRT-bound model's constructor) is kept beside the probes, under the same fingerprint: a
# model `auto` runs on LiteRT never starts the GPU, so no probe is recorded for it, and every
# process glanced again. A glance decides no more than where the GPU is tried: a device that
# then fails to start is recorded as a failed probe, and a probe's record is read first.
GLANCED = "glances.json"


def stored_glance(root: Optional[str], backend: str) -> Optional[str]:
    """The device name a glance at `backend` saw under this driver stack, if recent."""
    entry = _fresh_entry(root, GLANCED, backend)
    device = entry.get("device") if entry is not None else None
    return device if isinstance(device, str) and device else None


def store_glance(root: Optional[str], backend: str, device: str) -> None:
    _store_entry(root, GLANCED, backend, device=str(device))
