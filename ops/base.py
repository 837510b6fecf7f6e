"""The op contract: an `OpDef` per op, a registry, and what an op sees of the graph (`Node`).

Each op is defined once (docs/ops.md):
- `parse`     builtin options table (from the `tflite` bindings) -> a small frozen dataclass;
- `infer`     output shapes from the node's input shapes (and constant values where a shape
              depends on them, e.g. RESHAPE's shape tensor);
- `reference` numpy on the float view: quantized tensors arrive dequantized to float32 and the
              runtime quantization-simulates the outputs, so a reference is plain float math;
- `supports`  None, or why the Taichi delegate cannot take this instance;
- `taichi`    the Taichi implementation (the delegate's part; None until it has one).

An op whose output shape depends on run-time *values* (WHERE of a run-time condition) raises
`DataDependentShape` from infer: graph.prepare then leaves it and everything that reads its
outputs to be inferred again at each invoke, on the CPU (as LiteRT's dynamic tensors).

A `stateful` op (its `State`: resource variables, CALL_ONCE) has a reference taking a third
argument, the interpreter's runtime (`resources`: the variables; `call_once(subgraph_index, node)`).
"""
from __future__ import annotations

import importlib
import os
import sys
from dataclasses import dataclass
from typing import Any, Callable, Optional, Protocol, Sequence

import numpy as np

from tflite_taichi.errors import ModelError
# Quantization lives below the model reader and the float view, which build and read it
# without importing ops; re-exported here, its old home
from tflite_taichi.tensors import Quantization  # noqa: F401


class DataDependentShape(ModelError):
    """Raised by an op's infer: its output shape is known only from run-time values. A
    ModelError, so that where no invoke-time inference follows it still reads as one."""


@dataclass(frozen=True)
class TensorSpec:
    """What an op sees of one tensor when the graph is prepared."""

    index: int
    name: str
    shape: tuple
    dtype: np.dtype          # the model's dtype (int8 for a quantized tensor)
    quantization: Optional[Quantization] = None
    value: Optional[np.ndarray] = None   # float-view value when known at prepare time

    @property
    def is_quantized(self) -> bool:
        return self.quantization is not None

    @property
    def rank(self) -> int:
        return len(self.shape)


@dataclass(frozen=True)
class Node:
    """One operator instance, as handed to infer/reference/supports."""

    index: int
    op: str
    version: int
    options: Any
    inputs: tuple            # TensorSpec, or None for an omitted optional input (-1)
    outputs: tuple           # TensorSpec (shapes as declared until inferred)

    def input_value(self, i: int, what: str) -> np.ndarray:
        """The constant value of input `i`; ModelError if it is only known at run time."""
        spec = self.inputs[i] if i < len(self.inputs) else None
        if spec is None:
            raise ModelError(f"op #{self.index} ({self.op}): input {i} ({what}) is missing")
        if spec.value is None:
            # a run-time value (a loop counter in a WHILE body, a computed shape): the op is
            # inferred again at every invoke with the value known, as LiteRT's dynamic tensors
            raise DataDependentShape(
                f"op #{self.index} ({self.op}): {what} (tensor '{spec.name}') is known only at "
                "invoke")
        return spec.value

    def fail(self, message: str) -> ModelError:
        return ModelError(f"op #{self.index} ({self.op}): {message}")


def no_options(_options) -> None:
    return None


def _no_restrictions(_node: Node) -> Optional[str]:
    return None


@dataclass(frozen=True)
class Fusion:
    """How the delegate may fuse an op with its neighbours, declared by the op (codegen links
    the chains; it never names an op): OpDef(fusion=Fusion(...)); the default fuses nothing."""

    moves_values: bool = False               # every output element is an input element as it
                                             # is (slices, concatenations, transposes): where
                                             # its data inputs share the output's grid, the
                                             # delegate stores without snapping to it (planner)
    stores_once: bool = False                # its Taichi step writes each output element once,
                                             # with its final value, through out.store(): an
                                             # element-wise reader can run inside that store
    epilogue_inputs: Optional[Callable] = None  # node -> input positions the op can take as a
                                             # value handed over by its producer's store (element-
                                             # wise ops): its step has fused_store(arena, weights,
                                             # io, flat, value, position) (kit.EpilogueRef)
    computed_at_load: bool = False           # cheap enough to compute at the load of its only
                                             # reader when that is element-wise (PAD, binary
                                             # arithmetic): its step has fused_load(arena,
                                             # weights, io, flat) -> element `flat` of its output,
                                             # snapped (kit.LoadRef), and the delegate never
                                             # stores that output
    alias_input: Optional[int] = None        # the output is this input's data, reshaped (RESHAPE,
                                             # SQUEEZE, EXPAND_DIMS): the delegate addresses the
                                             # input instead of copying it


NO_FUSION = Fusion()


def _first_input(_node) -> tuple:
    return (0,)


# an element-wise op of one data input (activations, casts, (de)quantization): it stores each
# element once, and runs inside its producer's store
ELEMENTWISE_UNARY = Fusion(stores_once=True, epilogue_inputs=_first_input)


@dataclass(frozen=True)
class State:
    """What state an op reads or writes beyond its inputs and outputs, declared by the op (the
    pipeline never names an op): OpDef(state=State(...)); the default keeps none. OpDef reads
    each field as its own attribute too (opdef.stateful is opdef.state.stateful)."""

    stateful: bool = False                   # reads/writes the interpreter's state (variables,
                                             # subgraph calls): never folded or delegated, kept in
                                             # order; reference(node, inputs, runtime)
    infer_takes_runtime: bool = False        # infer(node, runtime): its output shapes come from
                                             # running a subgraph (IF, WHILE); stateful ops only
    state_inputs: Optional[Callable] = None  # node -> input positions the op overwrites after it
                                             # runs when they are variable tensors (an LSTM's
                                             # state): its reference returns their new values
                                             # after its outputs
    taichi_writes_state: bool = False        # its Taichi part writes those new values too
                                             # (into StepIO.state): the delegate takes it with
                                             # float variable tensors, which then live in slots
                                             # of its io buffer between invokes
    init_subgraph_of: Optional[Callable] = None  # options -> index of the subgraph the op
                                             # runs once to initialise state (CALL_ONCE): the
                                             # interpreter prepares it with the model
    writes_resource_handle: bool = False     # its outputs may be resource tensors (VAR_HANDLE),
                                             # which have no numpy form
    variable_access: Optional[str] = None    # "read" (output 0 is the value) or "write" (input
                                             # 1 is): a stateful op on the resource variable its
                                             # input 0's handle names. The delegate takes it, with
                                             # its Taichi part, where the handle is known at
                                             # prepare: the variable then lives in a slot of the
                                             # program's io buffer (partition.VariableSlot), which
                                             # the Taichi part reads or writes as input 0


NO_STATE = State()


@dataclass(frozen=True)
class OpDef:
    """One op, defined once. See the module docstring for the parts."""

    name: str
    infer: Callable[[Node], Sequence[tuple]]  # infer(node), or infer(node, runtime) with
                                             # state.infer_takes_runtime (ops that run subgraphs)
    reference: Callable[[Node, list], list]   # reference(node, inputs); state.stateful: (node,
                                             # inputs, runtime)
    # parse(raw) -> the node's options. With options_class set, raw is that builtin options table
    # of the operator (the `tflite` bindings' class, e.g. Conv2DOptions); with options_class None,
    # raw is the whole model.Operator (custom ops read `custom_options`, StableHLO ops
    # `builtin_options_2`)
    parse: Callable[[Any], Any] = no_options
    options_class: Optional[str] = None      # e.g. "Conv2DOptions"; None: parse gets the Operator
    versions: tuple = (1, 1 << 30)           # inclusive range of op versions accepted
    supports: Callable[[Node], Optional[str]] = _no_restrictions   # checked only when taichi is set
    taichi: Any = None                       # (node, StepIO) -> an object with a ti.func run(arena, weights, io)
    pack: Optional[Callable] = None          # (node, input position, float32 value) -> the constant
                                             # laid out for the Taichi part's kernel, or None: as is
    scratch: Optional[Callable] = None       # node -> float32 elements of scratch its Taichi
                                             # part needs (split-K partial sums), or 0
    temp_bytes: Optional[Callable] = None    # node -> bytes of the temporary arrays its numpy
                                             # reference makes at once besides its outputs, where
                                             # they can dwarf them (CONV_2D's patches): charged
                                             # to the model's memory budget (graph.ModelBudget)
    foldable: bool = True                    # may be evaluated at prepare when inputs are constant
    reads_only_shapes: bool = False          # output depends on input shapes alone (SHAPE): always folded
    fusion: Fusion = NO_FUSION               # how the delegate may fuse it with its neighbours
    state: State = NO_STATE                  # what state it keeps across ops and invokes
    index_inputs: Optional[Callable] = None  # node -> {input position: check or None}: plain
                                             # int32 run-time inputs (ids, indices) its Taichi part
                                             # reads; partition lets them in, the host writes them
                                             # into io as float32 (exact below 2**24: the op's
                                             # supports() refuses larger ranges) and calls
                                             # check(value) first, which raises InputError for
                                             # values the op refuses (an id out of range)
    input_ranges: Optional[Callable] = None  # node -> {input position: (low, high)}: the
                                             # integers it accepts there (ids within a table,
                                             # indices within an axis: low <= v < high), so that
                                             # made-up inputs are valid (testing.model_random_inputs:
                                             # `tflite-taichi run` and `bench` without --input)
    # what the runtime needs to know about the op, declared by the op (no op names elsewhere):
    numpy_faster_on_cpu: bool = False        # backend='auto' without a hardware GPU keeps it on
                                             # numpy rather than Taichi's cpu backend where its
                                             # work is big enough (costs.numpy_wins_on_cpu;
                                             # measured per op: bench/results/cpu_2core.md)
    litert_checks_omitted_inputs: bool = False  # its LiteRT kernel tests each optional input
                                             # before reading it, so a model that omits one (-1)
                                             # may run on LiteRT (backend 'litert'); every other
                                             # LiteRT kernel reads its inputs by position, where
                                             # an omitted one is a null pointer (a RESHAPE whose
                                             # shape input was -1 crashed LiteRT)
    litert_leaves_rows_unwritten: bool = False  # its LiteRT kernel writes only part of its
                                             # outputs (TFLite_Detection_PostProcess: the first
                                             # num_detections rows), the rest is whatever its
                                             # arena held: it stays off LiteRT islands, where the
                                             # other paths' zeros are the answer
    min_inputs: int = 1
    max_inputs: Optional[int] = None

    # State's fields, read through the op (the pipeline asks opdef.stateful)
    stateful = property(lambda self: self.state.stateful)
    infer_takes_runtime = property(lambda self: self.state.infer_takes_runtime)
    state_inputs = property(lambda self: self.state.state_inputs)
    taichi_writes_state = property(lambda self: self.state.taichi_writes_state)
    init_subgraph_of = property(lambda self: self.state.init_subgraph_of)
    writes_resource_handle = property(lambda self: self.state.writes_resource_handle)
    variable_access = property(lambda self: self.state.variable_access)

    def check_arity(self, node_index: int, n_inputs: int):
        hi = self.max_inputs if self.max_inputs is not None else n_inputs
        if not self.min_inputs <= n_inputs <= hi:
            want = (f"{self.min_inputs}" if self.min_inputs == hi
                    else f"{self.min_inputs} to {hi}")
            raise ModelError(f"op #{node_index} ({self.name}): takes {want} inputs, has {n_inputs}")


REGISTRY: dict = {}

# The built-in op families are imported when a model first names one of their ops (index.py
# maps each built-in name to its module): importing every family cost more than the rest of
# `import tflite_taichi` together. _OWNERS records which module's body registered each name
# (tests/test_ops_index.py holds index.py to it); _BUILTIN keeps each built-in definition as
# its family registered it, whatever a user replaces it with later.
_OWNERS: dict = {}
_BUILTIN: dict = {}
_PACKAGE = __name__.rsplit(".", 1)[0]


def _family_of(name: str) -> Optional[str]:
    """The full module name of the built-in family defining `name`, or None."""
    from .index import OP_MODULES
    family = OP_MODULES.get(name)
    return f"{_PACKAGE}.{family}" if family else None


def _registering_module() -> Optional[str]:
    """The module whose body is running (the innermost module-level frame): the family for a
    built-in op, whichever helper of common/kit it registers through."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "<module>":
            return frame.f_globals.get("__name__")
        frame = frame.f_back
    return None


def _same_definition(a: OpDef, b: OpDef) -> bool:
    """Whether two OpDefs come from the same source: the same functions by module file and
    name (a module imported twice, e.g. as a script and as a module, defines its op twice)."""
    def where(fn):              # the file by its real path: a script's may be relative
        code = getattr(fn, "__code__", None)
        return (getattr(fn, "__qualname__", None),
                os.path.realpath(code.co_filename) if code else None)
    return where(a.infer) == where(b.infer) and where(a.reference) == where(b.reference)


def register_op(opdef: OpDef, *, replace: bool = False) -> OpDef:
    """Register an op implementation under its name (a builtin name or 'CUSTOM:<code>').
    Registering a name again is an error unless `replace=True` or it is the same definition
    again (its module imported a second time)."""
    if not isinstance(opdef, OpDef):
        raise TypeError("register_op takes an OpDef")
    if opdef.state.infer_takes_runtime and not opdef.state.stateful:
        raise ValueError(f"op {opdef.name}: infer_takes_runtime is for stateful ops (they run "
                         "subgraphs through the runtime)")
    family = _family_of(opdef.name)
    if family is not None:
        # the built-in first, so that a user's definition replaces it (or is refused without
        # replace=True) as if every family had been imported at `import tflite_taichi`
        importlib.import_module(family)
    if opdef.name in REGISTRY and not replace and not _same_definition(REGISTRY[opdef.name], opdef):
        raise ValueError(f"op {opdef.name} is already registered (pass replace=True)")
    owner = _registering_module()
    REGISTRY[opdef.name] = opdef
    _OWNERS[opdef.name] = owner
    if family is not None and owner == family:
        _BUILTIN.setdefault(opdef.name, opdef)
    return opdef


def lookup(name: str) -> Optional[OpDef]:
    """The op registered under `name`, importing its built-in family on first use."""
    opdef = REGISTRY.get(name)
    if opdef is None:
        family = _family_of(name)
        if family is not None:
            importlib.import_module(family)
            opdef = REGISTRY.get(name)
            if opdef is None:       # index.py out of date (its test says so): still answer
                load_all()
                opdef = REGISTRY.get(name)
    return opdef


def load_all() -> dict:
    """Import every built-in family; returns REGISTRY (the built-in ops and the user's)."""
    from .index import OP_MODULES
    for family in sorted(set(OP_MODULES.values())):
        importlib.import_module(f"{_PACKAGE}.{family}")
    return REGISTRY


def builtin(name: str) -> Optional[OpDef]:
    """The definition tflite_taichi itself gives `name` (None for a user's op): a compile
    worker process knows only these."""
    lookup(name)
    return _BUILTIN.get(name)


class Runtime(Protocol):
    """What a `stateful` op may ask of the interpreter running it (the third argument of its
    reference, the second of a subgraph-calling op's infer). The interpreter's runtime is one;
    ops never reach past it. `prepared` values are opaque to ops beyond `.subgraph` and `.specs`
    (graph.PreparedGraph, which ops may not import: the pipeline sits above them)."""

    resources: Any                      # resource handle -> its value, in the model's dtype
                                        # (`get(handle)`, `[handle] = value`: a
                                        # tflite_taichi.variables.Variables, which fetches a
                                        # value the delegate holds on the device); as
                                        # long-lived as the interpreter, shared by subgraphs

    def subgraph(self, index: int, node: Node, role: str = "called") -> Any:
        """The model's subgraph `index`, as named by `node` (ModelError if out of range)."""

    def prepare_subgraph(self, index: int, input_shapes, node: Node) -> Any:
        """Subgraph `index` prepared for inputs of `input_shapes` (ModelError on recursion)."""

    def run_subgraph(self, prepared: Any, feeds: dict) -> dict:
        """Run a prepared subgraph on the reference path; every tensor's float view."""

    def call_once(self, subgraph_index: int, node: Node) -> None:
        """Run init subgraph `subgraph_index` unless this interpreter already has."""
