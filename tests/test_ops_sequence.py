"""LSTM (builtin: the FULL kernel and the 5-input BASIC cell) and UNIDIRECTIONAL_SEQUENCE_LSTM
vs LiteRT's reference kernels through one-op float32 models: CIFG or not, peepholes, projection
with and without bias, layer norm, the 20- and 24-input forms, cell activations, cell_clip and
proj_clip; for the sequence op also time_major, the sequence length and
diagonal_recurrent_tensors. Tolerance: tflite_taichi.testing (1e-5 of the largest magnitude).

LiteRT requires output_state and cell_state to be variable tensors: zero at allocation, then
updated by each invoke. Our runtime does not keep variable tensors yet (see ops/sequence.py), so
each comparison runs LiteRT on the model with variable state and ours on its twin whose states
are ordinary tensors holding the state LiteRT started that invoke from: zero constants for the
first invoke, inputs fed with the state for the second (and our own new states are compared
with LiteRT's). The tests of state kept across invokes by our Interpreter itself are strict expected failures until the
runtime keeps variable tensors (`_runtime_keeps_variable_tensors`).

int8/hybrid: LiteRT's integer LSTMs compute in 16-bit fixed point with scales from intermediate
tensors, and its hybrid ones quantize the input at run time, so the float view is not held to
them here (tests/test_quant_dynamic.py bounds the hybrid LSTM's first step).
"""
import numpy as np
import pytest
from hypothesis import assume, given, strategies as st

from tflite_taichi import graph, model as model_ir
from tflite_taichi.builder import ModelBuilder
from tflite_taichi.errors import ModelError
from tflite_taichi.ops.sequence import lstm_step
from tflite_taichi.testing import (assert_float_close, check_against_litert, run_ours,
                                   strategies)

S = strategies()
GATES = ("i", "f", "c", "o")
ACTIVATIONS = ["TANH", "RELU", "RELU6", "RELU_N1_TO_1", "SIGN_BIT"]
SEQ = "UNIDIRECTIONAL_SEQUENCE_LSTM"
# Float32 rounding of the gate sums (terms of magnitude ~1, carried over up to 20 time steps) is
# a few ulps of 1 (1e-7 to 5e-7) absolute, so an output whose every element cancels to far below
# 1 cannot be held to 1e-5 of itself (seen: 9.9e-9 off on a RELU-cell output of at most 6.9e-4,
# and 1.4e-7 on one of 0.0133; ours bit-identical to the code before this module's sequence op,
# both within float32 rounding of the float64 equations): outputs are held to 1e-5 of
# max(their largest magnitude, OUTPUT_FLOOR), i.e. at least 5e-7 absolute.
OUTPUT_FLOOR = 0.05
# Likewise layer norm divides a gate's sums by their standard deviation over the cells: sums
# nearly equal across the cells (seen: 2 cells) amplify that rounding by 1/std (seen: ours and
# LiteRT each 8.9e-6 from the float64 equations, 1.8e-5 apart, on an output of 0.53).
MIN_LAYER_NORM_STD = 1e-2


def _ill_conditioned(expected, case, x, h, c) -> bool:
    """Whether float32 cannot hold this draw to 1e-5 (see the constants above)."""
    if case["layer_norm"]:
        stds, args = [], [np.asarray(a, np.float64) for a in (x, h, c)]
        (numpy_sequence if case.get("op", "LSTM") == SEQ else numpy_lstm)(case, *args, stds=stds)
        return min(stds) < MIN_LAYER_NORM_STD
    return False


def assert_lstm_close(actual, expected, case, x, h, c, what="output"):
    """assert_float_close, except that a draw float32 cannot hold to 1e-5 (_ill_conditioned)
    and that misses is skipped (assume) rather than failed; small outputs are held to the
    gate sums' rounding (OUTPUT_FLOOR)."""
    try:
        assert_float_close(actual, expected, what=what, floor=OUTPUT_FLOOR)
    except AssertionError:
        assume(not _ill_conditioned(expected, case, x, h, c))
        raise


def _clip():
    return st.one_of(st.just(0.0), st.floats(0.05, 3.0).map(lambda v: float(np.float32(v))))


@st.composite
def lstm_case(draw, layer_norm=None, activations=ACTIVATIONS):
    """An LSTM's structure and options; the weights come from `seed` (see `lstm_weights`)."""
    projection = draw(st.booleans())
    n_cell = draw(st.integers(1, 6))
    case = dict(
        n_batch=draw(st.integers(1, 3)), n_input=draw(st.integers(1, 6)), n_cell=n_cell,
        n_output=draw(st.integers(1, 6)) if projection else n_cell,
        cifg=draw(st.booleans()), peephole=draw(st.booleans()), projection=projection,
        projection_bias=projection and draw(st.booleans()),
        layer_norm=draw(st.booleans()) if layer_norm is None else layer_norm,
        act=draw(st.sampled_from(activations)), cell_clip=draw(_clip()), proj_clip=draw(_clip()),
        seed=draw(S.seeds()))
    case["n_inputs"] = 24 if case["layer_norm"] else draw(st.sampled_from([20, 24]))
    return case


@st.composite
def sequence_case(draw, layer_norm=None, activations=ACTIVATIONS, max_time=4):
    """An UNIDIRECTIONAL_SEQUENCE_LSTM case: lstm_case's structure over 1 to `max_time` steps,
    time-major or not, with diagonal recurrent weights or not (then n_output = n_cell)."""
    case = draw(lstm_case(layer_norm, activations))
    diagonal = draw(st.booleans())
    if diagonal:
        case["n_output"] = case["n_cell"]
    case.update(op=SEQ, n_time=draw(st.integers(1, max_time)), time_major=draw(st.booleans()),
                diagonal=diagonal)
    return case


def x_shape(case) -> tuple:
    B, I = case["n_batch"], case["n_input"]
    if case.get("op", "LSTM") != SEQ:
        return (B, I)
    T = case["n_time"]
    return (T, B, I) if case["time_major"] else (B, T, I)


def y_shape(case) -> tuple:
    return x_shape(case)[:-1] + (case["n_output"],)


def lstm_weights(case) -> dict:
    """Name -> float32 array for every tensor the case has (None for an omitted one)."""
    rng = np.random.default_rng(case["seed"])
    C, I, O = case["n_cell"], case["n_input"], case["n_output"]
    u = lambda *shape: rng.uniform(-1, 1, shape).astype(np.float32)   # noqa: E731
    w = {}
    for g in GATES:
        off = case["cifg"] and g == "i"
        w["w_" + g] = None if off else u(C, I)
        w["r_" + g] = None if off else (u(C) if case.get("diagonal") else u(C, O))
        w["b_" + g] = None if off else u(C)
        w["p_" + g] = u(C) if case["peephole"] and g != "c" and not off else None
        w["ln_" + g] = u(C) + np.float32(1) if case["layer_norm"] and not off else None
    w["proj"] = u(O, C) if case["projection"] else None
    w["proj_b"] = u(O) if case["projection_bias"] else None
    return w


def lstm_model(case, state="variable", x_q=None, out_q=None, state_q=(None, None),
               weight_q=None, options=None) -> bytes:
    """A one-op LSTM (or, with case["op"], UNIDIRECTIONAL_SEQUENCE_LSTM) model. state:
    'variable' (as LiteRT requires), 'zero' (constant zeros) or 'input' (model inputs after x:
    output_state, then cell_state). x_q, out_q, state_q: int8 quantization of the input, output
    and states; weight_q: int8 weights with that scale; options: op options overriding the
    case's."""
    from tflite_taichi.testing import quantize_array
    w = lstm_weights(case)
    B, C, O = case["n_batch"], case["n_cell"], case["n_output"]
    b = ModelBuilder()
    g = b.subgraph()
    dtype = lambda q: np.float32 if q is None else np.int8   # noqa: E731
    x = g.input("x", x_shape(case), dtype(x_q), x_q)

    def const(name):
        if w[name] is None:
            return -1
        if weight_q is not None and not name.startswith(("b_", "proj_b")):
            return g.const(name, quantize_array(w[name], (weight_q, 0)), quantization=(weight_q, 0))
        return g.const(name, w[name])

    ins = [x] + [const("w_" + k) for k in GATES] + [const("r_" + k) for k in GATES]
    ins += [const("p_" + k) for k in ("i", "f", "o")] + [const("b_" + k) for k in GATES]
    ins += [const("proj"), const("proj_b")]
    for name, shape, q in (("output_state", (B, O), state_q[0]),
                           ("cell_state", (B, C), state_q[1])):
        if state == "variable":
            ins.append(g.tensor(name, shape, is_variable=True))
        elif state == "zero":
            ins.append(g.const(name, np.zeros(shape, np.float32)))
        else:
            ins.append(g.input(name, shape, dtype(q), q))
    if case["n_inputs"] == 24:
        ins += [const("ln_" + k) for k in GATES]
    y = g.tensor("y", y_shape(case), dtype(out_q), out_q)
    options_override = options
    options = dict(fused_activation_function=case["act"], cell_clip=case["cell_clip"],
                   proj_clip=case["proj_clip"])
    if case.get("op", "LSTM") == SEQ:
        options.update(time_major=case["time_major"], diagonal_recurrent_tensors=case["diagonal"])
    g.op(case.get("op", "LSTM"), ins, [y], **{**options, **(options_override or {})})
    g.output(y)
    return b.finish()


def litert_steps(model: bytes, xs) -> list:
    """LiteRT's reference kernels over consecutive invokes: per invoke (output, output_state,
    cell_state) as they are after it."""
    from ai_edge_litert.interpreter import Interpreter, OpResolverType
    it = Interpreter(model_content=model, experimental_op_resolver_type=OpResolverType.BUILTIN_REF)
    it.allocate_tensors()
    index = {d["name"]: d["index"] for d in it.get_tensor_details()}
    out = []
    for x in xs:
        it.set_tensor(it.get_input_details()[0]["index"], x)
        it.invoke()
        out.append(tuple(it.get_tensor(index[n]) for n in ("y", "output_state", "cell_state")))
    return out


def our_step(model: bytes, feeds) -> tuple:
    """The op's full step (output, new output_state, new cell_state) on the model's inputs."""
    m = model_ir.read_model(model)
    prepared = graph.prepare(m.main, graph.resolve_ops(m), {})
    (step,) = prepared.steps
    values = {**prepared.constants, **dict(zip(m.main.inputs, feeds))}
    return lstm_step(step.node, [values[t] if t != -1 else None for t in step.op.inputs])


def _zero_state(case):
    return [np.zeros((case["n_batch"], n), np.float32) for n in (case["n_output"], case["n_cell"])]


def _x(case, seed):
    return np.random.default_rng(seed).uniform(-2, 2, x_shape(case)).astype(np.float32)


# -- against LiteRT ------------------------------------------------------------------------
@given(case=lstm_case(), seed=S.seeds())
def test_first_invoke_matches_litert(case, seed):
    x = _x(case, seed)
    (expected, *_), = litert_steps(lstm_model(case, "variable"), [x])
    actual = run_ours(lstm_model(case, "zero"), [x])[0]
    assert_lstm_close(actual, expected, case, x, *_zero_state(case))


@given(case=lstm_case(), seed=S.seeds())
def test_second_invoke_matches_litert(case, seed):
    # From a non-zero state: LiteRT's state after its first invoke feeds our second step, and
    # our new states must be LiteRT's after its second.
    x1, x2 = _x(case, seed), _x(case, seed + 1)
    (_, h1, c1), (y2, h2, c2) = litert_steps(lstm_model(case, "variable"), [x1, x2])
    twin = lstm_model(case, "input")
    conditioning = (case, x2, h1, c1)
    assert_lstm_close(run_ours(twin, [x2, h1, c1])[0], y2, *conditioning)
    out, h, c = our_step(twin, [x2, h1, c1])
    assert_lstm_close(out, y2, *conditioning)
    assert_lstm_close(h, h2, *conditioning, what="output_state")
    assert_lstm_close(c, c2, *conditioning, what="cell_state")


@pytest.mark.parametrize("cifg, peephole, projection", [
    (False, False, False), (True, False, False), (False, True, False), (False, False, True),
    (True, True, True)])
def test_named_variants_match_litert(cifg, peephole, projection):
    case = dict(n_batch=2, n_input=5, n_cell=4, n_output=3 if projection else 4, cifg=cifg,
                peephole=peephole, projection=projection, projection_bias=projection,
                layer_norm=False, act="TANH", cell_clip=0.0, proj_clip=0.0, seed=7, n_inputs=20)
    xs = [_x(case, 1), _x(case, 2), _x(case, 3)]
    steps = litert_steps(lstm_model(case, "variable"), xs)
    assert_float_close(run_ours(lstm_model(case, "zero"), [xs[0]])[0], steps[0][0])
    twin = lstm_model(case, "input")
    for k in (1, 2):
        _, h, c = steps[k - 1]
        assert_float_close(run_ours(twin, [xs[k], h, c])[0], steps[k][0], what=f"invoke {k + 1}")


BASE_SEQUENCE = dict(n_batch=2, n_input=3, n_cell=4, n_output=4, cifg=False, peephole=True,
                     projection=False, projection_bias=False, layer_norm=False, act="TANH",
                     cell_clip=0.0, proj_clip=0.0, seed=3, n_inputs=20, op=SEQ, n_time=3,
                     time_major=False, diagonal=False)


@given(case=sequence_case(), seed=S.seeds())
def test_sequence_first_invoke_matches_litert(case, seed):
    x = _x(case, seed)
    (expected, h, c), = litert_steps(lstm_model(case, "variable"), [x])
    zeros = _zero_state(case)
    conditioning = (case, x, *zeros)
    assert_lstm_close(run_ours(lstm_model(case, "zero"), [x])[0], expected, *conditioning)
    out, h_ours, c_ours = our_step(lstm_model(case, "input"), [x] + zeros)
    assert_lstm_close(out, expected, *conditioning)
    assert_lstm_close(h_ours, h, *conditioning, what="output_state")
    assert_lstm_close(c_ours, c, *conditioning, what="cell_state")


@given(case=sequence_case(), seed=S.seeds())
def test_sequence_second_invoke_matches_litert(case, seed):
    # the state after LiteRT's first invoke feeds our second; our new states must be LiteRT's
    x1, x2 = _x(case, seed), _x(case, seed + 1)
    (_, h1, c1), (y2, h2, c2) = litert_steps(lstm_model(case, "variable"), [x1, x2])
    twin = lstm_model(case, "input")
    conditioning = (case, x2, h1, c1)
    assert_lstm_close(run_ours(twin, [x2, h1, c1])[0], y2, *conditioning)
    out, h, c = our_step(twin, [x2, h1, c1])
    assert_lstm_close(out, y2, *conditioning)
    assert_lstm_close(h, h2, *conditioning, what="output_state")
    assert_lstm_close(c, c2, *conditioning, what="cell_state")


@pytest.mark.parametrize("time_major, diagonal, layer_norm, projection", [
    (True, False, False, False), (False, False, False, True), (True, True, True, False),
    (False, True, False, True), (True, False, True, True)])
def test_sequence_named_variants_over_invokes_match_litert(time_major, diagonal, layer_norm,
                                                           projection):
    """Three invokes, each of ours starting from the state our previous one returned."""
    case = dict(BASE_SEQUENCE, time_major=time_major, diagonal=diagonal, layer_norm=layer_norm,
                n_inputs=24 if layer_norm else 20, projection=projection,
                projection_bias=projection, n_output=4 if diagonal or not projection else 3,
                n_time=4, cell_clip=0.8 if diagonal else 0.0, proj_clip=0.5 if projection else 0.0)
    xs = [_x(case, k) for k in range(3)]
    steps = litert_steps(lstm_model(case, "variable"), xs)
    twin = lstm_model(case, "input")
    h, c = (np.zeros((2, n), np.float32) for n in (case["n_output"], case["n_cell"]))
    for k, (y, h_lite, c_lite) in enumerate(steps):
        out, h, c = our_step(twin, [xs[k], h, c])
        assert_float_close(out, y, what=f"invoke {k + 1}")
        assert_float_close(h, h_lite, what=f"output_state after invoke {k + 1}")
        assert_float_close(c, c_lite, what=f"cell_state after invoke {k + 1}")


@given(case=sequence_case(activations=["TANH", "NONE"]), seed=S.seeds())
def test_sequence_reference_matches_the_plain_equations(case, seed):
    """From a non-zero state, activation NONE included (the identity here; see below)."""
    rng = np.random.default_rng(seed)
    x = _x(case, seed)
    h, c = (rng.uniform(-1, 1, (case["n_batch"], n)).astype(np.float32)
            for n in (case["n_output"], case["n_cell"]))
    out, h_ours, c_ours = our_step(lstm_model(case, "input"), [x, h, c])
    y, h_np, c_np = numpy_sequence(case, *(a.astype(np.float64) for a in (x, h, c)))
    conditioning = (case, x, h, c)
    assert_lstm_close(out, y.astype(np.float32), *conditioning)
    assert_lstm_close(h_ours, h_np.astype(np.float32), *conditioning, what="output_state")
    assert_lstm_close(c_ours, c_np.astype(np.float32), *conditioning, what="cell_state")


def _runtime_keeps_variable_tensors() -> bool:
    """Whether our Interpreter accepts an op reading a variable tensor (state kept across
    invokes, like LiteRT)."""
    from tflite_taichi.interpreter import Interpreter
    case = dict(BASE_SEQUENCE, op="LSTM")
    it = Interpreter(model_content=lstm_model(case, "variable"), backend="reference")
    try:
        it.allocate_tensors()
    except ModelError as e:
        if "variable tensor" in str(e) and "not supported yet" in str(e):
            return False
        raise
    return True


def test_variable_state_lstm_stays_on_the_cpu_under_the_delegate(taichi_workers):
    """An op that overwrites variable tensors runs on the CPU (the delegate's partitions hold
    no state across invokes), with the reason in the warning; the answer is the reference's."""
    from tflite_taichi.testing import check_delegate
    for op in ("LSTM", SEQ):
        case = dict(BASE_SEQUENCE, op=op)
        summaries = check_delegate(lstm_model(case, "variable"), taichi_workers, [_x(case, 0)],
                                   expect_all_delegated=False)
        for backend, summary in summaries.items():
            reasons = [row["reason"] for row in summary["fallback"]]
            assert any("overwrites variable tensors" in r for r in reasons), (backend, reasons)


@pytest.mark.parametrize("op", ["LSTM", SEQ])
def test_state_persists_across_invokes(op):
    """Our Interpreter on the model with variable state, four invokes and a reset, against
    LiteRT's (ops/sequence.py, STATE_INPUTS)."""
    from ai_edge_litert.interpreter import Interpreter as LiteRT, OpResolverType
    from tflite_taichi.interpreter import Interpreter
    from tflite_taichi.testing import run_sequence
    case = dict(BASE_SEQUENCE, op=op, projection=True, projection_bias=True, n_output=3)
    model = lstm_model(case, "variable")
    xs = [[_x(case, k)] for k in range(4)]
    ours, theirs = Interpreter(model_content=model, backend="reference"), LiteRT(
        model_content=model, experimental_op_resolver_type=OpResolverType.BUILTIN_REF)
    for it in (ours, theirs):
        it.allocate_tensors()
    for k, (a, e) in enumerate(zip(run_sequence(ours, xs), run_sequence(theirs, xs))):
        assert_float_close(a[0], e[0], what=f"invoke {k + 1}")
        for d in theirs.get_tensor_details():      # the state tensors themselves, as LiteRT's
            if "state" in d["name"]:
                assert_float_close(ours.get_tensor(d["index"]), theirs.get_tensor(d["index"]),
                                   what=f"'{d['name']}' after invoke {k + 1}")
    for it in (ours, theirs):
        it.reset_all_variables()
    a, e = run_sequence(ours, xs[:1]), run_sequence(theirs, xs[:1])
    assert_float_close(a[0][0], e[0][0], what="after reset_all_variables")


# -- activation NONE: the identity here, not what LiteRT computes ---------------------------
def numpy_lstm(case, x, h, c, none_output="identity", return_state=False, stds=None):
    """A plain transcription of the LSTM equations (independent of ops/sequence.py), one step.
    none_output='cell_gate': LiteRT's h' = o * g under activation NONE. `stds`: a list that
    collects the layer norm's standard deviations."""
    w = lstm_weights(case)
    sig = lambda v: 1 / (1 + np.exp(-v))   # noqa: E731
    act = {"NONE": lambda v: v, "TANH": np.tanh, "RELU": lambda v: np.maximum(v, 0),
           "RELU6": lambda v: np.clip(v, 0, 6), "RELU_N1_TO_1": lambda v: np.clip(v, -1, 1),
           "SIGN_BIT": lambda v: np.signbit(v).astype(v.dtype)}[case["act"]]

    def pre(k, cell):
        r = w["r_" + k]
        v = x @ w["w_" + k].T + (h * r if r.ndim == 1 else h @ r.T)
        if w["p_" + k] is not None:
            v = v + w["p_" + k] * cell
        if w["ln_" + k] is not None:
            if stds is not None:
                stds.append(float(np.sqrt(v.var(1)).min()))
            v = (v - v.mean(1, keepdims=True)) / np.sqrt(v.var(1, keepdims=True) + 1e-8)
            v = v * w["ln_" + k]
        return v + w["b_" + k]

    f = sig(pre("f", c))
    i = 1 - f if case["cifg"] else sig(pre("i", c))
    g = act(pre("c", None))
    c2 = f * c + i * g
    if case["cell_clip"] > 0:
        c2 = np.clip(c2, -case["cell_clip"], case["cell_clip"])
    o = sig(pre("o", c2))
    h2 = o * (g if none_output == "cell_gate" else act(c2))
    if case["projection"]:
        h2 = h2 @ w["proj"].T + (w["proj_b"] if w["proj_b"] is not None else 0)
        if case["proj_clip"] > 0:
            h2 = np.clip(h2, -case["proj_clip"], case["proj_clip"])
    if return_state:
        return h2, c2
    return h2.astype(np.float32)


def numpy_sequence(case, x, h, c, stds=None):
    """numpy_lstm over the time steps of an UNIDIRECTIONAL_SEQUENCE_LSTM input, in float64:
    (output, last h, last c)."""
    xs = x if case["time_major"] else np.swapaxes(x, 0, 1)
    outs = []
    for t in range(case["n_time"]):
        h, c = numpy_lstm(case, xs[t], h, c, return_state=True, stds=stds)
        outs.append(h)
    y = np.stack(outs)
    return (y if case["time_major"] else np.swapaxes(y, 0, 1)), h, c


@given(case=lstm_case(activations=["NONE"]), seed=S.seeds())
def test_activation_none_is_the_identity(case, seed):
    x = _x(case, seed)
    B = case["n_batch"]
    h0, c0 = np.zeros((B, case["n_output"])), np.zeros((B, case["n_cell"]))
    actual = run_ours(lstm_model(case, "zero"), [x])[0]
    # the module's comparison (a new draw, seed 533027892, had two layer-normed cells nearly
    # equal: 2.5e-6 off an output of 0.083, the 1/std amplification MIN_LAYER_NORM_STD describes)
    assert_lstm_close(actual, numpy_lstm(case, x.astype(np.float64), h0, c0), case, x, h0, c0)


def test_litert_activation_none_multiplies_by_the_cell_gate():
    # Documents the oracle's behaviour that we do not follow (ops/sequence.py): LiteRT's
    # ApplyActivationToVector writes nothing for NONE, leaving the cell gate in the buffer.
    case = dict(n_batch=2, n_input=3, n_cell=4, n_output=4, cifg=False, peephole=True,
                projection=False, projection_bias=False, layer_norm=False, act="NONE",
                cell_clip=0.0, proj_clip=0.0, seed=11, n_inputs=20)
    x = _x(case, 5)
    (litert, *_), = litert_steps(lstm_model(case, "variable"), [x])
    zeros = np.zeros((2, 4))
    assert_float_close(litert, numpy_lstm(case, x.astype(np.float64), zeros, zeros, "cell_gate"))
    assert not np.allclose(litert, numpy_lstm(case, x.astype(np.float64), zeros, zeros))


def test_reference_matches_the_plain_equations_with_state():
    case = dict(n_batch=3, n_input=4, n_cell=5, n_output=2, cifg=False, peephole=True,
                projection=True, projection_bias=True, layer_norm=True, act="TANH",
                cell_clip=0.7, proj_clip=0.4, seed=2, n_inputs=24)
    rng = np.random.default_rng(0)
    x, h, c = (rng.uniform(-1, 1, s).astype(np.float32) for s in ((3, 4), (3, 2), (3, 5)))
    out = run_ours(lstm_model(case, "input"), [x, h, c])[0]
    assert_float_close(out, numpy_lstm(case, *(a.astype(np.float64) for a in (x, h, c))))


# -- LSTM, kernel_type BASIC ----------------------------------------------------------------
def basic_model(B, I, O, seed, act="TANH", cell_clip=0.0, proj_clip=0.0, dtype=np.float32,
                n_outputs=4, weights_shape=None):
    """A one-op BASIC LSTM: inputs x, prev_activation, prev_state; constant weights, biases."""
    rng = np.random.default_rng(seed)
    b = ModelBuilder()
    g = b.subgraph()
    x, h = g.input("x", (B, I), dtype), g.input("prev_activation", (B, O))
    w = g.const("weights", rng.uniform(-1, 1, weights_shape or (4 * O, I + O)).astype(np.float32))
    bias = g.const("biases", rng.uniform(-1, 1, 4 * O).astype(np.float32))
    c = g.input("prev_state", (B, O))
    outs = [g.tensor(name, shape) for name, shape in
            (("activation", (B, O)), ("state", (B, O)), ("concat_temp", (B, I + O)),
             ("activation_temp", (B, 4 * O)))][:n_outputs]
    g.op("LSTM", [x, h, w, bias, c], outs, version=2, kernel_type="BASIC",
         fused_activation_function=act, cell_clip=cell_clip, proj_clip=proj_clip)
    g.output(*outs)
    return b.finish()


def basic_inputs(B, I, O, seed):
    rng = np.random.default_rng(seed)
    return [rng.uniform(-2, 2, shape).astype(np.float32) for shape in ((B, I), (B, O), (B, O))]


@given(B=st.integers(1, 3), I=st.integers(1, 6), O=st.integers(1, 6),
       act=st.sampled_from(ACTIVATIONS + ["NONE"]), cell_clip=_clip(), proj_clip=_clip(),
       seed=S.seeds())
def test_basic_matches_litert(B, I, O, act, cell_clip, proj_clip, seed):
    """All four outputs. LiteRT's float BASIC kernel ignores the activation and the clips
    (always tanh, never clipped), and so do we. Scale floor 1: the new state is f*c + i*g with
    c in [-2, 2] and gates in [0, 1], and the output o*tanh(state); both can cancel to far below
    their terms (seen: a 0.00174 output of B=1, O=1 off by 2.1e-8, 1e-8 of its terms), and
    float32 rounds relative to the terms."""
    check_against_litert(basic_model(B, I, O, seed, act, cell_clip, proj_clip),
                         basic_inputs(B, I, O, seed + 1), floor=1.0)


def test_basic_matches_the_plain_equations():
    B, I, O = 2, 3, 4
    x, h, c = basic_inputs(B, I, O, 1)
    act_h, state, concat, activ = run_ours(basic_model(B, I, O, 0), [x, h, c])
    rng = np.random.default_rng(0)
    w = rng.uniform(-1, 1, (4 * O, I + O)).astype(np.float32)
    bias = rng.uniform(-1, 1, 4 * O).astype(np.float32)
    z = np.concatenate([x, h], 1).astype(np.float64) @ w.T + bias
    sig = lambda v: 1 / (1 + np.exp(-v))   # noqa: E731
    s2 = sig(z[:, :O]) * np.tanh(z[:, O:2 * O]) + sig(z[:, 2 * O:3 * O]) * c
    assert_float_close(concat, np.concatenate([x, h], 1))
    assert_float_close(activ, z.astype(np.float32))
    assert_float_close(state, s2.astype(np.float32))
    assert_float_close(act_h, (sig(z[:, 3 * O:]) * np.tanh(s2)).astype(np.float32))


def test_basic_bad_models():
    inputs = basic_inputs(2, 3, 4, 0)
    with pytest.raises(ModelError, match="LSTM.*weights must have shape"):
        run_ours(basic_model(2, 3, 4, 0, weights_shape=(16, 6)), inputs)
    with pytest.raises(ModelError, match="LSTM.*4 outputs"):
        run_ours(basic_model(2, 3, 4, 0, n_outputs=2), inputs)
    with pytest.raises(ModelError, match="LSTM.*float32 only"):
        run_ours(basic_model(2, 3, 4, 0, dtype=np.int32), [inputs[0].astype(np.int32)] + inputs[1:])


def test_basic_kernel_type_with_the_full_inputs_is_refused():
    _refused(_raw_model(None, options={"kernel_type": "BASIC"}), "BASIC.*5 inputs")


# -- invalid models --------------------------------------------------------------------------
BASE = dict(n_batch=2, n_input=3, n_cell=4, n_output=4, cifg=False, peephole=True,
            projection=False, projection_bias=False, layer_norm=False, act="TANH",
            cell_clip=0.0, proj_clip=0.0, seed=1, n_inputs=24)


def _raw_model(inputs_fn, n_inputs=24, options=None, input_shape=(2, 3)):
    """An LSTM model from BASE's tensors with `inputs_fn(index list)` editing the inputs."""
    b = ModelBuilder()
    g = b.subgraph()
    w = lstm_weights(BASE)
    x = g.input("x", input_shape)
    c = lambda n: g.const(n, w[n]) if w[n] is not None else -1   # noqa: E731
    ins = [x] + [c("w_" + k) for k in GATES] + [c("r_" + k) for k in GATES]
    ins += [c("p_" + k) for k in ("i", "f", "o")] + [c("b_" + k) for k in GATES] + [-1, -1]
    ins += [g.input("output_state", (2, 4)), g.input("cell_state", (2, 4))] + [-1] * 4
    ins = inputs_fn(g, ins)[:n_inputs] if inputs_fn else ins[:n_inputs]
    y = g.tensor("y", (2, 4))
    g.op("LSTM", ins, [y], **{"fused_activation_function": "TANH", **(options or {})})
    g.output(y)
    return b.finish()


def _refused(model, match):
    with pytest.raises(ModelError, match="LSTM.*" + match):
        run_ours(model, [np.zeros((2, 3), np.float32), np.zeros((2, 4), np.float32),
                         np.zeros((2, 4), np.float32)])


def _set(i, value_fn):
    def edit(g, ins):
        ins = list(ins)
        ins[i] = value_fn(g)
        return ins
    return edit


@pytest.mark.parametrize("n", [21, 23])
def test_input_count_other_than_20_or_24_is_refused(n):
    def pad(g, ins):
        return ins + [-1] * 4
    _refused(_raw_model(pad, n_inputs=n), "20 or 24 inputs")


def test_half_cifg_is_refused():
    _refused(_raw_model(_set(1, lambda g: -1)), "CIFG")


def test_partial_peepholes_are_refused():
    _refused(_raw_model(_set(10, lambda g: -1)), "peephole")


def test_projection_bias_without_weights_is_refused():
    _refused(_raw_model(_set(17, lambda g: g.const("pb", np.zeros(4, np.float32)))), "projection")


def test_output_size_must_equal_cells_without_projection():
    def edit(g, ins):
        ins = list(ins)
        for k in range(5, 9):
            ins[k] = g.const(f"r{k}", np.zeros((4, 3), np.float32))
        ins[18] = g.input("h3", (2, 3))
        return ins
    b_model = _raw_model(edit)
    with pytest.raises(ModelError, match="LSTM.*number of cells"):
        run_ours(b_model, [np.zeros(s, np.float32) for s in ((2, 3), (2, 4), (2, 4), (2, 3))])


def test_wrong_weight_shape_is_refused():
    _refused(_raw_model(_set(3, lambda g: g.const("bad", np.zeros((4, 2), np.float32)))),
             "input-to-cell weights")


def test_wrong_state_size_is_refused():
    def edit(g, ins):
        ins = list(ins)
        ins[19] = g.input("c5", (2, 5))
        return ins
    with pytest.raises(ModelError, match="LSTM.*cell_state"):
        run_ours(_raw_model(edit), [np.zeros(s, np.float32) for s in ((2, 3), (2, 4), (2, 4), (2, 5))])


def test_negative_clip_is_refused():
    _refused(_raw_model(None, options={"cell_clip": -1.0}), "cell_clip")


def test_input_rank_other_than_2_is_refused():
    with pytest.raises(ModelError, match="LSTM.*rank 2"):
        run_ours(_raw_model(None, input_shape=(2, 3, 1)),
                 [np.zeros((2, 3, 1), np.float32)] + [np.zeros((2, 4), np.float32)] * 2)


def test_partial_layer_norm_is_refused():
    def edit(g, ins):
        ins = list(ins)
        ins[22] = g.const("ln_c", np.ones(4, np.float32))
        return ins
    _refused(_raw_model(edit), "layer-norm")


def test_unquantized_integer_weights_are_refused():
    _refused(_raw_model(_set(2, lambda g: g.const("w_int", np.zeros((4, 3), np.int8)))), "int8")


def test_sequence_bad_models():
    x = _x(BASE_SEQUENCE, 0)
    h, c = np.zeros((2, 4), np.float32), np.zeros((2, 4), np.float32)

    def refused(case, match, feeds=None, options=None):
        with pytest.raises(ModelError, match=f"{SEQ}.*" + match):
            run_ours(lstm_model(case, "input", options=options), feeds or [x, h, c])

    # a rank-2 input: an LSTM's, not a sequence's
    with pytest.raises(ModelError, match=f"{SEQ}.*rank 3"):
        b = ModelBuilder()
        g = b.subgraph()
        w = lstm_weights(BASE_SEQUENCE)
        ins = [g.input("x", (2, 3))] + [g.const(k, w[k]) if w[k] is not None else -1 for k in (
            [f"w_{k}" for k in GATES] + [f"r_{k}" for k in GATES] + ["p_i", "p_f", "p_o"]
            + [f"b_{k}" for k in GATES])] + [-1, -1, g.input("h", (2, 4)), g.input("c", (2, 4))]
        y = g.tensor("y", (2, 4))
        g.op(SEQ, ins, [y], fused_activation_function="TANH")
        g.output(y)
        run_ours(b.finish(), [np.zeros((2, 3), np.float32), h, c])
    # diagonal_recurrent_tensors with full recurrent matrices, and the converse
    refused(dict(BASE_SEQUENCE), r"rank 1 \(diagonal_recurrent_tensors\)",
            options=dict(diagonal_recurrent_tensors=True))
    refused(dict(BASE_SEQUENCE, diagonal=True), "rank 2",
            options=dict(diagonal_recurrent_tensors=False))
    # with diagonal recurrent weights n_output is n_cell: a 4-unit output_state for 5 cells
    refused(dict(BASE_SEQUENCE, diagonal=True, peephole=False, n_cell=5, n_output=4),
            "output_state .input 18. must hold 10 elements", [x, h, np.zeros((2, 5), np.float32)])
