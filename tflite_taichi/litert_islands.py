"""Islands for LiteRT: some ops of a subgraph as a subgraph of their own, in a copy of the model.

A schedule on a GPU backend runs GPU partitions with CPU steps between them; each maximal run
of CPU steps (an island) runs on LiteRT's CPU kernels. LiteRT runs whole subgraphs only, so
`islands_model` writes a model whose subgraphs are the original ones, unchanged and at their
original indices (IF / WHILE / CALL_ONCE name subgraphs by index), followed by one subgraph
per island (`island_index`): the source subgraph's tensors, exactly the island's operator
tables, and the island's inputs and outputs.

Nothing of the original is rewritten. Flatbuffer offsets point forward only, so the new model
is a new head (the root offset, the identifier, a Model table, the subgraphs vector, the
islands' Subgraph tables and their index vectors) followed by the original bytes unchanged:
every other field of the new Model table, each original Subgraph, and each island operator is
an offset forward into that copy. The head's length is a multiple of BUFFER_ALIGNMENT, so the
constants in the copy keep the alignment the converter gave them (the schema aligns buffer
data to 16 bytes; LiteRT reads constants in place).
"""
from __future__ import annotations

import dataclasses
import struct
from dataclasses import dataclass
from typing import Optional

import flatbuffers
import numpy as np

from tflite_taichi import model as model_ir
from tflite_taichi.errors import BackendUnavailable, ModelError
from tflite_taichi.ops.base import lookup
from tflite_taichi.quant import dequantize, is_float_view, quantize

# The schema's `force_align: 16` on Buffer.data: the head's length keeps every constant of the
# appended copy on the same boundary as in the original file.
BUFFER_ALIGNMENT = 16
FILE_IDENTIFIER = b"TFL3"

# Model table slots (schema.fbs field order); every field but `subgraphs` is carried forward.
_MODEL_VERSION = 0
_MODEL_SUBGRAPHS = 2
_MODEL_OFFSET_FIELDS = (1, 3, 4, 5, 6, 7)   # operator_codes, description, buffers,
                                            # metadata_buffer, metadata, signature_defs
_MODEL_FIELDS = 8
_SUBGRAPH_TENSORS = 0


@dataclass(frozen=True)
class Island:
    """Ops `ops` (indices, in execution order) of subgraph `subgraph`, taking tensors `inputs`
    and handing out tensors `outputs` (tensor indices of that subgraph)."""
    subgraph: int
    ops: tuple
    inputs: tuple
    outputs: tuple


def island_index(model, k: int) -> int:
    """The subgraph index of island `k` in the model `islands_model` writes for `model`."""
    return len(model.subgraphs) + k


def island_of(model, subgraph: int, ops) -> Island:
    """The island of ops `ops` of `subgraph` with the inputs it needs (tensors its ops read that
    no earlier op of it writes, constants aside) and the outputs something else needs (tensors
    it writes that a later op outside it reads, or that the subgraph hands out)."""
    sg = model.subgraphs[subgraph]
    ops = tuple(int(i) for i in ops)
    inside = set(ops)
    written, inputs = set(), []
    for i in ops:
        op = sg.operators[i]
        for t in op.inputs:
            if t != -1 and t not in written and t not in inputs and sg.tensors[t].data is None:
                inputs.append(t)
        written.update(op.outputs)
    read_elsewhere = set(sg.outputs)    # (an op before the island cannot read what it writes)
    for op in sg.operators:
        if op.index not in inside:
            read_elsewhere.update(op.inputs)
    outputs = [t for i in ops for t in sg.operators[i].outputs if t in read_elsewhere]
    return Island(subgraph=subgraph, ops=ops, inputs=tuple(inputs), outputs=tuple(outputs))


# -- what an island may hold ------------------------------------------------------------------
def island_safe(model, subgraph: int, op_index: int) -> Optional[str]:
    """Why op `op_index` of `subgraph` must not run on an island (None: it may). A resource
    variable or a variable tensor keeps state across invokes, which must live in one place:
    an op touching one, or calling a subgraph that does, stays where the rest of the model's
    state is."""
    return _why_not_on_island(model, subgraph, op_index, set())


def _why_not_on_island(model, subgraph: int, op_index: int, visited: set) -> Optional[str]:
    sg = model.subgraphs[subgraph]
    op = sg.operators[op_index]
    why = _touches_state(sg, op)
    if why is not None:
        return why
    for called in _called_subgraphs(op):
        why = _subgraph_touches_state(model, called, visited)
        if why is not None:
            return f"calls subgraph {called}, whose {why}"
    return None


def _touches_state(sg, op) -> Optional[str]:
    for t in op.inputs + op.outputs:
        if t == -1:
            continue
        tensor = sg.tensors[t]
        if tensor.type_code == model_ir.RESOURCE_TYPE:
            return (f"reads or writes resource tensor {t} ('{tensor.name}'): a resource "
                    "variable's state must live in one interpreter")
        if tensor.is_variable:
            return (f"uses variable tensor {t} ('{tensor.name}'), whose state must live in one "
                    "interpreter")
    return None


def _subgraph_touches_state(model, index: int, visited: set) -> Optional[str]:
    if index in visited or not 0 <= index < len(model.subgraphs):
        return None     # seen (a loop through subgraphs), or not ours to judge: read_model's
    visited.add(index)
    for op in model.subgraphs[index].operators:
        why = _why_not_on_island(model, index, op.index, visited)
        if why is not None:
            return f"op #{op.index} ({op.name}) {why}"
    return None


def _called_subgraphs(op) -> tuple:
    """The subgraphs an op runs, from its parsed options: every op that calls one (IF, WHILE,
    CALL_ONCE, STABLEHLO_COMPOSITE) names it in an options field `*_subgraph_index`."""
    opdef = lookup(op.name)
    if opdef is None or opdef.options_class is None or not opdef.stateful:
        return ()
    try:
        options = opdef.parse(model_ir.read_options(op, opdef.options_class))
    except ModelError:
        raise
    except Exception as e:      # a corrupt options table: decode errors of any kind
        raise ModelError(f"op #{op.index} ({op.name}): cannot read its options: {e}") from None
    if not dataclasses.is_dataclass(options):
        return ()
    return tuple(int(getattr(options, f.name)) for f in dataclasses.fields(options)
                 if f.name.endswith("subgraph_index"))


def _check_island(model, k: int, island: Island) -> None:
    """BackendUnavailable naming what island `k` holds that a sub-model cannot run as the
    original model does."""
    if not 0 <= island.subgraph < len(model.subgraphs):
        raise BackendUnavailable(f"island {k}: subgraph {island.subgraph} is not in the model "
                                 f"({len(model.subgraphs)} subgraphs)")
    sg = model.subgraphs[island.subgraph]
    where = f"island {k} of subgraph {island.subgraph}"
    _check_op_order(sg, where, island.ops)
    for kind, tensors in (("input", island.inputs), ("output", island.outputs)):
        for t in tensors:
            if not 0 <= t < len(sg.tensors):
                raise BackendUnavailable(f"{where}: {kind} tensor {t} is not in the subgraph "
                                         f"({len(sg.tensors)} tensors)")
    for i in island.ops:
        why = island_safe(model, island.subgraph, i)
        if why is not None:
            raise BackendUnavailable(f"{where}: op #{i} ({sg.operators[i].name}) {why}")
    _check_dataflow(sg, where, island)


def _check_op_order(sg, where: str, ops) -> None:
    if not ops:
        raise BackendUnavailable(f"{where} has no ops")
    for i in ops:
        if not 0 <= i < len(sg.operators):
            raise BackendUnavailable(f"{where}: op #{i} is not in the subgraph "
                                     f"({len(sg.operators)} ops)")
    for before, after in zip(ops, ops[1:]):
        if after <= before:
            raise BackendUnavailable(f"{where}: ops {list(ops)} are not in execution order "
                                     f"(#{after} after #{before})")


def _check_dataflow(sg, where: str, island: Island) -> None:
    """Every tensor an op of the island reads is an input, a constant or the output of an
    earlier op of the island; inputs are not written by it; outputs are written by it."""
    inputs = set(island.inputs)
    for t in island.inputs:
        if sg.tensors[t].data is not None:
            raise BackendUnavailable(f"{where}: input tensor {t} ('{sg.tensors[t].name}') is a "
                                     "constant of the model, which the island holds already")
    written = {}
    for i in island.ops:
        op = sg.operators[i]
        for t in op.inputs:
            if t != -1 and t not in inputs and t not in written and sg.tensors[t].data is None:
                raise BackendUnavailable(
                    f"{where}: op #{i} ({op.name}) reads tensor {t} ('{sg.tensors[t].name}'), "
                    "which is not an input of the island, a constant, or written by an earlier "
                    "op of it")
        for t in op.outputs:
            if t in inputs:
                raise BackendUnavailable(f"{where}: input tensor {t} ('{sg.tensors[t].name}') is "
                                         f"written by the island's own op #{i} ({op.name})")
            written[t] = i
    for t in island.outputs:
        if t not in written and t not in inputs:
            raise BackendUnavailable(f"{where}: output tensor {t} ('{sg.tensors[t].name}') is "
                                     "written by no op of the island and is not an input")


# -- the original file, where its tables are ----------------------------------------------------
class _Original:
    """Positions of the original file's tables, read through the `tflite` bindings; every
    position the new head points at is checked to lie inside the file."""

    def __init__(self, data: bytes):
        import tflite.Model
        self.data = data
        self.root = tflite.Model.GetRootAs(data, 0)

    def _inside(self, position: int, what: str) -> int:
        if not 8 <= position < len(self.data):
            raise ModelError(f"the model is corrupt: {what} lies at offset {position}, outside "
                             f"its {len(self.data)} bytes")
        return position

    def field_target(self, table, slot: int, what: str) -> Optional[int]:
        """Where the offset field `slot` of `table` (a flatbuffers Table) points, or None."""
        o = table.Offset(4 + 2 * slot)
        if not o:
            return None
        return self._inside(table.Indirect(self._inside(table.Pos + o, what)), what)

    def model_target(self, slot: int, what: str) -> Optional[int]:
        return self.field_target(self.root._tab, slot, what)

    def unknown_model_fields(self) -> list:
        """Slots of Model fields newer than this schema (a head cannot carry what it cannot
        name: a scalar and an offset look alike)."""
        tab = self.root._tab
        vtable = tab.Pos - tab.Get(flatbuffers.number_types.SOffsetTFlags, tab.Pos)
        slots = (tab.Get(flatbuffers.number_types.VOffsetTFlags, self._inside(vtable, "the "
                 "Model's vtable")) - 4) // 2
        return [s for s in range(_MODEL_FIELDS, slots) if tab.Offset(4 + 2 * s)]

    def subgraph(self, index: int):
        return self.root.Subgraphs(index)

    def subgraph_table(self, index: int) -> int:
        return self._inside(self.subgraph(index)._tab.Pos, f"subgraph {index}")

    def operator_table(self, subgraph: int, op: int) -> int:
        return self._inside(self.subgraph(subgraph).Operators(op)._tab.Pos,
                            f"subgraph {subgraph} op #{op}")

    def tensors_vector(self, subgraph: int) -> Optional[int]:
        return self.field_target(self.subgraph(subgraph)._tab, _SUBGRAPH_TENSORS,
                                 f"subgraph {subgraph}'s tensors")

    def external_buffers(self) -> list:
        """Indices of buffers whose data lies outside the flatbuffer, at absolute offsets."""
        # (a mutated count stops at the file's end: a read past it is a struct.error)
        return [i for i in range(self.root.BuffersLength()) if int(self.root.Buffers(i).Offset()) > 1]


def _check_matches(original: _Original, model) -> None:
    """`model` must be the reading of these bytes: the head points into them by position."""
    root = original.root
    if model.size and model.size != len(original.data):
        raise ModelError(f"the model read was {model.size} bytes, the bytes given are "
                         f"{len(original.data)}: they are not the same model")
    counts = [(sg.index, len(sg.operators), len(sg.tensors)) for sg in model.subgraphs]
    if root.SubgraphsLength() != len(counts) or any(
            (root.Subgraphs(i).OperatorsLength(), root.Subgraphs(i).TensorsLength()) != (n_ops, n_t)
            for i, n_ops, n_t in counts):
        raise ModelError("the bytes given do not hold the subgraphs of the model read: they are "
                         "not the same model")


# -- the new head ---------------------------------------------------------------------------------
def _forward(target: int) -> int:
    """A flatbuffers Builder offset that lands on `target`, a position in the original bytes
    appended after the head. The Builder counts offsets back from the head's end, where the
    copy starts, so a target inside the copy is a negative one; its PrependUOffsetTRelative
    then stores the forward distance."""
    return -target


def _write_island(b, original: _Original, k: int, island: Island) -> int:
    inputs = b.CreateNumpyVector(np.asarray(island.inputs, np.int32))
    outputs = b.CreateNumpyVector(np.asarray(island.outputs, np.int32))
    operators = [_forward(original.operator_table(island.subgraph, i)) for i in island.ops]
    b.StartVector(4, len(operators), 4)
    for offset in reversed(operators):
        b.PrependUOffsetTRelative(offset)
    operators_vector = b.EndVector()
    name = b.CreateString(f"island {k} of subgraph {island.subgraph}")
    tensors = original.tensors_vector(island.subgraph)
    b.StartObject(5)        # SubGraph: tensors, inputs, outputs, operators, name
    if tensors is not None:
        b.PrependUOffsetTRelativeSlot(0, _forward(tensors), 0)
    b.PrependUOffsetTRelativeSlot(1, inputs, 0)
    b.PrependUOffsetTRelativeSlot(2, outputs, 0)
    b.PrependUOffsetTRelativeSlot(3, operators_vector, 0)
    b.PrependUOffsetTRelativeSlot(4, name, 0)
    return b.EndObject()


def _write_head(original: _Original, n_subgraphs: int, islands) -> bytes:
    b = flatbuffers.Builder(1024)
    b.Prep(BUFFER_ALIGNMENT, 0)     # the head's length becomes a multiple of it at Finish
    tables = [_write_island(b, original, k, island) for k, island in enumerate(islands)]
    subgraphs = [_forward(original.subgraph_table(i)) for i in range(n_subgraphs)] + tables
    b.StartVector(4, len(subgraphs), 4)
    for offset in reversed(subgraphs):
        b.PrependUOffsetTRelative(offset)
    subgraphs_vector = b.EndVector()
    carried = {slot: original.model_target(slot, f"the Model's field {slot}")
               for slot in _MODEL_OFFSET_FIELDS}
    b.StartObject(_MODEL_FIELDS)
    b.PrependUint32Slot(_MODEL_VERSION, int(original.root.Version()), 0)
    b.PrependUOffsetTRelativeSlot(_MODEL_SUBGRAPHS, subgraphs_vector, 0)
    for slot, target in carried.items():
        if target is not None:
            b.PrependUOffsetTRelativeSlot(slot, _forward(target), 0)
    b.Finish(b.EndObject(), file_identifier=FILE_IDENTIFIER)
    head = bytes(b.Output())
    assert len(head) % BUFFER_ALIGNMENT == 0, "the head would shift the constants' alignment"
    return head


def islands_model(data: bytes, model, islands) -> bytes:
    """A .tflite whose subgraphs are `model`'s (read from `data`, its bytes) followed by one per
    island of `islands` (island k at island_index(model, k)). BackendUnavailable naming what a
    sub-model cannot express (an island's ops, inputs or outputs; constants stored outside the
    flatbuffer); ModelError where `data` is not the model read or is corrupt."""
    data = bytes(data)
    islands = list(islands)
    try:
        original = _Original(data)
        _check_matches(original, model)
        for k, island in enumerate(islands):
            _check_island(model, k, island)
        _refuse_what_a_head_cannot_carry(original)
        return _write_head(original, len(model.subgraphs), islands) + data
    except (BackendUnavailable, ModelError):
        raise
    except (struct.error, IndexError, ValueError, TypeError, OverflowError, AttributeError) as e:
        raise ModelError(f"the model is corrupt: its flatbuffer is malformed (the decoder said: "
                         f"{e})") from None


def _refuse_what_a_head_cannot_carry(original: _Original) -> None:
    external = original.external_buffers()
    if external:
        raise BackendUnavailable(
            f"LiteRT islands cannot be written for this model: buffers {external[:8]} hold their "
            "data outside the flatbuffer at absolute file offsets, which a new head would shift")
    unknown = original.unknown_model_fields()
    if unknown:
        raise BackendUnavailable(f"LiteRT islands cannot be written for this model: its Model "
                                 f"table has fields {unknown} this schema does not know")


# -- running them: a schedule's CPU steps on LiteRT's kernels ----------------------------------
def island_runs(model, subgraph: int, items) -> list:
    """The islands of a schedule's items (partitions have `steps`; the rest are CPU steps):
    each maximal run of consecutive CPU steps whose ops may go on an island (island_safe), as
    (position of its first item, number of items, Island). An op that calls subgraphs (IF,
    WHILE, a composite) stays a step of its own: the delegate runs the subgraphs it calls, each
    as a program of its own (executor.DelegatedCall)."""
    runs, start, ops = [], None, []

    def close(end):
        if ops:
            runs.append((start, end - start, island_of(model, subgraph, ops)))
    for position, item in enumerate(items):
        if (not hasattr(item, "steps") and not _called_subgraphs(item.op)
                and not _leaves_rows_unwritten(item.op)
                and island_safe(model, subgraph, item.op.index) is None):
            if not ops:
                start = position
            ops.append(item.op.index)
            continue
        close(position)
        start, ops = None, []
    close(len(items))
    return runs


def _leaves_rows_unwritten(op) -> bool:
    """An op whose LiteRT kernel writes only part of its outputs (OpDef.litert_leaves_rows_
    unwritten): on an island the rest would be whatever LiteRT's arena held, where every other
    path of ours writes zeros."""
    opdef = lookup(op.name)
    return opdef is not None and opdef.litert_leaves_rows_unwritten


class IslandRunner:
    """The islands of one subgraph's schedule on one LiteRT interpreter (every island shares
    its thread pool): `data` the model's bytes, `specs` the prepared graph's TensorSpecs (the
    shapes LiteRT is allocated for and held to). BackendUnavailable where LiteRT cannot run
    them (a kernel it lacks, a shape it infers otherwise), ModelError where the model is
    corrupt."""

    def __init__(self, data: bytes, model, islands, threads: int, specs: dict, dynamic=()):
        from tflite_taichi.litert_cpu import LiteRTModel
        self.model, self.islands = model, list(islands)
        self.litert = LiteRTModel(islands_model(data, model, self.islands), threads)
        self._shapes = {}
        for k, island in enumerate(self.islands):
            self._allocate(k, {t: tuple(specs[t].shape) for t in island.inputs})
            self.litert.check_shapes(island_index(model, k), {
                t: specs[t].shape for t in island.outputs if t in specs and t not in dynamic})

    def _allocate(self, k: int, shapes: dict) -> None:
        self.litert.allocate(island_index(self.model, k), shapes)
        self._shapes[k] = shapes

    def run(self, k: int, values: dict) -> None:
        """Island `k`: its inputs from `values` (float views of quantized tensors, as the host
        keeps them), its outputs into it (the same form)."""
        island = self.islands[k]
        tensors = self.model.subgraphs[island.subgraph].tensors
        inputs, shapes = [], {}
        for t in island.inputs:
            tensor, value = tensors[t], values[t]
            if is_float_view(tensor.dtype, tensor.quantization):
                value = quantize(value, tensor.quantization, tensor.dtype)
            value = np.ascontiguousarray(value, dtype=tensor.dtype)
            inputs.append((t, value))
            shapes[t] = value.shape
        if shapes != self._shapes[k]:       # a data-dependent shape reached the island
            self._allocate(k, shapes)
        outputs = self.litert.run(island_index(self.model, k), inputs, island.outputs)
        for t, value in zip(island.outputs, outputs):
            tensor = tensors[t]
            values[t] = (dequantize(value, tensor.quantization)
                         if is_float_view(tensor.dtype, tensor.quantization) else value)


class IslandStep:
    """A schedule item: island `k` of `runner`, run where its CPU steps ran (executor.cpu_step
    runs it; delegate.DeviceRun reads `op.inputs` and `op.outputs` to hand tensors across, as
    for one CPU step)."""

    def __init__(self, runner: IslandRunner, k: int, replaces: list):
        self.runner, self.k = runner, k
        self.op = runner.islands[k]
        self.replaces = replaces            # the CPU steps it runs

    def run(self, values: dict) -> None:
        self.runner.run(self.k, values)
