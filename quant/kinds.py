"""What kind of quantized model a file is, in the words of the TFLite converter's options."""
from __future__ import annotations

import numpy as np


def model_kind(model) -> str:
    """One of: 'float32', 'float16 weights', 'dynamic-range (int8 weights, float activations)',
    'full-integer int8', 'full-integer uint8', 'full-integer 16x8 (int16 activations, int8
    weights)', with ', float IO' when a full-integer model takes or returns float32."""
    runtime, constant = set(), set()
    for sg in model.subgraphs:
        for t in sg.tensors:
            if t.dtype is None or t.quantization is None or t.dtype.kind not in "iu":
                continue
            (constant if t.data is not None else runtime).add(np.dtype(t.dtype))
    main = model.main
    io = [main.tensors[t].dtype for t in list(main.inputs) + list(main.outputs)]
    float_io = any(d is not None and d.kind == "f" for d in io)
    if runtime:
        if np.dtype(np.int16) in runtime:
            kind = "full-integer 16x8 (int16 activations, int8 weights)"
        elif np.dtype(np.uint8) in runtime and np.dtype(np.int8) not in runtime:
            kind = "full-integer uint8"
        else:
            kind = "full-integer int8" + (" (uint8 at the edges)" if np.dtype(np.uint8) in runtime else "")
        return kind + (", float IO" if float_io else "")
    if constant & {np.dtype(np.int8), np.dtype(np.uint8)}:
        return "dynamic-range (int8 weights, float activations)"
    if any(t.dtype == np.float16 and t.data is not None for sg in model.subgraphs for t in sg.tensors):
        return "float16 weights"
    return "float32"
