"""Getting one program's kernels through Taichi's C API: cache lookup, compile workers, AOT
load, and the background build behind Interpreter(answer_while_compiling=True),
so that a start never waits on kernels it can answer without.

A program's kernels (codegen: one per chunk of a partition, named `p{partition}_k{chunk}`) live
in up to compile_workers.MODULE_GROUPS AOT modules, each cached under its own key (cache.py).
`ProgramKernels.get()` returns every kernel's handle, in launch order: each module from this
process's earlier interpreters (device.shared_module), else from the cache (checked on the
descriptors it is read from), else compiled by worker processes, saved, loaded from the folder
it was built in and only then committed to the cache. `start()` does the same in the
background: it loads what is cached and returns; a thread has the rest compiled and (except on
OpenGL/GLES, whose context lives in the caller's thread) loaded, and `adopt()` hands the
kernels over when they are there. On cuda and cpu, loading a module compiles its machine code
(seconds per kernel), so there the thread does everything, cache lookups included.

What a program does with its kernels (buffers, launches, the one wait per invoke) is
delegate.py's; the fallback to Taichi's Python runtime when the C API refuses a module is too.
"""
from __future__ import annotations

import contextlib
import contextvars
import functools
import hashlib
import os
import shutil
import tempfile
import threading
import time
import warnings
from typing import Callable, Optional

from tflite_taichi import switches
from tflite_taichi.runtime import capi

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
    own (a WHILE's body, say) and reports its own count. A build in the background reports from
    its thread."""
    token = _compile_progress.set(callback)
    try:
        yield
    finally:
        _compile_progress.reset(token)


def kernel_compiled_reporter(total: int) -> Callable[[], None]:
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


class ProgramKernels:
    """One program's kernels on a C API device (see the module docstring).

    `names`: the kernels' names per partition, in launch order; `codes`: the partitions'
    codegen.PartitionCode (what a compile needs); `plan_digest`: what the kernels bake in;
    `own_modules`: the program's list of modules to destroy with it (those not cached)."""

    def __init__(self, device, codes: list, names: list, backend: str, fp16: bool,
                 subgraph: int, input_shapes: dict, plan_digest: str, model_cache,
                 own_modules: list):
        self.device, self.codes, self.names = device, codes, names
        self.backend, self.fp16, self.subgraph = backend, fp16, subgraph
        self.model_cache = model_cache
        self.store = model_cache.store if model_cache is not None else None
        self.own_modules = own_modules
        self.keys, self.groups = self._modules(input_shapes, plan_digest)
        self.cache_state = None         # ('warm' | 'cold', reason)
        self.build_s = 0.0
        self.compiled_in = None         # where they were compiled (cold), in words
        self.tasks = {}                 # {kernel name: Taichi tasks} from the modules
        self.failed = None              # what a background build raised
        self._pending = None            # the background build, until adopt() takes it

    # -- which modules ---------------------------------------------------------------------
    def _modules(self, input_shapes: dict, plan_digest: str) -> tuple:
        """The modules' cache keys (None: the cache is off) and kernels: lists of (name, code
        position, chunk position), split by weight (ops per kernel) into at most
        compile_workers.MODULE_GROUPS, so that worker processes compile them in parallel."""
        from tflite_taichi.runtime.compile_workers import kernel_groups
        kernels = [(name, i, j) for i, names in enumerate(self.names) for j, name in enumerate(names)]
        weights = [len(self.codes[i].chunks[j]) + 1 for _, i, j in kernels]
        groups = [[kernels[k] for k in group] for group in kernel_groups(weights)]
        keys = [None] * len(groups)
        if self.store is not None:
            base = self.model_cache.module_key(self.subgraph, input_shapes, plan_digest)
            keys = [_group_key(base, g, len(groups)) for g in range(len(groups))]
        return keys, groups

    # -- at once -----------------------------------------------------------------------------
    def get(self) -> list:
        """Every kernel's handle, in launch order, compiling what is not cached."""
        handles, missing, reason = self._find()
        if missing:
            start = time.perf_counter()
            compiled = kernel_compiled_reporter(sum(len(group) for _, group in missing))
            with contextlib.ExitStack() as folders:
                saved = self._compile(missing, folders, lambda _name: compiled())
                handles.update(self._load_compiled(missing, saved))
            self.build_s = time.perf_counter() - start
        return self._settle(handles, bool(missing), reason)

    def _find(self) -> tuple:
        """({kernel name: handle} of the modules found, [(key, group)] of those missing, why
        they are missing)."""
        reason = ("the cache is off (cache_dir=False)" if self.store is None else
                  self.model_cache.record_reason or "its kernels were not in the cache")
        handles, missing = {}, []
        for key, group in zip(self.keys, self.groups):
            found, problem = self._loaded(key, [name for name, _, _ in group])
            if found is None:
                missing.append((key, group))
                reason = problem or reason
            else:
                handles.update(found)
        return handles, missing, reason

    def _settle(self, handles: dict, built: bool, reason) -> list:
        """The cache's record of this program (warm, or cold and why) and its kernels in
        launch order."""
        self.cache_state = ("cold", reason) if built else ("warm", None)
        if self.model_cache is not None:
            self.model_cache.note(self.subgraph, *self.cache_state)
        return [[handles[name] for name in names] for names in self.names]

    def _loaded(self, key, names) -> tuple:
        """({kernel name: handle}, None) for the module KEY, from this process's earlier
        interpreters or from the cache; (None, why not) or (None, None) where it is not there."""
        d = self.device
        if key is None:
            return None, None
        if d.has_module(key):           # loaded by an earlier interpreter of this process
            module = d.shared_module(key, None)
            self.tasks.update(d.module_info.get(key, {}))
            return {name: d.kernel(module, name) for name in names}, None
        return self._load_cached(key, names)

    def _load_cached(self, key: str, names) -> tuple:
        """({name: kernel}, None) from the cached module KEY, loaded from what was checked
        (cache.py: its descriptors, under the cache's shared lock); (None, why not) otherwise."""
        d = self.device
        refused = None
        with self.store.opened(key, d.arch) as (found, problem):
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
            self.store.reject(key, f"the C API refused it: {refused}")
            return None, f"the cached module did not load ({refused})"
        d.module_info[key] = tasks
        self.tasks.update(tasks)
        return kernels, None

    def _compile(self, missing: list, folders: contextlib.ExitStack, compiled) -> list:
        """Compile the modules `missing` with Taichi's Python frontend, in worker processes where
        they can take them (no C API call: any thread may run this), each into a folder of its
        own that `folders` removes; [(folder, the module's file or folder in it)]."""
        from tflite_taichi.runtime import compile_workers, session
        d = self.device
        caps = [] if d.llvm else d.capabilities()
        off = switches.value("TFLITE_TAICHI_SPIRV_CAPS_OFF")
        caps = [c for c in caps if c.split("=", 1)[0] not in off]   # an A/B switch (README)
        made = [folders.enter_context(self.store.building() if self.store is not None
                                      else _temporary_folder()) for _ in missing]
        modules = [(g, folder, group) for g, (folder, (_, group)) in enumerate(zip(made, missing))]
        saved, self.compiled_in = compile_workers.build_modules(
            self.codes, modules, self.backend, caps, d.llvm, session.cache_root(), compiled)
        return [(made[g], saved[g]) for g in range(len(missing))]

    def _load_compiled(self, missing: list, saved: list) -> dict:
        """Load each module just compiled from the folder it was built in, before it is
        committed to the cache: what this process runs is what was written, whatever happens to
        modules/KEY later. {name: kernel}."""
        from tflite_taichi import codegen
        d = self.device
        handles = {}
        for (key, group), (folder, rel) in zip(missing, saved):
            path = os.path.join(folder, rel)
            tasks = codegen.module_tasks(path, d.llvm)
            names = [name for name, _, _ in group]
            module = d.shared_module(key, path) if key is not None else d.load_module(path)
            handles.update({name: d.kernel(module, name) for name in names})
            if key is None:
                self.own_modules.append(module)   # the program's alone: destroyed with it
            else:
                self.store.commit(key, folder, rel, d.arch, {
                    "subgraph": self.subgraph, "backend": self.backend,
                    "precision": "fp16" if self.fp16 else "fp32", "kernels": names,
                    "tasks": tasks})
                d.module_info[key] = tasks
            self.tasks.update(tasks)
        return handles

    # -- in the background ------------------------------------------------------------------
    def start(self, install: Callable[[list], None], closed: Callable[[], bool],
              release: Callable[[], None], device: Optional[Callable[[], object]] = None) -> None:
        """Begin getting the kernels without waiting for a compile: `install(kernels)` runs when
        they are there: here (all cached, not cuda/cpu), in the thread (not OpenGL/GLES), or in
        adopt(). `closed()` says the program was closed meanwhile (then nothing more is
        loaded, and `release()` frees what the thread made after the program's own release).
        `device`: the device is not started yet; the thread gets it from this call first and
        then does everything (a GPU runtime's start, 0.7-1.4 s on an H100, is off the first
        result too)."""
        if device is not None or self.device.llvm:
            pending = _Pending({}, [], None, None)
            target = functools.partial(self._whole_in_background, device=device)
        else:
            handles, missing, reason = self._find()
            if not missing:
                install(self._settle(handles, False, reason))
                return
            pending = _Pending(handles, missing, reason,
                               kernel_compiled_reporter(sum(len(g) for _, g in missing)))
            target = self._compile_in_background
        pending.install, pending.closed, pending.release = install, closed, release
        self._pending = pending
        context = contextvars.copy_context()        # compile_progress's callback, if any
        pending.thread = threading.Thread(target=context.run, args=(target, pending),
                                          name="tflite_taichi-compile", daemon=True)
        pending.thread.start()

    def _whole_in_background(self, pending: "_Pending", device=None) -> None:
        with pending.running():
            if device is not None and not pending.closed():
                self.device = device()
            if not pending.closed():
                self._install(pending, self.get())

    def _compile_in_background(self, pending: "_Pending") -> None:
        with pending.running():
            pending.saved = self._compile(pending.missing, pending.folders,
                                          lambda _name: pending.compiled())
            if self.device.affinity.owner is None and not pending.closed():   # not GL: load here
                self._finish(pending)

    def _finish(self, pending: "_Pending") -> None:
        """Load what the background compile saved, settle the cache's record, install."""
        try:
            pending.handles.update(self._load_compiled(pending.missing, pending.saved))
        finally:
            pending.folders.close()
        self._install(pending, self._settle(pending.handles, True, pending.reason))

    @staticmethod
    def _install(pending: "_Pending", kernels: list) -> None:
        pending.install(kernels)
        pending.finished = True
        if pending.closed():            # closed meanwhile: what was just made goes too
            pending.release()

    @property
    def compiling(self) -> bool:
        return self._pending is not None

    def adopt(self, timeout: Optional[float] = 0.0) -> bool:
        """True when the kernels are installed; else False (still compiling after `timeout`
        seconds, None: as long as it takes; or the background build failed: `failed` holds
        why, warned once). On OpenGL/GLES the modules compiled in the background are loaded
        and installed here, in the context's thread."""
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
            warnings.warn(f"tflite_taichi: getting this model's kernels ready on {self.backend} "
                          f"failed ({type(pending.error).__name__}: {pending.error}); its invokes run on "
                          "the CPU (LiteRT's kernels, or numpy where LiteRT cannot run the model)",
                          RuntimeWarning, stacklevel=5)
            return False
        return True

    def abandon(self) -> None:
        """The program is closed: build folders the thread left for adopt() go."""
        pending = self._pending
        if pending is not None and pending.done.is_set() and not pending.finished:
            pending.folders.close()

    @property
    def thread(self) -> Optional[threading.Thread]:
        return self._pending.thread if self._pending is not None else None


class _Pending:
    """A background build: what was found, what its thread compiles, and how it ended."""

    def __init__(self, handles: dict, missing: list, reason, compiled):
        self.handles, self.missing, self.reason, self.compiled = handles, missing, reason, compiled
        self.folders = contextlib.ExitStack()   # the build folders, until loaded or given up
        self.saved = None                       # [(folder, module file or folder)]
        self.error = None                       # what the build raised
        self.finished = False                   # installed
        self.seconds = 0.0
        self.done = threading.Event()
        self.thread = self.install = self.closed = self.release = None

    @contextlib.contextmanager
    def running(self):
        """The thread's body: its exception kept for adopt(), its time, done set at the end."""
        start = time.perf_counter()
        try:
            yield
        except BaseException as e:      # kept for adopt() and wait_for_kernels()
            self.error = e
        finally:
            self.seconds = time.perf_counter() - start
            self.done.set()


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
