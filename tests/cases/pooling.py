"""Cases for the pools: the LiteRT tests' case space of AVERAGE_POOL_2D, MAX_POOL_2D and
L2_POOL_2D (shapes, filter, stride, padding, activation), used by test_ops_pooling.py, the
delegate's conv table (cases/conv.py) and the quantized tests."""
from hypothesis import strategies as st
from tflite_taichi.testing import strategies


S = strategies()


@st.composite
def pool_case(draw):
    padding = draw(st.sampled_from(["SAME", "VALID"]))
    k = (draw(st.integers(1, 5)), draw(st.integers(1, 5)))
    s = (draw(st.integers(1, 4)), draw(st.integers(1, 4)))
    size = [draw(st.integers(kk if padding == "VALID" else 1, 12)) for kk in k]
    out = [-(-n // st_) if padding == "SAME" else (n - kk) // st_ + 1
           for n, kk, st_ in zip(size, k, s)]
    n, c = draw(st.integers(1, 2)), draw(st.integers(1, 8))
    return dict(in_shape=(n, *size, c), out_shape=(n, *out, c),
                options=dict(padding=padding, filter_height=k[0], filter_width=k[1],
                             stride_h=s[0], stride_w=s[1],
                             fused_activation_function=draw(S.activations())))
