"""The Taichi runtime: which arch, probing, one runtime per process.

Facts this module is built on (measured; the README's "Backends" table says where):
- `ti.init` falls back to CPU silently unless told not to, so we pass enable_fallback=False
  and still check the arch after init;
- Taichi is one runtime per process and `ti.reset()` kills every ndarray, so the first Taichi
  backend an Interpreter asks for is the process's; asking for another is an error;
- headless OpenGL/GLES need EGL_PLATFORM=surfaceless, and a bad GL stack can segfault inside
  `ti.init`, so GL is probed in a subprocess first;
- a software device (Mesa's lavapipe, llvmpipe) is a CPU in disguise: `auto` never picks it.
"""
from __future__ import annotations

import os
import subprocess
import sys
from typing import Optional

from tflite_taichi.errors import BackendUnavailable
from tflite_taichi.runtime import session
from tflite_taichi.runtime.children import python_script_command

TAICHI_BACKENDS = ("cuda", "vulkan", "metal", "opengl", "gles", "cpu")
AUTO_ORDER = ("cuda", "vulkan", "metal", "opengl")   # hardware GPUs, best first
SOFTWARE_DEVICE_MARKERS = ("llvmpipe", "lavapipe", "softpipe", "swiftshader")


def is_software_device(text: str) -> bool:
    """Whether a device name or a probe's log names a CPU pretending to be a GPU."""
    return any(m in text.lower() for m in SOFTWARE_DEVICE_MARKERS)
GFX_PROBED = ("vulkan", "opengl", "gles")   # archs whose device may be software (Metal is not)
FP16_BACKENDS = ("cuda", "vulkan", "cpu")            # no u16 in Taichi's GL SPIR-V path

# the process's state (the claimed backend, Taichi's Python runtime, the probes' results) is
# runtime/session.py's SESSION; these are its readers, kept here for the layers above
current = session.current
cache_root = session.cache_root


def ensure_python_taichi(name: str, cache_root: Optional[str] = None):
    """Taichi's Python runtime started on `name` (runtime/device.py starts it)."""
    from tflite_taichi.runtime import device
    return device.ensure_python_taichi(name, cache_root)


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
    known = _known_probe(name, cache_root)
    if known is not None:
        return known
    try:
        proc = subprocess.run(python_script_command(PROBE_SCRIPT, name), capture_output=True,
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
    from tflite_taichi.runtime import cache
    cache.remember_probe(cache_root, name, result, keep=not result[2].startswith("probe timed out"))
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


# Device nodes a GPU driver makes on Linux: Mesa's and the kernel's DRM drivers (AMD, Intel, and
# Nouveau/NVIDIA's DRM), NVIDIA's own driver, WSL's GPU paravirtualization, Qualcomm's and Arm's
# mobile GPUs. Mesa's lavapipe and llvmpipe need none: they are the CPU.
GPU_DEVICE_NODES = ("/dev/dri/renderD*", "/dev/nvidia[0-9]*", "/dev/dxg", "/dev/kgsl*", "/dev/mali*")


def gpu_device_nodes() -> list:
    """The GPU device nodes this machine has (GPU_DEVICE_NODES); on Linux, none means that no
    hardware GPU backend can start. Elsewhere (macOS's Metal, Windows) not known: ['?']."""
    if not sys.platform.startswith("linux"):
        return ["?"]
    import glob
    return [found for pattern in GPU_DEVICE_NODES for found in glob.glob(pattern)]


def choose_auto(cache_root: Optional[str] = None, at_a_glance: bool = False) -> str:
    """The first hardware GPU backend that really works, else 'cpu' (Taichi's LLVM CPU). In
    AUTO_ORDER, what this process or the cache folder already knows is taken as known; the
    probes not yet recorded from there on run side by side (each is a subprocess of 0.3-2.7 s:
    one after another they were most of a cold `auto` start). A Linux machine without a GPU
    device node has no hardware GPU to find, so it runs none (its cold start was 1.4 s against
    a warm 0.3 s).

    at_a_glance: the caller answers on LiteRT until the GPU is ready (the Interpreter's
    `auto`), so an NVIDIA GPU that the CUDA driver shows in this process (cuda_at_a_glance:
    ~0.1 s, where cuda's probe took 2.7 s cold on an H100) is taken without its probe; the
    device's start in the background is the probe then (device._start_capi records it). The
    glance is kept in the cache folder too (cache.store_glance): a model that ends on LiteRT
    never starts the device, and every process would ask the driver again."""
    if not gpu_device_nodes():
        return "cpu"
    names = [n for n in AUTO_ORDER if n != "metal" or sys.platform == "darwin"]
    while names:                        # decided by what is known, in order
        known = _known_probe(names[0], cache_root)
        if known is None:
            break
        ok, software, _ = known
        if ok and not software:
            return names[0]
        names.pop(0)
    device = _glanced(names[0], cache_root) if names and at_a_glance else None
    if device is not None:
        session.SESSION.unprobed[names[0]] = (cache_root, device)
        return names[0]
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(max_workers=max(len(names), 1)) as pool:
        results = dict(zip(names, pool.map(lambda n: probe(n, cache_root=cache_root), names)))
    for name in names:
        ok, software, _ = results[name]
        if ok and not software:
            return name
    return "cpu"


def _known_probe(name: str, cache_root: Optional[str]) -> Optional[tuple]:
    """A probe's result this process holds, or the cache folder's (then this process's too),
    else None (probe() runs it)."""
    probes = session.SESSION.probes
    if name not in probes:
        from tflite_taichi.runtime import cache
        stored = cache.stored_probe(cache_root, name)
        if stored is not None:
            probes[name] = stored
    return probes.get(name)


def _glanced(name: str, cache_root: Optional[str]) -> Optional[str]:
    """The device a glance at `name` (GLANCES) sees: the cache folder's record of an earlier
    glance under this driver stack, else the glance itself, recorded where it saw one."""
    glance = GLANCES.get(name)
    if glance is None:
        return None
    from tflite_taichi.runtime import cache
    device = cache.stored_glance(cache_root, name)
    if device is None:
        device = glance()
        if device is not None:
            cache.store_glance(cache_root, name, device)
    return device


# Taichi 1.7.4's CUDA code generator (LLVM 15's NVPTX) targets compute capabilities up to 9.0
CUDA_NEWEST_TARGET = (9, 0)
_CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, _CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 75, 76


def cuda_at_a_glance() -> Optional[str]:
    """The name of the first CUDA device, asked of the NVIDIA driver in this process, where
    one is there whose compute capability Taichi generates code for; else None (no driver, no
    device, CUDA_VISIBLE_DEVICES empty, a GPU too new or too old for Taichi 1.7.4)."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes as C
    try:
        cu = C.CDLL("libcuda.so.1")
    except OSError:
        return None
    count, device, major, minor = C.c_int(), C.c_int(), C.c_int(), C.c_int()
    name = C.create_string_buffer(256)
    if (cu.cuInit(0) != 0 or cu.cuDeviceGetCount(C.byref(count)) != 0 or count.value < 1
            or cu.cuDeviceGet(C.byref(device), 0) != 0
            or cu.cuDeviceGetAttribute(C.byref(major), _CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, device) != 0
            or cu.cuDeviceGetAttribute(C.byref(minor), _CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, device) != 0
            or cu.cuDeviceGetName(name, len(name), device) != 0):
        return None
    if not (3, 5) <= (major.value, minor.value) <= CUDA_NEWEST_TARGET:
        return None
    return name.value.decode(errors="replace").strip() or "CUDA device"


# the backends `auto` can take at a glance (choose_auto): backend -> () -> device name or None
GLANCES = {"cuda": cuda_at_a_glance}


def cannot_start(name: str, why: str) -> BackendUnavailable:
    """The one sentence a backend that cannot start here is refused with, every backend alike."""
    return BackendUnavailable(f"backend '{name}' cannot start here: {why}; use 'auto' (the best "
                              f"GPU this machine has, else the CPU) or 'cpu'")


def _taichi_words(text: str) -> str:
    """A refusal of Taichi's without its enum reprs ("Arch=[<Arch.metal: 4>]" -> "metal")."""
    import re
    return re.sub(r"Arch=\[<Arch\.(\w+): \d+>\]", r"\1", text)


# the library each backend's driver is reached through on Linux: where it cannot be loaded,
# Taichi would print its own C++ warnings ("libcuda.so lib not found", "C-API error") and then
# refuse the arch in its own words
DRIVER_LIBRARIES = {"cuda": ("libcuda.so.1", "there is no NVIDIA driver (libcuda.so.1 is not "
                                             "installed or not loadable)"),
                    "vulkan": ("libvulkan.so.1", "there is no Vulkan loader (libvulkan.so.1 is "
                                                 "not installed or not loadable)")}


def check_driver(name: str) -> None:
    """BackendUnavailable in one sentence, before Taichi is touched, where the backend cannot
    be had here: Metal off macOS, or a driver library that is missing (a loader may exist
    without a device: probe() and the device's start tell those)."""
    if name == "metal" and sys.platform != "darwin":
        raise cannot_start(name, "Metal is Apple's GPU API, which Taichi runs on macOS only")
    if name not in DRIVER_LIBRARIES or not sys.platform.startswith("linux"):
        return
    import ctypes
    library, why = DRIVER_LIBRARIES[name]
    try:
        ctypes.CDLL(library)
    except OSError:
        raise cannot_start(name, why) from None


def ensure_runtime(name: str, cache_root: Optional[str] = None, start: bool = True) -> str:
    """Claim Taichi backend `name` for this process and start its device (device.py: Taichi's
    C API runtime, or Taichi's Python runtime where the C API is missing), or raise
    BackendUnavailable. The first claim fixes the process's backend (Taichi's Python frontend,
    which compiles kernels that are not cached, runs one arch per process); a later claim of
    another backend is an error. `cache_root`: the GPU drivers' caches point into that cache
    folder while the device starts (cache.driver_env). start=False: claimed only; the device
    starts where a program first asks for it (program_builder: in its build thread, while the
    interpreter answers on the CPU)."""
    if name not in TAICHI_BACKENDS:
        raise BackendUnavailable(f"unknown Taichi backend {name!r}")
    check_driver(name)
    from tflite_taichi.runtime import taichi_build
    taichi_build.check()                 # TFLITE_TAICHI_TAICHI=forge where forge cannot run
    s = session.SESSION
    with s.lock:
        if s.backend is None and name in ("opengl", "gles"):
            ok, _software, detail = probe(name, cache_root=cache_root)
            if not ok:
                raise cannot_start(name, f"no working {'OpenGL' if name == 'opengl' else 'OpenGL ES'} "
                                         f"driver was found (the probe: {_taichi_words(detail)})")
            # process-wide on purpose: libEGL reads EGL_PLATFORM at every display it opens (the
            # C API device's, Taichi's Python runtime's when it compiles later) and the compile
            # workers inherit it; set only where the user left it unset and has no display
            os.environ.update({k: v for k, v in _env_for(name).items() if k == "EGL_PLATFORM"})
        s.claim(name, cache_root)
    if not start:
        return name
    from tflite_taichi.runtime import cache, device
    try:
        device.get(name, lambda: cache.driver_env(s.cache_root))
    except BackendUnavailable as e:
        with s.lock:
            if device.current(name) is None:
                s.release()
        raise cannot_start(name, f"its device did not start ({_taichi_words(str(e))})") from None
    return name
