"""Op implementations, one module per op family. A family is imported when a model first
names one of its ops (index.py lists which module defines which op); load_all() imports them
all, e.g. to list every op."""
from .base import (REGISTRY, OpDef, Node, TensorSpec, Quantization, register_op, lookup,  # noqa: F401
                   load_all, builtin)
