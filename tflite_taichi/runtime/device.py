"""Where the delegate's kernels run: a device with buffers that live on it, an enqueue-only
launch and one wait.

Two implementations of the same small interface:
- `CapiDevice`: Taichi's C API (capi.py). Kernels come from AOT modules (compiled once by
  Taichi's Python frontend and cached, see cache.py), launches are enqueued and the host waits
  once per invoke; Taichi's Python package is not needed to run them.
- `PythonDevice`: Taichi's Python runtime (`ti.ndarray`, `ti.kernel`), the fallback where the C
  API library is missing or refuses the arch. Same buffers and schedule; every launch goes
  through Taichi's Python launcher and kernels compile in every process.

A device owns the process's runtime for one backend (Taichi: one arch per process). Buffers are
1-D arrays of f32 or f16. The boundary tensors of a program (what partitions read from the host,
from each other, and what the host reads back) live in one device buffer, the `io` buffer,
reached from the host through a `HostLink` chosen per arch by what measured cheapest:
- Vulkan, OpenGL/GLES, Metal: host-visible staging buffers (written through a mapped pointer)
  and copies enqueued on the device (`ti_copy_memory_device_to_device`), so kernels read
  device-local memory and the copies keep their order with the launches;
- CUDA: the C API maps host-visible memory slowly (~0.3 ms per 600 KB on an H200: it is CUDA
  managed memory), so inputs and outputs are copied with the CUDA driver (cuMemcpyHtoD/DtoH) from
  pinned host memory into the exported device pointer; Taichi's LLVM C API has no device copy;
- x64 (Taichi's cpu backend): device memory is host memory: numpy arrays imported into the
  runtime (`ti_import_cpu_memory`), read and written in place; the C API cannot free x64
  allocations it made itself, imported ones are freed with their numpy array;
- the Python device: the io buffer is a `ti.ndarray`, ranges are copied by tiny kernels.

Every call into Taichi (either runtime) holds TAICHI_LOCK: Taichi's runtimes record launches
into one command list per process and its Python frontend is not thread-safe.
"""
import contextlib
import ctypes as C
import io
import os
import platform
import warnings
from typing import Optional

import numpy as np

from tflite_taichi import switches
from tflite_taichi.runtime import capi, vulkan_host, vulkan_submit
# the process's Taichi lock, a GL runtime's thread and the devices started are the session's
from tflite_taichi.runtime.session import (GL_BACKENDS, SESSION, TAICHI_LOCK,  # noqa: F401
                                           ThreadAffinity, inside_device_call)
from tflite_taichi.errors import BackendUnavailable, InputError

ITEMSIZE = {"f32": 4, "f16": 2}
NUMPY = {"f32": np.float32, "f16": np.float16}
GFX_BACKENDS = ("vulkan", "opengl", "gles", "metal")


def _cpu_arch() -> str:
    return "arm64" if platform.machine().lower() in ("arm64", "aarch64") else "x64"




class Buffer:
    """One allocation: `elements` values of `dtype` ('f32' or 'f16')."""

    __slots__ = ("handle", "elements", "dtype", "host", "nbytes", "__weakref__")

    def __init__(self, handle, elements: int, dtype: str, host=None):
        self.handle = handle            # TiMemory (C API) or ti.ndarray (Python device)
        self.elements = int(elements)
        self.dtype = dtype
        self.host = host                # numpy array backing the buffer (x64), else None
        self.nbytes = _nbytes(elements, dtype)


def _nbytes(elements: int, dtype: str) -> int:
    return max(-(-int(elements) * ITEMSIZE[dtype] // 4) * 4, 4)    # whole 32-bit words


# -- the C API device --------------------------------------------------------------------------
class CapiDevice:
    """Taichi's C API runtime for one backend."""

    kind = "capi"

    def __init__(self, backend: str, env=None):
        self.backend = backend
        self.affinity = ThreadAffinity(backend)
        self.arch = _cpu_arch() if backend == "cpu" else backend
        self.lib = capi.load_library()
        self.llvm = self.arch in capi.LLVM_ARCHS
        with TAICHI_LOCK, (env() if env is not None else contextlib.nullcontext()):
            self.runtime = self.lib.ti_create_runtime(capi.ARCHS[self.arch], 0)
            code, message = capi.last_error(self.lib)
        if not self.runtime or code != 0:
            raise capi.CapiError(f"Taichi's C API cannot start a {backend} runtime here: "
                                 f"{capi.ERRORS.get(code, code)} {message}".strip(), code)
        self._cuda = _CudaDriver() if self.arch == "cuda" else None
        self.vulkan_device, self._boost, self._boost_off = None, None, None
        self._fence, self._fence_waits = self._vulkan_host(), 0
        self._taichi_waits_owed = False     # Taichi flushed work since its last ti_wait
        self._submitter, self.submit_note = self._own_submissions()
        # loaded modules by cache key, kept for the process: Taichi's gfx runtime never
        # unregisters a module's kernels (destroying one frees nothing: measured 3.8 MB per
        # load on lavapipe), and an LLVM module's load compiles machine code again
        self._modules = {}
        self._kernels = {}              # (module, kernel name) -> kernel, looked up once
        self.module_info = {}           # cache key -> {kernel name: tasks} of a loaded module

    def capabilities(self) -> list:
        """The runtime's device capabilities as Taichi's AOT builder takes them
        ("spirv_has_float16=1"): a module is compiled for exactly these, and the C API refuses
        to load it on a device whose capabilities differ."""
        with TAICHI_LOCK:
            count = C.c_uint32(0)
            self.lib.ti_get_runtime_capabilities(self.runtime, C.byref(count), None)
            caps = (capi.CapabilityLevelInfo * max(count.value, 1))()
            self.lib.ti_get_runtime_capabilities(self.runtime, C.byref(count), caps)
            capi.check(self.lib, "get_runtime_capabilities")
        return [f"{capi.CAPABILITIES[c.capability]}={c.level}" for c in caps[:count.value]
                if c.capability in capi.CAPABILITIES]

    # memory
    def allocate(self, elements: int, dtype: str = "f32", host_write: bool = False,
                 host_read: bool = False) -> Buffer:
        nbytes = _nbytes(elements, dtype)
        with TAICHI_LOCK:
            if self.arch in ("x64", "arm64"):
                # 64-byte aligned numpy memory the runtime imports: freed with the array
                raw = np.zeros(nbytes + 64, np.uint8)
                start = (-raw.ctypes.data) % 64
                host = raw[start:start + nbytes]
                handle = self.lib.ti_import_cpu_memory(self.runtime, host.ctypes.data, nbytes)
                capi.check(self.lib, f"import of {nbytes} bytes of host memory")
                return Buffer(handle, elements, dtype, host=host)
            info = capi.MemoryAllocateInfo(nbytes, int(host_write), int(host_read), 0,
                                           capi.MEMORY_USAGE_STORAGE)
            handle = self.lib.ti_allocate_memory(self.runtime, C.byref(info))
            code, message = capi.last_error(self.lib)
        if not handle or code != 0:
            raise capi.CapiError(f"cannot allocate {nbytes:,} bytes on {self.backend}: "
                                 f"{capi.ERRORS.get(code, code)} {message}".strip(), code)
        return Buffer(handle, elements, dtype)

    def free(self, buffer: Buffer) -> None:
        if buffer.handle is None:
            return
        with TAICHI_LOCK:
            if self._submitter is not None:
                self._submitter.forget(buffer.handle)
            if buffer.host is None:
                self.lib.ti_free_memory(self.runtime, buffer.handle)
                capi.last_error(self.lib)
        buffer.handle, buffer.host = None, None

    def map(self, buffer: Buffer) -> int:
        ptr = self.lib.ti_map_memory(self.runtime, buffer.handle)
        capi.check(self.lib, "map_memory")
        return ptr

    def unmap(self, buffer: Buffer) -> None:
        self.lib.ti_unmap_memory(self.runtime, buffer.handle)

    def copy(self, dst: Buffer, dst_offset: int, src: Buffer, src_offset: int, count: int) -> None:
        """Enqueue a device copy of `count` elements (gfx archs)."""
        size = ITEMSIZE[src.dtype]
        if self._submitter is not None:
            self._submitter.copy(dst, dst_offset * size, src, src_offset * size, count * size)
            return
        d = capi.MemorySlice(dst.handle, dst_offset * size, count * size)
        s = capi.MemorySlice(src.handle, src_offset * size, count * size)
        self.lib.ti_copy_memory_device_to_device(self.runtime, C.byref(d), C.byref(s))

    def fill(self, buffer: Buffer, array: np.ndarray) -> None:
        """Write `array` (the buffer's dtype) into the whole device-local buffer, once (weights)."""
        data = np.ascontiguousarray(array, dtype=NUMPY[buffer.dtype]).reshape(-1)
        with TAICHI_LOCK:
            if buffer.host is not None:
                buffer.host.view(NUMPY[buffer.dtype])[:data.size] = data
                return
            if self._cuda is not None:
                self._cuda.to_device(self.device_pointer(buffer), data)
                return
            staging = self.allocate(buffer.elements, buffer.dtype, host_write=True)
            try:
                ptr = self.map(staging)
                C.memmove(ptr, data.ctypes.data, data.nbytes)
                self.unmap(staging)
                self.copy(buffer, 0, staging, 0, data.size)
                self.wait()
            finally:
                self.free(staging)

    def device_pointer(self, buffer: Buffer) -> int:
        info = capi.InteropInfo()
        self.lib.ti_export_cuda_memory(self.runtime, buffer.handle, C.byref(info))
        capi.check(self.lib, "export_cuda_memory")
        return info.ptr

    # modules and launches
    def load_module(self, path: str, data: Optional[bytes] = None, taichi: bool = False):
        """An AOT module: a .tcm archive (gfx: `data`, its bytes as checked, else read from
        `path`) or a saved folder (LLVM archs), or CapiError. Vulkan: a module of ours
        (vulkan_submit.py) where it can run as Taichi would, else (or `taichi`) Taichi's."""
        if self._submitter is not None and not taichi:
            if data is None:
                with open(path, "rb") as f:
                    data = f.read()
            try:
                plan = vulkan_submit.ModulePlan(data)
                if plan.physical_pointers and self._submitter.vk.address_of is None:
                    raise vulkan_submit.NotReplayable("the driver gives no buffer device address")
            except vulkan_submit.NotReplayable as e:
                self.submit_note = f"Taichi's for a module ({e})"
            else:
                return vulkan_submit.Module(self._submitter.vk, plan, data)
        with TAICHI_LOCK:
            if self.llvm:
                module = self.lib.ti_load_aot_module(self.runtime, os.fsencode(path))
            else:
                if data is None:
                    with open(path, "rb") as f:
                        data = f.read()
                module = self.lib.ti_create_aot_module(self.runtime, data, len(data))
            code, message = capi.last_error(self.lib)
        if not module or code != 0:
            raise capi.CapiError(f"the AOT module {path} does not load on {self.backend}: "
                                 f"{capi.ERRORS.get(code, code)} {message}".strip(), code)
        return module

    def shared_module(self, key: str, path: str, data: Optional[bytes] = None):
        """The module cached under `key`, loaded once per process (see _modules)."""
        with TAICHI_LOCK:
            module = self._modules.get(key)
            if module is None:
                module = self._modules[key] = self.load_module(path, data)
            return module

    def has_module(self, key: str) -> bool:
        return key in self._modules

    def forget_module(self, key: str) -> None:
        with TAICHI_LOCK:
            module = self._modules.pop(key, None)
            for known in [k for k in self._kernels if k[0] == module]:
                del self._kernels[known]

    def kernel(self, module, name: str):
        """A kernel of a loaded module, looked up once (an LLVM module compiles the kernel's
        machine code at each lookup: 1.5-2.5 s per kernel on the H200's cuda)."""
        with TAICHI_LOCK:
            kernel = self._kernels.get((module, name))
            if kernel is not None:
                return kernel
            asked = module
            if isinstance(module, vulkan_submit.Module):
                try:
                    kernel = self._kernels[(asked, name)] = module.kernel(name)
                    return kernel
                except capi.CapiError as e:         # the driver refused a pipeline of ours
                    self.submit_note = f"Taichi's for a module ({e})"
                    if module.taichi is None:
                        module.taichi = self.load_module("", module.data, taichi=True)
                    module = module.taichi
            kernel = self.lib.ti_get_aot_module_kernel(module, name.encode())
            code, message = capi.last_error(self.lib)
            if kernel and code == 0:
                self._kernels[(asked, name)] = kernel
        if not kernel or code != 0:
            raise capi.CapiError(f"kernel {name} is not in the AOT module: "
                                 f"{capi.ERRORS.get(code, code)} {message}".strip(), code)
        return kernel

    def destroy_module(self, module) -> None:
        with TAICHI_LOCK:
            for known in [k for k in self._kernels if k[0] == module]:
                del self._kernels[known]
            if isinstance(module, vulkan_submit.Module):
                module.destroy()
                if module.taichi is None:
                    return
                module = module.taichi
            self.lib.ti_destroy_aot_module(module)
            capi.last_error(self.lib)

    def launcher(self, kernel, buffers):
        if isinstance(kernel, vulkan_submit.Kernel):
            with TAICHI_LOCK:
                return vulkan_submit.Launch(self._submitter, kernel, buffers)
        if self._submitter is not None:
            return OrderedCapiLaunch(self, kernel, buffers)
        return CapiLaunch(self, kernel, buffers)

    def _own_submissions(self):
        """Vulkan: (the Submitter that records and resubmits our own command buffers, why
        not): vulkan_submit.py says why. Off with TFLITE_TAICHI_VULKAN_SUBMIT=taichi (an A/B
        switch), or where the fence or the runtime's functions are not there."""
        if self.arch != "vulkan":
            return None, None
        if switches.value("TFLITE_TAICHI_VULKAN_SUBMIT") == "taichi":
            return None, "Taichi's (TFLITE_TAICHI_VULKAN_SUBMIT=taichi)"
        if self._fence is None:
            return None, "Taichi's (no fence of ours)"
        try:
            with TAICHI_LOCK:
                return vulkan_submit.Submitter(self.lib, self.runtime, self._fence), "ours"
        except capi.CapiError as e:
            warnings.warn(f"vulkan: submitting through Taichi: {e}", RuntimeWarning, stacklevel=3)
            return None, f"Taichi's ({e})"

    def before_taichi_launch(self) -> None:
        """A launch through Taichi's command list: what we recorded before it goes first."""
        if self._submitter.pending:
            self._submitter.submit()
        self._submitter.taichi_pending = True

    def _vulkan_host(self):
        """Vulkan: the fence the host polls instead of ti_wait and the NVIDIA clock boost
        (vulkan_host.py says why); the fence unless TFLITE_TAICHI_VULKAN_WAIT=taichi. None where
        the runtime cannot give them (warned: waits go through Taichi, slower on some drivers)."""
        if self.arch != "vulkan":
            return None
        try:
            with TAICHI_LOCK:
                host = vulkan_host.VulkanHost(self.lib, self.runtime)
        except capi.CapiError as e:
            warnings.warn(f"vulkan: waiting through Taichi's ti_wait: {e}", RuntimeWarning,
                          stacklevel=2)
            return None
        self.vulkan_device = host.info
        self._boost, self._boost_off = vulkan_host.boost_for(host.info)
        if switches.value("TFLITE_TAICHI_VULKAN_WAIT") == "taichi":
            return None
        return host

    @property
    def uses_fence(self) -> bool:
        return self._fence is not None

    @property
    def perf_boost(self) -> Optional[str]:
        """Where the NVIDIA clock boost stands (vulkan), else None."""
        return self._boost.state if self._boost is not None else self._boost_off

    def wait(self) -> None:
        """Return when every enqueued launch and copy has finished. Vulkan polls its fence and
        lets Taichi's own wait (which frees its flushed command buffers) run every
        FULL_WAIT_EVERY waits, once the queue is idle, where Taichi submitted anything."""
        with TAICHI_LOCK:
            if self._submitter is not None:
                self._taichi_waits_owed |= self._submitter.taichi_pending
                self._submitter.wait()
                self._fence_waits += 1
                if self._fence_waits >= vulkan_host.FULL_WAIT_EVERY and self._taichi_waits_owed:
                    self.drain()
                return
            if self._fence is not None:
                self.lib.ti_flush(self.runtime)
                capi.check(self.lib, f"flush on {self.backend}")
                self._fence.wait()
                self._fence_waits += 1
                if self._fence_waits < vulkan_host.FULL_WAIT_EVERY:
                    return
            self.drain()

    def drain(self) -> None:
        """Taichi's own wait: the queue idle and every command buffer Taichi keeps freed."""
        with TAICHI_LOCK:
            if self._submitter is not None:
                self._submitter.wait()
            self.lib.ti_wait(self.runtime)
            capi.check(self.lib, f"wait on {self.backend}")
            self._fence_waits, self._taichi_waits_owed = 0, False

    def flush(self) -> None:
        with TAICHI_LOCK:
            if self._submitter is not None:
                self._submitter.submit()
                return
            self.lib.ti_flush(self.runtime)

    def link(self, io: Buffer) -> "HostLink":
        if io.host is not None:
            return HostMemoryLink(self, io)
        if self._cuda is not None:
            return CudaLink(self, io)
        return StagingLink(self, io)


class CapiLaunch:
    """One kernel with its arguments bound once (the buffers live as long as the program):
    calling it enqueues the launch."""

    __slots__ = ("lib", "runtime", "kernel", "args", "count")

    def __init__(self, device: CapiDevice, kernel, buffers):
        self.lib, self.runtime, self.kernel = device.lib, device.runtime, kernel
        self.count = len(buffers)
        self.args = (capi.Argument * self.count)(
            *[capi.ndarray_argument(b.handle, b.elements, b.dtype) for b in buffers])

    def __call__(self) -> None:
        self.lib.ti_launch_kernel(self.runtime, self.kernel, self.count, self.args)


class OrderedCapiLaunch(CapiLaunch):
    """A launch through Taichi on a device that submits its own command buffers (a module
    vulkan_submit.py cannot run): it keeps its place among our recorded commands."""

    __slots__ = ("device",)

    def __init__(self, device: CapiDevice, kernel, buffers):
        super().__init__(device, kernel, buffers)
        self.device = device

    def __call__(self) -> None:
        self.device.before_taichi_launch()
        self.lib.ti_launch_kernel(self.runtime, self.kernel, self.count, self.args)


# -- links between the host and the io buffer --------------------------------------------------
class HostLink:
    """Moves float32 ranges of a program's io buffer between host and device:
    `put([(offset, array)])` enqueues host -> device; `request(ranges)` enqueues device -> host
    for ranges the host will read after the next wait, `take(ranges, into)` returns them then:
    each a new float32 array, or, where `into` gives a contiguous array of the range's size,
    that array, filled (cast to its dtype) straight from the link's memory: one pass instead of
    a copy and then a cast or a second copy (a 257x257x21 output: 5.5 MB)."""

    def put(self, items) -> None:
        raise NotImplementedError

    def request(self, ranges) -> None:
        pass

    def take(self, ranges, into=None) -> list:
        raise NotImplementedError

    def close(self) -> None:
        pass


def _deliver(source: np.ndarray, dest) -> np.ndarray:
    """`source` (float32, the link's memory) as a fresh array, or cast into `dest`."""
    if dest is None:
        return source.copy()
    np.copyto(dest.reshape(-1), source, casting="unsafe")
    return dest


def _destinations(ranges, into) -> list:
    """`into` checked against `ranges`: an array where it fits the range contiguously, else None."""
    into = list(into) if into is not None else []
    into += [None] * (len(ranges) - len(into))
    return [d if d is not None and d.flags.c_contiguous and d.size == count else None
            for (_, count), d in zip(ranges, into)]


def _merged(ranges) -> list:
    """Adjacent (offset, count) ranges merged: fewer copy commands."""
    out = []
    for offset, count in sorted(ranges):
        if out and out[-1][0] + out[-1][1] == offset:
            out[-1] = (out[-1][0], out[-1][1] + count)
        else:
            out.append((offset, count))
    return out


class StagingLink(HostLink):
    """gfx archs: an upload buffer the host writes through a mapped pointer and a download
    buffer it reads, each copied to/from the device-local io buffer by enqueued copies."""

    def __init__(self, device: CapiDevice, io: Buffer):
        self.device, self.io = device, io
        self.upload = device.allocate(io.elements, "f32", host_write=True)
        self.download = device.allocate(io.elements, "f32", host_read=True)

    def put(self, items) -> None:
        if not items:
            return
        d = self.device
        with TAICHI_LOCK:
            ptr = d.map(self.upload)
            try:
                for offset, array in items:
                    C.memmove(ptr + 4 * offset, array.ctypes.data, array.nbytes)
            finally:
                d.unmap(self.upload)
            for offset, count in _merged((o, a.size) for o, a in items):
                d.copy(self.io, offset, self.upload, offset, count)

    def request(self, ranges) -> None:
        with TAICHI_LOCK:
            for offset, count in _merged(ranges):
                self.device.copy(self.download, offset, self.io, offset, count)

    def take(self, ranges, into=None) -> list:
        d, out = self.device, []
        with TAICHI_LOCK:
            ptr = d.map(self.download)
            try:
                for (offset, count), dest in zip(ranges, _destinations(ranges, into)):
                    mapped = np.ctypeslib.as_array(
                        (C.c_float * max(count, 1)).from_address(ptr + 4 * offset))[:count]
                    out.append(_deliver(mapped, dest))
            finally:
                d.unmap(self.download)
        return out

    def close(self) -> None:
        self.device.free(self.upload)
        self.device.free(self.download)


class CudaLink(HostLink):
    """CUDA: pinned host memory and the driver's copies into the exported device pointer (on
    the legacy default stream Taichi launches on, so they keep their order with the kernels)."""

    def __init__(self, device: CapiDevice, io: Buffer):
        self.cuda = device._cuda
        self.ptr = device.device_pointer(io)
        self.pinned = self.cuda.pinned(io.elements)

    def put(self, items) -> None:
        for offset, array in items:
            view = self.pinned[offset:offset + array.size]
            view[...] = array
            self.cuda.copy_in(self.ptr + 4 * offset, view)

    def take(self, ranges, into=None) -> list:
        out = []
        for (offset, count), dest in zip(ranges, _destinations(ranges, into)):
            view = self.pinned[offset:offset + count]
            self.cuda.copy_out(view, self.ptr + 4 * offset)
            out.append(_deliver(view, dest))
        return out

    def close(self) -> None:
        self.cuda.free_pinned(self.pinned)
        self.pinned = None


class HostMemoryLink(HostLink):
    """x64: the io buffer is host memory the kernels run on; launches are synchronous there."""

    def __init__(self, device, io: Buffer):
        self.view = io.host.view(np.float32)

    def put(self, items) -> None:
        for offset, array in items:
            self.view[offset:offset + array.size] = array

    def take(self, ranges, into=None) -> list:
        return [_deliver(self.view[offset:offset + count], dest)
                for (offset, count), dest in zip(ranges, _destinations(ranges, into))]


class _CudaDriver:
    """The few CUDA driver calls CudaLink needs, on the primary context Taichi's runtime uses."""

    def __init__(self):
        try:
            self.cu = C.CDLL("libcuda.so.1")
        except OSError as e:
            raise capi.CapiError(f"CUDA's driver library is not loadable: {e}") from None
        self.ctx = C.c_void_p()
        dev = C.c_int()
        self._ok(self.cu.cuInit(0), "cuInit")
        self._ok(self.cu.cuDeviceGet(C.byref(dev), 0), "cuDeviceGet")
        self._ok(self.cu.cuDevicePrimaryCtxRetain(C.byref(self.ctx), dev), "cuDevicePrimaryCtxRetain")
        for name in ("cuMemcpyHtoD_v2", "cuMemcpyDtoH_v2"):
            getattr(self.cu, name).argtypes = [C.c_uint64, C.c_void_p, C.c_size_t] \
                if name.startswith("cuMemcpyHtoD") else [C.c_void_p, C.c_uint64, C.c_size_t]
        self.cu.cuCtxSetCurrent.argtypes = [C.c_void_p]
        self.cu.cuMemAllocHost_v2.argtypes = [C.POINTER(C.c_void_p), C.c_size_t]
        self.cu.cuMemFreeHost.argtypes = [C.c_void_p]
        self._pinned = {}

    def _ok(self, status: int, what: str) -> None:
        if status != 0:
            raise capi.CapiError(f"CUDA driver call {what} failed with status {status}")

    def pinned(self, elements: int) -> np.ndarray:
        self._ok(self.cu.cuCtxSetCurrent(self.ctx), "cuCtxSetCurrent")
        ptr = C.c_void_p()
        self._ok(self.cu.cuMemAllocHost_v2(C.byref(ptr), max(elements, 1) * 4), "cuMemAllocHost")
        array = np.ctypeslib.as_array((C.c_float * max(elements, 1)).from_address(ptr.value))
        self._pinned[id(array)] = ptr.value
        return array

    def free_pinned(self, array: np.ndarray) -> None:
        ptr = self._pinned.pop(id(array), None)
        if ptr is not None:
            self.cu.cuMemFreeHost(ptr)

    def copy_in(self, device_ptr: int, host: np.ndarray) -> None:
        self.cu.cuCtxSetCurrent(self.ctx)
        self._ok(self.cu.cuMemcpyHtoD_v2(device_ptr, host.ctypes.data, host.nbytes), "cuMemcpyHtoD")

    def copy_out(self, host: np.ndarray, device_ptr: int) -> None:
        self.cu.cuCtxSetCurrent(self.ctx)
        self._ok(self.cu.cuMemcpyDtoH_v2(host.ctypes.data, device_ptr, host.nbytes), "cuMemcpyDtoH")

    def to_device(self, device_ptr: int, data: np.ndarray) -> None:
        data = np.ascontiguousarray(data)
        self.cu.cuCtxSetCurrent(self.ctx)
        self._ok(self.cu.cuMemcpyHtoD_v2(device_ptr, data.ctypes.data, data.nbytes), "cuMemcpyHtoD")


# -- the Python device (fallback) --------------------------------------------------------------
class PythonDevice:
    """Taichi's Python runtime: the same interface, kernels launched from Python."""

    kind = "python"

    def __init__(self, backend: str):
        self.backend = backend
        self.affinity = ensure_python_taichi(backend)
        import taichi as ti
        self.ti = ti
        self._copy_kernels = None

    def allocate(self, elements: int, dtype: str = "f32", host_write: bool = False,
                 host_read: bool = False) -> Buffer:
        ti = self.ti
        with TAICHI_LOCK:
            handle = ti.ndarray(ti.f16 if dtype == "f16" else ti.f32, max(int(elements), 1))
        return Buffer(handle, elements, dtype)

    def free(self, buffer: Buffer) -> None:
        with TAICHI_LOCK:          # Taichi frees an ndarray when it is collected
            buffer.handle = None

    def fill(self, buffer: Buffer, array: np.ndarray) -> None:
        data = np.zeros(max(buffer.elements, 1), NUMPY[buffer.dtype])
        flat = np.asarray(array, dtype=NUMPY[buffer.dtype]).reshape(-1)
        data[:flat.size] = flat
        with TAICHI_LOCK:
            buffer.handle.from_numpy(data)

    def launcher(self, kernel, buffers) -> "PythonLaunch":
        return PythonLaunch(kernel, buffers)

    def wait(self) -> None:
        with TAICHI_LOCK:
            self.ti.sync()

    def flush(self) -> None:
        pass

    def destroy_module(self, module) -> None:
        pass

    def shared_module(self, key, path):
        raise NotImplementedError("the Python device runs no AOT modules")

    def link(self, io: Buffer) -> HostLink:
        return PythonLink(self, io)

    def copy_kernels(self):
        if self._copy_kernels is None:
            ti = self.ti
            f32 = ti.types.ndarray(dtype=ti.f32, ndim=1)

            @ti.kernel
            def put(io: f32, src: f32, offset: ti.i32):
                for i in src:
                    io[offset + i] = src[i]

            @ti.kernel
            def take(io: f32, dst: f32, offset: ti.i32):
                for i in dst:
                    dst[i] = io[offset + i]
            self._copy_kernels = (put, take)
        return self._copy_kernels


class PythonLaunch:
    __slots__ = ("kernel", "args")

    def __init__(self, kernel, buffers):
        self.kernel, self.args = kernel, [b.handle for b in buffers]

    def __call__(self) -> None:
        self.kernel(*self.args)


class PythonLink(HostLink):
    """The Python device: ranges copied by two small kernels with numpy arguments."""

    def __init__(self, device: PythonDevice, io: Buffer):
        self.device, self.io = device, io

    def put(self, items) -> None:
        put, _ = self.device.copy_kernels()
        with TAICHI_LOCK:
            for offset, array in items:
                put(self.io.handle, np.ascontiguousarray(array, np.float32), offset)

    def take(self, ranges, into=None) -> list:
        _, take = self.device.copy_kernels()
        out = []
        with TAICHI_LOCK:
            for (offset, count), dest in zip(ranges, _destinations(ranges, into)):
                a = np.empty(count, np.float32)
                take(self.io.handle, a, offset)
                out.append(a if dest is None else _deliver(a, dest))
        return out


# -- one device per backend per process (the registry is the session's: SESSION.devices) ----------
def runtime_kind() -> str:
    """'capi' (default) or 'python': TFLITE_TAICHI_RUNTIME picks one for A/B runs."""
    try:
        return switches.value("TFLITE_TAICHI_RUNTIME")
    except InputError as e:
        raise BackendUnavailable(str(e)) from None


def get(backend: str, env=None):
    """The process's device for `backend`: the C API's, else (with a warning, once) Taichi's
    Python runtime. `env`: a context manager around the runtime's start (driver caches)."""
    s = SESSION
    with s.devices_lock:
        device = s.devices.get(backend)
        if device is not None:
            return device
        kind = runtime_kind()
        if backend == "gles":
            # Taichi 1.7.4's C API creates no GLES runtime ("not supported"; it can only import
            # a GLES context made elsewhere): GLES kernels run through the Python runtime
            kind = "python"
        refused = s.capi_refused.pop(backend, None)
        if kind == "capi" and refused is None:
            try:
                device = _start_capi(backend, env)
            except capi.CapiError as e:
                refused = e
        if device is None:
            try:
                device = PythonDevice(backend)
            except BackendUnavailable as e:
                if refused is not None:    # neither runtime starts: the arch is not there
                    raise BackendUnavailable(f"{e} (and {refused})") from None
                raise
            if refused is not None and not s.warned_fallback:
                s.warned_fallback = True
                warnings.warn(f"tflite_taichi: {refused}; kernels run through Taichi's Python "
                              "runtime instead (each process compiles them again, and every "
                              "launch pays Python's overhead)", RuntimeWarning, stacklevel=3)
        s.devices[backend] = device
        return device


def get_capi(backend: str, env=None) -> "CapiDevice":
    """The process's C API device for `backend`, started here if need be (waiting for a start
    under way), or BackendUnavailable: a program built in a background thread
    (program_builder) runs on the C API or not at all, since Taichi's Python runtime belongs
    to the thread that started it. A refusal is kept for get(), as start_early keeps one."""
    s = SESSION
    with s.devices_lock:
        device = s.devices.get(backend)
        if device is None and backend not in s.capi_refused:
            try:
                device = s.devices[backend] = _start_capi(backend, env)
            except capi.CapiError as e:
                s.capi_refused[backend] = e
    if device is None or device.kind != "capi":
        why = s.capi_refused.get(backend) or "the process runs it through Taichi's Python runtime"
        raise BackendUnavailable(f"Taichi's C API did not start {backend} ({why})")
    return device


def start_early(backend: str, env=None) -> None:
    """Start `backend`'s C API runtime before get() asks for it: the Interpreter does so in a
    thread while it reads the model (creating the runtime took 0.2 s of a 0.5 s warm start on
    the 2-core machine, the model's read as long). Only what get() would make the same way:
    nothing for OpenGL/GLES (a GL context belongs to the thread that creates it) or the Python
    runtime (Taichi's LLVM archs insist on their starting thread); a refusal is kept for get(),
    which then falls back as it always did. The backend is not claimed here (backend.py)."""
    s = SESSION
    if backend in GL_BACKENDS or runtime_kind() != "capi" or s.taichi_build_problem is not None:
        return
    with s.devices_lock:            # get() waits here until the runtime is up
        if backend in s.devices or backend in s.capi_refused:
            return
        try:
            s.devices[backend] = _start_capi(backend, env)
        except capi.CapiError as e:
            s.capi_refused[backend] = e


def _start_capi(backend: str, env=None) -> CapiDevice:
    """A C API device (under SESSION.devices_lock). Where `auto` chose the backend at a glance,
    without its probe (SESSION.unprobed), this start is the probe: its outcome is recorded in
    the cache folder as probe() records one, so the next process's `auto` knows it."""
    glance = SESSION.unprobed.pop(backend, None)
    from tflite_taichi.runtime.cache import remember_probe
    try:
        device = CapiDevice(backend, env)
    except capi.CapiError as e:
        if glance is not None:
            remember_probe(glance[0], backend, (False, False, f"its device did not start: {e}"))
        raise
    if glance is not None:
        remember_probe(glance[0], backend, (True, False, glance[1]))
    return device


def current(backend: str) -> Optional[object]:
    return SESSION.devices.get(backend)


# -- Taichi's Python runtime ---------------------------------------------------------------------
def ensure_python_taichi(name: str, cache_root: Optional[str] = None):
    """Taichi's Python runtime started on `name` (once per process): it compiles kernels that
    are not in the cache, and runs them where the C API cannot (PythonDevice).

    Taichi's LLVM backends (cpu, cuda) build their struct module at the first kernel compile and
    assert that it happens in the thread that ran ti.init (measured, Taichi 1.7.4: "Assertion
    failure: std::this_thread::get_id() == main_thread_id_"), so it is materialized right here,
    in the starting thread. Taichi's own offline cache is off: compiled programs are cached as
    AOT modules (cache.py), and Taichi's cache would only grow a second copy in ~/.cache/taichi.
    Returns the runtime's ThreadAffinity (OpenGL/GLES: its context's thread).
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
