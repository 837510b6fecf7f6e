"""Sparse tensors: DENSIFY. The TFLite sparsity format itself (its types, `densify` and the
encoder `sparsify`) lives in tflite_taichi/tensors.py, below the model reader that densifies
sparse constants with it; its names are re-exported here.

Sparse constants are densified when the model is read (tflite_taichi/model.py calls `densify`),
so every op, FULLY_CONNECTED included, sees an ordinary constant; DENSIFY of one is then the
identity and is folded at prepare, so the delegate never sees it.
"""
from __future__ import annotations

import numpy as np

from tflite_taichi.quant import dequantize, is_float_view, quantize
from tflite_taichi.tensors import (  # noqa: F401  (re-exported: the format's old home)
    DENSE, FORMAT_NAMES, SPARSE_CSR, DimMetadata, Sparsity, densify, sparsify,
)

from .base import OpDef, register_op


# -- DENSIFY ----------------------------------------------------------------------------------
def _infer_densify(node):
    x, out = node.inputs[0], node.outputs[0]
    if x is None or x.value is None:
        name = x.name if x is not None else "(missing)"
        raise node.fail(f"input '{name}' must be a constant (sparse) tensor, as in LiteRT")
    if out.dtype is not None and np.dtype(out.dtype) != np.dtype(x.dtype):
        raise node.fail(f"output '{out.name}' is {np.dtype(out.dtype).name}, input '{x.name}' "
                        f"is {np.dtype(x.dtype).name}")
    return [tuple(x.shape)]


def _densify_reference(node, inputs):
    # The input was densified when the model was read; LiteRT copies the stored values, so a
    # quantized output reinterprets the input's integers under its own scale.
    x, out = node.inputs[0], node.outputs[0]
    value = np.array(inputs[0], copy=True)
    if is_float_view(x.dtype, x.quantization) and is_float_view(out.dtype, out.quantization):
        value = dequantize(quantize(value, x.quantization, x.dtype), out.quantization)
    return [value]


DENSIFY = register_op(OpDef(name="DENSIFY", infer=_infer_densify, reference=_densify_reference,
                            options_class="DensifyOptions", min_inputs=1, max_inputs=1))
