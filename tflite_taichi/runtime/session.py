"""The process's Taichi state, in one place. Taichi runs one arch per process, so a process has
one session (`SESSION`): the backend it claimed and the cache folder it was claimed with (the
GPU drivers' caches point there), Taichi's Python runtime (started or not, on which arch, and
the thread its GL context belongs to), and what the backend probes found. `backend.py` decides
(which backend, the probes); `device.py` runs kernels; both keep their state here, and the ops
learn the arch from their step's IO (ops.kit.StepIO.arch), never from this module."""
from __future__ import annotations

import contextlib
import io
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
    lock: threading.Lock = field(default_factory=threading.Lock)
    backend: Optional[str] = None           # claimed by backend.ensure_runtime
    cache_root: Optional[str] = None        # the cache folder it was claimed with (resolved)
    python_taichi: Optional[str] = None     # the arch Taichi's Python runtime started on
    python_affinity: object = None          # its device.ThreadAffinity
    probes: dict = field(default_factory=dict)   # arch -> (ok, software, detail)

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


SESSION = Session()


def current() -> Optional[str]:
    """The Taichi backend this process claimed, or None."""
    return SESSION.backend


def cache_root() -> Optional[str]:
    """The cache folder the process's backend was claimed with (the drivers' caches are there)."""
    return SESSION.cache_root


def ensure_python_taichi(name: str, cache_root: Optional[str] = None):
    """Taichi's Python runtime started on `name` (once per process): it compiles kernels that
    are not in the cache, and runs them where the C API cannot (device.PythonDevice).

    Taichi's LLVM backends (cpu, cuda) build their struct module at the first kernel compile and
    assert that it happens in the thread that ran ti.init (measured, Taichi 1.7.4: "Assertion
    failure: std::this_thread::get_id() == main_thread_id_"), so it is materialized right here,
    in the starting thread. Taichi's own offline cache is off: compiled programs are cached as
    AOT modules (cache.py), and Taichi's cache would only grow a second copy in ~/.cache/taichi.
    Returns the runtime's device.ThreadAffinity (OpenGL/GLES: its context's thread).
    `cache_root`: the cache folder, where no Interpreter claimed the backend (a compile worker)."""
    from tflite_taichi.ops.kit import realize
    from tflite_taichi.runtime import cache
    s = SESSION
    with s.lock:
        if s.python_taichi == name:
            return s.python_affinity
        if s.python_taichi is not None:
            raise BackendUnavailable(f"Taichi's Python runtime already runs on {s.python_taichi!r} "
                                     f"in this process, not {name!r}")
        if cache_root is not None and s.cache_root is None:
            s.cache_root = cache_root
        ti = realize()                  # Taichi imported, the ops' decorators applied
        arch = ti.cpu if name == "cpu" else getattr(ti, name)
        offline_dir = cache.taichi_offline_dir(s.cache_root)
        cache.remove_stale_taichi_lock(offline_dir)
        where = {"offline_cache_file_path": offline_dir} if offline_dir else {}
        try:
            # ti.init prints "[Taichi] Starting on arch=..." on stdout, which is the user's
            # (a pipe of outputs): said by summary() and the command line instead
            with TAICHI_LOCK, cache.driver_env(s.cache_root), \
                    contextlib.redirect_stdout(io.StringIO()):
                ti.init(arch=arch, enable_fallback=False, offline_cache=False,
                        advanced_optimization=False, cfg_optimization=False, log_level=ti.WARN,
                        **where)
        except Exception as e:  # taichi raises RuntimeError for a missing arch
            raise BackendUnavailable(f"{name} is not available: {e}") from None
        got = ti.lang.impl.current_cfg().arch.name
        expected = {"cpu": ("x64", "arm64")}.get(name, (name,))
        if got not in expected:
            ti.reset()
            raise BackendUnavailable(f"asked for {name}, but Taichi started on {got}")
        runtime = ti.lang.impl.get_runtime()
        if not runtime.materialized:
            with TAICHI_LOCK:
                runtime.materialize()
        s.python_taichi = name
        s.python_affinity = ThreadAffinity(name)      # GL: its context is this thread's
        return s.python_affinity
