"""RFFT2D and COMPLEX_ABS vs LiteRT through one-op models (and the two chained, a spectrogram's
magnitude). Complex outputs are compared as (real, imaginary) pairs: float tolerance of
tflite_taichi.testing on the largest magnitude of either part."""
import numpy as np
import pytest
from hypothesis import given, strategies as st

from tflite_taichi.builder import ModelBuilder
from tflite_taichi.errors import ModelError
from tflite_taichi.testing import (Const, Input, Output, assert_float_close, check_against_litert,
                                   one_op_model, run_litert, run_ours, strategies)

S = strategies()


def as_pairs(z):
    """complex64 [...] -> float32 [..., 2] (real, imaginary), for the float comparison."""
    z = np.asarray(z)
    assert z.dtype == np.complex64, z.dtype
    return np.stack([z.real, z.imag], axis=-1)


@st.composite
def rfft2d_case(draw):
    """(input shape, fft_length): rank 2 to 4; lengths powers of two that crop or pad the
    input. Widths >= 2: LiteRT 2.3 returns wrong values for a width of 1."""
    shape = draw(S.shapes(2, 4, 1, 9))
    fft_length = (2 ** draw(st.integers(0, 4)), 2 ** draw(st.integers(1, 5)))
    return shape, fft_length


def rfft2d_model(shape, fft_length):
    out = tuple(shape[:-2]) + (fft_length[0], fft_length[1] // 2 + 1)
    return one_op_model("RFFT2D", [Input(shape), Const(np.array(fft_length, np.int32))],
                        [Output(out, np.complex64)])


@given(case=rfft2d_case(), seed=S.seeds())
def test_rfft2d_matches_litert(case, seed):
    shape, fft_length = case
    model = rfft2d_model(shape, fft_length)
    x = np.random.default_rng(seed).uniform(-3, 3, shape).astype(np.float32)
    expected = run_litert(model, [x])[0]
    actual = run_ours(model, [x])[0]
    assert_float_close(as_pairs(actual), as_pairs(expected))


def test_rfft2d_width_1():
    # LiteRT 2.3 gets these wrong; the DFT over one column is np.fft.rfft2's
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    actual = run_ours(rfft2d_model((2, 3), (4, 1)), [x])[0]
    np.testing.assert_allclose(actual, np.fft.rfft2(x, s=(4, 1)), rtol=1e-6, atol=1e-6)


@given(shape=S.shapes(0, 4, 1, 6), seed=S.seeds())
def test_complex_abs_matches_litert(shape, seed):
    rng = np.random.default_rng(seed)
    z = (rng.normal(size=shape) + 1j * rng.normal(size=shape)).astype(np.complex64)
    model = one_op_model("COMPLEX_ABS", [Input(shape, np.complex64)], [Output(shape)])
    check_against_litert(model, [z])


def test_rfft2d_then_complex_abs_matches_litert():
    b = ModelBuilder()
    g = b.subgraph()
    x = g.input("x", (2, 5, 7))
    n = g.const("fft_length", np.array([8, 16], np.int32))
    spectrum = g.tensor("spectrum", (2, 8, 9), np.complex64)
    magnitude = g.tensor("magnitude", (2, 8, 9))
    g.op("RFFT2D", [x, n], [spectrum])
    g.op("COMPLEX_ABS", [spectrum], [magnitude])
    g.output(magnitude)
    check_against_litert(b.finish(), seed=3)


# -- invalid attributes --------------------------------------------------------------------------
@pytest.mark.parametrize("fft_length", [[3, 4], [4, 6], [0, 4], [4, -2]])
def test_rfft2d_lengths_must_be_powers_of_two(fft_length):
    model = one_op_model("RFFT2D", [Input((4, 4)), Const(np.array(fft_length, np.int32))],
                         [Output((4, 3), np.complex64)])
    with pytest.raises(ModelError, match="RFFT2D.*powers of two"):
        run_ours(model, [np.zeros((4, 4), np.float32)])


def test_rfft2d_fft_length_given_at_run_time_matches_litert():
    # a run-time fft_length: the op is inferred at invoke, as LiteRT's dynamic output
    model = one_op_model("RFFT2D", [Input((4, 4)), Input((2,), np.int32)],
                         [Output((4, 3), np.complex64)])
    x = np.random.default_rng(0).uniform(-1, 1, (4, 4)).astype(np.float32)
    check_against_litert(model, [x, np.array([4, 4], np.int32)])


@pytest.mark.parametrize("fft_length", [[4], [4, 4, 4]])
def test_rfft2d_fft_length_must_have_two_entries(fft_length):
    model = one_op_model("RFFT2D", [Input((4, 4)), Const(np.array(fft_length, np.int32))],
                         [Output((4, 3), np.complex64)])
    with pytest.raises(ModelError, match="RFFT2D.*shape"):
        run_ours(model, [np.zeros((4, 4), np.float32)])


def test_rfft2d_needs_rank_2():
    model = one_op_model("RFFT2D", [Input((4,)), Const(np.array([4, 4], np.int32))],
                         [Output((4, 3), np.complex64)])
    with pytest.raises(ModelError, match="RFFT2D.*rank"):
        run_ours(model, [np.zeros(4, np.float32)])


def test_complex_abs_needs_complex():
    model = one_op_model("COMPLEX_ABS", [Input((3,))], [Output((3,))])
    with pytest.raises(ModelError, match="COMPLEX_ABS.*complex64"):
        run_ours(model, [np.zeros(3, np.float32)])


def test_assert_float_close_compares_imaginary_parts():
    from tflite_taichi.testing import assert_float_close
    z = np.array([1 + 1j, 2 - 1j], np.complex64)
    assert_float_close(z, z.copy())
    with pytest.raises(AssertionError, match="max"):
        assert_float_close(z, np.array([1 + 1j, 2 + 1j], np.complex64))
