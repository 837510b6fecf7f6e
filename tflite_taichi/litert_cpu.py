"""The CPU half on TFLite's own kernels: a model run by LiteRT (`ai_edge_litert`, XNNPACK on).

As around the official GPU delegate, what runs on the CPU runs on TFLite's CPU kernels: numpy
pays ~15 us of Python per op and im2col + BLAS per convolution, Taichi's x64 kernels were
measured 6.5x slower than OpenBLAS on GEMM, and XNNPACK is faster than both. Where no GPU takes
the model (`backend='litert'`, and `auto` on a machine without a hardware GPU) the whole model
runs here: one LiteRT interpreter, shared by every subgraph the Interpreter runs (the main graph
and the signatures'), so resource variables and variable tensors live in one place, as they do
in LiteRT. numpy (`reference`) stays the ground truth and the fallback where LiteRT is not
installed or cannot run the model (a custom op of the user's).

LiteRT's public methods take subgraph 0 only and refuse to run while a numpy view of its
buffers exists; the calls below are its wrapper's (the ones its own SignatureRunner makes), which
take a subgraph index. Every array crosses by copy: no view of LiteRT's memory leaves this
module, so no resize can leave a caller holding freed memory.
"""
from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import sys
import tempfile
import threading
from typing import Optional

import numpy as np

from tflite_taichi.errors import BackendUnavailable, InputError, InterpreterStateError, ModelError

INSTALL_HINT = ('pip install ai-edge-litert (LiteRT has wheels for Linux x86_64/aarch64 and '
                'macOS arm64)')


def available() -> bool:
    """Whether LiteRT's Python package can be imported here (without importing it)."""
    try:
        return importlib.util.find_spec("ai_edge_litert") is not None
    except (ImportError, ValueError):
        return False


def version() -> Optional[str]:
    try:
        from importlib.metadata import version as dist_version
        return dist_version("ai-edge-litert")
    except Exception:           # not installed, or metadata unreadable: only a label
        return None


def refuse_what_litert_trusts(model, resolved) -> None:
    """BackendUnavailable naming the first op, of any subgraph, that LiteRT would read past
    what the file holds. LiteRT's first allocation hands every node of every subgraph to its
    XNNPACK delegate, which reads the node's inputs by position with no check of their count:
    that is before our prepare has seen the subgraphs main does not call (CALL_ONCE's init,
    one nobody calls), so what their nodes must hold is checked here, from the file alone.
    `resolved`: graph.resolve_ops(model)."""
    for sg in model.subgraphs:
        for op in sg.operators:
            opdef, _options = resolved[(sg.index, op.index)]
            why = _unchecked_by_litert(sg, op, opdef)
            if why is not None:
                raise BackendUnavailable(f"LiteRT cannot run this model: subgraph {sg.index} op "
                                         f"#{op.index} ({op.name}) {why}")
    _refuse_variables_of_two_shapes(model, resolved)


def _unchecked_by_litert(sg, op, opdef) -> Optional[str]:
    """Why LiteRT would crash on op `op` of subgraph `sg`, or None."""
    try:
        opdef.check_arity(op.index, len(op.inputs))
    except ModelError as e:         # "op #i (NAME): takes n inputs, has m"
        return str(e).split(": ", 1)[-1]
    if -1 in op.inputs and not opdef.litert_checks_omitted_inputs:
        # a kernel that reads its inputs by position takes an omitted one for a tensor
        return f"omits its input {list(op.inputs).index(-1)}, which LiteRT's kernel reads unchecked"
    return _variable_value_without_data(sg, op, opdef)


def _variable_value_without_data(sg, op, opdef) -> Optional[str]:
    """A resource variable's value that is no data (a handle, a string): LiteRT copies the
    bytes of what ASSIGN_VARIABLE stores into the tensor READ_VARIABLE declares, past the end
    of either."""
    tensor = _variable_value(sg, op, opdef)
    if tensor is None or tensor.dtype is not None:
        return None
    kind = "input 1" if opdef.variable_access == "write" else "output 0"
    return (f"has {kind} ('{tensor.name}') of type {tensor.type_name} as the variable's value, "
            "which must be data")


def _refuse_variables_of_two_shapes(model, resolved) -> None:
    """BackendUnavailable where one resource variable is written or read as tensors of two
    shapes or dtypes: XNNPACK keeps a variable in a buffer of the size it first sees and copies
    each tensor's bytes in or out of it (a value smaller or larger than the buffer overruns one
    of them). A variable is known by the options of the op that makes its handle (VAR_HANDLE's
    container and shared name), wherever that op is; a handle passed in from another subgraph
    is not followed."""
    seen = {}           # variable -> ((type, shape), where first seen)
    for sg in model.subgraphs:
        handles = {}    # tensor -> the options naming its variable
        for op in sg.operators:
            opdef, options = resolved[(sg.index, op.index)]
            if opdef.writes_resource_handle and options is not None:
                handles.update((t, options) for t in op.outputs)
            value = _variable_value(sg, op, opdef)
            if value is None or op.inputs[0] not in handles:
                continue
            variable = handles[op.inputs[0]]
            held = (value.type_name, tuple(value.shape))
            where = f"subgraph {sg.index} op #{op.index} ({op.name}) as {held[0]} {list(held[1])}"
            first = seen.setdefault(variable, (held, where))
            if first[0] != held:
                raise BackendUnavailable(
                    f"LiteRT cannot run this model: resource variable "
                    f"'{sg.tensors[op.inputs[0]].name}' is held by {first[1]} and by {where}")


def _variable_value(sg, op, opdef):
    """The tensor holding the value a variable op writes or reads (None: not such an op, or
    that tensor is missing)."""
    position = {"write": (op.inputs, 1), "read": (op.outputs, 0)}.get(opdef.variable_access)
    if position is None or not op.inputs:
        return None
    tensors, k = position
    return sg.tensors[tensors[k]] if k < len(tensors) and tensors[k] != -1 else None


def interim_can_carry_state(model, resolved) -> bool:
    """Whether LiteRT can answer for a delegate whose kernels compile, with the state handed
    across each invoke: only variable tensors of the subgraph invoked can be (LiteRT's
    resource variables, CALL_ONCE's having run and the variable tensors of called subgraphs
    live inside its interpreter, which can neither hand them out nor take them in)."""
    if any(opdef.variable_access or opdef.writes_resource_handle or opdef.init_subgraph_of
           for opdef, _options in resolved.values()):
        return False
    called = {sg.index for sg in model.subgraphs} - {0} - {s.subgraph_index for s in model.signatures}
    return not any(t.is_variable for sg in model.subgraphs if sg.index in called for t in sg.tensors)


# LiteRT's C++ prints this on stderr at the first allocation of a process; its logger has no
# switch (TF_CPP_MIN_LOG_LEVEL does not reach it), so every user's output would carry an INFO
# line of LiteRT's own. It goes to our log instead (logging at INFO, as our own notes do).
XNNPACK_NOTE = b"INFO: Created TensorFlow Lite XNNPACK delegate for CPU.\n"
_note = {"seen": False, "lock": threading.Lock()}
_log = logging.getLogger("tflite_taichi.litert")


@contextlib.contextmanager
def xnnpack_note_to_the_log():
    """Around a LiteRT allocation: until LiteRT has printed its XNNPACK note in this process,
    stderr (file descriptor 2, which its C++ writes) goes to a temporary file for the call, and
    whatever else was written there meanwhile is written back after it."""
    if _note["seen"]:
        yield
        return
    with _note["lock"]:
        try:
            sys.stderr.flush()
            saved = os.dup(2)
        except (OSError, ValueError):       # no stderr to speak of: nothing to keep calm
            yield
            return
        with tempfile.TemporaryFile() as held:
            os.dup2(held.fileno(), 2)
            try:
                yield
            finally:
                os.dup2(saved, 2)
                os.close(saved)
                held.seek(0)
                written = held.read()
                if XNNPACK_NOTE in written:
                    _note["seen"] = True
                    _log.info(XNNPACK_NOTE.decode().strip()[len("INFO: "):])
                    written = written.replace(XNNPACK_NOTE, b"", 1)
                if written:
                    os.write(2, written)


def _litert_threads(budget: int) -> int:
    """LiteRT's num_threads for our budget (threads.resolve: at least 1)."""
    return max(int(budget), 1)


class LiteRTModel:
    """One model on LiteRT's CPU kernels. `model_bytes`: the .tflite file's bytes (LiteRT keeps
    a reference, not a copy); `threads`: its thread pool's size (the interpreter's budget);
    `preserve_all`: keep every intermediate readable (LiteRT's experimental_preserve_all_tensors).
    BackendUnavailable where LiteRT is missing or refuses the model, naming why."""

    def __init__(self, model_bytes: bytes, threads: int, preserve_all: bool = False):
        if not available():
            raise BackendUnavailable(f"backend 'litert' needs LiteRT's Python package: {INSTALL_HINT}")
        from ai_edge_litert.interpreter import Interpreter as LiteRTInterpreter
        self.threads = _litert_threads(threads)
        self.preserve_all = preserve_all
        self._bytes = bytes(model_bytes)            # LiteRT reads it for its lifetime
        try:
            self._interpreter = LiteRTInterpreter(model_content=self._bytes, num_threads=self.threads,
                                                  experimental_preserve_all_tensors=preserve_all)
        except (ValueError, RuntimeError) as e:
            raise BackendUnavailable(f"LiteRT cannot run this model: {_first_line(e)}") from None
        self._wrapper = self._interpreter._interpreter
        # LiteRT's kernels trust what their Prepare is given (an omitted input a kernel needs
        # is a null pointer to it: a segfault), so no subgraph is prepared here: allocate()
        # prepares each after our own prepare accepted it, check_kernels() once the caller has

    def check_kernels(self) -> None:
        """LiteRT's Prepare of the main graph: BackendUnavailable naming what LiteRT cannot run
        (a custom op it has no kernel for is refused here, not when the model is read). Call it
        only on a model our own prepare accepted."""
        try:
            with xnnpack_note_to_the_log():
                self._wrapper.AllocateTensors(0)
        except (ValueError, RuntimeError) as e:
            raise BackendUnavailable(f"LiteRT cannot run this model: {_first_line(e)}") from None

    # -- shapes ----------------------------------------------------------------------------
    def allocate(self, subgraph: int, input_shapes: dict) -> None:
        """LiteRT's tensors of `subgraph` for inputs of `input_shapes` {tensor: shape}
        (resized where they differ from what LiteRT has; allocated always, as LiteRT's
        allocate_tensors)."""
        for t, shape in input_shapes.items():
            have = self._wrapper.TensorSize(t, subgraph)
            if tuple(int(d) for d in have) != tuple(shape):
                try:
                    self._wrapper.ResizeInputTensor(t, np.array(shape, np.int32), False, subgraph)
                except (ValueError, RuntimeError) as e:
                    raise InputError(f"LiteRT cannot resize input {t} of subgraph {subgraph} to "
                                     f"{list(shape)}: {_first_line(e)}") from None
        try:
            with xnnpack_note_to_the_log():
                self._wrapper.AllocateTensors(subgraph)
        except (ValueError, RuntimeError) as e:
            raise BackendUnavailable(f"LiteRT cannot allocate subgraph {subgraph} for inputs of "
                                     f"shapes {[list(s) for s in input_shapes.values()]}: "
                                     f"{_first_line(e)}") from None

    def check_shapes(self, subgraph: int, shapes: dict) -> None:
        """ModelError where LiteRT gave a tensor of `subgraph` another shape than `shapes`
        {tensor: shape} (ours, inferred and checked at prepare): LiteRT's kernels trust the
        shapes the file declares (an XNNPACK node planned for one shape, fed another, writes
        past its buffers), so a model whose ops and declared shapes disagree must not run."""
        for t, shape in shapes.items():
            have = tuple(int(d) for d in self._wrapper.TensorSize(t, subgraph))
            if have != tuple(shape):
                raise ModelError(f"subgraph {subgraph} tensor {t} ('{self._wrapper.TensorName(t, subgraph)}'): "
                                 f"LiteRT gives it shape {list(have)}, the model's ops give "
                                 f"{list(shape)}: the file is inconsistent")

    # -- an invoke ---------------------------------------------------------------------------
    @property
    def wrapper(self):
        """LiteRT's wrapper (SetTensor / Invoke / GetTensor by subgraph), for the
        Interpreter's lean path (executor.SubgraphState.litert_lean)."""
        return self._wrapper

    def write(self, t: int, value: np.ndarray, subgraph: int) -> None:
        """Copies `value` (the tensor's dtype, native byte order, its shape) into tensor `t`."""
        self._wrapper.SetTensor(t, value, subgraph)

    def invoke(self, subgraph: int) -> None:
        try:
            self._wrapper.Invoke(subgraph)
        except (ValueError, RuntimeError) as e:
            raise litert_invoke_error(e, subgraph) from None

    def run(self, subgraph: int, inputs, outputs) -> list:
        """Sets `inputs` [(tensor, array in the model's dtype)], invokes `subgraph` and returns a
        fresh array for each of `outputs` [tensor]. (Lists, not dicts: on a model of a few
        microseconds, this loop is most of the step.)"""
        wrapper = self._wrapper
        for t, value in inputs:
            wrapper.SetTensor(t, value, subgraph)
        self.invoke(subgraph)
        return [wrapper.GetTensor(t, subgraph) for t in outputs]

    def read(self, t: int, subgraph: int):
        """A tensor's current contents (a fresh array)."""
        return self._wrapper.GetTensor(t, subgraph)

    def shape(self, t: int, subgraph: int) -> tuple:
        return tuple(int(d) for d in self._wrapper.TensorSize(t, subgraph))

    def dtype(self, t: int, subgraph: int) -> np.dtype:
        return np.dtype(self._wrapper.TensorType(t, subgraph))

    def main_io(self) -> tuple:
        """(input tensors, output tensors) of the main graph, as LiteRT reads them."""
        return list(self._wrapper.InputIndices()), list(self._wrapper.OutputIndices())

    def reset_variables(self) -> None:
        """Variable tensors back to their values in the model, every subgraph's (LiteRT's
        reset_all_variables)."""
        self._wrapper.ResetVariableTensors()

    def describe(self) -> dict:
        """What summary()["cpu_executor"] says of it."""
        return {"runtime": "litert", "version": version(), "threads": self.threads,
                "xnnpack": True, "preserve_all": self.preserve_all}

    def close(self) -> None:
        self._interpreter = self._wrapper = None


def litert_invoke_error(error: BaseException, subgraph: int) -> InterpreterStateError:
    """What a failed LiteRT invoke raises (its ValueError / RuntimeError, first line)."""
    return InterpreterStateError(f"LiteRT's invoke of subgraph {subgraph} failed: {_first_line(error)}")


def _first_line(error: BaseException) -> str:
    """LiteRT's messages carry its C++ log (file:line, node numbers) after the first line."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
