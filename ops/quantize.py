"""DEQUANTIZE and QUANTIZE.

On the float view both are identities: a quantized tensor already holds its real values, so
DEQUANTIZE (int8/uint8/int16 -> float32) just hands them on as float32, and float16 -> float32
is a cast. QUANTIZE (float32 -> int8/uint8/int16, and the requantizations int8 -> int8 with a
new scale, uint8 <-> int8, int16 -> int16/int8) returns its input: the runtime snaps the output
to its quantization grid (fake-quant), which is exactly TFLite's round(x / scale) + zero_point
with clamping. Float16 weights behind DEQUANTIZE are constants, so they fold at prepare.

Taichi: both are a `CopyStep` (one thread per element). DEQUANTIZE of a run-time tensor hands
the float view on (float16 -> float32 is the load's cast); QUANTIZE writes its input through the
output's store, which snaps it to the output's grid: float -> int8 quantization and int8 -> int8
requantization alike. Both fuse into their producer's store (Fusion.epilogue_inputs): there a
QUANTIZE is the snap alone. A quantized model input is dequantized on the CPU before the partition, so
a QUANTIZE/DEQUANTIZE at the model boundary still runs here, as a snap or an identity.
"""
import numpy as np

from .base import ELEMENTWISE_UNARY, OpDef, register_op
from .kit import CopyStep

_QUANTIZED_INTS = {np.dtype(np.int8), np.dtype(np.uint8), np.dtype(np.int16)}


def _name(dtype) -> str:
    return np.dtype(dtype).name


def _infer_dequantize(node):
    x, out = node.inputs[0], node.outputs[0]
    if x.dtype is not None:
        dtype = np.dtype(x.dtype)
        if dtype == np.float16:
            pass
        elif dtype in _QUANTIZED_INTS:
            if not x.is_quantized:
                raise node.fail(f"input '{x.name}' ({_name(dtype)}) has no quantization parameters")
        else:
            raise node.fail(f"input '{x.name}' has dtype {_name(dtype)}; expected float16, "
                            "int8, uint8 or int16")
    if out.dtype is not None and np.dtype(out.dtype) != np.float32:
        raise node.fail(f"output '{out.name}' has dtype {_name(out.dtype)}; expected float32")
    return [tuple(x.shape)]


def _dequantize_reference(node, inputs):
    return [np.asarray(inputs[0]).astype(np.float32)]


_QUANTIZE_INPUTS = {np.dtype(np.float32)} | _QUANTIZED_INTS
_QUANTIZE_OUTPUTS = _QUANTIZED_INTS | {np.dtype(np.int32)}


def _infer_quantize(node):
    x, out = node.inputs[0], node.outputs[0]
    if x.dtype is not None:
        dtype = np.dtype(x.dtype)
        if dtype not in _QUANTIZE_INPUTS:
            raise node.fail(f"input '{x.name}' has dtype {_name(dtype)}; expected float32, "
                            "int8, uint8 or int16")
        if dtype in _QUANTIZED_INTS and not x.is_quantized:
            raise node.fail(f"input '{x.name}' ({_name(dtype)}) has no quantization parameters")
    if out.dtype is not None and np.dtype(out.dtype) not in _QUANTIZE_OUTPUTS:
        raise node.fail(f"output '{out.name}' has dtype {_name(out.dtype)}; expected int8, "
                        "uint8, int16 or int32")
    if not out.is_quantized:
        raise node.fail(f"output '{out.name}' has no quantization parameters")
    if np.any(out.quantization.scale <= 0) or not np.all(np.isfinite(out.quantization.scale)):
        raise node.fail(f"output '{out.name}' has a non-positive or non-finite scale")
    return [tuple(x.shape)]


def _quantize_reference(node, inputs):
    # The float view: the runtime fake-quantizes this to the output's grid.
    return [np.asarray(inputs[0], np.float32)]


# -- Taichi ------------------------------------------------------------------------------------
def _copy_taichi(node, io):
    return CopyStep(io.inputs[0], io.outputs[0])


DEQUANTIZE = register_op(OpDef(name="DEQUANTIZE", infer=_infer_dequantize,
                               reference=_dequantize_reference, taichi=_copy_taichi,
                               min_inputs=1, max_inputs=1, fusion=ELEMENTWISE_UNARY))
QUANTIZE = register_op(OpDef(name="QUANTIZE", infer=_infer_quantize,
                             reference=_quantize_reference, taichi=_copy_taichi,
                             min_inputs=1, max_inputs=1, fusion=ELEMENTWISE_UNARY))
