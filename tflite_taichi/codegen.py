"""One generated Taichi kernel per partition (or per bounded chunk of it).

Each delegated op becomes a step object from its OpDef's `taichi` factory: plain Python
holding static offsets and shapes, with a `ti.func run(arena, weights, io)` whose top-level
loop is the op. A kernel is `for step in ti.static(steps): step.run(...)`: Taichi runs each
top-level loop as its own parallel task, in order, so the partition keeps TFLite's sequential
semantics for the price of one launch (DESIGN.md, "Speed").

Chunking policy, per backend (DESIGN.md's measurements on an H200: a fused chain of 30 ops
ran faster than 30 launches on CUDA and Vulkan, slower on OpenGL, and compile time grows with
kernel size): CUDA, Vulkan, Metal and CPU fuse up to CHUNK_STEPS ops per kernel; OpenGL/GLES
launch one kernel per op.
"""

import numpy as np

from tflite_taichi.graph import PreparedGraph
from tflite_taichi.ops.tiutil import StepIO, ti
from tflite_taichi.partition import Partition
from tflite_taichi.planner import Plan, plan_partition

CHUNK_STEPS = {"cuda": 32, "vulkan": 32, "metal": 32, "cpu": 32, "opengl": 1, "gles": 1}


def _make_kernel(steps: list):
    @ti.kernel
    def partition_kernel(arena: ti.types.ndarray(ndim=1), weights: ti.types.ndarray(ndim=1),
                         io: ti.types.ndarray(ndim=1)):
        for s in ti.static(range(len(steps))):
            steps[s].run(arena, weights, io)
    return partition_kernel


class CompiledPartition:
    """A partition ready to run: its kernels and its three device buffers."""

    def __init__(self, partition: Partition, graph: PreparedGraph, backend: str, fp16: bool):
        self.partition = partition
        self.plan: Plan = plan_partition(partition, graph, fp16)
        self.np_dtype = np.float16 if fp16 else np.float32
        ti_dtype = ti.f16 if fp16 else ti.f32
        refs = self.plan.refs
        self.steps = []
        for step in partition.steps:
            io = StepIO(inputs=tuple(refs.get(t) if t != -1 else None for t in step.op.inputs),
                        outputs=tuple(refs[t] for t in step.op.outputs))
            self.steps.append(step.opdef.taichi(step.node, io))
        size = CHUNK_STEPS.get(backend, 32)
        self.kernels = [_make_kernel(self.steps[i:i + size]) for i in range(0, len(self.steps), size)]
        self.arena = ti.ndarray(ti_dtype, self.plan.arena_size)
        self.weights = ti.ndarray(ti_dtype, self.plan.weights.size)
        self.weights.from_numpy(self.plan.weights.astype(self.np_dtype))
        self.io = ti.ndarray(ti.f32, self.plan.io_size)      # float32 always: see planner
        self.io_host = np.zeros(self.plan.io_size, np.float32)
        self.specs = graph.specs

    @property
    def launches(self) -> int:
        return len(self.kernels)

    def run(self, values: dict) -> None:
        """Copy the partition's inputs in, launch its kernels, copy its outputs back into values."""
        for t, off, shape in self.plan.io_inputs:
            n = int(np.prod(shape, dtype=np.int64))
            self.io_host[off:off + n] = np.asarray(values[t]).reshape(-1)
        self.io.from_numpy(self.io_host)
        for kernel in self.kernels:
            kernel(self.arena, self.weights, self.io)
        out = self.io.to_numpy()
        for t, off, shape in self.plan.io_outputs:
            n = int(np.prod(shape, dtype=np.int64))
            flat = out[off:off + n].reshape(shape)
            dtype = self.specs[t].dtype
            if dtype == np.bool_:
                values[t] = flat > 0.5
            else:
                values[t] = flat.astype(np.float32 if dtype != np.float16 else np.float16)
