"""Models of audio front ends: an input sized at run time whose placeholder size does not fit
the model (the command line's tests: --shape and what inspect says without it)."""
import numpy as np

from tflite_taichi.builder import ModelBuilder


def audio_front_end() -> bytes:
    """audio [-1, -1] (sized at run time) -> RESHAPE [1, 1, -1, 1] -> a 1x4 VALID CONV_2D of
    stride 4: at the placeholder size [1, 1] the window does not fit (an audio front end's
    failure without --shape)."""
    b = ModelBuilder()
    g = b.subgraph()
    x = g.input("audio", (1, 1), np.float32, shape_signature=(-1, -1))
    frames = g.tensor("frames", (1, 1, 1, 1), shape_signature=(1, 1, -1, 1))
    g.op("RESHAPE", [x, g.const("shape", np.array([1, 1, -1, 1], np.int32))], [frames])
    y = g.tensor("y", (1, 1, 1, 2), shape_signature=(1, 1, -1, 2))
    g.op("CONV_2D", [frames, g.const("w", np.ones((2, 1, 4, 1), np.float32)),
                     g.const("b", np.zeros(2, np.float32))], [y], padding="VALID", stride_h=1,
         stride_w=4)
    g.output(y)
    return b.finish()
