"""Building a subgraph's program: what allocate_tensors() does for a Taichi backend's partitions,
split from what invoke() runs as TFLite's GPU delegate splits its InferenceBuilder from the
InferenceRunner that only sets objects and runs (delegates/gpu/api.h).

`build_program` lays out the io buffer (io_layout), plans each partition's kernel
(codegen.plan), gets the kernels (the cache, compile workers and Taichi's C API through
runtime/kernels.py; Taichi's Python runtime where the C API refuses them), allocates the device
memory and returns the runner, `delegate.Program`. With background=True it returns the runner at
once and hands it its memory when the kernels are there (answer_while_compiling).
"""
from __future__ import annotations

import warnings

import numpy as np

from tflite_taichi import codegen, switches
from tflite_taichi.delegate import IoLayout, Memory, Program, kernel_names, plan_digest
from tflite_taichi.errors import ModelError, TfliteTaichiError
from tflite_taichi.graph import PreparedGraph
from tflite_taichi.partition import Partition, Schedule
from tflite_taichi.quant import is_float_view
from tflite_taichi.runtime import capi
from tflite_taichi.runtime import device as device_mod
from tflite_taichi.runtime.device import TAICHI_LOCK
from tflite_taichi.runtime.kernels import ProgramKernels, kernel_compiled_reporter


def build_program(graph: PreparedGraph, schedule: Schedule, backend: str, fp16: bool,
                  model_cache=None, preserve_all: bool = False, background: bool = False,
                  cpu_threads: int = 0, variables=None, state=None,
                  io_codes: bool = True) -> Program:
    """The runner of `schedule`'s partitions on `backend`'s device, its kernels and memory ready
    (background: getting there in a thread; `Program.can_run()` says when).
    variables: the interpreter's resource variables, state: the subgraph's variable tensors
    (each a variables.Variables), for partitions that keep some in their io slots.
    io_codes: the subgraph's quantized inputs and outputs may cross as integer codes
    (IoLayout.codes); False for a called subgraph (executor.DelegatedCall)."""
    layout = io_layout(schedule, graph, preserve_all, io_codes)
    _check_io_size(layout)
    codes = [codegen.plan(p, graph, backend, fp16, layout.offsets, layout.codes, cpu_threads)
             for p in schedule.partitions]
    env = (lambda: _driver_env(model_cache)) if model_cache is not None else None
    later = background and starts_in_background(backend)
    device = None if later else device_mod.get(backend, env)
    if device is not None:
        device.affinity.check_thread("allocate_tensors()")
    modules = []                        # modules of this program alone (no cache)
    kernels = None                      # runtime.kernels.ProgramKernels (C API devices)
    if later or device.kind == "capi":
        shapes = {t: graph.specs[t].shape for t in graph.subgraph.inputs}
        kernels = ProgramKernels(device, codes, kernel_names(codes), backend, fp16,
                                 graph.subgraph.index, shapes,
                                 plan_digest(backend, fp16, layout, codes), model_cache, modules)
    program = Program(graph, schedule, backend, fp16, layout, codes, device, kernels, modules,
                      variables, state)

    def started_device():               # in the build thread: the program runs on it
        program.run_on(device_mod.get_capi(backend, env), kernels)
        return program.device
    try:
        if background and kernels is not None:
            kernels.start(lambda got: program.install(_allocate(program, got)),
                          lambda: program.closed, program.release_now,
                          device=started_device if later else None)
        else:
            _build_now(program)
    except BaseException:
        program.release_now()
        raise
    return program


def starts_in_background(backend: str) -> bool:
    """Whether a program built in the background (answer_while_compiling) gets `backend`'s
    device in its build thread (starting it there, or waiting for its start under way), and
    its kernels there too, cached or not: Taichi's C API, not OpenGL/GLES (a GL context
    belongs to the thread that makes it, the caller's). allocate_tensors() then never waits
    on the GPU."""
    return backend not in device_mod.GL_BACKENDS and device_mod.runtime_kind() == "capi"


def _build_now(program: Program) -> None:
    """The kernels got (compiled if need be) and the memory allocated, before returning."""
    kernels = program.kernels
    if kernels is not None:
        try:
            got = kernels.get()
        except TfliteTaichiError as e:
            if not isinstance(e, capi.CapiError):
                raise
            got = _fall_back(program, e)
        except Exception as e:      # Taichi's AOT builder refused a kernel that its Python
            got = _fall_back(program, e)    # runtime may still run (if not, that compile raises)
    else:
        got = _python_kernels(program.codes)
    program.install(_allocate(program, got))
    if program.device.kind == "python":       # compile now (Taichi compiles at first launch)
        _compile_by_launching(program)


def _fall_back(program: Program, why: Exception) -> list:
    """The program through Taichi's Python runtime (the C API refused its module, or Taichi
    could not archive it), with a warning; its kernels for that runtime."""
    warnings.warn(f"tflite_taichi: {type(why).__name__}: {why}; this model's kernels run "
                  "through Taichi's Python runtime instead", RuntimeWarning, stacklevel=6)
    program.run_on(device_mod.PythonDevice(program.backend))
    return _python_kernels(program.codes)


def _python_kernels(codes: list) -> list:
    with TAICHI_LOCK:
        return [codegen.build_kernels(code) for code in codes]


def _allocate(program: Program, kernels: list) -> Memory:
    """The program's buffers on its device (arena and scratch shared by the partitions, io,
    each partition's weights, uploaded once) and its launchers bound to them, owned by the
    program (it frees them)."""
    d, codes = program.device, program.codes
    storage = "f16" if program.fp16 else "f32"

    def buffer(elements, kind):
        program.owned.buffers.append(d.allocate(elements, kind))
        return program.owned.buffers[-1]
    arena = buffer(max((c.plan.arena_size for c in codes), default=1), storage)
    scratch = buffer(max((c.plan.scratch_size for c in codes), default=1), "f32")
    io = buffer(program.layout.size, "f32")
    link = d.link(io)
    program.owned.links.append(link)
    launches = {}
    for code, got in zip(codes, kernels):
        weights = buffer(max(code.plan.weights.size, 1), storage)
        d.fill(weights, code.plan.weights)
        launches[id(code.partition)] = [d.launcher(k, (arena, weights, io, scratch)) for k in got]
    return Memory(link, launches)


def _compile_by_launching(program: Program) -> None:
    """Python device: compile every kernel now, in allocate_tensors(), as TFLite's GPU delegate
    builds its programs there, not in the first invoke (one launch on the zeroed buffers, whose
    results nobody reads)."""
    with TAICHI_LOCK, codegen.intended_unrolling():
        compiled = kernel_compiled_reporter(program.launches)
        for code in program.codes:
            for chunk_at, launch in enumerate(program.memory.launches[id(code.partition)]):
                with codegen.compiling(code, chunk_at):
                    launch()            # the first launch compiles
                compiled()
        program.device.wait()


def _check_io_size(layout: IoLayout) -> None:
    if layout.size > codegen.MAX_BUFFER_ELEMENTS:
        raise ModelError(f"the tensors passed between the delegate's partitions and the host "
                         f"need {layout.size:,} float32 elements in one buffer; Taichi indexes "
                         f"buffers with 32-bit integers (at most {codegen.MAX_BUFFER_ELEMENTS:,}): "
                         "use backend='reference' or smaller shapes")


# -- the io buffer --------------------------------------------------------------------------------
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


def _driver_env(model_cache):
    from tflite_taichi.runtime.cache import driver_env
    return driver_env(model_cache.root)
