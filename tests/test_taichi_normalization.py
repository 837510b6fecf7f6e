"""LOG_SOFTMAX, L2_NORMALIZATION, LOCAL_RESPONSE_NORMALIZATION on the delegate (cpu, vulkan,
opengl workers; fp16 on vulkan; gles) vs the reference path, over the attribute space of the
LiteRT tests. Tolerances: tflite_taichi.testing.TAICHI_RTOL; quantized outputs within one
quantization step (check_delegate's rule)."""
import numpy as np
from hypothesis import given, settings, strategies as st

from tflite_taichi.testing import TAICHI_EXAMPLES, check_delegate, check_op, strategies
from cases.normalization import ROW_OPS, lrn_case, lrn_model, row_case, row_inputs, row_model

S = strategies()


@settings(max_examples=TAICHI_EXAMPLES)
@given(data=st.data(), seed=S.seeds())
def test_float32_delegate_matches_reference(taichi_workers, data, seed):
    # the op drawn in the test: one compile per example for the family
    op = data.draw(st.sampled_from(ROW_OPS + ["LOCAL_RESPONSE_NORMALIZATION"]))
    if op == "LOCAL_RESPONSE_NORMALIZATION":
        shape, options = data.draw(lrn_case())
        check_delegate(lrn_model(shape, options), taichi_workers, seed=seed)
        return
    shape, spread = data.draw(row_case(op))
    zero_rows = op == "L2_NORMALIZATION" and data.draw(st.booleans())
    check_delegate(row_model(op, shape), taichi_workers, row_inputs(shape, spread, seed, zero_rows))


@st.composite
def row_ops_int8_delegate_matches_reference_cases(draw):
    seed = draw(S.seeds())
    op = draw(st.sampled_from(ROW_OPS))
    dtype = draw(st.sampled_from([np.int8, np.uint8]))
    shape, _ = draw(row_case(op))
    qi = draw(S.quant_params(dtype, scale_range=(1e-3, 0.5)))
    return row_model(op, shape, dtype, qi), None, {"seed": seed}


def test_row_ops_int8_delegate_matches_reference(taichi_workers):
    check_op(row_ops_int8_delegate_matches_reference_cases(), workers=taichi_workers)


def test_normalization_fp16_on_vulkan(vulkan_workers):
    for op in ROW_OPS:
        check_delegate(row_model(op, (2, 3, 17)), vulkan_workers, seed=1, precision="fp16")
    check_delegate(lrn_model((1, 3, 2, 9), dict(radius=2, bias=1.0, alpha=0.5, beta=0.75)),
                   vulkan_workers, seed=1, precision="fp16")


def test_normalization_gles(gles_worker):
    for op in ROW_OPS:
        check_delegate(row_model(op, (3, 11)), [gles_worker], seed=2)
    check_delegate(lrn_model((2, 2, 3, 6), dict(radius=1, bias=2.0, alpha=0.1, beta=0.5)),
                   [gles_worker], seed=2)


def test_long_rows(taichi_workers):
    # one row of 1000 logits (a classifier's LOG_SOFTMAX), and L2 over 4 rows of 512
    check_delegate(row_model("LOG_SOFTMAX", (1, 1000)), taichi_workers,
                   row_inputs((1, 1000), 10.0, 3))
    check_delegate(row_model("L2_NORMALIZATION", (4, 512)), taichi_workers, seed=4)
