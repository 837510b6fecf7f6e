"""Whole real models (../shared/models) through the Interpreter API against LiteRT.

Tolerances: a float model within 1e-4 of the output's largest magnitude (float32
summation order differs between numpy's BLAS and LiteRT's kernels over ~30 layers); an int8
model within 3 units (our float view rounds once per op where LiteRT's integer kernels use
fixed-point multipliers, and one-unit differences can propagate a few layers).
"""
import os

import numpy as np
import pytest

from tflite_taichi import Interpreter
from tflite_taichi.testing import (assert_float_close, assert_quantized_close, random_input,
                                   synthetic_portrait)

litert = pytest.importorskip("ai_edge_litert.interpreter")

FLOAT_MODELS = ["face_detection_short_range", "iris_landmark", "hand_landmark_lite",
                "mobilenet_v1_fp32", "selfie_segmentation"]
MODEL_RTOL = 1e-4
INT8_UNITS = 3
INVOKES = 3

pytestmark = pytest.mark.models


def _compare_every_op_output(path, check, make_input=None):
    """Three seeded invokes; every op's output (not only the model's, which for a randomly
    initialised classifier can be a near-constant softmax) held against LiteRT's default
    (XNNPACK) path with all tensors preserved. `make_input(detail, rng)`: the inputs (default
    uniform 0..1)."""
    ours = Interpreter(model_path=path, backend="reference")
    ours.allocate_tensors()
    with pytest.warns(UserWarning, match="preserve_all_tensors"):
        theirs = litert.Interpreter(model_path=path, experimental_preserve_all_tensors=True)
    theirs.allocate_tensors()
    # Ops folded at prepare (DEQUANTIZE of float16 weights) are constants: XNNPACK packs them
    # into its weights and never writes their tensors; their consumers check them.
    folded = {row["index"] for row in ours.op_table() if row["folded"]}
    rng = np.random.default_rng(1234)
    compared = 0
    for _ in range(INVOKES):
        for d in ours.get_input_details():
            x = make_input(d, rng) if make_input else random_input(d, rng, 0.0, 1.0)
            ours.set_tensor(d["index"], x)
            theirs.set_tensor(d["index"], x)
        ours.invoke()
        theirs.invoke()
        for op in ours.model.main.operators:
            if op.index in folded:
                continue
            for t in op.outputs:
                tensor = ours.model.main.tensors[t]
                check(ours.get_tensor(t), theirs.get_tensor(t), f"op #{op.index} {op.name} -> '{tensor.name}'")
                compared += 1
    return compared


# selfie_segmentation's mask on uniform noise is a sigmoid tail (~1e-9): its relative error is
# the logits' absolute error (~2e-4 after 245 float32 ops, summation order), not a property of
# the mask. On a picture of a person its mask spans 0..0.7 and every op holds 1e-4.
MODEL_INPUTS = {"selfie_segmentation": lambda d, rng: synthetic_portrait(*d["shape"][1:3], rng)}


@pytest.mark.parametrize("name", FLOAT_MODELS)
def test_float_model_matches_litert(shared_models, name):
    path = os.path.join(shared_models, f"{name}.tflite")
    assert _compare_every_op_output(
        path, lambda a, e, what: assert_float_close(a, e, MODEL_RTOL, what=f"{name}: {what}"),
        MODEL_INPUTS.get(name)) > 0


def test_mobilenet_v1_int8_matches_litert(shared_models):
    """Measured: every int8 tensor within 2 units of XNNPACK (LiteRT's optimized builtin kernels
    reach 5 units in layers 8-10, so XNNPACK, LiteRT's default, is the reference here)."""
    path = os.path.join(shared_models, "mobilenet_v1_int8.tflite")

    def check(a, e, what):
        if a.dtype == np.int8:
            assert_quantized_close(a, e, INT8_UNITS, what=f"int8: {what}")
        else:
            np.testing.assert_array_equal(a, e, err_msg=what)
    assert _compare_every_op_output(path, check) > 0


@pytest.mark.parametrize("name", FLOAT_MODELS + ["mobilenet_v1_int8"])
def test_inferred_shapes_match_the_declared_ones(shared_models, name):
    """Our shape inference agrees with the converter's shapes on every tensor of real models."""
    it = Interpreter(model_path=os.path.join(shared_models, f"{name}.tflite"), backend="reference")
    it.allocate_tensors()
    sg = it.model.main
    specs = it._main.prepared.specs
    wrong = [(t.name, list(t.shape), list(specs[t.index].shape)) for t in sg.tensors
             if t.dtype is not None and tuple(t.shape) != tuple(specs[t.index].shape)]
    assert not wrong, wrong[:5]
