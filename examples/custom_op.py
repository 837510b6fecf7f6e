"""Adding an op the package does not have: a Swish activation under the custom code "Swish".

    y = x * sigmoid(beta * x), beta stored in the op's custom_options as a little-endian float32.

One OpDef holds all of it: infer (shapes), reference (numpy: the CPU path and the ground
truth), and taichi (the delegate's kernel). Registering it is importing this module. Then a
model built with tflite_taichi.builder runs with it, on the delegate and on the reference path,
and tflite_taichi.testing.check_op property-tests it.

    python examples/custom_op.py [--backend cpu|vulkan|opengl|cuda|...]
"""
import argparse
import os
import struct
import sys
from dataclasses import dataclass

import numpy as np

from tflite_taichi import Fusion, OpDef, register_op
from tflite_taichi.ops.kit import ElementwiseStep, ti

OP_NAME = "CUSTOM:Swish"


@dataclass(frozen=True)
class SwishOptions:
    beta: float


def parse(op):
    """Custom ops get the model's Operator; their options are raw bytes."""
    raw = op.custom_options or b""
    if len(raw) != 4:
        from tflite_taichi.errors import ModelError
        raise ModelError(f"op #{op.index} ({OP_NAME}): custom_options must hold one float32 (beta)")
    return SwishOptions(beta=struct.unpack("<f", raw)[0])


def infer(node):
    return [node.inputs[0].shape]


def reference(node, inputs):
    x = inputs[0].astype(np.float32)
    return [x / (1.0 + np.exp(-node.options.beta * x))]


@ti.data_oriented
class SwishStep(ElementwiseStep):
    """The op kit's element-wise template gives the loop (one thread per element) and the fused
    variant (the same formula on a value its producer's store hands over: the delegate runs the
    op inside a CONV_2D's store, no task, no memory round trip); the op gives the formula."""

    def __init__(self, x, out, beta):
        super().__init__(x, out)
        self.beta = beta

    @ti.func
    def formula(self, v):
        return v / (1.0 + ti.exp(-self.beta * v))


def taichi(node, io):
    return SwishStep(io.inputs[0], io.outputs[0], node.options.beta)


# Fusion is declared: the step writes each element once (stores_once: an element-wise reader
# may run in its store), and it can itself run in its producer's store, for input 0.
SWISH = register_op(OpDef(name=OP_NAME, infer=infer, reference=reference, parse=parse,
                          taichi=taichi, min_inputs=1, max_inputs=1,
                          fusion=Fusion(stores_once=True, epilogue_inputs=lambda node: (0,))))


def build_model(beta: float = 1.5) -> bytes:
    """conv 3x3 -> Swish -> mean: a small model using the new op."""
    from tflite_taichi.builder import ModelBuilder
    rng = np.random.default_rng(0)
    b = ModelBuilder()
    g = b.subgraph()
    x = g.input("image", (1, 16, 16, 3))
    conv = g.tensor("conv", (1, 16, 16, 8))
    g.op("CONV_2D", [x, g.const("w", rng.normal(0, 0.5, (8, 3, 3, 3)).astype(np.float32)),
                     g.const("b", np.zeros(8, np.float32))], [conv], padding="SAME", stride_w=1, stride_h=1)
    act = g.tensor("swish", (1, 16, 16, 8))
    g.op(OP_NAME, [conv], [act], custom_options=struct.pack("<f", beta))
    pooled = g.tensor("pooled", (1, 8))
    g.op("MEAN", [act, g.const("axes", np.array([1, 2], np.int32))], [pooled])
    g.output(pooled)
    return b.finish()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="auto")
    parser.add_argument("--check", action="store_true", help="also property-test the op with check_op")
    args = parser.parse_args(argv)
    from tflite_taichi import Interpreter
    model = build_model()
    x = np.random.default_rng(1).uniform(-1, 1, (1, 16, 16, 3)).astype(np.float32)
    results = {}
    for backend in (args.backend, "reference"):
        it = Interpreter(model_content=model, backend=backend)
        it.allocate_tensors()
        it.set_tensor(it.get_input_details()[0]["index"], x)
        it.invoke()
        results[backend] = it.get_tensor(it.get_output_details()[0]["index"])
        s = it.summary()
        print(f"{backend:>9} -> {s['backend']:<9} delegated {s['ops_delegated']}/{s['ops_total']} ops, "
              f"partitions {[p['ops'] for p in s['partitions']]}, "
              f"fused (producer, op) {[f for p in s['partitions'] for f in p['fused']]}")
    diff = float(np.max(np.abs(results[args.backend] - results["reference"])))
    print(f"max |{args.backend} - reference| = {diff:.3g}")
    if args.check:
        from hypothesis import strategies as st
        from tflite_taichi.testing import BackendWorker, Input, Output, check_op, one_op_model

        @st.composite
        def swish_cases(draw):
            shape = tuple(draw(st.lists(st.integers(1, 6), min_size=1, max_size=4)))
            beta = float(np.float32(draw(st.floats(0.1, 4.0))))
            model = one_op_model(OP_NAME, [Input(shape)], [Output(shape)],
                                 custom_options=struct.pack("<f", beta))
            x = np.random.default_rng(draw(st.integers(0, 1000))).normal(0, 3, shape).astype(np.float32)
            return model, [x]
        # against the reference path on a Taichi backend (with no worker, and no LiteRT to
        # compare with, check_op would check nothing: it refuses)
        worker = BackendWorker("cpu" if args.backend == "auto" else args.backend)
        try:
            check_op(swish_cases(), workers=[worker], plugins=["custom_op"], max_examples=10)
        finally:
            worker.close()
        print(f"check_op: 10 Swish cases passed on {worker.backend} against the reference path")
    return 0 if diff <= 1e-5 * max(float(np.max(np.abs(results["reference"]))), 1e-30) else 1


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    sys.exit(main())
