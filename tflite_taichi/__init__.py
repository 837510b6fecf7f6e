"""tflite_taichi: run TensorFlow Lite models from Python, on a numpy reference path today and
on GPUs of any brand through Taichi with the delegate.

ops/ and quant/ stand at the top of the source tree; the installed package holds them as
tflite_taichi.ops and tflite_taichi.quant (pyproject.toml's package-dir), and in the source tree
the links tflite_taichi/ops and tflite_taichi/quant point at them, so `import tflite_taichi`
from a clone's root finds them too (docs/layout.md)."""
from tflite_taichi import errors  # noqa: F401
from tflite_taichi.runtime import taichi_build as _taichi_build
_taichi_build.install()      # which Taichi (TFLITE_TAICHI_TAICHI), before anything imports it
from tflite_taichi.interpreter import Interpreter, SignatureRunner  # noqa: E402,F401
from tflite_taichi.ops.base import Fusion, OpDef, Node, State, TensorSpec, register_op  # noqa: E402,F401
from tflite_taichi.version import __version__  # noqa: E402,F401

__all__ = ["Interpreter", "SignatureRunner", "Fusion", "OpDef", "Node", "State", "TensorSpec", "register_op",
           "errors"]
