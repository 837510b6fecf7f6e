"""The float view of 8-bit (and 16-bit) quantized models.

As the official GPU delegate does: every quantized tensor is carried as float32 holding its
real value. Constants are dequantized once at prepare time; model inputs are dequantized and
outputs quantized on the CPU at each invoke; the output of every op whose tensor is quantized
in the model passes through `fake_quant`, which snaps it to the values its integer form can
represent, so errors do not drift away from what the integer kernels compute.
"""
from .floatview import (  # noqa: F401  (the package's API)
    dequantize, fake_quant, is_float_view, quantize, quantized_range, round_half_away, view_dtype,
)
from .kinds import model_kind  # noqa: F401,E402
