"""uint8 models (asymmetric, zero points 0..255; uint8 filters with a zero point, per tensor;
int32 bias) on the float view: every op LiteRT has a uint8 kernel for, ours (reference path) vs
LiteRT's reference kernels, and the delegate vs the reference on the Taichi workers (each op
family's TAICHI_EXAMPLES shared among its ops), fp16 on vulkan, GLES. Cases:
tests/cases/quant.py (the int8 tests' attribute spaces on the uint8 grid, LiteRT's constraints
and the DIV inputs its kernel leaves undefined). Tolerances: tflite_taichi.testing (one
quantization step), no exception: every uint8 kernel of LiteRT meets it (600 cases per op).

QUANTIZE / DEQUANTIZE with uint8 (float32 -> uint8, uint8 <-> int8, uint8 -> float32) are held
against LiteRT in test_ops_quantize.py; here they run on the delegate.

LiteRT has no uint8 SQUARED_DIFFERENCE or EXP ("Type 3 is currently not supported"): not here."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from cases.quant import (ACTIVATIONS, BINARY, CONV, INT8, LAYOUT, POOL, REDUCE, RESIZE, UINT8, case,
                         quant)
from tflite_taichi.testing import (TAICHI_EXAMPLES, examples, Input, Output, check_against_litert,
                                   check_delegate, one_op_model, strategies)

S = strategies()
NO_UINT8_KERNEL = {"EXP"}          # LiteRT: "Type 3 is currently not supported by Exp"
LITERT_OPS = [op for op in BINARY + CONV + POOL + REDUCE + RESIZE + ACTIVATIONS + LAYOUT
              if op not in NO_UINT8_KERNEL]

FAMILIES = {
    "elementwise": BINARY,
    "conv": CONV,
    "pool_reduce_resize": POOL + REDUCE + RESIZE,
    "activations": tuple(op for op in ACTIVATIONS if op not in NO_UINT8_KERNEL),
    "layout": LAYOUT,
    "quantize": ("QUANTIZE", "DEQUANTIZE", "QUANTIZE uint8->int8", "QUANTIZE int8->uint8",
                 "QUANTIZE uint8->uint8"),
}
_REQUANTIZE = {"QUANTIZE uint8->int8": (UINT8, INT8), "QUANTIZE int8->uint8": (INT8, UINT8),
               "QUANTIZE uint8->uint8": (UINT8, UINT8)}


def _case(op):
    if op in _REQUANTIZE:
        return case(UINT8, "QUANTIZE", other=_REQUANTIZE[op])
    return case(UINT8, op)


@pytest.mark.parametrize("op", LITERT_OPS)
@given(data=st.data())
def test_uint8_matches_litert(op, data):
    model, inputs, kw = data.draw(_case(op), label=op)
    check_against_litert(model, inputs, **kw)


@given(shape=S.shapes(0, 4), qi=quant(UINT8), seed=S.seeds())
def test_tanh_uint8_canonical_output_matches_litert(shape, qi, seed):
    """The converter's TANH output grid: 1/128 with zero point 128."""
    model = one_op_model("TANH", [Input(shape, np.uint8, qi)],
                         [Output(shape, np.uint8, (1 / 128, 128))])
    check_against_litert(model, seed=seed)


def _delegate_examples(family):
    """A family's TAICHI_EXAMPLES shared among its ops (at least 3 each), so that every op
    runs on the delegate in every run (drawing the op among 15 in 20 examples missed 6)."""
    return max(3, -(-TAICHI_EXAMPLES // len(FAMILIES[family])))


@pytest.mark.parametrize("family, op", [pytest.param(f, op, id=f"{f}-{op}")
                                        for f, ops in FAMILIES.items() for op in ops])
def test_uint8_delegate_matches_reference(taichi_workers, family, op):
    @settings(max_examples=_delegate_examples(family))
    @given(case=_case(op).filter(lambda c: c.delegable))
    def delegate_matches_reference(case):
        check_delegate(case.model, taichi_workers, case.inputs)

    delegate_matches_reference()


# -- fp16 on vulkan, GLES: a few ops of each family -------------------------------------------
# A uint8 grid fits float16 storage (|q - zero point| <= 255 needs 8 of its 11 bits), so uint8
# models run at precision='fp16'; 16-bit grids do not (test_quant_int16.py).
FP16_OPS = ["CONV_2D", "DEPTHWISE_CONV_2D", "ADD", "MUL", "AVERAGE_POOL_2D", "MEAN", "SOFTMAX",
            "LOGISTIC", "CONCATENATION", "RESIZE_BILINEAR", "QUANTIZE"]
GLES_OPS = ["CONV_2D", "ADD", "AVERAGE_POOL_2D", "SOFTMAX", "CONCATENATION", "QUANTIZE"]


@pytest.mark.parametrize("op", FP16_OPS)
def test_uint8_fp16_on_vulkan(vulkan_workers, op):
    @settings(max_examples=examples(3))
    @given(case=_case(op).filter(lambda c: c.delegable))
    def fp16_matches_reference(case):
        check_delegate(case.model, vulkan_workers, case.inputs, precision="fp16")

    fp16_matches_reference()


@pytest.mark.parametrize("op", GLES_OPS)
def test_uint8_gles(gles_worker, op):
    @settings(max_examples=examples(2))
    @given(case=_case(op).filter(lambda c: c.delegable))
    def gles_matches_reference(case):
        check_delegate(case.model, [gles_worker], case.inputs)

    gles_matches_reference()
