"""BATCH_MATMUL on the delegate (cpu, vulkan, opengl workers; fp16 on vulkan; gles) vs the
reference path, over the attribute space of the LiteRT tests (run-time or constant RHS, the
latter packed for the kernel; adj_x / adj_y; broadcast batch dimensions; split-K).
Tolerances: tflite_taichi.testing.TAICHI_RTOL; quantized outputs within one quantization step."""
import numpy as np
from hypothesis import strategies as st

from tflite_taichi.testing import check_delegate, check_op, strategies
from cases.matmul import _hybrid, matmul_case, matmul_model, output_scale

S = strategies()


@st.composite
def float32_delegate_matches_reference_cases(draw):
    case = draw(matmul_case())
    const = draw(st.booleans())
    seed = draw(S.seeds())
    rhs = (np.random.default_rng(seed).uniform(-3, 3, case[1]).astype(np.float32)
           if const else None)
    return matmul_model(case, rhs_const=rhs), None, {"seed": seed}


def test_float32_delegate_matches_reference(taichi_workers):
    check_op(float32_delegate_matches_reference_cases(), workers=taichi_workers)


@st.composite
def int8_delegate_matches_reference_cases(draw):
    case = draw(matmul_case())
    const = draw(st.sampled_from(["input", "int8", "hybrid"]))
    ql = draw(S.quant_params())
    qr = draw(S.quant_params())
    zo = draw(st.integers(-20, 20))
    widen = draw(st.floats(0.05, 1.0))
    seed = draw(S.seeds())
    if const == "hybrid":
        model = _hybrid(case, seed)[0]
    else:
        qo = (output_scale(case, ql[0], qr[0], widen), zo)
        rhs = (np.random.default_rng(seed).integers(-128, 128, case[1]).astype(np.int8)
               if const == "int8" else None)
        model = matmul_model(case, np.int8, (ql, qr, qo), rhs)
    return model, None, {"seed": seed}


def test_int8_delegate_matches_reference(taichi_workers):
    check_op(int8_delegate_matches_reference_cases(), workers=taichi_workers)


def test_split_k(taichi_workers):
    # 2 x 3 outputs of 700 terms: partial sums in scratch; constant RHS with adj_y (packed)
    case = ((2, 3, 700), (1, 4, 700), False, True, (2, 3, 4))
    rhs = np.random.default_rng(0).uniform(-1, 1, case[1]).astype(np.float32)
    check_delegate(matmul_model(case, rhs_const=rhs), taichi_workers, seed=0)
    case = ((2, 700, 3), (700, 4), True, False, (2, 3, 4))
    check_delegate(matmul_model(case), taichi_workers, seed=1)


def test_matmul_fp16_on_vulkan(vulkan_workers):
    case = ((2, 1, 5, 6), (3, 7, 6), False, True, (2, 3, 5, 7))
    check_delegate(matmul_model(case), vulkan_workers, seed=1, precision="fp16")


def test_matmul_gles(gles_worker):
    case = ((2, 6, 5), (6, 7), True, False, (2, 5, 7))
    rhs = np.random.default_rng(2).uniform(-3, 3, case[1]).astype(np.float32)
    check_delegate(matmul_model(case, rhs_const=rhs), [gles_worker], seed=2)
