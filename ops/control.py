"""Control flow: IF, WHILE and STABLEHLO_COMPOSITE, which run other subgraphs of the model.

As in LiteRT (kernels/if.cc, while.cc):
- IF: input 0 is the condition, a bool tensor of one element; the other inputs are handed to
  the `then` or `else` subgraph, whose outputs become IF's outputs. Both branches take as
  many inputs as IF passes and give as many outputs as IF has.
- WHILE: n loop-carried tensors (inputs i <-> outputs i). `cond` takes the n current values
  and gives one bool of one element; while it is true, `body` maps the n values to the next
  n. Zero iterations hand the inputs on unchanged. There is no iteration limit: a loop whose
  condition never turns false runs forever, as in LiteRT.
- Values cross subgraph boundaries as raw tensors: dtypes must match (a ModelError here;
  LiteRT would reinterpret the bytes), and a quantized tensor keeps its integers, which the
  receiving tensor reads under its own scale.
- A called subgraph is prepared for the shapes it is called with (resize_tensor_input
  propagates through it); IF branches whose outputs differ in shape, and WHILE bodies that
  change the shape of a loop-carried tensor, make LiteRT's outputs dynamic: here they are a
  ModelError at prepare (every shape is static after allocate_tensors).
- STABLEHLO_COMPOSITE (what litert-torch / the StableHLO path writes for a named block such as
  "odml.scaled_dot_product_attention"): its options (StableHLOCompositeOptions, in the
  schema's second options union, builtin_options_2) name the block, its version, its
  attributes (a flexbuffer map, kept as raw bytes: nothing here reads them) and the
  `decomposition` subgraph that computes it from the same inputs. As LiteRT does when no
  delegate claims the composite (kernels/stablehlo_composite.cc), it runs that subgraph as a
  one-branch IF: the inputs (at least one, as LiteRT's Prepare insists) go to the
  decomposition's inputs and its outputs become the op's, raw tensors crossing as above; the
  arity must match both ways, every output shape is the decomposition's, and a decomposition
  output whose shape depends on run-time values (dynamic in LiteRT) is a ModelError at prepare.
  LiteRT 2.3 checks the index only against the upper end and does not check recursion; here
  both are ModelErrors naming the op.
- A subgraph that calls itself, directly or through others, is a ModelError at prepare
  (LiteRT overflows its stack and crashes on such a model).

All three are `stateful`: never folded, and they run on the host (a called subgraph may touch
variables). Their infer and reference take the interpreter's runtime, which prepares a
called subgraph for given input shapes (`prepare_subgraph`) and runs it (`run_subgraph`): on a
Taichi backend the called subgraph is delegated on its own (executor.DelegatedCall: its own
partitions and program, built in allocate_tensors), else on the reference path. So a
composite's decomposition (the attention's BATCH_MATMUL, MUL, SOFTMAX, BATCH_MATMUL) runs as
its own program, called from the host between the calling graph's partitions, and a WHILE's
body is one program run per iteration, the host reading the condition.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from tflite_taichi.quant import dequantize, is_float_view, quantize

from .base import OpDef, Runtime, State, register_op


def _dtype_name(spec) -> str:
    return np.dtype(spec.dtype).name if spec.dtype is not None else "resource"


def _same_quantization(a, b) -> bool:
    if a is None or b is None:
        return a is b
    return (a.quantized_dimension == b.quantized_dimension and np.array_equal(a.scale, b.scale)
            and np.array_equal(a.zero_point, b.zero_point))


def _retag(value, src, dst):
    """A value handed from tensor `src` to tensor `dst` (same dtype) as LiteRT copies it: the
    stored data unchanged, so a quantized tensor's integers are read under dst's scale."""
    if src.dtype is None or dst.dtype is None:           # resource handles pass as they are
        return value
    src_view = is_float_view(src.dtype, src.quantization)
    dst_view = is_float_view(dst.dtype, dst.quantization)
    if src_view == dst_view and (not src_view or _same_quantization(src.quantization, dst.quantization)):
        return value
    raw = quantize(value, src.quantization, src.dtype) if src_view else np.asarray(value).astype(src.dtype)
    return dequantize(raw, dst.quantization) if dst_view else raw


def _prepare(node, runtime: Optional[Runtime], index: int, role: str, args: list):
    """The subgraph `index` prepared for the argument specs `args`; checks inputs."""
    if runtime is None:
        raise node.fail("calls subgraphs and can be prepared only inside an Interpreter")
    sg = runtime.subgraph(index, node, role)
    if len(sg.inputs) != len(args):
        raise node.fail(f"{role} subgraph {index} takes {len(sg.inputs)} inputs, the op passes {len(args)}")
    for t, arg in zip(sg.inputs, args):
        tensor = sg.tensors[t]
        if (tensor.dtype is None) != (arg.dtype is None) or (
                tensor.dtype is not None and np.dtype(tensor.dtype) != np.dtype(arg.dtype)):
            raise node.fail(f"{role} subgraph {index} input '{tensor.name}' is "
                            f"{_dtype_name(tensor)}; '{arg.name}' passed to it is {_dtype_name(arg)}")
    return runtime.prepare_subgraph(index, [a.shape for a in args], node)


def _outputs(prepared):
    return [prepared.specs[t] for t in prepared.subgraph.outputs]


def _check_bool_scalar(node, spec, what: str):
    if spec is None:
        raise node.fail(f"{what} is missing (-1)")
    if spec.dtype is None or np.dtype(spec.dtype) != np.bool_ or int(np.prod(spec.shape)) != 1:
        raise node.fail(f"{what} '{spec.name}' must be a bool tensor of one element, got "
                        f"{_dtype_name(spec)} {list(spec.shape)}")


def _run(runtime: Runtime, prepared, values: list, specs: list) -> list:
    """Run a prepared subgraph on `values` (float views of tensors `specs`); returns its
    outputs' float views (of the tensors `_outputs(prepared)`)."""
    sg = prepared.subgraph
    feeds = {t: _retag(v, s, prepared.specs[t]) for t, v, s in zip(sg.inputs, values, specs)}
    results = runtime.run_subgraph(prepared, feeds)
    return [results[t] for t in sg.outputs]


# -- IF ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class IfOptions:
    then_subgraph_index: int
    else_subgraph_index: int


def _parse_if(opts) -> IfOptions:
    return IfOptions(int(opts.ThenSubgraphIndex()), int(opts.ElseSubgraphIndex()))


def _infer_if(node, runtime: Optional[Runtime]):
    _check_bool_scalar(node, node.inputs[0], "condition")
    args = list(node.inputs[1:])
    if any(a is None for a in args):
        raise node.fail("an input passed to the branches is missing (-1)")
    branches = []
    for role, index in (("then", node.options.then_subgraph_index),
                        ("else", node.options.else_subgraph_index)):
        outs = _outputs(_prepare(node, runtime, index, role, args))
        if len(outs) != len(node.outputs):
            raise node.fail(f"{role} subgraph {index} gives {len(outs)} outputs, the op has "
                            f"{len(node.outputs)}")
        for spec, out in zip(outs, node.outputs):
            if _dtype_name(spec) != _dtype_name(out):
                raise node.fail(f"output '{out.name}' is {_dtype_name(out)}; {role} subgraph "
                                f"{index} gives {_dtype_name(spec)} ('{spec.name}')")
        branches.append(outs)
    for then_spec, else_spec, out in zip(*branches, node.outputs):
        if tuple(then_spec.shape) != tuple(else_spec.shape):
            raise node.fail(f"output '{out.name}' would have shape {list(then_spec.shape)} from the "
                            f"then branch and {list(else_spec.shape)} from the else branch: "
                            "outputs whose shape depends on the branch taken (dynamic tensors in "
                            "LiteRT) are not supported")
    return [tuple(s.shape) for s in branches[0]]


def _if_reference(node, inputs, runtime: Runtime):
    take_then = bool(np.asarray(inputs[0]).reshape(-1)[0])
    index = node.options.then_subgraph_index if take_then else node.options.else_subgraph_index
    args = list(node.inputs[1:])
    prepared = runtime.prepare_subgraph(index, [a.shape for a in args], node)
    results = _run(runtime, prepared, list(inputs[1:]), args)
    return [_retag(v, s, out) for v, s, out in zip(results, _outputs(prepared), node.outputs)]


# -- WHILE ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class WhileOptions:
    cond_subgraph_index: int
    body_subgraph_index: int


def _parse_while(opts) -> WhileOptions:
    return WhileOptions(int(opts.CondSubgraphIndex()), int(opts.BodySubgraphIndex()))


def _infer_while(node, runtime: Optional[Runtime]):
    carried = list(node.inputs)
    if any(a is None for a in carried):
        raise node.fail("a loop-carried input is missing (-1)")
    if len(node.outputs) != len(carried):
        raise node.fail(f"has {len(carried)} loop-carried inputs but {len(node.outputs)} outputs")
    for spec, out in zip(carried, node.outputs):
        if _dtype_name(spec) != _dtype_name(out):
            raise node.fail(f"output '{out.name}' is {_dtype_name(out)}, its loop-carried input "
                            f"'{spec.name}' {_dtype_name(spec)}")
    cond = _outputs(_prepare(node, runtime, node.options.cond_subgraph_index, "cond", carried))
    if len(cond) != 1:
        raise node.fail(f"cond subgraph {node.options.cond_subgraph_index} gives {len(cond)} "
                        "outputs; it must give one bool")
    _check_bool_scalar(node, cond[0], f"cond subgraph {node.options.cond_subgraph_index} output")
    body_index = node.options.body_subgraph_index
    prepared = _prepare(node, runtime, body_index, "body", carried)
    body = _outputs(prepared)
    if len(body) != len(carried):
        raise node.fail(f"body subgraph {body_index} gives {len(body)} outputs for "
                        f"{len(carried)} loop-carried tensors")
    for t, spec, arg in zip(prepared.subgraph.outputs, body, carried):
        if _dtype_name(spec) != _dtype_name(arg):
            raise node.fail(f"body subgraph {body_index} output '{spec.name}' is "
                            f"{_dtype_name(spec)}, its loop-carried input '{arg.name}' {_dtype_name(arg)}")
        # an output whose shape the body computes from run-time values (a converted Keras
        # LSTM writes step i as CONCATENATION(SLICE(..., i), item, SLICE(i + 1, ...)): its
        # shape is the carried one whatever i is, but known only when it runs) is checked at
        # every iteration instead (_check_carried_shapes)
        if t not in prepared.dynamic and tuple(spec.shape) != tuple(arg.shape):
            raise _changes_shape(node, body_index, arg, spec.name, spec.shape)
    return [tuple(a.shape) for a in carried]


def _changes_shape(node, body_index: int, arg, name: str, shape):
    return node.fail(f"body subgraph {body_index} turns loop-carried '{arg.name}' of shape "
                     f"{list(arg.shape)} into {list(shape)} ('{name}'): tensors that change shape "
                     "across iterations (dynamic tensors in LiteRT) are not supported")


def _check_carried_shapes(node, body, values: list, carried: list) -> None:
    """A body's run-time-shaped outputs must come out in their loop-carried shapes."""
    for t, value, arg in zip(body.subgraph.outputs, values, carried):
        if t in body.dynamic and tuple(np.shape(value)) != tuple(arg.shape):
            raise _changes_shape(node, node.options.body_subgraph_index, arg,
                                 body.specs[t].name, np.shape(value))


def _while_reference(node, inputs, runtime: Runtime):
    carried = list(node.inputs)
    shapes = [a.shape for a in carried]
    cond = runtime.prepare_subgraph(node.options.cond_subgraph_index, shapes, node)
    body = runtime.prepare_subgraph(node.options.body_subgraph_index, shapes, node)
    values, specs = list(inputs), carried
    body_specs = _outputs(body)
    while bool(np.asarray(_run(runtime, cond, values, specs)[0]).reshape(-1)[0]):
        values, specs = _run(runtime, body, values, specs), body_specs
        _check_carried_shapes(node, body, values, carried)
    return [_retag(v, s, out) for v, s, out in zip(values, specs, node.outputs)]


# the ops that run subgraphs: their output shapes come from running them
RUNS_SUBGRAPHS = State(stateful=True, infer_takes_runtime=True)

IF = register_op(OpDef(name="IF", infer=_infer_if, reference=_if_reference, parse=_parse_if,
                       options_class="IfOptions", state=RUNS_SUBGRAPHS,
                       min_inputs=1))
WHILE = register_op(OpDef(name="WHILE", infer=_infer_while, reference=_while_reference,
                          parse=_parse_while, options_class="WhileOptions", state=RUNS_SUBGRAPHS,
                          min_inputs=0))


# -- STABLEHLO_COMPOSITE ----------------------------------------------------------------------
@dataclass(frozen=True)
class CompositeOptions:
    name: str                          # "odml.scaled_dot_product_attention", ...
    decomposition_subgraph_index: int
    composite_attributes: bytes        # flexbuffer map, as stored (LiteRT's kernels read it)
    version: int


def _parse_composite(opts) -> CompositeOptions:
    name = opts.Name()
    attributes = opts.CompositeAttributesAsNumpy()
    return CompositeOptions(
        name=name.decode("utf-8", "replace") if name else "",
        decomposition_subgraph_index=int(opts.DecompositionSubgraphIndex()),
        composite_attributes=bytes(attributes.tobytes()) if isinstance(attributes, np.ndarray) else b"",
        version=int(opts.Version()))


def _infer_composite(node, runtime: Optional[Runtime]):
    args = list(node.inputs)
    if not args:            # LiteRT's Prepare insists on one (TF_LITE_ENSURE inputs > 0)
        raise node.fail("takes at least one input, has none")
    if any(a is None for a in args):
        raise node.fail("an input passed to the decomposition is missing (-1)")
    index = node.options.decomposition_subgraph_index
    prepared = _prepare(node, runtime, index, "decomposition", args)
    outs = _outputs(prepared)
    if len(outs) != len(node.outputs):
        raise node.fail(f"decomposition subgraph {index} gives {len(outs)} outputs, the op has "
                        f"{len(node.outputs)}")
    for t, spec, out in zip(prepared.subgraph.outputs, outs, node.outputs):
        if _dtype_name(spec) != _dtype_name(out):
            raise node.fail(f"output '{out.name}' is {_dtype_name(out)}; decomposition subgraph "
                            f"{index} gives {_dtype_name(spec)} ('{spec.name}')")
        if t in prepared.dynamic:
            raise node.fail(f"decomposition subgraph {index} output '{spec.name}' has a shape "
                            "known only at invoke: outputs whose shape depends on run-time "
                            "values (dynamic tensors in LiteRT) are not supported")
    return [tuple(s.shape) for s in outs]


def _composite_reference(node, inputs, runtime: Runtime):
    args = list(node.inputs)
    prepared = runtime.prepare_subgraph(node.options.decomposition_subgraph_index,
                                        [a.shape for a in args], node)
    results = _run(runtime, prepared, list(inputs), args)
    return [_retag(v, s, out) for v, s, out in zip(results, _outputs(prepared), node.outputs)]


STABLEHLO_COMPOSITE = register_op(OpDef(
    name="STABLEHLO_COMPOSITE", infer=_infer_composite, reference=_composite_reference,
    parse=_parse_composite, options_class="StableHLOCompositeOptions",
    state=RUNS_SUBGRAPHS, min_inputs=0))          # none: refused by its infer, with a message saying so
