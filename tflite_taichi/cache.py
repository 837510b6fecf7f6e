"""Kernel caches on disk: `Interpreter(..., cache_dir=DIR, model_token=None)`.

Serialization as the official GPU delegate has it (issue #5: its `serialization_dir` and
`model_token`), with issue #7's robustness: processes may share DIR, and nothing found in it is
trusted before it is checked.

DIR (created 0700; an existing DIR must be owned by the user and not group/world-writable):

    lock                 flock'ed around every check, wipe, Taichi dump and manifest write
    manifest.json        versions, a generation id, and the size and sha256 of every file under
                         taichi/ (written atomically: temp file + os.replace)
    taichi/              Taichi's offline cache (ti.init(offline_cache_file_path=...))
    xdg/                 XDG_CACHE_HOME while Taichi starts and stops: Taichi's Vulkan pipeline
                         cache (xdg/taichi/rhi_cache.bin)
    mesa/                MESA_SHADER_CACHE_DIR (lavapipe, llvmpipe, Mesa's GPU drivers)
    nvidia-gl/           __GL_SHADER_DISK_CACHE_PATH (NVIDIA's GL/Vulkan shader cache)
    cuda/                CUDA_CACHE_PATH (CUDA's PTX JIT cache)
    models/TOKEN.json    one record per model token: what the token covers, and whether the
                         kernels were built into the current generation of taichi/

What is trusted, and why (facts measured on Taichi 1.7.4):
- Taichi keys each kernel in its offline cache by a hash of the kernel's IR and compile
  config, so a token never selects code: it names a record that says warm or cold. A token
  reused for another model gives a cold start, never another model's kernels.
- Taichi checks a .tic when it loads it, but a damaged one is only logged at debug level
  ("The file was corrupted", "IO error"), compiled again and never rewritten: every later start
  pays that compile, unseen. So before ti.init the files under taichi/ are
  checked against manifest.json: a missing manifest, other versions, a missing, extra,
  truncated or altered file -> a CacheWarning, taichi/ and xdg/taichi/ wiped, a new generation
  (rebuild). xdg/taichi/ (the Vulkan pipeline cache) is not hashed: see WIPED.
- Taichi writes its cache only when its program is finalized (ti.reset() or interpreter
  teardown). The first Taichi start with a cache_dir registers an atexit handler that, under
  the lock, checks the files again, calls ti.reset() (Taichi dumps), and hashes the result into
  manifest.json, then writes the records of this process's models that built their kernels.
  A process killed before that leaves no new files behind (Taichi did not dump either).
- Driver caches (Mesa, NVIDIA, CUDA) check their own entries (checksums, keys holding the
  driver's build id) and do their own locking: they are pointed into DIR, not hashed.
- The environment variables are set only while Taichi starts (and around the dump at exit),
  then restored, so child processes and other libraries keep their own caches.
- backend='reference' compiles nothing: its cache_dir and model_token are validated, not used.
"""
from __future__ import annotations

import atexit
import contextlib
import hashlib
import json
import os
import platform
import re
import shutil
import stat
import sys
import tempfile
import threading
import time
import uuid
import warnings
import weakref
from typing import Optional

from tflite_taichi.errors import BackendUnavailable, InputError

try:
    import fcntl
except ImportError:          # Windows: no flock; a cache_dir is then for one process at a time
    fcntl = None

FORMAT = 1
TOKEN_PATTERN = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
MANIFEST = "manifest.json"
LOCK = "lock"
TAICHI = "taichi"
MODELS = "models"
VERIFIED = ("taichi",)                      # the tree manifest.json covers
# Wiped with it: Taichi's Vulkan pipeline cache and its version file. Not hashed: Taichi writes
# xdg/taichi/version_info while the device starts, after our scan (a second process found it
# grown from 0 to 54 bytes and distrusted a sound cache), and the Vulkan driver validates
# rhi_cache.bin's header itself (vendor, device, pipeline-cache UUID), as Mesa's caches.
WIPED = ("taichi", "xdg/taichi")
DRIVER_ENV = {                               # variable -> folder under DIR
    "XDG_CACHE_HOME": "xdg",
    "MESA_SHADER_CACHE_DIR": "mesa",
    "__GL_SHADER_DISK_CACHE_PATH": "nvidia-gl",
    "CUDA_CACHE_PATH": "cuda",
}
SUBDIRS = (TAICHI, "xdg", "mesa", "nvidia-gl", "cuda", MODELS)
TAICHI_LOCK = "ticache.lock"                 # Taichi's own lock file: transient, not hashed
STALE_TAICHI_LOCK_S = 60.0                   # Taichi holds it for milliseconds; older = left by a crash


class CacheError(BackendUnavailable):
    """cache_dir cannot be used: not private, not ours, or another cache_dir already serves
    this process's Taichi runtime."""


class CacheWarning(UserWarning):
    """Something in cache_dir was not trusted (corrupt, truncated, foreign) and was rebuilt."""


# -- arguments --------------------------------------------------------------------------------
def check_arguments(cache_dir, model_token) -> None:
    """Validate Interpreter(cache_dir=, model_token=) before anything starts (InputError)."""
    if cache_dir is None:
        if model_token is not None:
            raise InputError("model_token needs cache_dir: the token names a record in the cache")
        return
    if not isinstance(cache_dir, (str, os.PathLike)) or isinstance(os.fspath(cache_dir), bytes) \
            or not os.fspath(cache_dir):
        raise InputError(f"cache_dir must be a non-empty str or os.PathLike, got {cache_dir!r}")
    if model_token is not None:
        check_token(model_token)


def check_token(token) -> str:
    """A user-given token: 1-128 of [A-Za-z0-9_.-], not starting with '.' or '-' (InputError).
    It becomes a file name under DIR/models, so nothing that could be a path is accepted."""
    if not isinstance(token, str) or not TOKEN_PATTERN.fullmatch(token):
        raise InputError(f"model_token must be 1-128 characters of [A-Za-z0-9_.-] starting with "
                         f"a letter, digit or '_' (it names a file in the cache), got {token!r}")
    return token


def resolve_path(cache_dir) -> str:
    return os.path.realpath(os.path.abspath(os.path.expanduser(os.fspath(cache_dir))))


# -- versions and fingerprints ----------------------------------------------------------------
_source_digest: Optional[str] = None


def _package_source_digest() -> str:
    """sha256 of this package's Python sources (kernels are generated from them): a checkout
    edited without a version bump still gets new default tokens."""
    global _source_digest
    if _source_digest is None:
        import tflite_taichi
        import tflite_taichi.ops
        import tflite_taichi.quant
        h = hashlib.sha256()
        for package in (tflite_taichi, tflite_taichi.ops, tflite_taichi.quant):
            for top in package.__path__:
                for dirpath, dirnames, filenames in os.walk(top):
                    dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
                    for name in sorted(filenames):
                        if name.endswith(".py"):
                            path = os.path.join(dirpath, name)
                            h.update(os.path.relpath(path, top).encode() + b"\0")
                            with open(path, "rb") as f:
                                h.update(f.read())
        _source_digest = h.hexdigest()[:16]
    return _source_digest


def taichi_versions() -> dict:
    """What the Taichi cache files depend on; a manifest with other values is not trusted."""
    import taichi
    import tflite_taichi
    return {"format": FORMAT, "taichi": ".".join(map(str, taichi.__version__)),
            "tflite_taichi": tflite_taichi.__version__,
            "machine": platform.machine(), "system": platform.system()}


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
                 preserve_all_tensors: bool = False) -> dict:
    """Everything the default token is a fingerprint of (recorded with every token)."""
    import numpy
    sha, size = _digest_source(source)
    return {"model_sha256": sha, "model_size": size, "backend": backend, "precision": precision,
            "max_delegated_partitions": int(max_delegated_partitions),
            "preserve_all_tensors": bool(preserve_all_tensors),
            **taichi_versions(), "tflite_taichi_source": _package_source_digest(),
            "numpy": numpy.__version__, "python": "%d.%d" % sys.version_info[:2]}


def default_token(covers: dict) -> str:
    """model_token=None: the sha256 of what the token covers (64 hex digits)."""
    return hashlib.sha256(json.dumps(covers, sort_keys=True).encode()).hexdigest()


# -- the folder -------------------------------------------------------------------------------
def _check_private(path: str) -> None:
    try:
        st = os.stat(path)
    except OSError as e:
        raise CacheError(f"cache_dir {path}: {e.strerror}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise CacheError(f"cache_dir {path} exists and is not a directory")
    if hasattr(os, "getuid") and st.st_uid != os.getuid():
        raise CacheError(f"cache_dir {path} is owned by uid {st.st_uid}, not by you (uid "
                         f"{os.getuid()}): a cache another user controls is never trusted")
    if st.st_mode & 0o022:
        raise CacheError(f"cache_dir {path} is group- or world-writable (mode "
                         f"{stat.S_IMODE(st.st_mode):04o}): anyone who can write there could "
                         "plant kernels; chmod 700 it or choose another folder")


def _private_dir(path: str) -> None:
    """Create `path` with mode 0700 (exactly, whatever the umask), or check an existing one."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError as e:
        raise CacheError(f"cannot create cache folder {path}: {e.strerror}") from None
    else:
        os.chmod(path, 0o700)
    _check_private(path)


def prepare_dir(cache_dir) -> str:
    """The absolute, checked cache folder (created 0700 with its subfolders), or CacheError."""
    given = os.path.abspath(os.path.expanduser(os.fspath(cache_dir)))
    if hasattr(os, "getuid") and os.path.islink(given) and os.lstat(given).st_uid != os.getuid():
        raise CacheError(f"cache_dir {given} is a symbolic link owned by uid "
                         f"{os.lstat(given).st_uid}, not by you: refusing to follow it")
    root = resolve_path(cache_dir)
    parent = os.path.dirname(root)
    try:
        os.makedirs(parent, exist_ok=True)
    except OSError as e:
        raise CacheError(f"cannot create {parent} for cache_dir: {e.strerror}") from None
    _private_dir(root)
    for sub in SUBDIRS:
        _private_dir(os.path.join(root, sub))
    return root


@contextlib.contextmanager
def locked(root: str):
    """An exclusive flock on DIR/lock (blocks while another process holds it)."""
    fd = os.open(os.path.join(root, LOCK), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        if fcntl is not None:
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)                 # closing releases the flock


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


def scan(root: str) -> tuple:
    """({relative path: {size, sha256}} of the files under VERIFIED, [what is not a plain file])."""
    files, odd = {}, []
    for sub in VERIFIED:
        top = os.path.join(root, sub)
        for dirpath, dirnames, filenames in os.walk(top):
            dirnames.sort()
            for name in dirnames:
                if os.path.islink(os.path.join(dirpath, name)):
                    odd.append(os.path.relpath(os.path.join(dirpath, name), root))
            for name in sorted(filenames):
                path = os.path.join(dirpath, name)
                rel = os.path.relpath(path, root).replace(os.sep, "/")
                if name == TAICHI_LOCK and dirpath == os.path.join(root, TAICHI):
                    continue
                if os.path.islink(path) or not os.path.isfile(path):
                    odd.append(rel)
                    continue
                files[rel] = _file_digest(path)
    return files, odd


def check(root: str) -> tuple:
    """(manifest or None, problem or None): problem is None when taichi/ holds
    exactly what manifest.json lists, written by these versions (or are empty, with no manifest)."""
    files, odd = scan(root)
    manifest, unreadable = _read_json(os.path.join(root, MANIFEST))
    if unreadable:
        return None, unreadable
    if manifest is None:
        if files or odd:
            return None, (f"{len(files) + len(odd)} cache files without {MANIFEST} (a cache this "
                          "package did not write)")
        return None, None
    if (not isinstance(manifest, dict) or not isinstance(manifest.get("files"), dict)
            or not isinstance(manifest.get("generation"), str)):
        return None, f"{MANIFEST} is malformed"
    if manifest.get("versions") != taichi_versions():
        old, new = manifest.get("versions"), taichi_versions()
        old = old if isinstance(old, dict) else {}
        diff = ", ".join(f"{k} {old.get(k)!r} != {new[k]!r}" for k in new if old.get(k) != new[k])
        return manifest, f"it was written by other versions ({diff or 'unknown'})"
    if odd:
        return manifest, f"{odd[0]} is not a regular file"
    listed = manifest["files"]
    for rel in sorted(set(listed) | set(files)):
        if rel not in files:
            return manifest, f"{rel} is missing"
        if rel not in listed:
            return manifest, f"{rel} is not in {MANIFEST} (written outside this package's lock)"
        if files[rel] != listed[rel]:
            got, want = files[rel], listed[rel]
            if isinstance(want, dict) and got["size"] != want.get("size"):
                return manifest, f"{rel} has {got['size']} bytes, {want.get('size')} recorded (truncated?)"
            return manifest, f"{rel} does not match its recorded sha256 (corrupt)"
    return manifest, None


def _wipe(root: str) -> None:
    for sub in WIPED:
        shutil.rmtree(os.path.join(root, sub), ignore_errors=True)
    for sub in WIPED:
        _private_dir(os.path.join(root, sub))
    files, odd = scan(root)
    if files or odd:
        raise CacheError(f"cannot clear the untrusted cache in {root}: "
                         f"{(list(files) + odd)[0]} could not be removed")


def _new_manifest(files=None) -> dict:
    return {"format": FORMAT, "versions": taichi_versions(), "generation": uuid.uuid4().hex,
            "files": files or {}}


def _clear_stale_taichi_lock(root: str) -> None:
    path = os.path.join(root, TAICHI, TAICHI_LOCK)
    with contextlib.suppress(OSError):
        if time.time() - os.stat(path).st_mtime > STALE_TAICHI_LOCK_S:
            os.unlink(path)      # left by a killed process: Taichi would skip its cache for good


# -- one process's cache ----------------------------------------------------------------------
class ProcessCache:
    """The cache_dir this process's Taichi runtime was started with."""

    def __init__(self, root: str):
        self.root = root
        self.taichi_dir = os.path.join(root, TAICHI)
        self.generation = None              # of the Taichi cache, from manifest.json
        self.rebuilt = None                 # why the cache was wiped at start, or None
        self.models = []                    # ModelCache of this process's interpreters
        self._finished = False
        self._mutex = threading.Lock()

    @contextlib.contextmanager
    def driver_env(self):
        """The driver cache variables pointed into DIR (and Taichi's own cache variable out of
        the way: the ti.init argument names the folder); restored on exit."""
        wanted = {var: os.path.join(self.root, sub) for var, sub in DRIVER_ENV.items()}
        wanted["TI_OFFLINE_CACHE_FILE_PATH"] = None
        saved = {var: os.environ.get(var) for var in wanted}
        try:
            for var, value in wanted.items():
                if value is None:
                    os.environ.pop(var, None)
                else:
                    os.environ[var] = value
            yield
        finally:
            for var, value in saved.items():
                if value is None:
                    os.environ.pop(var, None)
                else:
                    os.environ[var] = value

    @contextlib.contextmanager
    def starting(self):
        """Around ti.init, under the lock: the Taichi cache checked (or wiped, with a
        CacheWarning) before the driver loads, the variables set; after, what Taichi wrote under
        taichi/ while starting hashed into the manifest."""
        with locked(self.root):
            _clear_stale_taichi_lock(self.root)
            manifest, problem = check(self.root)
            if problem:
                warnings.warn(CacheWarning(
                    f"tflite_taichi: the kernel cache in {self.root} is not trusted ({problem}); "
                    "clearing it: this start compiles every kernel again"), stacklevel=6)
                _wipe(self.root)
            if problem or manifest is None:
                manifest = _new_manifest()
                _write_json(os.path.join(self.root, MANIFEST), manifest)
            self.generation, self.rebuilt = manifest["generation"], problem
            with self.driver_env():
                yield
            files, odd = scan(self.root)
            if files != manifest["files"] and not odd:
                manifest["files"] = files
                _write_json(os.path.join(self.root, MANIFEST), manifest)

    def activate(self) -> None:
        """Taichi runs on this cache: dump, hash and record it at exit."""
        atexit.register(self.finish)

    def finish(self) -> None:
        """Under the lock: check the files again, finalize Taichi (it dumps its cache), hash the
        result into manifest.json, write this process's model records. Never raises."""
        with self._mutex:
            if self._finished:
                return
            self._finished = True
        try:
            self._finish()
        except Exception as e:  # at exit: say it, never raise
            print(f"tflite_taichi: could not record the kernel cache in {self.root}: "
                  f"{type(e).__name__}: {e}", file=sys.stderr)

    def _finish(self) -> None:
        built = [m for m in self.models if m.was_built()]
        with locked(self.root):
            manifest, problem = check(self.root)
            if not problem and (manifest or {}).get("generation") != self.generation:
                # Taichi's dump lists every kernel it knows, its .tic files written only for
                # those it compiled: over another generation, the list would name files that
                # are gone, which Taichi then compiles again at every start, unseen.
                problem = "another process rebuilt it meanwhile"
            import taichi as ti
            with self.driver_env():
                ti.reset()                  # Taichi's Program.finalize writes its offline cache
            if problem:
                warnings.warn(CacheWarning(
                    f"tflite_taichi: the kernel cache in {self.root} changed while this process "
                    f"ran ({problem}); clearing it"), stacklevel=2)
                _wipe(self.root)
                _write_json(os.path.join(self.root, MANIFEST), _new_manifest())
                return
            if manifest is None:            # fresh folder whose manifest was never written
                manifest = _new_manifest()
            files, odd = scan(self.root)
            if odd:
                _wipe(self.root)
                files = {}
                manifest = _new_manifest()
            manifest["files"] = files
            manifest["updated"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            _write_json(os.path.join(self.root, MANIFEST), manifest)
            for m in built:
                m.write_record(manifest["generation"])


_process: Optional[ProcessCache] = None


def start(cache_dir) -> ProcessCache:
    """Called by backend.ensure_runtime before ti.init: the checked folder (CacheError). Then
    `with cache.starting(): ti.init(...)`, and activate() once Taichi runs."""
    global _process
    _process = ProcessCache(prepare_dir(cache_dir))
    return _process


def check_same(cache_dir, started_with: Optional[str]) -> None:
    """A later interpreter in a process whose Taichi already runs: the same cache_dir or none."""
    if cache_dir is None:
        return
    root = resolve_path(cache_dir)
    if started_with is None:
        raise CacheError(
            f"cache_dir={os.fspath(cache_dir)!r}: Taichi already runs in this process without a "
            "cache_dir (its own offline cache); give cache_dir to the first Taichi interpreter "
            "of the process (Taichi's caches and the drivers' are fixed when Taichi starts)")
    if root != started_with:
        raise CacheError(
            f"cache_dir={os.fspath(cache_dir)!r}: Taichi in this process already uses the cache in "
            f"{started_with}; one cache_dir per process (Taichi's caches and the drivers' are "
            "fixed when Taichi starts)")


def current() -> Optional[ProcessCache]:
    return _process


# -- one model's record -----------------------------------------------------------------------
class ModelCache:
    """What the cache holds for one interpreter's model: its token, warm or cold, and why."""

    def __init__(self, process: ProcessCache, token: str, token_given: bool, covers: dict,
                 interpreter=None):
        self.process = process
        self.token = token
        self.token_given = token_given
        self.covers = covers
        self.path = os.path.join(process.root, MODELS, token + ".json")
        self.built = False
        self._interpreter = weakref.ref(interpreter) if interpreter is not None else None
        self.reason = self._cold_reason()
        self.warm = self.reason is None

    def _cold_reason(self) -> Optional[str]:
        if self.process.rebuilt:
            return f"the cache was rebuilt at this start ({self.process.rebuilt})"
        record, unreadable = _read_json(self.path)
        if unreadable:
            return f"its record {unreadable}"
        if record is None:
            return "no record of this token: its kernels were never built here"
        if not isinstance(record, dict) or record.get("format") != FORMAT:
            return "its record is malformed"
        covers = record.get("covers")
        if covers != self.covers:
            covers = covers if isinstance(covers, dict) else {}
            diff = sorted(k for k in set(covers) | set(self.covers) if covers.get(k) != self.covers.get(k))
            return f"the token was recorded for something else (differs in {', '.join(diff)})"
        if record.get("generation") != self.process.generation:
            return "the Taichi cache was rebuilt since the kernels were recorded"
        if not record.get("built"):
            return "its kernels were not built"
        return None

    def note_built(self) -> None:
        """The interpreter compiled its kernels (allocate_tensors): record it at exit."""
        self.built = True

    def was_built(self) -> bool:
        if self.built:
            return True
        interpreter = self._interpreter() if self._interpreter is not None else None
        main = getattr(interpreter, "_main", None)
        return bool(getattr(main, "compiled", None))   # interim: allocate_tensors compiled

    def write_record(self, generation: str) -> None:
        _write_json(self.path, {"format": FORMAT, "token": self.token,
                                "token_given": self.token_given, "covers": self.covers,
                                "generation": generation, "built": True,
                                "written": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})

    def info(self) -> dict:
        """For summary() and bench: where, which token, warm or cold and why."""
        return {"dir": self.process.root, "token": self.token,
                "token_source": "given" if self.token_given else "fingerprint",
                "state": "warm" if self.warm else "cold", "reason": self.reason,
                "rebuilt": self.process.rebuilt}


def open_model(cache_dir, model_token, source, backend: str, precision: str,
               max_delegated_partitions: int = 1, preserve_all_tensors: bool = False,
               interpreter=None) -> ModelCache:
    """After backend.ensure_runtime(backend, cache_dir): the model's token and record."""
    process = _process
    if process is None or process.root != resolve_path(cache_dir):
        raise CacheError(f"cache_dir={os.fspath(cache_dir)!r} is not the cache this process's "
                         "Taichi runtime was started with")
    covers = token_covers(source, backend, precision, max_delegated_partitions, preserve_all_tensors)
    token = check_token(model_token) if model_token is not None else default_token(covers)
    model = ModelCache(process, token, model_token is not None, covers, interpreter)
    process.models.append(model)
    return model
