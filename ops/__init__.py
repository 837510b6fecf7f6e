"""Op implementations, one module per op family; importing this registers them all."""
from .base import REGISTRY, OpDef, Node, TensorSpec, Quantization, register_op, lookup  # noqa: F401

from . import (  # noqa: F401,E402  (imported for their registrations)
    activations,
    arith,
    compare,
    control,
    conv,
    detection,
    elementwise,
    fft,
    indexing,
    layout,
    matmul,
    mediapipe,
    normalization,
    pooling,
    quantize,
    recurrent,
    reduce,
    resize,
    scatter,
    sequence,
    shape,
    slicing,
    sparse,
    state,
    transforms,
)

# The ops this package defines, as registered at import (a compile worker process finds a
# program's ops here by name: runtime/compile_workers.py; a user's registration does not change it)
BUILTIN = dict(REGISTRY)
