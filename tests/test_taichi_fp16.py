"""precision='fp16' through chains whose intermediates are stored in float16.

A one-op model keeps its input and output in the float32 io buffer (planner.py), so only its
weights pass through float16; here chains of 4-8 ops (CONV_2D, DEPTHWISE_CONV_2D, pools, ADD of
two earlier tensors, MUL by a constant, RELU) run in one partition, their intermediates in the
float16 arena, on the cpu and vulkan workers, against the reference path.

Tolerance, derived from the chain (testing.fp16_chain_rtol): every value stays positive (positive
inputs, weights and biases), so each op's relative error is bounded by its operands' (a sum of
positive terms, a mean or a max: the largest operand error; a product: their sum) - no
cancellation can magnify it. Each tensor stored in float16 adds half an ulp (2^-11) of its own
magnitude, each weight tensor rounded to float16 on the way another 2^-11, each float32 op a
little slack. The bound is computed per tensor as the chain is built (counting every
intermediate as stored: fusing an element-wise op into its producer's store only drops a
rounding). A 1% error on each stored intermediate (a store mutated by hand to check these tests)
is 20 half-ulps: it fails these tests."""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from tflite_taichi.builder import ModelBuilder
from tflite_taichi.testing import (FP16_HALF_ULP, FP16_OP_SLACK, TAICHI_EXAMPLES, check_delegate,
                                   fp16_chain_rtol)

OPS = ["CONV_2D", "DEPTHWISE_CONV_2D", "AVERAGE_POOL_2D", "MAX_POOL_2D", "ADD", "MUL", "RELU"]


@pytest.fixture
def fp16_workers(taichi_workers):
    """The workers whose backend has f16 storage (cpu, vulkan; not opengl)."""
    workers = [w for w in taichi_workers if w.backend in ("cpu", "vulkan")]
    if not workers:
        pytest.skip("neither cpu nor vulkan is among TFLITE_TAICHI_TEST_BACKENDS")
    return workers


def positive_chain(ops, shape, rng, kernel=3, perturb=1.0):
    """x -> ops[0] -> ... -> out, every op on the last tensor (ADD: the last and an earlier
    one, the input included). Positive weights (each output's weights sum to 1: the values keep
    their magnitude), biases and constants. Returns (model bytes, relative error bound).
    `perturb`: a factor on the weights and bias of every conv whose output is an intermediate
    (a conv is linear: as if its stored output were off by that factor)."""
    c = shape[-1]
    b = ModelBuilder()
    g = b.subgraph()
    x = g.input("x", shape)
    tensors, eps = [x], {x: 0.0}        # relative error bound of each tensor, x exact (f32 io)
    for i, name in enumerate(ops):
        last = i == len(ops) - 1
        src = tensors[-1]
        out = g.tensor(f"t{i}", shape)
        if name in ("CONV_2D", "DEPTHWISE_CONV_2D"):
            dw = name == "DEPTHWISE_CONV_2D"
            w = rng.uniform(0.1, 1.0, (1, kernel, kernel, c) if dw else (c, kernel, kernel, c))
            w = w / (w.sum(axis=(0, 1, 2), keepdims=True) if dw else w.sum(axis=(1, 2, 3), keepdims=True))
            bias = rng.uniform(0.0, 0.1, c)
            if not last:
                w, bias = w * perturb, bias * perturb
            extra = {"depth_multiplier": 1} if dw else {}
            g.op(name, [src, g.const(f"w{i}", w.astype(np.float32)),
                        g.const(f"b{i}", bias.astype(np.float32))], [out],
                 padding="SAME", stride_h=1, stride_w=1, **extra)
            e = eps[src] + FP16_HALF_ULP       # weights and bias rounded to f16
        elif name in ("AVERAGE_POOL_2D", "MAX_POOL_2D"):
            g.op(name, [src], [out], padding="SAME", stride_h=1, stride_w=1,
                 filter_height=kernel, filter_width=kernel)
            e = eps[src]
        elif name == "ADD":
            other = tensors[int(rng.integers(0, len(tensors) - 1))] if len(tensors) > 1 else src
            g.op("ADD", [src, other], [out])
            e = max(eps[src], eps[other])
        elif name == "MUL":
            k = rng.uniform(0.5, 1.5, c).astype(np.float32)
            g.op("MUL", [src, g.const(f"k{i}", k)], [out])
            e = eps[src] + FP16_HALF_ULP       # the constant rounded to f16
        else:
            g.op(name, [src], [out])
            e = eps[src]
        eps[out] = e + FP16_OP_SLACK + (0.0 if last else FP16_HALF_ULP)   # stored in f16
        tensors.append(out)
    g.output(tensors[-1])
    return b.finish(), eps[tensors[-1]]


def positive_input(shape, rng, scale):
    # in [0.5, 1] x scale: normal float16 all the way (the smallest mean of a SAME 3x3 window
    # at a corner keeps 4/9 of the weights' 0.1..1 mass: far above 2^-14)
    return (rng.uniform(0.5, 1.0, shape) * scale).astype(np.float32)


def test_the_bound_counts_stores_and_weights():
    # four convs: three intermediates stored, four weight tensors rounded, four ops
    _, rtol = positive_chain(["CONV_2D"] * 4, (1, 4, 4, 2), np.random.default_rng(0))
    assert rtol == pytest.approx(fp16_chain_rtol(3, 4, 4))
    assert rtol < 4e-3


def test_a_conv_chain_in_fp16(fp16_workers):
    """Conv -> conv -> ... : every intermediate is a conv's output read by the next conv, so
    stored in the f16 arena (nothing to fuse); 3 stores + 4 weight roundings: 7 half-ulps."""
    rng = np.random.default_rng(1)
    shape = (1, 5, 5, 3)
    model, rtol = positive_chain(["CONV_2D", "DEPTHWISE_CONV_2D", "CONV_2D", "DEPTHWISE_CONV_2D"],
                                 shape, rng)
    for s in check_delegate(model, fp16_workers, [positive_input(shape, rng, 2.0)],
                            precision="fp16", rtol=rtol).values():
        assert s["partitions"][0]["fused"] == [], s["partitions"]


def test_a_wrong_store_one_percent_off_exceeds_the_bound():
    """A store 1% off, simulated on the reference path (cheap: the real store is inside a Taichi
    kernel): each stored conv output 1% high breaks the bound."""
    from tflite_taichi.interpreter import Interpreter
    from tflite_taichi.testing import assert_float_close
    shape, ops = (1, 5, 5, 3), ["CONV_2D", "DEPTHWISE_CONV_2D", "CONV_2D", "DEPTHWISE_CONV_2D"]
    x = positive_input(shape, np.random.default_rng(2), 2.0)

    def run(model):
        it = Interpreter(model_content=model, backend="reference")
        it.allocate_tensors()
        it.set_tensor(it.get_input_details()[0]["index"], x)
        it.invoke()
        return it.get_tensor(it.get_output_details()[0]["index"])

    model, rtol = positive_chain(ops, shape, np.random.default_rng(1))
    wrong, _ = positive_chain(ops, shape, np.random.default_rng(1), perturb=1.01)
    assert_float_close(run(model), run(positive_chain(ops, shape, np.random.default_rng(1),
                                                      perturb=1 + FP16_HALF_ULP)[0]), rtol)
    with pytest.raises(AssertionError, match="max"):
        assert_float_close(run(wrong), run(model), rtol)


@settings(max_examples=TAICHI_EXAMPLES, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(st.sampled_from(OPS), min_size=4, max_size=8),
       hw=st.tuples(st.integers(1, 5), st.integers(1, 5)), c=st.integers(1, 4),
       kernel=st.sampled_from([1, 3]), log_scale=st.integers(-3, 3), seed=st.integers(0, 2**16))
def test_chains_in_fp16(fp16_workers, ops, hw, c, kernel, log_scale, seed):
    rng = np.random.default_rng(seed)
    shape = (1, *hw, c)
    model, rtol = positive_chain(ops, shape, rng, kernel)
    check_delegate(model, fp16_workers, [positive_input(shape, rng, 2.0 ** log_scale)],
                   precision="fp16", rtol=rtol)
