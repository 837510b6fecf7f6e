"""A user's step with the least Python (the microsecond models pay it per step), and the stores it no longer snaps.

- The lean step (Program.lean_step, SubgraphState.lean_step): where the whole invoke is one
  partition (plus CALL_ONCEs that have run), the inputs go straight from the interpreter's arrays
  to the device and the outputs straight back into them. It answers exactly as the general path
  does (which profiling and preserve_all keep), float and int8 (codes at the edges), state
  included, and steps aside wherever the host has work between.
- Ops that only move values (Fusion.moves_values: slices, concatenations, ...) store without
  snapping to the output's grid where every data input is on that grid already; the planner
  keeps the snap where an input has another scale or the op clamps (a fused RELU6).
Measured: bench/results/cpu_taichi_2core.md."""
import warnings

import numpy as np
import pytest

from tflite_taichi import Interpreter
from tflite_taichi.builder import ModelBuilder

from cases.state import ring_buffer_model

Q_A, Q_B = (0.05, -3), (0.07, 5)


def int8_slice_concat(q_second=Q_A, activation="NONE") -> bytes:
    """int8 x [1, 6, 4] (Q_A): a strided slice of its last 4 rows and a concatenation of it with
    a second input (q_second) along rows; then an ADD, so something computes."""
    b = ModelBuilder()
    g = b.subgraph()
    x = g.input("x", (1, 6, 4), np.int8, Q_A)
    y = g.input("y", (1, 2, 4), np.int8, q_second)
    part = g.tensor("part", (1, 4, 4), np.int8, Q_A)
    g.op("STRIDED_SLICE", [x, g.const("b", np.array([0, 2, 0], np.int32)),
                           g.const("e", np.array([1, 6, 4], np.int32)),
                           g.const("s", np.array([1, 1, 1], np.int32))], [part])
    both = g.tensor("both", (1, 6, 4), np.int8, Q_A)
    g.op("CONCATENATION", [part, y], [both], axis=1, fused_activation_function=activation)
    out = g.tensor("out", (1, 6, 4), np.int8, Q_A)
    g.op("ADD", [both, both], [out])
    g.output(out)
    return b.finish()


@pytest.fixture(autouse=True)
def _io_codes(monkeypatch):
    """The model's int8 IO as codes (the default): the lean step's precondition for int8 models
    (with TFLITE_TAICHI_IO_CODES=0 the host dequantizes, and the general path runs)."""
    monkeypatch.delenv("TFLITE_TAICHI_IO_CODES", raising=False)


def _interpreter(model: bytes, **kwargs) -> Interpreter:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        it = Interpreter(model_content=model, backend="cpu", **kwargs)
        it.allocate_tensors()
    return it


def _step(it, inputs) -> list:
    for d, x in zip(it.get_input_details(), inputs):
        it.set_tensor(d["index"], x)
    it.invoke()
    return [it.get_tensor(d["index"]) for d in it.get_output_details()]


def _int8_inputs(seed: int) -> list:
    rng = np.random.default_rng(seed)
    return [rng.integers(-128, 128, (1, 6, 4)).astype(np.int8),
            rng.integers(-128, 128, (1, 2, 4)).astype(np.int8)]


@pytest.mark.parametrize("q_second", [Q_A, Q_B])
def test_the_lean_step_answers_as_the_general_path(q_second):
    model = int8_slice_concat(q_second)
    lean, general = _interpreter(model), _interpreter(model, profile=True)
    reference = Interpreter(model_content=model, backend="reference")
    reference.allocate_tensors()
    for seed in range(3):
        inputs = _int8_inputs(seed)
        ours = _step(lean, inputs)
        assert lean._main.lean_step() is not None and lean._main.answered_by == "delegate"
        assert general._main.lean_step() is None            # profiling times each partition
        np.testing.assert_array_equal(ours[0], _step(general, inputs)[0])
        np.testing.assert_array_equal(ours[0], _step(reference, inputs)[0])


def test_the_lean_step_keeps_the_callers_arrays_apart():
    it = _interpreter(int8_slice_concat())
    inputs = _int8_inputs(0)
    kept = [x.copy() for x in inputs]
    first = _step(it, inputs)[0]
    first_copy = first.copy()
    _step(it, _int8_inputs(1))
    np.testing.assert_array_equal(inputs[0], kept[0])       # inputs are read, never written
    np.testing.assert_array_equal(first, first_copy)        # an output got is the caller's


def test_the_lean_step_waits_for_call_once_and_carries_state():
    """The ring buffer (a variable on the device): CALL_ONCE's first invoke takes the general
    path, every later one the lean step; the outputs follow the reference over the sequence."""
    model = ring_buffer_model(3, 4, (0.1, 0), (0.1, 0), (0.1, 0))
    it = _interpreter(model)
    reference = Interpreter(model_content=model, backend="reference")
    reference.allocate_tensors()
    state = it._main
    assert state.lean_step() is None                        # CALL_ONCE has not run
    rng = np.random.default_rng(0)
    for _ in range(5):
        x = [rng.integers(-128, 128, (1, 1, 4)).astype(np.int8)]
        np.testing.assert_array_equal(_step(it, x)[0], _step(reference, x)[0])
        assert state.lean_step() is not None
    it.allocate_tensors()                                    # a new program: lean again at once
    x = [np.zeros((1, 1, 4), np.int8)]
    np.testing.assert_array_equal(_step(it, x)[0], _step(reference, x)[0])


def test_preserve_all_takes_the_general_path():
    it = _interpreter(int8_slice_concat(), experimental_preserve_all_tensors=True)
    _step(it, _int8_inputs(0))
    assert it._main.lean_step() is None


# -- stores without a snap ----------------------------------------------------------------------
def _plan_refs(model: bytes) -> dict:
    """tensor name -> its TensorRef in the partition's plan."""
    it = _interpreter(model)
    program = it._main.program
    names = {t.index: t.name for t in it._main.subgraph.tensors}
    return {names[t]: ref for c in program.codes for t, ref in c.plan.refs.items() if t in names}


def test_moved_values_on_their_grid_are_stored_without_a_snap():
    refs = _plan_refs(int8_slice_concat())
    assert refs["part"].quant is None and refs["both"].quant is None
    assert refs["out"].quant is not None or refs["out"].codes   # ADD computes: snapped


@pytest.mark.parametrize("q_second, activation", [(Q_B, "NONE"), (Q_A, "RELU6")])
def test_a_moved_value_off_the_grid_is_still_snapped(q_second, activation):
    """A concatenation of another scale requantizes; RELU6's 6 may fall between grid points."""
    refs = _plan_refs(int8_slice_concat(q_second, activation))
    assert refs["part"].quant is None
    assert refs["both"].quant is not None
