"""A subgraph's delegated partitions as one program on one device: the runner.

program_builder.build_program builds it in `allocate_tensors()` (the io layout, the partitions'
kernels, their memory) and hands it over; what `invoke()` runs is here, and only that:

- **memory, allocated once** (again only after a resize): one `io` buffer for every tensor that
  crosses a partition's edge (model inputs, CPU ops' results the GPU reads, partition outputs),
  one arena and one scratch buffer shared by the partitions (they run one after another), and
  each partition's weights. A tensor one partition writes and another reads stays in io, on the
  device; only what a CPU op or the caller reads comes back, through the device's host link
  (device.py);
- **variables on the device**: a resource variable a partition reads or assigns lives in a slot
  of io (partition.VariableSlot); the host puts its value there only when the host's is newer
  (versions: variables.Variables) and takes it back only when something on the host reads it;
- **the traffic, one implementation**: `Program.put`, `launch` and `wait_and_take`, which both
  the executor's schedule loop (through a `DeviceRun`, one invoke's) and the lean step (a
  `LeanRun`, a one-partition invoke prepared once) go through;
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

from tflite_taichi.runtime import device as device_mod
from tflite_taichi.runtime.device import TAICHI_LOCK
from tflite_taichi.partition import Partition, Schedule, carried_index_inputs
from tflite_taichi.quant import is_float_view
# compile_progress lives in the runtime wing; delegate.compile_progress is its documented name
from tflite_taichi.runtime.kernels import compile_progress  # noqa: F401


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


class Program:
    """The runner of one prepared subgraph's delegated partitions on one device, as
    program_builder.build_program hands it over: its memory and variable slots, the invoke's
    traffic with the device, and its lifetime."""

    def __init__(self, graph, schedule: Schedule, backend: str, fp16: bool, layout: IoLayout,
                 codes: list, device, kernels, modules: list, variables=None, state=None):
        """device: None until a build in the background has started it (run_on);
        kernels: runtime.kernels.ProgramKernels (None on Taichi's Python runtime); modules:
        this program's own, freed with it; variables, state: the interpreter's resource
        variables and the subgraph's variable tensors, which io slots may hold."""
        self.graph, self.schedule, self.backend, self.fp16 = graph, schedule, backend, fp16
        self.layout, self.codes, self.device, self.kernels = layout, codes, device, kernels
        self.memory = None                      # Memory, once the kernels exist (install)
        self.waits = 0                          # of the last invoke
        self.closed = False
        self._slots = _SlotVariables(layout, variables, state)
        self._host_forms = _host_forms(graph, layout)     # tensor -> (dtype, shape) taken back
        self._host_written = frozenset(layout.host_written)   # looked up per CPU step
        self._code_of = {id(c.partition): c for c in codes}
        self._index_checks = _index_checks(schedule)
        self.owned = _Owned(device, modules)   # what it frees: the builder adds its memory
        self._buffers = self.owned.buffers
        self._finalizer = weakref.finalize(self, _release, self.owned)

    # -- what the builder sets ---------------------------------------------------------------
    def run_on(self, device, kernels=None) -> None:
        """Run on `device`: the one a build in the background started, or instead of the one
        it had (the builder's fallback to Taichi's Python runtime)."""
        self.device = self.owned.device = device
        self.kernels = kernels

    def install(self, memory: "Memory") -> None:
        """The memory the kernels run on: the program can run from now on."""
        self.memory = memory

    @property
    def device_kind(self) -> str:
        """'capi' or 'python' (summary): a device still starting is the C API's."""
        return self.device.kind if self.device is not None else "capi"

    # -- where the kernels stand (summary) ---------------------------------------------------
    def can_run(self, timeout: Optional[float] = 0.0) -> bool:
        """True when the program can run: its kernels installed (answer_while_compiling: they
        may still be compiling after `timeout` seconds, None waiting as long as it takes, or
        their compile failed: `failed` holds why). runtime/kernels.py says more."""
        return self.kernels is None or self.kernels.adopt(timeout)

    build_s = property(lambda self: self.kernels.build_s if self.kernels is not None else 0.0)
    compiled_in = property(lambda self: None if self.kernels is None else self.kernels.compiled_in)
    compiling = property(lambda self: self.kernels is not None and self.kernels.compiling)
    failed = property(lambda self: self.kernels.failed if self.kernels is not None else None)

    tasks = property(lambda self: tasks_per_invoke(self.kernels, self.codes))

    def plan_digest(self) -> str:
        return plan_digest(self.backend, self.fp16, self.layout, self.codes)

    def kernel_names(self) -> list:
        return kernel_names(self.codes)

    @property
    def launches(self) -> int:
        return sum(c.launches for c in self.codes)

    def code(self, partition: Partition):
        return self._code_of[id(partition)]

    def planned_waits(self) -> int:
        return planned_waits(self.schedule, self._code_of, self.layout.host_read)

    # -- invoke -------------------------------------------------------------------------------
    def start_invoke(self, values: dict, into: Optional[dict] = None) -> "DeviceRun":
        """The DeviceRun of one invoke (the executor's schedule loop drives it), what the host
        holds of `values` put: float views, but `layout.codes`' integer codes in the model's
        dtype. `into`: tensor -> a host array (the interpreter's outputs) to take it into where
        it has the tensor's shape and host dtype (values[t] is then that array)."""
        return DeviceRun(self, values, into or {})

    def lean_step(self, inputs: dict, outputs: dict) -> Optional["LeanRun"]:
        """The invoke with the least Python (a LeanRun), or None where it needs the general path
        (LeanRun.prepare says when)."""
        return LeanRun.prepare(self, inputs, outputs)

    def begin_invoke(self) -> None:
        self.device.affinity.check_thread("invoke()")
        self.waits = 0

    def put(self, tensors, values: dict) -> None:
        """Host values of `tensors` into io (int32 ids the kernels read are checked first:
        refused values raise here)."""
        for t in tensors:
            for check in self._index_checks.get(t, ()):
                check(values[t])
        offsets = self.layout.offsets
        self.memory.link.put([(offsets[t], np.asarray(values[t], dtype=np.float32).reshape(-1))
                              for t in tensors])

    def launch(self, partition: Partition, times: Optional[list] = None,
               puts: Optional[list] = None) -> None:
        """Enqueue `partition`'s launches, its variables made current in their slots first
        (with `puts`, (offset, float32 values) for io, in the same put). `times` (profiling):
        wait after each kernel and append its seconds, launch included."""
        memory = self.memory
        if partition.reads_first:
            puts = (puts or []) + self._slots.stale(partition)
        if puts is not None:
            memory.link.put(puts)
        with TAICHI_LOCK:
            if times is None:
                for launch in memory.launches[id(partition)]:
                    launch()
            else:
                for launch in memory.launches[id(partition)]:
                    start = time.perf_counter()
                    launch()
                    self.device.wait()
                    times.append(time.perf_counter() - start)
                    self.waits += 1
        self._slots.hold_assigned(partition, self)

    def wait_and_take(self, ranges: list, destinations: Optional[list] = None,
                      counted: bool = True) -> list:
        """Wait for everything enqueued and take io's `ranges` back (flat float32, into
        `destinations`' arrays where given). `counted`: a wait of the invoke (`waits`)."""
        if counted:
            self.waits += 1
        link = self.memory.link
        with TAICHI_LOCK:
            if ranges:
                link.request(ranges)
            self.device.wait()
        return link.take(ranges, destinations or [None] * len(ranges)) if ranges else []

    def take_variable(self, resource) -> np.ndarray:
        """The value this program's slot holds, in the model's dtype (for the host: a CPU op or
        another program reads the variable). Waits for the launches enqueued so far."""
        offset, slot = self.layout.slots[resource]
        flat = self.wait_and_take([(offset, slot.count)], counted=False)[0]
        if np.dtype(slot.dtype).kind in "iub":      # codes (or 0/1): exact in float32
            flat = np.rint(flat)
        return flat.astype(slot.dtype).reshape(slot.shape)

    # -- lifetime -----------------------------------------------------------------------------
    def close(self) -> None:
        """Free the device buffers and the module now (also done when the program is collected).
        A background build still running finishes its compile (the cache keeps it) and loads
        nothing more. Variables only its slots hold come to the host first."""
        if not self.closed:
            if self.memory is not None:
                self._slots.bring_home(self)
            self.closed = True
            if self.kernels is not None:
                self.kernels.abandon()
            self._finalizer()

    def release_now(self) -> None:
        """Free what the program owns now: a build that failed, or memory a background build
        made after close()."""
        self._finalizer.detach()
        _release(self.owned)


@dataclass
class Memory:
    """A program's device memory once its kernels exist: the host link to its io buffer, and
    each partition's launchers bound to the arena, its weights, io and scratch."""
    link: object
    launches: dict                          # id(partition) -> [launcher]


@dataclass
class _Owned:
    """What a program frees: its device's buffers, host links and modules (the device may
    change while it is built: the fallback to Taichi's Python runtime)."""
    device: object
    modules: list
    buffers: list = field(default_factory=list)
    links: list = field(default_factory=list)


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

    def bring_home(self, program: Program) -> None:
        """`program` is closing: the resource variables only its slots hold come to the host
        (variable tensors need no such care: the next allocation resets them)."""
        if self.variables is None:
            return
        try:
            self.variables.release(program)
        except Exception as e:      # the device is gone: the host keeps what it had
            warnings.warn(f"tflite_taichi: resource variables kept on the device could "
                          f"not be read back when the delegate closed ({type(e).__name__}: "
                          f"{e}); they keep their last value on the host",
                          RuntimeWarning, stacklevel=3)

    def _store(self, key):
        """The store a slot's value belongs to: the interpreter's resource variables, or the
        subgraph's variable tensors."""
        return self.state if self.layout.slots[key][1].kind == "tensor" else self.variables


class DeviceRun:
    """One invoke's traffic with a program's device, as the executor's schedule loop walks it:
    the host's puts, the launches enqueued, and the partition outputs the host reads, pending
    until the next wait. One wait per invoke, plus one before each CPU op that reads a pending
    output (everything pending comes back at that wait); `wait_and_take_pending()` waits at
    once (profiling, so a partition's time is its own)."""

    def __init__(self, program: Program, values: dict, into: dict):
        program.begin_invoke()
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

    def before_host(self, step) -> None:
        """Before a CPU step: the pending outputs it reads (and all others) come back."""
        if any(t in self._pending for t in step.op.inputs):
            self.wait_and_take_pending()

    def after_host(self, step) -> None:
        """After a CPU step: its outputs a partition reads go to the device."""
        self.program.put([t for t in step.op.outputs if t in self._written], self.values)

    def finish(self) -> None:
        """The invoke's last wait: the outputs back, and the device idle before the next invoke
        writes the upload buffer again (a wait even when nothing is read)."""
        if self._pending or self._launched:
            self.wait_and_take_pending()

    def wait_and_take_pending(self) -> None:
        """Wait now for what was launched, and take the pending outputs into `values`."""
        pending, values, layout = self._pending, self.values, self.program.layout
        destinations = [self._destination(t) for t in pending]
        taken = self.program.wait_and_take([layout.range(t) for t in pending], destinations)
        for t, flat in zip(pending, taken):
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


class LeanRun:
    """A one-partition invoke prepared once (Program.lean_step): its puts, launch and takes
    fixed, through the program's same launch and wait_and_take as a DeviceRun's. The inputs
    go straight from the interpreter's arrays (float or integer codes, as they are) to the
    device, with the variables' stale slots in the same put, and the outputs straight back
    into the interpreter's arrays, with one wait."""

    __slots__ = ("program", "partition", "puts", "ranges", "destinations")

    def __init__(self, program: Program, partition: Partition, puts: list, takes: list,
                 destinations: list):
        self.program, self.partition = program, partition
        # (offset, a flat view of the interpreter's array, made once, whether it is cast to
        # float32 per invoke): a float32 input goes as it is, codes are cast
        self.puts = [(offset, a.reshape(-1), a.dtype != np.float32) for offset, a in puts]
        self.ranges = [program.layout.range(t) for t in takes]
        self.destinations = destinations

    @classmethod
    def prepare(cls, program: Program, inputs: dict, outputs: dict) -> Optional["LeanRun"]:
        """The LeanRun that puts `inputs` (tensor -> the interpreter's array) and takes every
        output into `outputs`' arrays, where the schedule's one partition is all there is to
        run (the executor checks that its CPU steps have nothing left to do); None where an
        invoke needs the general path: inputs the host dequantizes or checks (ids) or that are
        not contiguous, outputs in another form than the interpreter's arrays, more than one
        partition."""
        partitions, layout = program.schedule.partitions, program.layout
        if len(partitions) != 1 or program._index_checks:
            return None
        specs, puts = program.graph.specs, []
        for t in layout.host_written:
            spec = specs[t]
            if t not in inputs or (t not in layout.codes and is_float_view(spec.dtype, spec.quantization)):
                return None
            if not inputs[t].flags.c_contiguous:    # its flat view would be a copy, made once
                return None
            puts.append((layout.offsets[t], inputs[t]))
        takes = [t for t in layout.host_read if t in outputs]
        if len(takes) != len(layout.host_read) or set(takes) != set(outputs):
            return None
        for t in takes:
            dtype, shape = program._host_forms[t]
            dest = outputs[t]
            if dest.dtype != dtype or dtype == np.bool_ or dest.shape != shape:
                return None
        return cls(program, partitions[0], puts, takes, [outputs[t] for t in takes])

    def __call__(self) -> None:
        program, f32 = self.program, np.float32
        program.begin_invoke()
        program.launch(self.partition, None, [(offset, flat.astype(f32) if cast else flat)
                                              for offset, flat, cast in self.puts])
        program.wait_and_take(self.ranges, self.destinations)


def _host_forms(graph, layout: IoLayout) -> dict:
    """What the host takes each tensor back as: its codes in the model's dtype, else its float
    view (float32, float16 or bool), and the shape it has."""
    return {t: (np.dtype(graph.specs[t].dtype if t in layout.codes else _host_dtype(graph.specs[t])),
                tuple(graph.specs[t].shape)) for t in layout.host_read}


def _host_dtype(spec):
    if spec.dtype == np.bool_:
        return np.bool_
    return np.float16 if spec.dtype == np.float16 else np.float32


def kernel_names(codes: list) -> list:
    """Each partition's kernels' names, in launch order (the names its modules hold)."""
    return [[f"p{i}_k{j}" for j in range(c.launches)] for i, c in enumerate(codes)]


def plan_digest(backend: str, fp16: bool, layout: IoLayout, codes: list) -> str:
    """What a program's kernels bake in, as a digest (its modules' cache key)."""
    parts = (backend, fp16, sorted(layout.offsets.items()), [c.digest_parts() for c in codes])
    return hashlib.sha256(repr(parts).encode()).hexdigest()


def tasks_per_invoke(kernels, codes: list):
    """Taichi tasks (GPU dispatches) per invoke, from the modules (None: not known, e.g. on
    Taichi's Python runtime, `kernels` None)."""
    counts = kernels.tasks if kernels is not None else {}
    names = sum(kernel_names(codes), [])
    if not names or any(n not in counts for n in names):
        return None
    return sum(counts[n] for n in names)


def planned_waits(schedule: Schedule, code_of: dict, host_read) -> int:
    """Host waits per invoke (without profiling): one before each CPU op that reads what a
    partition wrote since the last wait, and one at the end if anything ran since."""
    host_read, pending, launched, waits = set(host_read), set(), False, 0
    for item in schedule.items:
        if id(item) in code_of:                # a partition (known before its launches exist)
            launched = True
            pending.update(t for t in item.outputs if t in host_read)
        elif pending & set(item.op.inputs):
            waits, pending, launched = waits + 1, set(), False
    return waits + (1 if pending or launched else 0)


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


def _release(owned: _Owned) -> None:
    """Frees a program's device memory and module (weakref.finalize: also at collection, in any
    thread, so under TAICHI_LOCK; a GL device's frees wait for its own thread). A collection
    inside a device call of this thread (in the middle of a Vulkan submission of ours, whose
    fence and command buffers a release would wait on and free) waits for the next invoke."""
    device, buffers, links, modules = owned.device, owned.buffers, owned.links, owned.modules
    if device is None:                  # its device never started (a build in the background)
        return
    if not device.affinity.on_owner_thread() or device_mod.inside_device_call():
        device.affinity.defer(lambda: _release(owned))
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
