"""Generated Taichi kernels: one per partition (or per bounded chunk of it).

Each delegated op becomes a step object from its OpDef's `taichi` factory: plain Python
holding static offsets and shapes, with a `ti.func run(arena, weights, io)` whose top-level
loop is the op. A kernel is `for step in ti.static(steps): step.run(...)`: Taichi runs each
top-level loop as its own parallel task, in order, so the partition keeps TFLite's sequential
semantics for the price of one launch (DESIGN.md, "Speed").

Kernels take four typed 1-D ndarrays, `(arena, weights, io, scratch)`, so that Taichi can
archive them as an AOT module (cache.py) that later processes load through the C API without
running Taichi's frontend (device.py); the steps see `io` as the triple (io, io, scratch) of
tiutil (a partition's inputs and outputs are both in the program's io buffer).

Chunking policy, per backend (DESIGN.md's measurements on an H200: a fused chain of 30 ops
ran faster than 30 launches on CUDA and Vulkan, slower on OpenGL, and compile time grows with
kernel size): CUDA, Vulkan, Metal and CPU fuse up to CHUNK_STEPS ops per kernel; OpenGL/GLES
launch one kernel per op.

This module is the only part of the delegate that needs Taichi's Python frontend: a program
whose AOT module is in the cache plans its partitions (`plan`) but never builds kernels.
"""
from dataclasses import dataclass, field

import numpy as np

from tflite_taichi.graph import PreparedGraph
from tflite_taichi.ops.tiutil import ResidualAddRef, StepIO, realize, ti
from tflite_taichi.partition import Partition
from tflite_taichi.planner import Plan, plan_partition

CHUNK_STEPS = {"cuda": 32, "vulkan": 32, "metal": 32, "cpu": 32, "opengl": 1, "gles": 1}

# Taichi indexes ndarrays with 32-bit integers: a buffer of more elements would be addressed
# wrongly, so a partition needing one is refused (a ModelError; after resize_tensor_input the
# interpreter reports the resize and keeps its previous shapes)
MAX_BUFFER_ELEMENTS = 2**31 - 1


def chunk_ranges(n_steps: int, backend: str) -> list:
    size = CHUNK_STEPS.get(backend, 32)
    return [(i, min(i + size, n_steps)) for i in range(0, n_steps, size)] or [(0, 0)]


# Producers whose Taichi step stores each output element exactly once, with its final value:
# an ADD reading only their output can be fused into that store (ResidualAddRef).
EPILOGUE_PRODUCERS = frozenset({"CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED", "TRANSPOSE_CONV",
                                "CUSTOM:Convolution2DTransposeBias"})


def _is_float(spec) -> bool:
    return spec.dtype is not None and np.dtype(spec.dtype).kind == "f" and spec.quantization is None


def residual_fusions(partition: Partition) -> dict:
    """{position of a producer: position of the ADD fused into it}: the ADD right after it reads
    its output and a residual of the same shape, nothing else reads that output (and it is not a
    partition output), all float. The producer then writes the ADD's result directly."""
    steps, fused = partition.steps, {}
    readers = {}
    for s in steps:
        for t in s.op.inputs:
            readers[t] = readers.get(t, 0) + 1
    outputs = set(partition.outputs)
    for i in range(len(steps) - 1):
        prod, add = steps[i], steps[i + 1]
        if prod.op.name not in EPILOGUE_PRODUCERS or add.op.name != "ADD" or len(prod.op.outputs) != 1:
            continue
        t = prod.op.outputs[0]
        others = [u for u in add.op.inputs if u != t]
        if (list(add.op.inputs).count(t) != 1 or len(others) != 1 or readers.get(t) != 1
                or t in outputs or others[0] in partition.constants):
            continue
        specs = [prod.node.outputs[0], add.node.outputs[0]] + [x for x in add.node.inputs]
        if all(_is_float(x) for x in specs) and len({tuple(x.shape) for x in specs}) == 1:
            fused[i] = i + 1
    return fused


@dataclass
class PartitionCode:
    """A partition planned for its kernels: memory plan, chunks, fusions; `kernels` is filled
    by build_kernels (only when the program's AOT module has to be built)."""
    partition: Partition
    plan: Plan
    chunks: list                      # (start, end) step ranges, one per kernel
    fusions: dict                     # producer position -> fused ADD position
    fp16: bool
    kernels: list = field(default_factory=list)

    @property
    def launches(self) -> int:
        return len(self.chunks)

    @property
    def fused(self) -> list:
        steps = self.partition.steps
        return [(steps[i].op.index, steps[j].op.index) for i, j in self.fusions.items()]

    def digest_parts(self) -> tuple:
        return (tuple(s.op.index for s in self.partition.steps), tuple(self.chunks),
                tuple(sorted(self.fusions.items())), self.fp16, self.plan.digest_parts())


def plan(partition: Partition, graph: PreparedGraph, backend: str, fp16: bool,
         io_offsets: dict) -> PartitionCode:
    """The partition's chunks, fusions and memory plan (no Taichi compile)."""
    chunks = chunk_ranges(len(partition.steps), backend)
    fusions = residual_fusions(partition)
    # the ADD's output is written when its producer runs: its lifetime starts there
    early = {partition.steps[j].op.outputs[0]: i for i, j in fusions.items()}
    p = plan_partition(partition, graph, fp16, io_offsets, early_writes=early)
    sizes = {"arena": p.arena_size, "weights": p.weights.size, "scratch": p.scratch_size}
    big = {k: int(v) for k, v in sizes.items() if int(v) > MAX_BUFFER_ELEMENTS}
    if big:
        from tflite_taichi.errors import ModelError
        first = partition.steps[0].op
        raise ModelError(
            f"the delegated partition starting at op #{first.index} ({first.name}) needs "
            + ", ".join(f"{n:,} elements of {k}" for k, n in big.items())
            + f" in one buffer; Taichi indexes buffers with 32-bit integers (at most "
            f"{MAX_BUFFER_ELEMENTS:,}): use backend='reference' or smaller shapes")
    return PartitionCode(partition, p, chunks, fusions, fp16)


def _make_kernel(steps: list, fp16: bool):
    storage = ti.types.ndarray(dtype=ti.f16 if fp16 else ti.f32, ndim=1)
    f32 = ti.types.ndarray(dtype=ti.f32, ndim=1)

    @ti.kernel
    def partition_kernel(arena: storage, weights: storage, io: f32, scratch: f32):
        for s in ti.static(range(len(steps))):
            steps[s].run(arena, weights, (io, io, scratch))
    return partition_kernel


def build_kernels(code: PartitionCode) -> list:
    """The partition's Taichi kernels, one per chunk (not yet compiled: Taichi compiles at the
    first launch, or when an AOT module adds them). Needs Taichi's Python runtime started."""
    realize()                       # Taichi's decorators on every op's Taichi part (lazy_taichi.py)
    partition, plan_, fusions = code.partition, code.plan, code.fusions
    refs, packed = plan_.refs, plan_.packed
    steps, skipped = [], set(fusions.values())
    for position, step in enumerate(partition.steps):
        if position in skipped:
            steps.append(None)                  # done by its producer's store
            continue
        inputs = tuple(None if t == -1 else packed.get((step.op.index, i), refs.get(t))
                       for i, t in enumerate(step.op.inputs))
        outputs = tuple(refs[t] for t in step.op.outputs)
        if position in fusions:
            add = partition.steps[fusions[position]]
            residual = [u for u in add.op.inputs if u != step.op.outputs[0]][0]
            outputs = (ResidualAddRef(refs[add.op.outputs[0]], refs[residual],
                                      add.node.options.fused_activation_function),)
        io = StepIO(inputs=inputs, outputs=outputs, scratch=plan_.scratch.get(step.op.index))
        steps.append(step.opdef.taichi(step.node, io))
    groups = [[st for st in steps[a:b] if st is not None] for a, b in code.chunks]
    code.kernels = [_make_kernel(g, code.fp16) for g in groups]
    return code.kernels


def aot_module(caps=()):
    """A `ti.aot.Module` for the current arch, compiled for device capabilities `caps` (Taichi's
    names, "spirv_has_float16=1": SPIR-V archs generate code for them, and the C API loads the
    module only on a device with exactly these). Taichi 1.7.4's constructor finalizes the root
    FieldsBuilder and refuses a second module per process ("can only finalize the root
    FieldsBuilder once"); we declare no fields, so every module after the first skips that step
    and is otherwise built as the constructor does (same private calls, pinned taichi)."""
    from taichi.lang import impl
    fb = impl._root_fb
    if not fb.finalized:
        return ti.aot.Module(caps=list(caps))
    module = ti.aot.Module.__new__(ti.aot.Module)
    module._arch = impl.current_cfg().arch
    module._kernels, module._fields, module._content = [], {}, []
    module._aot_builder = impl.get_runtime().prog.make_aot_module_builder(module._arch, list(caps))
    return module
