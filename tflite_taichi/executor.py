"""The executor: what runs a model's subgraphs for the Interpreter (the tf.lite face).

- `SubgraphState`: one subgraph's shapes, prepared graph, delegate schedule and program, IO
  arrays and state; allocate (prepare, partition, compile), invoke (feed the float views, run
  the schedule: partitions on the device, the rest on numpy), read back;
- `ModelRuntime`: what stateful ops may ask of the model they run in (`ops.base.Runtime`): the
  resource variables, CALL_ONCE's init subgraphs, IF/WHILE's subgraphs prepared per call shapes
  and, on a Taichi backend, delegated (`DelegatedCall`);
- `init_subgraphs`: the subgraphs a model's init ops name, prepared with the main graph.
"""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import Optional

import numpy as np

from tflite_taichi import graph as graph_mod
from tflite_taichi.auto_choice import Chooser
from tflite_taichi.litert_cpu import litert_invoke_error
from tflite_taichi.errors import (BackendUnavailable, InputError, InterpreterStateError, ModelError,
                                  NotReadyError, TensorTooLargeError, TfliteTaichiError)
from tflite_taichi.quant import dequantize, is_float_view, quantize
from tflite_taichi.variables import Variables


@dataclass(frozen=True)
class DelegateOptions:
    """What an Interpreter asks of the delegate, typed: built once by the Interpreter, read by
    every subgraph it runs and every call it delegates."""
    backend: str                        # 'reference', 'litert' or the Taichi backend that runs
    precision: str = "fp32"             # 'fp32' or 'fp16' (f16 storage)
    max_partitions: int = 1
    profile: bool = False
    preserve_all: bool = False          # copy every delegated tensor back for get_tensor
    reference_ops: frozenset = frozenset()  # op names kept on numpy (`auto` without a GPU)
    background: bool = False            # answer on the CPU while the kernels compile
    # `auto` on a GPU with LiteRT to answer meanwhile: time both sides' first invokes and run
    # on the faster from then on (auto_choice.py)
    choose: bool = False
    # (islands, specs, dynamic) -> litert_islands.IslandRunner: the schedule's CPU steps on
    # LiteRT's kernels (Taichi backends where LiteRT is installed; None: on numpy)
    litert_islands: object = None
    threads: int = 0                    # Taichi's CPU loops' budget (costs.cpu_loop_threads)
    cost_backend: Optional[str] = None  # `auto` on a GPU: what numpy runs faster stays on the CPU
    cache: object = None                # runtime.cache.ModelCache (Taichi backends)

    @property
    def fp16(self) -> bool:
        return self.precision == "fp16"


@contextlib.contextmanager
def _pushed(stack: list, item):
    """`item` on top of `stack` while the block runs (the calls under way, outermost first)."""
    stack.append(item)
    try:
        yield
    finally:
        stack.pop()


class DelegatedCall:
    """A subgraph that IF, WHILE or a composite calls (ops/control.py), delegated as the main
    graph is: its own schedule and Program, built when the call is prepared for its input
    shapes (in allocate_tensors, where the shapes are known then), with the interpreter's
    options. The calling op stays on the host and hands values across (a WHILE reads one
    condition per iteration); inside the call, the delegated ops run as one launch sequence and
    one wait, the rest on numpy as in any schedule. Values cross as float views (no integer
    codes: the calling op hands real values), and the call's outputs come back in the dtypes
    the reference path gives (int32 counters as int32, not the io buffer's float32).
    A subgraph with variable tensors of its own (an LSTM's state inside a loop body) stays on
    the reference path: its state is not kept per call."""

    def __init__(self, prepared, options: DelegateOptions, runtime: "ModelRuntime"):
        self.prepared, self._runtime = prepared, runtime
        self.schedule, self.program = None, None
        self.runs = 0                   # calls its program answered (the others: the reference path)
        if prepared.variables:
            return
        self.schedule, self.program = delegate_subgraph(prepared, options, runtime.resources,
                                                        called=True)

    def run(self, feeds: dict):
        """The call's tensors' values (float views) for `feeds` (float views of its inputs), or
        None where the program cannot answer (none, or its kernels still compiling: the caller
        runs the reference path)."""
        program = self.program
        if program is None or not program.can_run():
            return None
        values = {**self.prepared.constants, **feeds}
        run_schedule(self.schedule.items, values, cpu_step(self._runtime),
                     program.start_invoke(values))
        self.runs += 1
        specs = self.prepared.specs
        for t in self.prepared.subgraph.outputs:
            values[t] = _reference_form(specs[t], values[t])
        return values

    def info(self) -> dict:
        """What summary()["calls"] says of it."""
        sg = self.prepared.subgraph
        names = {op.index: op.name for op in sg.operators}
        if self.schedule is None:
            fallback = [{"index": s.op.index, "op": s.op.name,
                         "reason": "a called subgraph with variable tensors of its own runs on "
                                   "the numpy path"} for s in self.prepared.steps]
        else:
            fallback = [{"index": i, "op": names[i], "reason": r}
                        for i, r in sorted(self.schedule.refused.items())]
        partitions = [] if self.schedule is None else [
            {"ops": [s.op.index for s in p.steps],
             "kernels": self.program.code(p).launches} for p in self.schedule.partitions]
        return {"subgraph": sg.index, "name": sg.name,
                "input_shapes": [list(self.prepared.specs[t].shape) for t in sg.inputs],
                "ops_total": len(sg.operators),
                "ops_delegated": sum(len(p["ops"]) for p in partitions),
                "partitions": partitions, "fallback": fallback, "runs_on_delegate": self.runs,
                "kernels": None if self.program is None else kernels_state(self.program)}

    def close(self) -> None:
        if self.program is not None:
            self.program.close()


def delegate_subgraph(prepared, options: DelegateOptions, resources, state=None,
                      called: bool = False) -> tuple:
    """(schedule, program or None): `prepared`'s partitions and CPU steps with `options`, and
    the program (program_builder.build_program) that runs the partitions, if any; for a
    model's subgraph (its variable tensors: `state`) and for a called one alike.
    `resources`: the interpreter's resource variables. called: a subgraph IF, WHILE or a
    composite calls (DelegatedCall): its refusals are not warned (they name op indices of
    another subgraph; summary()["calls"] reports them with the subgraph they belong to), no
    tensor is preserved, and values cross as float views (no integer codes)."""
    from tflite_taichi.partition import build_schedule
    from tflite_taichi.program_builder import build_program
    preserve_all = options.preserve_all and not called
    schedule = build_schedule(prepared, options.max_partitions, fp16=options.fp16,
                              warn=not called, preserve_all=preserve_all,
                              reference_ops=options.reference_ops,
                              cost_backend=options.cost_backend, called=called,
                              backend=None if called else options.backend)
    if not schedule.partitions:
        return schedule, None
    program = build_program(prepared, schedule, options.backend, options.fp16, options.cache,
                            preserve_all, background=options.background,
                            cpu_threads=options.threads, variables=resources, state=state,
                            io_codes=not called)
    return schedule, program


def kernels_state(program) -> str:
    """Where a program's kernels stand, for summary(): 'compiling' (answer_while_compiling:
    the reference path answers meanwhile), 'ready', or 'failed (Type: why)'."""
    if program.compiling:
        return "compiling"
    if program.failed is not None:
        return f"failed ({type(program.failed).__name__}: {program.failed})"
    return "ready"


def _initial_variables(prepared) -> Variables:
    """A called subgraph's variable tensors at their values in the model (or zeros)."""
    state = Variables()
    for t, v in prepared.variables.items():
        state[t] = np.array(v)
    return state


def _reference_form(spec, value):
    """A partition's output as the reference path holds it: float views as they come, other
    tensors in their own dtype (the io buffer carries integers and bools as float32)."""
    if spec.dtype is None or is_float_view(spec.dtype, spec.quantization):
        return value
    dtype = np.dtype(spec.dtype)
    if value.dtype == dtype:
        return value
    if dtype.kind in "iu":
        value = np.rint(value)
    return value.astype(dtype)


class ModelRuntime:
    """What stateful ops see of their interpreter: the resource variables (as long-lived as
    the interpreter, shared by its subgraphs), CALL_ONCE's subgraph runner, and for IF/WHILE
    (ops/control.py) subgraphs prepared for the shapes they are called with, run delegated on a
    Taichi backend (DelegatedCall, where the call's program can answer) and on the reference
    path otherwise."""

    MAX_CALL_PREPARATIONS = 256         # cached (subgraph, input shapes) preparations
    # Subgraph calls (IF, WHILE, STABLEHLO_COMPOSITE, CALL_ONCE) nested in one another, the
    # main graph's calls at depth 1. Each level costs a few Python frames, preparing and
    # running alike, so a chain of a few hundred IF subgraphs ran out of Python's stack (a bare
    # RecursionError; LiteRT overflows its native stack). Converted models nest a handful deep.
    MAX_CALL_DEPTH = 64

    def __init__(self, model, resolved, state_of, delegate_options=None, litert_model=None):
        self._model = model             # model.Model: its subgraphs
        # backend 'litert': () -> litert_cpu.LiteRTModel, the model on LiteRT's CPU kernels, one
        # for every subgraph the interpreter runs (made at the first allocation, again after close)
        self._litert_factory = litert_model
        self._litert = None
        self._resolved = resolved       # graph.resolve_ops(model)
        self._state_of = state_of       # subgraph index -> its SubgraphState (made on demand)
        # the interpreter's options on a Taichi backend (None: reference): calls are delegated
        self._delegate_options = delegate_options
        self._delegated = {}            # id(PreparedGraph) -> its DelegatedCall
        # id(PreparedGraph) -> its variable tensors during one eval of the op calling it
        # (_start_call); only for subgraphs that have some
        self._call_variables = {}
        self.resources = Variables()    # ResourceHandle -> array in the model's dtype
        self._called = set()            # subgraphs CALL_ONCE has run (or is running)
        self._calls = {}                # (subgraph index, input shapes) -> PreparedGraph
        # one memory budget for the model: every subgraph state's tensors and those of the
        # calls they make (graph.ModelBudget)
        self.budget = graph_mod.ModelBudget(None if model is None else model.max_tensor_bytes)
        self._preparing = []            # subgraph indices being prepared, outermost first
        self._nested = []               # subgraph calls under way (prepared or run), outermost first

    def preparing(self, subgraph_index: int):
        """Marks a subgraph as being prepared: a call back into it from inside is recursion."""
        return _pushed(self._preparing, subgraph_index)

    def _calling(self, subgraph_index: int):
        """Marks a subgraph call as under way (its preparation or its run): one nesting level."""
        return _pushed(self._nested, subgraph_index)

    def _check_depth(self, index: int, node) -> None:
        """Refuses, before preparing or running it, a call of subgraph `index` that would nest
        deeper than MAX_CALL_DEPTH, naming the depth and the chain of subgraphs."""
        depth = len(self._nested) + 1
        if depth <= self.MAX_CALL_DEPTH:
            return
        chain = [str(i) for i in self._nested + [index]]
        if len(chain) > 8:
            chain = chain[:3] + ["..."] + chain[-3:]
        error = node.fail(f"calls subgraph {index} at nesting depth {depth} (the calls under way: "
                          f"subgraphs {' -> '.join(chain)}): subgraph calls may nest at most "
                          f"{self.MAX_CALL_DEPTH} deep")
        error.call_depth = depth    # passed out as it is: its message names every level already
        raise error

    def subgraph(self, index: int, node, role: str = "called"):
        """The model's subgraph `index`, as named by op `node` (ModelError if out of range)."""
        count = len(self._model.subgraphs)
        if not 0 <= index < count:
            raise node.fail(f"{role} subgraph {index} does not exist ({count} subgraphs)")
        return self._model.subgraphs[index]

    def prepare_subgraph(self, index: int, input_shapes, node):
        """Subgraph `index` prepared (shapes inferred, constants folded) for inputs of
        `input_shapes`, for op `node` (IF/WHILE) to call; cached per shapes. A subgraph already
        being prepared further out is recursion: a ModelError (LiteRT crashes on it)."""
        sg = self.subgraph(index, node)
        self._check_depth(index, node)      # every call of it is prepared first: runs are bounded too
        key = (index, tuple(tuple(int(d) for d in s) for s in input_shapes))
        prepared = self._calls.get(key)
        if prepared is not None:        # its tensors count in this allocation too
            self.budget.call(("call", key), prepared.charges, f"subgraph {index} called by op "
                             f"#{node.index} ({node.op}) for inputs of shapes {list(key[1])}")
            self._start_call(prepared, node)
            return prepared
        if index in self._preparing:
            chain = " -> ".join(str(i) for i in self._preparing[self._preparing.index(index):])
            raise node.fail(f"calls subgraph {index}, which is already being called (subgraphs "
                            f"{chain} -> {index}): recursive subgraph calls are not supported")
        try:
            with self.preparing(index), self._calling(index), self._charging(("call", key)):
                prepared = graph_mod.prepare(sg, self._resolved, dict(zip(sg.inputs, key[1])),
                                             runtime=self, budget=self.budget)
        except ModelError as e:         # say where: nested calls give a chain of ops
            if getattr(e, "call_depth", None) is not None:
                raise
            where = f"in subgraph {index}: {e}"
            if isinstance(e, TensorTooLargeError):      # stays what it is
                raise TensorTooLargeError(f"op #{node.index} ({node.op}): {where}") from None
            raise node.fail(where) from None
        self.budget.counted(("call", key))      # charged as it was prepared
        if len(self._calls) >= self.MAX_CALL_PREPARATIONS:
            self._calls.clear()
            self._call_variables.clear()
            self._close_delegated()
            self.budget.release(keep=lambda owner: owner[0] != "call")
        self._calls[key] = prepared
        self._start_call(prepared, node)
        return prepared

    def _start_call(self, prepared, node) -> None:
        """An IF, WHILE or composite prepares the subgraphs it calls at every eval
        (ops/control.py), so an eval starts here: the called subgraph's variable tensors start
        again from their values in the model, as in LiteRT, which frees a called subgraph's
        memory after each eval of its op (a WHILE's iterations share them). On a Taichi backend
        the call is delegated."""
        if prepared.variables:
            self._call_variables[id(prepared)] = _initial_variables(prepared)
        self._delegate(prepared, node)

    def _delegate(self, prepared, node) -> None:
        """On a Taichi backend, the call's DelegatedCall (built once per preparation, and again
        after close())."""
        if self._delegate_options is None or id(prepared) in self._delegated:
            return
        try:
            self._delegated[id(prepared)] = DelegatedCall(prepared, self._delegate_options, self)
        except ModelError as e:
            raise node.fail(f"delegating subgraph {prepared.subgraph.index}: {e}") from None

    def delegated_calls(self) -> list:
        """The delegated calls prepared so far (summary()["calls"])."""
        return list(self._delegated.values())

    def call_programs(self) -> list:
        """The programs of the delegated calls (wait_for_kernels waits for them too)."""
        return [call.program for call in self._delegated.values() if call.program is not None]

    def prepared_calls(self) -> list:
        """(PreparedGraph, its DelegatedCall or None) of every call prepared so far."""
        return [(prepared, self._delegated.get(id(prepared))) for prepared in self._calls.values()]

    def _close_delegated(self) -> None:
        for call in self._delegated.values():
            call.close()
        self._delegated.clear()

    @property
    def litert(self):
        """The model on LiteRT's CPU kernels (backend 'litert'), None on other backends."""
        if self._litert is None and self._litert_factory is not None:
            self._litert = self._litert_factory()
            if self._litert is None:            # refused (the factory kept why): not again
                self._litert_factory = None
        return self._litert

    def hand_over_litert(self):
        """The LiteRT model this runtime made (None if none), from now on not this runtime's
        to close (Interpreter._become_litert gives it to the next runtime)."""
        litert, self._litert, self._litert_factory = self._litert, None, None
        return litert

    def close(self) -> None:
        """Free the delegated calls' device memory (Interpreter.close) and LiteRT's interpreter
        (unless it holds the model's lifetime state); the next allocate_tensors builds them
        again."""
        self._close_delegated()
        if self._litert is not None and not self._litert_holds_lifetime_state():
            self._litert.close()
            self._litert = None

    def _litert_holds_lifetime_state(self) -> bool:
        """Whether LiteRT's interpreter holds state that lives as long as ours: resource
        variables and CALL_ONCE's having run (reset_all_variables keeps them, and close() does
        on the other backends). LiteRT can neither hand them out nor take them back, so close()
        keeps such a model's LiteRT interpreter."""
        return any(opdef.variable_access or opdef.writes_resource_handle or opdef.init_subgraph_of
                   for opdef, _options in self._resolved.values())

    def _charging(self, owner):
        """Inside an allocation (allocate_tensors), a call preparation's tensors are the
        allocation's; outside one (a call first prepared at invoke), its own."""
        return contextlib.nullcontext() if self.budget.busy else self.budget.allocating(owner)

    def run_subgraph(self, prepared, feeds: dict) -> dict:
        """Run a subgraph from prepare_subgraph, delegated where it is (DelegatedCall), else on
        the reference path: `feeds` are the float views of its inputs; returns the values of
        its outputs (and, on the reference path, of every other tensor)."""
        with self._calling(prepared.subgraph.index):
            call = self._delegated.get(id(prepared))
            values = call.run(feeds) if call is not None else None
            if values is None:      # its variable tensors (if any) as this eval left them
                state = self._call_variables.get(id(prepared))
                held = state.snapshot() if state is not None else {}
                values = run_schedule(prepared.steps, {**prepared.constants, **held, **feeds},
                                      cpu_step(self, state))
            return values

    def has_run_init(self, subgraph_index: int) -> bool:
        """Whether CALL_ONCE has run (or is running) init subgraph `subgraph_index`."""
        return subgraph_index in self._called

    def call_once(self, subgraph_index: int, node) -> None:
        if subgraph_index in self._called:
            return
        count = len(self._model.subgraphs)
        if not 0 <= subgraph_index < count:
            raise node.fail(f"init subgraph {subgraph_index} does not exist ({count} subgraphs)")
        self._check_depth(subgraph_index, node)    # a chain of init subgraphs nests too
        self._called.add(subgraph_index)        # before running: a call back into it is a no-op
        try:
            state = self._state_of(subgraph_index)
            if state.subgraph.inputs:
                raise node.fail(f"init subgraph {subgraph_index} takes inputs; CALL_ONCE passes none")
            with self._calling(subgraph_index):
                if state.prepared is None:
                    state.allocate()
                state.invoke()
        except BaseException:
            # not run after all: the next invoke() tries again (and fails the same way) rather
            # than skip the initialisation silently
            self._called.discard(subgraph_index)
            raise


class SubgraphState:
    """Shapes, prepared graph, delegate schedule and IO storage of one subgraph."""

    def __init__(self, model, subgraph, resolved, options, runtime=None):
        self.model = model
        self.subgraph = subgraph
        self.resolved = resolved
        self.options = options          # DelegateOptions
        self.runtime = runtime          # the ModelRuntime (variables, CALL_ONCE)
        self.input_shapes = {}          # resized inputs: tensor index -> shape
        self.prepared = None            # PreparedGraph after allocate_tensors
        self.schedule = None            # partitions and CPU steps (Taichi backends)
        # what run_schedule runs when the program answers: the schedule's items with runs of
        # CPU steps as LiteRT islands (_plan_islands), or None (the schedule's own)
        self.run_items = None
        self.islands_refused = None     # why LiteRT does not run this schedule's CPU steps
        self.program = None             # delegate.Program: the partitions on the device
        self.io = {}                    # input/output tensor index -> array in the model's dtype
        self.values = {}                # float views from the last invoke
        # variable tensor index -> float view, kept across invokes (on the device where the
        # delegate keeps them: Program's state slots)
        self.variables = Variables()
        self.invoked = False
        self.timings = {}               # schedule position -> list of seconds (profile=True)
        self.kernel_timings = {}        # (schedule position, kernel) -> list of seconds (same)
        self._last_allocation = None    # the _KEPT fields after the last successful allocate
        self.failed = None              # why the last invoke() failed ("Type: message"), or None
        self.closed = False             # close() freed the device memory
        self._answering = None          # the program that ran the last invoke (None: reference)
        # which path ran the last invoke: 'delegate', 'reference' (numpy) or 'litert' (LiteRT's
        # CPU kernels: backend 'litert', or the answers while the kernels compile)
        self.answered_by = None
        self._lean = (None, None)       # (program, its lean_step or None): see lean_step
        self._interim = None            # see _interim_litert
        # `auto`'s measurement of this subgraph's two sides (auto_choice.Chooser), once it has a
        # program; its choice, once made, holds for the interpreter's lifetime
        self.chooser = None
        # backend 'litert': LiteRT's tensors hold the inputs and outputs (set_tensor writes
        # them there, get_tensor reads them there: one copy each, as in LiteRT) until
        # Interpreter.tensor() hands out a live view of an io array; from then on the io arrays
        # hold them and each invoke copies them across (a view may be written at any time)
        self.views_given = False
        # while LiteRT holds them: (LiteRT's wrapper, {input: dtype}, outputs) for the
        # Interpreter's lean set_tensor / invoke / get_tensor (see litert_lean); else None
        self.litert_lean = None

    # what allocate() puts back when a resize does not fit (the last invoke's values, which a
    # failed _allocate never reaches, stay as they are)
    _KEPT = ("input_shapes", "prepared", "schedule", "program", "io", "run_items", "islands_refused")

    def allocate(self):
        """Prepare (and on a Taichi backend plan and compile) for the current input shapes. If
        that fails after resize_tensor_input, the state of the last successful allocate is put
        back (its input shapes included), so the interpreter stays usable, and the error says
        which resize did not fit; a first allocate's error passes as it is."""
        good = self._last_allocation
        self._take_io_from_litert(outputs=False)    # the inputs set so far, kept if they fit
        self.litert_lean = None
        try:
            if self.runtime is None:
                self._allocate()
            else:                   # its tensors, its calls' included, replace its last ones
                with self.runtime.budget.allocating(("state", self.subgraph.index)):
                    self._allocate()
        except Exception as e:
            previous = good["input_shapes"] if good is not None else {}
            tried = {t: s for t, s in self.input_shapes.items() if previous.get(t) != s}
            if good is None:        # a first allocate: back to unallocated, resizes dropped
                self.prepared, self.schedule, self.program, self.io = None, None, None, {}
                self.values, self.invoked = {}, False
                if not tried:
                    raise
                self.input_shapes = {}
            else:
                for name in self._KEPT:
                    setattr(self, name, good[name])
                self.input_shapes = dict(previous)
                self._restore_litert()
            # MemoryError: numpy could not allocate the resized tensors (a ModelError covers
            # limits we check ourselves); either way the resize is what does not fit
            if not tried or not isinstance(e, (ModelError, MemoryError)):
                raise
            what = ", ".join(f"'{self.subgraph.tensors[t].name}' to {list(shape)}" for t, shape in tried.items())
            why = (f"{e}" if isinstance(e, ModelError)
                   else f"not enough memory for the tensors of those shapes ({e})")
            raise InputError(f"resizing input {what} does not fit the model: {why}. The interpreter "
                             "keeps its previous input shapes") from e
        previous = good["program"] if good is not None else None
        if previous is not None and previous is not self.program:
            previous.close()            # the last allocate's device memory, now unused
        self._last_allocation = {name: getattr(self, name) for name in self._KEPT}
        self._last_allocation["input_shapes"] = dict(self.input_shapes)
        self.failed, self.closed = None, False

    def _allocate(self):
        if self.runtime is not None:        # IF/WHILE inside call subgraphs with these shapes
            with self.runtime.preparing(self.subgraph.index):
                self.prepared = graph_mod.prepare(self.subgraph, self.resolved, self.input_shapes,
                                                  self.runtime, self.runtime.budget)
        else:
            self.prepared = graph_mod.prepare(self.subgraph, self.resolved, self.input_shapes)
        self.schedule, self.program = None, None
        self.run_items, self.islands_refused = None, None
        variables = Variables()         # this allocation's variable tensors (reset below)
        if self.options.backend not in ("reference", "litert"):
            self.schedule, self.program = delegate_subgraph(
                self.prepared, self.options, getattr(self.runtime, "resources", None),
                state=variables)
        self.run_items, self.islands_refused = self._plan_islands()
        old = self.io
        self.io = {}
        for t in list(self.subgraph.inputs) + list(self.subgraph.outputs):
            spec = self.prepared.specs[t]
            keep = old.get(t)
            if t in self.subgraph.inputs and keep is not None and keep.shape == spec.shape:
                self.io[t] = keep       # allocate_tensors keeps inputs already set, as LiteRT does
            else:
                self.io[t] = np.zeros(spec.shape, dtype=spec.dtype)
        if self.options.backend == "litert":
            litert = self.runtime.litert
            litert.allocate(self.subgraph.index, {t: self.io[t].shape for t in self.subgraph.inputs})
            litert.check_shapes(self.subgraph.index, self._static_shapes())
            self._give_io_to_litert()
        self.variables = variables
        self.reset_variables()          # as LiteRT's AllocateTensors
        self.values = {}
        self.invoked = False
        self._answering, self.answered_by = None, None
        self._lean = (None, None)
        self._interim = None            # LiteRT not yet allocated for these shapes (_interim_litert)
        self.timings, self.kernel_timings = {}, {}

    # -- the CPU steps of a schedule: islands on LiteRT's kernels ----------------------------------
    def _plan_islands(self) -> tuple:
        """(the items run_schedule runs when the program answers: the schedule's, each run of
        CPU steps LiteRT can take replaced by one litert_islands.IslandStep; why LiteRT does
        not run them, or None). Not with profile=True (its table times each op) nor
        experimental_preserve_all_tensors (LiteRT keeps no island's intermediates)."""
        make = self.options.litert_islands
        if (make is None or self.program is None or self.options.profile
                or self.options.preserve_all):
            return None, None
        from tflite_taichi.litert_islands import IslandStep, island_runs
        runs = island_runs(self.model, self.subgraph.index, self.schedule.items)
        if not runs:
            return None, None
        try:
            runner = make([island for _, _, island in runs], self.prepared.specs,
                          frozenset(self.prepared.dynamic))
        except (BackendUnavailable, ModelError, InputError) as e:
            return None, str(e)
        items = list(self.schedule.items)
        for k, (start, count, _island) in reversed(list(enumerate(runs))):
            items[start:start + count] = [IslandStep(runner, k, items[start:start + count])]
        return items, None

    def islands(self) -> list:
        """The op indices each LiteRT island of the schedule runs (summary, inspect)."""
        return [[step.op.index for step in item.replaces]
                for item in (self.run_items or ()) if hasattr(item, "replaces")]

    # -- backend 'litert': where the io data lives ----------------------------------------------
    def _litert_holds_io(self) -> bool:
        return self.options.backend == "litert" and not self.views_given

    def _give_io_to_litert(self) -> None:
        """After LiteRT's allocation: the inputs (kept or zeros) into LiteRT's tensors, which
        hold them from here while no view is out; the lean path's table for them."""
        if not self._litert_holds_io():
            return
        litert, index = self.runtime.litert, self.subgraph.index
        for t in self.subgraph.inputs:
            litert.write(t, self.io[t], index)
        self.litert_lean = (litert.wrapper, {
            t: self.io[t].dtype for t in self.subgraph.inputs if self.io[t].dtype.kind in "biufc"},
            frozenset(self.subgraph.outputs))

    def _take_io_from_litert(self, outputs: bool) -> None:
        """What LiteRT holds into the io arrays: the inputs (and, after an invoke, the
        outputs, where `outputs`), before LiteRT's tensors are resized or freed, or when the io
        arrays start holding the data (a view handed out)."""
        if not (self._litert_holds_io() and self._last_allocation is not None and self.runtime.litert is not None):
            return
        litert, index = self.runtime.litert, self.subgraph.index
        for t in self.subgraph.inputs:
            np.copyto(self.io[t], litert.read(t, index))
        if outputs and self.invoked:
            for t in self.subgraph.outputs:
                value = litert.read(t, index)
                if value.shape == self.io[t].shape:
                    np.copyto(self.io[t], value)
                else:               # a data-dependent shape: this invoke's
                    self.io[t] = value

    def _restore_litert(self) -> None:
        """After a resize that did not fit: LiteRT's tensors back to the kept shapes, the kept
        inputs in them (best effort: if LiteRT cannot, the next invoke says so)."""
        if self.options.backend != "litert" or self.prepared is None:
            return
        try:
            self.runtime.litert.allocate(self.subgraph.index,
                                         {t: self.io[t].shape for t in self.subgraph.inputs})
        except (BackendUnavailable, InputError):
            return
        self._give_io_to_litert()

    def unprepare(self) -> None:
        """An input was resized: allocate() must run again before anything else."""
        self.prepared, self.litert_lean = None, None

    def hand_out_views(self) -> None:
        """Interpreter.tensor(): the io arrays hold the data from now on (a live view may be
        written at any time, so each invoke copies the inputs across)."""
        if self.views_given:
            return
        self._take_io_from_litert(outputs=True)
        self.views_given, self.litert_lean = True, None

    def io_shape(self, t) -> tuple:
        """The current shape of input or output `t` (an output's changes with the data)."""
        if self._litert_holds_io() and self.invoked and self.prepared is not None:
            return self.runtime.litert.shape(t, self.subgraph.index)
        return self.io[t].shape

    def set_io(self, t, value) -> None:
        """An input's (or output's) data, checked by the caller: `value` in the model's dtype
        (either byte order) and shape."""
        if not self._litert_holds_io():
            np.copyto(self.io[t], value)
            return
        self.runtime.litert.write(t, np.asarray(value, dtype=self.io[t].dtype), self.subgraph.index)
        if t not in self.subgraph.inputs:   # an output: its data until the next invoke
            np.copyto(self.io[t], value)

    def reset_variables(self):
        """Variable tensors (an LSTM's state) back to their values in the model (or zeros)."""
        if self.options.backend == "litert":       # LiteRT holds them
            self.runtime.litert.reset_variables()
        for t, v in (self.prepared.variables or {}).items():
            self.variables[t] = np.array(v)     # a host write: the device's copies are stale

    def _run_schedule(self, feeds: dict, program) -> dict:
        """The schedule (partitions on `program`'s device, the rest on numpy), or every step on
        numpy where no program answers (the reference backend, or kernels still compiling)."""
        values = {**self.prepared.constants, **feeds}
        host = cpu_step(self.runtime, self.variables)
        if program is None:
            if self.schedule is None or self.program is not None:
                # no schedule, or kernels still compiling (its partitions cannot run here)
                return run_schedule(self.prepared.steps, values, host)
            timings = self.timings if self.options.profile else None   # a schedule of CPU steps
            return run_schedule(self.schedule.items, values, host, timings=timings)
        # outputs straight into the io arrays, where they fit
        device = program.start_invoke(values, {t: self.io[t] for t in self.subgraph.outputs})
        profiling = self.options.profile
        return run_schedule(self.run_items or self.schedule.items, values, host, device,
                            self.timings if profiling else None,
                            self.kernel_timings if profiling else None)

    def close(self) -> None:
        """Free the device memory and kernels (the interpreter must be allocated again)."""
        self._take_io_from_litert(outputs=False)    # LiteRT's tensors may go: the inputs stay
        self.litert_lean = None
        self.closed = True
        for program in {id(p): p for p in (self.program, (self._last_allocation or {}).get("program"))
                        if p is not None}.values():
            program.close()
        self.program, self.prepared, self.schedule, self._last_allocation = None, None, None, None
        self.values, self.invoked = {}, False

    def require_allocated(self, what: str) -> None:
        if self.prepared is None:
            again = (" again: resize_tensor_input() changed the input shapes"
                     if self._last_allocation is not None else
                     " again: close() freed its memory" if self.closed else "")
            raise NotReadyError(f"{what} called before allocate_tensors(){again}")

    def invoke(self):
        """Run the graph on the inputs set. If it raises, no output has a value until the next
        successful invoke (read() says why); inputs, shapes and compiled kernels stay as they
        were, so the interpreter is usable at once (resource variables an ASSIGN_VARIABLE wrote
        before the failure keep what it wrote, as in LiteRT)."""
        self.require_allocated("invoke()")
        self.failed = None
        try:
            if self.options.backend == "litert":
                self._invoke_litert()
                return
            if self.chooser is not None or (self.options.choose and self.program is not None):
                self._invoke_choosing()
                return
            self._invoke_any()
        except BaseException as e:
            self.values, self.invoked = {}, False
            self.failed = f"{type(e).__name__}: {e}"
            raise

    def _invoke_any(self):
        """One invoke on whatever answers now: the delegate (its lean step where it can take
        it), or the CPU while its kernels compile."""
        lean = self.lean_step()
        if lean is not None:            # no numpy arithmetic: no floating-point warnings to mute
            self.values, self.invoked = {}, False
            lean()
            self.answered_by, self.invoked = "delegate", True
            return
        # NaN and Inf in the data are values, not errors (LiteRT neither warns nor stops):
        # numpy's floating-point warnings are off while the graph runs
        with np.errstate(all="ignore"):
            self._invoke()

    def _invoke_choosing(self):
        """`auto` on a GPU (DelegateOptions.choose): the side auto_choice chose answers; until
        it has chosen, whichever answers now does, the GPU's invokes timed, and once its first
        ones are in, LiteRT is timed beside them and the choice is made and kept in the kernel
        cache for the next process. (A choice of LiteRT makes the Interpreter run the whole
        model on LiteRT from its next invoke: Interpreter._become_litert; until then, or where
        it cannot, LiteRT answers here.)"""
        chooser = self.chooser
        if chooser is None:
            chooser = self.chooser = Chooser()
        if chooser.choice is not None:
            litert = self._interim_litert() if chooser.choice.runs_on == "litert" else None
            if litert is not None:
                self._invoke_interim(litert)
            else:
                self._invoke_any()
            return
        start = time.perf_counter()
        self._invoke_any()
        if self.answered_by == "delegate":  # not LiteRT's interim answers (auto_choice.LITERT_STEPS)
            chooser.add("delegate", time.perf_counter() - start)
        if chooser.gpu_timed():
            self._choose(chooser)

    def _choose(self, chooser) -> None:
        litert = self._interim_litert()
        if litert is None:
            # LiteRT cannot run these shapes: the GPU it is, for this interpreter (not kept:
            # another process, or other shapes, may find LiteRT able)
            chooser.litert = [float("inf")]
            chooser.decide()
            return
        self._time_litert(litert)       # left out: a first invoke packs weights, starts threads
        for _ in range(chooser.litert_missing()):
            chooser.add("litert", self._time_litert(litert))
        choice = chooser.decide()
        cache = self.options.cache
        if cache is not None:
            cache.remember_choice(self.subgraph.index, choice)

    def _time_litert(self, litert) -> float:
        """One LiteRT invoke of the inputs and state the host holds, answering nothing (its
        outputs and state are dropped): a step time beside the GPU's."""
        inputs, _ = self._litert_inputs()
        start = time.perf_counter()
        litert.run(self.subgraph.index, inputs, list(self.subgraph.outputs))
        return time.perf_counter() - start

    def chose_litert(self) -> bool:
        """Whether `auto` measured LiteRT faster on this subgraph while the delegate still
        holds it (Interpreter._become_litert hands the model over)."""
        chooser = self.chooser
        return (chooser is not None and chooser.choice is not None
                and chooser.choice.runs_on == "litert" and self.options.choose)

    def switch_to(self, options: DelegateOptions, runtime) -> None:
        """Interpreter._become_litert: this subgraph on `options`' backend ('litert') and
        `runtime` from now on, allocated again for the same input shapes (the delegate's
        program closed), the inputs set so far kept, and the variable tensors' state as it
        stood (an LSTM's h and c) carried into LiteRT, which holds it from here."""
        inputs, _ = self._litert_inputs()
        # copies: allocate() below takes LiteRT's tensors into the io arrays, and LiteRT's
        # inputs still hold the ones auto_choice timed it on
        carried = [(t, np.array(value)) for t, value in inputs]
        self.options, self.runtime = options, runtime
        self.allocate()
        litert, index = runtime.litert, self.subgraph.index
        for t, value in carried:
            litert.write(t, value, index)
            if t in self.io:
                np.copyto(self.io[t], value)
            else:                   # a variable tensor: LiteRT holds it, the host keeps a copy
                tensor = self.subgraph.tensors[t]
                self.variables[t] = (dequantize(value, tensor.quantization)
                                     if is_float_view(tensor.dtype, tensor.quantization) else value)

    def _litert_inputs(self) -> tuple:
        """(inputs, state) for a LiteRT invoke of what the host holds: the model's inputs, and
        its variable tensors' state (an LSTM's h and c) in the model's dtypes; `state` lists
        those variable tensors."""
        state = list(self.prepared.variables or {})
        self._answering = None          # the host's state, in the model's dtypes (no device codes)
        inputs = [(t, self.io[t]) for t in self.subgraph.inputs]
        inputs += [(t, np.ascontiguousarray(self._to_model_dtype(t, self.variables[t]))) for t in state]
        return inputs, state

    def answering_program(self):
        """The program that runs the next invoke: None when there is none, or while its kernels
        compile in the background (Interpreter(answer_while_compiling=True)): the reference
        path answers then, with the same state (variables live on the host between invokes)."""
        program = self.program
        return program if program is not None and program.can_run() else None

    def lean_step(self):
        """The delegate's lean step (Program.lean_step) where the next invoke can take it: the
        program answers, runs its one partition with nothing on the host between (its CPU steps
        are CALL_ONCEs that have run: OpDef.init_subgraph_of; state stays in the program's
        slots), no profiling; else None (the general path)."""
        program = self.program
        if program is None or self.options.profile or not program.can_run():
            return None
        if self._lean[0] is not program:
            if not all(hasattr(item, "steps") or self._init_done(item) for item in self.schedule.items):
                return None             # e.g. CALL_ONCE before the first invoke: asked again
            inputs = {t: self.io[t] for t in self.subgraph.inputs}
            outputs = {t: self.io[t] for t in self.subgraph.outputs}
            self._lean = (program, program.lean_step(inputs, outputs))
        self._answering = program
        return self._lean[1]

    def _init_done(self, item) -> bool:
        """A CPU step that has nothing left to do: an init op whose subgraph has run."""
        init = item.opdef.init_subgraph_of
        return (init is not None and self.runtime is not None
                and self.runtime.has_run_init(init(item.node.options)))

    def _invoke(self):
        program = self._answering = self.answering_program()
        if program is None and self.program is not None:    # its kernels are compiling
            interim = self._interim_litert()
            if interim is not None:
                self._invoke_interim(interim)
                return
        feeds = {}
        # inputs the delegate takes as integer codes go as they are (its kernels dequantize them)
        codes = program.layout.codes if program is not None else ()
        for t in self.subgraph.inputs:
            tensor = self.subgraph.tensors[t]
            data = self.io[t]
            feeds[t] = (dequantize(data, tensor.quantization)
                        if is_float_view(tensor.dtype, tensor.quantization) and t not in codes
                        else data)
        # the state the last invoke left (steps overwrite it), but what the delegate keeps in
        # its slots: that stays on the device
        feeds.update(self.variables.snapshot(exclude=program.layout.slots if program is not None else ()))
        self.values = {}
        self.invoked = False
        values = self._run_schedule(feeds, program)
        self.answered_by = "delegate" if program is not None else "reference"
        for t in self.subgraph.outputs:
            value = self._to_model_dtype(t, values[t])
            if value is self.io[t]:     # the delegate took it there (Program.start_invoke's `into`)
                continue
            if value.shape == self.io[t].shape:
                np.copyto(self.io[t], value)
            else:               # a data-dependent shape (graph.run_step): this invoke's
                self.io[t] = np.array(value)
        self.values = values
        self.invoked = True

    def _invoke_litert(self):
        """The whole subgraph on LiteRT's CPU kernels. While LiteRT holds the io data, only its
        invoke; else the inputs in from the io arrays and the outputs back into them (a
        data-dependent shape replaces its array)."""
        self.values, self.invoked = {}, False
        sg, io = self.subgraph, self.io
        litert = self.runtime.litert
        if self._litert_holds_io():
            litert.invoke(sg.index)
        else:
            outputs = litert.run(sg.index, [(t, io[t]) for t in sg.inputs], sg.outputs)
            for t, value in zip(sg.outputs, outputs):
                held = io[t]
                if value.shape == held.shape:
                    np.copyto(held, value)      # into the array a tensor(i)() view holds
                else:
                    io[t] = value
        self.answered_by, self.invoked = "litert", True

    def _interim_litert(self):
        """The model on LiteRT's CPU kernels, allocated for this allocation's shapes, to answer
        while the kernels compile (Interpreter._interim_litert); None: numpy answers."""
        if self._interim is None:
            self._interim = False
            litert = self.runtime.litert if self.runtime is not None else None
            if litert is not None:
                try:
                    litert.allocate(self.subgraph.index, {t: self.io[t].shape for t in self.subgraph.inputs})
                    litert.check_shapes(self.subgraph.index, self._static_shapes())
                    self._interim = True
                except (BackendUnavailable, InputError, ModelError):
                    pass        # LiteRT does not take these shapes: numpy answers
        return self.runtime.litert if self._interim else None

    def _static_shapes(self) -> dict:
        """Every data tensor's shape that does not depend on the data (ours, from prepare)."""
        return {t: spec.shape for t, spec in self.prepared.specs.items()
                if t not in self.prepared.dynamic and self.subgraph.tensors[t].dtype is not None}

    def _invoke_interim(self, litert) -> None:
        """One invoke on LiteRT while the kernels compile, as the delegate would answer it: the
        inputs, and the variable tensors' state (an LSTM's h and c, as the host holds them),
        in; the outputs and the new state out, to the host, where the delegate's first invoke
        takes it up (Variables: a host write makes the device's copies stale)."""
        sg = self.subgraph
        inputs, state = self._litert_inputs()
        self.values, self.invoked = {}, False
        values = litert.run(sg.index, inputs, list(sg.outputs) + state)
        for t, value in zip(sg.outputs, values):
            held = self.io[t]
            if value.shape == held.shape:
                np.copyto(held, value)
            else:                   # a data-dependent shape: this invoke's
                self.io[t] = value
        for t, value in zip(state, values[len(sg.outputs):]):
            tensor = sg.tensors[t]
            self.variables[t] = (dequantize(value, tensor.quantization)
                                 if is_float_view(tensor.dtype, tensor.quantization) else value)
        self.answered_by, self.invoked = "litert", True

    def invoke_litert_lean(self, wrapper) -> None:
        """invoke() while LiteRT holds the io data (`wrapper`: litert_lean's): the same as
        invoke() -> _invoke_litert, with nothing else on the way (a model of a few
        microseconds is mostly this path)."""
        self.failed, self.invoked = None, False
        try:
            wrapper.Invoke(self.subgraph.index)
        except BaseException as e:
            self.failed = f"{type(e).__name__}: {e}"
            if isinstance(e, (ValueError, RuntimeError)):
                raise litert_invoke_error(e, self.subgraph.index) from None
            raise
        self.answered_by, self.invoked = "litert", True

    def _read_litert(self, t, name):
        """A tensor LiteRT holds: a variable tensor's state now, or (experimental_preserve_all_
        tensors=True) an intermediate of the last invoke."""
        if t in self.variables or self.options.preserve_all:
            if t not in self.variables and not self.invoked:
                raise NotReadyError(f"tensor {t} ('{name}') has no value: it is an intermediate "
                                    "and no invoke() has computed it")
            return self.runtime.litert.read(t, self.subgraph.index)
        raise InterpreterStateError(
            f"tensor {t} ('{name}') is an intermediate of LiteRT's CPU executor, which reuses its "
            "memory: create the Interpreter with experimental_preserve_all_tensors=True to read "
            "intermediates")

    def _to_model_dtype(self, t, value):
        tensor = self.subgraph.tensors[t]
        program = self._answering
        if program is not None and t in program.layout.codes:
            return value                # the device quantized it (delegate.IoLayout.codes)
        if is_float_view(tensor.dtype, tensor.quantization):
            return quantize(value, tensor.quantization, tensor.dtype)
        return value.astype(tensor.dtype, copy=False)

    def require_value(self, t):
        """Refuses, as LiteRT does ("Tensor data is null", a ValueError), a tensor whose data
        does not exist yet: an output whose shape depends on the data, before an invoke() has
        computed it (its placeholder's shape would be made up)."""
        if self.prepared is not None and t in self.prepared.dynamic and not self.invoked:
            name = self.subgraph.tensors[t].name
            raise NotReadyError(f"tensor {t} ('{name}') has no value yet: its shape depends on "
                                "the input data, known after invoke()")

    def read(self, t):
        """A tensor's current contents in the model's dtype (a fresh array)."""
        name = self.subgraph.tensors[t].name
        if self.subgraph.tensors[t].dtype is None:      # LiteRT: a ValueError too
            raise InputError(f"tensor {t} ('{name}') is a resource handle; it has no data to "
                             "read (READ_VARIABLE's output holds the variable's value)")
        if self.failed is not None and t not in self.subgraph.inputs and not (
                self.prepared is not None and t in self.prepared.constants):
            raise NotReadyError(
                f"tensor {t} ('{name}') has no value: the last invoke() failed ({self.failed}); "
                "fix the inputs and invoke() again")
        self.require_value(t)
        if t in self.io:
            if self._litert_holds_io() and (self.invoked or t in self.subgraph.inputs):
                return self.runtime.litert.read(t, self.subgraph.index)
            return self.io[t].copy()
        if self.options.backend == "litert" and not (
                self.prepared is not None and t in self.prepared.constants):
            return self._read_litert(t, name)
        if t in self.variables:     # the state now, as LiteRT's get_tensor of a variable tensor
            return np.array(self._to_model_dtype(t, self.variables[t]))
        if self.prepared is not None and t in self.prepared.constants:
            return np.array(self._to_model_dtype(t, self.prepared.constants[t]))
        if t in self.values:        # a copy: the caller's array is never the runtime's
            return np.array(self._to_model_dtype(t, self.values[t]))
        if self.invoked and self.schedule is not None:
            raise InterpreterStateError(
                f"tensor {t} ('{name}') lives inside a delegated partition: create the Interpreter "
                "with experimental_preserve_all_tensors=True to read intermediates")
        raise NotReadyError(f"tensor {t} ('{name}') has no value: it is an intermediate and no "
                            "invoke() has computed it")


def cpu_step(runtime=None, state=None):
    """run(step, values): one step on numpy, its inputs from `values`, its outputs into it
    (`state`: the variable tensors a step that updates them overwrites)."""
    def run(step, values: dict) -> None:
        if hasattr(step, "replaces"):       # an island: LiteRT runs its steps
            try:
                step.run(values)
                return
            except InterpreterStateError:
                # LiteRT refused this invoke's data (a GATHER index out of range): its steps
                # on numpy, which names the op and the value (or answers, if LiteRT erred)
                for inner in step.replaces:
                    run(inner, values)
                return
        inputs = [values[t] if t != -1 else None for t in step.op.inputs]
        for t, v in zip(step.op.outputs, graph_mod.run_step(step, inputs, runtime, state)):
            values[t] = v
    return run


def run_schedule(items: list, values: dict, host, device=None, timings: Optional[dict] = None,
                 kernel_timings: Optional[dict] = None) -> dict:
    """The one loop over a schedule: each item a partition that `device` (a
    delegate.DeviceRun) launches, or a step `host(step, values)` runs on numpy, whose inputs
    the device hands back first and whose outputs a later partition reads it takes. `values`
    holds the constants and feeds and receives every result. `timings`: schedule position ->
    seconds, appended per invoke (profile=True: the device waits after each partition, so
    its time is its own); `kernel_timings`: (position, kernel) -> seconds, the device waiting
    after each kernel too."""
    for position, item in enumerate(items):
        start = time.perf_counter() if timings is not None else 0.0
        if device is not None and device.delegated(item):
            kernels = [] if kernel_timings is not None else None
            device.launch(item, kernels)
            for k, seconds in enumerate(kernels or ()):
                kernel_timings.setdefault((position, k), []).append(seconds)
            if timings is not None:
                device.wait_and_take_pending()
        else:
            if device is not None:
                device.before_host(item)
            host(item, values)
            if device is not None:
                device.after_host(item)
        if timings is not None:
            timings.setdefault(position, []).append(time.perf_counter() - start)
    if device is not None:
        device.finish()
    return values


def check_on_host(model, resolved) -> None:
    """Our own prepare of the main graph (and of the subgraphs it calls) for its declared
    shapes, as allocate_tensors() would run it on the reference path: a ModelError where the
    model is inconsistent. LiteRT's kernels do not check what their Prepare is given, so a model
    goes to LiteRT's Prepare (litert_cpu.LiteRTModel.check_kernels) only after this passed."""
    runtime = ModelRuntime(model, resolved, state_of=None)
    SubgraphState(model, model.main, resolved, DelegateOptions(backend="reference"), runtime).allocate()


def planned_schedule(model, resolved, options: DelegateOptions):
    """The main graph's schedule (partition.Schedule) at its declared shapes, as
    allocate_tensors() would build it with `options`, warning nothing and compiling nothing;
    None where the model does not prepare at those shapes (allocate_tensors says why)."""
    from tflite_taichi.partition import build_schedule
    runtime = ModelRuntime(model, resolved, state_of=None)
    state = SubgraphState(model, model.main, resolved, DelegateOptions(backend="reference"), runtime)
    try:
        state.allocate()
    except TfliteTaichiError:
        return None
    return build_schedule(state.prepared, options.max_partitions, fp16=options.fp16, warn=False,
                          preserve_all=options.preserve_all, reference_ops=options.reference_ops,
                          cost_backend=options.cost_backend, backend=options.backend)


def init_subgraphs(model, resolved) -> list:
    """Subgraphs the model's init ops (CALL_ONCE: OpDef.init_subgraph_of) name (valid indices
    only: a bad one fails when run)."""
    found = []
    for (sg, _op), (opdef, options) in resolved.items():
        if opdef.init_subgraph_of is not None:
            index = opdef.init_subgraph_of(options)
            if 0 <= index < len(model.subgraphs) and index != sg and index not in found:
                found.append(index)
    return found
