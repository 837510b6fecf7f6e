"""The SSD head of tests/test_ops_detection.py on the delegate (cpu, vulkan, opengl workers) vs
the reference path: the backbone, box and class convs, RESHAPE, CONCATENATION and LOGISTIC
(and the int8 model's DEQUANTIZE) run in one delegated partition; TFLite_Detection_PostProcess,
which has no Taichi part (as in the official GPU delegate), runs after it on the CPU.
Tolerances: tflite_taichi.testing.TAICHI_RTOL (the outputs are the post-process's choices and
the decoded boxes: a score off by float32 rounding could only reorder exact ties)."""
import pytest

from tflite_taichi.testing import check_delegate, quantize_array
from cases.detection import POSTPROCESS, ssd_image, ssd_model, ssd_ranges


def assert_backbone_delegated(summaries, model_ops):
    """Every op but the last (the post-process) in one partition; the post-process on the CPU."""
    for backend, s in summaries.items():
        assert [(f["index"], f["op"]) for f in s["fallback"]] == [(model_ops - 1, POSTPROCESS)], \
            (backend, s["fallback"])
        assert "no Taichi implementation" in s["fallback"][0]["reason"], backend
        assert [p["ops"] for p in s["partitions"]] == [list(range(model_ops - 1))], backend


@pytest.mark.parametrize("regular", [False, True])
def test_ssd_backbone_delegated_postprocess_on_cpu(taichi_workers, regular):
    model, _ = ssd_model(regular)
    summaries = check_delegate(model, taichi_workers, [ssd_image(1)], expect_all_delegated=False)
    assert_backbone_delegated(summaries, 14)


def test_int8_ssd_backbone_delegated_postprocess_on_cpu(taichi_workers):
    model, _ = ssd_model(True, ssd_ranges(True))
    image = quantize_array(ssd_image(2), (1 / 255, -128))
    summaries = check_delegate(model, taichi_workers, [image], expect_all_delegated=False)
    assert_backbone_delegated(summaries, 16)
