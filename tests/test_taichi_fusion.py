"""Fusion declared by the op (issue #13, item 1): element-wise ops run inside their producer's
store (`OpDef.epilogue_inputs`, `stores_once`, tiutil.EpilogueRef), reshape-like ops address
their input (`OpDef.alias_input`). Chains of random element-wise ops after a conv, a pool or
an ADD, float32 and int8, against the reference on every Taichi backend under test; and each
condition under which nothing may be fused."""
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


@settings(max_examples=TAICHI_EXAMPLES)
@given(producer=st.sampled_from(PRODUCERS),
       chain=st.lists(st.sampled_from(CHAIN_OPS), min_size=1, max_size=4),
       quantized=st.booleans(), q=S.quant_params(), seed=S.seeds())
def test_a_chain_of_element_wise_ops_runs_in_its_producers_store(taichi_workers, producer, chain,
                                                                quantized, q, seed):
    model = chain_model(producer, chain, np.random.default_rng(seed), q if quantized else None)
    for backend, s in check_delegate(model, taichi_workers, seed=seed).items():
        [p] = s["partitions"]
        assert p["fused"] == [[i, i + 1] for i in range(len(chain))], (backend, p)
        assert p["kernels"] == 1, (backend, p)          # one task: the producer's


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
