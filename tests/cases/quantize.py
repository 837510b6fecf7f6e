"""Cases for QUANTIZE and DEQUANTIZE: the integer types and requantization pairs, each type's
quantization parameters and the reals its grid covers (used by test_ops_quantize.py and the
activations' delegate table, cases/activations.py)."""
import numpy as np
from hypothesis import strategies as st
from tflite_taichi.testing import strategies


S = strategies()


INTS = {"int8": np.int8, "uint8": np.uint8, "int16": np.int16}


REQUANTIZE = [("int8", "int8"), ("int8", "uint8"), ("uint8", "int8"), ("uint8", "uint8"),
              ("int16", "int16"), ("int16", "int8")]


def quant_params(dtype):
    """(scale, zero_point) for `dtype`; int16 scales reach lower to use its range."""
    if np.dtype(dtype) == np.int16:
        return st.tuples(S.scales(1e-5, 1e-2), st.just(0))
    return S.quant_params(dtype)


def _real_range(dtype, q, margin=0.1):
    """The reals the grid of (dtype, q) covers, widened by `margin` so clamping is exercised."""
    info = np.iinfo(dtype)
    lo, hi = (info.min - q[1]) * q[0], (info.max - q[1]) * q[0]
    pad = margin * (hi - lo)
    return lo - pad, hi + pad
