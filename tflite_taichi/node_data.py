"""What the delegate did, as node data for Google's Model Explorer (`ai-edge-model-explorer`):
per op of every subgraph, where it runs (a partition of the delegate, the CPU, or folded at
prepare), why an op stayed on the CPU, the fusion group it belongs to, and, after profiled
invokes, its time. Model Explorer draws the model's graph with its own TFLite adapter and
colours each node by these values (`Interpreter.node_data()`, `tflite-taichi inspect --explore`
or `--node-data`; docs/explore.md).

The JSON is Model Explorer's node-data format (its `node_data_builder.ModelNodeData`):
`{graph id: {"results": {node id: {"value": ..., "bgColor": ...}}, ...}}`, one object per
overlay. Its TFLite adapter names a graph by its subgraph's name ("main" for an unnamed first
subgraph, "subgraph_<i>" for another) and an op's node by the op's index in its subgraph (its
other nodes, the graph's inputs, outputs and constants, come after): `graph_ids` and the op
indices here are those ids, and tests/test_explore.py holds them to the adapter's own graphs.
Nothing here imports Model Explorer: the node data is written without it."""
from __future__ import annotations

import colorsys
from dataclasses import dataclass
from typing import Optional

import numpy as np

# where an op runs: a partition's colour (these first, then partition_color's), the CPU's, a
# folded op's, one never prepared
PARTITION_COLORS = ("#66c2a5", "#8da0cb", "#a6d854", "#80b1d3", "#b3de69", "#bebada")
CPU_COLOR = "#fc8d62"
FOLDED_COLOR = "#d9d9d9"
UNKNOWN_COLOR = "#ffffb3"
# fusion groups of more than one op, cycled; an op alone stays white
GROUP_COLORS = ("#8dd3c7", "#fdb462", "#bc80bd", "#ccebc5", "#ffed6f", "#fb8072", "#80b1d3",
                "#b3de69", "#fccde5", "#bebada")
TIME_GRADIENT = [{"stop": 0, "bgColor": "#ffffcc"}, {"stop": 0.5, "bgColor": "#fd8d3c"},
                 {"stop": 1, "bgColor": "#bd0026"}]

OVERLAYS = {
    "where": "where each op runs (tflite-taichi)",
    "why": "why an op runs on the CPU (tflite-taichi)",
    "fusion": "fusion group: the op whose store or loop runs it (tflite-taichi)",
    "time": "time per invoke in us; ops sharing a kernel show the kernel's time (tflite-taichi)",
}


@dataclass
class SubgraphView:
    """One prepared subgraph as the node data reads it: its prepared graph, and on a Taichi
    backend its schedule and program, with the profiled times (executor.SubgraphState, or a
    delegated call's)."""
    prepared: object                    # graph.PreparedGraph
    schedule: object = None             # partition.Schedule (None: every op on numpy)
    program: object = None              # delegate.Program
    timings: Optional[dict] = None      # schedule position -> seconds per invoke
    kernel_timings: Optional[dict] = None   # (schedule position, kernel) -> seconds
    on_litert: frozenset = frozenset()  # ops of the schedule's LiteRT islands (litert_islands.py)


@dataclass
class OpFacts:
    where: str                          # "partition 0 (vulkan)", "CPU", "folded at prepare", ...
    color: str
    why: str                            # why on the CPU ("" where the delegate runs it)
    group: Optional[int] = None         # op index of its fusion group's head (None: not in one)
    group_size: int = 1
    time_us: Optional[float] = None     # median per invoke (profiled), the kernel's where shared


def graph_ids(model) -> list:
    """Model Explorer's TFLite adapter's graph id of each subgraph, by index."""
    return [sg.name or ("main" if i == 0 else f"subgraph_{i}") for i, sg in enumerate(model.subgraphs)]


def partition_color(number: int) -> str:
    """Partition `number`'s colour, apart from every other partition's: the palette, then hues
    a golden angle apart (light, as the palette is) for a model split further than it goes."""
    if number < len(PARTITION_COLORS):
        return PARTITION_COLORS[number]
    hue = (number - len(PARTITION_COLORS)) * 0.381966 % 1.0    # a golden angle, in turns
    # darker every 24 partitions, so that a hue that comes round again is not the same colour
    red, green, blue = colorsys.hsv_to_rgb(hue, 0.45, 0.85 - 0.1 * (number // 24 % 4))
    return "#{:02x}{:02x}{:02x}".format(*(round(255 * c) for c in (red, green, blue)))


def _median_us(seconds) -> Optional[float]:
    return float(np.median(seconds)) * 1e6 if seconds else None


def subgraph_facts(subgraph, view: Optional[SubgraphView], backend: str) -> dict:
    """op index -> OpFacts for one subgraph (`view` None: it was never prepared)."""
    if view is None:
        return {op.index: OpFacts("not prepared", UNKNOWN_COLOR,
                                  "a called subgraph prepared only when its caller runs it at "
                                  "shapes allocate_tensors() did not know")
                for op in subgraph.operators}
    facts = {i: OpFacts("folded at prepare", FOLDED_COLOR, "its inputs are all known at "
                        "allocate_tensors(): computed once there") for i in view.prepared.folded}
    if view.schedule is None:
        if backend == "litert":     # LiteRT runs every op, the folded ones and IF/WHILE's included
            return {op.index: OpFacts("CPU (LiteRT)", CPU_COLOR, "backend='litert' runs every op "
                                      "on LiteRT's CPU kernels (XNNPACK)")
                    for op in subgraph.operators}
        why = ("backend='reference' runs every op on numpy" if backend == "reference" else
               "a called subgraph with variable tensors of its own runs on numpy")
        for step in view.prepared.steps:
            facts[step.op.index] = OpFacts("CPU", CPU_COLOR, why)
        return _complete(facts, subgraph)
    timings, kernel_timings = view.timings or {}, view.kernel_timings or {}
    partition_number = 0
    for position, item in enumerate(view.schedule.items):
        if hasattr(item, "steps"):
            facts.update(_partition_facts(item, view.program.code(item), position, kernel_timings,
                                          f"partition {partition_number} ({backend})",
                                          partition_color(partition_number)))
            partition_number += 1
        else:
            index = item.op.index
            why = view.schedule.refused.get(index, "")
            if index in view.on_litert:
                facts[index] = OpFacts("CPU (LiteRT)", CPU_COLOR, why + "; LiteRT's CPU kernels run "
                                       "it, in an island between the partitions")
            else:
                facts[index] = OpFacts("CPU", CPU_COLOR, why, time_us=_median_us(timings.get(position)))
    return _complete(facts, subgraph)


def _complete(facts: dict, subgraph) -> dict:
    """Every op of the subgraph has facts: one that prepare left out runs nowhere."""
    for op in subgraph.operators:
        facts.setdefault(op.index, OpFacts("not run", UNKNOWN_COLOR,
                                           "nothing the subgraph returns depends on it"))
    return facts


def _partition_facts(partition, code, position: int, kernel_timings: dict, where: str,
                     color: str) -> dict:
    """The facts of a partition's ops: each op's head (the step whose store or loop runs it:
    itself, its producer for an op fused into that store, its reader for one computed at the
    reader's loads; a reshape-like op addresses its input and runs nowhere) and its kernel."""
    kernel_of = {j: k for k, chunk in enumerate(code.chunks) for j in chunk}

    def head(j):
        seen = set()
        while j not in kernel_of and j not in seen:
            seen.add(j)
            if j in code.fusions:
                j = code.fusions[j][0]
            elif j in code.at_load:
                j = code.at_load[j]
            else:
                return None                     # an alias: no work of its own
        return j if j in kernel_of else None

    heads = {j: head(j) for j in range(len(partition.steps))}
    members = {}
    for j, h in heads.items():
        if h is not None:
            members.setdefault(h, []).append(j)
    facts = {}
    for j, step in enumerate(partition.steps):
        h = heads[j]
        if h is None:
            facts[step.op.index] = OpFacts(where, color, "", time_us=0.0)
            continue
        seconds = kernel_timings.get((position, kernel_of[h]))
        facts[step.op.index] = OpFacts(where, color, "", group=partition.steps[h].op.index,
                                       group_size=len(members[h]), time_us=_median_us(seconds))
    return facts


def overlays(model, facts_by_subgraph: dict, profiled: bool) -> dict:
    """overlay name -> its ModelNodeData as a dict (graph id -> GraphNodeData): where, why,
    fusion, and with `profiled` time. `facts_by_subgraph`: subgraph index -> op facts."""
    ids = graph_ids(model)
    names = [{op.index: op.name for op in sg.operators} for sg in model.subgraphs]
    out = {name: {} for name in OVERLAYS if name != "time" or profiled}
    for index, facts in facts_by_subgraph.items():
        graph = ids[index]
        group_color = {}
        where, why, fusion, time = {}, {}, {}, {}
        for op_index, f in sorted(facts.items()):
            node = str(op_index)
            where[node] = {"value": f.where, "bgColor": f.color}
            why[node] = {"value": f.why or f"runs in {f.where}", "bgColor": f.color}
            if f.group is None:
                fusion[node] = {"value": "no work of its own (addresses its input)"
                                if f.where.startswith("partition") else f"not fused ({f.where})"}
            elif f.group_size == 1:
                fusion[node] = {"value": f"#{op_index} {names[index][op_index]} alone"}
            else:
                color = group_color.setdefault(f.group, GROUP_COLORS[len(group_color) % len(GROUP_COLORS)])
                fusion[node] = {"value": f"#{f.group} {names[index][f.group]} (+{f.group_size - 1} fused)",
                                "bgColor": color}
            if profiled:
                time[node] = {"value": round(f.time_us, 3) if f.time_us is not None else 0}
        out["where"][graph] = {"name": OVERLAYS["where"], "results": where}
        out["why"][graph] = {"name": OVERLAYS["why"], "results": why}
        out["fusion"][graph] = {"name": OVERLAYS["fusion"], "results": fusion}
        if profiled:
            out["time"][graph] = {"name": OVERLAYS["time"], "results": time,
                                  "gradient": TIME_GRADIENT}
    return out
