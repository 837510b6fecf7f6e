"""Fusion declared by the op: element-wise ops run inside their producer's store
(`Fusion.epilogue_inputs`, `Fusion.stores_once`, kit.EpilogueRef), reshape-like ops address their
input (`Fusion.alias_input`). Chains of random element-wise ops after a conv, a pool or an ADD,
float32 and int8, against the reference on every Taichi backend under test; and each condition
under which nothing may be fused."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from tflite_taichi.builder import ModelBuilder
from tflite_taichi.testing import TAICHI_EXAMPLES, check_delegate, strategies

S = strategies()
SHAPE = (1, 6, 6, 4)
# element-wise ops after the producer: (name, kind) with kind 'unary', 'const' (the other
# operand a broadcast constant), 'residual' (the other operand the model's input), 'prelu'
CHAIN_OPS = [("RELU", "unary"), ("RELU6", "unary"), ("LOGISTIC", "unary"), ("TANH", "unary"),
             ("HARD_SWISH", "unary"), ("LEAKY_RELU", "unary"), ("PRELU", "prelu"),
             ("ADD", "const"), ("MUL", "const"), ("SUB", "residual"), ("MAXIMUM", "const"),
             ("MINIMUM", "residual"), ("ADD", "residual"), ("ABS", "unary"), ("SQUARE", "unary"),
             ("ELU", "unary"), ("ADD_N", "residual")]
PRODUCERS = ["CONV_2D", "DEPTHWISE_CONV_2D", "AVERAGE_POOL_2D", "MAX_POOL_2D", "ADD"]


def _quant(q, i):
    """An int8 grid per tensor: q is (scale, zero point) of the input; each later tensor its
    own scale (ranges differ along a chain)."""
    if q is None:
        return None
    return (q[0] * (1.0 + 0.25 * i), int(q[1]))


def chain_model(producer, chain, rng, q=None):
    """x -> PRODUCER -> op_1 -> ... -> op_n -> out: one producer and `chain` element-wise ops."""
    dtype = np.int8 if q is not None else np.float32
    b = ModelBuilder()
    g = b.subgraph()
    x = g.input("x", SHAPE, dtype, _quant(q, 0))
    t = g.tensor("t0", SHAPE, dtype, _quant(q, 1))
    if producer in ("CONV_2D", "DEPTHWISE_CONV_2D"):
        depthwise = producer == "DEPTHWISE_CONV_2D"
        w = rng.uniform(-1, 1, (1, 3, 3, 4) if depthwise else (4, 3, 3, 4)).astype(np.float32)
        bias = rng.uniform(-1, 1, 4).astype(np.float32)
        if q is not None:
            ws = np.float32(1 / 127)
            w = g.const("w", np.round(w / ws).astype(np.int8), quantization=(float(ws), 0))
            bias = g.const("b", np.round(bias / (ws * q[0])).astype(np.int32),
                           quantization=(float(ws * q[0]), 0))
        else:
            w, bias = g.const("w", w), g.const("b", bias)
        extra = {"depth_multiplier": 1} if depthwise else {}
        g.op(producer, [x, w, bias], [t], padding="SAME", stride_h=1, stride_w=1, **extra)
    elif producer in ("AVERAGE_POOL_2D", "MAX_POOL_2D"):
        g.op(producer, [x], [t], padding="SAME", stride_h=1, stride_w=1, filter_height=3,
             filter_width=3)
    else:
        g.op("ADD", [x, x], [t])
    for i, (name, kind) in enumerate(chain):
        out = g.tensor(f"t{i + 1}", SHAPE, dtype, _quant(q, i + 2))
        if kind == "unary":
            g.op(name, [t], [out], **({"alpha": 0.2} if name == "LEAKY_RELU" else {}))
        elif kind == "prelu":
            alpha = rng.uniform(0, 0.5, (1, 1, 4)).astype(np.float32)
            a = (g.const(f"alpha{i}", np.round(alpha / 0.004).astype(np.int8), quantization=(0.004, 0))
                 if q is not None else g.const(f"alpha{i}", alpha))
            g.op("PRELU", [t, a], [out])
        elif kind == "const":
            c = rng.uniform(-1, 1, (4,)).astype(np.float32)
            c = (g.const(f"c{i}", np.round(c / 0.01).astype(np.int8), quantization=(0.01, 0))
                 if q is not None else g.const(f"c{i}", c))
            g.op(name, [t, c] if i % 2 == 0 else [c, t], [out])
        else:
            g.op(name, [x, t] if i % 2 else [t, x], [out])
        t = out
    g.output(t)
    return b.finish()


# Quantized, an intermediate on a rounding boundary may snap to either neighbour (the conv's sum
# in another order): one unit, which an op's slope multiplies on the way down the chain (each
# grid here is 1.25x wider than the last). SQUARE (slope 2x: seen 4 units) and HARD_SWISH (up to
# 1.5) can push it past the one-unit check; the others' slopes are at most 1.
CHAIN_OPS_INT8 = [op for op in CHAIN_OPS if op[0] not in ("SQUARE", "HARD_SWISH")]


@settings(max_examples=TAICHI_EXAMPLES)
@given(producer=st.sampled_from(PRODUCERS), quantized=st.booleans(), data=st.data(),
       q=S.quant_params(), seed=S.seeds())
def test_a_chain_of_element_wise_ops_runs_in_its_producers_store(taichi_workers, producer,
                                                                quantized, data, q, seed):
    chain = data.draw(st.lists(st.sampled_from(CHAIN_OPS_INT8 if quantized else CHAIN_OPS),
                               min_size=1, max_size=4), label="chain")
    model = chain_model(producer, chain, np.random.default_rng(seed), q if quantized else None)
    for backend, s in check_delegate(model, taichi_workers, seed=seed).items():
        [p] = s["partitions"]
        if producer != "ADD":       # an ADD producer may instead be computed at the next load
            assert p["fused"] == [[i, i + 1] for i in range(len(chain))], (backend, p)
        _assert_one_step(s, len(chain) + 1, backend)


def test_quantize_dequantize_and_cast_run_in_the_producers_store(taichi_workers):
    """A float conv whose output a QUANTIZE snaps to an int8 grid, a DEQUANTIZE hands on and a
    CAST to float16 rounds: all three in the conv's store, each with its own grid or rounding."""
    rng = np.random.default_rng(5)
    b = ModelBuilder()
    g = b.subgraph()
    x = g.input("x", SHAPE)
    t = g.tensor("t", SHAPE)
    g.op("CONV_2D", [x, g.const("w", rng.uniform(-1, 1, (4, 3, 3, 4)).astype(np.float32)),
                     g.const("b", rng.uniform(-1, 1, 4).astype(np.float32))], [t],
         padding="SAME", stride_h=1, stride_w=1)
    q = g.tensor("q", SHAPE, np.int8, (0.07, -3))
    g.op("QUANTIZE", [t], [q])
    d = g.tensor("d", SHAPE)
    g.op("DEQUANTIZE", [q], [d])
    h = g.tensor("h", SHAPE, np.float16)
    g.op("CAST", [d], [h], in_data_type=0, out_data_type=1)
    g.output(h)
    model = b.finish()
    for backend, s in check_delegate(model, taichi_workers, seed=2).items():
        assert s["partitions"][0]["fused"] == [[0, 1], [1, 2], [2, 3]], (backend, s["partitions"])
        assert s["runtime"]["steps_per_invoke"] == 1, (backend, s["runtime"])


def _assert_one_step(summary, n_ops, backend):
    """All n_ops ops of the partition run in one step: the others fused into a store or
    computed at a load."""
    [p] = summary["partitions"]
    folded = {j for _, j in p["fused"]} | {i for i, _ in p["computed_at_load"]}
    assert len(folded) == n_ops - 1, (backend, p)
    assert summary["runtime"]["steps_per_invoke"] == 1, (backend, summary["runtime"])


def test_a_chain_in_fp16(vulkan_workers):
    model = chain_model("CONV_2D", [("HARD_SWISH", "unary"), ("ADD", "residual"), ("LOGISTIC", "unary")],
                        np.random.default_rng(3))
    for s in check_delegate(model, vulkan_workers, precision="fp16").values():
        assert len(s["partitions"][0]["fused"]) == 3


def _pair(read_twice=False, also_output=False, late_operand=False, broadcast=False):
    """CONV_2D -> t -> ADD(t, u) -> out, with what forbids fusing the ADD."""
    rng = np.random.default_rng(1)
    b = ModelBuilder()
    g = b.subgraph()
    x = g.input("x", SHAPE)
    t = g.tensor("t", (1, 6, 6, 1) if broadcast else SHAPE)
    c_out = 1 if broadcast else 4
    g.op("CONV_2D", [x, g.const("w", rng.uniform(-1, 1, (c_out, 3, 3, 4)).astype(np.float32)),
                     g.const("b", rng.uniform(-1, 1, c_out).astype(np.float32))], [t],
         padding="SAME", stride_h=1, stride_w=1)
    u = x
    if late_operand:                 # the ADD's other operand is made after the conv
        u = g.tensor("u", SHAPE)
        g.op("RELU", [x], [u])
    out = g.tensor("out", SHAPE)
    g.op("ADD", [t, u], [out])
    outputs = [out]
    if read_twice:
        again = g.tensor("again", (1, 6, 6, 1) if broadcast else SHAPE)
        g.op("RELU", [t], [again])
        outputs.append(again)
    if also_output:
        outputs.append(t)
    g.output(*outputs)
    return b.finish()


@pytest.mark.parametrize("why", ["read_twice", "also_output", "late_operand", "broadcast"])
def test_nothing_is_fused_where_it_would_be_wrong(taichi_workers, why):
    """The conv's output read by two ops, needed as a model output, the ADD's other operand made
    after the conv (the conv's store would read it before it exists), the conv's output
    broadcast by the ADD (its store writes fewer elements than the ADD's output has): the ADD
    stays a step of its own (and the results still match)."""
    model = _pair(**{why: True})
    for backend, s in check_delegate(model, taichi_workers).items():
        fused = s["partitions"][0]["fused"]
        assert [0, 1] not in fused and [0, 2] not in fused, (backend, why, fused)


def _reshape_model(also_output=False):
    """x -> RELU -> RESHAPE -> SQUEEZE -> EXPAND_DIMS -> MUL(c) -> out (the reshapes alias)."""
    b = ModelBuilder()
    g = b.subgraph()
    x = g.input("x", (1, 4, 6, 2))
    a = g.tensor("a", (1, 4, 6, 2))
    g.op("RELU", [x], [a])
    r = g.tensor("r", (1, 4, 12))
    g.op("RESHAPE", [a, g.const("shape", np.array([1, 4, 12], np.int32))], [r], new_shape=[1, 4, 12])
    sq = g.tensor("sq", (4, 12))
    g.op("SQUEEZE", [r], [sq], squeeze_dims=[0])
    ex = g.tensor("ex", (4, 1, 12))
    g.op("EXPAND_DIMS", [sq, g.const("axis", np.array(1, np.int32))], [ex])
    out = g.tensor("out", (4, 1, 12))
    g.op("MUL", [ex, g.const("c", np.linspace(-2, 2, 12).astype(np.float32))], [out])
    g.output(out, *([r] if also_output else []))
    return b.finish()


def test_reshapes_address_their_input(taichi_workers):
    """RESHAPE, SQUEEZE and EXPAND_DIMS cost no step: their outputs are their inputs' memory
    read with another shape; a reshape whose output leaves the partition is copied there."""
    for backend, s in check_delegate(_reshape_model(), taichi_workers).items():
        assert s["runtime"]["steps_per_invoke"] == 2, (backend, s["runtime"])     # RELU, MUL
    for backend, s in check_delegate(_reshape_model(also_output=True), taichi_workers).items():
        assert s["runtime"]["steps_per_invoke"] == 3, (backend, s["runtime"])     # + RESHAPE's copy


# -- ops computed at their reader's load (Fusion.computed_at_load, kit.LoadRef) -------------
# what runs between the model's input and the reader: PAD (spatial or of the channels, as
# BlazeFace's residuals), binary arithmetic with a per-channel constant
LOAD_OPS = ["PAD", "PAD_CHANNELS", "ADD", "MUL", "SUB", "MAXIMUM"]
# element-wise readers: a RELU, or an ADD of a conv's output that runs in the conv's store
READERS = ["RELU", "ADD_IN_CONV_STORE"]


def load_chain_model(chain, reader, rng, q=None):
    """x -> op_1 -> ... -> op_n -> READER -> out. READER 'ADD_IN_CONV_STORE' is
    conv(y) + op_n's output, the conv first in the graph; 'CONV_2D' a conv reading op_n."""
    dtype = np.int8 if q is not None else np.float32
    b = ModelBuilder()
    g = b.subgraph()
    grid = 0
    x = g.input("x", SHAPE, dtype, _quant(q, grid))
    shape = SHAPE
    for name in chain:
        if name.startswith("PAD"):
            pads = [[0, 0], [1, 2], [2, 0], [0, 0]] if name == "PAD" else [[0, 0]] * 3 + [[0, 3]]
            shape = tuple(d + lo + hi for d, (lo, hi) in zip(shape, pads))

    def conv(src, c_in, c_out, grid_in, grid_out, out_shape):
        w = rng.uniform(-1, 1, (c_out, 3, 3, c_in)).astype(np.float32)
        bias = rng.uniform(-1, 1, c_out).astype(np.float32)
        if q is not None:
            ws, xs = float(np.float32(1 / 127)), _quant(q, grid_in)[0]
            w = g.const(f"w{src}", np.round(w / ws).astype(np.int8), quantization=(ws, 0))
            bias = g.const(f"b{src}", np.round(bias / (ws * xs)).astype(np.int32), quantization=(ws * xs, 0))
        else:
            w, bias = g.const(f"w{src}", w), g.const(f"b{src}", bias)
        out = g.tensor(f"conv{src}", out_shape, dtype, _quant(q, grid_out))
        g.op("CONV_2D", [src, w, bias], [out], padding="SAME", stride_h=1, stride_w=1)
        return out

    if reader == "ADD_IN_CONV_STORE":
        y = g.input("y", shape, dtype, _quant(q, 7))
        c = conv(y, shape[-1], shape[-1], 7, 8, shape)
    t, shape = x, SHAPE
    for i, name in enumerate(chain):
        if name.startswith("PAD"):
            pads = [[0, 0], [1, 2], [2, 0], [0, 0]] if name == "PAD" else [[0, 0]] * 3 + [[0, 3]]
            shape = tuple(d + lo + hi for d, (lo, hi) in zip(shape, pads))
            out = g.tensor(f"t{i}", shape, dtype, _quant(q, grid))    # PAD keeps its grid
            g.op("PAD", [t, g.const(f"pads{i}", np.array(pads, np.int32))], [out])
        else:
            grid += 1
            out = g.tensor(f"t{i}", shape, dtype, _quant(q, grid))
            k = rng.uniform(-1, 1, (shape[-1],)).astype(np.float32)
            k = (g.const(f"k{i}", np.round(k / 0.01).astype(np.int8), quantization=(0.01, 0))
                 if q is not None else g.const(f"k{i}", k))
            g.op(name, [t, k] if i % 2 == 0 else [k, t], [out])
        t = out
    if reader == "RELU":
        out = g.tensor("out", shape, dtype, _quant(q, grid))
        g.op("RELU", [t], [out])
    elif reader == "ADD_IN_CONV_STORE":
        out = g.tensor("out", shape, dtype, _quant(q, 9))
        g.op("ADD", [c, t], [out])
    else:
        out = conv(t, shape[-1], 5, grid, 9, shape[:3] + (5,))
    g.output(out)
    return b.finish()


@settings(max_examples=TAICHI_EXAMPLES)
@given(chain=st.lists(st.sampled_from(LOAD_OPS), min_size=1, max_size=3),
       reader=st.sampled_from(READERS), quantized=st.booleans(), q=S.quant_params(),
       seed=S.seeds())
def test_pads_and_broadcast_arithmetic_run_in_their_readers_loads(taichi_workers, chain, reader,
                                                                  quantized, q, seed):
    model = load_chain_model(chain, reader, np.random.default_rng(seed), q if quantized else None)
    first = 1 if reader == "ADD_IN_CONV_STORE" else 0       # the conv is op 0
    n = len(chain)
    pads = {first + i for i, name in enumerate(chain) if name.startswith("PAD")}
    for backend, s in check_delegate(model, taichi_workers, seed=seed).items():
        [p] = s["partitions"]
        _assert_one_step(s, n + 1 + first, backend)
        # a PAD never runs as a step (nor heads a chain): it is addressing of its reader's loads
        assert pads <= {i for i, _ in p["computed_at_load"]}, (backend, p)
        if reader == "ADD_IN_CONV_STORE":
            assert [0, n + 1] in p["fused"], (backend, p)


def test_a_conv_reads_a_stored_pad(taichi_workers):
    """A conv loads each input element 9 * c_out times: what it reads is stored, not computed
    at each load (slower on the H200: codegen._load_reader)."""
    model = load_chain_model(["PAD", "MUL"], "CONV_2D", np.random.default_rng(2))
    for backend, s in check_delegate(model, taichi_workers).items():
        [p] = s["partitions"]
        assert p["computed_at_load"] == [[0, 1]], (backend, p)      # PAD at the MUL's load
        assert s["runtime"]["steps_per_invoke"] == 2, (backend, s["runtime"])


def test_a_residual_pad_is_read_in_the_fused_add(taichi_workers):
    """BlazeFace's residual: y = conv(x) + PAD(x) (channels padded), the PAD made after the
    conv: the ADD runs in the conv's store, and the PAD at the ADD's load (one step)."""
    rng = np.random.default_rng(4)
    b = ModelBuilder()
    g = b.subgraph()
    x = g.input("x", SHAPE)
    c = g.tensor("c", (1, 6, 6, 6))
    g.op("CONV_2D", [x, g.const("w", rng.uniform(-1, 1, (6, 3, 3, 4)).astype(np.float32)),
                     g.const("b", rng.uniform(-1, 1, 6).astype(np.float32))], [c],
         padding="SAME", stride_h=1, stride_w=1)
    padded = g.tensor("padded", (1, 6, 6, 6))
    g.op("PAD", [x, g.const("pads", np.array([[0, 0]] * 3 + [[0, 2]], np.int32))], [padded])
    out = g.tensor("out", (1, 6, 6, 6))
    g.op("ADD", [padded, c], [out], fused_activation_function="RELU")
    g.output(out)
    for backend, s in check_delegate(b.finish(), taichi_workers).items():
        [p] = s["partitions"]
        assert p["fused"] == [[0, 2]] and p["computed_at_load"] == [[1, 2]], (backend, p)
        assert s["runtime"]["steps_per_invoke"] == 1, (backend, s["runtime"])


def _pad_read_by(readers=1, output=False):
    b = ModelBuilder()
    g = b.subgraph()
    x = g.input("x", SHAPE)
    padded = g.tensor("padded", (1, 8, 8, 4))
    g.op("PAD", [x, g.const("pads", np.array([[0, 0], [1, 1], [1, 1], [0, 0]], np.int32))], [padded])
    outs = []
    for i in range(readers):
        o = g.tensor(f"pool{i}", (1, 8, 8, 4))
        g.op("MAX_POOL_2D" if i == 0 else "AVERAGE_POOL_2D", [padded], [o], padding="SAME",
             stride_h=1, stride_w=1, filter_height=3, filter_width=3)
        outs.append(o)
    g.output(*outs, *([padded] if output else []))
    return b.finish()


@pytest.mark.parametrize("readers,output", [(2, False), (1, True)])
def test_a_pad_with_two_readers_or_leaving_the_partition_is_stored(taichi_workers, readers, output):
    """Read by two ops (each would compute it again: kept in memory once) or needed outside."""
    for backend, s in check_delegate(_pad_read_by(readers, output), taichi_workers).items():
        assert s["partitions"][0]["computed_at_load"] == [], (backend, s["partitions"])


def test_what_a_load_reads_lives_until_the_load(taichi_workers):
    """a = conv1(x); p = PAD(a); b = conv2(x); out = conv3(b) + p: the PAD runs in conv3's
    store, three steps after its input a was made; b (a's size, made in between) must not
    take a's place in the arena."""
    rng = np.random.default_rng(6)
    b_ = ModelBuilder()
    g = b_.subgraph()
    x = g.input("x", SHAPE)

    def conv(name, src, c_in, c_out):
        out = g.tensor(name, (1, 6, 6, c_out))
        g.op("CONV_2D", [src, g.const(f"{name}_w", rng.uniform(-1, 1, (c_out, 3, 3, c_in)).astype(np.float32)),
                         g.const(f"{name}_b", rng.uniform(-1, 1, c_out).astype(np.float32))], [out],
             padding="SAME", stride_h=1, stride_w=1)
        return out
    a = conv("a", x, 4, 4)
    p = g.tensor("p", (1, 6, 6, 6))
    g.op("PAD", [a, g.const("pads", np.array([[0, 0]] * 3 + [[1, 1]], np.int32))], [p])
    b = conv("b", x, 4, 4)
    c = conv("c", b, 4, 6)
    out = g.tensor("out", (1, 6, 6, 6))
    g.op("ADD", [c, p], [out])
    g.output(out)
    for backend, s in check_delegate(b_.finish(), taichi_workers).items():
        [part] = s["partitions"]
        assert part["fused"] == [[3, 4]] and part["computed_at_load"] == [[1, 4]], (backend, part)


def test_long_chains_are_cut(taichi_workers):
    """40 element-wise ops after a conv (a fuzzed model had ~30: Taichi's compiler ran out of
    Python stack on the nesting): fused in chains of at most codegen.MAX_CHAIN, still right;
    and 12 PADs, computed at loads in chains of at most MAX_CHAIN."""
    from tflite_taichi.codegen import MAX_CHAIN

    def longest(pairs, downward):
        depth = {}
        for a, b in sorted(pairs, reverse=not downward):
            src, dst = (a, b) if downward else (b, a)
            depth[dst] = depth.get(src, 0) + 1
        return max(depth.values(), default=0)
    chain = [("RELU", "unary"), ("ADD", "const"), ("MUL", "const"), ("MAXIMUM", "const")] * 10
    model = chain_model("CONV_2D", chain, np.random.default_rng(8))
    for backend, s in check_delegate(model, taichi_workers).items():
        [p] = s["partitions"]
        assert longest(p["fused"], True) == MAX_CHAIN, (backend, p)
        assert longest(p["computed_at_load"], False) <= MAX_CHAIN, (backend, p)
        assert s["runtime"]["steps_per_invoke"] < 10, (backend, s["runtime"])
    model = load_chain_model(["PAD_CHANNELS"] * 12, "RELU", np.random.default_rng(9))
    for backend, s in check_delegate(model, taichi_workers).items():
        [p] = s["partitions"]
        assert longest(p["computed_at_load"], False) == MAX_CHAIN, (backend, p)
