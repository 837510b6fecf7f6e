"""The delegate's speed paths against the reference, on shapes that take them (the op-family
tests use small shapes, which do not):

- split-K: CONV_2D and FULLY_CONNECTED with few outputs and a long reduction (ops/conv/select.py,
  SPLIT_K_THREADS / SPLIT_K_MIN_TERMS), partial sums in arena scratch;
- split reductions: MEAN / SUM / REDUCE_MAX with few outputs (ops/reduce.py);
- chunked SOFTMAX over long rows (ops/activations.py);
- packed weights: every constant-filter conv here reads its filter laid out by OpDef.pack;
- shared-memory GEMM tiles: pointwise CONV_2D and FULLY_CONNECTED with many outputs, on the archs
  that have block-shared memory (vulkan and opengl here; cpu keeps the register-tiled gather).
  Their own workers run with the tile threshold lowered to TEST_MIN_BLOCKS, so that shapes a
  software rasteriser computes quickly take the tiled kernel.

Float32 within the delegate's usual 1e-5 of the largest magnitude (only the summation order
changes), int8 within 1 unit, fp16 on vulkan (the arena is float16 but the partial results stay
in the float32 scratch buffer).
"""
import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tflite_taichi.ops.conv import (GEMM_CONFIG, GEMM_K, GEMM_MIN_BLOCKS, SMALL_GRID_CONFIG,
                                    SMALL_GRID_MIN_BLOCKS, SPLIT_K_MIN_TERMS, SPLIT_K_THREADS,
                                    gemm_blocks, gemm_choice, pointwise_splits, split_k)
from tflite_taichi import Interpreter
from tflite_taichi.testing import (BackendWorker, Const, Input, Output, TAICHI_EXAMPLES,
                                   check_delegate, check_op, model_inputs, one_op_model,
                                   quantize_array, strategies)

S = strategies()
TILE_M, TILE_N = GEMM_CONFIG[:2]


def test_the_thresholds_split_what_the_fast_paths_are_for():
    assert split_k(1000, 1024) == 16            # a classifier: 16 x 1000 threads of 64 terms
    assert split_k(7 * 7 * 1024, 1024) == 2
    assert split_k(SPLIT_K_THREADS, 4096) == 1  # enough threads already
    assert split_k(10, 2 * SPLIT_K_MIN_TERMS - 1) == 1
    # a pointwise conv counts its threads (4 pixels x 1 channel each): MobileNet's tail splits
    assert pointwise_splits(14 * 14, 512, 512) == 3
    assert pointwise_splits(7 * 7, 1024, 1024) == 5
    assert pointwise_splits(28 * 28, 256, 256) == 2
    assert pointwise_splits(56 * 56, 128, 128) == 1


@st.composite
def long_reduction_conv(draw):
    side = draw(st.integers(1, 7))      # 1x1 ones: PointwiseConvStep, up to 13 pixel tiles
    c_in = draw(st.sampled_from([128, 200, 256, 513]))
    c_out = draw(st.integers(1, 40))
    k = draw(st.sampled_from([1, 3]))
    return side, c_in, c_out, k, draw(st.sampled_from(["NONE", "RELU6"])), draw(S.seeds())


@st.composite
def split_k_conv2d_cases(draw):
    side, c_in, c_out, k, act, seed = draw(long_reduction_conv())

    def conv(activation):
        rng = np.random.default_rng(seed)
        return one_op_model("CONV_2D", [
            Input((1, side, side, c_in)),
            Const(rng.uniform(-1, 1, (c_out, k, k, c_in)).astype(np.float32)),
            Const(rng.uniform(-1, 1, c_out).astype(np.float32))],
            [Output((1, side, side, c_out))], padding="SAME", stride_h=1, stride_w=1,
            fused_activation_function=activation)
    # the sum's rounding (split in another order) is relative to the sums, not to what RELU6
    # leaves of them: the scale is the largest pre-activation value (seen: 6.5e-5 on outputs
    # clamped to 6 from sums up to ~40)
    pre = Interpreter(model_content=conv("NONE"), backend="reference")
    pre.allocate_tensors()
    pre.set_tensor(pre.get_input_details()[0]["index"], model_inputs(conv("NONE"), seed)[0])
    pre.invoke()
    floor = float(np.max(np.abs(pre.get_tensor(pre.get_output_details()[0]["index"]))))
    return conv(act), None, {"seed": seed, "floor": floor}


def test_split_k_conv2d(taichi_workers):
    check_op(split_k_conv2d_cases(), workers=taichi_workers)


@st.composite
def split_k_fully_connected_cases(draw):
    rows = draw(st.integers(1, 3))
    depth = draw(st.sampled_from([128, 300, 1024]))
    units = draw(st.integers(1, 64))
    int8 = draw(st.booleans())
    seed = draw(S.seeds())
    rng = np.random.default_rng(seed)
    w = rng.uniform(-1, 1, (units, depth)).astype(np.float32)
    b = rng.uniform(-1, 1, units).astype(np.float32)
    if int8:
        qx, qw = (0.05, 3), (float(np.abs(w).max()) / 127, 0)
        qo = (float(np.sqrt(depth)) * 0.05 * qw[0] * 127 / 40, -2)
        model = one_op_model("FULLY_CONNECTED", [
            Input((rows, depth), np.int8, qx), Const(quantize_array(w, qw), qw),
            Const(np.round(b / (qx[0] * qw[0])).astype(np.int32), (qx[0] * qw[0], 0))],
            [Output((rows, units), np.int8, qo)])
    else:
        model = one_op_model("FULLY_CONNECTED", [Input((rows, depth)), Const(w), Const(b)],
                             [Output((rows, units))])
    return model, None, {"seed": seed}


def test_split_k_fully_connected(taichi_workers):
    check_op(split_k_fully_connected_cases(), workers=taichi_workers)


@st.composite
def split_reductions_cases(draw):
    op = draw(st.sampled_from(["MEAN", "SUM", "REDUCE_MAX"]))
    side = draw(st.integers(4, 9))
    channels = draw(st.integers(1, 300))
    seed = draw(S.seeds())
    model = one_op_model(op, [Input((1, side, side, channels)), Const(np.array([1, 2], np.int32))],
                         [Output((1, 1, 1, channels))], keep_dims=True)
    return model, None, {"seed": seed}


def test_split_reductions(taichi_workers):
    """A global pool: 16..81 terms per output, few outputs."""
    check_op(split_reductions_cases(), workers=taichi_workers)


@st.composite
def chunked_softmax_cases(draw):
    rows = draw(st.integers(1, 4))
    n = draw(st.integers(64, 1500))
    beta = draw(st.sampled_from([1.0, 0.5, 3.0]))
    seed = draw(S.seeds())
    model = one_op_model("SOFTMAX", [Input((rows, n))], [Output((rows, n))], beta=beta)
    return model, None, {"seed": seed}


def test_chunked_softmax(taichi_workers):
    check_op(chunked_softmax_cases(), workers=taichi_workers)


def test_gemm_tiles_are_taken_by_the_shapes_they_are_for():
    assert gemm_blocks(112 * 112, 64) == 196                  # MobileNet's first pointwise conv
    assert gemm_blocks(14 * 14, 512) < GEMM_MIN_BLOCKS         # measured faster as a gather
    assert gemm_blocks(7 * 7, 1024) < GEMM_MIN_BLOCKS          # its last: split-K's job
    assert gemm_blocks(TILE_M * GEMM_MIN_BLOCKS, 1) == GEMM_MIN_BLOCKS
    assert gemm_blocks(112 * 112 * 32, 64) >= GEMM_MIN_BLOCKS  # ...at batch 32 every one does
    assert gemm_blocks(7 * 7 * 32, 1024) >= GEMM_MIN_BLOCKS


def test_gemm_tile_shapes_follow_the_arch_and_the_class():
    for arch in ("cuda", "vulkan", "opengl"):
        assert gemm_choice(14 * 14, 512, 512, arch) is None                 # batch 1: the gather
        assert gemm_choice(112 * 112 * 32, 64, 32, arch) == GEMM_CONFIG     # batch 32: 64x64 tiles
    # PoseNet's 17x17 1024->1024 and DeepLab's 33x33x256: 32x32 tiles on vulkan only (measured
    # faster there, slower on cuda: ops/conv/select.py SMALL_GRID_CONFIG)
    assert gemm_choice(17 * 17, 1024, 1024, "vulkan") == SMALL_GRID_CONFIG
    assert gemm_choice(33 * 33, 256, 256, "vulkan") == SMALL_GRID_CONFIG
    for arch in ("cuda", "opengl", "x64"):
        assert gemm_choice(17 * 17, 1024, 1024, arch) is None
    assert gemm_choice(17 * 17, 1024, GEMM_K - 1, "vulkan") is None         # too short to stage


TEST_MIN_BLOCKS = 8


@pytest.fixture(scope="module")
def gemm_workers(taichi_workers):
    """Workers of the shared-memory backends under test, started with the tile threshold
    lowered (the variable is read when a step is built, in the worker)."""
    backends = [w.backend for w in taichi_workers if w.backend != "cpu"]
    if not backends:
        pytest.skip("no backend with shared memory among TFLITE_TAICHI_TEST_BACKENDS")
    saved = os.environ.get("TFLITE_TAICHI_GEMM_MIN_BLOCKS")
    os.environ["TFLITE_TAICHI_GEMM_MIN_BLOCKS"] = str(TEST_MIN_BLOCKS)
    workers = []
    try:
        workers = [BackendWorker(b) for b in backends]
    finally:
        if saved is None:
            del os.environ["TFLITE_TAICHI_GEMM_MIN_BLOCKS"]
        else:
            os.environ["TFLITE_TAICHI_GEMM_MIN_BLOCKS"] = saved
    yield workers
    for w in workers:
        w.close()


@st.composite
def gemm_shapes(draw, tile_m=TILE_M, tile_n=TILE_N, min_blocks=TEST_MIN_BLOCKS):
    """Pixels x output channels with at least `min_blocks` tiles of tile_m x tile_n, ragged
    edges in every dimension (pixels, channels and the reduction not multiples of the tile
    sizes)."""
    c_out = draw(st.integers(1, 3 * tile_n + 5))
    col_blocks = -(-c_out // tile_n)
    row_blocks = -(-min_blocks // col_blocks) + draw(st.integers(0, 3))
    pixels = row_blocks * tile_m - draw(st.integers(0, tile_m - 1))
    c_in = draw(st.sampled_from([GEMM_K, GEMM_K + 3, 40, 67]))
    return pixels, c_in, c_out


@st.composite
def small_grid_shapes(draw):
    """Shapes of the small-grid class: SMALL_GRID_MIN_BLOCKS 32x32 tiles or more, which vulkan
    runs as 32x32 tiles at the default thresholds (asserted, so the test reaches the kernel)."""
    pixels, c_in, c_out = draw(gemm_shapes(*SMALL_GRID_CONFIG[:2], SMALL_GRID_MIN_BLOCKS))
    assert gemm_choice(pixels, c_out, c_in, "vulkan") == SMALL_GRID_CONFIG
    return pixels, c_in, c_out


@st.composite
def gemm_tiles_cases(draw, shapes=None):
    shape = draw(shapes if shapes is not None else gemm_shapes())
    op = draw(st.sampled_from(["CONV_2D", "FULLY_CONNECTED"]))
    act = draw(st.sampled_from(["NONE", "RELU6"]))
    bias = draw(st.booleans())
    int8 = draw(st.booleans())
    seed = draw(S.seeds())
    pixels, c_in, c_out = shape
    rng = np.random.default_rng(seed)
    w = rng.uniform(-1, 1, (c_out, c_in)).astype(np.float32)
    b = rng.uniform(-1, 1, c_out).astype(np.float32)
    x_shape, w_shape, out_shape = (((1, pixels, 1, c_in), (c_out, 1, 1, c_in), (1, pixels, 1, c_out))
                                   if op == "CONV_2D" else ((pixels, c_in), (c_out, c_in), (pixels, c_out)))
    options = dict(padding="VALID", stride_h=1, stride_w=1) if op == "CONV_2D" else {}
    if int8:
        qx, qw = (0.02, -5), (float(np.abs(w).max()) / 127, 0)
        qo = (float(np.sqrt(c_in)) * 0.02 * 127 * qw[0] / 30, 4)
        inputs = [Input(x_shape, np.int8, qx), Const(quantize_array(w, qw).reshape(w_shape), qw)]
        bias_const = Const(np.round(b / (qx[0] * qw[0])).astype(np.int32), (qx[0] * qw[0], 0))
        out = Output(out_shape, np.int8, qo)
    else:
        inputs = [Input(x_shape), Const(w.reshape(w_shape))]
        bias_const, out = Const(b), Output(out_shape)
    if bias or op == "CONV_2D":             # LiteRT's CONV_2D needs a bias; FC's is optional
        inputs.append(bias_const)
    model = one_op_model(op, inputs, [out], fused_activation_function=act, **options)
    return model, None, {"seed": seed}


def test_gemm_tiles(gemm_workers):
    check_op(gemm_tiles_cases(), workers=gemm_workers)


def test_gemm_small_grid_tiles_on_vulkan(vulkan_workers):
    check_op(gemm_tiles_cases(small_grid_shapes()), workers=vulkan_workers)


def test_fast_paths_in_fp16_keep_float32_partials(vulkan_workers):
    rng = np.random.default_rng(0)
    for model in (
        one_op_model("SOFTMAX", [Input((1, 1000))], [Output((1, 1000))], beta=1.0),
        one_op_model("FULLY_CONNECTED", [Input((1, 512)), Const(rng.uniform(-1, 1, (10, 512)).astype(np.float32))],
                     [Output((1, 10))]),
    ):
        check_delegate(model, vulkan_workers, precision="fp16")


def test_gemm_tiles_in_fp16(gemm_workers):
    rng = np.random.default_rng(0)
    model = one_op_model("FULLY_CONNECTED", [Input((TILE_M * TEST_MIN_BLOCKS, 40)),
                                             Const(rng.uniform(-1, 1, (50, 40)).astype(np.float32))],
                         [Output((TILE_M * TEST_MIN_BLOCKS, 50))])
    vulkan = [w for w in gemm_workers if w.backend == "vulkan"]
    if not vulkan:
        pytest.skip("vulkan is not among TFLITE_TAICHI_TEST_BACKENDS")
    check_delegate(model, vulkan, precision="fp16")


# -- epilogue fusion: an ADD of a residual into its producer's store ---------------------------
def _residual_model(producer, act_conv, act_add, residual_first, also_output, rng):
    """x -> PRODUCER -> t; out = ADD(t, x) (or ADD(x, t)); t also a model output if asked."""
    from tflite_taichi.builder import ModelBuilder
    b = ModelBuilder()
    g = b.subgraph()
    x = g.input("x", (1, 5, 5, 8))
    t = g.tensor("t", (1, 5, 5, 8))
    if producer == "CONV_2D":
        g.op("CONV_2D", [x, g.const("w", rng.uniform(-1, 1, (8, 3, 3, 8)).astype(np.float32)),
                         g.const("b", rng.uniform(-1, 1, 8).astype(np.float32))], [t],
             padding="SAME", stride_h=1, stride_w=1, fused_activation_function=act_conv)
    else:
        g.op("DEPTHWISE_CONV_2D", [x, g.const("w", rng.uniform(-1, 1, (1, 3, 3, 8)).astype(np.float32)),
                                   g.const("b", rng.uniform(-1, 1, 8).astype(np.float32))], [t],
             padding="SAME", stride_h=1, stride_w=1, depth_multiplier=1,
             fused_activation_function=act_conv)
    out = g.tensor("out", (1, 5, 5, 8))
    g.op("ADD", [x, t] if residual_first else [t, x], [out], fused_activation_function=act_add)
    g.output(out, *([t] if also_output else []))
    return b.finish()


@settings(max_examples=TAICHI_EXAMPLES)
@given(producer=st.sampled_from(["CONV_2D", "DEPTHWISE_CONV_2D"]), act_conv=S.activations(),
       act_add=S.activations(), residual_first=st.booleans(), also_output=st.booleans(),
       seed=S.seeds())
def test_residual_add_fused_into_its_producer(taichi_workers, producer, act_conv, act_add,
                                              residual_first, also_output, seed):
    model = _residual_model(producer, act_conv, act_add, residual_first, also_output,
                            np.random.default_rng(seed))
    for backend, s in check_delegate(model, taichi_workers, seed=seed).items():
        # fused unless the producer's own output is needed (a model output here)
        expected = [] if also_output else [[0, 1]]
        assert s["partitions"][0]["fused"] == expected, (backend, s["partitions"])


def test_quantized_residual_add_is_fused_and_snaps_first(taichi_workers):
    """An int8 ADD reads its producer's output on that tensor's grid: fused into the conv's
    store (kit.EpilogueRef), the value is snapped to it before the ADD, as storing it would
    have done. The grids make a missed snap visible: t's step 0.5 against the output's 0.07,
    so skipping it moves the sum by up to 3.5 output units (the check allows 1)."""
    from tflite_taichi.builder import ModelBuilder
    rng = np.random.default_rng(0)
    b = ModelBuilder()
    g = b.subgraph()
    x = g.input("x", (1, 4, 4, 4), np.int8, (0.01, 0))
    t = g.tensor("t", (1, 4, 4, 4), np.int8, (0.5, 0))
    g.op("CONV_2D", [x, g.const("w", rng.integers(-127, 128, (4, 1, 1, 4)).astype(np.int8), quantization=(0.01, 0)),
                     g.const("b", np.zeros(4, np.int32), quantization=(0.0001, 0))], [t],
         padding="SAME", stride_h=1, stride_w=1)
    out = g.tensor("out", (1, 4, 4, 4), np.int8, (0.07, 0))
    g.op("ADD", [t, x], [out])
    g.output(out)
    for backend, s in check_delegate(b.finish(), taichi_workers).items():
        assert s["partitions"][0]["fused"] == [[0, 1]], (backend, s["partitions"])
