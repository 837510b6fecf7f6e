"""Which Taichi builds and runs this process's kernels: upstream taichi 1.7.4 (the pin), or,
opted into with TFLITE_TAICHI_TAICHI=forge and the `forge` extra, the taichi-forge fork.

Why the fork is offered (a warm start without LLVM work: bench/results/forge_starts.md): Taichi 1.7.4's C API
loads a cuda or x64 module as LLVM IR and compiles it at every kernel lookup, in every process:
1.5-3.5 s of each warm cuda start on the H200 and 5 s of a warm cpu one on the 2-core machine.
taichi-forge 0.7 exports cuda modules as PTX (the driver caches what it makes of PTX) and its
runtime loads x64 modules several times faster; its C library keeps Taichi 1.7's C API (same
functions, version 1007000, same structure layouts), so device.py and capi.py drive it
unchanged. Our code generator runs on its Python frontend unchanged: `import taichi` is
answered with `taichi_forge` (an import alias) in this process and in the compile workers,
which inherit the switch.

The build is fixed for the process when the package is imported (Taichi's frontend runs one
build per process); the cache keys modules by the build and its version.
"""
from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from typing import Optional

from tflite_taichi.runtime.session import SESSION

SWITCH = "TFLITE_TAICHI_TAICHI"
TAICHI_BUILDS = ("taichi", "forge")


def chosen() -> str:
    """'taichi' (default) or 'forge', from TFLITE_TAICHI_TAICHI."""
    from tflite_taichi import switches
    from tflite_taichi.errors import BackendUnavailable, InputError
    try:
        return switches.value(SWITCH)
    except InputError as e:         # a Taichi that cannot be had: the backend's error, as before
        raise BackendUnavailable(str(e)) from None


def is_forge() -> bool:
    return SESSION.taichi_build == "forge"


def _forge_alias():
    """A finder answering `import taichi[.x]` with `taichi_forge[.x]` (the same module objects);
    built on demand: importlib.abc is not needed by upstream's processes."""
    import importlib.abc

    class ForgeAlias(importlib.abc.Loader, importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "taichi" or name.startswith("taichi."):
                return importlib.util.spec_from_loader(name, self)
            return None

        def create_module(self, spec):
            return importlib.import_module("taichi_forge" + spec.name[len("taichi"):])

        def exec_module(self, module):
            pass
    return ForgeAlias()


def install() -> str:
    """Fix this process's Taichi build (once; `import tflite_taichi` calls it), kept in the session
    (SESSION.taichi_build, SESSION.taichi_build_problem). For forge: alias `taichi` to it. Never raises: a
    switch that cannot be honoured is reported by check(), when a Taichi backend starts (the
    reference path needs no Taichi)."""
    s = SESSION
    if s.taichi_build is not None:
        return s.taichi_build
    try:
        build = chosen()
    except Exception as e:          # BackendUnavailable, reported by check()
        s.taichi_build, s.taichi_build_problem = "taichi", str(e)
        return s.taichi_build
    problem = None
    if build == "forge":
        loaded = sys.modules.get("taichi")
        if not _installed("taichi_forge"):
            problem = (f"{SWITCH}=forge, but taichi-forge is not installed: pip install "
                       "'tflite-taichi[forge]' (Python 3.10 or newer)")
        elif loaded is not None and not loaded.__name__.startswith("taichi_forge"):
            problem = (f"{SWITCH}=forge, but this process imported taichi itself before "
                       "tflite_taichi: set the switch before anything imports taichi")
        else:
            sys.meta_path.insert(0, _forge_alias())
    s.taichi_build_problem = problem
    s.taichi_build = build if problem is None else "taichi"
    return s.taichi_build


def _installed(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):     # a broken or hidden install counts as absent
        return False


def check() -> None:
    """BackendUnavailable if TFLITE_TAICHI_TAICHI asked for what this process cannot run."""
    install()
    if SESSION.taichi_build_problem is not None:
        from tflite_taichi.errors import BackendUnavailable
        raise BackendUnavailable(SESSION.taichi_build_problem)


def _forge_runtime_lib() -> Optional[str]:
    spec = importlib.util.find_spec("taichi_forge_runtime")
    if spec is None or not spec.submodule_search_locations:
        return None
    return os.path.join(list(spec.submodule_search_locations)[0], "_lib")


def capi_library() -> Optional[str]:
    """The forge runtime's C library (Taichi 1.7's C API), or None."""
    lib = _forge_runtime_lib()
    path = lib and os.path.join(lib, "runtime_native", "libtaichi_runtime.so")
    return path if path and os.path.isfile(path) else None


def runtime_bitcode_dir() -> Optional[str]:
    """The forge runtime's LLVM runtime bitcode folder (TI_LIB_DIR), or None."""
    lib = _forge_runtime_lib()
    path = lib and os.path.join(lib, "runtime")
    return path if path and os.path.isfile(os.path.join(path, "runtime_x64.bc")) else None


def artifact_format(arch: str) -> Optional[str]:
    """What a forge module is saved as: PTX on cuda (no LLVM work at load; the driver caches
    its own compilation of PTX), the default elsewhere. None on upstream taichi."""
    return "ptx" if is_forge() and arch == "cuda" else None


def version() -> str:
    """The forge distribution's version, for the cache key."""
    from importlib import metadata
    try:
        return "forge-" + metadata.version("taichi-forge")
    except metadata.PackageNotFoundError:
        return "forge-unknown"
