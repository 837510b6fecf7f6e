"""The process's Taichi state, in one place. Taichi runs one arch per process, so a process has
one session (`SESSION`): the backend it claimed and the cache folder it was claimed with (the
GPU drivers' caches point there), Taichi's Python runtime (started or not, on which arch, and
the thread its GL context belongs to), what the backend probes found, the devices started, the
C API library, the compile workers, which Taichi builds the kernels (the Taichi build), the cache's
eviction bookkeeping and the process that started this one. The modules that act on it keep
their state here (backend.py decides which backend; device.py starts and runs devices; capi.py,
compile_workers.py, taichi_build.py, cache.py and children.py each their own part) and import this
module, which imports none of them: `describe()` says what it holds for summary(). The ops
learn the arch from their step's IO (ops.kit.StepIO.arch), never from this module."""
from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field
from typing import Optional

from tflite_taichi.errors import BackendUnavailable

# Every call into a Taichi runtime holds this lock: Taichi's runtimes are not thread-safe.
TAICHI_LOCK = threading.RLock()


def inside_device_call() -> bool:
    """Whether this thread holds TAICHI_LOCK: it is inside a call into a runtime (ours included:
    vulkan_submit.py records and submits in Python, where garbage collection can run a
    finalizer at any allocation). RLock._is_owned is CPython's (threading.Condition uses it)."""
    return TAICHI_LOCK._is_owned()


GL_BACKENDS = ("opengl", "gles")


class ThreadAffinity:
    """OpenGL/GLES: the runtime's GL context is current in the thread that created it, and only
    there (Taichi makes it current once; EGL refuses a context current in another thread). Calls
    from another thread would find no context (map_memory returns NULL, launches do nothing), so
    they are refused with an InterpreterStateError instead; frees that garbage collection runs
    in another thread, or inside a device call of this one, wait until the owner thread uses
    the device again."""

    def __init__(self, backend: str):
        self.backend = backend
        self.owner = threading.get_ident() if backend in GL_BACKENDS else None
        self.owner_name = threading.current_thread().name
        self._deferred = []

    def on_owner_thread(self) -> bool:
        return self.owner is None or threading.get_ident() == self.owner

    def check_thread(self, what: str) -> None:
        if not self.on_owner_thread():
            from tflite_taichi.errors import InterpreterStateError
            raise InterpreterStateError(
                f"{what} on {self.backend} from thread {threading.current_thread().name!r}: "
                f"Taichi's {self.backend} runtime lives in thread {self.owner_name!r}, the one that "
                "created the first Taichi interpreter of this process (an OpenGL context is "
                "current in one thread only); use the interpreter from that thread, or vulkan "
                "from any thread")
        while self._deferred and not inside_device_call():
            self._deferred.pop(0)()

    def defer(self, fn) -> None:
        self._deferred.append(fn)


@dataclass
class Session:
    """Everything this process holds for its Taichi runtime, and nothing else does: the modules
    of runtime/ read and write these fields, and keep no state of their own (module-level
    tables that never change and memo caches of pure functions aside). Each lock below guards
    the fields listed under it; TAICHI_LOCK (above) is a different thing: it serializes calls
    into a runtime, not access to this record."""

    # -- the backend claimed (backend.py) and Taichi's Python runtime (device.py) -------------
    # under `lock`: one claim, and one start of the Python runtime, at a time
    lock: threading.Lock = field(default_factory=threading.Lock)
    backend: Optional[str] = None           # claimed by backend.ensure_runtime
    cache_root: Optional[str] = None        # the cache folder it was claimed with (resolved)
    python_taichi: Optional[str] = None     # the arch Taichi's Python runtime started on
    python_affinity: object = None          # its ThreadAffinity
    probes: dict = field(default_factory=dict)   # arch -> (ok, software, detail)

    # -- devices (device.py): one per backend per process --------------------------------------
    # under `devices_lock`: a device starts once, and get() waits for start_early's thread
    devices_lock: threading.Lock = field(default_factory=threading.Lock)
    devices: dict = field(default_factory=dict)        # backend -> CapiDevice | PythonDevice
    capi_refused: dict = field(default_factory=dict)   # backend -> the C API's CapiError from
    #                                                    start_early, kept for get()'s fallback
    warned_fallback: bool = False           # the Python-runtime fallback is warned about once
    # backend -> (cache root, device name): `auto` chose it at a glance (backend.choose_auto),
    # without its probe; the C API's start of its device is the probe, recorded then
    unprobed: dict = field(default_factory=dict)

    # -- Taichi's C API library (capi.py): loaded once per process ------------------------------
    # under `capi_lock`: two threads starting devices load it once
    capi_lock: threading.Lock = field(default_factory=threading.Lock)
    capi_lib: object = None                 # the bound ctypes.CDLL, None until loaded
    capi_path: Optional[str] = None         # the file it was loaded from

    # -- the compile workers (compile_workers.py) ----------------------------------------------
    # under `compile_pool_lock`: one pool per process; a forked child sees its parent's pool
    # (pool.pid is not its own: the pipes are the parent's) and makes its own
    compile_pool_lock: threading.Lock = field(default_factory=threading.Lock)
    compile_pool: object = None             # compile_workers._Pool, None until a compile needs it

    # -- which Taichi (taichi_build.py): fixed when the package is imported -------------------------
    # set once by taichi_build.install() at `import tflite_taichi` (the import lock serializes it)
    taichi_build: Optional[str] = None           # 'taichi' or 'forge', None until installed
    taichi_build_problem: Optional[str] = None   # why TFLITE_TAICHI_TAICHI cannot be honoured

    # -- the kernel cache (cache.py) ------------------------------------------------------------
    # root -> (commits since the last eviction scan, time of that scan): a process scans a
    # cache folder at its first commit there, then every so often (cache.EVICT_EVERY); written
    # by ModuleStore.commit under the folder's exclusive flock, which this process's threads
    # take one at a time too (each opens its own descriptor)
    evictions: dict = field(default_factory=dict)

    # -- the process that started this one (children.py) ---------------------------------------
    # set once, first thing in a ConnectedChild, before it starts any thread
    parent_pid: Optional[int] = None

    def claim(self, name: str, cache_root: Optional[str]) -> None:
        """Claim `name` for this process (under self.lock; claiming it again changes nothing).
        Another backend than the one claimed is refused."""
        if self.backend is not None and self.backend != name:
            raise BackendUnavailable(
                f"Taichi already runs on {self.backend!r} in this process and cannot switch to "
                f"{name!r} without destroying the other interpreters' memory; use one Taichi "
                "backend per process (or backend='reference')")
        if self.backend is None:
            self.backend, self.cache_root = name, cache_root

    def release(self) -> None:
        """Give the claim up (its device did not start; under self.lock)."""
        self.backend = None

    def own_compile_pool(self):
        """The compile pool if this process made it (a forked child's inherited one is not)."""
        pool = self.compile_pool
        return pool if pool is not None and pool.pid == os.getpid() else None

    def describe(self) -> dict:
        """What the session holds, as plain values (summary()["runtime"]["session"])."""
        pool = self.own_compile_pool()
        return {
            "backend": self.backend,
            "cache_root": self.cache_root,
            "python_taichi": self.python_taichi,
            # copies first: another thread may start a device meanwhile
            "devices": {name: device.kind for name, device in sorted(dict(self.devices).items())},
            "capi_refused": {name: str(e) for name, e in sorted(dict(self.capi_refused).items())},
            "capi_library": {"loaded": self.capi_lib is not None, "path": self.capi_path},
            "compile_pool": pool.describe() if pool is not None else
            {"started": False, "workers": 0, "busy": False},
            "taichi_build": self.taichi_build,
            "taichi_build_problem": self.taichi_build_problem,
            "probes": {arch: found[0] for arch, found in sorted(dict(self.probes).items())},
            "parent_pid": self.parent_pid,
        }


SESSION = Session()


def current() -> Optional[str]:
    """The Taichi backend this process claimed, or None."""
    return SESSION.backend


def cache_root() -> Optional[str]:
    """The cache folder the process's backend was claimed with (the drivers' caches are there)."""
    return SESSION.cache_root
