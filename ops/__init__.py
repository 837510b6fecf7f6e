"""Op implementations, one module per op family; importing this registers them all."""
from .base import REGISTRY, OpDef, Node, TensorSpec, Quantization, register_op, lookup  # noqa: F401

from . import (  # noqa: F401,E402  (imported for their registrations)
    activations,
    arith,
    compare,
    control,
    conv,
    elementwise,
    fft,
    indexing,
    layout,
    matmul,
    mediapipe,
    normalization,
    pooling,
    quantize,
    reduce,
    resize,
    sequence,
    shape,
    slicing,
    sparse,
    state,
)
