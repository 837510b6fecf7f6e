"""Taichi's C API (`libtaichi_c_api`, shipped inside the taichi wheel), bound with ctypes.

Why: a Taichi AOT module (kernels compiled once by Taichi's Python frontend, then saved) loads
through the C API in milliseconds, where Taichi's frontend takes seconds to compile the same
kernels again in every process; and the C API lets us allocate device memory ourselves, keep it
on the device between invokes, enqueue every launch of an invoke and wait once
(../shared/results/taichi_capi_h200.md: a wait costs ~0.6 ms on the H200's Vulkan, an enqueue
~50 us). Nothing here imports the `taichi` Python package: a warm start never loads it.

Only what the delegate needs is bound: runtimes, memory (allocate, map, copy, free, export),
AOT modules, kernels with ndarray arguments, flush and wait, the Vulkan runtime's handles (for
vulkan_host.py's wait), and the last error. Every call that
can fail is checked against `ti_get_last_error`, and a failure raises `CapiError` naming the
call and Taichi's message. Structures follow `taichi/taichi_core.h` of Taichi 1.7.4 (the C API
version the library reports is checked against it when it loads).
"""
from __future__ import annotations

import ctypes as C
import importlib.util
import os
import sys
from typing import Optional

from tflite_taichi.errors import BackendUnavailable
from tflite_taichi.runtime.session import SESSION

C_API_VERSION = 1007000          # TI_C_API_VERSION of the header these structures follow

ARCHS = {"vulkan": 1, "metal": 2, "cuda": 3, "x64": 4, "arm64": 5, "opengl": 6, "gles": 7}
LLVM_ARCHS = ("cuda", "x64", "arm64")    # modules load only as folders (a .tcm segfaults)

DATA_TYPES = {"f16": 0, "f32": 1, "i32": 5, "u8": 8}
ARGUMENT_NDARRAY = 2
MEMORY_USAGE_STORAGE, MEMORY_USAGE_UNIFORM = 1, 2

# TiCapability (taichi_core.h): the names Taichi's AOT builder takes ("spirv_has_float16=1")
CAPABILITIES = {1: "spirv_version", 2: "spirv_has_int8", 3: "spirv_has_int16", 4: "spirv_has_int64",
                5: "spirv_has_float16", 6: "spirv_has_float64", 7: "spirv_has_atomic_int64",
                8: "spirv_has_atomic_float16", 9: "spirv_has_atomic_float16_add",
                10: "spirv_has_atomic_float16_minmax", 11: "spirv_has_atomic_float",
                12: "spirv_has_atomic_float_add", 13: "spirv_has_atomic_float_minmax",
                14: "spirv_has_atomic_float64", 15: "spirv_has_atomic_float64_add",
                16: "spirv_has_atomic_float64_minmax", 17: "spirv_has_variable_ptr",
                18: "spirv_has_physical_storage_buffer", 19: "spirv_has_subgroup_basic",
                20: "spirv_has_subgroup_vote", 21: "spirv_has_subgroup_arithmetic",
                22: "spirv_has_subgroup_ballot", 23: "spirv_has_non_semantic_info",
                24: "spirv_has_no_integer_wrap_decoration"}

ERRORS = {0: "success", -1: "not supported", -2: "corrupted data", -3: "name not found",
          -4: "invalid argument", -5: "argument null", -6: "argument out of range",
          -7: "argument not found", -8: "invalid interop", -9: "invalid state",
          -10: "incompatible module", -11: "out of memory"}


class CapiError(BackendUnavailable):
    """A call into Taichi's C API failed (the library is missing, a runtime does not start, a
    module does not load, a launch was refused): the call and Taichi's own message."""

    def __init__(self, message: str, code: int = 0):
        super().__init__(message)
        self.code = code


# -- structures (taichi_core.h, 1.7.4) ----------------------------------------------------------
class NdShape(C.Structure):
    _fields_ = [("dim_count", C.c_uint32), ("dims", C.c_uint32 * 16)]


class NdArray(C.Structure):
    _fields_ = [("memory", C.c_void_p), ("shape", NdShape), ("elem_shape", NdShape),
                ("elem_type", C.c_uint32)]


class _TensorValue(C.Union):
    _fields_ = [("x8", C.c_uint8 * 128), ("x64", C.c_uint64 * 16)]


class _TensorValueWithLength(C.Structure):
    _fields_ = [("length", C.c_uint32), ("data", _TensorValue)]


class _Tensor(C.Structure):
    _fields_ = [("type", C.c_uint32), ("contents", _TensorValueWithLength)]


class _ScalarValue(C.Union):
    _fields_ = [("x8", C.c_uint8), ("x16", C.c_uint16), ("x32", C.c_uint32), ("x64", C.c_uint64)]


class _Scalar(C.Structure):
    _fields_ = [("type", C.c_uint32), ("value", _ScalarValue)]


class _Texture(C.Structure):
    _fields_ = [("image", C.c_void_p), ("sampler", C.c_void_p), ("dimension", C.c_uint32),
                ("extent", C.c_uint32 * 4), ("format", C.c_uint32)]


class _ArgumentValue(C.Union):
    _fields_ = [("i32", C.c_int32), ("f32", C.c_float), ("ndarray", NdArray),
                ("texture", _Texture), ("scalar", _Scalar), ("tensor", _Tensor)]


class Argument(C.Structure):
    _fields_ = [("type", C.c_uint32), ("value", _ArgumentValue)]


class MemoryAllocateInfo(C.Structure):
    _fields_ = [("size", C.c_uint64), ("host_write", C.c_uint32), ("host_read", C.c_uint32),
                ("export_sharing", C.c_uint32), ("usage", C.c_uint32)]


class MemorySlice(C.Structure):
    _fields_ = [("memory", C.c_void_p), ("offset", C.c_uint64), ("size", C.c_uint64)]


class CapabilityLevelInfo(C.Structure):
    _fields_ = [("capability", C.c_uint32), ("level", C.c_uint32)]


class InteropInfo(C.Structure):      # TiCpuMemoryInteropInfo and TiCudaMemoryInteropInfo
    _fields_ = [("ptr", C.c_void_p), ("size", C.c_uint64)]


class VulkanRuntimeInterop(C.Structure):    # TiVulkanRuntimeInteropInfo (taichi_vulkan.h)
    _fields_ = [("get_instance_proc_addr", C.c_void_p), ("api_version", C.c_uint32),
                ("instance", C.c_void_p), ("physical_device", C.c_void_p), ("device", C.c_void_p),
                ("compute_queue", C.c_void_p), ("compute_queue_family_index", C.c_uint32),
                ("graphics_queue", C.c_void_p), ("graphics_queue_family_index", C.c_uint32)]


class VulkanMemoryInterop(C.Structure):     # TiVulkanMemoryInteropInfo (taichi_vulkan.h)
    _fields_ = [("buffer", C.c_uint64), ("size", C.c_uint64), ("usage", C.c_uint32),
                ("memory", C.c_uint64), ("offset", C.c_uint64)]


# -- the library ------------------------------------------------------------------------------
def _taichi_root() -> Optional[str]:
    """The installed taichi package's folder, found without importing it."""
    spec = importlib.util.find_spec("taichi")
    if spec is None or not spec.submodule_search_locations:
        return None
    return list(spec.submodule_search_locations)[0]


def library_path() -> Optional[str]:
    """libtaichi_c_api from $TFLITE_TAICHI_CAPI_LIB, else the taichi wheel's (None if absent)."""
    from tflite_taichi import switches
    given = switches.value("TFLITE_TAICHI_CAPI_LIB")
    if given:
        return given
    from tflite_taichi.runtime import taichi_build
    if taichi_build.is_forge():             # the fork's runtime library keeps Taichi 1.7's C API
        return taichi_build.capi_library()
    root = _taichi_root()
    if root is None:
        return None
    name = {"darwin": "libtaichi_c_api.dylib", "win32": "taichi_c_api.dll"}.get(sys.platform,
                                                                               "libtaichi_c_api.so")
    for sub in ("lib", "bin"):
        path = os.path.join(root, "_lib", "c_api", sub, name)
        if os.path.isfile(path):
            return path
    return None


def runtime_bitcode_dir() -> Optional[str]:
    """The LLVM runtime bitcode the C API's cuda/x64 runtimes need (TI_LIB_DIR)."""
    from tflite_taichi.runtime import taichi_build
    if taichi_build.is_forge():
        return taichi_build.runtime_bitcode_dir()
    root = _taichi_root()
    if root is None:
        return None
    for sub in (("_lib", "c_api", "runtime"), ("_lib", "runtime")):
        path = os.path.join(root, *sub)
        if os.path.isfile(os.path.join(path, "runtime_x64.bc")):
            return path
    return None


_VOID, _P, _U32, _U64 = None, C.c_void_p, C.c_uint32, C.c_uint64
_SIGNATURES = {
    "ti_get_version": (_U32, []),
    "ti_get_last_error": (C.c_int32, [C.POINTER(C.c_uint64), C.c_char_p]),
    "ti_set_last_error": (_VOID, [C.c_int32, C.c_char_p]),
    "ti_get_available_archs": (_VOID, [C.POINTER(C.c_uint32), C.POINTER(C.c_uint32)]),
    "ti_create_runtime": (_P, [_U32, _U32]),
    "ti_destroy_runtime": (_VOID, [_P]),
    "ti_get_runtime_capabilities": (_VOID, [_P, C.POINTER(C.c_uint32), C.POINTER(CapabilityLevelInfo)]),
    "ti_allocate_memory": (_P, [_P, C.POINTER(MemoryAllocateInfo)]),
    "ti_free_memory": (_VOID, [_P, _P]),
    "ti_map_memory": (_P, [_P, _P]),
    "ti_unmap_memory": (_VOID, [_P, _P]),
    "ti_copy_memory_device_to_device": (_VOID, [_P, C.POINTER(MemorySlice), C.POINTER(MemorySlice)]),
    "ti_launch_kernel": (_VOID, [_P, _P, _U32, C.POINTER(Argument)]),
    "ti_flush": (_VOID, [_P]),
    "ti_wait": (_VOID, [_P]),
    "ti_load_aot_module": (_P, [_P, C.c_char_p]),
    "ti_create_aot_module": (_P, [_P, C.c_void_p, _U64]),
    "ti_destroy_aot_module": (_VOID, [_P]),
    "ti_get_aot_module_kernel": (_P, [_P, C.c_char_p]),
    "ti_export_cpu_memory": (_VOID, [_P, _P, C.POINTER(InteropInfo)]),
    "ti_import_cpu_memory": (_P, [_P, _P, C.c_size_t]),
    "ti_export_cuda_memory": (_VOID, [_P, _P, C.POINTER(InteropInfo)]),
    "ti_export_vulkan_runtime": (_VOID, [_P, C.POINTER(VulkanRuntimeInterop)]),
    "ti_export_vulkan_memory": (_VOID, [_P, _P, C.POINTER(VulkanMemoryInterop)]),
}

def load_library():
    """The bound C API library (loaded once per process and kept in the session: SESSION.capi_lib,
    from SESSION.capi_path), or CapiError saying why not."""
    s = SESSION
    with s.capi_lock:
        if s.capi_lib is not None:
            return s.capi_lib
        path = library_path()
        if path is None:
            raise CapiError("Taichi's C API library (taichi/_lib/c_api, or taichi-forge's runtime "
                            "library) is not installed; set TFLITE_TAICHI_CAPI_LIB to its path")
        # the LLVM runtimes (cuda, x64) refuse to start without their bitcode folder, and
        # crash (SIGSEGV, measured) on another Taichi build's: importing taichi-forge sets
        # TI_LIB_DIR to its own for the whole process and its children
        bitcode = runtime_bitcode_dir()
        if bitcode is not None:
            os.environ["TI_LIB_DIR"] = bitcode
        try:
            lib = C.CDLL(path)
        except OSError as e:
            raise CapiError(f"cannot load Taichi's C API library {path}: {e}") from None
        for name, (restype, argtypes) in _SIGNATURES.items():
            fn = getattr(lib, name, None)
            if fn is None:
                raise CapiError(f"{path} has no {name}: not the C API of Taichi 1.7")
            fn.restype, fn.argtypes = restype, argtypes
        version = lib.ti_get_version()
        if version // 1000 != C_API_VERSION // 1000:
            raise CapiError(f"{path} is Taichi's C API {version}; tflite_taichi binds "
                            f"{C_API_VERSION} (taichi 1.7)")
        s.capi_lib, s.capi_path = lib, path
        return lib


def last_error(lib) -> tuple:
    """(code, message) of the last C API error, and clears it."""
    size = C.c_uint64(0)
    code = lib.ti_get_last_error(C.byref(size), None)
    message = ""
    if code != 0 and size.value:
        buf = C.create_string_buffer(size.value + 1)
        size = C.c_uint64(size.value + 1)
        code = lib.ti_get_last_error(C.byref(size), buf)
        message = buf.value.decode(errors="replace")
    lib.ti_set_last_error(0, None)
    return code, message


def check(lib, what: str) -> None:
    """Raise CapiError if the last call failed."""
    code, message = last_error(lib)
    if code != 0:
        raise CapiError(f"Taichi C API {what} failed: {ERRORS.get(code, code)}"
                        + (f" ({message})" if message else ""), code)


def available_archs() -> list:
    """The archs the C API library can create a runtime on here."""
    lib = load_library()
    count = C.c_uint32(0)
    lib.ti_get_available_archs(C.byref(count), None)
    archs = (C.c_uint32 * max(count.value, 1))()
    lib.ti_get_available_archs(C.byref(count), archs)
    names = {v: k for k, v in ARCHS.items()}
    return [names.get(a, str(a)) for a in archs[:count.value]]


def ndarray_argument(memory: int, elements: int, dtype: str) -> Argument:
    """A kernel argument: a 1-D ndarray of `elements` `dtype` values in `memory`."""
    arg = Argument()
    arg.type = ARGUMENT_NDARRAY
    arg.value.ndarray.memory = memory
    arg.value.ndarray.shape.dim_count = 1
    arg.value.ndarray.shape.dims[0] = elements
    arg.value.ndarray.elem_shape.dim_count = 0
    arg.value.ndarray.elem_type = DATA_TYPES[dtype]
    return arg
