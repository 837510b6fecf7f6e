"""The tf.lite-compatible Interpreter.

Same methods, arguments and detail dictionaries as `ai_edge_litert.interpreter.Interpreter`,
so code written for LiteRT runs unchanged. Quantized models keep their own IO dtypes (int8 in,
int8 out); inside, they run as a float view (see `quant`).
"""
from __future__ import annotations

import dataclasses
import functools
import sys
import threading
import time
import warnings
from typing import Optional

import numpy as np

from tflite_taichi import graph as graph_mod
from tflite_taichi import threads
from tflite_taichi.errors import (BackendUnavailable, InputError, InterpreterStateError,
                                  TfliteTaichiError)
from tflite_taichi.executor import (DelegateOptions, ModelRuntime, SubgraphState, init_subgraphs,
                                    kernels_state)
from tflite_taichi.model import read_model
from tflite_taichi.quant import model_kind

BACKENDS = ("auto", "litert", "reference", "vulkan", "metal", "opengl", "gles", "cuda", "cpu")
# backends that run no Taichi: nothing of Taichi's is imported or started for them
HOST_BACKENDS = ("reference", "litert")
PRECISIONS = ("fp32", "fp16")


def _resolve_backend(backend: str, precision: str, cache_root: Optional[str] = None,
                     at_a_glance: bool = False) -> str:
    """The backend this interpreter runs on: 'reference', 'litert' or a Taichi arch (its
    device is started by backend.ensure_runtime, once the cache folder is known). `auto`
    without a hardware GPU: 'litert' where LiteRT is installed (the Interpreter falls back to
    Taichi's 'cpu' if LiteRT refuses the model), else 'cpu'. at_a_glance: see
    backend.choose_auto (the interpreter answers on LiteRT while the GPU gets ready)."""
    if backend not in BACKENDS:
        raise BackendUnavailable(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    if precision not in PRECISIONS:
        raise BackendUnavailable(f"unknown precision {precision!r}; choose 'fp32' or 'fp16'")
    if backend == "reference":
        if precision != "fp32":
            raise BackendUnavailable("precision='fp16' needs a Taichi backend (cuda, vulkan or cpu); "
                                     "the reference path is fp32")
        return "reference"
    from tflite_taichi import litert_cpu
    if backend == "litert":
        if precision != "fp32":
            raise BackendUnavailable("precision='fp16' needs a Taichi backend (cuda, vulkan or cpu); "
                                     "LiteRT's CPU kernels run fp32")
        if not litert_cpu.available():
            raise BackendUnavailable(f"backend 'litert' needs LiteRT's Python package: "
                                     f"{litert_cpu.INSTALL_HINT}")
        return "litert"
    from tflite_taichi import backend as ti_backend
    if backend == "auto":
        backend = ti_backend.current() or ti_backend.choose_auto(cache_root, at_a_glance)
        if backend == "cpu" and precision == "fp32" and litert_cpu.available():
            return "litert"     # no hardware GPU: TFLite's own CPU kernels
    ti_backend.check_driver(backend)
    if precision == "fp16" and backend not in ti_backend.FP16_BACKENDS:
        raise BackendUnavailable(f"precision='fp16' is not available on {backend}: Taichi's "
                                 "OpenGL/GLES path has no 16-bit storage; use cuda, vulkan or cpu")
    return backend


def _answers_while_compiling_by_default(requested: str, resolved: str) -> bool:
    """`auto` on a GPU, with LiteRT to answer meanwhile: a cold compile (seconds to minutes) or
    a warm cuda load (seconds) no longer holds up the first result."""
    from tflite_taichi import litert_cpu
    return requested == "auto" and resolved not in HOST_BACKENDS + ("cpu",) and litert_cpu.available()


def _capi_runtime() -> bool:
    """Whether Taichi's C API runs the kernels (device.runtime_kind, without importing it)."""
    from tflite_taichi import switches
    try:
        return switches.value("TFLITE_TAICHI_RUNTIME") == "capi"
    except InputError:              # a bad TFLITE_TAICHI_RUNTIME: the backend's start says so
        return False


def _device_starts_later(backend: str) -> bool:
    """Whether the programs' build threads may start `backend`'s device (program_builder)."""
    from tflite_taichi.program_builder import starts_in_background
    return starts_in_background(backend)


class _BackendStart(threading.Thread):
    """The cache folder (CacheError if unsafe: it remembers auto's probes), the backend resolved
    and its C API runtime started (device.start_early), in a thread beside the model's read:
    each took about 0.2 s of a 0.5 s warm start on the 2-core machine, and the runtime's start
    is C code that runs while Python parses. The backend is claimed afterwards, by
    ensure_runtime in the constructing thread, once the model has been read.
    `auto` (`device_verdict`): the runtime starts only once the constructing thread says the
    model needs it (start_device): a model `auto` runs on LiteRT from the start needs none, and
    a GPU's runtime takes 0.4 s to start (cuda, the H200), most of such a model's first result.
    Where the interpreter answers on the CPU while its kernels get ready, nobody waits for the
    start (finish(wait=False)): the programs' build threads do."""

    def __init__(self, backend: str, precision: str, cache_dir, device_verdict: bool = False,
                 at_a_glance: bool = False):
        super().__init__(name="tflite_taichi-backend-start", daemon=True)
        self._args = backend, precision, cache_dir, at_a_glance
        self._result, self._error = None, None
        self._resolved = threading.Event()
        self._verdict = threading.Event()
        self._device_wanted = True
        if not device_verdict:
            self._verdict.set()
        self.start()

    def run(self) -> None:
        backend, precision, cache_dir, at_a_glance = self._args
        try:
            from tflite_taichi.runtime import cache
            cache_root = cache.root_for(cache_dir) if backend != "reference" else None
            resolved = _resolve_backend(backend, precision, cache_root, at_a_glance)
            self._result = cache_root, resolved
        except BaseException as e:      # re-raised in the constructing thread by result()
            self._error = e
            return
        finally:
            self._resolved.set()
        if resolved in HOST_BACKENDS:
            return
        self._verdict.wait()
        if not self._device_wanted:
            return
        try:
            from tflite_taichi import backend as ti_backend
            from tflite_taichi.runtime import device
            if ti_backend.current() in (None, resolved):
                device.start_early(resolved, lambda: cache.driver_env(cache_root))
        except BaseException as e:
            self._error = e

    def result(self):
        """(cache root, backend), once resolved (the runtime may still be starting)."""
        self._resolved.wait()
        if self._error is not None:
            raise self._error
        return self._result

    def finish(self, start_device: bool, wait: bool = True) -> None:
        """Says whether the runtime is wanted (where the thread waits to know) and waits for the
        thread; an error it met starting the runtime is raised where it was wanted (a model
        error, met before, wins over the backend's). wait=False: the runtime goes on starting
        while the interpreter answers on the CPU; the first program to need it waits for it
        (device.get_capi, in its build thread) and meets its refusal there."""
        self._device_wanted = start_device
        self._verdict.set()
        if not wait:
            return
        self.join()
        if start_device and self._error is not None:
            raise self._error


# tensor types without a numpy form of their data, as LiteRT's details name them (its
# TfLiteTypeToPyArrayType): a handle or a variant is a Python object, a string bytes
_DETAILS_TYPES = {"STRING": np.bytes_, "COMPLEX128": np.complex128, "RESOURCE": np.object_,
                  "VARIANT": np.object_}


def _litert_factory(first, data: bytes, budget: int, preserve_all: bool = False):
    """() -> a litert_cpu.LiteRTModel of `data`: `first` (one already made, or None) at the
    first call, a fresh one at each call after."""
    made = [first] if first is not None else []

    def model():
        from tflite_taichi.litert_cpu import LiteRTModel
        return made.pop() if made else LiteRTModel(data, budget, preserve_all)
    return model


def _median_ms(seconds: list):
    return float(np.median(seconds)) * 1e3 if seconds else None


def _invoked_shape(state, t, declared):
    """A tensor of run-time shape: the last invoke's shape once it has run (an output's, or an
    intermediate's the run kept), as LiteRT reports it; until then the declared one, as LiteRT."""
    if not state.invoked:
        return declared
    if t in state.io:
        return state.io_shape(t)
    value = state.values.get(t)
    return np.shape(value) if value is not None else declared


def _details_dtype(tensor):
    if tensor.dtype is not None:
        return tensor.dtype.type
    return _DETAILS_TYPES.get(tensor.type_name)


def _sparsity_details(tensor) -> dict:
    """As LiteRT's 'sparsity_parameters': {} for a dense tensor; 'block_map' only when the file
    stores that (optional) vector, as LiteRT copies the file's fields as they are."""
    if tensor.sparsity is None:
        return {}
    details = tensor.sparsity.details()
    if not tensor.block_map_stored:
        del details["block_map"]
    return details


def _as_shape(value) -> Optional[tuple]:
    """A shape from what resize_tensor_input was given: integers, or floats with integer values
    (LiteRT truncates 1.5 to 1; we refuse it); None if it is not one."""
    try:
        dims = np.asarray(value).reshape(-1).tolist()
    except (TypeError, ValueError, OverflowError):
        return None
    shape = []
    for d in dims:
        if isinstance(d, float) and d.is_integer():
            d = int(d)
        if not isinstance(d, int) or isinstance(d, bool):
            return None
        shape.append(d)
    return tuple(shape)


def _vulkan_info(device) -> dict:
    """A C API Vulkan device's physical device, how the host waits and the clock boost
    (vulkan_host.py); nothing for other devices."""
    if getattr(device, "arch", None) != "vulkan" or getattr(device, "kind", None) != "capi":
        return {}
    return {"vulkan_device": repr(device.vulkan_device) if device.vulkan_device else None,
            "host_wait": "fence" if device.uses_fence else "ti_wait",
            "submit": device.submit_note,
            "perf_boost": device.perf_boost}


def _serialised(method):
    """Holds the interpreter's lock for the call: calls from several threads run one at a time,
    each whole (docs/errors.md, "Threads and processes")."""
    @functools.wraps(method)
    def locked(self, *args, **kwargs):
        with self._lock:
            return method(self, *args, **kwargs)
    return locked


# resize_tensor_input: dimensions are int32 in TFLite (LiteRT refuses larger ones with an
# OverflowError), and numpy arrays have at most 64 dimensions
MAX_DIM = 2**31 - 1
MAX_RANK = 64


class Interpreter:
    """Runs a .tflite model. See the README for the backends, docs/quantization.md for the float
    view of 8-bit models.

    Thread-safe: every method takes the interpreter's lock, so calls from several threads run
    one at a time, each as if alone (a SignatureRunner call, inputs to outputs, is one such
    call). The live views `tensor(i)()` returns are not locked."""

    def __init__(self, model_path=None, model_content=None, experimental_delegates=None,
                 num_threads: Optional[int] = None, experimental_op_resolver_type=None,
                 experimental_preserve_all_tensors: bool = False,
                 experimental_disable_delegate_clustering: bool = False,
                 experimental_default_delegate_latest_features: bool = False,
                 experimental_compress_quantization_zero_points: bool = False,
                 experimental_disable_delegate_node_fusion: bool = False,
                 experimental_force_delegate_node_profiling: bool = False, *,
                 backend: str = "auto", precision: str = "fp32",
                 max_delegated_partitions: int = 1, profile: bool = False,
                 cache_dir=None, model_token: Optional[str] = None,
                 max_tensor_bytes: Optional[int] = None,
                 answer_while_compiling: Optional[bool] = None):
        """The positional arguments are LiteRT's, in LiteRT's order (ai_edge_litert.interpreter.
        Interpreter), so code written for it runs unchanged; ours are keyword-only.
        backend: 'auto' (the best hardware GPU backend; without one, 'litert', else Taichi's
        CPU), 'litert' (the whole model on LiteRT's CPU kernels), 'reference' (numpy), or a
        Taichi arch: 'cuda', 'vulkan', 'metal', 'opengl', 'gles', 'cpu'.
        precision: 'fp32', or 'fp16' (f16 storage on cuda, vulkan, cpu).
        num_threads: as in LiteRT, the most threads a CPU op may use; None or -1: every core this
        process may run on; 0: one. It bounds numpy's BLAS during each invoke (one thread on the
        'cpu' backend, whose own pool has the cores; the process's setting comes back after the
        invoke: tflite_taichi/threads.py).
        The experimental_* arguments of LiteRT are accepted for drop-in use: op resolvers and
        LiteRT's delegate tuning (clustering, node fusion, latest features, zero-point
        compression, node profiling) do not apply here and are ignored;
        experimental_preserve_all_tensors=True copies every tensor a delegated partition writes
        back to the host, so get_tensor can read intermediates (the reference path always keeps
        them); experimental_delegates: None or an empty list (LiteRT's own delegates cannot run
        here: a non-empty list is refused, choose backend= instead).
        cache_dir: where compiled kernels are kept (AOT modules, see tflite_taichi.runtime.cache):
        None (default) the per-user cache (~/.cache/tflite_taichi, or $TFLITE_TAICHI_CACHE_DIR),
        False none, or a private folder (created 0700), checked before use and shared safely
        between processes; model_token names this model's record in it (default: a fingerprint
        of the model bytes, backend, precision, options and versions).
        max_tensor_bytes: the most bytes one tensor may take (default: 4x the model file's
        size + 256 MiB; all of the model's tensors together, every subgraph's: 16x that); a
        larger one is refused with errors.TensorTooLargeError naming it, before anything is
        allocated.
        answer_while_compiling: when the kernels are not cached, allocate_tensors() returns
        without waiting for them: they compile in worker processes while invoke() answers on
        the CPU, and the first invoke after they are loaded runs them. The CPU answers come
        from LiteRT's kernels where it is installed and can hand the model's state across
        (variable tensors can be; resource variables and CALL_ONCE cannot), else from numpy
        (always with experimental_preserve_all_tensors, whose intermediates numpy keeps): the
        same results within the stated tolerances, the same state.
        summary()["runtime"]["kernels"] says where they stand, wait_for_kernels() waits.
        None (default): on for backend='auto' where it chose a GPU and LiteRT is installed
        (the first answers come at once, at LiteRT's speed), off for every backend named (the
        synchronous tf.lite contract: allocate_tensors() returns with the kernels loaded)."""
        if (model_path is None) == (model_content is None):
            raise InputError("pass exactly one of model_path or model_content")
        if num_threads is not None and (not isinstance(num_threads, int) or num_threads < -1):
            raise InputError(f"num_threads must be an int >= -1, got {num_threads!r}")
        if experimental_delegates:
            raise InputError(f"experimental_delegates={experimental_delegates!r}: LiteRT's "
                             "delegates cannot run inside tflite_taichi, whose delegate is built "
                             "in; pass None or [] and choose it with backend='vulkan', 'cuda', "
                             "... (or 'auto')")
        if not isinstance(backend, str):
            raise InputError(f"backend must be a name such as 'auto', 'vulkan' or 'cpu', got "
                             f"{backend!r}")
        if not isinstance(max_delegated_partitions, int) or max_delegated_partitions < 0:
            raise InputError(f"max_delegated_partitions must be an int >= 0, got {max_delegated_partitions!r}")
        from tflite_taichi.runtime import cache
        cache.check_arguments(cache_dir, model_token)
        from tflite_taichi import litert_cpu
        # while the model is read; `auto` starts a GPU's runtime only where the model needs it
        answers_meanwhile = (backend == "auto" and answer_while_compiling is not False
                             and not experimental_preserve_all_tensors and litert_cpu.available())
        starting = _BackendStart(backend, precision, cache_dir,
                                 device_verdict=backend == "auto" and litert_cpu.available(),
                                 at_a_glance=answers_meanwhile and _capi_runtime())
        try:
            self._model = read_model(model_path if model_path is not None else model_content,
                                     max_tensor_bytes=max_tensor_bytes)
            self._resolved = graph_mod.resolve_ops(self._model)
        except BaseException:
            starting.finish(start_device=False)   # a model error wins over the backend's
            raise
        try:        # until the backend is known: `auto` may run the model on LiteRT alone
            cache_root, self._backend = starting.result()
            self._requested_backend = backend
            self._bytes = None              # _model_bytes()
            self._litert_refused = None     # why `auto` could not run the model on LiteRT
            budget = threads.resolve(num_threads)
            if answer_while_compiling is None:
                answer_while_compiling = _answers_while_compiling_by_default(backend, self._backend)
            litert_model = None
            if self._backend == "litert":
                litert_model = self._litert_model(budget, bool(experimental_preserve_all_tensors))
                if litert_model is None:    # auto: LiteRT refused it; Taichi's CPU backend runs it
                    self._backend = "cpu"
            elif answer_while_compiling and self._backend != "reference":
                litert_model = self._interim_litert(budget, bool(experimental_preserve_all_tensors))
            self._precision = precision
            self._num_threads = num_threads
            # numpy's BLAS threads during an invoke (threads.py): the budget, or one thread where
            # Taichi's CPU pool runs in the same invoke (OpenBLAS's spinning workers starve it)
            self._blas_threads = 1 if self._backend == "cpu" else budget
            self._numpy_free = (None, False)    # (schedule, whether every op of it is delegated)
            reference_ops, cost_backend = frozenset(), None
            if backend == "auto" and self._backend == "cpu":       # no hardware GPU: per-op policy
                from tflite_taichi.backend import cpu_reference_ops
                reference_ops = cpu_reference_ops({opdef.name for opdef, _ in self._resolved.values()})
            elif backend == "auto":         # a GPU: what numpy runs faster stays on the CPU (costs.py)
                cost_backend = self._backend
            self._cache = None              # cache.ModelCache: token, warm or cold (Taichi backends)
            self._auto_choice = None        # auto_choice.Choice an earlier process made, taken here
            if self._backend not in HOST_BACKENDS:
                self._cache = cache.open_model(
                    cache_root, model_token, model_path if model_path is not None else model_content,
                    self._backend, precision, max_delegated_partitions,
                    bool(experimental_preserve_all_tensors), reference_ops)
                if backend == "auto" and self._backend != "cpu":
                    litert_model = self._litert_from_the_start(
                        litert_model, budget, bool(experimental_preserve_all_tensors),
                        DelegateOptions(backend=self._backend, precision=precision,
                                        max_partitions=max_delegated_partitions,
                                        cost_backend=cost_backend))
        except BaseException:
            starting.finish(start_device=False)
            raise
        on_device = self._backend not in HOST_BACKENDS
        # answering on the CPU meanwhile: the GPU's runtime goes on starting in the background
        # (0.7 s warm, 1.4 s cold for cuda on an H100) and the kernels' build waits for it
        later = on_device and bool(answer_while_compiling) and _device_starts_later(self._backend)
        starting.finish(start_device=on_device, wait=not later)
        if on_device:
            from tflite_taichi.backend import ensure_runtime
            ensure_runtime(self._backend, self._cache.root, start=not later)
        self._options = DelegateOptions(
            backend=self._backend, precision=precision, max_partitions=max_delegated_partitions,
            profile=bool(profile), preserve_all=bool(experimental_preserve_all_tensors),
            reference_ops=reference_ops, background=bool(answer_while_compiling),
            choose=(backend == "auto" and self._backend not in HOST_BACKENDS + ("cpu",)
                    and litert_model is not None),
            litert_islands=self._islands_on_litert(budget, bool(experimental_preserve_all_tensors)),
            threads=budget, cost_backend=cost_backend, cache=self._cache)
        self._lock = threading.RLock()   # see _serialised
        self._runtime = ModelRuntime(self._model, self._resolved, self._state,
                                     self._options if self._backend not in HOST_BACKENDS else None,
                                     litert_model)
        self._states = {}
        self._main = self._state(0)
        for index in init_subgraphs(self._model, self._resolved):
            self._state(index)          # prepared by allocate_tensors() with the main graph

    # -- internals -------------------------------------------------------------------------
    def _litert_from_the_start(self, litert_model, budget: int, preserve_all: bool,
                               planning: DelegateOptions):
        """`auto` on a GPU: the whole model runs on LiteRT's CPU kernels from the start, and no
        GPU kernel is compiled or loaded, where an earlier process measured LiteRT faster on
        this model (auto_choice.py; kept in the kernel cache's record), where the delegate
        would take no op of the main graph at its declared shapes (`planning`: auto's cost
        policy leaves every op on the CPU, as on a text classifier), or where LiteRT's step,
        timed here on a scratch interpreter, is under the least a GPU invoke costs (a wake-word
        detector). Returns the LiteRT factory the interpreter then uses (the one given where
        none holds, or LiteRT refuses the model)."""
        if preserve_all:
            return litert_model
        from tflite_taichi import auto_choice, litert_cpu
        choice, schedule = self._cache.choice(0), None
        if choice is None and litert_cpu.available():
            from tflite_taichi.executor import planned_schedule
            schedule = planned_schedule(self._model, self._resolved, planning)
            if schedule is not None and not schedule.partitions:
                choice = auto_choice.planned()
        timed = choice is None and schedule is not None and auto_choice.small_enough_to_time(schedule)
        if (choice is None and not timed) or (choice is not None and choice.runs_on != "litert"):
            return litert_model
        # a schedule was planned: our prepare took the model at its declared shapes already
        whole = self._litert_model(budget, preserve_all, prepared_here=schedule is not None)
        if whole is None:
            return litert_model
        if timed:
            choice = self._litert_under_the_floor(whole)
            if choice is None:
                return litert_model
        self._backend, self._cache, self._auto_choice = "litert", None, choice
        return whole

    def _litert_under_the_floor(self, litert_model):
        """auto_choice.under_the_floor for LiteRT's step, timed on the first model the factory
        `litert_model` makes (the one _litert_model built and checked), thrown away with its
        state, resource variables included: the interpreter's models come fresh from it after.
        None where the step is not under the floor, or LiteRT fails to run the model on zeros."""
        from tflite_taichi import auto_choice
        try:
            return auto_choice.under_the_floor(auto_choice.time_litert(litert_model()))
        except TfliteTaichiError:
            return None

    def _become_litert(self, state: SubgraphState) -> bool:
        """`auto` measured LiteRT faster on this model (state.chooser, during the first
        invokes): from this invoke on, the whole model runs on LiteRT's CPU kernels as on
        backend 'litert' (its lean set/invoke/get), the GPU's memory and kernels freed. The
        inputs set and the model's state (its variable tensors: an LSTM's h and c) carry
        across. False (LiteRT keeps answering through the general path) where a live tensor()
        view is out, or other subgraphs have state of their own here."""
        if state.views_given or list(self._states) != [0]:
            return False
        model = _litert_factory(self._runtime.hand_over_litert(), self._model_bytes(),
                                self._options.threads)
        self._runtime.close()
        self._options = dataclasses.replace(
            self._options, backend="litert", background=False, choose=False,
            litert_islands=None, cost_backend=None, cache=None)
        self._runtime = ModelRuntime(self._model, self._resolved, self._state, None, model)
        self._auto_choice = state.chooser.choice
        self._backend, self._cache = "litert", None
        state.switch_to(self._options, self._runtime)
        return True

    def _litert_model(self, budget: int, preserve_all: bool, prepared_here: bool = False):
        """() -> the model on LiteRT's CPU kernels (litert_cpu.LiteRTModel), built here once to
        know that LiteRT takes the model; None where `auto` chose LiteRT and it refuses the
        model (the reason kept for summary()); BackendUnavailable for backend='litert'.
        prepared_here: our prepare already took the model at its declared shapes (auto's
        planned_schedule), so check_on_host would only do it again."""
        from tflite_taichi import litert_cpu
        data = self._model_bytes()
        auto = self._requested_backend == "auto"
        try:
            litert_cpu.refuse_what_litert_trusts(self._model, self._resolved)
            first = litert_cpu.LiteRTModel(data, budget, preserve_all)
            # LiteRT refuses an op it lacks (a custom op, a type combination) only in its
            # Prepare, which must not see a model our prepare has not accepted (its kernels
            # crash on what ours refuse): `auto` tries both now, to choose its backend here
            if auto or any(op.name.startswith("CUSTOM:")
                           for sg in self._model.subgraphs for op in sg.operators):
                if not prepared_here:
                    self._check_on_host(auto)
                first.check_kernels()
        except BackendUnavailable as e:
            if self._requested_backend == "litert":
                raise
            self._litert_refused = str(e)
            return None
        return _litert_factory(first, data, budget, preserve_all)

    def _check_on_host(self, auto: bool) -> None:
        """Our prepare of the model at its declared shapes, before LiteRT's Prepare may see it;
        for `auto`, a model it refuses is not for LiteRT (BackendUnavailable: the cpu backend
        says what is wrong at allocate_tensors, as it always did)."""
        from tflite_taichi.executor import check_on_host
        try:
            check_on_host(self._model, self._resolved)
        except TfliteTaichiError as e:
            if not auto:
                raise
            raise BackendUnavailable(f"the model does not prepare at its declared shapes: {e}") from None

    def _islands_on_litert(self, budget: int, preserve_all: bool):
        """On a Taichi backend: (islands, specs, dynamic) -> litert_islands.IslandRunner, the
        runs of CPU steps between partitions on LiteRT's kernels, as around the official
        delegate; None (numpy runs them) where LiteRT is not installed, or intermediates must be
        readable (LiteRT keeps no island's)."""
        from tflite_taichi import litert_cpu
        if self._backend in HOST_BACKENDS or preserve_all or not litert_cpu.available():
            return None

        def make(islands, specs, dynamic):
            from tflite_taichi.litert_islands import IslandRunner
            litert_cpu.refuse_what_litert_trusts(self._model, self._resolved)
            return IslandRunner(self._model_bytes(), self._model, islands, budget, specs, dynamic)
        return make

    def _interim_litert(self, budget: int, preserve_all: bool):
        """answer_while_compiling: () -> the model on LiteRT's CPU kernels, for the answers
        while the kernels compile (made at the first such answer: a warm start never pays for
        it), or None where numpy answers instead, as it did before LiteRT could: LiteRT is not
        installed or refuses the model (the reason kept for summary()), intermediates must be
        readable (experimental_preserve_all_tensors: numpy keeps them all), or the model has
        state LiteRT cannot hand back to the delegate (resource variables, CALL_ONCE, variable
        tensors of a called subgraph). None: no such factory."""
        from tflite_taichi import litert_cpu
        if preserve_all or not litert_cpu.available() or not litert_cpu.interim_can_carry_state(
                self._model, self._resolved):
            return None

        def model():
            try:
                litert_cpu.refuse_what_litert_trusts(self._model, self._resolved)
                from tflite_taichi.executor import check_on_host
                check_on_host(self._model, self._resolved)  # before LiteRT's Prepare sees it
                made = litert_cpu.LiteRTModel(self._model_bytes(), budget)
                made.check_kernels()
                return made
            except TfliteTaichiError as e:
                self._litert_refused = str(e)
                return None
        return model

    def _model_bytes(self) -> bytes:
        """The model's bytes as read_model validated them (a file's mapping, not the file read
        again), for LiteRT; copied from a mapping once, at the first LiteRT model that needs them."""
        if self._bytes is None:
            self._bytes = bytes(self._model._keepalive)
        return self._bytes

    def _state(self, subgraph_index: int) -> SubgraphState:
        if subgraph_index not in self._states:
            if not 0 <= subgraph_index < len(self._model.subgraphs):
                raise InputError(f"subgraph index {subgraph_index} out of range "
                                 f"({len(self._model.subgraphs)} subgraphs)")
            self._states[subgraph_index] = SubgraphState(
                self._model, self._model.subgraphs[subgraph_index], self._resolved, self._options,
                self._runtime)
        return self._states[subgraph_index]

    def _tensor(self, index, subgraph_index=0):
        tensors = self._model.subgraphs[subgraph_index].tensors
        if not isinstance(index, (int, np.integer)) or not 0 <= int(index) < len(tensors):
            raise InputError(f"tensor index {index!r} out of range ({len(tensors)} tensors)")
        return tensors[int(index)]

    def _details(self, t: int, state: SubgraphState) -> dict:
        tensor = state.subgraph.tensors[t]
        shape = (state.prepared.specs[t].shape if state.prepared is not None
                 else state.input_shapes.get(t, tensor.shape))
        if state.prepared is not None and t in state.prepared.dynamic:
            shape = _invoked_shape(state, t, shape)
        q = tensor.quantization
        if q is None:
            scales, zero_points, dim = np.zeros(0, np.float32), np.zeros(0, np.int32), 0
        else:
            scales, zero_points, dim = q.scale.astype(np.float32), q.zero_point.astype(np.int32), q.quantized_dimension
        per_tensor = (float(scales[0]), int(zero_points[0])) if scales.size == 1 else (0.0, 0)
        return {
            "name": tensor.name,
            "index": t,
            "shape": np.array(shape, dtype=np.int32),
            "shape_signature": np.array(tensor.shape_signature, dtype=np.int32),
            "dtype": _details_dtype(tensor),
            "quantization": per_tensor,
            "quantization_parameters": {"scales": scales, "zero_points": zero_points,
                                        "quantized_dimension": dim, "block_size": 0},
            "sparsity_parameters": _sparsity_details(tensor),
        }

    # -- the tf.lite API -------------------------------------------------------------------
    @_serialised
    def allocate_tensors(self):
        if self._cache is not None:
            self._cache.events.clear()      # warm or cold: this allocate's programs
        for state in self._states.values():
            state.allocate()

    @_serialised
    def wait_for_kernels(self, timeout: Optional[float] = None) -> bool:
        """Wait until every program's kernels are loaded (answer_while_compiling=True: they
        compile in the background), those of the subgraphs IF/WHILE call included: True when
        the next invoke() runs on the delegate, False when `timeout` seconds passed first. If
        compiling them failed, raises what it raised (invoke() keeps answering on the
        reference path, with a RuntimeWarning)."""
        deadline = None if timeout is None else time.monotonic() + max(timeout, 0.0)
        programs = [state.program for state in self._states.values() if state.program is not None]
        for program in programs + self._runtime.call_programs():
            left = None if deadline is None else max(deadline - time.monotonic(), 0.0)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)     # raised instead, below
                ready = program.can_run(left)
            if program.failed is not None:
                raise program.failed
            if not ready:
                return False
        return True

    @_serialised
    def get_input_details(self):
        return [self._details(t, self._main) for t in self._main.subgraph.inputs]

    @_serialised
    def get_output_details(self):
        return [self._details(t, self._main) for t in self._main.subgraph.outputs]

    @_serialised
    def get_tensor_details(self, subgraph_index=0):
        state = self._state(subgraph_index)
        return [self._details(t.index, state) for t in state.subgraph.tensors]

    def num_subgraphs(self) -> int:
        """The model's subgraphs (LiteRT's num_subgraphs)."""
        return len(self._model.subgraphs)

    def _get_ops_details(self) -> list:
        """Every op of the main graph in LiteRT's form (its _get_ops_details, which model viewers
        and converters' tests use): index, op_name (the builtin name, or a custom op's code),
        inputs and outputs as int32 arrays of tensor indices (-1: an optional input left out),
        and operand_types / result_types, the dtypes of those that exist. LiteRT lists its
        delegate's nodes in place of the ops they took; the model's ops are listed here."""
        sg = self._main.subgraph
        tensors = sg.tensors

        def dtypes(indices):
            return [_details_dtype(tensors[t]) for t in indices if t != -1]
        return [{"index": int(op.index), "op_name": op.name,
                 "inputs": np.array(op.inputs, dtype=np.int32),
                 "outputs": np.array(op.outputs, dtype=np.int32),
                 "operand_types": dtypes(op.inputs), "result_types": dtypes(op.outputs)}
                for op in sg.operators]

    def set_tensor(self, tensor_index, value, subgraph_index=0):
        lock = self._lock
        lock.acquire()      # (not `with`: half the cost, on a path of a few tenths of a us)
        try:
            lean = self._main.litert_lean
            # backend 'litert', the common case (an array of the input's dtype, native byte
            # order): one copy into LiteRT's tensor, whose SetTensor checks the shape and the
            # index itself; whatever it refuses, _set_tensor says why, in our words
            if lean is not None and type(value) is np.ndarray and subgraph_index == 0:
                if value.dtype is lean[1].get(tensor_index):
                    try:
                        lean[0].SetTensor(tensor_index, value, 0)
                        return
                    except (TypeError, ValueError):
                        pass
            self._set_tensor(tensor_index, value, subgraph_index)
        finally:
            lock.release()

    def _set_tensor(self, tensor_index, value, subgraph_index):
        state = self._state(subgraph_index)
        tensor = self._tensor(tensor_index, subgraph_index)
        # LiteRT lets an output be set too (its data until the next invoke overwrites it)
        if tensor.index not in state.subgraph.inputs and tensor.index not in state.subgraph.outputs:
            raise InputError(f"tensor {tensor.index} ('{tensor.name}') is neither an input nor an "
                             "output of the model; only those can be set")
        state.require_allocated("set_tensor()")
        try:
            value = np.asarray(value)
        except (TypeError, ValueError, OverflowError) as e:
            raise InputError(f"cannot set tensor {tensor.index} ('{tensor.name}'): the value is not "
                             f"an array ({e})") from None
        # the data is copied in (the caller's array is never kept or written), so any layout
        # does: non-contiguous, read-only, broadcast views, the other byte order (its values
        # are converted; LiteRT reads such bytes as if native)
        if value.dtype != tensor.dtype and value.dtype.newbyteorder("=") != tensor.dtype:
            raise InputError(f"cannot set tensor {tensor.index} ('{tensor.name}'): got {value.dtype} "
                             f"data, the input is {tensor.dtype}")
        expected = state.io_shape(tensor.index)
        if value.shape != expected:
            raise InputError(f"cannot set tensor {tensor.index} ('{tensor.name}'): got shape "
                             f"{list(value.shape)}, expected {list(expected)} "
                             "(call resize_tensor_input first to change it)")
        state.set_io(tensor.index, value)

    def get_tensor(self, tensor_index, subgraph_index=0):
        lock = self._lock
        lock.acquire()
        try:
            state = self._main
            lean = state.litert_lean
            # backend 'litert' after an invoke: an output straight from LiteRT (a fresh array)
            if lean is not None and state.invoked and tensor_index in lean[2] and subgraph_index == 0:
                try:
                    return lean[0].GetTensor(tensor_index, 0)
                except TypeError:       # an index of another type that equals an output's
                    pass
            tensor = self._tensor(tensor_index, subgraph_index)
            state = self._state(subgraph_index)
            state.require_allocated("get_tensor()")
            return state.read(tensor.index)
        finally:
            lock.release()

    def tensor(self, tensor_index):
        """A function returning the tensor's array: a live view for inputs and outputs (as in
        LiteRT; writing into an input's view sets it), a fresh copy for other tensors."""
        tensor = self._tensor(tensor_index)
        state = self._main
        with self._lock:
            state.hand_out_views()      # the io arrays hold the data from now on

        def view():
            state.require_allocated("tensor()()")
            if tensor.index not in state.io:
                return state.read(tensor.index)
            state.require_value(tensor.index)
            return state.io[tensor.index]
        return view

    def invoke(self):
        lock = self._lock
        lock.acquire()
        try:
            state = self._main
            lean = state.litert_lean
            if lean is None and state.chose_litert() and self._become_litert(state):
                lean = state.litert_lean
            if lean is not None:
                state.invoke_litert_lean(lean[0])   # LiteRT's pool has the budget
            elif self._backend == "litert":
                state.invoke()
            else:
                with threads.blas_limited(self._blas_budget(state)):
                    state.invoke()
        finally:
            lock.release()

    def _blas_budget(self, state: SubgraphState) -> Optional[int]:
        """numpy's BLAS threads for an invoke of `state`: None (left as it is: no BLAS call
        happens, and setting it costs ~3 us a step) where every op runs in the delegate's
        partitions and the delegate answers, or the invoke takes the lean step."""
        if state.lean_step() is not None:
            return None
        schedule = state.schedule
        if self._numpy_free[0] is not schedule:
            self._numpy_free = (schedule, schedule is not None and not self._options.background
                                and all(hasattr(item, "steps") for item in schedule.items))
        return None if self._numpy_free[1] else self._blas_threads

    @_serialised
    def reset_all_variables(self):
        """As LiteRT: resets variable tensors; resource variables (VAR_HANDLE) keep their values
        for the interpreter's lifetime, and CALL_ONCE does not run again."""
        self._require_prepared("reset_all_variables()")
        for state in self._states.values():
            if state.prepared is not None:
                state.reset_variables()

    @_serialised
    def resize_tensor_input(self, input_index, tensor_size, strict=False):
        state = self._main
        tensor = self._tensor(input_index)
        if tensor.index not in state.subgraph.inputs:
            raise InputError(f"tensor {tensor.index} ('{tensor.name}') is not an input; only inputs can be resized")
        shape = _as_shape(tensor_size)
        what = f"resize of input {tensor.index} ('{tensor.name}')"
        if shape is None:
            raise InputError(f"{what}: {tensor_size!r} is not a shape (a sequence of integers)")
        if any(d < 0 for d in shape):
            raise InputError(f"{what}: negative dimension in {list(shape)}")
        if len(shape) > MAX_RANK:
            raise InputError(f"{what}: rank {len(shape)} is more than {MAX_RANK} dimensions")
        if any(d > MAX_DIM for d in shape):
            raise InputError(f"{what}: dimension {max(shape)} in {list(shape)} does not fit in "
                             f"int32 (at most {MAX_DIM}), as in TFLite")
        nbytes = int(np.prod(shape, dtype=object)) * np.dtype(tensor.dtype or np.float32).itemsize
        if nbytes > sys.maxsize:
            raise InputError(f"{what}: {list(shape)} would need {nbytes} bytes, more than an "
                             "array can address")
        if strict:
            sig = tensor.shape_signature
            if len(shape) != len(sig) or any(s != -1 and s != d for s, d in zip(sig, shape)):
                raise InputError(f"resize of '{tensor.name}' to {list(shape)} is not allowed by its "
                                 f"shape_signature {list(sig)} (strict=True)")
        state.input_shapes[tensor.index] = shape
        state.unprepare()       # shapes must be propagated again by allocate_tensors()

    def get_signature_list(self):
        return {s.key: {"inputs": sorted(s.inputs), "outputs": sorted(s.outputs)}
                for s in self._model.signatures}

    def get_signature_runner(self, signature_key=None):
        sigs = self._model.signatures
        if not sigs:
            raise InputError("the model has no signatures")
        if signature_key is None:
            if len(sigs) > 1:
                raise InputError("the model has several signatures: name one "
                                 f"({', '.join(s.key for s in sigs)})")
            sig = sigs[0]
        else:
            matches = [s for s in sigs if s.key == signature_key]
            if not matches:
                raise InputError(f"no signature {signature_key!r} (have {', '.join(s.key for s in sigs)})")
            sig = matches[0]
        return SignatureRunner(self, sig)

    # -- beyond tf.lite ----------------------------------------------------------------------
    @property
    def backend(self) -> str:
        return self._backend

    @property
    def model(self):
        return self._model

    @_serialised
    def op_table(self) -> list:
        """Per op of the main graph: index, name, version, output shapes, whether it was folded
        at prepare, `delegate`: None if the delegate takes it, else the reason it cannot, and
        `runs_on`: 'delegate', 'litert' (LiteRT's CPU kernels: backend 'litert', or an island
        between partitions), 'numpy' or 'folded' (computed once at prepare)."""
        from tflite_taichi.partition import delegate_reason
        state = self._require_prepared("op_table()")
        folded = set(state.prepared.folded)
        steps = {s.op.index: s for s in state.prepared.steps}
        refused = state.schedule.refused if state.schedule is not None else {}
        on_litert = {i for island in state.islands() for i in island}
        rows = []
        for op in state.subgraph.operators:
            step = steps.get(op.index)
            if self._backend == "litert":
                reason = "backend='litert' runs every op on LiteRT's CPU kernels"
            elif step is None:
                reason = None
            elif op.index in refused:
                reason = refused[op.index]
            else:
                reason = delegate_reason(step, self._precision == "fp16", self._options.reference_ops)
            rows.append({
                "index": op.index, "op": op.name, "version": op.version,
                "outputs": [list(state.prepared.specs[t].shape) for t in op.outputs],
                "folded": op.index in folded, "delegate": reason,
                "runs_on": ("folded" if op.index in folded else
                            "litert" if self._backend == "litert" or op.index in on_litert else
                            "delegate" if reason is None and state.schedule is not None else "numpy"),
            })
        return rows

    def _require_prepared(self, what: str) -> "SubgraphState":
        self._main.require_allocated(what)
        return self._main

    @_serialised
    def summary(self) -> dict:
        """How the model runs: backend, op counts, delegated partitions and their kernels, the
        ops left on the CPU and why, the ops folded at prepare, and whether it is a float view."""
        state = self._main
        ops = state.subgraph.operators
        names = {op.index: op.name for op in ops}
        quantized = any(t.quantization is not None and t.dtype is not None and t.dtype.kind in "iu"
                        for t in state.subgraph.tensors if t.data is None)
        if state.prepared is None:
            state.allocate()
        folded = list(state.prepared.folded)
        if self._backend == "litert":       # every op on LiteRT's kernels: none on numpy
            partitions, fallback = [], []
        elif state.schedule is None:
            partitions, fallback = [], [
                {"index": s.op.index, "op": s.op.name,
                 "reason": "backend='reference' runs every op on the numpy path"}
                for s in state.prepared.steps]
        else:
            program = state.program
            partitions = [{"ops": [s.op.index for s in p.steps],
                           "kernels": program.code(p).launches,
                           "fused": [list(f) for f in program.code(p).fused],
                           "computed_at_load": [list(f) for f in program.code(p).computed_at_load],
                           # cpu: threads per top-level loop (1: serial tasks in the caller's
                           # thread, Taichi merges them into one); 0 on other backends
                           "cpu_threads": program.code(p).cpu_threads}
                          for p in state.schedule.partitions]
            on_litert = {i for island in state.islands() for i in island}
            fallback = [{"index": i, "op": names[i], "reason": r,
                         "runs_on": "litert" if i in on_litert else "numpy"}
                        for i, r in sorted(state.schedule.refused.items())]
        return {
            "backend": self._backend,
            "precision": self._precision,
            "ops_total": len(ops),
            "ops_delegated": sum(len(p["ops"]) for p in partitions),
            "ops_folded": len(folded),
            "partitions": partitions,
            "fallback": fallback,
            "folded": [{"index": i, "op": names[i]} for i in folded],
            "float_view": quantized,      # quantized tensors run as float32 real values
            "quantization": model_kind(self._model),
            "cache": self._cache.info() if self._cache is not None else None,
            "runtime": self._runtime_info(state),
            # the last invoke's path: 'delegate', 'litert' (LiteRT's CPU kernels) or 'reference'
            "answered_by": state.answered_by,
            # subgraphs IF/WHILE/composites call, each delegated on its own (executor.DelegatedCall)
            "calls": [call.info() for call in self._runtime.delegated_calls()],
            # backend 'litert': the model on LiteRT's CPU kernels (litert_cpu.LiteRTModel)
            "cpu_executor": self._runtime.litert.describe() if self._backend == "litert" else None,
            # `auto` without a GPU: why LiteRT did not take the model (Taichi's cpu runs it)
            "litert_refused": self._litert_refused,
            # `auto` on a GPU: which side it measured faster on this model (auto_choice.py), as
            # {runs_on: 'litert' | 'gpu', litert_ms, gpu_ms, how: 'measured' | 'cached'};
            # None until it has measured
            "auto_choice": self._auto_choice_info(state),
            # on a Taichi backend: the runs of ops between partitions that LiteRT's kernels run
            # (op indices per island), and why LiteRT does not run them where it does not
            "litert_islands": {"islands": state.islands(), "refused": state.islands_refused},
        }

    def _auto_choice_info(self, state) -> Optional[dict]:
        choice = self._auto_choice or (state.chooser.choice if state.chooser is not None else None)
        if choice is None:
            return None
        record = {k: (v if not isinstance(v, float) or np.isfinite(v) else None)   # unmeasured
                  for k, v in choice.as_record().items()}
        return {**record, "how": choice.how, "text": choice.describe()}

    def _runtime_info(self, state) -> Optional[dict]:
        """Where the delegate's kernels run: Taichi's C API ('capi') or its Python runtime
        ('python'), what an invoke costs the host (launches, waits), and what the process's
        session holds (`session`: backend, devices, C API library, compile pool, Taichi build)."""
        from tflite_taichi.runtime.session import SESSION
        program = state.program
        if program is None:
            return None
        layout = program.layout
        return {"device": program.device_kind, "launches_per_invoke": program.launches,
                "steps_per_invoke": sum(c.steps for c in program.codes),
                "tasks_per_invoke": program.tasks,
                "waits_per_invoke": program.planned_waits(),
                "waits_last_invoke": program.waits if state.invoked else None,
                "tensors_in": len(layout.host_written), "tensors_out": len(layout.host_read),
                "tensors_on_device": len(layout.offsets) - len(layout.host_written) - len(layout.host_read),
                # quantized inputs/outputs the device (de)quantizes: the host only casts them
                "tensors_as_codes": sorted(state.subgraph.tensors[t].name for t in layout.codes),
                "build_s": round(program.build_s, 3),
                "compiled_in": program.compiled_in,
                "kernels": kernels_state(program),
                "answered_by": state.answered_by,      # the last invoke's path
                **_vulkan_info(program.device),
                "session": SESSION.describe()}

    @_serialised
    def profile(self) -> dict:
        """Times of the invokes since allocate_tensors() (needs profile=True): per partition and
        per CPU op, median milliseconds and kernel launches per invoke; per kernel of a
        partition, the ops that run as its steps (the ops fused into them ride along) and its
        median milliseconds (profiling waits after every kernel, so each time is its own)."""
        if not self._options.profile:
            raise InterpreterStateError("profiling is off: create the Interpreter with profile=True")
        state = self._require_prepared("profile()")
        rows, launches = [], 0
        items = state.schedule.items if state.schedule is not None else []
        program = state.program
        for position, item in enumerate(items):
            times = state.timings.get(position, [])
            median_ms = _median_ms(times)
            if hasattr(item, "steps"):
                code = program.code(item)
                launches += code.launches
                kernels = [{"ops": [item.steps[j].op.index for j in chunk],
                            "ms": _median_ms(state.kernel_timings.get((position, k), []))}
                           for k, chunk in enumerate(code.chunks)]
                rows.append({"kind": "partition", "ops": [s.op.index for s in item.steps],
                             "launches": code.launches, "ms": median_ms, "invokes": len(times),
                             "kernels": kernels})
            else:
                rows.append({"kind": "cpu", "ops": [item.op.index], "op": item.op.name,
                             "launches": 0, "ms": median_ms, "invokes": len(times)})
        # profiling waits after every kernel to time it; without profile=True an invoke
        # waits `waits_per_invoke` times
        return {"backend": self._backend, "items": rows, "launches_per_invoke": launches,
                "tasks_per_invoke": program.tasks if program is not None else 0,
                "waits_per_invoke": program.planned_waits() if program is not None else 0,
                "device": program.device_kind if program is not None else None}

    @_serialised
    def node_data(self) -> dict:
        """What the delegate did, per op of every subgraph, as node data for Google's Model
        Explorer: {overlay: {graph id: {"results": {node id: {"value", "bgColor"}}}}}, the
        overlays "where" (the partition, the CPU, or folded at prepare), "why" (an op's reason
        to stay on the CPU), "fusion" (the op whose store or loop runs it) and, after invokes
        with profile=True, "time" (median microseconds per invoke; ops that share a kernel
        show the kernel's time). Each overlay is a JSON file Model Explorer's UI loads
        (`json.dump`); node ids are the ones its TFLite adapter gives (tflite_taichi/node_data.py,
        docs/explore.md)."""
        from tflite_taichi import node_data
        self._main.require_allocated("node_data()")
        views = {index: node_data.SubgraphView(s.prepared, s.schedule, s.program, s.timings,
                                               s.kernel_timings,
                                               frozenset(i for isl in s.islands() for i in isl))
                 for index, s in self._states.items() if s.prepared is not None}
        for prepared, call in self._runtime.prepared_calls():
            views.setdefault(prepared.subgraph.index, node_data.SubgraphView(
                prepared, call.schedule if call else None, call.program if call else None))
        facts = {sg.index: node_data.subgraph_facts(sg, views.get(sg.index), self._backend)
                 for sg in self._model.subgraphs}
        profiled = self._options.profile and any(s.timings for s in self._states.values())
        return node_data.overlays(self._model, facts, profiled)

    # -- lifetime ----------------------------------------------------------------------------
    @_serialised
    def close(self) -> None:
        """Free the interpreter's device memory and kernels now (they are also freed when it is
        garbage-collected). A closed interpreter raises InterpreterStateError until
        allocate_tensors() is called again."""
        for state in self._states.values():
            state.close()
        self._runtime.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


class SignatureRunner:
    """`interpreter.get_signature_runner(key)`: call it with the signature's input names."""

    def __init__(self, interpreter: Interpreter, sig):
        self._it = interpreter
        self._sig = sig
        self._state = interpreter._state(sig.subgraph_index)

    def get_input_details(self):
        return {name: self._it._details(t, self._state) for name, t in self._sig.inputs.items()}

    def get_output_details(self):
        return {name: self._it._details(t, self._state) for name, t in self._sig.outputs.items()}

    def __call__(self, **inputs):
        """Inputs in, outputs out: one call under the interpreter's lock, so concurrent calls
        from several threads each get their own inputs' outputs."""
        with self._it._lock:
            return self._call(inputs)

    def _call(self, inputs: dict) -> dict:
        unknown = set(inputs) - set(self._sig.inputs)
        missing = set(self._sig.inputs) - set(inputs)
        if unknown or missing:
            raise InputError(f"signature '{self._sig.key}' takes inputs {sorted(self._sig.inputs)}; "
                             f"unknown: {sorted(unknown)}, missing: {sorted(missing)}")
        state = self._state
        arrays = {self._sig.inputs[name]: np.asarray(v) for name, v in inputs.items()}
        current = state.prepared.specs if state.prepared is not None else {}
        for t, a in arrays.items():
            if t not in current or current[t].shape != a.shape:
                state.input_shapes[t] = a.shape
                state.unprepare()
        if state.prepared is None:
            state.allocate()
        for t, a in arrays.items():
            self._it.set_tensor(t, a, subgraph_index=self._sig.subgraph_index)
        state.invoke()
        return {name: state.read(t) for name, t in self._sig.outputs.items()}
