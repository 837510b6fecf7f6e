"""Binary element-wise ops vs LiteRT through one-op models: float32, int8, broadcasting,
fused activations. Tolerances: tflite_taichi.testing (1e-5 of the largest magnitude; 1 unit)."""
import numpy as np
import pytest
from hypothesis import assume, given, strategies as st

from tflite_taichi.testing import Const, Input, Output, check_against_litert, one_op_model
from cases.elementwise import INT8_OPS, S, WITHOUT_ACTIVATION, WITH_ACTIVATION, broadcast_pair


def _options(op, act):
    return {"fused_activation_function": act} if op in WITH_ACTIVATION else {}


@pytest.mark.parametrize("op", WITH_ACTIVATION + WITHOUT_ACTIVATION)
@given(shapes=broadcast_pair(), act=S.activations(), const_rhs=st.booleans(), seed=S.seeds())
def test_float32_matches_litert(op, shapes, act, const_rhs, seed):
    a_shape, b_shape, out_shape = shapes
    rng = np.random.default_rng(seed)
    rhs = rng.uniform(-3, 3, b_shape).astype(np.float32)
    if op == "DIV":
        rhs = np.where(np.abs(rhs) < 0.1, 0.5, rhs).astype(np.float32)   # keep away from x/0
    model = one_op_model(op, [Input(a_shape), Const(rhs) if const_rhs else Input(b_shape)],
                         [Output(out_shape)], **_options(op, act))
    inputs = [rng.uniform(-3, 3, a_shape).astype(np.float32)] + ([] if const_rhs else [rhs])
    check_against_litert(model, inputs)


@pytest.mark.parametrize("op", INT8_OPS)
@given(shapes=broadcast_pair(), act=S.activations(), qa=S.quant_params(), qb=S.quant_params(),
       qo=S.quant_params(), seed=S.seeds())
def test_int8_matches_litert(op, shapes, act, qa, qb, qo, seed):
    a_shape, b_shape, out_shape = shapes
    if op in ("MAXIMUM", "MINIMUM"):
        qb = qo = qa            # LiteRT's int8 MAXIMUM/MINIMUM require one scale for all three
    if op == "SQUARED_DIFFERENCE":
        assume(qo[0] > 0.01)    # keep the squared range representable
    model = one_op_model(op, [Input(a_shape, np.int8, qa), Input(b_shape, np.int8, qb)],
                         [Output(out_shape, np.int8, qo)], **_options(op, act))
    check_against_litert(model, seed=seed)


@given(shapes=broadcast_pair(), seed=S.seeds())
def test_logical_and_matches_litert(shapes, seed):
    a_shape, b_shape, out_shape = shapes
    model = one_op_model("LOGICAL_AND", [Input(a_shape, np.bool_), Input(b_shape, np.bool_)],
                         [Output(out_shape, np.bool_)])
    check_against_litert(model, seed=seed)


def test_int32_div_truncates_like_litert():
    model = one_op_model("DIV", [Input((6,), np.int32), Const(np.array([3, -3, 2, -2, 5, 7], np.int32))],
                         [Output((6,), np.int32)])
    check_against_litert(model, [np.array([7, 7, -7, -7, 0, 100], np.int32)])
