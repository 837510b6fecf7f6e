"""tflite_taichi: run TensorFlow Lite models from Python, on a numpy reference path today and
on GPUs of any brand through Taichi with the delegate."""
import os as _os

# The source tree keeps ops/ and quant/ beside tflite_taichi/ (the installed package maps them
# to tflite_taichi.ops and tflite_taichi.quant, pyproject.toml's package-dir). Run from a clone's
# root, `import tflite_taichi` finds this folder first and would miss them: search the root too.
_root = _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))
if (not _os.path.isdir(_os.path.join(__path__[0], "ops"))
        and _os.path.isfile(_os.path.join(_root, "ops", "__init__.py"))
        and _os.path.isfile(_os.path.join(_root, "quant", "__init__.py"))):
    __path__.append(_root)

from tflite_taichi import errors  # noqa: E402,F401
from tflite_taichi.runtime import flavour as _flavour  # noqa: E402
_flavour.install()      # which Taichi (TFLITE_TAICHI_TAICHI), before anything imports it
from tflite_taichi.interpreter import Interpreter, SignatureRunner  # noqa: E402,F401
from tflite_taichi.ops.base import OpDef, Node, TensorSpec, register_op  # noqa: E402,F401

__version__ = "0.1.0"
__all__ = ["Interpreter", "SignatureRunner", "OpDef", "Node", "TensorSpec", "register_op", "errors"]
