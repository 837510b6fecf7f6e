"""A subgraph prepared for execution: shapes inferred, constants folded, steps in order.

`prepare` walks the ops once, in graph order, calling each op's `infer` with the shapes (and,
where known, values) of its inputs. An op whose inputs are all known at prepare time is folded:
its reference runs once here (this is how SHAPE -> STRIDED_SLICE -> PACK -> RESHAPE chains and
float16 weights behind DEQUANTIZE become constants; SHAPE needs only its input's shape, which
prepare always knows). The rest are `Step`s, each run
on numpy by `run_step` (the executor's schedule loop walks them).

A stateful op whose infer names a `runtime` parameter (IF, WHILE: their output shapes are
those of the subgraphs they call) gets the interpreter's runtime there too, as its reference
does; `prepare` passes on the `runtime` it is given (None outside an Interpreter).
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field, replace
from typing import Optional

import numpy as np

from tflite_taichi import model as model_ir
from tflite_taichi.errors import ModelError, TensorTooLargeError, TfliteTaichiError, UnsupportedOpError
from tflite_taichi.ops.base import DataDependentShape, Node, OpDef, TensorSpec, lookup
from tflite_taichi.quant import dequantize, fake_quant, is_float_view, view_dtype


@dataclass
class Step:
    op: model_ir.Operator
    opdef: OpDef
    node: Node
    dynamic: bool = False   # output shapes known only at invoke (run_step infers them again)
    updates_state: bool = False   # overwrites variable tensors among its inputs (OpDef.state_inputs)
    max_bytes: Optional[int] = None   # the subgraph's limit per tensor, for run_step's shapes
    budget: Optional["ModelBudget"] = None   # the model's, for run_step's shapes (dynamic steps)


@dataclass
class PreparedGraph:
    subgraph: model_ir.Subgraph
    specs: dict            # tensor index -> TensorSpec (inferred shapes, float-view values of constants)
    constants: dict        # tensor index -> float-view value (model constants and folded results)
    steps: list            # ops left to run at invoke, in order
    folded: list           # indices of ops evaluated at prepare time
    dynamic: frozenset = frozenset()   # tensors whose shapes depend on run-time values
    variables: dict = None  # variable tensor index -> its float-view value at allocate/reset
    charges: tuple = (0, 0)  # (tensor bytes, largest temporary) charged to the model's budget
                             # preparing it, its calls' included (ModelBudget.call)


def resolve_ops(model: model_ir.Model) -> dict:
    """op index per subgraph -> (OpDef, parsed options); every unknown op reported at once."""
    missing = {}
    resolved = {}
    for sg in model.subgraphs:
        for op in sg.operators:
            opdef = lookup(op.name)
            if opdef is None:
                missing.setdefault(op.name, []).append(f"#{op.index}" if sg.index == 0
                                                      else f"#{op.index} of subgraph {sg.index}")
                continue
            lo, hi = opdef.versions
            if not lo <= op.version <= hi:
                missing.setdefault(f"{op.name} v{op.version} (supported v{lo}-v{hi})", []).append(
                    f"#{op.index}")
                continue
            resolved[(sg.index, op.index)] = (opdef, _parse_options(op, opdef))
    if missing:
        listing = "; ".join(f"{name} (op {', '.join(where)})" for name, where in missing.items())
        raise UnsupportedOpError(f"the model uses ops no implementation exists for: {listing}",
                                 ops=list(missing))
    return resolved


def _parse_options(op: model_ir.Operator, opdef: OpDef):
    try:
        raw = model_ir.read_options(op, opdef.options_class) if opdef.options_class else op
        return opdef.parse(raw)
    except ModelError:
        raise
    except Exception as e:  # a corrupt options table: decode errors of any kind
        raise ModelError(f"op #{op.index} ({op.name}): cannot read its options: {e}") from None


def constant_value(tensor: model_ir.Tensor) -> Optional[np.ndarray]:
    """The float view of a constant tensor (dequantized once), or None. (A sparse constant was
    densified by the model reader: model._read_sparse_constant.)"""
    if tensor.data is None:
        return None
    if is_float_view(tensor.dtype, tensor.quantization):
        return dequantize(tensor.data, tensor.quantization)
    return tensor.data


def spec_of(tensor: model_ir.Tensor, shape=None, value=None) -> TensorSpec:
    return TensorSpec(index=tensor.index, name=tensor.name,
                      shape=tuple(tensor.shape if shape is None else shape),
                      dtype=tensor.dtype, quantization=tensor.quantization, value=value)


@dataclass
class _Charges:
    """What one allocation, or one subgraph's preparation, has charged to a ModelBudget."""
    tensors: int = 0            # bytes of every tensor it holds, its calls' included
    temporary: int = 0          # the largest temporary array one op's reference makes
    calls: set = field(default_factory=set)     # the call preparations counted (their keys)

    def add(self, tensors: int, temporary: int) -> None:
        self.tensors += tensors
        self.temporary = max(self.temporary, temporary)


class ModelBudget:
    """The memory limits of one model (model.tensor_bytes): each tensor at most `per_tensor`
    bytes, and everything together at most TOTAL_FACTOR x that: the tensors of every subgraph
    prepared (the main graph's, its signatures' and init subgraphs', and those IF/WHILE call,
    once per set of shapes they are called with: the reference path keeps every intermediate
    of a call while the calls inside it run) plus the largest temporary array an op's numpy
    reference makes besides its outputs (OpDef.temp_bytes: CONV_2D's patches), which lives only
    while that op runs. One budget for the model, not one per subgraph: a fresh budget per
    nested IF let a 4 KB file ask for gigabytes. Charged as shapes are inferred, before the
    memory is allocated (a folded op's result: before its reference runs).

    Each subgraph preparation also tallies what it charges, the calls it makes included even
    where this allocation counted them already (PreparedGraph.charges): a cached call reused
    by a later allocation brings the calls inside it with it."""

    def __init__(self, per_tensor: Optional[int]):
        self.per_tensor = per_tensor
        self.limit = None if per_tensor is None else model_ir.TOTAL_FACTOR * per_tensor
        self._held = {}             # owner -> _Charges of its last successful allocation
        self._under_way = []        # _Charges of the allocations being made, outermost first
        self._tallies = []          # _Charges of the preparations under way, outermost first

    @property
    def busy(self) -> bool:
        return bool(self._under_way)

    @property
    def current(self) -> _Charges:
        """The charges of the innermost allocation under way."""
        return self._under_way[-1]

    @contextlib.contextmanager
    def allocating(self, owner):
        """Charges made inside go to `owner` (a subgraph state's index, a call preparation's
        key) and replace what its previous allocation held once this one succeeds; if it fails
        the previous charges stay (the owner keeps its previous tensors)."""
        previous = self._held.pop(owner, None)
        charges = _Charges()
        self._under_way.append(charges)
        try:
            yield charges
        except BaseException:
            if previous is not None:
                self._held[owner] = previous
            raise
        finally:
            self._under_way.remove(charges)
        self._held[owner] = charges

    @contextlib.contextmanager
    def preparing(self):
        """A subgraph's preparation: yields the tally of what it charges (PreparedGraph.charges)."""
        tally = _Charges()
        self._tallies.append(tally)
        try:
            yield tally
        finally:
            self._tallies.remove(tally)

    def release(self, keep=lambda owner: False) -> None:
        """Forgets the charges of owners `keep` does not keep (call preparations dropped)."""
        self._held = {owner: c for owner, c in self._held.items() if keep(owner)}

    def held(self) -> tuple:
        """(bytes of every tensor charged, the largest temporary among them): the allocations
        kept and those under way."""
        charges = list(self._held.values()) + self._under_way
        return sum(c.tensors for c in charges), max((c.temporary for c in charges), default=0)

    def headroom(self) -> Optional[int]:
        """Bytes left for what is not charged (invoke-time shapes); None without a limit."""
        if self.limit is None:
            return None
        tensors, temporary = self.held()
        return self.limit - tensors - temporary

    def tensor(self, where: str, what: str, shape, dtype, quantization=None) -> int:
        """Charges a tensor (`what`, in subgraph `where`) to the allocation under way:
        TensorTooLargeError naming it if it alone, or the model's tensors together, would pass
        the limits."""
        if self.per_tensor is None:
            return 0
        nbytes = model_ir.check_tensor_bytes(self.per_tensor, f"{where} {what}", shape, dtype,
                                             quantization)
        self._charge(nbytes, 0, lambda: f"{where}: with {what} of shape {list(shape)}")
        return nbytes

    def temporary(self, nbytes: int, where: str, what: str) -> None:
        """Charges the temporary arrays one op's reference makes while it runs (`nbytes`)."""
        if nbytes > 0:
            self._charge(0, nbytes, lambda: f"{where}: with the {nbytes} bytes of temporary "
                                            f"arrays the numpy reference of {what} makes")

    def call(self, key, charges: tuple, what: str) -> None:
        """Charges a cached call preparation (`charges`: PreparedGraph.charges) once per
        allocation, and once to each preparation under way."""
        for tally in self._tallies:
            if key not in tally.calls:
                tally.calls.add(key)
                tally.add(*charges)
        if self._under_way and key not in self.current.calls:
            self.current.calls.add(key)
            self._check(*charges, lambda: f"with {what}")

    def counted(self, key) -> None:
        """Marks a call preparation just made (its tensors charged as they were inferred) as
        counted in the allocation and the preparations under way."""
        for charges in self._tallies + self._under_way[-1:]:
            charges.calls.add(key)

    def _charge(self, tensors: int, temporary: int, describe) -> None:
        for tally in self._tallies:
            tally.add(tensors, temporary)
        self._check(tensors, temporary, describe)

    def _check(self, tensors: int, temporary: int, describe) -> None:
        """Adds to the allocation under way; TensorTooLargeError if the model passes its limit."""
        if self.limit is None or not self._under_way:
            return
        self.current.add(tensors, temporary)
        held, largest = self.held()
        if held + largest > self.limit:
            extra = f" + {largest} bytes of an op's temporary arrays" if largest else ""
            raise TensorTooLargeError(
                f"{describe()}, the model's tensors (all its subgraphs) would take {held} bytes "
                f"together{extra}, above the limit of {model_ir.TOTAL_FACTOR} x "
                f"{self.per_tensor} bytes (Interpreter(max_tensor_bytes=...))")


class _Budget:
    """One subgraph's preparation charging a ModelBudget, naming its tensors."""

    def __init__(self, subgraph: model_ir.Subgraph, model_budget: ModelBudget, tally: _Charges):
        self.sg = subgraph
        self.model = model_budget
        self._tally = tally

    def charges(self) -> tuple:
        """(tensor bytes, largest temporary) this preparation charged, its calls' included:
        what reusing it in another allocation adds (PreparedGraph.charges)."""
        return self._tally.tensors, self._tally.temporary

    def add(self, spec: TensorSpec, what: str = "tensor"):
        self.model.tensor(f"subgraph {self.sg.index}", f"{what} {spec.index} ('{spec.name}')",
                          spec.shape, spec.dtype, spec.quantization)

    def temporary(self, opdef: OpDef, node: Node):
        if opdef.temp_bytes is not None and self.model.limit is not None:
            self.model.temporary(int(opdef.temp_bytes(node)), f"subgraph {self.sg.index}",
                                 f"op #{node.index} ({node.op})")


def _check_channels(spec: TensorSpec, node: Node):
    """Per-channel quantization needs one scale per channel of its (inferred) shape."""
    q = spec.quantization
    if q is None or q.scale.size <= 1 or not spec.shape:
        return
    dim = q.quantized_dimension
    if not 0 <= dim < len(spec.shape) or spec.shape[dim] != q.scale.size:
        raise node.fail(f"output '{spec.name}' of shape {list(spec.shape)} has {q.scale.size} "
                        f"per-channel quantization scales along dimension {dim}")


def _check_data_tensors(subgraph: model_ir.Subgraph, op, opdef: OpDef):
    """Tensors without a numpy form (resource handles, strings) go only where they belong: only
    stateful ops (variables, subgraph calls) read them, and only an op that says it writes a
    handle (OpDef.writes_resource_handle: VAR_HANDLE) writes one."""
    if opdef.stateful:
        return
    for kind, indices in (("input", op.inputs), ("output", op.outputs)):
        for t in indices:
            if t == -1:
                continue
            tensor = subgraph.tensors[t]
            if tensor.dtype is None and not (kind == "output" and opdef.writes_resource_handle):
                raise ModelError(f"op #{op.index} ({op.name}): {kind} tensor {t} ('{tensor.name}') "
                                 f"is of type {tensor.type_name}, which this op cannot take")


def prepare(subgraph: model_ir.Subgraph, resolved: dict, input_shapes: dict,
            runtime=None, budget: Optional[ModelBudget] = None) -> PreparedGraph:
    """`budget`: the model's (an Interpreter's: ModelRuntime.budget), charged for every tensor
    before it is allocated; None: a budget of this subgraph alone."""
    if budget is None:
        budget = ModelBudget(subgraph.max_tensor_bytes)
    with contextlib.ExitStack() as scope:
        if not budget.busy:         # else inside an allocation (a subgraph state's, or a call's)
            scope.enter_context(budget.allocating(("subgraph", subgraph.index)))
        tally = scope.enter_context(budget.preparing())
        return _prepare(subgraph, resolved, input_shapes, runtime, _Budget(subgraph, budget, tally))


def _prepare(subgraph: model_ir.Subgraph, resolved: dict, input_shapes: dict, runtime,
             budget: _Budget) -> PreparedGraph:
    specs, constants = {}, {}
    model_budget = budget.model
    variables = {}
    for t in subgraph.tensors:
        value = constant_value(t)
        if t.is_variable and t.dtype is not None:
            # state kept across invokes (an LSTM's): its buffer, or zeros, is only the value at
            # allocate_tensors / reset_all_variables; never a constant, never folded
            budget.add(spec_of(t, shape=input_shapes.get(t.index)), "variable")   # before its zeros
            variables[t.index] = (np.zeros(input_shapes.get(t.index, t.shape), view_dtype(t.dtype, t.quantization))
                                  if value is None else np.array(value))
            value = None
        if value is not None:
            constants[t.index] = value
        specs[t.index] = spec_of(t, shape=input_shapes.get(t.index), value=value)
        if value is not None:
            budget.add(specs[t.index], "constant")
    for t in subgraph.inputs:
        if t not in constants:
            budget.add(specs[t], "input")

    steps, folded, dynamic = [], [], set()
    for op in subgraph.operators:
        opdef, options = resolved[(subgraph.index, op.index)]
        opdef.check_arity(op.index, len(op.inputs))
        _check_data_tensors(subgraph, op, opdef)
        node = Node(index=op.index, op=op.name, version=op.version, options=options,
                    inputs=tuple(specs[t] if t != -1 else None for t in op.inputs),
                    outputs=tuple(specs[t] for t in op.outputs))
        if any(t in dynamic for t in op.inputs):
            shapes = None           # reads a tensor of run-time shape
        else:
            try:
                shapes = _infer(opdef, node, runtime)
            except DataDependentShape:
                shapes = None
        if shapes is None:          # inferred again at every invoke (run_step); never folded
            dynamic.update(op.outputs)
            steps.append(Step(op=op, opdef=opdef, node=node, dynamic=True,
                              max_bytes=subgraph.max_tensor_bytes, budget=model_budget))
            continue
        for t, shape in zip(op.outputs, shapes):
            specs[t] = replace(specs[t], shape=shape)
            budget.add(specs[t])
        node = replace(node, outputs=tuple(specs[t] for t in op.outputs))
        budget.temporary(opdef, node)       # before a fold runs its reference
        for spec in node.outputs:
            _check_channels(spec, node)
        if opdef.foldable and not opdef.stateful and (opdef.reads_only_shapes or
                               all(s is None or s.value is not None for s in node.inputs)):
            outs = execute(opdef, node, [s.value if s else None for s in node.inputs])
            for t, v in zip(op.outputs, outs):
                constants[t] = v
                specs[t] = replace(specs[t], value=v)
            folded.append(op.index)
        else:
            steps.append(Step(op=op, opdef=opdef, node=node,
                              updates_state=bool(_state_targets(opdef, node, op, variables))))
    return PreparedGraph(subgraph=subgraph, specs=specs, constants=constants,
                         steps=steps, folded=folded, dynamic=frozenset(dynamic),
                         variables=variables, charges=budget.charges())


def _state_targets(opdef: OpDef, node: Node, op, variables: dict) -> list:
    """(position among the op's extra reference results, variable tensor index) for each input
    the op overwrites after it runs (OpDef.state_inputs) that is a variable tensor."""
    if opdef.state_inputs is None:
        return []
    return [(k, op.inputs[pos]) for k, pos in enumerate(opdef.state_inputs(node))
            if pos < len(op.inputs) and op.inputs[pos] in variables]


def _infer(opdef: OpDef, node: Node, runtime=None) -> list:
    try:
        if opdef.infer_takes_runtime:
            shapes = opdef.infer(node, runtime)
        else:
            shapes = opdef.infer(node)
        shapes = [tuple(int(d) for d in s) for s in shapes]
    except ModelError:
        raise
    except (ValueError, IndexError, TypeError, ZeroDivisionError, OverflowError, AttributeError,
            KeyError) as e:
        missing = [i for i, spec in enumerate(node.inputs) if spec is None]
        if missing:         # an omitted (-1) input the op needs: infer read it as a tensor
            raise node.fail(f"input {missing[0]} is omitted (-1), which this op does not allow "
                            f"({type(e).__name__}: {e})") from None
        raise node.fail(f"cannot infer output shapes: {e}") from None
    if len(shapes) != len(node.outputs):
        raise node.fail(f"has {len(node.outputs)} outputs, the op produces {len(shapes)}")
    for spec, shape in zip(node.outputs, shapes):
        if any(d < 0 for d in shape):
            raise node.fail(f"output '{spec.name}' would have a negative dimension {list(shape)}")
    return shapes


def execute(opdef: OpDef, node: Node, inputs: list, runtime=None, state=None,
            state_targets=()) -> list:
    """Run one op's reference and bring each output to its tensor's shape, dtype and float view.
    `runtime`: the interpreter's state (variables, subgraph calls), which stateful ops need.
    `state`: variable tensor values, updated for `state_targets` ((position among the op's
    state_inputs, variable tensor index): see _state_targets) from the reference's extra
    results."""
    if opdef.stateful and runtime is None:
        raise node.fail("keeps state across invokes and can run only inside an Interpreter")
    try:
        outs = (opdef.reference(node, inputs, runtime) if opdef.stateful
                else opdef.reference(node, inputs))
    except TfliteTaichiError:
        raise
    except (ArithmeticError, LookupError, TypeError, ValueError, AttributeError) as e:
        # The model handed the op what it cannot take (a dtype, a rank, a value its infer did
        # not check): a ModelError naming the op; the original error stays as the cause.
        raise node.fail(f"cannot compute on its inputs ({_describe(inputs)}): "
                        f"{type(e).__name__}: {e}") from e
    outs = list(outs)
    positions = tuple(opdef.state_inputs(node)) if opdef.state_inputs is not None else ()
    if len(outs) != len(node.outputs) + len(positions):
        raise node.fail(f"has {len(node.outputs)} outputs, its reference produced {len(outs)}")
    outs, new_states = outs[:len(node.outputs)], outs[len(node.outputs):]
    if state is not None:
        for k, t in state_targets:
            state[t] = _to_tensor(node, node.inputs[positions[k]], np.asarray(new_states[k]).reshape(
                node.inputs[positions[k]].shape))
    results = []
    for spec, out in zip(node.outputs, outs):
        out = np.asarray(out)
        if out.shape != spec.shape:
            raise node.fail(f"reference produced shape {list(out.shape)} for '{spec.name}', "
                            f"expected {list(spec.shape)}")
        results.append(_to_tensor(node, spec, out))
    return results


def _to_tensor(node: Node, spec: TensorSpec, out: np.ndarray) -> np.ndarray:
    """A reference result as the float view of `spec`'s tensor: its dtype, snapped to its
    quantization grid."""
    dtype = view_dtype(spec.dtype, spec.quantization) if spec.dtype is not None else out.dtype
    try:
        out = out.astype(dtype, copy=False)
    except (TypeError, ValueError):     # a resource handle for a tensor of another type
        raise node.fail(f"produces {out.dtype} values ({type(out.flat[0]).__name__ if out.size else '-'}) "
                        f"for '{spec.name}', a tensor of type {np.dtype(dtype).name}") from None
    if is_float_view(spec.dtype, spec.quantization):
        out = fake_quant(out, spec.quantization, spec.dtype)
    return out


def _describe(inputs) -> str:
    parts = []
    for x in inputs:
        if x is None:
            parts.append("-")
        else:
            a = np.asarray(x)
            parts.append(f"{a.dtype.name}{list(a.shape)}")
    return ", ".join(parts)


def run_step(step: Step, inputs: list, runtime=None, state=None) -> list:
    """One step on numpy. A dynamic step is inferred first from this invoke's input shapes,
    with its run-time inputs' values visible to infer as if they were constants (WHERE's count
    of true elements, a RESHAPE to a computed shape). `state`: the variable tensors' values,
    which a step that updates them (an LSTM's state) overwrites."""
    targets = (_state_targets(step.opdef, step.node, step.op, state)
               if step.updates_state and state is not None else ())
    if not step.dynamic:
        return execute(step.opdef, step.node, inputs, runtime, state, targets)
    node = step.node
    actual = tuple(None if spec is None else
                   replace(spec, shape=tuple(np.shape(x)), value=spec.value if spec.value is not None else x)
                   for spec, x in zip(node.inputs, inputs))
    node = replace(node, inputs=actual)
    shapes = _infer(step.opdef, node, runtime)
    node = replace(node, outputs=tuple(replace(spec, shape=shape) for spec, shape in zip(node.outputs, shapes)))
    _check_invoke_shapes(step, node)
    return execute(step.opdef, node, inputs, runtime, state, targets)


def _check_invoke_shapes(step: Step, node: Node) -> None:
    """The memory limits on this invoke's shapes: each output within the limit per tensor, and
    its outputs with its reference's temporaries within what the model's prepared tensors
    leave of its budget (their bytes were not known at allocate_tensors to be charged)."""
    total = 0
    for spec in node.outputs:
        total += model_ir.check_tensor_bytes(step.max_bytes, f"op #{node.index} ({node.op}) output "
                                             f"'{spec.name}'", spec.shape, spec.dtype, spec.quantization)
    headroom = step.budget.headroom() if step.budget is not None else None
    if headroom is None:
        return
    temporary = int(step.opdef.temp_bytes(node)) if step.opdef.temp_bytes is not None else 0
    if total + temporary > headroom:
        also = f" and {temporary} bytes of temporary arrays" if temporary else ""
        raise TensorTooLargeError(
            f"op #{node.index} ({node.op}): its outputs of shapes "
            f"{[list(s.shape) for s in node.outputs]} would take {total} bytes{also}, above the "
            f"{max(headroom, 0)} bytes the model's other tensors leave of its limit of "
            f"{model_ir.TOTAL_FACTOR} x {step.budget.per_tensor} bytes (Interpreter(max_tensor_bytes=...))")
