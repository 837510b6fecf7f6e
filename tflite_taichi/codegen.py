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

Threads: Taichi 1.7 is one runtime per process and its Python front end is not thread-safe
(two threads compiling at once fail with "Kernels cannot call other kernels": compilation
state is global), and its Vulkan/OpenGL runtimes record launches into one shared command
list. So everything here that reaches Taichi (building steps and kernels, allocating and
freeing ndarrays, compiling, launching) holds TAICHI_LOCK, one re-entrant lock per process:
interpreters in several threads each get whole launches, one at a time; the numpy copies in
and out of a partition's host arrays run outside it.
"""

import threading

import numpy as np

from tflite_taichi.graph import PreparedGraph
from tflite_taichi.ops.tiutil import CopyTensorStep, ResidualAddRef, StepIO, ti
from tflite_taichi.partition import Partition
from tflite_taichi.planner import Plan, plan_partition

CHUNK_STEPS = {"cuda": 32, "vulkan": 32, "metal": 32, "cpu": 32, "opengl": 1, "gles": 1}

TAICHI_LOCK = threading.RLock()     # see the module docstring: every call into Taichi holds it

# Taichi indexes ndarrays with 32-bit integers: a buffer of more elements would be addressed
# wrongly, so a partition needing one is refused (a ModelError; after resize_tensor_input the
# interpreter reports the resize and keeps its previous shapes)
MAX_BUFFER_ELEMENTS = 2**31 - 1


def _make_kernel(steps: list):
    @ti.kernel
    def partition_kernel(arena: ti.types.ndarray(ndim=1), weights: ti.types.ndarray(ndim=1),
                         io_in: ti.types.ndarray(ndim=1), io_out: ti.types.ndarray(ndim=1),
                         scratch: ti.types.ndarray(ndim=1)):
        for s in ti.static(range(len(steps))):
            steps[s].run(arena, weights, (io_in, io_out, scratch))
    return partition_kernel


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


class CompiledPartition:
    """A partition ready to run: its kernels, its device buffers (arena, weights) and its host
    io arrays, handed to the first and last kernel as arguments."""

    def __init__(self, partition: Partition, graph: PreparedGraph, backend: str, fp16: bool):
        with TAICHI_LOCK:
            self._build(partition, graph, backend, fp16)

    def _build(self, partition: Partition, graph: PreparedGraph, backend: str, fp16: bool):
        self.partition = partition
        chunks = chunk_ranges(len(partition.steps), backend)
        fusions = residual_fusions(partition)
        # the ADD's output is written when its producer runs: its lifetime starts there
        early = {partition.steps[j].op.outputs[0]: i for i, j in fusions.items()}
        self.plan: Plan = plan_partition(partition, graph, fp16, chunks, early_writes=early)
        sizes = {"arena": self.plan.arena_size, "weights": self.plan.weights.size,
                 "inputs": self.plan.io_in_size, "outputs": self.plan.io_out_size,
                 "scratch": self.plan.scratch_size}
        big = {k: int(v) for k, v in sizes.items() if int(v) > MAX_BUFFER_ELEMENTS}
        if big:
            from tflite_taichi.errors import ModelError
            first = partition.steps[0].op
            raise ModelError(
                f"the delegated partition starting at op #{first.index} ({first.name}) needs "
                + ", ".join(f"{n:,} elements of {k}" for k, n in big.items())
                + f" in one buffer; Taichi indexes buffers with 32-bit integers (at most "
                f"{MAX_BUFFER_ELEMENTS:,}): use backend='reference' or smaller shapes")
        self.fused = [(partition.steps[i].op.index, partition.steps[j].op.index)
                      for i, j in fusions.items()]
        self.np_dtype = np.float16 if fp16 else np.float32
        ti_dtype = ti.f16 if fp16 else ti.f32
        refs, packed = self.plan.refs, self.plan.packed
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
            io = StepIO(inputs=inputs, outputs=outputs, scratch=self.plan.scratch.get(step.op.index))
            steps.append(step.opdef.taichi(step.node, io))
        groups = [[st for st in steps[a:b] if st is not None] for a, b in chunks]
        groups[0] = [CopyTensorStep(src, dst) for src, dst in self.plan.stage_in] + groups[0]
        groups[-1] = groups[-1] + [CopyTensorStep(src, dst) for src, dst in self.plan.stage_out]
        self.kernels = [_make_kernel(g) for g in groups]
        self.arena = ti.ndarray(ti_dtype, self.plan.arena_size)
        self.weights = ti.ndarray(ti_dtype, self.plan.weights.size)
        self.weights.from_numpy(self.plan.weights.astype(self.np_dtype))
        self.io_in = np.zeros(self.plan.io_in_size, np.float32)
        self.io_out = np.zeros(self.plan.io_out_size, np.float32)
        self._unused = ti.ndarray(ti.f32, 1)        # io argument of the kernels between
        self.scratch = ti.ndarray(ti.f32, self.plan.scratch_size)
        # each io tensor's view into the host arrays, made once (invoke's hot path only copies)
        def view(array, off, shape):
            return array[off:off + int(np.prod(shape, dtype=np.int64))].reshape(shape)
        self._in_views = [(t, view(self.io_in, off, shape)) for t, off, shape in self.plan.io_inputs]
        self._out_views = [(t, view(self.io_out, off, shape),
                            np.bool_ if graph.specs[t].dtype == np.bool_
                            else np.float16 if graph.specs[t].dtype == np.float16 else np.float32)
                           for t, off, shape in self.plan.io_outputs]

    def compile(self) -> None:
        """Compile every kernel now (Taichi compiles at the first launch): one launch on the
        zeroed buffers, whose results nobody reads. allocate_tensors() calls it, so the cost of
        building the delegate is paid there, as TFLite's GPU delegate does, not in invoke()."""
        with TAICHI_LOCK:
            self._launch()
            ti.sync()

    @property
    def launches(self) -> int:
        return len(self.kernels)

    def run(self, values: dict) -> None:
        """Copy the partition's inputs in, launch its kernels, copy its outputs back into values."""
        self._upload(values)
        self._launch()
        self._download(values)

    def _launch(self) -> None:
        last = len(self.kernels) - 1
        with TAICHI_LOCK:
            for i, kernel in enumerate(self.kernels):
                kernel(self.arena, self.weights, self.io_in if i == 0 else self._unused,
                       self.io_out if i == last else self._unused, self.scratch)

    def __del__(self):
        """The device buffers are freed under TAICHI_LOCK (Taichi frees an ndarray when it is
        collected, which may happen in any thread, e.g. while another one launches)."""
        try:
            with TAICHI_LOCK:
                for name in ("arena", "weights", "_unused", "scratch", "kernels"):
                    self.__dict__.pop(name, None)
        except Exception:       # at interpreter shutdown the lock or Taichi may be gone
            pass

    def _upload(self, values: dict) -> None:
        for t, view in self._in_views:
            view[...] = np.asarray(values[t]).reshape(view.shape)

    def _download(self, values: dict) -> None:
        for t, view, dtype in self._out_views:
            values[t] = view > 0.5 if dtype == np.bool_ else view.astype(dtype)
