"""tflite_taichi: run TensorFlow Lite models from Python, on a numpy reference path today and
on GPUs of any brand through Taichi with the delegate."""
from tflite_taichi import errors  # noqa: F401
from tflite_taichi import ops as _ops  # noqa: F401  (registers the built-in ops)
from tflite_taichi.interpreter import Interpreter, SignatureRunner  # noqa: F401
from tflite_taichi.ops.base import OpDef, Node, TensorSpec, register_op  # noqa: F401

__version__ = "0.1.0"
__all__ = ["Interpreter", "SignatureRunner", "OpDef", "Node", "TensorSpec", "register_op", "errors"]
