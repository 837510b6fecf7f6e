"""The delegate's builder and runner: program_builder.build_program builds (plans, kernels,
memory) and hands over a delegate.Program, the runner; the device traffic of an invoke has one
implementation (Program.launch, Program.wait_and_take), which the lean step (a LeanRun,
prepared once) and the executor's schedule loop (a DeviceRun per invoke) both go through; the
executor builds a schedule and its program in one place, for a model's subgraphs and for the
subgraphs IF and WHILE call alike."""
import ast
import os
import warnings

import numpy as np
import pytest

from tflite_taichi import Interpreter
from tflite_taichi.builder import ModelBuilder
from tflite_taichi.delegate import LeanRun, Program

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))


def _interpreter(model: bytes, **kwargs) -> Interpreter:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        it = Interpreter(model_content=model, backend="cpu", **kwargs)
        it.allocate_tensors()
    return it


@pytest.fixture
def traffic(monkeypatch):
    """The Program traffic calls of each invoke, in order."""
    calls = []
    for name in ("launch", "wait_and_take"):
        original = getattr(Program, name)

        def recorded(self, *args, _original=original, _name=name, **kwargs):
            calls.append(_name)
            return _original(self, *args, **kwargs)
        monkeypatch.setattr(Program, name, recorded)
    return calls


def _add_mul(dtype, q) -> bytes:
    """(x + y) * y: one partition of two ops."""
    b = ModelBuilder()
    g = b.subgraph()
    x, y = g.input("x", (1, 4, 3), dtype, q), g.input("y", (1, 4, 3), dtype, q)
    t, out = g.tensor("t", (1, 4, 3), dtype, q), g.tensor("out", (1, 4, 3), dtype, q)
    g.op("ADD", [x, y], [t])
    g.op("MUL", [t, y], [out])
    g.output(out)
    return b.finish()


@pytest.mark.parametrize("dtype, q", [(np.float32, None), (np.int8, (0.05, -3))])
def test_the_lean_step_and_the_schedule_loop_run_the_same_traffic(traffic, dtype, q):
    model = _add_mul(dtype, q)
    lean = _interpreter(model)
    # intermediates read back: the host takes more than the outputs, so no lean step
    general = _interpreter(model, experimental_preserve_all_tensors=True)
    reference = Interpreter(model_content=model, backend="reference")
    reference.allocate_tensors()
    rng = np.random.default_rng(0)
    inputs = [rng.integers(-10, 10, (1, 4, 3)).astype(dtype) for _ in range(2)]
    outputs = []
    for it in (lean, general, reference):
        for d, x in zip(it.get_input_details(), inputs):
            it.set_tensor(d["index"], x)
        traffic.clear()
        it.invoke()
        outputs.append(it.get_output_details()[0]["index"])
        outputs[-1] = it.get_tensor(outputs[-1])
        if it is lean:
            assert isinstance(lean._main.lean_step(), LeanRun)
            assert traffic == ["launch", "wait_and_take"], traffic
        elif it is general:
            assert general._main.lean_step() is None
            assert traffic == ["launch", "wait_and_take"], traffic
    assert lean._main.answered_by == general._main.answered_by == "delegate"
    assert lean._main.program.waits == general._main.program.waits == 1
    np.testing.assert_array_equal(outputs[0], outputs[1])
    np.testing.assert_array_equal(outputs[0], outputs[2])


def _calls_in(path: str, name: str) -> list:
    """The lines of `path` that call a function called `name`."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), filename=path)
    return [node.lineno for node in ast.walk(tree) if isinstance(node, ast.Call)
            and getattr(node.func, "id", getattr(node.func, "attr", None)) == name]


def test_the_executor_builds_a_schedule_and_its_program_in_one_place():
    """DelegatedCall and SubgraphState both go through executor.delegate_subgraph, and nothing
    in the executor makes a Program but through the builder."""
    executor = os.path.join(ROOT, "tflite_taichi", "executor.py")
    assert len(_calls_in(executor, "build_program")) == 1
    assert len(_calls_in(executor, "build_schedule")) == 2      # and planned_schedule's plan
    assert len(_calls_in(executor, "delegate_subgraph")) == 2
    assert not _calls_in(executor, "Program")
