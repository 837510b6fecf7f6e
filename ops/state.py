"""State kept across invokes: resource variables (VAR_HANDLE, READ_VARIABLE, ASSIGN_VARIABLE)
and CALL_ONCE, which runs an initialisation subgraph once per interpreter.

As in LiteRT:
- VAR_HANDLE names a variable by (container, shared_name); every subgraph of an interpreter
  that names the same pair reaches the same variable. It is pure, so it folds at prepare into
  a `ResourceHandle` constant.
- ASSIGN_VARIABLE stores its value tensor as it is in the model's dtype (LiteRT copies the
  bytes), so an int8 state is stored as int8 and READ_VARIABLE hands those integers on under
  its own output's quantization - exactly what LiteRT computes even if the two tensors were
  given different scales.
- Variables live as long as the interpreter: `reset_all_variables()` does not touch them
  (measured on LiteRT with okay_nabu) and neither does `allocate_tensors()`.

READ_VARIABLE, ASSIGN_VARIABLE and CALL_ONCE are `stateful`: never folded, kept in their graph
order by the partitioner, and their reference receives the interpreter's runtime (the variables
and a way to run a subgraph) as a third argument. CALL_ONCE stays on the CPU. READ_VARIABLE and
ASSIGN_VARIABLE declare `variable_access`: the delegate takes them where the handle is folded,
keeping the variable in a slot of its io buffer that their Taichi parts copy from and to (an
8/16-bit variable's slot holds its integer codes, as the host's array does; each op reads or
writes them under its own tensor's quantization, as the references below do), so a streaming
model's state stays on the device between invokes (tflite_taichi/variables.py).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tflite_taichi.quant import dequantize, is_float_view, quantize, quantized_range

from .base import OpDef, Runtime, State, register_op
from .kit import IO_OUT, CopyStep, TensorRef


@dataclass(frozen=True)
class ResourceHandle:
    container: str
    shared_name: str

    def __str__(self):
        return f"'{self.container}/{self.shared_name}'" if self.container else f"'{self.shared_name}'"


def _text(raw) -> str:
    return raw.decode("utf-8", "replace") if isinstance(raw, bytes) else (raw or "")


@dataclass(frozen=True)
class VarHandleOptions:
    container: str
    shared_name: str


def _parse_var_handle(opts) -> VarHandleOptions:
    return VarHandleOptions(container=_text(opts.Container()), shared_name=_text(opts.SharedName()))


def _infer_var_handle(node):
    return [()]


def _var_handle_reference(node, inputs):
    handle = np.empty((), dtype=object)
    handle[()] = ResourceHandle(node.options.container, node.options.shared_name)
    return [handle]


def _handle_of(node, value) -> ResourceHandle:
    handle = value.item() if isinstance(value, np.ndarray) and value.dtype == object else value
    if not isinstance(handle, ResourceHandle):
        raise node.fail(f"input '{node.inputs[0].name}' is not a resource handle from VAR_HANDLE")
    return handle


def _require_inputs(node, *names):
    """Infer's check: these inputs are present (an omitted one (-1) is a ModelError)."""
    for i, name in enumerate(names):
        if node.inputs[i] is None:
            raise node.fail(f"input {i} ({name}) is omitted (-1)")


def _infer_read_variable(node):
    _require_inputs(node, "resource handle")
    # LiteRT resizes the output to the variable at run time; here the output keeps the shape
    # the model declares, and a stored value of another shape is a clear error when read.
    return [tuple(node.outputs[0].shape)]


def _read_variable_reference(node, inputs, runtime: Runtime):
    handle = _handle_of(node, inputs[0])
    stored = runtime.resources.get(handle)
    out = node.outputs[0]
    if stored is None:
        raise node.fail(f"reads variable {handle} before any ASSIGN_VARIABLE gave it a value")
    if stored.shape != tuple(out.shape) or (out.dtype is not None and stored.dtype != np.dtype(out.dtype)):
        raise node.fail(f"variable {handle} holds {stored.dtype} {list(stored.shape)}; output "
                        f"'{out.name}' is declared {np.dtype(out.dtype).name if out.dtype is not None else '?'} "
                        f"{list(out.shape)}")
    if is_float_view(out.dtype, out.quantization):
        return [dequantize(stored, out.quantization)]
    return [stored.copy()]


def _infer_assign_variable(node):
    _require_inputs(node, "resource handle", "value")
    value = node.inputs[1]
    if value.dtype is None:         # a handle or a string: no data a variable can hold
        raise node.fail(f"input 1 ('{value.name}'), the value to store, is a tensor without data "
                        "(a resource handle or a string)")
    return []


def _assign_variable_reference(node, inputs, runtime: Runtime):
    handle = _handle_of(node, inputs[0])
    value = node.inputs[1]
    data = np.asarray(inputs[1])
    if is_float_view(value.dtype, value.quantization):
        data = quantize(data, value.quantization, value.dtype)     # exact: already on its grid
    elif value.dtype is not None:
        data = data.astype(value.dtype)
    runtime.resources[handle] = np.array(data, copy=True)
    return []


@dataclass(frozen=True)
class CallOnceOptions:
    init_subgraph_index: int


def _parse_call_once(opts) -> CallOnceOptions:
    return CallOnceOptions(init_subgraph_index=int(opts.InitSubgraphIndex()))


def _infer_call_once(node):
    return []


def _init_subgraph_index(options: CallOnceOptions) -> int:
    return options.init_subgraph_index


def _call_once_reference(node, inputs, runtime: Runtime):
    runtime.call_once(node.options.init_subgraph_index, node)
    return []


# -- Taichi: copies between the variable's slot (input 0's ref: io, the variable's shape) and
# the op's tensor, the slot read or written as codes under that tensor's grid ------------------
def _slot_for(slot: TensorRef, spec) -> TensorRef:
    """The variable's slot seen through `spec`'s quantization: integer codes meaning what that
    tensor's scale and zero point say (a float variable's slot holds its values)."""
    if not is_float_view(spec.dtype, spec.quantization):
        return slot
    q = spec.quantization
    lo, hi = quantized_range(spec.dtype)
    return TensorRef(IO_OUT, slot.offset, slot.shape,
                     (float(q.scale[0]), float(q.zero_point[0]), lo, hi), codes=True)


def _read_variable_taichi(node, io):
    out = io.outputs[0]
    if type(out) is TensorRef and out.quantized and not out.codes:
        # (q - zp) * scale under the output's own grid is a point of it: stored as it is,
        # without the snap's round trip (exact: the snap would give the same value)
        out = TensorRef(out.buffer, out.offset, out.shape, None, out.storage)
    return CopyStep(_slot_for(io.inputs[0], node.outputs[0]), out)


def _assign_variable_taichi(node, io):
    return CopyStep(io.inputs[1], _slot_for(io.inputs[0], node.inputs[1]))


VAR_HANDLE = register_op(OpDef(name="VAR_HANDLE", infer=_infer_var_handle,
                               reference=_var_handle_reference, parse=_parse_var_handle,
                               options_class="VarHandleOptions",
                               state=State(writes_resource_handle=True),
                               min_inputs=0, max_inputs=0))
READ_VARIABLE = register_op(OpDef(name="READ_VARIABLE", infer=_infer_read_variable,
                                  reference=_read_variable_reference,
                                  state=State(stateful=True, variable_access="read"),
                                  taichi=_read_variable_taichi,
                                  min_inputs=1, max_inputs=1))
ASSIGN_VARIABLE = register_op(OpDef(name="ASSIGN_VARIABLE", infer=_infer_assign_variable,
                                    reference=_assign_variable_reference,
                                    state=State(stateful=True, variable_access="write"),
                                    taichi=_assign_variable_taichi,
                                    min_inputs=2, max_inputs=2))
CALL_ONCE = register_op(OpDef(name="CALL_ONCE", infer=_infer_call_once,
                              reference=_call_once_reference, parse=_parse_call_once,
                              options_class="CallOnceOptions",
                              state=State(stateful=True, init_subgraph_of=_init_subgraph_index),
                              min_inputs=0, max_inputs=0))
