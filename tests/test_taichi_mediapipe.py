"""MediaPipe's CUSTOM:MaxPoolingWithArgmax2D and CUSTOM:MaxUnpooling2D on the delegate (cpu,
vulkan, opengl workers; fp16 on vulkan; gles) vs the reference path, over the attribute space
of tests/cases/mediapipe.py (the LiteRT tests': every stride, padding and activation).

The index tensors are float32, as in real models, so the arena carries them (exact integers;
float16 holds them exactly up to 2048, beyond which the delegate refuses the window). int32
indices, plain or quantized, stay on the CPU (partition.delegate_reason). The delegate's
MaxUnpooling2D drops an index outside its window where the reference may place it in a
neighbouring window (ops/mediapipe.py), so the unpooling tests draw indices inside the window,
as MaxPoolingWithArgmax2D writes them.
Tolerances: tflite_taichi.testing.TAICHI_RTOL (the values are copies: exact in fp32). One case
table (MEDIAPIPE_ROWS, tests/cases/mediapipe.py: a row per op) drives one property test; both
ops in one partition, fp16 and GLES have their own tests; what stays on the CPU is a table too
(REFUSED: cases.table.Refused), one test."""
import numpy as np
import pytest

from tflite_taichi.testing import check_delegate, check_op
from cases.mediapipe import MEDIAPIPE_ROWS, POOL, _data, chain_model, pool_model
from cases.table import Refused, check_refused, refused_id, row_id


@pytest.mark.parametrize("row", MEDIAPIPE_ROWS, ids=row_id)
def test_op_on_the_delegate(taichi_workers, row):
    check_op(row.cases, workers=taichi_workers)


def test_pool_then_unpool_delegate_matches_reference(taichi_workers):
    """Both ops in one partition, the indices passed through the arena (padding before > 0 in
    the second case)."""
    for case in (dict(padding="VALID", f=(2, 2), s=(2, 2), in_shape=(1, 6, 4, 3),
                      out_shape=(1, 3, 2, 3), act=0),
                 dict(padding="SAME", f=(3, 2), s=(3, 2), in_shape=(2, 7, 5, 2),
                      out_shape=(2, 3, 3, 2), act=0)):
        x = _data(np.random.default_rng(7), case["in_shape"], ties=True)
        summaries = check_delegate(chain_model(case), taichi_workers, [x])
        for summary in summaries.values():
            assert summary["ops_delegated"] == 2


def test_fp16_on_vulkan(vulkan_workers):
    case = dict(padding="SAME", f=(2, 2), s=(2, 2), in_shape=(1, 7, 6, 4), out_shape=(1, 4, 3, 4),
                act=0)
    x = _data(np.random.default_rng(3), case["in_shape"], ties=True)
    check_delegate(chain_model(case), vulkan_workers, [x], precision="fp16")


def test_gles(gles_worker):
    case = dict(padding="VALID", f=(2, 3), s=(2, 3), in_shape=(2, 4, 7, 3), out_shape=(2, 2, 2, 3),
                act=0)
    check_delegate(chain_model(case), [gles_worker], [_data(np.random.default_rng(4),
                                                            case["in_shape"])])


# -- what stays on the CPU ------------------------------------------------------------------
TWO_BY_TWO = dict(padding="VALID", f=(2, 2), s=(2, 2), in_shape=(1, 4, 4, 2),
                  out_shape=(1, 2, 2, 2), act=0)
WINDOW_BEYOND_FLOAT16 = dict(padding="VALID", f=(1, 2049), s=(1, 2049), in_shape=(1, 1, 2049, 1),
                             out_shape=(1, 1, 1, 1), act=0)

REFUSED = [
    # partition.delegate_reason refuses int32 run-time tensors, quantized (scale 1) or not
    Refused("int32 indices", pool_model(TWO_BY_TWO, "int32"), POOL, "int32", seed=5),
    Refused("quantized int32 indices", pool_model(TWO_BY_TWO, "int32_q"), POOL, "int32",
            seed=5),
    Refused("window beyond float16 integers", pool_model(WINDOW_BEYOND_FLOAT16), POOL, "float16",
            seed=6),
]


@pytest.mark.parametrize("case", REFUSED, ids=refused_id)
def test_what_stays_on_the_cpu(taichi_workers, case):
    check_refused(case, taichi_workers)
