"""Vulkan without Taichi's submissions: the AOT module's SPIR-V run from command buffers of ours,
recorded once and submitted again at every invoke.

Why: on the H200, Taichi 1.7.4's `ti_flush` costs ~285 us however little it submits: each
submission allocates a command buffer, a semaphore and a fence (rhi/vulkan `VulkanStream::submit`),
and each `ti_launch_kernel` allocates an argument buffer and a descriptor set per task
(bench/results/launch_floor_h200.md). The driver's own cost for a submission and our
fence poll is ~10 us. So this module does what Taichi's gfx runtime does for a launch
(taichi/runtime/gfx/runtime.cpp, `GfxRuntime::launch_kernel`), once instead of every time:

- a module is read from its `.tcm` archive (metadata.json and one SPIR-V blob per task); each
  task becomes a compute pipeline of ours, with a descriptor set layout of the buffers it binds;
- a launch (kernel + the program's buffers) gets its argument buffer (each ndarray argument's
  shape, and its device address where the module uses physical storage buffers) and a
  descriptor set per task, written once;
- what the host enqueues between two waits (copies to and from the io buffer, launches) is a
  *segment*; the first time a segment is seen it is recorded into a command buffer, the same
  segment afterwards (every invoke of a program asks for the same one) is submitted as it is.
  Each dispatch is followed by the barrier Taichi puts after every dispatch
  (`VulkanCommandList::memory_barrier`), so the GPU runs exactly what Taichi would have run.

A module this path cannot run as Taichi would (a buffer kind other than arguments and ndarrays,
textures, return values, argument packs, more than one descriptor set) is left to Taichi's own
launches (device.py chooses per module). Memory is still Taichi's (`ti_allocate_memory`,
exported with `ti_export_vulkan_memory`); the queue is Taichi's compute queue. Every call must
hold TAICHI_LOCK.
"""
from __future__ import annotations

import ctypes as C
import io
import json
import struct
import zipfile
from collections import OrderedDict

from tflite_taichi.runtime import capi
from tflite_taichi.runtime.vulkan_host import _ok

# BufferType (taichi/codegen/spirv/kernel_utils.h): the two kinds a launch of ours binds
BUFFER_ARGS, BUFFER_EXT_ARR = 2, 5
TASK_SERIAL, TASK_RANGE_FOR = 0, 1    # OffloadedTaskType: the two a launch of ours dispatches

# Vulkan enums and structure types (vulkan_core.h)
S_SUBMIT_INFO, S_SHADER_MODULE, S_COMPUTE_PIPELINE, S_PIPELINE_LAYOUT = 4, 16, 29, 30
S_PIPELINE_SHADER_STAGE, S_SET_LAYOUT, S_DESCRIPTOR_POOL, S_SET_ALLOCATE = 18, 32, 33, 34
S_WRITE_SET, S_COMMAND_POOL, S_COMMAND_BUFFER_ALLOCATE, S_COMMAND_BUFFER_BEGIN = 35, 39, 40, 42
S_MEMORY_BARRIER, S_BUFFER_DEVICE_ADDRESS_INFO = 46, 1000244001
DESCRIPTOR_UNIFORM_BUFFER, DESCRIPTOR_STORAGE_BUFFER = 6, 7
STAGE_COMPUTE_SHADER_BIT = 0x20
BIND_POINT_COMPUTE = 1
PIPE_COMPUTE, PIPE_TRANSFER, PIPE_HOST, PIPE_ALL_COMMANDS = 0x800, 0x1000, 0x4000, 0x10000
ACCESS_SHADER_RW, ACCESS_TRANSFER_RW = 0x20 | 0x40, 0x800 | 0x1000
ACCESS_HOST_RW, ACCESS_MEMORY_RW = 0x2000 | 0x4000, 0x8000 | 0x10000
COMMAND_POOL_RESET_BUFFER = 0x2
WHOLE_SIZE = (1 << 64) - 1

SPIRV_MAGIC, OP_ENTRY_POINT, OP_DECORATE = 0x07230203, 15, 71
DECORATION_BINDING, DECORATION_DESCRIPTOR_SET = 33, 34

KEPT_SEGMENTS = 32            # recorded command buffers kept per device (least recently used out)

_U32, _U64, _P, _I32 = C.c_uint32, C.c_uint64, C.c_void_p, C.c_int32
_U64P = C.POINTER(_U64)
_FUNCTIONS = {
    "vkCreateShaderModule": (_I32, [_P, _P, _P, _U64P]),
    "vkDestroyShaderModule": (None, [_P, _U64, _P]),
    "vkCreateDescriptorSetLayout": (_I32, [_P, _P, _P, _U64P]),
    "vkDestroyDescriptorSetLayout": (None, [_P, _U64, _P]),
    "vkCreatePipelineLayout": (_I32, [_P, _P, _P, _U64P]),
    "vkDestroyPipelineLayout": (None, [_P, _U64, _P]),
    "vkCreateComputePipelines": (_I32, [_P, _U64, _U32, _P, _P, _U64P]),
    "vkDestroyPipeline": (None, [_P, _U64, _P]),
    "vkCreateDescriptorPool": (_I32, [_P, _P, _P, _U64P]),
    "vkDestroyDescriptorPool": (None, [_P, _U64, _P]),
    "vkAllocateDescriptorSets": (_I32, [_P, _P, _U64P]),
    "vkUpdateDescriptorSets": (None, [_P, _U32, _P, _U32, _P]),
    "vkCreateCommandPool": (_I32, [_P, _P, _P, _U64P]),
    "vkDestroyCommandPool": (None, [_P, _U64, _P]),
    "vkAllocateCommandBuffers": (_I32, [_P, _P, C.POINTER(_P)]),
    "vkFreeCommandBuffers": (None, [_P, _U64, _U32, C.POINTER(_P)]),
    "vkBeginCommandBuffer": (_I32, [_P, _P]),
    "vkEndCommandBuffer": (_I32, [_P]),
    "vkCmdBindPipeline": (None, [_P, _U32, _U64]),
    "vkCmdBindDescriptorSets": (None, [_P, _U32, _U64, _U32, _U32, _P, _U32, _P]),
    "vkCmdDispatch": (None, [_P, _U32, _U32, _U32]),
    "vkCmdPipelineBarrier": (None, [_P, _U32, _U32, _U32, _U32, _P, _U32, _P, _U32, _P]),
    "vkCmdCopyBuffer": (None, [_P, _U64, _U64, _U32, _P]),
    "vkQueueSubmit": (_I32, [_P, _U32, _P, _U64]),
}
_OPTIONAL = {"vkGetBufferDeviceAddress": (_U64, [_P, _P]),
             "vkGetBufferDeviceAddressKHR": (_U64, [_P, _P])}


# -- structures (64-bit layouts follow from ctypes' alignment, as in C) ------------------------
class _ShaderModuleInfo(C.Structure):
    _fields_ = [("sType", _U32), ("pNext", _P), ("flags", _U32), ("codeSize", C.c_size_t),
                ("pCode", _P)]


class _SetLayoutBinding(C.Structure):
    _fields_ = [("binding", _U32), ("descriptorType", _U32), ("descriptorCount", _U32),
                ("stageFlags", _U32), ("pImmutableSamplers", _P)]


class _SetLayoutInfo(C.Structure):
    _fields_ = [("sType", _U32), ("pNext", _P), ("flags", _U32), ("bindingCount", _U32),
                ("pBindings", _P)]


class _PipelineLayoutInfo(C.Structure):
    _fields_ = [("sType", _U32), ("pNext", _P), ("flags", _U32), ("setLayoutCount", _U32),
                ("pSetLayouts", _P), ("pushConstantRangeCount", _U32), ("pPushConstantRanges", _P)]


class _ShaderStageInfo(C.Structure):
    _fields_ = [("sType", _U32), ("pNext", _P), ("flags", _U32), ("stage", _U32),
                ("module", _U64), ("pName", C.c_char_p), ("pSpecializationInfo", _P)]


class _ComputePipelineInfo(C.Structure):
    _fields_ = [("sType", _U32), ("pNext", _P), ("flags", _U32), ("stage", _ShaderStageInfo),
                ("layout", _U64), ("basePipelineHandle", _U64), ("basePipelineIndex", _I32)]


class _PoolSize(C.Structure):
    _fields_ = [("type", _U32), ("descriptorCount", _U32)]


class _DescriptorPoolInfo(C.Structure):
    _fields_ = [("sType", _U32), ("pNext", _P), ("flags", _U32), ("maxSets", _U32),
                ("poolSizeCount", _U32), ("pPoolSizes", _P)]


class _SetAllocateInfo(C.Structure):
    _fields_ = [("sType", _U32), ("pNext", _P), ("descriptorPool", _U64),
                ("descriptorSetCount", _U32), ("pSetLayouts", _P)]


class _BufferInfo(C.Structure):
    _fields_ = [("buffer", _U64), ("offset", _U64), ("range", _U64)]


class _WriteSet(C.Structure):
    _fields_ = [("sType", _U32), ("pNext", _P), ("dstSet", _U64), ("dstBinding", _U32),
                ("dstArrayElement", _U32), ("descriptorCount", _U32), ("descriptorType", _U32),
                ("pImageInfo", _P), ("pBufferInfo", _P), ("pTexelBufferView", _P)]


class _CommandPoolInfo(C.Structure):
    _fields_ = [("sType", _U32), ("pNext", _P), ("flags", _U32), ("queueFamilyIndex", _U32)]


class _CommandBufferAllocateInfo(C.Structure):
    _fields_ = [("sType", _U32), ("pNext", _P), ("commandPool", _U64), ("level", _U32),
                ("commandBufferCount", _U32)]


class _CommandBufferBeginInfo(C.Structure):
    _fields_ = [("sType", _U32), ("pNext", _P), ("flags", _U32), ("pInheritanceInfo", _P)]


class _MemoryBarrier(C.Structure):
    _fields_ = [("sType", _U32), ("pNext", _P), ("srcAccessMask", _U32), ("dstAccessMask", _U32)]


class _BufferCopy(C.Structure):
    _fields_ = [("srcOffset", _U64), ("dstOffset", _U64), ("size", _U64)]


class _SubmitInfo(C.Structure):
    _fields_ = [("sType", _U32), ("pNext", _P), ("waitSemaphoreCount", _U32),
                ("pWaitSemaphores", _P), ("pWaitDstStageMask", _P), ("commandBufferCount", _U32),
                ("pCommandBuffers", _P), ("signalSemaphoreCount", _U32), ("pSignalSemaphores", _P)]


class _BufferAddressInfo(C.Structure):
    _fields_ = [("sType", _U32), ("pNext", _P), ("buffer", _U64)]


class NotReplayable(Exception):
    """The module uses something a launch of ours does not bind (the reason): Taichi runs it."""


# -- reading a module --------------------------------------------------------------------------
def read_module(data: bytes) -> tuple:
    """(metadata, {task name: SPIR-V bytes}) of a gfx `.tcm` archive."""
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        meta = json.loads(archive.read("metadata.json"))
        spirv = {n[:-4]: archive.read(n) for n in archive.namelist() if n.endswith(".spv")}
    return meta, spirv


def spirv_interface(code: bytes) -> tuple:
    """(entry point name, {binding: descriptor set}) declared by a SPIR-V module."""
    if len(code) < 20 or len(code) % 4:
        raise NotReplayable("a task's SPIR-V is not whole words")
    words = struct.unpack(f"<{len(code) // 4}I", code)
    if words[0] != SPIRV_MAGIC:
        raise NotReplayable("a task's SPIR-V has no SPIR-V magic number")
    entry, sets, bindings, at = None, {}, {}, 5
    while at < len(words):
        count, opcode = words[at] >> 16, words[at] & 0xFFFF
        if count == 0:
            raise NotReplayable("a task's SPIR-V has a zero-length instruction")
        operands = words[at + 1:at + count]
        if opcode == OP_ENTRY_POINT and entry is None:
            raw = struct.pack(f"<{len(operands) - 2}I", *operands[2:])
            entry = raw.split(b"\0", 1)[0].decode()
        elif opcode == OP_DECORATE and len(operands) >= 3:
            if operands[1] == DECORATION_DESCRIPTOR_SET:
                sets[operands[0]] = operands[2]
            elif operands[1] == DECORATION_BINDING:
                bindings[operands[0]] = operands[2]
        at += count
    if entry is None:
        raise NotReplayable("a task's SPIR-V has no entry point")
    return entry, {bindings[i]: sets.get(i, 0) for i in bindings}


class TaskPlan:
    """One task of a kernel: its SPIR-V, entry point, workgroups and what it binds where."""

    def __init__(self, attribs: dict, code: bytes):
        if attribs.get("texture_binds"):
            raise NotReplayable(f"task {attribs['name']} binds textures")
        self.name, self.code = attribs["name"], code
        self.entry, set_of = spirv_interface(code)
        per_group = attribs["advisory_num_threads_per_group"]
        self.groups = max(-(-attribs["advisory_total_num_threads"] // per_group), 1)
        self.binds = []                    # (binding, BUFFER_ARGS or the ndarray argument's index)
        for bind in attribs["buffer_binds"]:
            kind, root = bind["buffer"]["type"], bind["buffer"]["root_id"]
            if kind == BUFFER_ARGS:
                self.binds.append((bind["binding"], None))
            elif kind == BUFFER_EXT_ARR and len(root) == 1:
                self.binds.append((bind["binding"], root[0]))
            else:
                raise NotReplayable(f"task {self.name} binds a buffer of kind {kind}")
        if any(s != 0 for s in set_of.values()):
            raise NotReplayable(f"task {self.name} uses a descriptor set other than 0")


class KernelPlan:
    """A kernel of the module: its tasks, and where each ndarray argument's shape and device
    address go in its argument buffer (from the metadata's args type)."""

    def __init__(self, meta: dict, spirv: dict):
        self.name = meta["name"]
        ctx = meta["ctx_attribs"]
        if ctx.get("rets_bytes_") or ctx.get("ret_attribs_vec_"):
            raise NotReplayable(f"kernel {self.name} returns values")
        if ctx.get("argpack_types_"):
            raise NotReplayable(f"kernel {self.name} takes argument packs")
        self.args_bytes = int(ctx.get("args_bytes_", 0))
        self.arg_fields = {}               # argument index -> (shape offset, data_ptr offset)
        elements = {e["name"]: e for e in ctx["args_type_"]["content"]["elements_"]}
        for arg in ctx["arg_attribs_vec_"]:
            (index,), value = arg["key"], arg["value"]
            if not value.get("is_array") or value.get("is_argpack"):
                raise NotReplayable(f"kernel {self.name}: argument {index} is not an ndarray")
            element = elements[f"arg_{index}"]
            fields = {e["name"]: e["offset"] for e in element["type"]["content"]["elements_"]}
            self.arg_fields[index] = (element["offset"] + fields["shape"],
                                      element["offset"] + fields["data_ptr"])
        self.tasks = []
        for attribs in meta["tasks_attribs"]:
            if attribs.get("task_type") not in (TASK_SERIAL, TASK_RANGE_FOR):
                raise NotReplayable(f"task {attribs.get('name')} is of type {attribs.get('task_type')}")
            if attribs["name"] not in spirv:
                raise NotReplayable(f"task {attribs['name']} has no SPIR-V in the module")
            self.tasks.append(TaskPlan(attribs, spirv[attribs["name"]]))


class ModulePlan:
    """A gfx AOT module read for our own launches (NotReplayable where it cannot be)."""

    def __init__(self, data: bytes):
        try:
            meta, spirv = read_module(data)
        except (zipfile.BadZipFile, KeyError, ValueError) as e:
            raise NotReplayable(f"the module does not read as a gfx AOT archive ({e})") from None
        if meta.get("fields") or meta.get("root_buffer_size"):
            raise NotReplayable("the module has fields (a root buffer)")
        caps = {c.get("key"): c.get("value") for c in meta.get("required_caps") or []
                if isinstance(c, dict)}
        # ndarrays reached through 64-bit device addresses in the arguments, not descriptors
        self.physical_pointers = bool(caps.get("spirv_has_physical_storage_buffer"))
        try:
            self.kernels = {k["name"]: KernelPlan(k, spirv) for k in meta["kernels"]}
        except (KeyError, TypeError, IndexError, ValueError) as e:
            raise NotReplayable(f"the module's metadata is not what Taichi 1.7 writes ({e!r})") \
                from None


# -- Vulkan objects ----------------------------------------------------------------------------
class Vulkan:
    """The device functions this module calls, through the host's (vulkan_host.VulkanHost) view
    of Taichi's exported Vulkan runtime."""

    def __init__(self, lib, runtime, host):
        self.lib, self.runtime = lib, runtime
        self.device, self.queue, self.family = host.device, host.queue, host.queue_family
        self.fn = {name: host.function(name, res, args) for name, (res, args) in _FUNCTIONS.items()}
        self.address_of = next((host.function(name, res, args) for name, (res, args)
                                in _OPTIONAL.items() if host.has_function(name)), None)

    def create(self, what: str, info, *leading) -> int:
        handle = _U64(0)
        _ok(self.fn[what](self.device, *leading, C.byref(info), None, C.byref(handle)), what)
        return handle.value

    def buffer(self, memory) -> capi.VulkanMemoryInterop:
        """The VkBuffer behind a Taichi allocation."""
        info = capi.VulkanMemoryInterop()
        self.lib.ti_export_vulkan_memory(self.runtime, memory, C.byref(info))
        capi.check(self.lib, "export_vulkan_memory")
        if not info.buffer:
            raise capi.CapiError("Taichi exported no VkBuffer for a memory allocation")
        return info

    def device_address(self, buffer: int) -> int:
        if self.address_of is None:
            raise capi.CapiError("the Vulkan driver has no vkGetBufferDeviceAddress")
        return self.address_of(self.device, C.byref(_BufferAddressInfo(
            S_BUFFER_DEVICE_ADDRESS_INFO, None, buffer)))


class Pipeline:
    """A task's compute pipeline with its layouts."""

    def __init__(self, vk: Vulkan, task: TaskPlan):
        self.vk, self.task = vk, task
        self.shader = self.set_layout = self.layout = self.pipeline = 0
        try:
            code = C.create_string_buffer(task.code, len(task.code))
            self.shader = vk.create("vkCreateShaderModule", _ShaderModuleInfo(
                S_SHADER_MODULE, None, 0, len(task.code), C.cast(code, _P)))
            bindings = (_SetLayoutBinding * max(len(task.binds), 1))(*[
                _SetLayoutBinding(b, DESCRIPTOR_UNIFORM_BUFFER if arg is None
                                  else DESCRIPTOR_STORAGE_BUFFER, 1, STAGE_COMPUTE_SHADER_BIT, None)
                for b, arg in task.binds])
            self.set_layout = vk.create("vkCreateDescriptorSetLayout", _SetLayoutInfo(
                S_SET_LAYOUT, None, 0, len(task.binds), C.cast(bindings, _P)))
            set_layouts = (_U64 * 1)(self.set_layout)
            self.layout = vk.create("vkCreatePipelineLayout", _PipelineLayoutInfo(
                S_PIPELINE_LAYOUT, None, 0, 1, C.cast(set_layouts, _P), 0, None))
            stage = _ShaderStageInfo(S_PIPELINE_SHADER_STAGE, None, 0, STAGE_COMPUTE_SHADER_BIT,
                                     self.shader, task.entry.encode(), None)
            self.pipeline = vk.create("vkCreateComputePipelines", _ComputePipelineInfo(
                S_COMPUTE_PIPELINE, None, 0, stage, self.layout, 0, -1), 0, 1)
        except BaseException:
            self.destroy()
            raise

    def destroy(self) -> None:
        fn, device = self.vk.fn, self.vk.device
        for handle, destroy in ((self.pipeline, "vkDestroyPipeline"),
                                (self.layout, "vkDestroyPipelineLayout"),
                                (self.set_layout, "vkDestroyDescriptorSetLayout"),
                                (self.shader, "vkDestroyShaderModule")):
            if handle:
                fn[destroy](device, handle, None)
        self.shader = self.set_layout = self.layout = self.pipeline = 0


class Module:
    """A module of ours: its plan and, per kernel asked for, the tasks' pipelines. `data`: the
    archive, for Taichi to load instead where the driver refuses a pipeline of ours
    (`taichi`: that module, once loaded)."""

    def __init__(self, vk: Vulkan, plan: ModulePlan, data: bytes):
        self.vk, self.plan, self.data, self._kernels = vk, plan, data, {}
        self.taichi = None

    def kernel(self, name: str) -> "Kernel":
        kernel = self._kernels.get(name)
        if kernel is None:
            if name not in self.plan.kernels:
                raise capi.CapiError(f"kernel {name} is not in the AOT module")
            kernel = self._kernels[name] = Kernel(self, self.plan.kernels[name])
        return kernel

    def destroy(self) -> None:
        for kernel in self._kernels.values():
            kernel.destroy()
        self._kernels.clear()


class Kernel:
    def __init__(self, module: Module, plan: KernelPlan):
        self.module, self.plan, self.pipelines = module, plan, []
        try:
            for task in plan.tasks:
                self.pipelines.append(Pipeline(module.vk, task))
        except BaseException:
            self.destroy()
            raise

    def destroy(self) -> None:
        while self.pipelines:
            self.pipelines.pop().destroy()


class Launch:
    """A kernel bound to its buffers: the argument buffer and one descriptor set per task,
    written once. Calling it adds the launch to the submitter's segment."""

    def __init__(self, submitter: "Submitter", kernel: Kernel, buffers):
        self.submitter, self.kernel = submitter, kernel
        plan = kernel.plan
        self.buffers = list(buffers)
        self.handles = frozenset(b.handle for b in self.buffers)
        self.pool, self.args = 0, None
        submitter.launches.add(self)
        try:
            self._write_arguments(plan)
            self._write_sets()
        except BaseException:
            self.destroy()
            raise

    def _write_arguments(self, plan: KernelPlan) -> None:
        raw = bytearray(max(plan.args_bytes, 4))
        physical = self.kernel.module.plan.physical_pointers
        for index, (shape_at, pointer_at) in plan.arg_fields.items():
            buffer = self.buffers[index]
            struct.pack_into("<i", raw, shape_at, buffer.elements)
            if physical:
                address = self.submitter.vk.device_address(self.submitter.vk_buffer(buffer).buffer)
                struct.pack_into("<Q", raw, pointer_at, address)
        self.args = self.submitter.uniform(bytes(raw))

    def _write_sets(self) -> None:
        vk, pipelines = self.submitter.vk, self.kernel.pipelines
        storage = sum(1 for p in pipelines for _, a in p.task.binds if a is not None)
        uniform = sum(1 for p in pipelines for _, a in p.task.binds if a is None)
        sizes = (_PoolSize * 2)(_PoolSize(DESCRIPTOR_STORAGE_BUFFER, max(storage, 1)),
                                _PoolSize(DESCRIPTOR_UNIFORM_BUFFER, max(uniform, 1)))
        self.pool = vk.create("vkCreateDescriptorPool", _DescriptorPoolInfo(
            S_DESCRIPTOR_POOL, None, 0, max(len(pipelines), 1), 2, C.cast(sizes, _P)))
        n = len(pipelines)
        layouts = (_U64 * max(n, 1))(*[p.set_layout for p in pipelines])
        self.sets = (_U64 * max(n, 1))()
        if n:
            _ok(vk.fn["vkAllocateDescriptorSets"](vk.device, C.byref(_SetAllocateInfo(
                S_SET_ALLOCATE, None, self.pool, n, C.cast(layouts, _P))), self.sets),
                "vkAllocateDescriptorSets")
        infos, writes = [], []
        for i, p in enumerate(pipelines):
            for binding, arg in p.task.binds:
                if arg is None:
                    info = _BufferInfo(self.args.buffer, 0, WHOLE_SIZE)
                    kind = DESCRIPTOR_UNIFORM_BUFFER
                else:
                    info = _BufferInfo(self.submitter.vk_buffer(self.buffers[arg]).buffer, 0,
                                       WHOLE_SIZE)
                    kind = DESCRIPTOR_STORAGE_BUFFER
                infos.append(info)
                writes.append((self.sets[i], binding, kind))
        if writes:
            info_array = (_BufferInfo * len(infos))(*infos)
            write_array = (_WriteSet * len(writes))(*[
                _WriteSet(S_WRITE_SET, None, s, b, 0, 1, k, None,
                          C.cast(C.byref(info_array, j * C.sizeof(_BufferInfo)), _P), None)
                for j, (s, b, k) in enumerate(writes)])
            vk.fn["vkUpdateDescriptorSets"](vk.device, len(writes), write_array, 0, None)

    def record(self, cb, fn) -> None:
        if self.args is None:
            raise capi.CapiError(f"kernel {self.kernel.plan.name} launched after its buffers "
                                 "were freed")
        for i, p in enumerate(self.kernel.pipelines):
            fn["vkCmdBindPipeline"](cb, BIND_POINT_COMPUTE, p.pipeline)
            fn["vkCmdBindDescriptorSets"](cb, BIND_POINT_COMPUTE, p.layout, 0, 1,
                                          C.addressof(self.sets) + i * 8, 0, None)
            fn["vkCmdDispatch"](cb, p.task.groups, 1, 1)
            _barrier(cb, fn)

    def __call__(self) -> None:
        self.submitter.add(self)

    def destroy(self) -> None:
        self.submitter.launches.discard(self)
        if self.pool:
            self.submitter.vk.fn["vkDestroyDescriptorPool"](self.submitter.vk.device, self.pool, None)
            self.pool = 0
        if self.args is not None:
            self.submitter.release_uniform(self.args)
            self.args = None


_BETWEEN = _MemoryBarrier(S_MEMORY_BARRIER, None, ACCESS_SHADER_RW | ACCESS_TRANSFER_RW,
                          ACCESS_SHADER_RW | ACCESS_TRANSFER_RW)
_EDGE = _MemoryBarrier(S_MEMORY_BARRIER, None, ACCESS_MEMORY_RW | ACCESS_SHADER_RW | ACCESS_TRANSFER_RW
                       | ACCESS_HOST_RW, ACCESS_MEMORY_RW | ACCESS_SHADER_RW | ACCESS_TRANSFER_RW
                       | ACCESS_HOST_RW)


def _barrier(cb, fn) -> None:
    """Taichi's barrier after every dispatch and copy (VulkanCommandList::memory_barrier)."""
    stages = PIPE_TRANSFER | PIPE_COMPUTE
    fn["vkCmdPipelineBarrier"](cb, stages, stages, 0, 1, C.byref(_BETWEEN), 0, None, 0, None)


def _edge_barrier(cb, fn) -> None:
    """At a command buffer's ends: everything before it (Taichi's submissions, the host's writes
    to mapped memory) is done and visible, and the host sees what it wrote."""
    stages = PIPE_ALL_COMMANDS | PIPE_HOST
    fn["vkCmdPipelineBarrier"](cb, stages, stages, 0, 1, C.byref(_EDGE), 0, None, 0, None)


class Uniform:
    """A host-written uniform buffer of Taichi's, with its VkBuffer."""

    def __init__(self, memory, buffer: int):
        self.memory, self.buffer = memory, buffer


class Recording:
    """A segment's command buffer, the Taichi allocations it uses, and its submit info (made
    once: a resubmission builds nothing)."""

    def __init__(self, cb, handles: frozenset):
        self.cb, self.handles = cb, handles
        self._cbs = (_P * 1)(cb)
        self.submit_info = _SubmitInfo(S_SUBMIT_INFO, None, 0, None, None, 1,
                                       C.cast(self._cbs, _P), 0, None)


class Submitter:
    """Segments of commands between two waits, recorded once into command buffers of ours and
    submitted again when the same segment comes back; one fence the host waits on."""

    def __init__(self, lib, runtime, host):
        self.lib, self.runtime, self.host = lib, runtime, host      # host: vulkan_host.VulkanHost
        self.vk = Vulkan(lib, runtime, host)
        self.pool = self.vk.create("vkCreateCommandPool", _CommandPoolInfo(
            S_COMMAND_POOL, None, COMMAND_POOL_RESET_BUFFER, self.vk.family))
        self._segment = []              # what was asked since the last submission
        self._recorded = OrderedDict()  # segment key -> Recording
        self._exported = {}             # Taichi memory handle -> capi.VulkanMemoryInterop
        self.launches = set()           # every live Launch (destroyed with its buffers)
        self.taichi_pending = False     # Taichi's command list may hold launches of its own
        self.recordings = self.submissions = 0      # counted for tests and summaries

    # memory
    def vk_buffer(self, buffer) -> capi.VulkanMemoryInterop:
        info = self._exported.get(buffer.handle)
        if info is None:
            info = self._exported[buffer.handle] = self.vk.buffer(buffer.handle)
        return info

    def uniform(self, data: bytes) -> Uniform:
        info = capi.MemoryAllocateInfo(len(data), 1, 0, 0, capi.MEMORY_USAGE_UNIFORM)
        memory = self.lib.ti_allocate_memory(self.runtime, C.byref(info))
        capi.check(self.lib, "allocate_memory (a launch's arguments)")
        try:
            ptr = self.lib.ti_map_memory(self.runtime, memory)
            capi.check(self.lib, "map_memory")
            C.memmove(ptr, data, len(data))
            self.lib.ti_unmap_memory(self.runtime, memory)
            return Uniform(memory, self.vk.buffer(memory).buffer)
        except BaseException:
            self.lib.ti_free_memory(self.runtime, memory)
            raise

    def release_uniform(self, uniform: Uniform) -> None:
        self.forget(uniform.memory)
        self.lib.ti_free_memory(self.runtime, uniform.memory)

    def forget(self, handle) -> None:
        """A buffer is about to be freed (the queue is idle): no recorded segment or launch may
        use it again."""
        self._exported.pop(handle, None)
        for launch in [launch for launch in self.launches if handle in launch.handles]:
            launch.destroy()
        stale = [key for key, rec in self._recorded.items() if handle in rec.handles]
        for key in stale:
            self._free(self._recorded.pop(key).cb)

    # the segment
    def add(self, launch: Launch) -> None:
        self._segment.append(launch)

    def copy(self, dst, dst_offset: int, src, src_offset: int, nbytes: int) -> None:
        """A copy of `nbytes` between two Taichi allocations (byte offsets)."""
        self._segment.append((self.vk_buffer(src).buffer, self.vk_buffer(dst).buffer,
                              src_offset, dst_offset, nbytes, src.handle, dst.handle))

    @property
    def pending(self) -> bool:
        return bool(self._segment)

    def submit(self, fence: int = 0) -> None:
        """Submit the segment asked since the last submission (recorded the first time it is
        seen), signalling `fence` when it is done. Taichi's pending launches go first."""
        if self.taichi_pending:
            self.lib.ti_flush(self.runtime)
            capi.check(self.lib, "flush")
            self.taichi_pending = False
        if not self._segment:
            if fence:
                _ok(self.vk.fn["vkQueueSubmit"](self.vk.queue, 0, None, fence), "vkQueueSubmit")
            return
        key = tuple(item if isinstance(item, tuple) else id(item) for item in self._segment)
        found = self._recorded.get(key)
        if found is None:
            found = self._record(self._segment)
            self._recorded[key] = found
            self.recordings += 1
        else:
            self._recorded.move_to_end(key)
        self._segment = []
        _ok(self.vk.fn["vkQueueSubmit"](self.vk.queue, 1, C.byref(found.submit_info), fence),
            "vkQueueSubmit")
        self.submissions += 1

    def _record(self, segment) -> tuple:
        fn = self.vk.fn
        cb = (_P * 1)()
        _ok(fn["vkAllocateCommandBuffers"](self.vk.device, C.byref(_CommandBufferAllocateInfo(
            S_COMMAND_BUFFER_ALLOCATE, None, self.pool, 0, 1)), cb), "vkAllocateCommandBuffers")
        handle, handles = cb[0], set()
        try:
            _ok(fn["vkBeginCommandBuffer"](handle, C.byref(_CommandBufferBeginInfo(
                S_COMMAND_BUFFER_BEGIN, None, 0, None))), "vkBeginCommandBuffer")
            _edge_barrier(handle, fn)
            for item in segment:
                if isinstance(item, tuple):
                    src, dst, src_offset, dst_offset, nbytes, src_handle, dst_handle = item
                    fn["vkCmdCopyBuffer"](handle, src, dst, 1,
                                          C.byref(_BufferCopy(src_offset, dst_offset, nbytes)))
                    _barrier(handle, fn)
                    handles.update((src_handle, dst_handle))
                else:
                    item.record(handle, fn)
                    handles.update(item.handles)
                    handles.add(item.args.memory)
            _edge_barrier(handle, fn)
            _ok(fn["vkEndCommandBuffer"](handle), "vkEndCommandBuffer")
        except BaseException:
            self._free(handle)
            raise
        return Recording(handle, frozenset(handles))

    def wait(self) -> None:
        """Submit what is pending and return once the queue has done everything submitted (the
        segment's own submission signals the host's fence)."""
        self.host.wait(self.submit)
        while len(self._recorded) > KEPT_SEGMENTS:       # the queue is idle: safe to free
            self._free(self._recorded.popitem(last=False)[1].cb)

    def _free(self, cb) -> None:
        self.vk.fn["vkFreeCommandBuffers"](self.vk.device, self.pool, 1, C.byref(_P(cb)))

    def close(self) -> None:
        for launch in list(self.launches):
            launch.destroy()
        for recording in self._recorded.values():
            self._free(recording.cb)
        self._recorded.clear()
        if self.pool:
            self.vk.fn["vkDestroyCommandPool"](self.vk.device, self.pool, None)
            self.pool = 0
