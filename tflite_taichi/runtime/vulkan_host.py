"""The host's side of a Taichi Vulkan runtime: which device it is, a cheaper wait, and the
NVIDIA clock boost. Measured on the H200 (bench/results/vulkan_host_h200.md):

- **The wait.** `ti_wait` costs ~290 us more than it must: an empty invoke took 652 us through
  it and 363 us here (cuda: 84 us). Taichi's wait is `vkQueueWaitIdle`, a blocking wait that pays
  the driver's wake-up. Here the host submits an empty batch with a fence of its own to the queue
  Taichi uses (the fence of an empty `vkQueueSubmit` signals once all work submitted before it is
  done: the Vulkan spec's fence signal operation covers every earlier submission on that queue)
  and polls the fence, as CUDA's default synchronisation spins. The host gets the same guarantee
  as from Taichi's own wait, a queue wait-idle. Taichi keeps each flushed command buffer until
  its next `ti_wait`, so the device still calls it every `FULL_WAIT_EVERY` waits, when the queue
  is already idle. Polling holds a core; on a CPU Vulkan device (lavapipe) that core is the
  driver's, so there the host blocks in `vkWaitForFences`.
- **The clocks.** NVIDIA's driver raises a GPU's clocks for CUDA applications (its
  `CUDA_DISABLE_PERF_BOOST=1` turns that off), not for Vulkan ones: with only our Vulkan work
  the H200's SM clock fell to 345 MHz within seconds and a chain of ten 1x1 convs went from 1.19
  to 2.5 ms per invoke; with a CUDA context held in the process (no kernel) it stayed at 1980 MHz
  and 1.07 ms. So on an NVIDIA device the Vulkan backend holds the CUDA primary context of the
  same GPU (matched by UUID), created in a background thread so start-up does not wait for it.
  TFLITE_TAICHI_VULKAN_BOOST=0 turns this off (so does CUDA_DISABLE_PERF_BOOST=1, in the driver).
"""
from __future__ import annotations

import ctypes as C
import sys
import threading
import time
from typing import Optional

from tflite_taichi import switches
from tflite_taichi.runtime import capi

FULL_WAIT_EVERY = 64         # fence waits between Taichi's own (which frees its command buffers)
SPIN_S = 0.005               # poll this long, then block (a longer invoke pays the wake-up once)
BLOCK_SLICE_NS = 100_000_000

VK_SUCCESS, VK_NOT_READY, VK_TIMEOUT, VK_ERROR_DEVICE_LOST = 0, 1, 2, -4
STRUCTURE_FENCE_CREATE_INFO = 8
STRUCTURE_PHYSICAL_DEVICE_PROPERTIES_2 = 1000059001
STRUCTURE_PHYSICAL_DEVICE_ID_PROPERTIES = 1000071004
DEVICE_TYPES = {0: "other", 1: "integrated GPU", 2: "discrete GPU", 3: "virtual GPU", 4: "CPU"}
DEVICE_TYPE_CPU = 4
VENDOR_NVIDIA = 0x10DE

_PFN_GET_PROC = C.CFUNCTYPE(C.c_void_p, C.c_void_p, C.c_char_p)
_U32, _U64, _P, _I32 = C.c_uint32, C.c_uint64, C.c_void_p, C.c_int32
_DEVICE_FUNCTIONS = {
    "vkCreateFence": (_I32, [_P, _P, _P, C.POINTER(_U64)]),
    "vkDestroyFence": (None, [_P, _U64, _P]),
    "vkQueueSubmit": (_I32, [_P, _U32, _P, _U64]),
    "vkGetFenceStatus": (_I32, [_P, _U64]),
    "vkWaitForFences": (_I32, [_P, _U32, C.POINTER(_U64), _U32, _U64]),
    "vkResetFences": (_I32, [_P, _U32, C.POINTER(_U64)]),
}


class _FenceCreateInfo(C.Structure):
    _fields_ = [("sType", C.c_uint32), ("pNext", C.c_void_p), ("flags", C.c_uint32)]


class _IdProperties(C.Structure):          # VkPhysicalDeviceIDProperties
    _fields_ = [("sType", C.c_uint32), ("pNext", C.c_void_p), ("deviceUUID", C.c_uint8 * 16),
                ("driverUUID", C.c_uint8 * 16), ("deviceLUID", C.c_uint8 * 8),
                ("deviceNodeMask", C.c_uint32), ("deviceLUIDValid", C.c_uint32)]


class _Properties2(C.Structure):           # VkPhysicalDeviceProperties2, properties kept raw
    _fields_ = [("sType", C.c_uint32), ("pNext", C.c_void_p), ("properties", C.c_uint8 * 4096)]


class DeviceInfo:
    """The physical device behind the runtime (vkGetPhysicalDeviceProperties2: the first fields
    of its properties are five uint32s, then the name; the UUID from its ID properties)."""

    def __init__(self, name: str, device_type: int, vendor_id: int, uuid: Optional[bytes]):
        self.name, self.device_type, self.vendor_id, self.uuid = name, device_type, vendor_id, uuid

    @property
    def is_cpu(self) -> bool:
        return self.device_type == DEVICE_TYPE_CPU

    def __repr__(self):
        return f"{self.name} ({DEVICE_TYPES.get(self.device_type, self.device_type)})"


class VulkanHost:
    """Taichi Vulkan runtime's device and compute queue, with one fence the host polls. Every
    call must hold TAICHI_LOCK (the queue is shared with Taichi's own submissions)."""

    def __init__(self, lib, runtime):
        interop = capi.VulkanRuntimeInterop()
        lib.ti_export_vulkan_runtime(runtime, C.byref(interop))
        capi.check(lib, "export_vulkan_runtime")
        if not (interop.get_instance_proc_addr and interop.device and interop.compute_queue):
            raise capi.CapiError("Taichi's Vulkan runtime exported no device or compute queue")
        self.device, self.queue = interop.device, interop.compute_queue
        self.queue_family = interop.compute_queue_family_index
        get_instance_proc = _PFN_GET_PROC(interop.get_instance_proc_addr)
        self.info = _device_info(get_instance_proc, interop.instance, interop.physical_device)
        # kept for vulkan_submit.py's functions
        self.get_device_proc = _function(get_instance_proc, interop.instance,
                                         "vkGetDeviceProcAddr", _PFN_GET_PROC)
        self.vk = {name: self.function(name, res, args)
                   for name, (res, args) in _DEVICE_FUNCTIONS.items()}
        self.fence = C.c_uint64(0)
        create = _FenceCreateInfo(STRUCTURE_FENCE_CREATE_INFO, None, 0)
        _ok(self.vk["vkCreateFence"](self.device, C.byref(create), None, C.byref(self.fence)),
            "vkCreateFence")
        self.spin_s = 0.0 if self.info.is_cpu else SPIN_S

    def function(self, name: str, restype, argtypes):
        """The device function `name` (CapiError where the driver has none)."""
        return _function(self.get_device_proc, self.device, name, C.CFUNCTYPE(restype, *argtypes))

    def has_function(self, name: str) -> bool:
        return bool(self.get_device_proc(self.device, name.encode()))

    def wait(self, submit=None) -> None:
        """Return once everything submitted to the queue so far has finished. `submit(fence)`
        makes the last submission, signalling the fence (default: an empty one)."""
        vk, device, fence = self.vk, self.device, self.fence
        if submit is None:
            _ok(vk["vkQueueSubmit"](self.queue, 0, None, fence.value), "vkQueueSubmit")
        else:
            submit(fence.value)
        try:
            deadline = time.perf_counter() + self.spin_s
            status = vk["vkGetFenceStatus"](device, fence.value)
            while status == VK_NOT_READY and time.perf_counter() < deadline:
                status = vk["vkGetFenceStatus"](device, fence.value)
            while status in (VK_NOT_READY, VK_TIMEOUT):
                status = vk["vkWaitForFences"](device, 1, C.byref(fence), 1, BLOCK_SLICE_NS)
            _ok(status, "waiting for the device (vkGetFenceStatus/vkWaitForFences)")
        finally:
            vk["vkResetFences"](device, 1, C.byref(fence))


def _ok(result: int, what: str) -> None:
    if result != VK_SUCCESS:
        raise capi.CapiError(f"Vulkan {what} failed with VkResult {result}"
                             + (" (device lost)" if result == VK_ERROR_DEVICE_LOST else ""), result)


def _function(get_proc, handle, name: str, prototype):
    address = get_proc(handle, name.encode())
    if not address:
        raise capi.CapiError(f"the Vulkan driver has no {name}")
    return prototype(address)


def _device_info(get_instance_proc, instance, physical_device) -> DeviceInfo:
    ids = _IdProperties(STRUCTURE_PHYSICAL_DEVICE_ID_PROPERTIES, None)
    props = _Properties2(STRUCTURE_PHYSICAL_DEVICE_PROPERTIES_2, C.cast(C.pointer(ids), C.c_void_p))
    uuid = None
    try:                         # core in Vulkan 1.1 (Taichi asks for 1.3 where the driver has it)
        get_properties2 = _function(get_instance_proc, instance, "vkGetPhysicalDeviceProperties2",
                                    C.CFUNCTYPE(None, _P, _P))
        get_properties2(physical_device, C.byref(props))
        raw, uuid = bytes(props.properties), bytes(ids.deviceUUID)
    except capi.CapiError:
        plain = _function(get_instance_proc, instance, "vkGetPhysicalDeviceProperties",
                          C.CFUNCTYPE(None, _P, _P))
        buffer = (C.c_uint8 * 4096)()
        plain(physical_device, buffer)
        raw = bytes(buffer)
    field = lambda at: int.from_bytes(raw[at:at + 4], sys.byteorder)   # noqa: E731
    name = raw[20:20 + 256].split(b"\0", 1)[0].decode(errors="replace")
    return DeviceInfo(name, field(16), field(8), uuid)


# -- the clock boost ---------------------------------------------------------------------------
class CudaBoost:
    """Holds the CUDA primary context of the GPU with `uuid` for the process's lifetime (that
    raises the GPU's clocks), created in a background thread. `state` says where it stands."""

    def __init__(self, uuid: bytes):
        self.state = "starting"
        self._context = C.c_void_p()
        self._thread = threading.Thread(target=self._hold, args=(uuid,), daemon=True,
                                        name="tflite_taichi-cuda-boost")
        self._thread.start()

    def _hold(self, uuid: bytes) -> None:
        try:
            cu = C.CDLL("libcuda.so.1" if sys.platform != "win32" else "nvcuda.dll")
            if cu.cuInit(0) != 0:
                self.state = "off: cuInit failed"
                return
            count = C.c_int(0)
            cu.cuDeviceGetCount(C.byref(count))
            for ordinal in range(count.value):
                device, got = C.c_int(), (C.c_uint8 * 16)()
                if cu.cuDeviceGet(C.byref(device), ordinal) != 0 or cu.cuDeviceGetUuid(got, device) != 0:
                    continue
                if bytes(got) == uuid:
                    if cu.cuDevicePrimaryCtxRetain(C.byref(self._context), device) != 0:
                        self.state = "off: cuDevicePrimaryCtxRetain failed"
                        return
                    self.state = f"on: CUDA context held on device {ordinal}"
                    return
            self.state = "off: no CUDA device has the Vulkan device's UUID"
        except (OSError, AttributeError) as e:
            self.state = f"off: CUDA's driver library is not loadable ({e})"

    def join(self, timeout: Optional[float] = None) -> str:
        self._thread.join(timeout)
        return self.state


def boost_for(info: DeviceInfo):
    """A CudaBoost for an NVIDIA Vulkan device, else None, and why (for summary())."""
    if not switches.value("TFLITE_TAICHI_VULKAN_BOOST"):
        return None, "off: TFLITE_TAICHI_VULKAN_BOOST=0"
    if info.vendor_id != VENDOR_NVIDIA or info.uuid is None:
        return None, "off: not an NVIDIA device"
    return CudaBoost(info.uuid), None
