"""A subgraph's delegated partitions as one program on one device.

What `allocate_tensors()` builds for a Taichi backend, and what `invoke()` runs:

- **buffers, allocated once** (again only after a resize): one `io` buffer for every tensor
  that crosses a partition's edge (model inputs, CPU ops' results the GPU reads, partition
  outputs), one arena and one scratch buffer shared by the partitions (they run one after
  another), and each partition's weights, uploaded once. A tensor one partition writes and
  another reads stays in io, on the device; only what a CPU op or the caller reads comes back,
  through the device's host link (device.py);
- **kernels, compiled once per machine**: the partitions' kernels (codegen.py) as one Taichi
  AOT module in the cache (cache.py), loaded through Taichi's C API; a module that is not
  cached is compiled by Taichi's Python frontend, saved, then loaded the same way;
- **one wait per invoke**: every launch and copy of an invoke is enqueued, and the host waits
  once, before it reads the outputs, plus once before each CPU op that reads a partition's
  result (not more: everything pending is read back at that wait). `profile=True` waits after
  every partition instead, to time it.
"""
from __future__ import annotations

import contextlib
import contextvars
import hashlib
import os
import shutil
import tempfile
import threading
import time
import warnings
import weakref
from dataclasses import dataclass, field
from typing import Callable, Optional

import numpy as np

from tflite_taichi import capi, codegen
from tflite_taichi import device as device_mod
from tflite_taichi.device import TAICHI_LOCK
from tflite_taichi.errors import ModelError, TfliteTaichiError
from tflite_taichi.graph import PreparedGraph
from tflite_taichi.partition import Partition, Schedule, carried_index_inputs
from tflite_taichi.quant import is_float_view


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
    size: int = 1

    def range(self, t) -> tuple:
        return self.offsets[t], self.counts[t]


def io_layout(schedule: Schedule, graph: PreparedGraph, preserve_all: bool = False) -> IoLayout:
    """Host-written tensors first, then partition outputs the host reads, then those only
    partitions read, each at its own offset (a tensor is written once per invoke)."""
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
    layout.codes = _io_codes(graph, cpu_read=read_by_cpu,
                             candidates=(set(sg.inputs) & set(written)) | (set(sg.outputs) & on_device))
    for t in written + read + device_only:
        n = int(np.prod(graph.specs[t].shape, dtype=np.int64))
        layout.offsets[t], layout.counts[t] = at, n
        at += max(n, 1)
    layout.size = max(at, 1)
    return layout


def io_codes_enabled() -> bool:
    """TFLITE_TAICHI_IO_CODES=0: the model's quantized IO as real values, (de)quantized by numpy
    on the host (bench/'s A/B switch; the plan's digest tells the two apart)."""
    return os.environ.get("TFLITE_TAICHI_IO_CODES", "1").strip() != "0"


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


# -- compile progress ---------------------------------------------------------------------------
# A cold cache compiles every kernel (seconds to a minute); whoever asks (the CLI's progress bar)
# is told as each one is done. The library prints nothing itself. A context variable, not a
# global: interpreters built at the same time in other threads report to their own callers.
_compile_progress: contextvars.ContextVar = contextvars.ContextVar(
    "tflite_taichi_compile_progress", default=None)


@contextlib.contextmanager
def compile_progress(callback: Callable[[int, int], None]):
    """Within this block, every program whose kernels are compiled (not loaded from the cache)
    calls `callback(done, total)` with its kernel count: (0, total) before the first kernel
    compiles, then once after each. Each subgraph with delegated partitions is a program of its
    own (a WHILE's body, say) and reports its own count."""
    token = _compile_progress.set(callback)
    try:
        yield
    finally:
        _compile_progress.reset(token)


def _kernel_compiled_reporter(total: int) -> Callable[[], None]:
    """A function to call after each of `total` kernels compiles (a no-op when nobody asked)."""
    callback = _compile_progress.get()
    if callback is None or total <= 0:
        return lambda: None
    done = 0
    callback(done, total)

    def one_more():
        nonlocal done
        done += 1
        callback(done, total)
    return one_more


def _host_dtype(spec):
    if spec.dtype == np.bool_:
        return np.bool_
    return np.float16 if spec.dtype == np.float16 else np.float32


class Program:
    """The delegated partitions of one prepared subgraph, on one device."""

    def __init__(self, graph: PreparedGraph, schedule: Schedule, backend: str, fp16: bool,
                 model_cache=None, preserve_all: bool = False, background: bool = False):
        """background: kernels that are not cached are compiled (and, except on OpenGL/GLES,
        loaded) by a thread while the constructor returns at once; `adopt()` says when the
        program can run (the executor answers on the reference path until then)."""
        self.graph, self.schedule, self.backend, self.fp16 = graph, schedule, backend, fp16
        self.layout = io_layout(schedule, graph, preserve_all)
        # what the host takes each tensor back as: its codes in the model's dtype, else its
        # float view (float32, float16 or bool), and the shape it has
        self._host_forms = {t: (np.dtype(graph.specs[t].dtype if t in self.layout.codes
                                         else _host_dtype(graph.specs[t])),
                                tuple(graph.specs[t].shape)) for t in self.layout.host_read}
        if self.layout.size > codegen.MAX_BUFFER_ELEMENTS:
            raise ModelError(f"the tensors passed between the delegate's partitions and the host "
                             f"need {self.layout.size:,} float32 elements in one buffer; Taichi "
                             f"indexes buffers with 32-bit integers (at most "
                             f"{codegen.MAX_BUFFER_ELEMENTS:,}): use backend='reference' or "
                             "smaller shapes")
        self.codes = [codegen.plan(p, graph, backend, fp16, self.layout.offsets, self.layout.codes)
                      for p in schedule.partitions]
        self._code_of = {id(c.partition): c for c in self.codes}
        self._index_checks = _index_checks(schedule)
        self.cache_state = None                 # ('warm' | 'cold', reason) of the module
        self.waits = 0                          # of the last invoke
        self.build_s = 0.0
        self.compiled_in = None                 # where its kernels were compiled (cold), in words
        self._closed = False
        self._modules = []                      # modules of this program alone (no cache)
        self._buffers = []
        self._links = []                        # the host link, once the buffers exist
        self._pending = None                    # the background build, until adopt() takes it
        self.failed = None                      # the background build's exception, if it raised
        env = (lambda: _driver_env(model_cache)) if model_cache is not None else None
        self.device = device_mod.get(backend, env)
        self.device.affinity.check_thread("allocate_tensors()")
        self._link = None
        try:
            if background and self.device.kind == "capi":
                self._build_in_background(model_cache)
            else:
                self._build(model_cache)
        except BaseException:
            _release(self.device, self._buffers, self._links, self._modules)
            raise
        self._finalizer = weakref.finalize(self, _release, self.device, self._buffers,
                                           self._links, self._modules)

    def _build(self, model_cache) -> None:
        if self.device.kind == "capi":
            try:
                self._kernels = self._capi_kernels(model_cache)
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
        self._kernels = self._python_kernels()

    # -- kernels ------------------------------------------------------------------------------
    def plan_digest(self) -> str:
        parts = (self.backend, self.fp16, sorted(self.layout.offsets.items()),
                 [c.digest_parts() for c in self.codes])
        return hashlib.sha256(repr(parts).encode()).hexdigest()

    def kernel_names(self) -> list:
        return [[f"p{i}_k{j}" for j in range(c.launches)] for i, c in enumerate(self.codes)]

    def module_groups(self) -> list:
        """The program's kernels as the modules they are compiled and cached in: lists of
        (kernel name, code position, chunk position), split by weight (ops per kernel) into at
        most compile_workers.MODULE_GROUPS, so that worker processes compile them in parallel."""
        from tflite_taichi.runtime.compile_workers import kernel_groups
        kernels = [(name, i, j) for i, names in enumerate(self.kernel_names())
                   for j, name in enumerate(names)]
        weights = [len(self.codes[i].chunks[j]) + 1 for _, i, j in kernels]
        return [[kernels[k] for k in group] for group in kernel_groups(weights)]

    def _capi_kernels(self, model_cache) -> list:
        """The kernels through the C API: each module of module_groups() loaded from this
        process's earlier interpreters or from the cache, the others compiled (in worker
        processes, runtime/compile_workers.py), saved in the cache and loaded."""
        handles, missing, reason = self._find_modules(model_cache)
        if missing:
            handles.update(self._build_and_load(self._store(model_cache), missing))
        return self._settle(model_cache, handles, bool(missing), reason)

    @staticmethod
    def _store(model_cache):
        return model_cache.store if model_cache is not None else None

    def _find_modules(self, model_cache) -> tuple:
        """({kernel name: handle} of the modules found, [(key, group)] of those missing, why
        they are missing)."""
        store = self._store(model_cache)
        groups = self.module_groups()
        keys, reason = [None] * len(groups), "the cache is off (cache_dir=False)"
        if store is not None:
            shapes = {t: self.graph.specs[t].shape for t in self.graph.subgraph.inputs}
            base = model_cache.module_key(self.graph.subgraph.index, shapes, self.plan_digest())
            keys = [_group_key(base, g, len(groups)) for g in range(len(groups))]
            reason = model_cache.record_reason or "its kernels were not in the cache"
        self._module_tasks, handles, missing = {}, {}, []
        for key, group in zip(keys, groups):
            names = [name for name, _, _ in group]
            found, problem = self._loaded(store, key, names)
            if found is None:
                missing.append((key, group))
                reason = problem or reason
            else:
                handles.update(found)
        return handles, missing, reason

    def _settle(self, model_cache, handles: dict, built: bool, reason) -> list:
        """The cache's record of this program (warm, or cold and why) and its kernels in
        launch order."""
        self.cache_state = ("cold", reason) if built else ("warm", None)
        if model_cache is not None:
            model_cache.note(self.graph.subgraph.index, *self.cache_state)
        return [[handles[name] for name in names] for names in self.kernel_names()]

    # -- building in the background (Interpreter(answer_while_compiling=True)) -----------------
    def _build_in_background(self, model_cache) -> None:
        """The cached modules loaded now; the missing ones compiled by a thread (worker
        processes do the compiling), which also loads them and allocates the buffers, except on
        OpenGL/GLES, whose context lives in this thread: there adopt() loads them."""
        if self.device.llvm:
            # cuda/cpu: loading a module compiles its kernels' machine code (seconds each, warm
            # or cold), so the thread does all of it, cache lookups included
            pending = _Pending({}, [], None, model_cache, None)
            target = self._background_whole
        else:
            handles, missing, reason = self._find_modules(model_cache)
            if not missing:
                self._kernels = self._settle(model_cache, handles, False, reason)
                self._allocate()
                return
            pending = _Pending(handles, missing, reason, model_cache,
                               _kernel_compiled_reporter(sum(len(g) for _, g in missing)))
            target = self._background_build
        self._pending = pending
        context = contextvars.copy_context()        # compile_progress's callback, if any
        pending.thread = threading.Thread(target=context.run, args=(target, pending),
                                          name="tflite_taichi-compile", daemon=True)
        pending.thread.start()

    def _background_whole(self, pending: "_Pending") -> None:
        start = time.perf_counter()
        try:
            if not self._closed:
                self._kernels = self._capi_kernels(pending.model_cache)
                self._allocate()
                pending.finished = True
                if self._closed:        # closed meanwhile: what was made goes too
                    _release(self.device, self._buffers, self._links, self._modules)
        except BaseException as e:      # kept for adopt() and wait_for_kernels()
            pending.error = e
        finally:
            pending.seconds = time.perf_counter() - start
            pending.done.set()

    def _background_build(self, pending: "_Pending") -> None:
        start = time.perf_counter()
        try:
            store = self._store(pending.model_cache)
            pending.saved = self._compile(store, pending.missing, pending.folders,
                                          lambda _name: pending.compiled())
            if self.device.affinity.owner is None and not self._closed:   # not GL: load here
                self._finish(pending)
                if self._closed:        # closed meanwhile: what _finish made goes too
                    _release(self.device, self._buffers, self._links, self._modules)
        except BaseException as e:      # kept for adopt() and wait_for_kernels()
            pending.error = e
        finally:
            pending.seconds = time.perf_counter() - start
            pending.done.set()

    def _finish(self, pending: "_Pending") -> None:
        """Load what the background compile saved, settle the cache's record, allocate."""
        try:
            store = self._store(pending.model_cache)
            pending.handles.update(self._load_compiled(store, pending.missing, pending.saved,
                                                       pending.folders))
        finally:
            pending.folders.close()
        self._kernels = self._settle(pending.model_cache, pending.handles, True, pending.reason)
        self._allocate()
        pending.finished = True

    @property
    def ready(self) -> bool:
        """Whether invoke() runs this program (its kernels loaded, its buffers allocated)."""
        return self._pending is None and self.failed is None

    @property
    def compiling(self) -> bool:
        return self._pending is not None

    def adopt(self, timeout: Optional[float] = 0.0) -> bool:
        """True when the program can run; else False (still compiling after `timeout` seconds,
        None: as long as it takes, or its background build failed: `failed` holds why, warned
        once). On OpenGL/GLES the modules compiled in the background are loaded here, in the
        context's thread."""
        pending = self._pending
        if pending is None:
            return self.failed is None
        if not pending.done.wait(timeout):
            return False
        self._pending = None
        if self.cache_state is not None and self.cache_state[0] == "cold":
            self.build_s = self.build_s or pending.seconds      # a warm load builds nothing
        if pending.error is None and not pending.finished:
            try:
                self._finish(pending)
            except BaseException as e:
                pending.error = e
        else:
            pending.folders.close()
        if pending.error is not None:
            self.failed = pending.error
            warnings.warn(f"tflite_taichi: compiling this model's kernels failed "
                          f"({type(pending.error).__name__}: {pending.error}); its invokes run on "
                          "the reference path (numpy)", RuntimeWarning, stacklevel=4)
            return False
        return True

    def _loaded(self, store, key, names) -> tuple:
        """({kernel name: handle}, None) for the module KEY, from this process's earlier
        interpreters or from the cache; (None, why not) or (None, None) where it is not there."""
        d = self.device
        if key is None:
            return None, None
        if d.has_module(key):           # loaded by an earlier interpreter of this process
            module = d.shared_module(key, None)
            self._module_tasks.update(d.module_info.get(key, {}))
            return {name: d.kernel(module, name) for name in names}, None
        return self._load_cached(store, key, names)

    def _load_cached(self, store, key: str, names) -> tuple:
        """({name: kernel}, None) from the cached module KEY, loaded from what was checked
        (cache.py: its descriptors, under the cache's shared lock); (None, why not) otherwise."""
        d = self.device
        refused = None
        with store.opened(key, d.arch) as (found, problem):
            if found is None:
                return None, problem
            tasks = found.meta.get("tasks") or {}
            try:
                module = d.shared_module(key, found.path, found.data)
                kernels = {name: d.kernel(module, name) for name in names}
            except capi.CapiError as e:
                d.forget_module(key)
                refused = e
        if refused is not None:        # removed outside the shared lock (removal takes it whole)
            store.reject(key, f"the C API refused it: {refused}")
            return None, f"the cached module did not load ({refused})"
        d.module_info[key] = tasks
        self._module_tasks.update(tasks)
        return kernels, None

    def _build_and_load(self, store, missing: list) -> dict:
        """Compile the modules `missing` ((key, group)), save them as AOT modules (in the cache,
        or in temporary folders when it is off) and load them through the C API. {name: kernel}."""
        start = time.perf_counter()
        compiled = _kernel_compiled_reporter(sum(len(group) for _, group in missing))
        with contextlib.ExitStack() as folders:
            saved = self._compile(store, missing, folders, lambda _name: compiled())
            handles = self._load_compiled(store, missing, saved, folders)
        self.build_s = time.perf_counter() - start
        return handles

    def _compile(self, store, missing: list, folders: contextlib.ExitStack, compiled) -> list:
        """Compile the modules `missing` with Taichi's Python frontend, in worker processes where
        they can take them (no C API call: any thread may run this), each into a folder of its
        own that `folders` removes; [(folder, the module's file or folder in it)]."""
        from tflite_taichi import backend as ti_backend
        from tflite_taichi.runtime import compile_workers
        d = self.device
        caps = [] if d.llvm else d.capabilities()
        off = set(filter(None, os.environ.get("TFLITE_TAICHI_SPIRV_CAPS_OFF", "").split(",")))
        caps = [c for c in caps if c.split("=", 1)[0] not in off]   # an A/B switch (README)
        made = [folders.enter_context(store.building() if store is not None else _temporary_folder())
                for _ in missing]
        modules = [(g, folder, group) for g, (folder, (_, group)) in enumerate(zip(made, missing))]
        saved, self.compiled_in = compile_workers.build_modules(
            self.codes, modules, self.backend, caps, d.llvm, ti_backend.cache_root(), compiled)
        return [(made[g], saved[g]) for g in range(len(missing))]

    def _load_compiled(self, store, missing: list, saved: list, folders) -> dict:
        """Load each module just compiled from the folder it was built in, before it is
        committed to the cache: what this process runs is what was written, whatever happens to
        modules/KEY later. {name: kernel}."""
        d = self.device
        handles = {}
        for (key, group), (folder, rel) in zip(missing, saved):
            path = os.path.join(folder, rel)
            tasks = codegen.module_tasks(path, d.llvm)
            names = [name for name, _, _ in group]
            module = d.shared_module(key, path) if key is not None else d.load_module(path)
            handles.update({name: d.kernel(module, name) for name in names})
            if key is None:
                self._modules.append(module)    # this program's alone: destroyed with it
            else:
                store.commit(key, folder, rel, d.arch, {
                    "subgraph": self.graph.subgraph.index, "backend": self.backend,
                    "precision": "fp16" if self.fp16 else "fp32", "kernels": names,
                    "tasks": tasks})
                d.module_info[key] = tasks
            self._module_tasks.update(tasks)
        return handles

    @property
    def tasks(self):
        """Taichi tasks (GPU dispatches) per invoke, from the module (None: not known, e.g. on
        the Python runtime)."""
        counts = getattr(self, "_module_tasks", None) or {}
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
        arena = max((c.plan.arena_size for c in self.codes), default=1)
        scratch = max((c.plan.scratch_size for c in self.codes), default=1)
        self.arena = self._buffer(d.allocate(arena, storage))
        self.scratch = self._buffer(d.allocate(scratch, "f32"))
        self.io = self._buffer(d.allocate(self.layout.size, "f32"))
        self._link = d.link(self.io)
        self._links.append(self._link)
        self.weights, self._launches = [], []
        for code, kernels in zip(self.codes, self._kernels):
            w = self._buffer(d.allocate(max(code.plan.weights.size, 1), storage))
            d.fill(w, code.plan.weights)
            self.weights.append(w)
            self._launches.append([d.launcher(k, (self.arena, w, self.io, self.scratch))
                                   for k in kernels])
        self._launch_of = {id(c.partition): ls for c, ls in zip(self.codes, self._launches)}

    def _buffer(self, b):
        self._buffers.append(b)
        return b

    def _compile_by_launching(self) -> None:
        """Python device: compile every kernel now, in allocate_tensors(), as TFLite's GPU
        delegate builds its programs there, not in the first invoke (one launch on the zeroed
        buffers, whose results nobody reads)."""
        with TAICHI_LOCK, codegen.intended_unrolling():
            compiled = _kernel_compiled_reporter(self.launches)
            for launches in self._launches:
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

    def run(self, values: dict, run_cpu_step, timings: Optional[dict] = None,
            into: Optional[dict] = None) -> dict:
        """Run the schedule: partitions on the device, CPU steps through `run_cpu_step(step,
        values)` (which stores its outputs in values). `values` holds the constants and feeds:
        real values (float views), except the tensors in `layout.codes`, which come and go as
        integer codes in the model's dtype. `into`: tensor -> a host array to take it into when
        it has the tensor's shape and host dtype (the interpreter's output arrays): values[t]
        is then that array."""
        layout, link, d = self.layout, self._link, self.device
        d.affinity.check_thread("invoke()")
        self.waits = 0
        host_forms, into = self._host_forms, into or {}     # host_forms: the tensors it reads
        pending, launched = [], False

        def put(tensors):
            for t in tensors:       # int32 ids the kernels read: refused values raise here
                for check in self._index_checks.get(t, ()):
                    check(values[t])
            items = [(layout.offsets[t], np.asarray(values[t], dtype=np.float32).reshape(-1))
                     for t in tensors]
            link.put(items)

        def destination(t):
            dest = into.get(t)
            dtype, shape = host_forms[t]
            if dest is None or dest.dtype != dtype or dtype == np.bool_ or dest.shape != shape:
                return None
            return dest

        def take_pending():
            nonlocal launched
            ranges = [layout.range(t) for t in pending]
            with TAICHI_LOCK:
                link.request(ranges)
                d.wait()
            self.waits += 1
            launched = False
            for t, flat in zip(pending, link.take(ranges, [destination(t) for t in pending])):
                dtype, shape = host_forms[t]
                value = flat.reshape(shape)
                values[t] = value > 0.5 if dtype == np.bool_ else value.astype(dtype, copy=False)
            pending.clear()

        written = set(layout.host_written)
        put([t for t in layout.host_written if t in values])
        for position, item in enumerate(self.schedule.items):
            start = time.perf_counter() if timings is not None else 0.0
            launches = self._launch_of.get(id(item))
            if launches is not None:
                with TAICHI_LOCK:
                    for launch in launches:
                        launch()
                launched = True
                pending.extend(t for t in item.outputs if t in host_forms)
                if timings is not None:         # profiling: wait, so the time is the partition's
                    if pending:
                        take_pending()
                    else:
                        d.wait()
                        self.waits += 1
                        launched = False
            else:
                if any(t in pending for t in item.op.inputs):
                    take_pending()
                run_cpu_step(item, values)
                put([t for t in item.op.outputs if t in written])
            if timings is not None:
                timings.setdefault(position, []).append(time.perf_counter() - start)
        if pending:
            take_pending()
        elif launched:                  # nothing to read, but the device must be idle before the
            d.wait()                    # next invoke writes the upload buffer again
            self.waits += 1
        return values

    # -- lifetime -----------------------------------------------------------------------------
    def close(self) -> None:
        """Free the device buffers and the module now (also done when the program is collected).
        A background build still running finishes its compile (the cache keeps it) and loads
        nothing more."""
        if not self._closed:
            self._closed = True
            pending = self._pending
            if pending is not None and pending.done.is_set() and not pending.finished:
                pending.folders.close()
            self._finalizer()


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
    thread, so under TAICHI_LOCK; a GL device's frees wait for its own thread)."""
    if not device.affinity.on_owner_thread():
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


class _Pending:
    """A program's build in the background: what was found, what its thread compiles, and how
    it ended."""

    def __init__(self, handles: dict, missing: list, reason, model_cache, compiled):
        self.handles, self.missing, self.reason = handles, missing, reason
        self.model_cache, self.compiled = model_cache, compiled
        self.folders = contextlib.ExitStack()   # the build folders, until loaded or given up
        self.saved = None                       # [(folder, module file or folder)]
        self.error = None                       # what the build raised
        self.finished = False                   # loaded and allocated
        self.seconds = 0.0
        self.done = threading.Event()
        self.thread = None


def _group_key(base: str, group: int, groups: int) -> str:
    """The cache key of module `group` of `groups` of the program keyed `base`."""
    return hashlib.sha256(f"{base} module {group} of {groups}".encode()).hexdigest()


@contextlib.contextmanager
def _temporary_folder():
    folder = tempfile.mkdtemp(prefix="tflite_taichi-")
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _driver_env(model_cache):
    from tflite_taichi.cache import driver_env
    return driver_env(model_cache.root)
