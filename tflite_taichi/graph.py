"""A subgraph prepared for execution: shapes inferred, constants folded, steps in order.

`prepare` walks the ops once, in graph order, calling each op's `infer` with the shapes (and,
where known, values) of its inputs. An op whose inputs are all known at prepare time is folded:
its reference runs once here (this is how SHAPE -> STRIDED_SLICE -> PACK -> RESHAPE chains and
float16 weights behind DEQUANTIZE become constants; SHAPE needs only its input's shape, which
prepare always knows). The rest are `Step`s for `run_reference`.

A stateful op whose infer names a `runtime` parameter (IF, WHILE: their output shapes are
those of the subgraphs they call) gets the interpreter's runtime there too, as its reference
does; `prepare` passes on the `runtime` it is given (None outside an Interpreter).
"""
from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass, replace
from typing import Optional

import numpy as np

from tflite_taichi import model as model_ir
from tflite_taichi.errors import ModelError, UnsupportedOpError
from tflite_taichi.ops.base import DataDependentShape, Node, OpDef, TensorSpec, lookup
from tflite_taichi.quant import dequantize, fake_quant, is_float_view, view_dtype


@dataclass
class Step:
    op: model_ir.Operator
    opdef: OpDef
    node: Node
    dynamic: bool = False   # output shapes known only at invoke (run_step infers them again)


@dataclass
class PreparedGraph:
    subgraph: model_ir.Subgraph
    specs: dict            # tensor index -> TensorSpec (inferred shapes, float-view values of constants)
    constants: dict        # tensor index -> float-view value (model constants and folded results)
    steps: list            # ops left to run at invoke, in order
    folded: list           # indices of ops evaluated at prepare time
    dynamic: frozenset = frozenset()   # tensors whose shapes depend on run-time values


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


def prepare(subgraph: model_ir.Subgraph, resolved: dict, input_shapes: dict,
            runtime=None) -> PreparedGraph:
    specs, constants = {}, {}
    for t in subgraph.tensors:
        value = constant_value(t)
        if value is not None:
            constants[t.index] = value
        specs[t.index] = spec_of(t, shape=input_shapes.get(t.index), value=value)

    steps, folded, dynamic = [], [], set()
    for op in subgraph.operators:
        opdef, options = resolved[(subgraph.index, op.index)]
        opdef.check_arity(op.index, len(op.inputs))
        for t in op.inputs:
            if t != -1 and subgraph.tensors[t].is_variable and t not in constants:
                raise ModelError(f"op #{op.index} ({op.name}): reads variable tensor {t} "
                                 f"('{subgraph.tensors[t].name}'); state kept across invokes "
                                 "(variable tensors) is not supported yet")
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
            steps.append(Step(op=op, opdef=opdef, node=node, dynamic=True))
            continue
        for t, shape in zip(op.outputs, shapes):
            specs[t] = replace(specs[t], shape=shape)
        node = replace(node, outputs=tuple(specs[t] for t in op.outputs))
        if opdef.foldable and not opdef.stateful and (opdef.reads_only_shapes or
                               all(s is None or s.value is not None for s in node.inputs)):
            outs = execute(opdef, node, [s.value if s else None for s in node.inputs])
            for t, v in zip(op.outputs, outs):
                constants[t] = v
                specs[t] = replace(specs[t], value=v)
            folded.append(op.index)
        else:
            steps.append(Step(op=op, opdef=opdef, node=node))
    return PreparedGraph(subgraph=subgraph, specs=specs, constants=constants,
                         steps=steps, folded=folded, dynamic=frozenset(dynamic))


@functools.lru_cache(maxsize=None)
def _infer_takes_runtime(infer) -> bool:
    try:
        return "runtime" in inspect.signature(infer).parameters
    except (TypeError, ValueError):
        return False


def _infer(opdef: OpDef, node: Node, runtime=None) -> list:
    try:
        if opdef.stateful and _infer_takes_runtime(opdef.infer):
            shapes = opdef.infer(node, runtime)
        else:
            shapes = opdef.infer(node)
        shapes = [tuple(int(d) for d in s) for s in shapes]
    except ModelError:
        raise
    except (ValueError, IndexError, TypeError, ZeroDivisionError, OverflowError) as e:
        raise node.fail(f"cannot infer output shapes: {e}") from None
    if len(shapes) != len(node.outputs):
        raise node.fail(f"has {len(node.outputs)} outputs, the op produces {len(shapes)}")
    for spec, shape in zip(node.outputs, shapes):
        if any(d < 0 for d in shape):
            raise node.fail(f"output '{spec.name}' would have a negative dimension {list(shape)}")
    return shapes


def execute(opdef: OpDef, node: Node, inputs: list, runtime=None) -> list:
    """Run one op's reference and bring each output to its tensor's shape, dtype and float view.
    `runtime`: the interpreter's state (variables, subgraph calls), which stateful ops need."""
    if opdef.stateful:
        if runtime is None:
            raise node.fail("keeps state across invokes and can run only inside an Interpreter")
        outs = opdef.reference(node, inputs, runtime)
    else:
        outs = opdef.reference(node, inputs)
    results = []
    for spec, out in zip(node.outputs, outs):
        out = np.asarray(out)
        if out.shape != spec.shape:
            raise node.fail(f"reference produced shape {list(out.shape)} for '{spec.name}', "
                            f"expected {list(spec.shape)}")
        dtype = view_dtype(spec.dtype, spec.quantization) if spec.dtype is not None else out.dtype
        out = out.astype(dtype, copy=False)
        if is_float_view(spec.dtype, spec.quantization):
            out = fake_quant(out, spec.quantization, spec.dtype)
        results.append(out)
    return results


def run_step(step: Step, inputs: list, runtime=None) -> list:
    """One step on numpy. A dynamic step is inferred first from this invoke's input shapes,
    with its run-time inputs' values visible to infer as if they were constants (WHERE's count
    of true elements, a RESHAPE to a computed shape)."""
    if not step.dynamic:
        return execute(step.opdef, step.node, inputs, runtime)
    node = step.node
    actual = tuple(None if spec is None else
                   replace(spec, shape=tuple(np.shape(x)), value=spec.value if spec.value is not None else x)
                   for spec, x in zip(node.inputs, inputs))
    node = replace(node, inputs=actual)
    shapes = _infer(step.opdef, node, runtime)
    node = replace(node, outputs=tuple(replace(spec, shape=shape) for spec, shape in zip(node.outputs, shapes)))
    return execute(step.opdef, node, inputs, runtime)


def run_reference(graph: PreparedGraph, values: dict, runtime=None) -> dict:
    """Run the remaining steps on numpy; `values` holds the float views of the inputs."""
    values = {**graph.constants, **values}
    for step in graph.steps:
        inputs = [values[t] if t != -1 else None for t in step.op.inputs]
        for t, v in zip(step.op.outputs, run_step(step, inputs, runtime)):
            values[t] = v
    return values
