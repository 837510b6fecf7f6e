"""Element-wise ops on the delegate (cpu, vulkan, opengl workers; fp16 on vulkan; gles) vs the
reference path. Tolerances: tflite_taichi.testing.TAICHI_RTOL."""
import numpy as np
import pytest
from hypothesis import strategies as st

from tflite_taichi.testing import (Const, Input, Output, check_delegate, check_op, one_op_model,
                                   strategies)
from cases.elementwise import INT8_OPS, WITH_ACTIVATION, WITHOUT_ACTIVATION, broadcast_pair

S = strategies()


def _model(op, shapes, act, const_rhs, seed, dtype=np.float32, q=None):
    a_shape, b_shape, out_shape = shapes
    rng = np.random.default_rng(seed)
    rhs = rng.uniform(-3, 3, b_shape).astype(np.float32)
    if op == "DIV":
        rhs = np.where(np.abs(rhs) < 0.1, 0.5, rhs).astype(np.float32)
    options = {"fused_activation_function": act} if op in WITH_ACTIVATION else {}
    if dtype == np.int8:
        qa, qb, qo = q
        model = one_op_model(op, [Input(a_shape, np.int8, qa), Input(b_shape, np.int8, qb)],
                             [Output(out_shape, np.int8, qo)], **options)
        return model, None
    model = one_op_model(op, [Input(a_shape), Const(rhs) if const_rhs else Input(b_shape)],
                         [Output(out_shape)], **options)
    inputs = [rng.uniform(-3, 3, a_shape).astype(np.float32)] + ([] if const_rhs else [rhs])
    return model, inputs


# The property tests go through check_op, the helper a user's op gets: a strategy of cases
# (model, inputs[, check_delegate's options]), each run on the reference path and on every
# worker's backend, delegated and matching.
@st.composite
def float32_cases(draw, op):
    return _model(op, draw(broadcast_pair()), draw(S.activations()), draw(st.booleans()),
                  draw(S.seeds()))


@st.composite
def int8_cases(draw, op):
    seed = draw(S.seeds())
    q = (draw(S.quant_params()), draw(S.quant_params()), draw(S.quant_params()))
    model, _ = _model(op, draw(broadcast_pair()), draw(S.activations()), False, seed, np.int8, q)
    return model, None, {"seed": seed}


@st.composite
def logical_and_cases(draw):
    a_shape, b_shape, out_shape = draw(broadcast_pair())
    model = one_op_model("LOGICAL_AND", [Input(a_shape, np.bool_), Input(b_shape, np.bool_)],
                         [Output(out_shape, np.bool_)])
    return model, None, {"seed": draw(S.seeds())}


@pytest.mark.parametrize("op", WITH_ACTIVATION + WITHOUT_ACTIVATION)
def test_float32_delegate_matches_reference(taichi_workers, op):
    check_op(float32_cases(op), workers=taichi_workers)


@pytest.mark.parametrize("op", INT8_OPS)
def test_int8_delegate_matches_reference(taichi_workers, op):
    check_op(int8_cases(op), workers=taichi_workers)


def test_logical_and_delegate(taichi_workers):
    check_op(logical_and_cases(), workers=taichi_workers)


@pytest.mark.parametrize("op", ["ADD", "MUL", "SQUARED_DIFFERENCE"])
def test_fp16_on_vulkan(vulkan_workers, op):
    model, inputs = _model(op, ((2, 5, 3), (5, 1), (2, 5, 3)), "RELU6", True, 7)
    check_delegate(model, vulkan_workers, inputs, precision="fp16")


def test_gles(gles_worker):
    model, inputs = _model("SUB", ((3, 1, 4), (2, 4), (3, 2, 4)), "NONE", False, 3)
    check_delegate(model, [gles_worker], inputs)


def test_int32_div_stays_on_the_cpu(taichi_workers):
    model = one_op_model("DIV", [Input((4,), np.int32), Const(np.array([3, -3, 2, 1], np.int32))],
                         [Output((4,), np.int32)])
    summaries = check_delegate(model, taichi_workers, [np.array([7, 7, -7, 0], np.int32)],
                               expect_all_delegated=False)
    for summary in summaries.values():
        assert summary["ops_delegated"] == 0
        assert "int32" in summary["fallback"][0]["reason"]
