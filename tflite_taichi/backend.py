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
import os
import subprocess
import sys
import threading
from typing import Optional

from tflite_taichi.errors import BackendUnavailable

TAICHI_BACKENDS = ("cuda", "vulkan", "metal", "opengl", "gles", "cpu")
AUTO_ORDER = ("cuda", "vulkan", "metal", "opengl")   # hardware GPUs, best first
SOFTWARE_DEVICE_MARKERS = ("llvmpipe", "lavapipe", "softpipe", "swiftshader")
FP16_BACKENDS = ("cuda", "vulkan", "cpu")            # no u16 in Taichi's GL SPIR-V path

_lock = threading.Lock()
_current: Optional[str] = None
_cache_root: Optional[str] = None     # cache_dir Taichi was started with (resolved)
_probe_cache: dict = {}

PROBE_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_probe.py")


def _env_for(name: str) -> dict:
    env = dict(os.environ)
    if name in ("opengl", "gles") and not env.get("DISPLAY") and not env.get("WAYLAND_DISPLAY"):
        env.setdefault("EGL_PLATFORM", "surfaceless")
    return env


def probe(name: str, timeout: float = 120.0) -> tuple:
    """(ok, software, detail) for a Taichi arch, tested in a subprocess (cached per process)."""
    if name in _probe_cache:
        return _probe_cache[name]
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
            software = any(m in out.lower() for m in SOFTWARE_DEVICE_MARKERS)
            device = _device_name(out) or ok_line[0].split(" ", 2)[-1]
            result = (True, software, device)
    _probe_cache[name] = result
    return result


def _device_name(log: str) -> str:
    for line in log.splitlines():
        if "Found Vulkan Device" in line:
            return line.split("Found Vulkan Device", 1)[1].strip(" 0()")
    return ""


# backend='auto' on a machine without a hardware GPU runs Taichi's cpu backend, except for these
# ops, which numpy runs faster there (BLAS matrix products; depthwise as tap-by-tap vector
# multiply-adds): measured per op on the shared models, bench/results/cpu_2core.md.
CPU_REFERENCE_OPS = frozenset({"CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED", "TRANSPOSE_CONV",
                               "CUSTOM:Convolution2DTransposeBias", "AVERAGE_POOL_2D",
                               "MAX_POOL_2D", "RESIZE_BILINEAR", "RESIZE_NEAREST_NEIGHBOR"})


def choose_auto() -> str:
    """The first hardware GPU backend that really works, else 'cpu' (Taichi's LLVM CPU)."""
    for name in AUTO_ORDER:
        if name == "metal" and sys.platform != "darwin":
            continue
        ok, software, _ = probe(name)
        if ok and not software:
            return name
    return "cpu"


def ensure_runtime(name: str, cache_dir=None) -> str:
    """Initialise Taichi on `name` for this process (once), or raise BackendUnavailable.

    cache_dir (see cache.py): the first Taichi start of the process fixes it. Its Taichi cache
    is checked (or wiped) and the driver cache variables point into it while Taichi starts; a
    later call may pass the same folder or none, another one raises cache.CacheError."""
    global _current, _cache_root
    if name not in TAICHI_BACKENDS:
        raise BackendUnavailable(f"unknown Taichi backend {name!r}")
    with _lock:
        if _current == name:
            if cache_dir is not None:
                from tflite_taichi import cache
                cache.check_same(cache_dir, _cache_root)
            return name
        if _current is not None:
            raise BackendUnavailable(
                f"Taichi already runs on {_current!r} in this process and cannot switch to {name!r} "
                "without destroying the other interpreters' memory; use one Taichi backend per "
                "process (or backend='reference')")
        if name in ("opengl", "gles"):
            ok, _software, detail = probe(name)
            if not ok:
                raise BackendUnavailable(f"{name} does not work here: {detail}")
            os.environ.update({k: v for k, v in _env_for(name).items() if k == "EGL_PLATFORM"})
        import taichi as ti
        arch = ti.cpu if name == "cpu" else getattr(ti, name)
        kwargs, env, disk = {}, contextlib.nullcontext(), None
        if cache_dir is not None:       # before the driver loads: it reads the variables once
            from tflite_taichi import cache
            disk = cache.start(cache_dir)
            kwargs, env = {"offline_cache_file_path": disk.taichi_dir}, disk.starting()
        try:
            with env:
                ti.init(arch=arch, enable_fallback=False, offline_cache=True,
                        advanced_optimization=False, cfg_optimization=False,
                        log_level=ti.WARN, **kwargs)
        except Exception as e:  # taichi raises RuntimeError for a missing arch
            raise BackendUnavailable(f"{name} is not available: {e}") from None
        got = ti.lang.impl.current_cfg().arch.name
        expected = {"cpu": ("x64", "arm64")}.get(name, (name,))
        if got not in expected:
            if disk is not None:
                disk.finish()           # ti.reset() under the cache's lock, files re-hashed
            else:
                ti.reset()
            raise BackendUnavailable(f"asked for {name}, but Taichi started on {got}")
        if disk is not None:
            disk.activate()             # at exit: Taichi dumps its cache, the manifest follows
        _current, _cache_root = name, (disk.root if disk is not None else None)
        return name


def current() -> Optional[str]:
    return _current
