"""BATCH_MATMUL on the delegate (cpu, vulkan, opengl workers; fp16 on vulkan; gles) vs the
reference path, over the attribute space of the LiteRT tests (run-time or constant RHS, the
latter packed for the kernel; adj_x / adj_y; broadcast batch dimensions; split-K).
Tolerances: tflite_taichi.testing.TAICHI_RTOL; quantized outputs within one quantization step."""
import numpy as np
from hypothesis import given, settings, strategies as st

from tflite_taichi.testing import TAICHI_EXAMPLES, check_delegate, strategies
from cases.matmul import _hybrid, matmul_case, matmul_model, output_scale

S = strategies()


@settings(max_examples=TAICHI_EXAMPLES)
@given(case=matmul_case(), const=st.booleans(), seed=S.seeds())
def test_float32_delegate_matches_reference(taichi_workers, case, const, seed):
    rhs = (np.random.default_rng(seed).uniform(-3, 3, case[1]).astype(np.float32)
           if const else None)
    check_delegate(matmul_model(case, rhs_const=rhs), taichi_workers, seed=seed)


@settings(max_examples=TAICHI_EXAMPLES)
@given(case=matmul_case(), const=st.sampled_from(["input", "int8", "hybrid"]),
       ql=S.quant_params(), qr=S.quant_params(), zo=st.integers(-20, 20),
       widen=st.floats(0.05, 1.0), seed=S.seeds())
def test_int8_delegate_matches_reference(taichi_workers, case, const, ql, qr, zo, widen, seed):
    # int8 x int8 with the RHS at run time or constant, or float32 x int8-constant (hybrid)
    if const == "hybrid":
        model = _hybrid(case, seed)[0]
    else:
        qo = (output_scale(case, ql[0], qr[0], widen), zo)
        rhs = (np.random.default_rng(seed).integers(-128, 128, case[1]).astype(np.int8)
               if const == "int8" else None)
        model = matmul_model(case, np.int8, (ql, qr, qo), rhs)
    check_delegate(model, taichi_workers, seed=seed)


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
