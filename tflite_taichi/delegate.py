"""A subgraph's delegated partitions as one program on one device.

What `allocate_tensors()` builds for a Taichi backend, and what `invoke()` runs:

- **buffers, allocated once** (again only after a resize): one `io` buffer for every tensor
  that crosses a partition's edge (model inputs, CPU ops' results the GPU reads, partition
  outputs), one arena and one scratch buffer shared by the partitions (they run one after
  another), and each partition's weights, uploaded once. A tensor one partition writes and
  another reads stays in io, on the device; only what a CPU op or the caller reads comes back,
  through the device's host link (device.py);
- **kernels, compiled once per machine**: the partitions' kernels (codegen.py) as Taichi AOT
  modules in the cache (cache.py), loaded through Taichi's C API; modules that are not cached
  are compiled by worker processes, saved, then loaded the same way (runtime/kernels.py, which
  can also do it in the background while the reference path answers);
- **variables on the device**: a resource variable a partition reads or assigns lives in a slot
  of io (partition.VariableSlot); the host puts its value there only when the host's is newer
  (versions: variables.Variables) and takes it back only when something on the host reads it;
- **one wait per invoke**: every launch and copy of an invoke is enqueued, and the host waits
  once, before it reads the outputs, plus once before each CPU op that reads a partition's
  result (not more: everything pending is read back at that wait). `profile=True` waits after
  every partition instead, to time it.
"""
from __future__ import annotations

import hashlib
import time
import warnings
import weakref
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from tflite_taichi import switches
from tflite_taichi import codegen
from tflite_taichi.runtime import capi
from tflite_taichi.runtime import device as device_mod
from tflite_taichi.runtime.device import TAICHI_LOCK
from tflite_taichi.errors import ModelError, TfliteTaichiError
from tflite_taichi.graph import PreparedGraph
from tflite_taichi.partition import Partition, Schedule, carried_index_inputs
from tflite_taichi.quant import is_float_view
# compile_progress lives in the runtime wing; delegate.compile_progress is its documented name
from tflite_taichi.runtime.kernels import (ProgramKernels, compile_progress,  # noqa: F401
                                           kernel_compiled_reporter)


@dataclass
class IoLayout:
    """Where the boundary tensors live in the io buffer (float32 elements)."""
    offsets: dict = field(default_factory=dict)      # tensor -> offset
    counts: dict = field(default_factory=dict)       # tensor -> elements
    host_written: list = field(default_factory=list)  # tensors the host puts (model inputs, CPU results)
    host_read: list = field(default_factory=list)     # partition outputs the host takes back
    # the model's quantized inputs and outputs held as integer codes (TensorRef.codes): the host
    # puts and takes them in the model's dtype, with a cast instead of numpy's (de)quantize
    codes: set = field(default_factory=set)
    # resource variables kept on the device (partition.VariableSlot): resource -> (offset, slot);
    # every handle tensor naming one has the slot's offset in `offsets`
    slots: dict = field(default_factory=dict)
    size: int = 1

    def range(self, t) -> tuple:
        return self.offsets[t], self.counts[t]


def io_layout(schedule: Schedule, graph: PreparedGraph, preserve_all: bool = False,
              io_codes: bool = True) -> IoLayout:
    """Host-written tensors first, then partition outputs the host reads, then those only
    partitions read, each at its own offset (a tensor is written once per invoke).
    io_codes=False: every tensor crosses as its real value (a called subgraph's: its caller
    hands float views)."""
    partitions = schedule.partitions
    on_device = {t for p in partitions for t in p.outputs}
    read_by_cpu = {t for item in schedule.items if not isinstance(item, Partition)
                   for t in item.op.inputs if t != -1}
    read_by_host = set(graph.subgraph.outputs) | read_by_cpu
    written, read, device_only = [], [], []
    for p in partitions:
        for t in p.inputs:
            if t not in on_device and t not in written:
                written.append(t)
        for t in p.outputs:
            (read if (t in read_by_host or preserve_all) else device_only).append(t)
    layout, at = IoLayout(host_written=written, host_read=read), 0
    sg = graph.subgraph
    if io_codes:
        layout.codes = _io_codes(graph, cpu_read=read_by_cpu,
                                 candidates=(set(sg.inputs) & set(written)) | (set(sg.outputs) & on_device))
    for t in written + read + device_only:
        n = int(np.prod(graph.specs[t].shape, dtype=np.int64))
        layout.offsets[t], layout.counts[t] = at, n
        at += max(n, 1)
    for p in partitions:                # the variables' slots, written only by their ops
        for t, slot in p.variables.items():
            if slot.key not in layout.slots:
                layout.slots[slot.key] = (at, slot)
                at += max(slot.count, 1)
            layout.offsets[t] = layout.slots[slot.key][0]
    layout.size = max(at, 1)
    return layout


def io_codes_enabled() -> bool:
    """TFLITE_TAICHI_IO_CODES=0: the model's quantized IO as real values, (de)quantized by numpy
    on the host (bench/'s A/B switch; the plan's digest tells the two apart)."""
    return switches.value("TFLITE_TAICHI_IO_CODES")


def _io_codes(graph: PreparedGraph, cpu_read: set, candidates: set) -> set:
    """Of `candidates` (the subgraph's inputs that partitions read, its outputs that partitions
    write), those that can travel as integer codes: quantized per tensor with 8 or 16 bits
    (codes exact in float32) and read by no CPU step (CPU steps read real values from the
    host's dict)."""
    if not io_codes_enabled():
        return set()
    found = set()
    for t in candidates:
        spec = graph.specs[t]
        q = spec.quantization
        if (t not in cpu_read and spec.value is None and is_float_view(spec.dtype, q)
                and q.scale.size == 1 and np.dtype(spec.dtype).itemsize <= 2):
            found.add(t)
    return found


def _host_dtype(spec):
    if spec.dtype == np.bool_:
        return np.bool_
    return np.float16 if spec.dtype == np.float16 else np.float32


class Program:
    """The delegated partitions of one prepared subgraph, on one device."""

    def __init__(self, graph: PreparedGraph, schedule: Schedule, backend: str, fp16: bool,
                 model_cache=None, preserve_all: bool = False, background: bool = False,
                 cpu_threads: int = 0, variables=None, state=None, io_codes: bool = True):
        """background: kernels that are not cached are compiled (and, except on OpenGL/GLES,
        loaded) by a thread while the constructor returns at once; `adopt()` says when the
        program can run (the executor answers on the reference path until then).
        variables: the interpreter's resource variables, state: the subgraph's variable tensors
        (each a variables.Variables), for partitions that keep some in their io slots.
        io_codes: the subgraph's quantized inputs and outputs may cross as integer codes
        (IoLayout.codes); False for a called subgraph (executor.DelegatedCall)."""
        self.graph, self.schedule, self.backend, self.fp16 = graph, schedule, backend, fp16
        self.layout = io_layout(schedule, graph, preserve_all, io_codes)
        self._slots = _SlotVariables(self.layout, variables, state)
        # what the host takes each tensor back as: its codes in the model's dtype, else its
        # float view (float32, float16 or bool), and the shape it has
        self._host_forms = {t: (np.dtype(graph.specs[t].dtype if t in self.layout.codes
                                         else _host_dtype(graph.specs[t])),
                                tuple(graph.specs[t].shape)) for t in self.layout.host_read}
        self._host_written = frozenset(self.layout.host_written)   # looked up per CPU step
        if self.layout.size > codegen.MAX_BUFFER_ELEMENTS:
            raise ModelError(f"the tensors passed between the delegate's partitions and the host "
                             f"need {self.layout.size:,} float32 elements in one buffer; Taichi "
                             f"indexes buffers with 32-bit integers (at most "
                             f"{codegen.MAX_BUFFER_ELEMENTS:,}): use backend='reference' or "
                             "smaller shapes")
        self.codes = [codegen.plan(p, graph, backend, fp16, self.layout.offsets, self.layout.codes,
                                   cpu_threads) for p in schedule.partitions]
        self._code_of = {id(c.partition): c for c in self.codes}
        self._index_checks = _index_checks(schedule)
        self.waits = 0                          # of the last invoke
        self._closed = False
        self._modules = []                      # modules of this program alone (no cache)
        self._buffers = []
        self._links = []                        # the host link, once the buffers exist
        self._memory = None                     # _Memory, once the kernels exist
        env = (lambda: _driver_env(model_cache)) if model_cache is not None else None
        self.device = device_mod.get(backend, env)
        self.device.affinity.check_thread("allocate_tensors()")
        self.kernels = None                     # runtime.kernels.ProgramKernels (C API devices)
        if self.device.kind == "capi":
            shapes = {t: graph.specs[t].shape for t in graph.subgraph.inputs}
            self.kernels = ProgramKernels(self.device, self.codes, self.kernel_names(), backend,
                                          fp16, graph.subgraph.index, shapes, self.plan_digest(),
                                          model_cache, self._modules)
        try:
            if background and self.kernels is not None:
                self.kernels.start(self._install, lambda: self._closed, self._release_now)
            else:
                self._build()
        except BaseException:
            _release(self.device, self._buffers, self._links, self._modules)
            raise
        self._finalizer = weakref.finalize(self, _release, self.device, self._buffers,
                                           self._links, self._modules)

    def _build(self) -> None:
        if self.kernels is not None:
            try:
                self._kernels = self.kernels.get()
            except TfliteTaichiError as e:
                if not isinstance(e, capi.CapiError):
                    raise
                self._fall_back(e)
            except Exception as e:      # Taichi's AOT builder refused a kernel that its Python
                self._fall_back(e)      # runtime may still run (if not, that compile raises)
        else:
            self._kernels = self._python_kernels()
        self._allocate()
        if self.device.kind == "python":          # compile now (Taichi compiles at first launch)
            self._compile_by_launching()

    def _fall_back(self, why: Exception) -> None:
        """This program through Taichi's Python runtime (the C API refused its module, or Taichi
        could not archive it), with a warning."""
        warnings.warn(f"tflite_taichi: {type(why).__name__}: {why}; this model's kernels run "
                      "through Taichi's Python runtime instead", RuntimeWarning, stacklevel=5)
        self.device = device_mod.PythonDevice(self.backend)
        self.kernels = None
        self._kernels = self._python_kernels()

    def _install(self, kernels: list) -> None:
        """The kernels a background build got: this program can run once its buffers exist."""
        self._kernels = kernels
        self._allocate()

    def _release_now(self) -> None:
        _release(self.device, self._buffers, self._links, self._modules)

    # -- where the kernels stand (summary) ---------------------------------------------------
    @property
    def cache_state(self):
        """('warm' | 'cold', reason) of its modules (None on Taichi's Python runtime)."""
        return self.kernels.cache_state if self.kernels is not None else None

    @property
    def build_s(self) -> float:
        return self.kernels.build_s if self.kernels is not None else 0.0

    @property
    def compiled_in(self):
        return self.kernels.compiled_in if self.kernels is not None else None

    @property
    def compiling(self) -> bool:
        return self.kernels is not None and self.kernels.compiling

    @property
    def failed(self):
        return self.kernels.failed if self.kernels is not None else None

    def adopt(self, timeout: Optional[float] = 0.0) -> bool:
        """True when the program can run: its kernels installed (answer_while_compiling: they
        may still be compiling after `timeout` seconds, None waiting as long as it takes, or
        their compile failed: `failed` holds why). runtime/kernels.py says more."""
        return self.kernels is None or self.kernels.adopt(timeout)

    # -- kernels ------------------------------------------------------------------------------
    def plan_digest(self) -> str:
        parts = (self.backend, self.fp16, sorted(self.layout.offsets.items()),
                 [c.digest_parts() for c in self.codes])
        return hashlib.sha256(repr(parts).encode()).hexdigest()

    def kernel_names(self) -> list:
        return [[f"p{i}_k{j}" for j in range(c.launches)] for i, c in enumerate(self.codes)]

    @property
    def tasks(self):
        """Taichi tasks (GPU dispatches) per invoke, from the module (None: not known, e.g. on
        the Python runtime)."""
        counts = self.kernels.tasks if self.kernels is not None else {}
        names = sum(self.kernel_names(), [])
        if not names or any(n not in counts for n in names):
            return None
        return sum(counts[n] for n in names)

    def _python_kernels(self) -> list:
        with TAICHI_LOCK:
            return [codegen.build_kernels(code) for code in self.codes]

    # -- buffers ------------------------------------------------------------------------------
    def _allocate(self) -> None:
        d = self.device
        storage = "f16" if self.fp16 else "f32"
        arena = self._buffer(d.allocate(max((c.plan.arena_size for c in self.codes), default=1),
                                        storage))
        scratch = self._buffer(d.allocate(max((c.plan.scratch_size for c in self.codes), default=1),
                                          "f32"))
        io = self._buffer(d.allocate(self.layout.size, "f32"))
        link = d.link(io)
        self._links.append(link)
        launches = {}
        for code, kernels in zip(self.codes, self._kernels):
            weights = self._buffer(d.allocate(max(code.plan.weights.size, 1), storage))
            d.fill(weights, code.plan.weights)
            launches[id(code.partition)] = [d.launcher(k, (arena, weights, io, scratch))
                                            for k in kernels]
        self._memory = _Memory(link, launches)

    def _buffer(self, b):
        self._buffers.append(b)
        return b

    def _compile_by_launching(self) -> None:
        """Python device: compile every kernel now, in allocate_tensors(), as TFLite's GPU
        delegate builds its programs there, not in the first invoke (one launch on the zeroed
        buffers, whose results nobody reads)."""
        with TAICHI_LOCK, codegen.intended_unrolling():
            compiled = kernel_compiled_reporter(self.launches)
            for launches in self._memory.launches.values():
                for launch in launches:
                    launch()                # the first launch compiles
                    compiled()
            self.device.wait()

    # -- invoke -------------------------------------------------------------------------------
    @property
    def launches(self) -> int:
        return sum(c.launches for c in self.codes)

    def code(self, partition: Partition):
        return self._code_of[id(partition)]

    def planned_waits(self) -> int:
        """Host waits per invoke (without profiling): one before each CPU op that reads what a
        partition wrote since the last wait, and one at the end if anything ran since."""
        host_read, pending, launched, waits = set(self.layout.host_read), set(), False, 0
        for item in self.schedule.items:
            if id(item) in self._code_of:          # a partition (known before its launches exist)
                launched = True
                pending.update(t for t in item.outputs if t in host_read)
            elif pending & set(item.op.inputs):
                waits, pending, launched = waits + 1, set(), False
        return waits + (1 if pending or launched else 0)

    def start_invoke(self, values: dict, into: Optional[dict] = None) -> "DeviceRun":
        """One invoke's traffic with the device (the executor's schedule loop drives it): puts
        what the host holds of `values` and returns the DeviceRun that launches partitions and
        takes their outputs back into `values`. `values` holds the constants and feeds: real
        values (float views), except the tensors in `layout.codes`, which come and go as integer
        codes in the model's dtype. `into`: tensor -> a host array to take it into when it has
        the tensor's shape and host dtype (the interpreter's output arrays): values[t] is then
        that array."""
        return DeviceRun(self, values, into or {})

    def put(self, tensors, values: dict) -> None:
        """Host values of `tensors` into io (int32 ids the kernels read are checked first:
        refused values raise here)."""
        for t in tensors:
            for check in self._index_checks.get(t, ()):
                check(values[t])
        offsets = self.layout.offsets
        self._memory.link.put([(offsets[t], np.asarray(values[t], dtype=np.float32).reshape(-1))
                               for t in tensors])

    def launch(self, partition: Partition, times: Optional[list] = None) -> None:
        """Enqueue `partition`'s launches (its variables made current in their slots first).
        `times` (profiling): wait after each kernel and append its seconds, launch included."""
        memory = self._memory
        if partition.reads_first:
            memory.link.put(self._slots.stale(partition))
        with TAICHI_LOCK:
            for launch in memory.launches[id(partition)]:
                if times is None:
                    launch()
                    continue
                start = time.perf_counter()
                launch()
                self.device.wait()
                times.append(time.perf_counter() - start)
                self.waits += 1
        self._slots.hold_assigned(partition, self)

    def wait_and_take(self, tensors, destinations=None) -> list:
        """Wait for everything enqueued and take `tensors` back (flat float32, into
        `destinations`' arrays where given); counts the wait."""
        link, ranges = self._memory.link, [self.layout.range(t) for t in tensors]
        with TAICHI_LOCK:
            if ranges:
                link.request(ranges)
            self.device.wait()
        self.waits += 1
        return link.take(ranges, destinations or [None] * len(ranges)) if ranges else []

    def lean_step(self, inputs: dict, outputs: dict):
        """A callable running an invoke with the least Python, where the schedule's one
        partition is all there is to run (the executor checks that its CPU steps have nothing
        left to do): put the model's inputs from `inputs` (tensor -> the interpreter's array,
        float or integer codes, as they are), make the variables current, launch, wait once,
        and take every output into `outputs`' arrays. None where an invoke needs the general
        path: inputs the host dequantizes or checks (ids), outputs in another form than the
        interpreter's arrays, more than one partition."""
        partitions, layout = self.schedule.partitions, self.layout
        if len(partitions) != 1 or self._index_checks:
            return None
        p, specs = partitions[0], self.graph.specs
        puts = []
        for t in layout.host_written:
            spec = specs[t]
            if t not in inputs or (t not in layout.codes and is_float_view(spec.dtype, spec.quantization)):
                return None
            puts.append((layout.offsets[t], inputs[t]))
        takes = [t for t in layout.host_read if t in outputs]
        if len(takes) != len(layout.host_read) or set(takes) != set(outputs):
            return None
        for t in takes:
            dtype, shape = self._host_forms[t]
            dest = outputs[t]
            if dest.dtype != dtype or dtype == np.bool_ or dest.shape != shape:
                return None
        ranges = [layout.range(t) for t in takes]
        dests = [outputs[t] for t in takes]
        launches, link, device, check = self._memory.launches[id(p)], self._memory.link, \
            self.device, self.device.affinity.check_thread
        slots = self._slots

        def step():
            check("invoke()")
            items = [(offset, np.asarray(a, np.float32).reshape(-1)) for offset, a in puts]
            if p.reads_first:
                items += slots.stale(p)
            link.put(items)
            with TAICHI_LOCK:
                for launch in launches:
                    launch()
                link.request(ranges)
                device.wait()
            slots.hold_assigned(p, self)
            link.take(ranges, dests)
            self.waits = 1
        return step

    # -- resource variables in io slots (partition.VariableSlot) ------------------------------
    def take_variable(self, resource) -> np.ndarray:
        """The value this program's slot holds, in the model's dtype (for the host: a CPU op or
        another program reads the variable). Waits for the launches enqueued so far."""
        offset, slot = self.layout.slots[resource]
        ranges = [(offset, slot.count)]
        link = self._memory.link
        with TAICHI_LOCK:
            link.request(ranges)
            self.device.wait()
        flat = link.take(ranges)[0]
        if np.dtype(slot.dtype).kind in "iub":      # codes (or 0/1): exact in float32
            flat = np.rint(flat)
        return flat.astype(slot.dtype).reshape(slot.shape)

    # -- lifetime -----------------------------------------------------------------------------
    def close(self) -> None:
        """Free the device buffers and the module now (also done when the program is collected).
        A background build still running finishes its compile (the cache keeps it) and loads
        nothing more. Variables only its slots hold come to the host first."""
        if not self._closed:
            # (variable tensors need no such care: the next allocation resets them)
            if self._memory is not None and self._slots.variables is not None:
                try:
                    self._slots.variables.release(self)
                except Exception as e:      # the device is gone: the host keeps what it had
                    warnings.warn(f"tflite_taichi: resource variables kept on the device could "
                                  f"not be read back when the delegate closed ({type(e).__name__}: "
                                  f"{e}); they keep their last value on the host",
                                  RuntimeWarning, stacklevel=2)
            self._closed = True
            if self.kernels is not None:
                self.kernels.abandon()
            self._finalizer()


@dataclass
class _Memory:
    """A program's device memory once its kernels exist: the host link to its io buffer, and
    each partition's launchers bound to the arena, its weights, io and scratch."""
    link: object
    launches: dict                          # id(partition) -> [launcher]


class _SlotVariables:
    """Which value each variable slot of io holds (partition.VariableSlot): the versions the
    host's stores gave them, so a slot is put only when the host's value is newer."""

    def __init__(self, layout: IoLayout, variables, state):
        self.layout = layout
        self.variables = variables          # the interpreter's resource variables
        self.state = state                  # the subgraph's variable tensors
        self._version = {}                  # slot key -> the version its slot holds

    def stale(self, partition: Partition) -> list:
        """(offset, values) to put before `partition` runs: the variables it reads before
        writing whose slot is older than their value (the host, or another program, wrote
        since), as float32 (a quantized variable's codes, as the host stores them)."""
        items = []
        for resource, step in partition.reads_first.items():
            store = self._store(resource)
            if self._version.get(resource) == store.version(resource):
                continue
            value = store.get(resource)        # another program's newer value comes back first
            offset, slot = self.layout.slots[resource]
            if value is None:
                raise step.node.fail(f"reads variable {resource} before any ASSIGN_VARIABLE gave "
                                     "it a value")
            if value.shape != slot.shape or value.dtype != slot.dtype:
                raise step.node.fail(f"variable {resource} holds {value.dtype} {list(value.shape)}; "
                                     f"this subgraph reads and writes it as {np.dtype(slot.dtype).name} "
                                     f"{list(slot.shape)}")
            items.append((offset, np.asarray(value, np.float32).reshape(-1)))
            self._version[resource] = store.version(resource)
        return items

    def hold_assigned(self, partition: Partition, program: Program) -> None:
        """After `partition`'s launches: `program` holds the newest value of what it assigns."""
        for key in partition.assigns:
            self._version[key] = self._store(key).written_on_device(key, program)

    def _store(self, key):
        """The store a slot's value belongs to: the interpreter's resource variables, or the
        subgraph's variable tensors."""
        return self.state if self.layout.slots[key][1].kind == "tensor" else self.variables


class DeviceRun:
    """One invoke's traffic with a program's device, as the executor's schedule loop walks it:
    the host's puts, the launches enqueued, and the partition outputs the host reads, pending
    until the next wait. One wait per invoke, plus one before each CPU op that reads a pending
    output (everything pending comes back at that wait); `settle()` waits at once (profiling,
    so a partition's time is its own)."""

    def __init__(self, program: Program, values: dict, into: dict):
        program.device.affinity.check_thread("invoke()")
        program.waits = 0
        self.program, self.values, self.into = program, values, into
        self._host_forms = program._host_forms      # the tensors the host reads, and as what
        self._written = program._host_written
        self._pending, self._launched = [], False
        program.put([t for t in program.layout.host_written if t in values], values)

    def delegated(self, item) -> bool:
        """Whether the program runs `item` (a partition of its schedule)."""
        return id(item) in self.program._code_of

    def launch(self, partition: Partition, times: Optional[list] = None) -> None:
        self.program.launch(partition, times)
        self._launched = True
        self._pending.extend(t for t in partition.outputs if t in self._host_forms)

    def settle(self) -> None:
        """Wait now for what was launched (and take back what is pending)."""
        self._take_pending()

    def before_host(self, step) -> None:
        """Before a CPU step: the pending outputs it reads (and all others) come back."""
        if any(t in self._pending for t in step.op.inputs):
            self._take_pending()

    def after_host(self, step) -> None:
        """After a CPU step: its outputs a partition reads go to the device."""
        self.program.put([t for t in step.op.outputs if t in self._written], self.values)

    def finish(self) -> None:
        """The invoke's last wait: the outputs back, and the device idle before the next invoke
        writes the upload buffer again (a wait even when nothing is read)."""
        if self._pending or self._launched:
            self._take_pending()

    def _take_pending(self) -> None:
        pending, values = self._pending, self.values
        destinations = [self._destination(t) for t in pending]
        for t, flat in zip(pending, self.program.wait_and_take(pending, destinations)):
            dtype, shape = self._host_forms[t]
            value = flat.reshape(shape)
            values[t] = value > 0.5 if dtype == np.bool_ else value.astype(dtype, copy=False)
        pending.clear()
        self._launched = False

    def _destination(self, t):
        """The caller's array to take `t` into, where it has the host's dtype and shape."""
        dest = self.into.get(t)
        dtype, shape = self._host_forms[t]
        if dest is None or dest.dtype != dtype or dtype == np.bool_ or dest.shape != shape:
            return None
        return dest


def _index_checks(schedule: Schedule) -> dict:
    """tensor -> the checks its delegated readers run on its int32 values before the host puts
    them into io (partition.carried_index_inputs), e.g. an embedding's ids against its table."""
    checks = {}
    for p in schedule.partitions:
        for step in p.steps:
            for i, check in carried_index_inputs(step).items():
                if check is not None:
                    checks.setdefault(step.op.inputs[i], []).append(check)
    return checks


def _release(device, buffers, links, modules) -> None:
    """Frees a program's device memory and module (weakref.finalize: also at collection, in any
    thread, so under TAICHI_LOCK; a GL device's frees wait for its own thread). A collection
    inside a device call of this thread (in the middle of a Vulkan submission of ours, whose
    fence and command buffers a release would wait on and free) waits for the next invoke."""
    if not device.affinity.on_owner_thread() or device_mod.inside_device_call():
        device.affinity.defer(lambda: _release(device, buffers, links, modules))
        return
    try:
        with TAICHI_LOCK:
            if device.kind == "capi":
                device.drain()          # Taichi's own wait: it lets go of the buffers' commands
            while links:                # emptied as released: a second call frees nothing twice
                links.pop().close()
            while buffers:
                device.free(buffers.pop())
            while modules:
                device.destroy_module(modules.pop())
    except Exception:       # at interpreter shutdown the runtime may be gone
        pass


def _driver_env(model_cache):
    from tflite_taichi.runtime.cache import driver_env
    return driver_env(model_cache.root)
