"""The demo model: a small image classifier written with the builder, so the demo needs no file.

MobileNet-shaped: 3x3 conv (stride 2) + RELU6, depthwise 3x3 + RELU6, 1x1 conv + RELU6, a
residual ADD, average pool, MEAN, FULLY_CONNECTED, SOFTMAX. Seeded weights; same bytes each time.
"""
from __future__ import annotations

import numpy as np

from tflite_taichi.builder import ModelBuilder

DEMO_INPUT_SHAPE = (1, 96, 96, 3)
DEMO_CLASSES = 10


def build_demo_model(seed: int = 0) -> bytes:
    rng = np.random.default_rng(seed)

    def weights(*shape, fan_in):
        return (rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)).astype(np.float32)

    b = ModelBuilder(description="tflite_taichi demo classifier")
    g = b.subgraph("demo")
    x = g.input("image", DEMO_INPUT_SHAPE)
    h, w = DEMO_INPUT_SHAPE[1] // 2, DEMO_INPUT_SHAPE[2] // 2
    c1 = g.tensor("conv1", (1, h, w, 16))
    g.op("CONV_2D", [x, g.const("conv1/w", weights(16, 3, 3, 3, fan_in=27)),
                     g.const("conv1/b", np.zeros(16, np.float32))], [c1],
         padding="SAME", stride_w=2, stride_h=2, fused_activation_function="RELU6")
    d1 = g.tensor("dw1", (1, h, w, 16))
    g.op("DEPTHWISE_CONV_2D", [c1, g.const("dw1/w", weights(1, 3, 3, 16, fan_in=9)),
                               g.const("dw1/b", rng.uniform(-0.1, 0.1, 16).astype(np.float32))], [d1],
         padding="SAME", stride_w=1, stride_h=1, depth_multiplier=1, fused_activation_function="RELU6")
    p1 = g.tensor("pw1", (1, h, w, 16))
    g.op("CONV_2D", [d1, g.const("pw1/w", weights(16, 1, 1, 16, fan_in=16)),
                     g.const("pw1/b", np.zeros(16, np.float32))], [p1],
         padding="VALID", stride_w=1, stride_h=1, fused_activation_function="RELU6")
    r1 = g.tensor("residual", (1, h, w, 16))
    g.op("ADD", [c1, p1], [r1])
    pooled = g.tensor("pool", (1, h // 2, w // 2, 16))
    g.op("AVERAGE_POOL_2D", [r1], [pooled], padding="VALID", stride_w=2, stride_h=2,
         filter_width=2, filter_height=2)
    feat = g.tensor("features", (1, 16))
    g.op("MEAN", [pooled, g.const("mean/axes", np.array([1, 2], np.int32))], [feat], keep_dims=False)
    logits = g.tensor("logits", (1, DEMO_CLASSES))
    g.op("FULLY_CONNECTED", [feat, g.const("fc/w", weights(DEMO_CLASSES, 16, fan_in=16)),
                             g.const("fc/b", np.zeros(DEMO_CLASSES, np.float32))], [logits])
    probs = g.tensor("probabilities", (1, DEMO_CLASSES))
    g.op("SOFTMAX", [logits], [probs], beta=1.0)
    g.output(probs)
    b.signature("serving_default", 0, {"image": x}, {"probabilities": probs})
    return b.finish()


def build_tiny_mlp(seed: int = 0) -> bytes:
    """A tiny MLP classifier, FC 32 -> 64 (RELU) -> 10, softmax: the model backend='auto' should
    keep on the CPU (costs.py; measured by bench/cost_constants.py, tested by tests/test_costs.py)."""
    rng = np.random.default_rng(seed)
    b = ModelBuilder(description="tflite_taichi tiny MLP")
    g = b.subgraph()
    x = g.input("x", (1, 32))
    h = g.tensor("h", (1, 64))
    g.op("FULLY_CONNECTED", [x, g.const("w1", rng.uniform(-1, 1, (64, 32)).astype(np.float32)),
                             g.const("b1", np.zeros(64, np.float32))], [h], fused_activation_function="RELU")
    z = g.tensor("z", (1, 10))
    g.op("FULLY_CONNECTED", [h, g.const("w2", rng.uniform(-1, 1, (10, 64)).astype(np.float32)),
                             g.const("b2", np.zeros(10, np.float32))], [z])
    y = g.tensor("y", (1, 10))
    g.op("SOFTMAX", [z], [y], beta=1.0)
    g.output(y)
    return b.finish()

