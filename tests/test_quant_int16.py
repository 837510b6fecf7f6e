"""int16 activations ("16x8": symmetric int16 tensors, zero point 0; int8 symmetric filters per
tensor or per channel; int64 bias, or int32 declared by quantized_bias_type, with scale
input_scale * filter_scale) on the float view: every op LiteRT has an int16 kernel for, ours
(reference path) vs LiteRT's reference kernels; the delegate (fp32) vs the reference on the
Taichi workers (each op family's TAICHI_EXAMPLES shared among its ops); GLES; and fp16's
refusal of 16-bit grids. Cases: tests/cases/quant.py (the int8 tests' attribute spaces on the
int16 grid, LiteRT's constraints, and the inputs its kernels leave undefined or wrap on:
DIV's extreme quotients, MUL's rescale above 1, a broadcasting power-of-two ADD, which aborts).
Tolerances: tflite_taichi.testing (one quantization step) except the measured exceptions below.

RESIZE_* int16 is held against LiteRT in test_ops_resize.py and QUANTIZE / DEQUANTIZE int16 in
test_ops_quantize.py; here they run on the delegate. LiteRT has no int16 RELU_N1_TO_1,
HARD_SWISH, DEPTH_TO_SPACE, SPACE_TO_DEPTH or SQUARED_DIFFERENCE; its int16 PRELU is wrong
(LITERT_WRONG)."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from cases.quant import ACTIVATIONS, BINARY, CONV, INT8, INT16, LAYOUT, POOL, REDUCE, RESIZE, case
from tflite_taichi.quant import quantize
from tflite_taichi.ops.base import Quantization
from tflite_taichi.testing import (TAICHI_EXAMPLES, examples, assert_quantized_close, check_against_litert,
                                   check_delegate, run_ours)

NO_INT16_KERNEL = {"RELU_N1_TO_1", "HARD_SWISH", "DEPTH_TO_SPACE", "SPACE_TO_DEPTH"}
# LiteRT 2.3's int16 PRELU is wrong for negative inputs in all three kernel sets (reference,
# builtin, XNNPACK): on a 1e-3 grid with alpha 0.5, -20.0 gives 0.240 and -0.1 gives 0. Ours is
# held to the formula instead (test_prelu_int16_matches_numpy).
LITERT_WRONG = {"PRELU"}
LITERT_OPS = [op for op in BINARY + CONV + POOL + REDUCE + ACTIVATIONS + LAYOUT
              if op not in NO_INT16_KERNEL | LITERT_WRONG]

FAMILIES = {
    "elementwise": BINARY,
    "conv": CONV,
    "pool_reduce_resize": POOL + REDUCE + RESIZE,
    "activations": tuple(op for op in ACTIVATIONS if op not in NO_INT16_KERNEL),
    "layout": tuple(op for op in LAYOUT if op not in NO_INT16_KERNEL),
    "quantize": ("QUANTIZE", "DEQUANTIZE", "QUANTIZE int16->int16", "QUANTIZE int16->int8"),
}
_REQUANTIZE = {"QUANTIZE int16->int16": (INT16, INT16), "QUANTIZE int16->int8": (INT16, INT8)}

# -- LiteRT's int16 approximations: measured worst differences --------------------------------
# Our references are the exact functions; LiteRT's int16 kernels approximate them, so these ops
# get their measured worst case instead of one unit (measured with LiteRT 2.3's BUILTIN_REF).
#
# TANH and LOGISTIC: fixed-point kernels interpolating a 256-entry table (output grid 1/32768,
# which LiteRT requires). Every int16 input, 90 input scales from 1e-5 to 1e-2 and the powers of
# two 2^-7..2^-16: worst 3 units for TANH (scale 5.4e-3), 2 for LOGISTIC (scale 1.6e-4).
INT16_TANH_UNITS = 3
INT16_LOGISTIC_UNITS = 2
# EXP: a 513-entry table over the input range, linearly interpolated, so the error grows with
# the square of the range. Inputs here span at most +-8 (INT16_EXP_INPUT_SCALES) on a
# calibrated output grid (cases.quant.activation_case): every int16 input, 40 scales, 5 output
# headrooms from 1x to 2x: worst 10 units (range +-8, no headroom). Wider ranges are worse
# (+-16: 23, +-32: 58, +-87: 261 units), and a grid that saturates inside the range much worse
# (the table interpolates between clamped entries: 120 to 2084 units seen).
INT16_EXP_UNITS = 10
INT16_EXP_INPUT_SCALES = (1e-5, 8 / 32767)
# SOFTMAX: exp comes from a table over [-10, 0] (LiteRT: "exp(-10.0) is insignificant"), so
# every element more than 10 / beta below its row's maximum counts as e^-10 (1.5 units of the
# 1/32768 output) instead of ~0, and the row's other outputs shrink by as much: about 2 units
# per such element. Rows here are at most 7 long: worst 12 units over 3000 random cases and
# adversarial rows (one maximum, the rest 0..20/beta below it) of lengths 2, 4, 7: 2, 6, 12.
INT16_SOFTMAX_UNITS = 12

UNITS = {"TANH": INT16_TANH_UNITS, "LOGISTIC": INT16_LOGISTIC_UNITS, "EXP": INT16_EXP_UNITS,
         "SOFTMAX": INT16_SOFTMAX_UNITS}
INPUT_SCALES = {"EXP": INT16_EXP_INPUT_SCALES}


def _case(op):
    if op in _REQUANTIZE:
        return case(INT16, "QUANTIZE", other=_REQUANTIZE[op])
    if op in INPUT_SCALES:
        return case(INT16, op, input_scales=INPUT_SCALES[op])
    return case(INT16, op)


@pytest.mark.parametrize("op", LITERT_OPS)
@given(data=st.data())
def test_int16_matches_litert(op, data):
    model, inputs, kw = data.draw(_case(op), label=op)
    if op in UNITS:
        kw = dict(kw, units=UNITS[op])
    check_against_litert(model, inputs, **kw)


def _delegate_examples(family):
    """A family's TAICHI_EXAMPLES shared among its ops (at least 3 each), so that every op
    runs on the delegate in every run (drawing the op among 15 in 20 examples missed 6)."""
    return max(3, -(-TAICHI_EXAMPLES // len(FAMILIES[family])))


@pytest.mark.parametrize("family, op", [pytest.param(f, op, id=f"{f}-{op}")
                                        for f, ops in FAMILIES.items() for op in ops])
def test_int16_delegate_matches_reference(taichi_workers, family, op):
    @settings(max_examples=_delegate_examples(family))
    @given(case=_case(op).filter(lambda c: c.delegable))
    def delegate_matches_reference(case):
        check_delegate(case.model, taichi_workers, case.inputs)

    delegate_matches_reference()


@given(data=st.data())
def test_prelu_int16_matches_numpy(data):
    """where(x >= 0, x, alpha * x) on the real values, snapped to the output grid (LiteRT 2.3's
    int16 PRELU is wrong for negative inputs: LITERT_WRONG)."""
    c = data.draw(_case("PRELU"), label="PRELU")
    x, alpha, (scale, zp) = c.meta["x"], c.meta["alpha"], c.meta["qo"]
    expected = quantize(np.where(x >= 0, x, x * alpha).astype(np.float32),
                        Quantization(np.array([scale], np.float32), np.array([zp])), np.int16)
    out, = run_ours(c.model, c.inputs)
    assert_quantized_close(out, expected)


# -- fp16 refuses 16-bit grids; GLES ------------------------------------------------------------
@pytest.mark.parametrize("op", ["CONV_2D", "ADD", "SOFTMAX", "QUANTIZE"])
def test_int16_stays_on_the_cpu_with_fp16(vulkan_workers, op):
    """float16 storage (11 significant bits) cannot hold a 16-bit grid: at precision='fp16' the
    op runs on the reference path, with the reason (partition.delegate_reason)."""
    @settings(max_examples=examples(2))
    @given(case=_case(op).filter(lambda c: c.delegable))
    def stays_on_the_cpu(case):
        summaries = check_delegate(case.model, vulkan_workers, case.inputs, precision="fp16",
                                   expect_all_delegated=False)
        for backend, summary in summaries.items():
            assert summary["ops_delegated"] == 0, backend
            [row] = summary["fallback"]
            assert row["op"] == op and "float16 storage" in row["reason"], row

    stays_on_the_cpu()


@pytest.mark.parametrize("op", ["CONV_2D", "ADD", "AVERAGE_POOL_2D", "SOFTMAX", "CONCATENATION",
                                "QUANTIZE"])
def test_int16_gles(gles_worker, op):
    @settings(max_examples=examples(2))
    @given(case=_case(op).filter(lambda c: c.delegable))
    def gles_matches_reference(case):
        check_delegate(case.model, [gles_worker], case.inputs)

    gles_matches_reference()
