"""Quantization-aware-trained / full-integer models with float (or uint8) IO: what the converter
leaves after folding the fake-quant ops. Two shapes of model, built with ModelBuilder, random
scales, zero points and shapes:

  A  float32 x -> QUANTIZE (int8) -> CONV_2D (int8, per-channel or per-tensor filter, int32 bias)
     -> ADD (the conv output + the quantized input) -> AVERAGE_POOL_2D -> QUANTIZE (int8 -> int8,
     new scale and zero point) -> QUANTIZE (int8 -> uint8) -> QUANTIZE (uint8 -> int8) ->
     DEQUANTIZE -> float32 y
  B  uint8 x -> QUANTIZE (uint8 -> int8, zero point - 128: exact) -> DEPTHWISE_CONV_2D (int8)
     -> MAX_POOL_2D -> QUANTIZE (int8 -> uint8, new scale and zero point) -> uint8 y

so QUANTIZE/DEQUANTIZE sit at the model boundary and requantizing QUANTIZEs inside the
partition. The reference path is held to LiteRT's integer reference kernels on EVERY quantized
tensor (experimental_preserve_all_tensors on both sides), and the delegate (every op in one
partition) to the reference on every tensor too.

THE BOUND (units of each tensor's own scale). One op fed identical inputs lands within
QUANT_UNITS = 1 unit of LiteRT's integer kernel (each op's own test holds it to that). Fed inputs
that differ by d_i units (of input i's scale s_i), our float-view op's pre-rounding value moves by
at most G = sum_i L_i * (s_i / s_out) * d_i output units, L_i the op's Lipschitz constant in the
max norm (ADD, AVERAGE_POOL_2D, MAX_POOL_2D, QUANTIZE: 1 per input; CONV_2D: the largest
sum over a filter of |w|), and clamping and fused activations do not increase a difference.
Two reals G apart round to integers at most ceil(G) apart, so

    allowed(out) = QUANT_UNITS + ceil(G * (1 + 1e-5))

(the 1e-5 covers float32 rounding of G's inputs: an exact integer G may round either way).
Exact ops: QUANTIZE of a float32 model input (both compute round(x / s) + zp in float32:
allowed 0, see tests/test_ops_quantize.py) and uint8 <-> int8 with one scale and zero points 128
apart (a shift: allowed = the input's). DEQUANTIZE: |y - y'| <= allowed(input) * s_input, plus
1e-6 of it for the float32 product.
The delegate vs the reference: the same rule with the exact ops also at QUANT_UNITS = 1, as
another summation order (or a GPU's division) may move a value on a rounding boundary to the
other neighbour.
Measured vs LiteRT over 500 cases each (HYPOTHESIS_PROFILE=thorough), worst difference per
tensor in units (allowed, smallest..largest over the cases):
  A: a 0 (0), c 1 (1), s 2 (2..3), p 1 (4..5), r 2 (4..12), u 4 (4..26), v 4, y 4 (4..26);
  B: a 0 (0), d 1 (1), p 1 (3), y 2 (3..8).
The allowance grows through requantizations to finer scales (gain s_in / s_out up to 2 each).
"""
import math

import numpy as np
from hypothesis import given, settings, strategies as st

from cases.conv import _int8_filter, _int8_output_scale
from tflite_taichi.builder import ModelBuilder
from tflite_taichi.testing import QUANT_UNITS, TAICHI_EXAMPLES, strategies

S = strategies()
SLACK = 1e-5


def _scale(draw, base, lo=0.5, hi=2.0):
    return float(np.float32(base * draw(S.scales(lo, hi))))


class Graph:
    """ModelBuilder plus, per quantized tensor, how its allowed difference follows from its
    inputs': (kind, [(input name, gain L * s_in / s_out)])."""

    def __init__(self):
        self.b = ModelBuilder()
        self.g = self.b.subgraph()
        self.idx, self.quant, self.rule, self.shapes = {}, {}, {}, {}

    def __repr__(self):          # what hypothesis prints for a failing case
        return "Graph(" + ", ".join(f"{n}: {self.shapes.get(n)} {self.quant[n]}"
                                    for n in self.idx) + ")"

    def input(self, name, shape, dtype=np.float32, q=None):
        self.shapes[name] = tuple(shape)
        self.idx[name] = self.g.input(name, shape, dtype, q)
        self.quant[name] = q
        self.rule[name] = ("input", [])

    def op(self, op, ins, name, shape, dtype, q, rule, **options):
        """An op reading `ins` (names of tensors, or indices of constants) into a new tensor."""
        self.shapes[name] = tuple(shape)
        self.idx[name] = self.g.tensor(name, shape, dtype, q)
        self.quant[name] = q
        self.rule[name] = rule
        self.g.op(op, [self.idx[i] if isinstance(i, str) else i for i in ins], [self.idx[name]],
                  **options)

    def gain_of(self, src, q_src, q_dst, lipschitz=1.0):
        """(src, L * s_src / s_dst): how a difference in src moves the output, in its units."""
        return (src, lipschitz * q_src[0] / q_dst[0])

    def finish(self, outputs):
        self.g.output(*[self.idx[o] for o in outputs])
        self.model = self.b.finish()

    def allowed(self, exact_units):
        """Allowed difference per quantized tensor, in its own units. exact_units: what an
        'exact' op (float QUANTIZE at the boundary, same-scale uint8 <-> int8) may differ by."""
        out = {}
        for name, (kind, ins) in self.rule.items():       # insertion order = topological
            if kind == "input":
                out[name] = 0
            elif kind == "exact":
                out[name] = exact_units + sum(out[i] for i, _ in ins)
            elif kind == "float":
                out[name] = out[ins[0][0]]                 # DEQUANTIZE: the input's units
            else:
                g = sum(gain * out[i] for i, gain in ins)
                out[name] = QUANT_UNITS + math.ceil(g * (1 + SLACK))
        return out


# -- model A ----------------------------------------------------------------------------------
@st.composite
def model_a(draw):
    rng = np.random.default_rng(draw(S.seeds()))
    n, h, w, c = (draw(st.integers(1, 2)), draw(st.integers(2, 8)), draw(st.integers(2, 8)),
                  draw(st.integers(1, 4)))
    k = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    qa = draw(S.quant_params())
    filt, fq, fscales = _int8_filter(draw, rng, (c, *k, c), 0)
    qc = (_int8_output_scale(draw, qa[0], fscales, k[0] * k[1] * c), draw(st.integers(-128, 127)))
    qs = (_scale(draw, qa[0] + qc[0]), draw(st.integers(-128, 127)))
    qr = (_scale(draw, qs[0]), draw(st.integers(-128, 127)))
    qu = (_scale(draw, qr[0]), draw(st.integers(0, 255)))
    qv = (qu[0], qu[1] - 128) if draw(st.booleans()) else (_scale(draw, qu[0]),
                                                         draw(st.integers(-128, 127)))
    fh, fw = draw(st.integers(1, h)), draw(st.integers(1, w))
    sh, sw = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    pool_pad = draw(st.sampled_from(["SAME", "VALID"]))
    ph, pw = ((-(-h // sh), -(-w // sw)) if pool_pad == "SAME"
              else ((h - fh) // sh + 1, (w - fw) // sw + 1))
    act = draw(st.sampled_from(["NONE", "RELU", "RELU6"]))

    m = Graph()
    m.input("x", (n, h, w, c))
    m.op("QUANTIZE", ["x"], "a", (n, h, w, c), np.int8, qa, ("exact", []))
    bias_scales = (np.float32(qa[0]) * fscales).astype(np.float32)
    bias = m.g.const("bias", rng.integers(-2000, 2001, c).astype(np.int32),
                     quantization=(bias_scales, np.zeros(bias_scales.size, np.int64), 0))
    real = filt.astype(np.float64) * fscales.reshape(-1, 1, 1, 1)
    lip = float(np.abs(real).reshape(c, -1).sum(axis=1).max())     # largest sum of |w|
    m.op("CONV_2D", ["a", m.g.const("filter", filt, quantization=fq), bias], "c", (n, h, w, c),
         np.int8, qc, ("op", [m.gain_of("a", qa, qc, lip)]), padding="SAME", stride_h=1,
         stride_w=1, fused_activation_function=act)
    m.op("ADD", ["c", "a"], "s", (n, h, w, c), np.int8, qs,
         ("op", [m.gain_of("c", qc, qs), m.gain_of("a", qa, qs)]), fused_activation_function="NONE")
    m.op("AVERAGE_POOL_2D", ["s"], "p", (n, ph, pw, c), np.int8, qs, ("op", [("s", 1.0)]),
         padding=pool_pad, filter_height=fh, filter_width=fw, stride_h=sh, stride_w=sw)
    m.op("QUANTIZE", ["p"], "r", (n, ph, pw, c), np.int8, qr, ("op", [m.gain_of("p", qs, qr)]))
    m.op("QUANTIZE", ["r"], "u", (n, ph, pw, c), np.uint8, qu, ("op", [m.gain_of("r", qr, qu)]))
    shift = qv == (qu[0], qu[1] - 128)
    m.op("QUANTIZE", ["u"], "v", (n, ph, pw, c), np.int8, qv,
         ("exact", [("u", 1.0)]) if shift else ("op", [m.gain_of("u", qu, qv)]))
    m.op("DEQUANTIZE", ["v"], "y", (n, ph, pw, c), np.float32, None, ("float", [("v", 1.0)]))
    m.finish(["y"])
    lo, hi = (-128 - qa[1]) * qa[0], (127 - qa[1]) * qa[0]
    pad = 0.1 * (hi - lo)
    x = rng.uniform(lo - pad, hi + pad, (n, h, w, c)).astype(np.float32)
    return m, [x]


# -- model B ----------------------------------------------------------------------------------
@st.composite
def model_b(draw):
    rng = np.random.default_rng(draw(S.seeds()))
    n, h, w, c = (draw(st.integers(1, 2)), draw(st.integers(3, 8)), draw(st.integers(3, 8)),
                  draw(st.integers(1, 4)))
    mult = draw(st.integers(1, 2))
    qx = draw(S.quant_params(np.uint8))
    qa = (qx[0], qx[1] - 128)
    filt, fq, fscales = _int8_filter(draw, rng, (1, 3, 3, c * mult), 3)
    qd = (_int8_output_scale(draw, qa[0], fscales, 9), draw(st.integers(-128, 127)))
    qy = (_scale(draw, qd[0]), draw(st.integers(0, 255)))
    stride = draw(st.integers(1, 2))
    oh, ow = -(-h // stride), -(-w // stride)

    m = Graph()
    m.input("x", (n, h, w, c), np.uint8, qx)
    m.op("QUANTIZE", ["x"], "a", (n, h, w, c), np.int8, qa, ("exact", [("x", 1.0)]))
    bias_scales = (np.float32(qa[0]) * fscales).astype(np.float32)
    bias = m.g.const("bias", rng.integers(-2000, 2001, c * mult).astype(np.int32),
                     quantization=(bias_scales, np.zeros(bias_scales.size, np.int64), 0))
    real = filt.astype(np.float64) * fscales.reshape(1, 1, 1, -1)
    lip = float(np.abs(real).reshape(9, -1).sum(axis=0).max())      # largest sum of |w|
    m.op("DEPTHWISE_CONV_2D", ["a", m.g.const("filter", filt, quantization=fq), bias], "d",
         (n, h, w, c * mult), np.int8, qd, ("op", [m.gain_of("a", qa, qd, lip)]), version=3,
         padding="SAME", stride_h=1, stride_w=1, depth_multiplier=mult,
         fused_activation_function=draw(st.sampled_from(["NONE", "RELU6"])))
    m.op("MAX_POOL_2D", ["d"], "p", (n, oh, ow, c * mult), np.int8, qd, ("op", [("d", 1.0)]),
         padding="SAME", filter_height=2, filter_width=2, stride_h=stride, stride_w=stride)
    m.op("QUANTIZE", ["p"], "y", (n, oh, ow, c * mult), np.uint8, qy,
         ("op", [m.gain_of("p", qd, qy)]))
    m.finish(["y"])
    x = rng.integers(0, 256, (n, h, w, c)).astype(np.uint8)
    return m, [x]


# -- comparisons ------------------------------------------------------------------------------
def _all_tensors_litert(model, inputs):
    import warnings
    from ai_edge_litert.interpreter import Interpreter as LiteRT, OpResolverType
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")          # "preserve_all_tensors ... memory"
        it = LiteRT(model_content=model, experimental_op_resolver_type=OpResolverType.BUILTIN_REF,
                    experimental_preserve_all_tensors=True)
    return _invoke_all(it, inputs)


def _all_tensors_ours(model, inputs):
    from tflite_taichi.interpreter import Interpreter
    return _invoke_all(Interpreter(model_content=model, backend="reference",
                                   experimental_preserve_all_tensors=True), inputs)


def _invoke_all(it, inputs):
    it.allocate_tensors()
    for d, x in zip(it.get_input_details(), inputs):
        it.set_tensor(d["index"], x)
    it.invoke()
    return {d["index"]: it.get_tensor(d["index"]) for d in it.get_tensor_details()}


def _compare(m, actual, expected, exact_units, what):
    """Every tensor of `m` within its allowed units (the float output within its units times
    its input's scale). Returns {name: (worst, allowed)}."""
    allowed = m.allowed(exact_units)
    report = {}
    missing = [n for n, t in m.idx.items()
               if m.rule[n][0] != "input" and (t not in actual or t not in expected)]
    assert not missing, f"{what}: tensors not preserved: {missing}"
    for name, t in m.idx.items():
        if m.rule[name][0] == "input":
            continue
        a, e = np.asarray(actual[t]), np.asarray(expected[t])
        assert a.shape == e.shape and a.dtype == e.dtype, \
            f"{what} {name}: {a.dtype}{a.shape} vs {e.dtype}{e.shape}"
        diff = float(np.abs(a.astype(np.float64) - e.astype(np.float64)).max())
        if m.rule[name][0] == "float":                 # DEQUANTIZE: units of its input
            s_in = m.quant[m.rule[name][1][0][0]][0]
            worst, ok = diff / s_in, diff <= allowed[name] * s_in * (1 + 1e-6)
        else:
            worst, ok = diff, diff <= allowed[name]
        report[name] = (worst, allowed[name])
        assert ok, (f"{what}: tensor '{name}' differs by {worst:.3g} units, allowed "
                    f"{allowed[name]} (so far: {report})")
    return report


@given(case=model_a())
def test_model_a_every_tensor_matches_litert(case):
    m, inputs = case
    _compare(m, _all_tensors_ours(m.model, inputs), _all_tensors_litert(m.model, inputs), 0,
             "reference vs LiteRT")


@given(case=model_b())
def test_model_b_every_tensor_matches_litert(case):
    m, inputs = case
    _compare(m, _all_tensors_ours(m.model, inputs), _all_tensors_litert(m.model, inputs), 0,
             "reference vs LiteRT")


def _check_delegate_all(m, inputs, workers):
    expected = _all_tensors_ours(m.model, inputs)
    for w in workers:
        w.submit(m.model, inputs, experimental_preserve_all_tensors=True)
    answers = {}
    for w in workers:                  # collect every answer before asserting
        try:
            answers[w.backend] = w.result()
        except RuntimeError as e:
            answers[w.backend] = e
    ops = len(m.g.ops)
    for backend, answer in answers.items():
        if isinstance(answer, Exception):
            raise answer
        outputs, summary = answer
        assert not summary["fallback"], f"{backend}: ops left on the CPU: {summary['fallback']}"
        assert summary["ops_delegated"] == ops and len(summary["partitions"]) == 1, summary
        tensors = dict(summary["tensors"])
        for d_out, value in zip(m.g.outputs, outputs):
            tensors[d_out] = value
        _compare(m, tensors, expected, QUANT_UNITS, f"{backend} vs reference")


@settings(max_examples=TAICHI_EXAMPLES)
@given(case=model_a())
def test_model_a_on_the_delegate(taichi_workers, case):
    _check_delegate_all(*case, taichi_workers)


@settings(max_examples=TAICHI_EXAMPLES)
@given(case=model_b())
def test_model_b_on_the_delegate(taichi_workers, case):
    _check_delegate_all(*case, taichi_workers)
