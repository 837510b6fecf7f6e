"""STABLEHLO_COMPOSITE (ops/control.py) against LiteRT through multi-subgraph models written by
tflite_taichi.builder (its options in builtin_options_2):

- a litert-torch-like "odml.scaled_dot_product_attention": q, k, v [B, T, N, H] (k, v with a KV
  length S), an additive mask [B, 1, T, S]; the decomposition transposes to [B, N, T, H], then
  BATCH_MATMUL(q, k^T), MUL by the scale, ADD the mask, SOFTMAX, BATCH_MATMUL(., v) and back.
  Against LiteRT's reference kernels (which run the decomposition) and against XNNPACK, which
  claims this composite by name and computes it with its own fused attention, to the same
  tolerance: so the decomposition here means what the name means there. (XNNPACK reads the
  "scale" attribute only when it is a 32-bit flexbuffer float: a 64-bit one gives wrong
  outputs; litert-torch writes float32 attributes, and so do these models. With a batch of two
  its fused attention fails to prepare or gives outputs up to 0.1 off: compared at batch 1,
  what litert-torch exports, only.);
- decompositions handing an input straight out, giving a constant, calling another composite,
  a composite inside a WHILE body; int8 values crossing into a decomposition under other
  scales (raw integers, as IF);
- the options as read back; the errors (bad index, arity and dtype mismatches, recursion,
  which LiteRT 2.3 does not check: it crashes on recursion);
- on the delegate: the calling graph's ops delegated around the composite, which runs with its
  decomposition on the CPU (as IF/WHILE bodies)."""
import numpy as np
import pytest
from flatbuffers import flexbuffers
from hypothesis import given, settings
from hypothesis import strategies as st

from tflite_taichi import Interpreter
from tflite_taichi.builder import ModelBuilder
from tflite_taichi.errors import ModelError
from tflite_taichi.testing import TAICHI_EXAMPLES, examples, check_against_litert, check_delegate, strategies

pytest.importorskip("ai_edge_litert.interpreter")
S = strategies()
I32 = np.int32
SDPA = "odml.scaled_dot_product_attention"


def composite(g, inputs, outputs, index, name="odml.test", attributes=None, version=0):
    """A STABLEHLO_COMPOSITE op in `g` calling subgraph `index`."""
    attrs = bytes(flexbuffers.Dumps(attributes if attributes is not None else {}))
    return g.op("STABLEHLO_COMPOSITE", inputs, outputs, name=name,
                decomposition_subgraph_index=index, composite_attributes=attrs,
                option_fields=dict(version=version))


def _binary(g, op, a, b, shape, dtype=np.float32, q=None, name="y", **options):
    y = g.tensor(name, shape, dtype, q)
    g.op(op, [a, b], [y], **options)
    return y


# -- scaled dot-product attention ------------------------------------------------------------
def attention_decomposition(d, q, k, v, mask, dims, scale):
    """softmax(q k^T * scale + mask) v in BTNH, as litert-torch's decomposition computes it."""
    B, T, S_, N, H = dims
    perm = d.const("perm", np.array([0, 2, 1, 3], I32))

    def transpose(x, shape, name):
        y = d.tensor(name, shape)
        d.op("TRANSPOSE", [x, perm], [y])
        return y
    qt, kt, vt = (transpose(q, (B, N, T, H), "qt"), transpose(k, (B, N, S_, H), "kt"),
                  transpose(v, (B, N, S_, H), "vt"))
    scores = _binary(d, "BATCH_MATMUL", qt, kt, (B, N, T, S_), name="scores", adj_y=True)
    scaled = _binary(d, "MUL", scores, d.const("scale", np.float32(scale)), (B, N, T, S_),
                     name="scaled")
    masked = _binary(d, "ADD", scaled, mask, (B, N, T, S_), name="masked")
    weights = d.tensor("weights", (B, N, T, S_))
    d.op("SOFTMAX", [masked], [weights], beta=1.0)
    out = _binary(d, "BATCH_MATMUL", weights, vt, (B, N, T, H), name="out_t")
    return transpose(out, (B, T, N, H), "out")


def attention_model(dims, scale, projection=False):
    """main: q, k, v, mask -> the SDPA composite -> output (projection: x2 before and + 1 after,
    ops of the calling graph around it)."""
    B, T, S_, N, H = dims
    shapes = [(B, T, N, H), (B, S_, N, H), (B, S_, N, H), (B, 1, T, S_)]
    b = ModelBuilder()
    g = b.subgraph("main")
    ins = [g.input(n, s) for n, s in zip(["q", "k", "v", "mask"], shapes)]
    if projection:
        ins[0] = _binary(g, "MUL", ins[0], g.const("two", np.float32(2)), shapes[0], name="q2")
    out = g.tensor("attention", (B, T, N, H))
    # the scale attribute a float32 (flexbuffers writes it 32 bits wide), as litert-torch's f32
    # attribute: XNNPACK reads a 64-bit one wrongly (a scale of 1.506407072031263 as a double
    # gave outputs 0.49 off; as a float32, within 1e-7)
    composite(g, ins, [out], 1, name=SDPA, attributes={"scale": float(np.float32(scale))})
    if projection:
        out = _binary(g, "ADD", out, g.const("one", np.float32(1)), (B, T, N, H), name="out")
    g.output(out)
    d = b.subgraph("sdpa_decomposition")
    q, k, v, mask = (d.input(n, s) for n, s in zip(["q", "k", "v", "mask"], shapes))
    d.output(attention_decomposition(d, q, k, v, mask, dims, scale))
    return b.finish()


def attention_inputs(rng, dims, causal):
    B, T, S_, N, H = dims
    q, k, v = (rng.uniform(-1, 1, s).astype(np.float32)
               for s in [(B, T, N, H), (B, S_, N, H), (B, S_, N, H)])
    if causal:   # query t (the last T of S positions) sees keys up to S - T + t
        visible = np.arange(S_)[None, :] <= (S_ - T + np.arange(T))[:, None]
        mask = np.where(visible, 0.0, -1e9)
    else:
        mask = rng.uniform(-2, 0, (T, S_))
    return [q, k, v, np.broadcast_to(mask, (B, 1, T, S_)).astype(np.float32)]


def attention_numpy(q, k, v, mask, scale):
    qt, kt, vt = (np.transpose(x, (0, 2, 1, 3)).astype(np.float64) for x in (q, k, v))
    s = qt @ np.swapaxes(kt, -1, -2) * scale + mask
    p = np.exp(s - s.max(-1, keepdims=True))
    return np.transpose((p / p.sum(-1, keepdims=True)) @ vt, (0, 2, 1, 3))


@st.composite
def attention_dims(draw):
    T = draw(st.integers(1, 4))
    return (draw(st.integers(1, 2)), T, T + draw(st.integers(0, 3)), draw(st.integers(1, 3)),
            draw(st.integers(1, 5)))


@given(dims=attention_dims(), scale=st.sampled_from([0.5, 1.0]) | st.floats(0.05, 2.0),
       causal=st.booleans(), seed=S.seeds())
def test_scaled_dot_product_attention_composite_matches_litert(dims, scale, causal, seed):
    model = attention_model(dims, scale)
    inputs = attention_inputs(np.random.default_rng(seed), dims, causal)
    ours = check_against_litert(model, inputs)
    if dims[0] == 1:     # XNNPACK's fused attention, for the batch of one litert-torch exports
        check_against_litert(model, inputs, kernels="xnnpack")
    np.testing.assert_allclose(ours[0], attention_numpy(*inputs, scale), rtol=1e-5, atol=1e-5)


# -- other decompositions --------------------------------------------------------------------
def two_output_model(shape, kinds):
    """main: (x, y) -> composite -> (o1, o2), each output of the decomposition one of: 'x' (an
    input handed straight out), 'const', 'add' (x + y), 'nested' (another composite: x * y)."""
    b = ModelBuilder()
    g = b.subgraph("main")
    x, y = g.input("x", shape), g.input("y", shape)
    outs = [g.tensor(f"o{j}", shape) for j in range(2)]
    composite(g, [x, y], outs, 1)
    g.output(*outs)
    d = b.subgraph("decomposition")
    dx, dy = d.input("x", shape), d.input("y", shape)
    results = []
    for j, kind in enumerate(kinds):
        if kind == "x":
            results.append(dx)
        elif kind == "const":
            results.append(d.const(f"c{j}", np.full(shape, 0.25 * (j + 1), np.float32)))
        elif kind == "add":
            results.append(_binary(d, "ADD", dx, dy, shape, name=f"sum{j}"))
        else:
            inner = d.tensor(f"inner{j}", shape)
            composite(d, [dx, dy], [inner], 2, name="odml.inner")
            results.append(inner)
    d.output(*results)
    n = b.subgraph("inner")
    nx, ny = n.input("x", shape), n.input("y", shape)
    n.output(_binary(n, "MUL", nx, ny, shape))
    return b.finish()


@given(shape=S.shapes(0, 3, 1, 4), kinds=st.lists(st.sampled_from(["x", "const", "add", "nested"]),
                                                  min_size=2, max_size=2), seed=S.seeds())
def test_decompositions_passing_inputs_constants_and_nested_composites_match_litert(shape, kinds,
                                                                                   seed):
    rng = np.random.default_rng(seed)
    x, y = (rng.uniform(-2, 2, shape).astype(np.float32) for _ in range(2))
    out = check_against_litert(two_output_model(shape, kinds), [x, y])
    want = {"x": x, "add": x + y, "nested": x * y}
    for j, kind in enumerate(kinds):          # and each output is what its kind says
        expected = want.get(kind, np.full(shape, 0.25 * (j + 1), np.float32))
        np.testing.assert_allclose(out[j], expected, rtol=1e-6)


def int8_model(shape, q_in, q_dec, q_out, q_main):
    """An int8 x (q_in) into a decomposition whose input reads under q_dec and which returns
    RELU(x) under q_out; the composite's output tensor is q_main. Integers cross unchanged."""
    b = ModelBuilder()
    g = b.subgraph("main")
    x = g.input("x", shape, np.int8, q_in)
    out = g.tensor("o", shape, np.int8, q_main)
    composite(g, [x], [out], 1)
    g.output(out)
    d = b.subgraph("decomposition")
    dx = d.input("x", shape, np.int8, q_dec)
    r = d.tensor("r", shape, np.int8, q_out)
    d.op("RELU", [dx], [r])
    d.output(r)
    return b.finish()


@given(shape=S.shapes(1, 3, 1, 4), q_in=S.quant_params(), q_dec=S.quant_params(),
       q_out=S.quant_params(), q_main=S.quant_params(), same=st.booleans(), seed=S.seeds())
def test_int8_values_cross_into_a_decomposition_like_litert(shape, q_in, q_dec, q_out, q_main,
                                                            same, seed):
    if same:                  # what converters write: one scale on both sides
        q_dec = q_out = q_main = q_in
    check_against_litert(int8_model(shape, q_in, q_dec, q_out, q_main), seed=seed)


def composite_in_loop_model(shape):
    """WHILE i < n: x = composite(x) with the decomposition tanh(x) + 0.5."""
    b = ModelBuilder()
    g = b.subgraph("main")
    n, x = g.input("n", (), I32), g.input("x", shape)
    outs = [g.tensor("i_out", (), I32), g.tensor("n_out", (), I32), g.tensor("x_out", shape)]
    g.op("WHILE", [g.const("i0", I32(0)), n, x], outs, cond_subgraph_index=1, body_subgraph_index=2)
    g.output(outs[2])
    c = b.subgraph("cond")
    ci, cn, _ = c.input("i", (), I32), c.input("n", (), I32), c.input("x", shape)
    c.output(_binary(c, "LESS", ci, cn, (), np.bool_, name="go"))
    body = b.subgraph("body")
    bi, bn, bx = body.input("i", (), I32), body.input("n", (), I32), body.input("x", shape)
    stepped = body.tensor("stepped", shape)
    composite(body, [bx], [stepped], 3, name="odml.step")
    body.output(_binary(body, "ADD", bi, body.const("one", I32(1)), (), I32, name="i_next"), bn, stepped)
    d = b.subgraph("step")
    dx = d.input("x", shape)
    t = d.tensor("t", shape)
    d.op("TANH", [dx], [t])
    d.output(_binary(d, "ADD", t, d.const("half", np.float32(0.5)), shape))
    return b.finish()


@settings(max_examples=examples(25))
@given(shape=S.shapes(1, 2, 1, 4), n=st.integers(0, 4), seed=S.seeds())
def test_a_composite_inside_a_loop_body_matches_litert(shape, n, seed):
    x = np.random.default_rng(seed).uniform(-2, 2, shape).astype(np.float32)
    out = check_against_litert(composite_in_loop_model(shape), [I32(n), x])
    for _ in range(n):
        x = np.tanh(x) + np.float32(0.5)
    np.testing.assert_allclose(out[0], x, rtol=1e-5, atol=1e-6)


# -- options ----------------------------------------------------------------------------------
def test_options_are_read_from_builtin_options_2():
    model = attention_model((1, 2, 2, 1, 3), 0.125)
    it = Interpreter(model_content=model, backend="reference")
    _, options = it._resolved[(0, 0)]
    assert options.name == SDPA
    assert options.decomposition_subgraph_index == 1 and options.version == 0
    assert flexbuffers.Loads(options.composite_attributes) == {"scale": 0.125}


# -- errors -----------------------------------------------------------------------------------
def _prepare(model):
    it = Interpreter(model_content=model, backend="reference")
    it.allocate_tensors()
    return it


def calling(index, n_inputs=1, n_outputs=1, decomposition_inputs=1, decomposition_outputs=1,
            input_dtype=np.float32, output_dtype=np.float32, extra=()):
    """main: composite(x0..) -> outputs; subgraph 1 takes `decomposition_inputs` float (2,)
    tensors and gives RELU of the first `decomposition_outputs` times; `extra(b)` adds more."""
    b = ModelBuilder()
    g = b.subgraph("main")
    ins = [g.input(f"x{i}", (2,), input_dtype) for i in range(n_inputs)]
    outs = [g.tensor(f"y{j}", (2,), output_dtype) for j in range(n_outputs)]
    composite(g, ins, outs, index)
    g.output(*outs)
    d = b.subgraph("decomposition")
    dins = [d.input(f"in{i}", (2,)) for i in range(decomposition_inputs)]
    r = d.tensor("r", (2,))
    d.op("RELU", [dins[0]], [r])
    d.output(*[r] * decomposition_outputs)
    for build in extra:
        build(b)
    return b.finish()


def _self_calling(b):
    """subgraph 2: (x) -> composite calling subgraph 2 itself."""
    s = b.subgraph("self")
    x = s.input("x", (2,))
    y = s.tensor("y", (2,))
    composite(s, [x], [y], 2)
    s.output(y)


@pytest.mark.parametrize("model, match", [
    (calling(5), r"decomposition subgraph 5 does not exist \(2 subgraphs\)"),
    (calling(-1), r"decomposition subgraph -1 does not exist"),
    (calling(1, n_inputs=2), r"decomposition subgraph 1 takes 1 inputs, the op passes 2"),
    (calling(1, decomposition_inputs=2), r"decomposition subgraph 1 takes 2 inputs, the op passes 1"),
    (calling(1, n_outputs=2), r"decomposition subgraph 1 gives 1 outputs, the op has 2"),
    (calling(1, decomposition_outputs=2), r"decomposition subgraph 1 gives 2 outputs, the op has 1"),
    (calling(1, input_dtype=np.int32), r"decomposition subgraph 1 input 'in0' is float32; 'x0'"),
    (calling(1, output_dtype=np.int32), r"output 'y0' is int32; decomposition subgraph 1 gives float32"),
    (calling(0), r"subgraphs 0 -> 0\): recursive subgraph calls"),
    (calling(2, extra=[_self_calling]), r"subgraphs 2 -> 2\): recursive subgraph calls"),
    (calling(1, n_inputs=0), r"takes at least one input, has none"),
], ids=["past the end", "negative", "more inputs", "fewer inputs", "more outputs",
        "fewer outputs", "input dtype", "output dtype", "the main graph", "itself", "no inputs"])
def test_composite_errors_name_the_op(model, match):
    with pytest.raises(ModelError, match=rf"op #0 \(STABLEHLO_COMPOSITE\).*{match}"):
        _prepare(model)


def test_a_missing_input_is_refused():
    b = ModelBuilder()
    g = b.subgraph("main")
    x = g.input("x", (2,))
    y = g.tensor("y", (2,))
    composite(g, [x, -1], [y], 1)
    g.output(y)
    d = b.subgraph("decomposition")
    a = d.input("a", (2,))
    d.input("b", (2,))
    d.output(a)
    with pytest.raises(ModelError, match=r"STABLEHLO_COMPOSITE.*missing \(-1\)"):
        _prepare(b.finish())


def test_a_decomposition_output_of_run_time_shape_is_refused():
    """WHERE's output shape is its input's count of true elements: dynamic in LiteRT, a
    ModelError here (every shape is static after allocate_tensors)."""
    b = ModelBuilder()
    g = b.subgraph("main")
    x = g.input("x", (4,), np.bool_)
    y = g.tensor("y", (4, 1), np.int64)
    composite(g, [x], [y], 1)
    g.output(y)
    d = b.subgraph("decomposition")
    dx = d.input("x", (4,), np.bool_)
    w = d.tensor("w", (4, 1), np.int64)
    d.op("WHERE", [dx], [w])
    d.output(w)
    with pytest.raises(ModelError, match=r"STABLEHLO_COMPOSITE.*'w' has a shape known only at invoke"):
        _prepare(b.finish())


# -- on the delegate --------------------------------------------------------------------------
@settings(max_examples=max(TAICHI_EXAMPLES // 4, 3))      # partitioning, not kernels
@given(dims=attention_dims(), causal=st.booleans(), seed=S.seeds())
def test_delegate_runs_around_the_composite_like_litert(taichi_workers, dims, causal, seed):
    """The MUL before and the ADD after are delegated; the composite (its decomposition with
    it) runs on the CPU, with the reason."""
    model = attention_model(dims, 0.5, projection=True)
    inputs = attention_inputs(np.random.default_rng(seed), dims, causal)
    check_against_litert(model, inputs)
    summaries = check_delegate(model, taichi_workers, inputs, expect_all_delegated=False,
                               max_delegated_partitions=2)
    for backend, summary in summaries.items():
        assert [p["ops"] for p in summary["partitions"]] == [[0], [2]], (backend, summary)
        (fallback,) = summary["fallback"]
        assert fallback["op"] == "STABLEHLO_COMPOSITE" and "subgraph calls" in fallback["reason"]
