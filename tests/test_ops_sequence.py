"""LSTM (builtin, FULL kernel) vs LiteRT through one-op float32 models: CIFG or not, peepholes,
projection with and without bias, layer norm, the 20- and 24-input forms, cell activations,
cell_clip and proj_clip. Tolerance: tflite_taichi.testing (1e-5 of the largest magnitude).

LiteRT requires output_state and cell_state to be variable tensors: zero at allocation, then
updated by each invoke. Our runtime has no storage for variable tensors yet (see
ops/sequence.py), so each comparison runs LiteRT on the model with variable state and ours on
its twin whose states are ordinary tensors holding the state LiteRT started that invoke from:
zero constants for the first invoke, inputs fed with LiteRT's state for the second.
"""
import numpy as np
import pytest
from hypothesis import given, strategies as st

from tflite_taichi import graph, model as model_ir
from tflite_taichi.builder import ModelBuilder
from tflite_taichi.errors import ModelError
from tflite_taichi.ops.sequence import lstm_step
from tflite_taichi.testing import assert_float_close, run_ours, strategies

S = strategies()
GATES = ("i", "f", "c", "o")
ACTIVATIONS = ["TANH", "RELU", "RELU6", "RELU_N1_TO_1", "SIGN_BIT"]


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


def lstm_weights(case) -> dict:
    """Name -> float32 array for every tensor the case has (None for an omitted one)."""
    rng = np.random.default_rng(case["seed"])
    C, I, O = case["n_cell"], case["n_input"], case["n_output"]
    u = lambda *shape: rng.uniform(-1, 1, shape).astype(np.float32)   # noqa: E731
    w = {}
    for g in GATES:
        off = case["cifg"] and g == "i"
        w["w_" + g] = None if off else u(C, I)
        w["r_" + g] = None if off else u(C, O)
        w["b_" + g] = None if off else u(C)
        w["p_" + g] = u(C) if case["peephole"] and g != "c" and not off else None
        w["ln_" + g] = u(C) + np.float32(1) if case["layer_norm"] and not off else None
    w["proj"] = u(O, C) if case["projection"] else None
    w["proj_b"] = u(O) if case["projection_bias"] else None
    return w


def lstm_model(case, state="variable", x_q=None, out_q=None, state_q=(None, None),
               weight_q=None) -> bytes:
    """A one-op LSTM model. state: 'variable' (as LiteRT requires), 'zero' (constant zeros) or
    'input' (model inputs after x: output_state, then cell_state). x_q, out_q, state_q: int8
    quantization of the input, output and states; weight_q: int8 weights with that scale."""
    from tflite_taichi.testing import quantize_array
    w = lstm_weights(case)
    B, C, O = case["n_batch"], case["n_cell"], case["n_output"]
    b = ModelBuilder()
    g = b.subgraph()
    dtype = lambda q: np.float32 if q is None else np.int8   # noqa: E731
    x = g.input("x", (B, case["n_input"]), dtype(x_q), x_q)

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
    y = g.tensor("y", (B, O), dtype(out_q), out_q)
    g.op("LSTM", ins, [y], fused_activation_function=case["act"], cell_clip=case["cell_clip"],
         proj_clip=case["proj_clip"])
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


def _x(case, seed):
    shape = (case["n_batch"], case["n_input"])
    return np.random.default_rng(seed).uniform(-2, 2, shape).astype(np.float32)


# -- against LiteRT ------------------------------------------------------------------------
@given(case=lstm_case(), seed=S.seeds())
def test_first_invoke_matches_litert(case, seed):
    x = _x(case, seed)
    (expected, *_), = litert_steps(lstm_model(case, "variable"), [x])
    actual = run_ours(lstm_model(case, "zero"), [x])[0]
    assert_float_close(actual, expected)


@given(case=lstm_case(), seed=S.seeds())
def test_second_invoke_matches_litert(case, seed):
    # From a non-zero state: LiteRT's state after its first invoke feeds our second step, and
    # our new states must be LiteRT's after its second.
    x1, x2 = _x(case, seed), _x(case, seed + 1)
    (_, h1, c1), (y2, h2, c2) = litert_steps(lstm_model(case, "variable"), [x1, x2])
    twin = lstm_model(case, "input")
    assert_float_close(run_ours(twin, [x2, h1, c1])[0], y2, what="output")
    out, h, c = our_step(twin, [x2, h1, c1])
    assert_float_close(out, y2, what="output")
    assert_float_close(h, h2, what="output_state")
    assert_float_close(c, c2, what="cell_state")


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


def test_variable_state_is_refused_with_a_clear_error():
    """Variable tensors (state kept across invokes) come with issue #6; until then a model whose
    LSTM state is variable is refused at allocate_tensors with the op and tensor named."""
    from tflite_taichi.errors import ModelError
    from tflite_taichi.interpreter import Interpreter
    case = dict(n_batch=1, n_input=2, n_cell=3, n_output=3, cifg=False, peephole=False,
                projection=False, projection_bias=False, layer_norm=False, act="TANH",
                cell_clip=0.0, proj_clip=0.0, seed=3, n_inputs=24)
    it = Interpreter(model_content=lstm_model(case, "variable"), backend="reference")
    with pytest.raises(ModelError, match=r"op #0 \(LSTM\): reads variable tensor .* not supported yet"):
        it.allocate_tensors()


# -- activation NONE: the identity here, not what LiteRT computes ---------------------------
def numpy_lstm(case, x, h, c, none_output="identity"):
    """A plain transcription of the LSTM equations (independent of ops/sequence.py).
    none_output='cell_gate': LiteRT's h' = o * g under activation NONE."""
    w = lstm_weights(case)
    sig = lambda v: 1 / (1 + np.exp(-v))   # noqa: E731
    act = {"NONE": lambda v: v, "TANH": np.tanh}[case["act"]]

    def pre(k, cell):
        v = x @ w["w_" + k].T + h @ w["r_" + k].T
        if w["p_" + k] is not None:
            v = v + w["p_" + k] * cell
        if w["ln_" + k] is not None:
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
    return h2.astype(np.float32)


@given(case=lstm_case(activations=["NONE"]), seed=S.seeds())
def test_activation_none_is_the_identity(case, seed):
    x = _x(case, seed)
    B = case["n_batch"]
    h0, c0 = np.zeros((B, case["n_output"])), np.zeros((B, case["n_cell"]))
    actual = run_ours(lstm_model(case, "zero"), [x])[0]
    assert_float_close(actual, numpy_lstm(case, x.astype(np.float64), h0, c0))


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


def test_basic_kernel_type_is_refused():
    _refused(_raw_model(None, options={"kernel_type": "BASIC"}), "BASIC")


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
        run_ours(b_model, [np.zeros((2, 3), np.float32)] * 2 + [np.zeros((2, 4), np.float32)])


def test_wrong_weight_shape_is_refused():
    _refused(_raw_model(_set(3, lambda g: g.const("bad", np.zeros((4, 2), np.float32)))),
             "input-to-cell weights")


def test_wrong_state_size_is_refused():
    def edit(g, ins):
        ins = list(ins)
        ins[19] = g.input("c5", (2, 5))
        return ins
    with pytest.raises(ModelError, match="LSTM.*cell_state"):
        run_ours(_raw_model(edit), [np.zeros((2, 3), np.float32), np.zeros((2, 4), np.float32),
                                    np.zeros((2, 5), np.float32)])


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
