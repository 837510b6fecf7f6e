"""Ops registered by tests (imported in-process and by backend workers through `plugins=`)."""
import numpy as np

from tflite_taichi import OpDef, register_op

# An op with a reference but no Taichi part: the delegate must leave it on the CPU.
CPU_ONLY = register_op(OpDef(name="CUSTOM:CpuOnlyAbs", infer=lambda node: [node.inputs[0].shape],
                             reference=lambda node, inputs: [np.abs(inputs[0])]), replace=True)


# An op whose Taichi code does not compile (a name its ti.func never defines): allocate_tensors()
# must raise KernelError naming it, not Taichi's bare exception.
from tflite_taichi.ops.kit import ElementwiseStep, ti  # noqa: E402  (lazy: no Taichi at import)


@ti.data_oriented
class _BrokenStep(ElementwiseStep):
    @ti.func
    def formula(self, v):
        return v * name_this_kernel_never_defines  # noqa: F821


BROKEN_TAICHI = register_op(OpDef(name="CUSTOM:BrokenTaichi", infer=lambda node: [node.inputs[0].shape],
                                  reference=lambda node, inputs: [inputs[0] * 2],
                                  taichi=lambda node, io: _BrokenStep(io.inputs[0], io.outputs[0])),
                            replace=True)
