"""The five float models of ../shared/models fully delegated on every Taichi backend under test
(cpu, vulkan on lavapipe, opengl on llvmpipe in CI) and matching LiteRT (XNNPACK): float32 within
1e-4 of each output's largest magnitude (as for the reference path), fp16 storage within 2e-2."""
import os

import numpy as np
import pytest

from tflite_taichi.testing import assert_float_close, natural_image, random_input, synthetic_portrait

litert = pytest.importorskip("ai_edge_litert.interpreter")

MODELS = ["face_detection_short_range", "iris_landmark", "hand_landmark_lite", "mobilenet_v1_fp32",
          "selfie_segmentation"]
RTOL = {"fp32": 1e-4, "fp16": 2e-2}

pytestmark = pytest.mark.models


def _noise(path, detail, rng):
    return random_input(detail, rng, 0.0, 1.0)


def _realistic(path, detail, rng):
    """What the model sees in use (noise is not fp16's criterion: real inputs are smooth, so
    float16's rounding averages out less): a head and shoulders for the segmenter, a
    1/f-spectrum picture for the others."""
    _, h, w, c = detail["shape"]
    if "selfie" in os.path.basename(path):
        return synthetic_portrait(h, w, rng)
    return natural_image(h, w, rng, c)


def _litert_case(path, make_input=_noise):
    it = litert.Interpreter(model_path=path)
    it.allocate_tensors()
    rng = np.random.default_rng(4321)
    inputs = [make_input(path, d, rng).astype(d["dtype"]) for d in it.get_input_details()]
    for d, x in zip(it.get_input_details(), inputs):
        it.set_tensor(d["index"], x)
    it.invoke()
    return inputs, [it.get_tensor(d["index"]) for d in it.get_output_details()]


def _check(worker, path, precision, make_input=_noise):
    inputs, expected = _litert_case(path, make_input)
    worker.submit(open(path, "rb").read(), inputs, precision)
    outputs, summary = worker.result()
    assert summary["backend"] == worker.backend
    assert not summary["fallback"], f"ops left on the CPU: {summary['fallback']}"
    assert summary["ops_delegated"] + summary["ops_folded"] == summary["ops_total"]
    for i, (a, e) in enumerate(zip(outputs, expected)):
        assert_float_close(a, e, RTOL[precision], what=f"{os.path.basename(path)} on "
                                                       f"{worker.backend}/{precision} output {i}")


@pytest.mark.parametrize("name", MODELS)
def test_float_model_fully_delegated_matches_litert(shared_models, taichi_workers, name):
    for worker in taichi_workers:
        _check(worker, os.path.join(shared_models, f"{name}.tflite"), "fp32")


# fp16 on realistic inputs (bench/fp16_accuracy.py; bench/results/fp16_accuracy_2core.md). On
# selfie_segmentation's portrait a few mask pixels (16-40 of 65536, at the head's edge) move by
# 5-9% of the range even when every tensor is rounded to float16 once with float32 arithmetic
# (the "ideal f16 storage" column, computed in numpy): the model amplifies a 2**-12 rounding of
# its early 128x128 layers 400-fold there. No float16 storage of those layers meets 2e-2: it is
# the criterion's miss, recorded, not a tolerance to widen.
FP16_NOT_YET = {"selfie_segmentation": "f16 storage of its early layers moves edge pixels by "
                                       "5-9% of the range, ideal rounding included"}


@pytest.mark.parametrize("name", [pytest.param(m, marks=pytest.mark.xfail(
                                      strict=True, raises=AssertionError, reason=FP16_NOT_YET[m]))
                                  if m in FP16_NOT_YET else m for m in MODELS])
def test_fp16_on_vulkan_matches_litert_on_realistic_inputs(shared_models, vulkan_workers, name):
    _check(vulkan_workers[0], os.path.join(shared_models, f"{name}.tflite"), "fp16", _realistic)


# 20 seeded inputs in all; CI runs the first 3 of them (each is a full preserved-tensor
# run of MobileNet on three software backends), TFLITE_TAICHI_FULL=1 runs all 20.
INT8_INPUTS = 20 if os.environ.get("TFLITE_TAICHI_FULL") == "1" else 3


def test_mobilenet_v1_int8_fully_delegated_every_tensor_within_3_units(shared_models, taichi_workers):
    """The float view on the delegate: every int8 tensor of the int8 MobileNet (the output alone
    is a constant softmax for random inputs) within 3 units of LiteRT's XNNPACK path, over
    seeded inputs; the distribution of the differences is printed (bench/results has the full
    20-input table)."""
    path = os.path.join(shared_models, "mobilenet_v1_int8.tflite")
    model = open(path, "rb").read()
    with pytest.warns(UserWarning, match="preserve_all_tensors"):
        lite = litert.Interpreter(model_path=path, experimental_preserve_all_tensors=True)
    lite.allocate_tensors()
    histogram = {w.backend: np.zeros(4, np.int64) for w in taichi_workers}
    for seed in range(INT8_INPUTS):
        x = random_input(lite.get_input_details()[0], np.random.default_rng(seed))
        lite.set_tensor(lite.get_input_details()[0]["index"], x)
        lite.invoke()
        for worker in taichi_workers:
            worker.submit(model, [x], experimental_preserve_all_tensors=True)
        for worker in taichi_workers:
            outputs, summary = worker.result()
            assert not summary["fallback"] and summary["ops_delegated"] == 31, summary["fallback"]
            compared = 0
            for t, value in summary["tensors"].items():
                if value.dtype == np.int8:
                    diff = np.abs(value.astype(int) - lite.get_tensor(t).astype(int))
                    assert diff.max() <= 3, (f"{worker.backend} input {seed}: tensor {t} differs "
                                             f"by {diff.max()} units")
                    histogram[worker.backend] += np.bincount(diff.ravel(), minlength=4)
                    compared += 1
            assert compared >= 28, compared
    for backend, h in histogram.items():
        print(f"{backend}: |ours - LiteRT| in units 0/1/2/3 over {INT8_INPUTS} inputs: {h.tolist()}")
