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
ops in one partition, fp16, GLES and what stays on the CPU have their own tests."""
import numpy as np
import pytest

from tflite_taichi.testing import check_delegate, check_op
from cases.mediapipe import MEDIAPIPE_ROWS, _data, chain_model, pool_model
from cases.table import row_id


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


@pytest.mark.parametrize("index_dtype", ["int32", "int32_q"])
def test_int32_indices_stay_on_the_cpu(taichi_workers, index_dtype):
    """partition.delegate_reason refuses int32 run-time tensors, quantized (scale 1) or not."""
    case = dict(padding="VALID", f=(2, 2), s=(2, 2), in_shape=(1, 4, 4, 2), out_shape=(1, 2, 2, 2),
                act=0)
    summaries = check_delegate(pool_model(case, index_dtype), taichi_workers, seed=5,
                               expect_all_delegated=False)
    for summary in summaries.values():
        assert summary["ops_delegated"] == 0
        assert "int32" in summary["fallback"][0]["reason"]


def test_window_beyond_float16_integers_stays_on_the_cpu(taichi_workers):
    case = dict(padding="VALID", f=(1, 2049), s=(1, 2049), in_shape=(1, 1, 2049, 1),
                out_shape=(1, 1, 1, 1), act=0)
    summaries = check_delegate(pool_model(case), taichi_workers, seed=6,
                               expect_all_delegated=False)
    for summary in summaries.values():
        assert summary["ops_delegated"] == 0
        assert "float16" in summary["fallback"][0]["reason"]
