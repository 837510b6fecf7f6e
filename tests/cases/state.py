"""Models with state: builder models with resource variables and an init subgraph (an
accumulator, an int8 ring buffer, a variable crossing between device and host every invoke;
shared by test_ops_state.py and test_lean_step.py), and okay_nabu, a streaming int8 wake-word
model with 6 variables (../shared/models): its input sequences, LiteRT's every int8 tensor at
every step, and the check against them (shared by test_ops_state.py and
test_answer_while_compiling.py)."""
import numpy as np
import pytest

from tflite_taichi import Interpreter
from tflite_taichi.builder import RESOURCE, ModelBuilder


# -- models with state (tests/test_ops_state.py, tests/test_lean_step.py) ----------------------
def _init_subgraph(b, name, value, quantization=None):
    """Subgraph 1: VAR_HANDLE(name) <- ASSIGN_VARIABLE(const value)."""
    init = b.subgraph("init")
    h = init.tensor("h", (), RESOURCE)
    init.op("VAR_HANDLE", [], [h], shared_name=name)
    v = init.const("initial", value, quantization=quantization)
    init.op("ASSIGN_VARIABLE", [h, v], [])


def _accumulate(g, x, shape, init_subgraph_index: int) -> int:
    """Main's state ops: CALL_ONCE of the init subgraph, then variable 'acc' <- acc + x; the
    sum's tensor."""
    g.op("CALL_ONCE", [], [], init_subgraph_index=init_subgraph_index)
    h = g.tensor("h", (), RESOURCE)
    g.op("VAR_HANDLE", [], [h], shared_name="acc")
    state = g.tensor("state", shape)
    g.op("READ_VARIABLE", [h], [state])
    total = g.tensor("total", shape)
    g.op("ADD", [state, x], [total])
    g.op("ASSIGN_VARIABLE", [h, total], [])
    return total


def accumulator_model(shape, initial, scale_out=2.0):
    """state <- state + x each invoke (state starts at `initial`); outputs (state + x) * 2.
    float32; READ_VARIABLE, ADD, ASSIGN_VARIABLE and MUL are delegated, CALL_ONCE (and the init
    subgraph's ASSIGN_VARIABLE) stay on the CPU."""
    b = ModelBuilder()
    g = b.subgraph("main")
    x = g.input("x", shape)
    total = _accumulate(g, x, shape, init_subgraph_index=1)
    out = g.tensor("out", shape)
    g.op("MUL", [total, g.const("k", np.float32(scale_out))], [out])
    g.output(out)
    _init_subgraph(b, "acc", initial)
    return b.finish()


def ring_buffer_model(rows, cols, q_in, q_init, q_read):
    """okay_nabu's streaming pattern, int8: window = concat(state, x) along rows; the state
    keeps the last `rows` rows; outputs the window. The variable is first written by the init
    subgraph under q_init, then by main under q_in, and read under q_read, so the test pins
    LiteRT's semantics: a variable holds integers, READ_VARIABLE reinterprets them under its
    output's scale (a QUANTIZE then requantizes them to the window's scale, as CONCATENATION
    needs equal scales)."""
    b = ModelBuilder()
    g = b.subgraph("main")
    x = g.input("x", (1, 1, cols), np.int8, q_in)
    g.op("CALL_ONCE", [], [], init_subgraph_index=1)
    h = g.tensor("h", (), RESOURCE)
    g.op("VAR_HANDLE", [], [h], shared_name="ring")
    state = g.tensor("state", (1, rows, cols), np.int8, q_read)
    g.op("READ_VARIABLE", [h], [state])
    state_in = g.tensor("state_in", (1, rows, cols), np.int8, q_in)
    g.op("QUANTIZE", [state], [state_in])
    window = g.tensor("window", (1, rows + 1, cols), np.int8, q_in)
    g.op("CONCATENATION", [state_in, x], [window], axis=1)
    keep = g.tensor("keep", (1, rows, cols), np.int8, q_in)
    g.op("STRIDED_SLICE", [window, g.const("begin", np.array([0, 1, 0], np.int32)),
                           g.const("end", np.array([1, rows + 1, cols], np.int32)),
                           g.const("strides", np.array([1, 1, 1], np.int32))], [keep])
    g.op("ASSIGN_VARIABLE", [h, keep], [])
    g.output(window)
    initial = np.arange(rows * cols).reshape(1, rows, cols) % 200 - 100
    _init_subgraph(b, "ring", initial.astype(np.int8), q_init)
    return b.finish()


def crossing_model(shape, initial):
    """The variable crosses between the device and the host every invoke: main's partition
    reads it, adds x and assigns the sum (the device holds the newest value); then an IF on
    the host (its branches run on the reference path): `then` reads the variable (the host
    needs the device's value) and outputs it doubled; `else` assigns 100 + x (the host writes:
    the next invoke's partition must take that value to the device) and outputs x."""
    b = ModelBuilder()
    g = b.subgraph("main")
    c = g.input("c", (), np.bool_)
    x = g.input("x", shape)
    total = _accumulate(g, x, shape, init_subgraph_index=3)
    out = g.tensor("out", shape)
    g.op("IF", [c, x], [out], then_subgraph_index=1, else_subgraph_index=2)
    g.output(total, out)

    then = b.subgraph("then")
    tx = then.input("x", shape)
    th = then.tensor("h", (), RESOURCE)
    then.op("VAR_HANDLE", [], [th], shared_name="acc")
    tv = then.tensor("v", shape)
    then.op("READ_VARIABLE", [th], [tv])
    ty = then.tensor("y", shape)
    then.op("MUL", [tv, then.const("two", np.float32(2))], [ty])
    then.output(ty)
    del tx

    other = b.subgraph("else")
    ex = other.input("x", shape)
    eh = other.tensor("h", (), RESOURCE)
    other.op("VAR_HANDLE", [], [eh], shared_name="acc")
    ev = other.tensor("v", shape)
    other.op("ADD", [ex, other.const("hundred", np.float32(100))], [ev])
    other.op("ASSIGN_VARIABLE", [eh, ev], [])
    ey = other.tensor("y", shape)
    other.op("MUL", [ex, other.const("one", np.float32(1))], [ey])
    other.output(ey)
    _init_subgraph(b, "acc", initial)
    return b.finish()


# -- okay_nabu ---------------------------------------------------------------------------------
def nabu_sequence(steps=10, seed=0):
    rng = np.random.default_rng(seed)
    return [[rng.integers(-128, 128, (1, 3, 40)).astype(np.int8)] for _ in range(steps)]


def litert_nabu_tensors(path, sequence):
    """Every int8 tensor an op writes, at every step, from LiteRT (experimental_preserve_all_tensors
    keeps intermediates readable)."""
    int8 = [t for op in Interpreter(model_path=path, backend="reference").model.main.operators
            for t in op.outputs]
    from ai_edge_litert import interpreter as litert
    with pytest.warns(UserWarning, match="preserve_all_tensors"):
        lite = litert.Interpreter(model_path=path, experimental_preserve_all_tensors=True)
    lite.allocate_tensors()
    int8 = [t for t in int8 if lite.get_tensor_details()[t]["dtype"] == np.int8]
    steps = []
    for inputs in sequence:
        lite.set_tensor(lite.get_input_details()[0]["index"], inputs[0])
        lite.invoke()
        steps.append({t: lite.get_tensor(t) for t in int8})
    return steps


def check_nabu_steps(ours_by_step, litert_by_step, what):
    """The output alone is 0 on any noise input (no wake word), so every int8 tensor is held
    to 3 units at every step: the FC logits, the state windows, the convolutions."""
    compared = 0
    for step, (ours, theirs) in enumerate(zip(ours_by_step, litert_by_step)):
        for t, e in theirs.items():
            if t in ours:
                diff = np.abs(ours[t].astype(int) - e.astype(int))
                assert diff.max() <= 3, f"{what} step {step}: tensor {t} differs by {diff.max()} units"
                compared += 1
    assert compared >= 10 * 40, compared
