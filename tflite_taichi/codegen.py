"""Generated Taichi kernels: one per partition (or per bounded chunk of it).

Each delegated op becomes a step object from its OpDef's `taichi` factory: plain Python
holding static offsets and shapes, with a `ti.func run(arena, weights, io)` whose top-level
loop is the op. A kernel is `for step in ti.static(steps): step.run(...)`: Taichi runs each
top-level loop as its own parallel task, in order, so the partition keeps TFLite's sequential
semantics for the price of one launch (docs/delegate.md).

Kernels take four typed 1-D ndarrays, `(arena, weights, io, scratch)`, so that Taichi can
archive them as an AOT module (cache.py) that later processes load through the C API without
running Taichi's frontend (device.py); the steps see `io` as the triple (io, io, scratch) of
kit (a partition's inputs and outputs are both in the program's io buffer).

Chunking policy, per backend (measured on an H200: a fused chain of 30 ops
ran faster than 30 launches on CUDA and Vulkan, slower on OpenGL, and compile time grows with
kernel size): CUDA, Vulkan, Metal and CPU fuse up to CHUNK_STEPS ops per kernel; OpenGL/GLES
launch one kernel per op.

This module is the only part of the delegate that needs Taichi's Python frontend: a program
whose AOT module is in the cache plans its partitions (`plan`) but never builds kernels.
"""
import contextlib
import os
import sys
import warnings
from dataclasses import dataclass, field

import numpy as np

from tflite_taichi import switches
from tflite_taichi import costs
from tflite_taichi.errors import KernelError
from tflite_taichi.graph import PreparedGraph
from tflite_taichi.ops.kit import EpilogueRef, LoadRef, StepIO, realize, ti
from tflite_taichi.partition import Partition
from tflite_taichi.planner import Plan, plan_partition

CHUNK_STEPS = {"cuda": 32, "vulkan": 32, "metal": 32, "cpu": 32, "opengl": 1, "gles": 1}

# Taichi indexes ndarrays with 32-bit integers: a buffer of more elements would be addressed
# wrongly, so a partition needing one is refused (a ModelError; after resize_tensor_input the
# interpreter reports the resize and keeps its previous shapes)
MAX_BUFFER_ELEMENTS = 2**31 - 1


def chunk_ranges(n_steps: int, backend: str) -> list:
    """(start, end) ranges of at most CHUNK_STEPS[backend] steps, one per kernel
    (TFLITE_TAICHI_CHUNK_STEPS overrides it: bench/profile_invoke.py's one step per kernel, so
    that the kernel profiler's tasks map back to ops; a kernel switch, tflite_taichi/switches.py)."""
    size = switches.value("TFLITE_TAICHI_CHUNK_STEPS") or CHUNK_STEPS.get(backend, 32)
    return [(i, min(i + size, n_steps)) for i in range(0, n_steps, size)] or [(0, 0)]


def _fusable(spec) -> bool:
    """A tensor an epilogue may carry as a value: float, or the float view of a quantized one
    (its producer's store snaps it, EpilogueRef does the same); not bool (0/1 semantics)."""
    return spec.dtype is not None and np.dtype(spec.dtype) != np.dtype(np.bool_)


# The longest chain of ops fused into one store, or computed at one load: each link nests one
# more call in Taichi's AST transformer, which a fuzzed chain of ~30 took past Python's
# recursion limit (RecursionError at compile); real models chain 2-4.
MAX_CHAIN = 8


def epilogue_fusions(partition: Partition, graph: PreparedGraph) -> dict:
    """{position of an element-wise op: (position of its producer, input position)}: the op
    runs inside its producer's store (kit.EpilogueRef) instead of as a task of its own, when
    - it declares `epilogue_inputs` and the producer `stores_once` (or is itself fused: a chain
      of element-wise ops runs in the store of the op at its head);
    - the fused tensor is the producer's only output, the op's only use of it, read by nothing
      else and not needed outside the partition (it is never written to memory);
    - it has the op's output shape (an element-wise op with that input unbroadcast), and
    - the op's other inputs exist when the chain's head runs (produced before it; for an
      operand that will be computed at this op's load (load_fusions), that operand's inputs)."""
    steps, specs = partition.steps, graph.specs
    readers = {}
    for st in steps:
        for t in st.op.inputs:
            readers[t] = readers.get(t, 0) + 1
    producer = {t: i for i, st in enumerate(steps) for t in st.op.outputs}
    outputs = set(partition.outputs)
    reading = _reading_steps(steps)
    fused, head, depth = {}, {}, {}

    def load_reader(k):
        return _load_reader(k, steps, specs, outputs, reading)

    for j, st in enumerate(steps):
        if st.opdef.fusion.epilogue_inputs is None or len(st.op.outputs) != 1:
            continue
        # an operand that can be computed at this op's load (a PAD) is better read there than
        # made the head of a chain: try the others first
        candidates = sorted(st.opdef.fusion.epilogue_inputs(st.node),
                            key=lambda pos: load_reader(producer.get(st.op.inputs[pos], -1)) == j)
        for pos in candidates:
            t = st.op.inputs[pos]
            i = producer.get(t)
            if i is None:
                continue
            prod = steps[i]
            if not (prod.opdef.fusion.stores_once or i in fused) or len(prod.op.outputs) != 1:
                continue
            if i not in fused and load_reader(i) == j and load_reader(j) is not None:
                continue        # both can run at the next op's loads: neither is a task
            if readers.get(t) != 1 or t in outputs or list(st.op.inputs).count(t) != 1:
                continue
            if tuple(specs[t].shape) != tuple(specs[st.op.outputs[0]].shape):
                continue
            if not (_fusable(specs[t]) and _fusable(specs[st.op.outputs[0]])):
                continue
            h = head.get(i, i)
            if depth.get(i, 0) >= MAX_CHAIN:
                continue
            if not all(_available(u, h, j, steps, producer, fused, load_reader)
                       for u in st.op.inputs if u != t and u != -1):
                continue
            fused[j], head[j], depth[j] = (i, pos), h, depth.get(i, 0) + 1
            break
    return fused


def aliases(partition: Partition, graph: PreparedGraph) -> dict:
    """{position of a reshape-like op (`alias_input`): its input tensor}: its output addresses
    the input's memory instead of a copy, when the output is not needed outside the partition
    (it would need its own place in io) and keeps the input's quantization."""
    specs, outputs, found = graph.specs, set(partition.outputs), {}
    for j, st in enumerate(partition.steps):
        k = st.opdef.fusion.alias_input
        if k is None or k >= len(st.op.inputs) or st.op.inputs[k] == -1 or len(st.op.outputs) != 1:
            continue
        src, out = st.op.inputs[k], st.op.outputs[0]
        if out in outputs or specs[src].value is not None:
            continue
        qa, qb = specs[src].quantization, specs[out].quantization
        same_grid = (qa is None and qb is None) or (
            qa is not None and qb is not None and np.array_equal(qa.scale, qb.scale)
            and np.array_equal(qa.zero_point, qb.zero_point))
        if same_grid and np.dtype(specs[src].dtype) == np.dtype(specs[out].dtype):
            found[j] = src
    return found


def load_fusions(partition: Partition, graph: PreparedGraph, fusions: dict, aliased: dict) -> dict:
    """{position of an op computed at its reader's load (`computed_at_load`): the position of
    that reader}: the op's output is read by that one step only, is not needed outside the
    partition, and is not handed to an epilogue; the reader runs as a task or is itself fused
    (into a store, or at another load: a chain). The op's inputs must exist where the loads
    happen (the head of the reader's chain). Its output is then never stored."""
    steps, specs, outputs = partition.steps, graph.specs, set(partition.outputs)
    reading = _reading_steps(steps)
    producer = {t: i for i, st in enumerate(steps) for t in st.op.outputs}
    handed = {i for i, _ in fusions.values()}          # producers whose store feeds an epilogue
    heads = _heads(fusions)
    found, when, depth = {}, {}, {}
    excluded = set(fusions) | handed | set(aliased)

    def load_reader(k):
        return _load_reader(k, steps, specs, outputs, reading)

    for j in reversed(range(len(steps))):
        c = load_reader(j)
        if c is None or j in excluded or c in aliased:
            continue
        at = when.get(c, heads.get(c, c))           # where the reader's loads run
        if depth.get(c, 0) >= MAX_CHAIN:
            continue
        if not all(_available(u, at, j, steps, producer, excluded, load_reader, depth.get(c, 0) + 1)
                   for u in steps[j].op.inputs if u != -1):
            continue
        found[j], when[j], depth[j] = c, at, depth.get(c, 0) + 1
    # epilogue_fusions counted on these (its `ready`): a fused op reading one at its head
    for j, (i, _) in fusions.items():
        h = heads[j]
        for u in steps[j].op.inputs:
            k = producer.get(u, -1)
            if u != -1 and k >= h and k != i and k not in found:
                raise AssertionError(f"codegen: op {steps[j].op.index} fused at step {h} reads "
                                     f"tensor {u} made at step {k}")
    return found


def _available(u, at: int, reader: int, steps, producer: dict, excluded, load_reader,
               level: int = 0) -> bool:
    """Whether tensor u, read by step `reader` (itself `level` links down a load chain), can be
    read where step `at` runs: made before it, or made by an op that will be computed at the
    reader's load (not `excluded`, within MAX_CHAIN links) from tensors that are (a chain of
    PADs and broadcast arithmetic). load_fusions decides with the same rule."""
    k = producer.get(u, -1)
    if k < at:
        return True
    if k in excluded or load_reader(k) != reader or level >= MAX_CHAIN:
        return False
    return all(_available(v, at, k, steps, producer, excluded, load_reader, level + 1)
               for v in steps[k].op.inputs if v != -1)


def _reading_steps(steps) -> dict:
    """{tensor: positions of the steps that read it, each once}."""
    reading = {}
    for c, st in enumerate(steps):
        for t in dict.fromkeys(st.op.inputs):
            reading.setdefault(t, []).append(c)
    return reading


def _load_reader(k, steps, specs, outputs, reading):
    """The position of the one step that reads op k's output, if k can be computed at that
    step's loads (`computed_at_load`, one output, read by one step, not a partition output,
    a value an element-wise op may carry), and that step loads each element once: it is
    element-wise in that input (its `epilogue_inputs`) or is itself computed at a load (a PAD
    of a PAD); else None.
    Only element-wise readers: a convolution loads each input element k*k*c_out times, and
    computing selfie_segmentation's squeeze-excite MULs at the 1x1 convs' loads made it 1.5x
    slower on the H200's cuda (3.41 vs 2.22 ms, bench/results/kernels_h200.md)."""
    st = steps[k]
    if not st.opdef.fusion.computed_at_load or st.opdef.fusion.alias_input is not None or len(st.op.outputs) != 1:
        return None
    t = st.op.outputs[0]
    users = reading.get(t, [])
    if t in outputs or len(users) != 1 or not _fusable(specs[t]):
        return None
    reader = steps[users[0]]
    if reader.opdef.fusion.epilogue_inputs is not None:
        positions = [p for p, u in enumerate(reader.op.inputs) if u == t]
        if not set(positions) <= set(reader.opdef.fusion.epilogue_inputs(reader.node)):
            return None
    elif not reader.opdef.fusion.computed_at_load:     # a PAD reading a PAD: each element once
        return None
    return users[0]


def _heads(fusions: dict) -> dict:
    """{fused op position: position of the task at the head of its chain}."""
    heads = {}
    for j, (i, _) in sorted(fusions.items()):
        heads[j] = heads.get(i, i)
    return heads


@dataclass
class PartitionCode:
    """A partition planned for its kernels: memory plan, chunks, fusions; `kernels` is filled
    by build_kernels (only when the program's AOT module has to be built)."""
    partition: Partition
    plan: Plan
    chunks: list                      # lists of task positions (steps that run), one per kernel
    fusions: dict                     # fused op position -> (producer position, input position)
    aliased: dict                     # reshape-like op position -> its input tensor
    at_load: dict                     # op computed at its reader's load -> the reader's position
    fp16: bool
    cpu_threads: int = 0              # Taichi CPU threads per top-level loop (1: serial; 0: Taichi's)
    arch: str = ""                    # the Taichi arch the kernels are for ('x64' for cpu): StepIO.arch
    kernels: list = field(default_factory=list)

    @property
    def launches(self) -> int:
        return len(self.chunks)

    @property
    def steps(self) -> int:
        """Ops that run as steps of their own (the rest are fused or addresses)."""
        return sum(len(c) for c in self.chunks)

    @property
    def fused(self) -> list:
        """(producer op index, op index) of every op fused into its producer's store."""
        steps = self.partition.steps
        return [(steps[i].op.index, steps[j].op.index) for j, (i, _) in sorted(self.fusions.items())]

    @property
    def computed_at_load(self) -> list:
        """(op index, reader op index) of every op computed at its reader's loads."""
        steps = self.partition.steps
        return [(steps[j].op.index, steps[c].op.index) for j, c in sorted(self.at_load.items())]

    def digest_parts(self) -> tuple:
        return (tuple(s.op.index for s in self.partition.steps), tuple(map(tuple, self.chunks)),
                tuple(sorted(self.fusions.items())), tuple(sorted(self.aliased.items())),
                tuple(sorted(self.at_load.items())), self.fp16, self.plan.digest_parts(),
                self.cpu_threads)


def plan(partition: Partition, graph: PreparedGraph, backend: str, fp16: bool,
         io_offsets: dict, io_codes=(), cpu_threads: int = 0) -> PartitionCode:
    """The partition's fusions, chunks and memory plan (no Taichi compile); `io_codes`: the io
    tensors held as integer codes (planner.plan_partition); `cpu_threads`: the interpreter's
    thread budget, which the `cpu` backend's loops get unless the partition is small enough to
    run serially (costs.cpu_loop_threads)."""
    # bench/'s A/B switch (a kernel switch: tflite_taichi/switches.py): "store" fuses into stores
    # only, "none" runs every op as a step of its own
    mode = switches.value("TFLITE_TAICHI_FUSION")
    fusions = epilogue_fusions(partition, graph) if mode in ("all", "store") else {}
    aliased = aliases(partition, graph) if mode != "none" else {}
    at_load = load_fusions(partition, graph, fusions, aliased) if mode == "all" else {}
    tasks = [i for i in range(len(partition.steps))
             if i not in fusions and i not in aliased and i not in at_load]
    chunks = [tasks[a:b] for a, b in chunk_ranges(len(tasks), backend)]
    steps = partition.steps
    heads = _heads(fusions)
    # a fused op's output is written when the head of its chain runs: its lifetime starts there;
    # the tensors handed over inside a store, or computed at a load, never touch memory, and
    # what an op computed at a load reads is read where that load runs
    early = {steps[j].op.outputs[0]: h for j, h in heads.items()}
    virtual = ({steps[j].op.inputs[pos] for j, (_, pos) in fusions.items()}
               | {steps[j].op.outputs[0] for j in at_load})
    late = {}
    for j in sorted(at_load, reverse=True):
        c = at_load[j]
        at = late.get(c, heads.get(c, c))
        late[j] = at
    late_reads = [(u, late[j]) for j in at_load for u in steps[j].op.inputs if u != -1]
    p = plan_partition(partition, graph, fp16, io_offsets, early_writes=early, virtual=virtual,
                       aliases={steps[j].op.outputs[0]: src for j, src in aliased.items()},
                       late_reads=late_reads, io_codes=io_codes)
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
    threads = costs.cpu_loop_threads(partition.steps, cpu_threads) if backend == "cpu" else 0
    return PartitionCode(partition, p, chunks, fusions, aliased, at_load, fp16, threads,
                         arch="x64" if backend == "cpu" else backend)


@contextlib.contextmanager
def intended_unrolling():
    """Taichi's "You are unrolling more than 32 iterations" SyntaxWarning silenced while our
    kernels compile (only that warning, only in this block; the compiles run under TAICHI_LOCK).
    Our kernels unroll on purpose: a kernel is a `ti.static` loop over its steps, counted and
    capped by chunk_ranges (CHUNK_STEPS; TFLITE_TAICHI_CHUNK_STEPS may ask for more), and the ops'
    static loops (ADD_N's inputs, a conv's taps and tiles) are bounded by the model's shapes.
    The warning's advice (a dynamic loop, ti.init(unrolling_limit=0)) is for authors of Taichi
    code, not for our users, who would only see Taichi's text with a file:line of ours."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="You are unrolling more than",
                                category=SyntaxWarning, module="taichi")
        yield


def _make_kernel(steps: list, fp16: bool):
    storage = ti.types.ndarray(dtype=ti.f16 if fp16 else ti.f32, ndim=1)
    f32 = ti.types.ndarray(dtype=ti.f32, ndim=1)

    @ti.kernel
    def partition_kernel(arena: storage, weights: storage, io: f32, scratch: f32):
        for s in ti.static(range(len(steps))):
            steps[s].run(arena, weights, (io, io, scratch, weights))
    return partition_kernel


def _state_refs(step, partition: Partition, refs: dict) -> tuple:
    """StepIO.state of a step overwriting variable tensors the partition keeps in slots: per
    state input position, that slot's ref (None for an input that is not such a variable)."""
    if not (step.updates_state and step.opdef.taichi_writes_state):
        return ()
    inputs = step.op.inputs
    return tuple(refs[inputs[pos]] if pos < len(inputs) and inputs[pos] in partition.variables
                 else None for pos in step.opdef.state_inputs(step.node))


def kernel_ops(code: PartitionCode, chunk_at: int) -> list:
    """The ops (model_ir.Operator) whose code kernel `chunk_at` of the partition holds: its
    steps, those fused into their stores and those computed at their loads."""
    held = set(code.chunks[chunk_at])
    while True:
        more = ({j for j, (producer, _) in code.fusions.items() if producer in held}
                | {j for j, reader in code.at_load.items() if reader in held})
        if more <= held:
            return [code.partition.steps[p].op for p in sorted(held)]
        held |= more


@contextlib.contextmanager
def compiling(code: PartitionCode, chunk_at: int):
    """Taichi's frontend refusing kernel `chunk_at` (a name, type or syntax error in an op's
    ti.func) raises a KernelError naming the kernel's ops; other errors pass as they are (the
    AOT builder refusing a kernel is not the op's fault: the caller may run it another way)."""
    try:
        yield
    except Exception as e:
        frontend = sys.modules.get("taichi.lang.exception")     # loaded: Taichi raised it
        if frontend is None or not isinstance(e, frontend.TaichiCompilationError):
            raise
        ops = ", ".join(f"op #{op.index} ({op.name})" for op in kernel_ops(code, chunk_at))
        raise KernelError(f"the Taichi code of {ops} did not compile for Taichi's {code.arch or 'arch'}: "
                          f"{type(e).__name__}: {str(e).strip()}") from e


def build_kernels(code: PartitionCode) -> list:
    """The partition's Taichi kernels, one per chunk (not yet compiled: Taichi compiles at the
    first launch, or when an AOT module adds them). Needs Taichi's Python runtime started.
    Steps are built from the last to the first, so that a fused op's step exists when its
    producer's output is made an EpilogueRef handing values to it."""
    realize()                       # Taichi's decorators on every op's Taichi part (lazy_taichi.py)
    partition, plan_ = code.partition, code.plan
    refs, packed = plan_.refs, plan_.packed
    into = {partition.steps[i].op.outputs[0]: (j, pos) for j, (i, pos) in code.fusions.items()}
    # an op computed at its reader's loads: the reader gets a LoadRef, whose step is set below
    at_load = {partition.steps[j].op.outputs[0]: LoadRef(refs[partition.steps[j].op.outputs[0]])
               for j in code.at_load}
    steps = [None] * len(partition.steps)
    for position in reversed(range(len(partition.steps))):
        if position in code.aliased:
            continue                            # its output addresses its input (plan refs)
        step = partition.steps[position]
        inputs = tuple(None if t == -1 else packed.get((step.op.index, i), at_load.get(t, refs.get(t)))
                       for i, t in enumerate(step.op.inputs))
        outputs = []
        for t in step.op.outputs:
            if t in into:
                reader, pos = into[t]
                outputs.append(EpilogueRef(refs[t], steps[reader], pos))
            else:
                outputs.append(refs[t])
        io = StepIO(inputs=inputs, outputs=tuple(outputs),
                    scratch=plan_.scratch.get(step.op.index), state=_state_refs(step, partition, refs),
                    arch=code.arch)
        steps[position] = step.opdef.taichi(step.node, io)
    for j in code.at_load:
        at_load[partition.steps[j].op.outputs[0]].step = steps[j]
    code.kernels = [_make_kernel([steps[i] for i in chunk], code.fp16) for chunk in code.chunks]
    return code.kernels


def module_tasks(path: str, llvm: bool) -> dict:
    """{kernel name: its Taichi tasks (top-level loops, each a GPU dispatch)} of a saved AOT
    module: a .tcm archive's metadata.json (gfx archs) or the folder's LLVM IR, one function
    `<kernel>_kernel_<i>_<kind>` per task (cuda, x64). {} when the layout is not recognised."""
    import json
    import re
    import zipfile
    try:
        if not llvm:
            with zipfile.ZipFile(path) as z:
                meta = json.loads(z.read("metadata.json"))
            return {k["name"]: len(k["tasks_attribs"]) for k in meta["kernels"]}
        tasks = {}
        for name in os.listdir(path):
            if name.endswith(".ll"):
                with open(os.path.join(path, name), errors="replace") as f:
                    text = f.read()
                tasks[name[:-3]] = len(re.findall(r"^define void @\S*_kernel_\d+_", text, re.M))
        return tasks
    except (OSError, KeyError, TypeError, ValueError, zipfile.BadZipFile):
        return {}
