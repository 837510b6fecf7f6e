"""Which ops the delegate takes, and how they group into partitions.

An op is delegated when its OpDef has a Taichi implementation, every tensor it reads or
writes at run time is one the arena can carry (float32, float16, a quantized integer tensor
in its float view, or bool as 0/1; or a plain int32 run-time input the op declares as ids it
reads, OpDef.index_inputs), and its own `supports(node)` has no objection. Delegated ops
are grouped by their dependencies, as TFLite's partitioner does: a delegated op joins the
current partition unless it needs the result of a CPU op not yet run, so an op the delegate
refuses on a side branch does not split the graph; stateful ops (variables) keep their order
per variable. State a partition's ops read or write lives in slots of the program's io buffer
(`VariableSlot`): resource variables (READ/ASSIGN_VARIABLE: OpDef.variable_access) and variable
tensors an op overwrites with its Taichi part (an LSTM's: OpDef.taichi_writes_state). The
official delegate refuses those ops, which cut a streaming model into pieces. As in TFLite,
only the `max_delegated_partitions` largest partitions are kept
(default 1) and everything else runs on the reference path, in an order that respects every
dependency.
"""
from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
import warnings
from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np

from tflite_taichi import costs
from tflite_taichi.graph import PreparedGraph, Step
from tflite_taichi.quant import is_float_view

ARENA_DTYPES = {np.dtype(np.float32), np.dtype(np.float16), np.dtype(np.bool_)}

# The delegate's own choices (ops it keeps on the CPU on purpose) and where the ops ran are
# news, not something to act on: they are logged at INFO here; only what the delegate cannot
# take is a DelegateWarning. A library configures no handlers: the application decides.
_log = logging.getLogger("tflite_taichi.delegate")
logging.getLogger("tflite_taichi").addHandler(logging.NullHandler())


class DelegateWarning(UserWarning):
    """An op the delegate cannot take (what it keeps on the CPU by choice is logged instead)."""


@dataclass(frozen=True)
class VariableSlot:
    """State the delegate keeps on the device between invokes, in a slot of the program's io
    buffer: a resource variable (kind "resource", key its ops.state.ResourceHandle: its value's
    shape and dtype in the model, as every delegated READ/ASSIGN_VARIABLE of it in the subgraph
    declares them; an 8/16-bit variable's slot holds integer codes), or a variable tensor
    (kind "tensor", key its tensor index: an LSTM's state, as its float view)."""
    key: Any
    shape: tuple
    dtype: Any                        # numpy dtype of the host's array
    kind: str = "resource"

    @property
    def count(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))


@dataclass
class Partition:
    steps: list                       # graph-order Steps, all delegated
    inputs: list = field(default_factory=list)     # non-constant tensors read from outside
    outputs: list = field(default_factory=list)    # tensors written here and needed after it
    constants: list = field(default_factory=list)  # float constants its ops read
    variables: dict = field(default_factory=dict)  # handle or variable tensor -> the VariableSlot
                                                   # its ops address through it
    reads_first: dict = field(default_factory=dict)  # slot key -> the step reading it before any
                                                     # write here: its slot must be current
    assigns: list = field(default_factory=list)    # slot keys it writes


@dataclass
class Schedule:
    items: list                       # Partition or Step (a CPU op), in execution order
    refused: dict                     # op index -> reason it runs on the CPU
    chosen: frozenset = frozenset()   # those of `refused` the delegate could take but keeps on
                                      # the CPU by its own policy (auto's numpy ops, cost, the
                                      # partition limit, variable-only runs): logged, not warned

    @property
    def partitions(self) -> list:
        return [item for item in self.items if isinstance(item, Partition)]


def carried_by_arena(spec, runtime: bool = True) -> bool:
    """Float32 storage holds float16/32, bool (0/1) and the float view of 8/16-bit quantized
    tensors exactly; a quantized int32/int64 run-time tensor's grid (2^32 steps) it does not.
    A quantized int32 constant (a conv's bias) is dequantized once into the weights: carried."""
    if spec.dtype is None:
        return False
    dtype = np.dtype(spec.dtype)
    if dtype in ARENA_DTYPES:
        return True
    return is_float_view(dtype, spec.quantization) and (dtype.itemsize <= 2 or not runtime)


def delegate_reason(step: Step, fp16: bool = False, reference_ops=frozenset()) -> Optional[str]:
    """None if the delegate takes this op instance, else why not (TFLite's warning text):
    the CPU policy's reason first, then what the delegate cannot do."""
    return policy_reason(step, reference_ops) or capability_reason(step, fp16)


def policy_reason(step: Step, reference_ops=frozenset()) -> Optional[str]:
    """Why the CPU policy of `auto` keeps this op on numpy (a choice, not a limit), or None.
    `reference_ops`: op names that policy keeps on numpy (backend.cpu_reference_ops(): ops
    declaring OpDef.numpy_faster_on_cpu)."""
    if step.op.name in reference_ops and costs.numpy_wins_on_cpu(step):
        return ("backend='auto' without a GPU runs it on numpy, which is faster than Taichi's "
                "cpu kernel for this op at this size (BLAS and vectorised taps; measured per "
                "op)")
    return None


def capability_reason(step: Step, fp16: bool = False) -> Optional[str]:
    """None if the delegate can take this op instance, else why it cannot."""
    opdef, node = step.opdef, step.node
    if opdef.stateful:
        variable = variable_of(step)
        if variable is None and opdef.infer_takes_runtime:      # IF, WHILE, composites
            return ("it runs other subgraphs (subgraph calls): the host hands them their values "
                    "and reads a WHILE's condition; the subgraphs it calls are delegated on "
                    "their own (summary()['calls'])")
        if variable is None:
            return "it keeps state across invokes (variables, subgraph calls): that stays on the CPU"
        return _variable_reason(step, variable[1], fp16)
    if step.updates_state:
        reason = _state_reason(step)
        if reason is not None:
            return reason
    if step.dynamic:
        return "its output shape depends on values known only at invoke (a data-dependent shape)"
    index_inputs = carried_index_inputs(step)
    runtime_inputs = [s for i, s in enumerate(node.inputs)
                      if s is not None and s.value is None and i not in index_inputs]
    reason = _tensor_reason(runtime_inputs + list(node.outputs), fp16)
    if reason is not None:      # first: the tensors' types are the deeper reason (ARG_MAX's int32)
        return reason
    for spec in node.inputs:    # a float constant is data the kernel reads from the weights
        if (spec is not None and spec.value is not None and np.dtype(spec.dtype).kind == "f"
                and not carried_by_arena(spec, runtime=False)):
            return (f"constant '{spec.name}' is {np.dtype(spec.dtype).name}; the delegate's "
                    "weights are float32 (or float16)")
    if opdef.taichi is None:
        return "no Taichi implementation of this op yet"
    return opdef.supports(node)


def variable_of(step: Step) -> Optional[tuple]:
    """(resource, spec of the tensor holding its value in this op) of an op declaring
    OpDef.variable_access whose handle was folded at prepare, else None."""
    access, node = step.opdef.variable_access, step.node
    if access is None or not node.inputs or node.inputs[0] is None:
        return None
    handle = node.inputs[0].value
    if not (isinstance(handle, np.ndarray) and handle.dtype == object):
        return None
    spec = node.outputs[0] if access == "read" else node.inputs[1] if len(node.inputs) > 1 else None
    return (handle.item(), spec) if spec is not None else None


def _state_reason(step: Step) -> Optional[str]:
    """Why the delegate cannot keep the variable tensors this op overwrites (its state across
    invokes, e.g. an LSTM's) in its io slots, or None: its Taichi part must write them
    (OpDef.taichi_writes_state) and they must be plain float tensors (a quantized state would
    need the reference's snapping of the new values)."""
    if not step.opdef.taichi_writes_state:
        return ("it overwrites variable tensors (its state across invokes, e.g. an LSTM's): "
                "that stays on the CPU")
    for pos in step.opdef.state_inputs(step.node):
        spec = step.node.inputs[pos] if pos < len(step.node.inputs) else None
        if spec is not None and (spec.dtype is None or np.dtype(spec.dtype).kind != "f"
                                 or spec.quantization is not None):
            return (f"its state tensor '{spec.name}' is not a float tensor: the delegate keeps "
                    "float state only (the rest stays on the CPU)")
    return None


def _variable_reason(step: Step, spec, fp16: bool) -> Optional[str]:
    """Why the delegate cannot keep this variable access on the device, or None."""
    if step.dynamic:
        return "its output shape depends on values known only at invoke (a data-dependent shape)"
    reason = _tensor_reason([spec], fp16)
    if reason is not None:
        return reason
    if step.opdef.taichi is None:
        return "no Taichi implementation of this op yet"
    return step.opdef.supports(step.node)


def _variable_slots(graph: PreparedGraph, reasons: dict) -> dict:
    """resource -> VariableSlot for the variables whose delegated accesses agree on the value's
    shape and dtype; the accesses of a variable that is read or assigned as different tensors
    in one subgraph (LiteRT resizes it at run time) stay on the CPU, with the reason."""
    seen = {}
    for s in graph.steps:
        variable = variable_of(s) if reasons[s.op.index] is None else None
        if variable is not None:
            resource, spec = variable
            seen.setdefault(resource, []).append((s, tuple(spec.shape), np.dtype(spec.dtype)))
    slots = {}
    for resource, accesses in seen.items():
        forms = {(shape, dtype) for _, shape, dtype in accesses}
        if len(forms) == 1:
            (shape, dtype), = forms
            slots[resource] = VariableSlot(resource, shape, dtype)
            continue
        listed = ", ".join(sorted(f"{d.name} {list(sh)}" for sh, d in forms))
        for s, _, _ in accesses:
            reasons[s.op.index] = (f"variable {resource} is read or assigned as different tensors "
                                   f"in this subgraph ({listed}): the delegate keeps a variable "
                                   "in one slot of a fixed shape and type")
    return slots


def _only_variables(steps: list) -> bool:
    return all(s.opdef.variable_access is not None for s in steps)


def carried_index_inputs(step: Step) -> dict:
    """{input position: check or None} of the plain int32 run-time inputs this op's Taichi part
    reads as integers (OpDef.index_inputs: an embedding's ids). They come from the host (no
    delegated op writes int32), which writes them into io as float32: exact below 2**24."""
    opdef, node = step.opdef, step.node
    if opdef.index_inputs is None or opdef.taichi is None:
        return {}
    found = {}
    for i, check in opdef.index_inputs(node).items():
        spec = node.inputs[i] if i < len(node.inputs) else None
        if (spec is not None and spec.value is None and spec.dtype is not None
                and np.dtype(spec.dtype) == np.int32 and spec.quantization is None
                and 0 not in spec.shape):
            found[i] = check
    return found


def _tensor_reason(specs, fp16: bool) -> Optional[str]:
    """Why the delegate cannot carry these run-time tensors (constants are read at build time
    or packed), or None."""
    for spec in specs:
        if spec.dtype is not None and is_float_view(spec.dtype, spec.quantization) and not carried_by_arena(spec):
            return (f"tensor '{spec.name}' is {np.dtype(spec.dtype).name}-quantized: its 2^32-step "
                    "grid does not fit the delegate's float32 storage")
        if not carried_by_arena(spec):
            return (f"tensor '{spec.name}' is {np.dtype(spec.dtype).name if spec.dtype is not None else 'opaque'};"
                    " the delegate carries float data (float32, float16, quantized 8/16-bit, bool)")
        if 0 in spec.shape:
            return f"tensor '{spec.name}' is empty {list(spec.shape)}"
        if fp16 and is_float_view(spec.dtype, spec.quantization) and np.dtype(spec.dtype).itemsize > 1:
            return (f"tensor '{spec.name}' is {np.dtype(spec.dtype).name}-quantized: its grid does "
                    "not fit in float16 storage (precision='fp16')")
        if spec.quantization is not None and spec.quantization.per_channel:
            return f"tensor '{spec.name}' has per-channel quantization at run time"
    return None


def build_schedule(graph: PreparedGraph, max_partitions: int = 1, fp16: bool = False,
                   warn: bool = True, preserve_all: bool = False,
                   reference_ops=frozenset(), cost_backend=None, called: bool = False,
                   backend: Optional[str] = None) -> Schedule:
    """preserve_all: every tensor a partition writes is copied back to the host (LiteRT's
    experimental_preserve_all_tensors), so get_tensor reads intermediates; costs transfers.
    cost_backend: backend='auto' on this GPU backend: a partition that numpy runs faster by
    costs.py's estimate stays on the CPU. called: the subgraph is one that IF/WHILE call
    (executor.DelegatedCall), whose every call pays the host's round trips too. backend: the
    Taichi backend the delegate runs on, as its warnings name it."""
    reasons, chosen = {}, set()
    for s in graph.steps:
        policy = policy_reason(s, reference_ops)
        if policy is not None:
            chosen.add(s.op.index)
        reasons[s.op.index] = policy or capability_reason(s, fp16)
    slots = _variable_slots(graph, reasons)
    groups = _group_by_dependencies(graph, {i for i, r in reasons.items() if r is None})
    # a run of variable reads and writes alone (an init subgraph's assignments) computes nothing
    # on the device: a program for it would cost a compile and a launch more than the host's copy
    idle = [g for delegated, g in groups if delegated and _only_variables(g)]
    for run in idle:
        for step in run:
            chosen.add(step.op.index)
            reasons[step.op.index] = ("a partition of variable reads and writes alone computes "
                                      "nothing on the device: the host copies the values")
    if idle:
        groups = _group_by_dependencies(graph, {i for i, r in reasons.items() if r is None})
    runs = [g for delegated, g in groups if delegated]
    keep = sorted(runs, key=len, reverse=True)[:max(max_partitions, 0)]
    if cost_backend is not None:
        for run in list(keep):
            faster = costs.cpu_is_faster(run, cost_backend, called)
            if faster is not None:
                keep.remove(run)
                for step in run:
                    chosen.add(step.op.index)
                    reasons[step.op.index] = (
                        f"backend='auto': numpy runs its partition of {len(run)} op(s) faster than "
                        f"{cost_backend} (estimated {faster[0]:.0f} us against {faster[1]:.0f} us, "
                        "mostly the GPU's launch and wait: tflite_taichi/costs.py)")
    kept_ids = {id(r) for r in keep}
    for run in runs:
        if id(run) not in kept_ids:
            for step in run:
                reasons.setdefault(step.op.index, None)
                if reasons[step.op.index] is None:
                    chosen.add(step.op.index)
                    reasons[step.op.index] = (
                        f"ops that run on the CPU separate it from the delegated ones, and the "
                        f"delegate takes only the {max_partitions} largest group(s) of connected "
                        f"ops (partitions: max_delegated_partitions={max_partitions}"
                        f"{', the default' if max_partitions == 1 else ''})")
    items = []
    for delegated, group in groups:
        if delegated and id(group) in kept_ids:
            items.append(_partition(group, graph, preserve_all, slots))
        else:
            items.extend(group)
    refused = {i: r for i, r in reasons.items() if r is not None}
    schedule = Schedule(items=items, refused=refused, chosen=frozenset(chosen.intersection(refused)))
    if warn:
        _report(schedule, graph, backend)
    return schedule


def _dependencies(graph: PreparedGraph) -> dict:
    """op index -> indices of the ops it must run after: the producers of its inputs, and for
    a stateful op the earlier stateful ops touching the same variable (an op whose variable is
    not known at prepare, such as CALL_ONCE, orders against every stateful op)."""
    producer = {t: s.op.index for s in graph.steps for t in s.op.outputs}
    deps, last_on, stateful_so_far, barrier = {}, {}, [], None
    for s in graph.steps:
        d = {producer[t] for t in s.op.inputs if t in producer}
        if s.opdef.stateful:
            variable = variable_of(s)
            resource = variable[0] if variable is not None else None
            if resource is None:                       # orders against all state
                d.update(stateful_so_far)
                barrier = s.op.index
            else:
                if resource in last_on:
                    d.add(last_on[resource])
                if barrier is not None:
                    d.add(barrier)
                last_on[resource] = s.op.index
            stateful_so_far.append(s.op.index)
        deps[s.op.index] = d
    return deps


def _group_by_dependencies(graph: PreparedGraph, delegated: set) -> list:
    """[(is_delegated, [steps])] in an order that respects every dependency, with as few
    delegated groups as possible: as TFLite's partitioner does, alternately take every CPU op
    that is ready, then every delegated op that is ready (one group = one partition), so a
    delegated op does not wait for a CPU op it does not depend on."""
    deps = _dependencies(graph)
    done, pending, groups = set(), list(graph.steps), []
    want_delegated = False
    while pending:
        taken, rest = [], []
        for s in pending:                    # graph order is topological: one pass suffices
            ready = (s.op.index in delegated) == want_delegated and deps[s.op.index] <= done
            (taken if ready else rest).append(s)
            if ready:
                done.add(s.op.index)
        if taken:
            groups.append((want_delegated, taken))
        pending = rest
        want_delegated = not want_delegated
    return groups


def _partition(steps: list, graph: PreparedGraph, preserve_all: bool = False,
               slots: Optional[dict] = None) -> Partition:
    inside = {t for s in steps for t in s.op.outputs}
    members = {s.op.index for s in steps}
    p = Partition(steps=steps)
    _address_variables(p, slots or {}, graph)
    for s in steps:
        for t in s.op.inputs:
            if t == -1 or t in inside:
                continue
            if graph.specs[t].value is not None:
                if t not in p.constants and carried_by_arena(graph.specs[t], runtime=False):
                    p.constants.append(t)
            elif t not in p.inputs and t not in p.variables:
                p.inputs.append(t)
    # every reader outside the partition runs after it (it depends on it)
    needed_outside = set(graph.subgraph.outputs)
    for s in graph.steps:
        if s.op.index not in members:
            needed_outside.update(t for t in s.op.inputs if t != -1)
    p.outputs = [t for s in steps for t in s.op.outputs if preserve_all or t in needed_outside]
    return p


def _address_variables(p: Partition, slots: dict, graph: PreparedGraph) -> None:
    """The state slots the partition's ops address: resource variables (through their handle
    tensors) and variable tensors (read as inputs; overwritten by an op declaring
    taichi_writes_state); which of them it reads before writing (the host makes those current
    first) and which it writes (the device then holds their newest value)."""
    touched = set()

    def access(tensor, slot, step, writes):
        p.variables[tensor] = slot
        if slot.key not in touched:
            touched.add(slot.key)
            if not writes or step.opdef.variable_access is None:   # an LSTM reads its state first
                p.reads_first[slot.key] = step
        if writes and slot.key not in p.assigns:
            p.assigns.append(slot.key)

    state_tensors = graph.variables or {}
    for s in p.steps:
        variable = variable_of(s)
        if variable is not None:
            access(s.op.inputs[0], slots[variable[0]], s, s.opdef.variable_access == "write")
            continue
        written = set()
        if s.updates_state:
            written = {s.op.inputs[pos] for pos in s.opdef.state_inputs(s.node)
                       if pos < len(s.op.inputs)}
        for t in s.op.inputs:
            if t != -1 and t in state_tensors:
                value = state_tensors[t]
                access(t, VariableSlot(t, tuple(value.shape), value.dtype, "tensor"), s, t in written)


def _report(schedule: Schedule, graph: PreparedGraph, backend: Optional[str]):
    """TFLite's delegate lines, one per op kind and reason (with the op codes), then one
    summary line naming where the delegated ops run. What the delegate cannot take is a
    DelegateWarning; what it keeps on the CPU by choice, and the summary, are logged at INFO.
    The full list, op by op, is summary()["fallback"] (and `tflite-taichi inspect`)."""
    names = {s.op.index: s.op.name for s in graph.steps}
    where = f" of subgraph {graph.subgraph.index}" if graph.subgraph.index else ""
    groups: dict = {}
    for index, reason in sorted(schedule.refused.items()):
        # reasons that differ only in the tensor they name ('c0', 'c1') are one kind
        key = (names[index], index in schedule.chosen, re.sub(r"'[^']*'", "''", reason))
        groups.setdefault(key, []).append(index)
    for (name, by_choice, _), indices in groups.items():
        reason = schedule.refused[indices[0]]
        if len(indices) == 1:
            ops = f"op code #{indices[0]} ({name})"
        else:
            shown = ", ".join(f"#{i}" for i in indices[:8]) + (", ..." if len(indices) > 8 else "")
            ops = f"{len(indices)} {name} ops (op codes {shown})"
            if any(schedule.refused[i] != reason for i in indices):
                reason += f" (op #{indices[0]}'s words; the others name their own tensors)"
        line = f"{ops}{where} cannot be handled by this delegate: {reason}"
        if by_choice:
            _log.info(line)         # the text itself as the record's msg: filters can read it
        else:
            _warn_user(f"WARNING: {line}")
    delegated = sum(len(p.steps) for p in schedule.partitions)
    _log.info(f"{delegated} of {len(graph.steps)} ops{where} run on {_delegate_name(backend)} in "
              f"{len(schedule.partitions)} partition(s); {len(graph.steps) - delegated} run on the "
              f"CPU; {len(graph.folded)} computed once at load")


def _delegate_name(name: Optional[str]) -> str:
    if name == "cpu":
        return "the delegate's cpu backend (Taichi on the CPU, no GPU)"
    return f"the GPU delegate ({name})" if name else "the GPU delegate"


_PACKAGE_DIRS: Optional[tuple] = None


def _warn_user(message: str) -> None:
    """A DelegateWarning attributed to the user's line that led here (allocate_tensors(), the
    Interpreter's construction), not to our internals: Python then prints that line."""
    global _PACKAGE_DIRS
    if _PACKAGE_DIRS is None:
        from tflite_taichi import ops, quant     # below: graph and quant import them already
        here = os.path.dirname(os.path.abspath(__file__))       # the package's own folder
        _PACKAGE_DIRS = (here + os.sep,) + tuple(os.path.dirname(os.path.abspath(m.__file__)) + os.sep
                                                for m in (ops, quant))
    frame = sys._getframe(1)
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(_PACKAGE_DIRS):
        frame = frame.f_back
    if frame is None:
        warnings.warn(message, DelegateWarning, stacklevel=2)
        return
    registry = frame.f_globals.setdefault("__warningregistry__", {})
    warnings.warn_explicit(message, DelegateWarning, frame.f_code.co_filename, frame.f_lineno,
                           module=frame.f_globals.get("__name__", "__main__"), registry=registry)


class _LinesHandler(logging.Handler):
    """Each record as one line tagged with its level ("INFO: ..."), appended to a list."""

    def __init__(self, lines: list):
        super().__init__(logging.INFO)
        self.lines = lines

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(f"{record.levelname}: {record.getMessage()}")


@contextlib.contextmanager
def notes_into(lines: list):
    """The delegate's logged notes while the block runs, appended to `lines` as "INFO: ..."
    strings and kept from every other handler: for callers that say them their own way (the
    command line's -v, testing's workers). Pass the list catch_warnings(record=True) fills to
    keep warnings and notes in the order they came."""
    handler = _LinesHandler(lines)
    level, propagate = _log.level, _log.propagate
    _log.addHandler(handler)
    _log.setLevel(logging.INFO)
    _log.propagate = False
    try:
        yield lines
    finally:
        _log.removeHandler(handler)
        _log.setLevel(level)
        _log.propagate = propagate
