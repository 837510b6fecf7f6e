"""Cases for the convolutions, FULLY_CONNECTED and the pools: the LiteRT tests' case
generators, options and int8 weight/bias/scale helpers, dyadic data (used by test_ops_conv.py
and the quantized tests), and the delegate's case table's rows: one strategy of check_op cases
per op and dtype, its models built from those generators (test_taichi_conv.py)."""
import struct
import numpy as np
from hypothesis import strategies as st
from tflite_taichi.builder import ModelBuilder
from tflite_taichi.testing import Const, Input, Output, one_op_model, strategies
from cases.pooling import pool_case
from cases.table import Row


S = strategies()


PADDINGS = st.sampled_from(["SAME", "VALID"])


def _dyadic(rng, shape, bound):
    """Multiples of 1/8 in [-bound, bound], as float32 (exact sums in any order)."""
    return (rng.integers(-8 * bound, 8 * bound + 1, shape) / 8).astype(np.float32)


def _out_size(padding, size, k, stride, dilation=1):
    eff = (k - 1) * dilation + 1
    return -(-size // stride) if padding == "SAME" else (size - eff) // stride + 1


@st.composite
def window(draw, max_k=4, max_dilation=3, max_side=10, dilation=True):
    """(padding, (h, w), (kh, kw), (sh, sw), (dh, dw)) with the window fitting a VALID input."""
    padding = draw(PADDINGS)
    k = (draw(st.integers(1, max_k)), draw(st.integers(1, max_k)))
    s = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    d = ((draw(st.integers(1, max_dilation)), draw(st.integers(1, max_dilation)))
         if dilation else (1, 1))
    size = []
    for kk, dd in zip(k, d):
        lo = (kk - 1) * dd + 1 if padding == "VALID" else 1
        size.append(draw(st.integers(lo, max(lo, max_side))))
    return padding, tuple(size), k, s, d


def _conv_options(padding, s, d, act):
    return dict(padding=padding, stride_h=s[0], stride_w=s[1], dilation_h_factor=d[0],
                dilation_w_factor=d[1], fused_activation_function=act)


def _int8_output_scale(draw, in_scale, filter_scale, taps):
    """An output scale that keeps a typical int8 accumulation inside the int8 range, times a
    random factor so some cases saturate and some are coarse."""
    spread = 74.0 * in_scale * 74.0 * float(np.max(filter_scale)) * np.sqrt(taps)
    factor = draw(S.scales(0.25, 4.0))
    return float(np.float32(max(6.0 * spread / 256.0 * factor, 1e-6)))


def _int8_filter(draw, rng, shape, channel_dim):
    """int8 filter data and its symmetric quantization: per-channel along `channel_dim`, or
    per-tensor. Returns (data, quantization, scales: one per output channel or one)."""
    data = rng.integers(-127, 128, shape).astype(np.int8)
    channels = shape[channel_dim]
    if draw(st.booleans()):
        scales = np.array([draw(S.scales(1e-3, 0.05)) for _ in range(channels)], np.float32)
        return data, (scales, np.zeros(channels, np.int64), channel_dim), scales
    scale = draw(S.scales(1e-3, 0.05))
    return data, (scale, 0), np.array([scale], np.float32)


def _int8_bias(rng, in_scale, filter_scales, channels, present=True):
    """int32 bias with scale input_scale * filter_scale, per-channel when the filter is (LiteRT
    reads a per-tensor filter's bias scale from a single-scale quantization only)."""
    if not present:
        return None
    scales = (np.float32(in_scale) * filter_scales).astype(np.float32)
    data = rng.integers(-2000, 2001, channels).astype(np.int32)
    return Const(data, (scales, np.zeros(scales.size, np.int64), 0))


# -- CONV_2D ------------------------------------------------------------------------------------
@st.composite
def conv_case(draw):
    padding, (h, w), k, s, d = draw(window())
    groups = draw(st.sampled_from([1, 1, 2, 3]))
    c_f = draw(st.integers(1, 8 // groups))
    c_out = groups * draw(st.integers(1, 6 // groups if groups > 1 else 6))
    n = draw(st.integers(1, 2))
    act = draw(S.activations())
    return dict(padding=padding, in_shape=(n, h, w, groups * c_f), k=k, s=s, d=d,
                c_f=c_f, c_out=c_out, act=act,
                out_shape=(n, _out_size(padding, h, k[0], s[0], d[0]),
                           _out_size(padding, w, k[1], s[1], d[1]), c_out))


# -- DEPTHWISE_CONV_2D ---------------------------------------------------------------------------
@st.composite
def depthwise_case(draw):
    padding, (h, w), k, s, d = draw(window())
    c_in = draw(st.integers(1, 4))
    mult = draw(st.integers(1, 8 // c_in))
    n = draw(st.integers(1, 2))
    return dict(padding=padding, in_shape=(n, h, w, c_in), k=k, s=s, d=d, mult=mult,
                c_out=c_in * mult, act=draw(S.activations()),
                out_shape=(n, _out_size(padding, h, k[0], s[0], d[0]),
                           _out_size(padding, w, k[1], s[1], d[1]), c_in * mult))


def _depthwise_options(c):
    return dict(_conv_options(c["padding"], c["s"], c["d"], c["act"]), depth_multiplier=c["mult"])


# -- TRANSPOSE_CONV ------------------------------------------------------------------------------
@st.composite
def transpose_conv_case(draw):
    padding, (oh, ow), k, s, _ = draw(window(max_k=4, dilation=False, max_side=12))
    c_in, c_out, n = draw(st.integers(1, 6)), draw(st.integers(1, 6)), draw(st.integers(1, 2))
    in_h, in_w = _out_size(padding, oh, k[0], s[0]), _out_size(padding, ow, k[1], s[1])
    return dict(padding=padding, in_shape=(n, in_h, in_w, c_in), k=k, s=s, c_out=c_out,
                out_shape=(n, oh, ow, c_out), act=draw(S.activations()),
                bias=draw(st.booleans()))


def _transpose_conv_model(c, inputs, out, version):
    opts = dict(padding=c["padding"], stride_h=c["s"][0], stride_w=c["s"][1])
    if version >= 4:
        opts["fused_activation_function"] = c["act"]
    return one_op_model("TRANSPOSE_CONV", [Const(np.array(c["out_shape"], np.int32))] + inputs,
                        [out], version=version, **opts)


# -- FULLY_CONNECTED -----------------------------------------------------------------------------
@st.composite
def fully_connected_case(draw):
    keep = draw(st.booleans())
    in_shape = draw(S.shapes(1, 4, 1, 5))
    if keep or draw(st.booleans()):
        depth = in_shape[-1]
    else:          # rows of `depth` across the flattened input
        size = int(np.prod(in_shape))
        depth = draw(st.sampled_from([d for d in range(1, size + 1) if size % d == 0 and d <= 16]))
    units = draw(st.integers(1, 8))
    size = int(np.prod(in_shape))
    out_shape = in_shape[:-1] + (units,) if keep else (size // depth, units)
    return dict(in_shape=in_shape, depth=depth, units=units, keep=keep, out_shape=out_shape,
                act=draw(S.activations()), bias=draw(st.booleans()))


TFLITE_PADDING = {"SAME": 1, "VALID": 2}


def _tcb_options(padding, s, extra=b""):
    return struct.pack("<iii", TFLITE_PADDING[padding], s[1], s[0]) + extra


def _tcb_out_size(padding, size, k, stride):
    """MediaPipe's Prepare: out = s * (in - 1) + k - total padding."""
    pad = max(0, k - (size - 1) % stride - 1) if padding == "SAME" else 0
    return stride * (size - 1) + k - pad, pad // 2


@st.composite
def tcb_case(draw, stride_within_kernel=True):
    """XNNPACK refuses strides larger than the kernel; MediaPipe's kernel takes them."""
    padding = draw(PADDINGS)
    k = (draw(st.integers(1, 5)), draw(st.integers(1, 5)))
    s = tuple(draw(st.integers(1, kk if stride_within_kernel else 4)) for kk in k)
    n, c_in, c_out = draw(st.integers(1, 2)), draw(st.integers(1, 6)), draw(st.integers(1, 6))
    in_shape = (n, draw(st.integers(1, 8)), draw(st.integers(1, 8)), c_in)
    out_shape = (n, _tcb_out_size(padding, in_shape[1], k[0], s[0])[0],
                 _tcb_out_size(padding, in_shape[2], k[1], s[1])[0], c_out)
    return dict(padding=padding, k=k, s=s, in_shape=in_shape, out_shape=out_shape,
                c_out=c_out)


def big_conv() -> bytes:
    """One 3x3 CONV_2D of [1, 128, 128, 16] -> 16 channels, random weights: enough work that
    numpy (BLAS) beats Taichi's cpu kernel on it (auto's cost policy, costs.py)."""
    rng = np.random.default_rng(1)
    b = ModelBuilder()
    g = b.subgraph()
    x = g.input("x", (1, 128, 128, 16))
    y = g.tensor("y", (1, 128, 128, 16))
    g.op("CONV_2D", [x, g.const("w", rng.uniform(-1, 1, (16, 3, 3, 16)).astype(np.float32)),
                     g.const("b", np.zeros(16, np.float32))], [y], padding="SAME", stride_h=1,
         stride_w=1)
    g.output(y)
    return b.finish()


# -- the delegate's case table ----------------------------------------------------------------
# Float data are multiples of 1/8 (_dyadic): sums are then exact in float32 whatever the order,
# as the reference and the kernels sum differently. Tolerances are check_delegate's for every
# row: TAICHI_RTOL; an int8 output within one quantization unit.
POOLS = ["AVERAGE_POOL_2D", "MAX_POOL_2D"]         # float32 and int8
FLOAT_POOLS = POOLS + ["L2_POOL_2D"]               # L2_POOL_2D: float32 only, as LiteRT


def _f32_inputs(rng, model_shapes):
    return [_dyadic(rng, shape, 3) for shape in model_shapes]


def _conv_model(c, rng, int8=None):
    """int8: None for float32, else (draw, input quantization)."""
    if int8 is None:
        return one_op_model("CONV_2D", [Input(c["in_shape"]),
                                        Const(_dyadic(rng, (c["c_out"], *c["k"], c["c_f"]), 1)),
                                        Const(_dyadic(rng, c["c_out"], 1))],
                            [Output(c["out_shape"])],
                            **_conv_options(c["padding"], c["s"], c["d"], c["act"]))
    draw, qi = int8
    filt, fq, fscales = _int8_filter(draw, rng, (c["c_out"], *c["k"], c["c_f"]), 0)
    qo = (_int8_output_scale(draw, qi[0], fscales, c["k"][0] * c["k"][1] * c["c_f"]),
          draw(st.integers(-128, 127)))
    return one_op_model("CONV_2D", [Input(c["in_shape"], np.int8, qi), Const(filt, fq),
                                    _int8_bias(rng, qi[0], fscales, c["c_out"])],
                        [Output(c["out_shape"], np.int8, qo)],
                        **_conv_options(c["padding"], c["s"], c["d"], c["act"]))


def _depthwise_model(c, rng, int8=None):
    if int8 is None:
        return one_op_model("DEPTHWISE_CONV_2D",
                            [Input(c["in_shape"]), Const(_dyadic(rng, (1, *c["k"], c["c_out"]), 1)),
                             Const(_dyadic(rng, c["c_out"], 1))],
                            [Output(c["out_shape"])], version=2, **_depthwise_options(c))
    draw, qi = int8
    filt, fq, fscales = _int8_filter(draw, rng, (1, *c["k"], c["c_out"]), 3)
    qo = (_int8_output_scale(draw, qi[0], fscales, c["k"][0] * c["k"][1]),
          draw(st.integers(-128, 127)))
    return one_op_model("DEPTHWISE_CONV_2D",
                        [Input(c["in_shape"], np.int8, qi), Const(filt, fq),
                         _int8_bias(rng, qi[0], fscales, c["c_out"])],
                        [Output(c["out_shape"], np.int8, qo)], version=3,
                        **_depthwise_options(c))


def _tconv_model(c, rng, int8=None):
    w_shape = (c["c_out"], *c["k"], c["in_shape"][3])
    if int8 is None:
        inputs = [Const(_dyadic(rng, w_shape, 1)), Input(c["in_shape"])]
        if c["bias"]:
            inputs.append(Const(_dyadic(rng, c["c_out"], 1)))
        return _transpose_conv_model(c, inputs, Output(c["out_shape"]), 4)
    draw, qi = int8
    weights, wq, wscales = _int8_filter(draw, rng, w_shape, 0)
    taps = -(-c["k"][0] // c["s"][0]) * -(-c["k"][1] // c["s"][1]) * c["in_shape"][3]
    qo = (_int8_output_scale(draw, qi[0], wscales, taps), draw(st.integers(-128, 127)))
    inputs = [Const(weights, wq), Input(c["in_shape"], np.int8, qi)]
    if c["bias"]:
        inputs.append(_int8_bias(rng, qi[0], wscales, c["c_out"]))
    return _transpose_conv_model(c, inputs, Output(c["out_shape"], np.int8, qo), 4)


def _fc_options(c):
    return dict(keep_num_dims=c["keep"], fused_activation_function=c["act"])


def _tcb_model(c, rng):
    return one_op_model("CUSTOM:Convolution2DTransposeBias",
                        [Input(c["in_shape"]),
                         Const(_dyadic(rng, (c["c_out"], *c["k"], c["in_shape"][3]), 1)),
                         Const(_dyadic(rng, c["c_out"], 1))],
                        [Output(c["out_shape"])], custom_options=_tcb_options(c["padding"], c["s"]))


# -- check_op's strategies: float32 and int8 ---------------------------------------------------
@st.composite
def float32_cases(draw, case, make):
    """`make(case, rng)`'s model for a drawn case, its input dyadic (exact sums in any order)."""
    c, rng = draw(case), np.random.default_rng(draw(S.seeds()))
    return make(c, rng), _f32_inputs(rng, [c["in_shape"]])


@st.composite
def int8_cases(draw, case, make):
    """`make(case, rng, (draw, qi))`'s int8 model for a drawn case: filters, output scale and
    zero point drawn inside; inputs seeded from the model."""
    c, qi, seed = draw(case), draw(S.quant_params()), draw(S.seeds())
    return make(c, np.random.default_rng(seed), (draw, qi)), None, {"seed": seed}


@st.composite
def fully_connected_float32_cases(draw):
    """Constant weights (in the weights buffer) or weights and bias given at run time."""
    c, const_weights = draw(fully_connected_case()), draw(st.booleans())
    rng = np.random.default_rng(draw(S.seeds()))
    weights = _dyadic(rng, (c["units"], c["depth"]), 1)
    bias = _dyadic(rng, c["units"], 1)
    x = _dyadic(rng, c["in_shape"], 3)
    if const_weights:
        ins, feeds = [Input(c["in_shape"]), Const(weights), Const(bias) if c["bias"] else None], [x]
    else:
        extra = [Input(bias.shape)] if c["bias"] else []
        ins, feeds = [Input(c["in_shape"]), Input(weights.shape)] + extra, [x, weights]
        feeds += [bias] if c["bias"] else []
    return one_op_model("FULLY_CONNECTED", ins, [Output(c["out_shape"])], **_fc_options(c)), feeds


@st.composite
def fully_connected_int8_cases(draw):
    c, qi, seed = draw(fully_connected_case()), draw(S.quant_params()), draw(S.seeds())
    rng = np.random.default_rng(seed)
    weights, wq, wscales = _int8_filter(draw, rng, (c["units"], c["depth"]), 0)
    qo = (_int8_output_scale(draw, qi[0], wscales, c["depth"]), draw(st.integers(-128, 127)))
    model = one_op_model("FULLY_CONNECTED",
                         [Input(c["in_shape"], np.int8, qi), Const(weights, wq),
                          _int8_bias(rng, qi[0], wscales, c["units"], c["bias"])],
                         [Output(c["out_shape"], np.int8, qo)], **_fc_options(c))
    return model, None, {"seed": seed}


@st.composite
def pool_float32_cases(draw, op):
    case = draw(pool_case())
    model = one_op_model(op, [Input(case["in_shape"])], [Output(case["out_shape"])],
                         **case["options"])
    return model, _f32_inputs(np.random.default_rng(draw(S.seeds())), [case["in_shape"]])


@st.composite
def pool_int8_cases(draw, op):
    """One quantization for input and output (as converters write it), or two: the float
    view handles both."""
    case, qi, qo, same = draw(pool_case()), draw(S.quant_params()), draw(S.quant_params()), draw(
        st.booleans())
    model = one_op_model(op, [Input(case["in_shape"], np.int8, qi)],
                         [Output(case["out_shape"], np.int8, qi if same else qo)],
                         **case["options"])
    return model, None, {"seed": draw(S.seeds())}


CONV_ROWS = [
    Row("CONV_2D-float32", float32_cases(conv_case(), _conv_model), "grouped too, dilations"),
    Row("CONV_2D-int8", int8_cases(conv_case(), _conv_model), "per-channel or per-tensor filters"),
    Row("DEPTHWISE_CONV_2D-float32", float32_cases(depthwise_case(), _depthwise_model)),
    Row("DEPTHWISE_CONV_2D-int8", int8_cases(depthwise_case(), _depthwise_model)),
    Row("TRANSPOSE_CONV-float32", float32_cases(transpose_conv_case(), _tconv_model),
        "with and without bias"),
    Row("TRANSPOSE_CONV-int8", int8_cases(transpose_conv_case(), _tconv_model)),
    Row("FULLY_CONNECTED-float32", fully_connected_float32_cases(),
        "constant weights, or weights and bias at run time"),
    Row("FULLY_CONNECTED-int8", fully_connected_int8_cases()),
    Row("Convolution2DTransposeBias-float32",
        float32_cases(tcb_case(stride_within_kernel=False), _tcb_model)),
] + [Row(f"{op}-float32", pool_float32_cases(op)) for op in FLOAT_POOLS] + [
    Row(f"{op}-int8", pool_int8_cases(op), "one grid for input and output, or two")
    for op in POOLS]
