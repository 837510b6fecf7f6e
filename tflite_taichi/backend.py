"""The Taichi runtime: which arch, probing, one runtime per process.

Facts this module is built on (DESIGN.md, "Backends"):
- `ti.init` falls back to CPU silently unless told not to, so we pass enable_fallback=False
  and still check the arch after init;
- Taichi is one runtime per process and `ti.reset()` kills every ndarray, so the first Taichi
  backend an Interpreter asks for is the process's; asking for another is an error;
- headless OpenGL/GLES need EGL_PLATFORM=surfaceless, and a bad GL stack can segfault inside
  `ti.init`, so GL is probed in a subprocess first;
- a software device (Mesa's lavapipe, llvmpipe) is a CPU in disguise: `auto` never picks it.
"""
from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
import threading
from typing import Optional

from tflite_taichi.errors import BackendUnavailable
from tflite_taichi.ops import kit

TAICHI_BACKENDS = ("cuda", "vulkan", "metal", "opengl", "gles", "cpu")
AUTO_ORDER = ("cuda", "vulkan", "metal", "opengl")   # hardware GPUs, best first
SOFTWARE_DEVICE_MARKERS = ("llvmpipe", "lavapipe", "softpipe", "swiftshader")


def is_software_device(text: str) -> bool:
    """Whether a device name or a probe's log names a CPU pretending to be a GPU."""
    return any(m in text.lower() for m in SOFTWARE_DEVICE_MARKERS)
GFX_PROBED = ("vulkan", "opengl", "gles")   # archs whose device may be software (Metal is not)
FP16_BACKENDS = ("cuda", "vulkan", "cpu")            # no u16 in Taichi's GL SPIR-V path

_lock = threading.Lock()
_current: Optional[str] = None
_python_started: Optional[str] = None   # Taichi's Python runtime
_python_affinity = None                 # its device.ThreadAffinity
_cache_root: Optional[str] = None     # cache_dir Taichi was started with (resolved)
_probe_cache: dict = {}

PROBE_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_probe.py")


def _env_for(name: str) -> dict:
    env = dict(os.environ)
    if name in ("opengl", "gles") and not env.get("DISPLAY") and not env.get("WAYLAND_DISPLAY"):
        env.setdefault("EGL_PLATFORM", "surfaceless")
    return env


def probe(name: str, timeout: float = 120.0, cache_root: Optional[str] = None) -> tuple:
    """(ok, software, detail) for a Taichi arch, tested in a subprocess (a crash in a driver
    cannot take the caller down). Remembered per process, and in the cache folder `cache_root`
    for this driver stack (cache.driver_fingerprint), so a later process does not pay the
    subprocess (0.3-0.8 s) again."""
    if name in _probe_cache:
        return _probe_cache[name]
    from tflite_taichi.runtime import cache
    stored = cache.stored_probe(cache_root, name)
    if stored is not None:
        _probe_cache[name] = stored
        return stored
    try:
        proc = subprocess.run([sys.executable, PROBE_SCRIPT, name], capture_output=True,
                              text=True, timeout=timeout, env=_env_for(name))
    except subprocess.TimeoutExpired:
        result = (False, False, f"probe timed out after {timeout:.0f} s")
    else:
        out = proc.stdout + proc.stderr
        ok_line = [l for l in proc.stdout.splitlines() if l.startswith("PROBE-OK")]
        if proc.returncode != 0 or not ok_line:
            messages = [l for l in out.strip().splitlines()
                        if l.strip() and not l.startswith(("[T ", "[D ", "[I ", "[Taichi]"))]
            tail = messages[-1:] or [f"exit code {proc.returncode}"]
            if proc.returncode < 0:
                tail = [f"the probe crashed (signal {-proc.returncode})"]
            result = (False, False, tail[0][:300])
        else:
            software = is_software_device(out)
            device = (_device_name(out) or ok_line[0].split(" ", 2)[-1]).strip()
            if name in GFX_PROBED and device in ("", name):
                # a device nobody can name (no renderer string, no Vulkan device line) is
                # treated as software: auto must never pick a CPU in disguise by default
                software, device = True, "unknown device (treated as software)"
            result = (True, software, device)
    _probe_cache[name] = result
    if not result[2].startswith("probe timed out"):
        cache.store_probe(cache_root, name, result)
    return result


def _device_name(log: str) -> str:
    """The device of Taichi's `Found Vulkan Device 0 (NVIDIA H200)` line: what is inside the
    brackets (stripping the characters " 0()" from both ends cut "NVIDIA H200" to "NVIDIA H2")."""
    import re
    for line in log.splitlines():
        if "Found Vulkan Device" in line:
            rest = line.split("Found Vulkan Device", 1)[1].strip()
            match = re.match(r"\d+\s*\((.*)\)$", rest)
            return match.group(1).strip() if match else re.sub(r"^\d+\s*", "", rest)
    return ""


def cpu_reference_ops(names=None) -> frozenset:
    """Names of the ops backend='auto' keeps on numpy on a machine without a hardware GPU,
    rather than Taichi's cpu backend: those whose OpDef says numpy runs them faster there
    (`numpy_faster_on_cpu`, set and measured where each op is defined). Of `names` (a model's
    ops: the set then depends on the model alone, as the cache key it enters must), else of
    every registered op, an op registered later (a user's) included."""
    from tflite_taichi.ops import load_all, lookup
    if names is None:
        names = list(load_all())
    return frozenset(name for name in names
                     if (opdef := lookup(name)) is not None and opdef.numpy_faster_on_cpu)


def __getattr__(name: str):
    # CPU_REFERENCE_OPS, the set's older name, stays readable (bench.py, tests), computed on
    # access like cpu_reference_ops() so it can never go stale against the registry
    if name == "CPU_REFERENCE_OPS":
        return cpu_reference_ops()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def choose_auto(cache_root: Optional[str] = None) -> str:
    """The first hardware GPU backend that really works, else 'cpu' (Taichi's LLVM CPU). The
    probes not yet recorded run side by side (each is a subprocess of 0.3-0.8 s: one after
    another they were most of a cold `auto` start on a machine without a GPU)."""
    from concurrent.futures import ThreadPoolExecutor
    names = [n for n in AUTO_ORDER if n != "metal" or sys.platform == "darwin"]
    with ThreadPoolExecutor(max_workers=len(names)) as pool:
        results = dict(zip(names, pool.map(lambda n: probe(n, cache_root=cache_root), names)))
    for name in names:
        ok, software, _ = results[name]
        if ok and not software:
            return name
    return "cpu"


def check_driver(name: str) -> None:
    """BackendUnavailable in one sentence, before Taichi is touched, where the backend's driver
    library is missing: Taichi would print its own warnings from C++ ("libcuda.so lib not
    found", "Falling back to x64") and then refuse the arch in its own words. Only CUDA's
    driver has one library to look for (Vulkan's and OpenGL's loaders may exist without a
    device: probe() and the device's start tell those)."""
    if name != "cuda" or not sys.platform.startswith("linux"):
        return
    import ctypes
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        raise BackendUnavailable("backend 'cuda' cannot start here: there is no NVIDIA driver "
                                 "(libcuda.so.1 is not installed or not loadable); use 'auto' "
                                 "(the best GPU this machine has, else the CPU), 'vulkan' or "
                                 "'cpu'") from None


def ensure_runtime(name: str, cache_root: Optional[str] = None) -> str:
    """Claim Taichi backend `name` for this process and start its device (device.py: Taichi's
    C API runtime, or Taichi's Python runtime where the C API is missing), or raise
    BackendUnavailable. The first claim fixes the process's backend (Taichi's Python frontend,
    which compiles kernels that are not cached, runs one arch per process); a later claim of
    another backend is an error. `cache_root`: the GPU drivers' caches point into that cache
    folder while the device starts (cache.driver_env)."""
    global _current, _cache_root
    if name not in TAICHI_BACKENDS:
        raise BackendUnavailable(f"unknown Taichi backend {name!r}")
    check_driver(name)
    from tflite_taichi.runtime import flavour
    flavour.check()                 # TFLITE_TAICHI_TAICHI=forge where forge cannot run
    with _lock:
        if _current is not None and _current != name:
            raise BackendUnavailable(
                f"Taichi already runs on {_current!r} in this process and cannot switch to {name!r} "
                "without destroying the other interpreters' memory; use one Taichi backend per "
                "process (or backend='reference')")
        if _current is None:
            if name in ("opengl", "gles"):
                ok, _software, detail = probe(name, cache_root=cache_root)
                if not ok:
                    raise BackendUnavailable(f"{name} does not work here: {detail}")
                os.environ.update({k: v for k, v in _env_for(name).items() if k == "EGL_PLATFORM"})
            _current, _cache_root = name, cache_root
            kit.claim_backend(name)
    from tflite_taichi.runtime import cache, device
    try:
        device.get(name, lambda: cache.driver_env(_cache_root))
    except BackendUnavailable:
        with _lock:
            if device.current(name) is None:
                _current = None
                kit.claim_backend(None)
        raise
    return name


def ensure_python_taichi(name: str, cache_root: Optional[str] = None) -> None:
    """Taichi's Python runtime started on `name` (once per process): it compiles kernels that
    are not in the cache, and runs them where the C API cannot (device.PythonDevice).

    Taichi's LLVM backends (cpu, cuda) build their struct module at the first kernel compile and
    assert that it happens in the thread that ran ti.init (measured, Taichi 1.7.4: "Assertion
    failure: std::this_thread::get_id() == main_thread_id_"), so it is materialized right here,
    in the starting thread. Taichi's own offline cache is off: compiled programs are cached as
    AOT modules (cache.py), and Taichi's cache would only grow a second copy in ~/.cache/taichi.
    Returns the runtime's device.ThreadAffinity (OpenGL/GLES: its context's thread).
    `cache_root`: the cache folder, where no Interpreter claimed the backend (a compile worker)."""
    global _python_started, _python_affinity, _cache_root
    from tflite_taichi.runtime.device import ThreadAffinity
    with _lock:
        if _python_started == name:
            return _python_affinity
        if _python_started is not None:
            raise BackendUnavailable(f"Taichi's Python runtime already runs on {_python_started!r} "
                                     f"in this process, not {name!r}")
        from tflite_taichi.runtime import cache
        from tflite_taichi.runtime.device import TAICHI_LOCK
        from tflite_taichi.ops.kit import realize
        if cache_root is not None and _cache_root is None:
            _cache_root = cache_root
        ti = realize()                  # Taichi imported, the ops' decorators applied
        arch = ti.cpu if name == "cpu" else getattr(ti, name)
        offline_dir = cache.taichi_offline_dir(_cache_root)
        cache.remove_stale_taichi_lock(offline_dir)
        where = {"offline_cache_file_path": offline_dir} if offline_dir else {}
        try:
            # ti.init prints "[Taichi] Starting on arch=..." on stdout, which is the user's
            # (a pipe of outputs): said by summary() and the command line instead
            with TAICHI_LOCK, cache.driver_env(_cache_root), \
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
        _python_started = name
        _python_affinity = ThreadAffinity(name)      # GL: its context is this thread's
        return _python_affinity


def cache_root() -> Optional[str]:
    """The cache folder the process's backend was claimed with (the drivers' caches are there)."""
    return _cache_root


def current() -> Optional[str]:
    return _current
