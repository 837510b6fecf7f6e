"""Ops registered by tests (imported in-process and by backend workers through `plugins=`)."""
import numpy as np

from tflite_taichi import OpDef, register_op

# An op with a reference but no Taichi part: the delegate must leave it on the CPU.
CPU_ONLY = register_op(OpDef(name="CUSTOM:CpuOnlyAbs", infer=lambda node: [node.inputs[0].shape],
                             reference=lambda node, inputs: [np.abs(inputs[0])]), replace=True)
