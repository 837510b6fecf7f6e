"""MediaPipe's CUSTOM:MaxPoolingWithArgmax2D and CUSTOM:MaxUnpooling2D vs LiteRT and vs a
direct transcription of MediaPipe's kernels (ops/mediapipe.py gives the semantics).

LiteRT has no CPU kernel for them: only its default XNNPACK delegate runs them, so the LiteRT
tests use kernels="xnnpack", within XNNPACK's limits (stride == filter, activation NONE,
VALID padding for MaxUnpooling2D). XNNPACK keeps the index as a raw uint32 counted
column-major (kx * filter_h + ky) whatever the index tensor's type, so:
- its index output, read as uint32, is translated to MediaPipe's row-major index;
- a one-op MaxUnpooling2D gets XNNPACK's encoding from LiteRT and MediaPipe's from us;
- a pool -> unpool model is compared as it is.
With top/left padding (SAME, total padding >= 2) XNNPACK's window repeats the first input
row/column in the padded slots and can report a padded slot: there the tests compare the input
element both indices point at rather than the index.

The numpy transcriptions take every stride, padding, activation and index (out of the window,
negative, fractional, NaN) MediaPipe's CPU kernel takes. Tolerances: the values are copies, so
exact equality."""
import struct

import numpy as np
import pytest
from hypothesis import given, strategies as st

from tflite_taichi.errors import ModelError
from tflite_taichi.ops.mediapipe import pool_params_bytes
from tflite_taichi.testing import Input, Output, one_op_model, run_litert, run_ours, strategies
from cases.mediapipe import POOL, UNPOOL, _data, _window_indices, chain_model, pool_case, pool_model, pool_out_size, unpool_case, unpool_model

S = strategies()


def pool_pad_before(padding, size, f, s):
    out = pool_out_size(padding, size, f, s)
    return max((out - 1) * s + f - size, 0) // 2


def xnnpack_to_row_major(raw, f):
    """XNNPACK's column-major window index (a uint32 in the tensor's bytes) -> row-major."""
    k = np.asarray(raw).view(np.uint32).astype(np.int64)
    return (k % f[0]) * f[1] + k // f[0]


def row_major_to_xnnpack(index, f):
    """MediaPipe's row-major window index -> XNNPACK's column-major uint32, as float32 bytes."""
    index = np.asarray(index, np.int64)
    return ((index % f[1]) * f[0] + index // f[1]).astype(np.uint32).view(np.float32)


# -- direct transcriptions of MediaPipe's CPU kernels ----------------------------------------
CLAMPS = {1: (0.0, np.inf), 2: (-1.0, 1.0), 3: (0.0, 6.0)}


def numpy_pool(x, case):
    """max_pool_argmax.cc's MaxPoolArgmax, loop for loop (index without its +0.1)."""
    (f_h, f_w), (s_h, s_w) = case["f"], case["s"]
    n, h, w, c = x.shape
    _, oh, ow, _ = case["out_shape"]
    pad_h = pool_pad_before(case["padding"], h, f_h, s_h)
    pad_w = pool_pad_before(case["padding"], w, f_w, s_w)
    lo, hi = CLAMPS.get(case["act"], (-np.inf, np.inf))
    values = np.zeros((n, oh, ow, c), np.float32)
    index = np.zeros((n, oh, ow, c), np.int64)
    for b in range(n):
        for oy in range(oh):
            for ox in range(ow):
                for ch in range(c):
                    y0, x0 = oy * s_h - pad_h, ox * s_w - pad_w
                    best, by, bx = np.float32(np.finfo(np.float32).min), 0, 0
                    for fy in range(max(0, -y0), min(f_h, h - y0)):
                        for fx in range(max(0, -x0), min(f_w, w - x0)):
                            cur = x[b, y0 + fy, x0 + fx, ch]
                            if cur > best:
                                best, by, bx = cur, fy, fx
                    values[b, oy, ox, ch] = min(max(best, lo), hi)
                    index[b, oy, ox, ch] = by * f_w + bx
    return values, index


def numpy_unpool(x, idx, f, s):
    """max_unpooling.cc's MaxUnpooling, loop for loop (a non-finite index is skipped here)."""
    n, h, w, c = x.shape
    out = np.zeros((n, h * f[0], w * f[1], c), np.float32)
    pad_h = max(0, ((h - 1) * s[0] + f[0] - h * f[0]) // 2)
    pad_w = max(0, ((w - 1) * s[1] + f[1] - w * f[1]) // 2)
    for b in range(n):
        for y in range(h):
            for xx in range(w):
                for ch in range(c):
                    v = float(idx[b, y, xx, ch])
                    if not np.isfinite(v) or abs(v) >= 2.0 ** 31:
                        continue
                    i = int(v)                         # truncates toward zero, as C does
                    q = abs(i) // f[1] * (1 if i >= 0 else -1)
                    r = i - q * f[1]
                    oy, ox = y * s[0] - pad_h + q, xx * s[1] - pad_w + r
                    if 0 <= oy < out.shape[1] and 0 <= ox < out.shape[2]:
                        out[b, oy, ox, ch] = x[b, y, xx, ch]
    return out


def _pointed_input(index, case, clamp):
    """(row, column) of the input element each row-major window index points at; `clamp`:
    XNNPACK's padded slots read the nearest edge element."""
    (f_h, f_w), (s_h, s_w) = case["f"], case["s"]
    _, h, w, _ = case["in_shape"]
    _, oh, ow, _ = case["out_shape"]
    oy = np.arange(oh).reshape(1, -1, 1, 1)
    ox = np.arange(ow).reshape(1, 1, -1, 1)
    y = oy * s_h - pool_pad_before(case["padding"], h, f_h, s_h) + index // f_w
    x = ox * s_w - pool_pad_before(case["padding"], w, f_w, s_w) + index % f_w
    if clamp:
        y, x = np.clip(y, 0, h - 1), np.clip(x, 0, w - 1)
    return y, x


# -- MaxPoolingWithArgmax2D -------------------------------------------------------------------
@given(case=pool_case(xnnpack=True), seed=S.seeds())
def test_pool_matches_litert_xnnpack(case, seed):
    x = _data(np.random.default_rng(seed), case["in_shape"])
    model = pool_model(case)
    lv, li = run_litert(model, [x], "xnnpack")
    ov, oi = run_ours(model, [x])
    np.testing.assert_array_equal(ov, lv)
    assert oi.dtype == np.float32 and np.array_equal(oi, np.round(oi))
    ours, theirs = oi.astype(np.int64), xnnpack_to_row_major(li, case["f"])
    _, h, w, _ = case["in_shape"]
    if (pool_pad_before(case["padding"], h, case["f"][0], case["s"][0]) == 0
            and pool_pad_before(case["padding"], w, case["f"][1], case["s"][1]) == 0):
        np.testing.assert_array_equal(ours, theirs)
    else:       # XNNPACK may name a padded slot holding a copy of the same input element
        for a, b in zip(_pointed_input(ours, case, False), _pointed_input(theirs, case, True)):
            np.testing.assert_array_equal(a, b)


@given(case=pool_case(), ties=st.booleans(), seed=S.seeds())
def test_pool_matches_numpy(case, ties, seed):
    """Every stride (overlapping windows, gaps), activation, padding; ties keep the first
    maximum in row-major window order."""
    x = _data(np.random.default_rng(seed), case["in_shape"], ties)
    values, index = run_ours(pool_model(case), [x])
    expected_values, expected_index = numpy_pool(x, case)
    np.testing.assert_array_equal(values, expected_values)
    np.testing.assert_array_equal(index, expected_index.astype(np.float32))


@pytest.mark.parametrize("index_dtype", ["int32", "int32_q"])
def test_pool_int32_indices(index_dtype):
    """int32 index outputs hold the same integers; XNNPACK takes the quantized (scale 1) form."""
    case = dict(padding="SAME", f=(2, 2), s=(2, 2), in_shape=(1, 5, 4, 3), out_shape=(1, 3, 2, 3),
                act=0)
    x = _data(np.random.default_rng(4), case["in_shape"])
    values, index = run_ours(pool_model(case, index_dtype), [x])
    assert index.dtype == np.int32
    np.testing.assert_array_equal(index, numpy_pool(x, case)[1])
    if index_dtype == "int32_q":
        lv, li = run_litert(pool_model(case, index_dtype), [x], "xnnpack")
        np.testing.assert_array_equal(values, lv)
        np.testing.assert_array_equal(index, xnnpack_to_row_major(li, case["f"]))


def test_pool_special_values():
    """-inf and NaN never win a strict >: a window of them reports float32's lowest, index 0,
    as MediaPipe's kernel starts from that value."""
    case = dict(padding="VALID", f=(2, 2), s=(2, 2), in_shape=(1, 2, 4, 1), out_shape=(1, 1, 2, 1),
                act=0)
    x = np.array([-np.inf, np.nan, 1.0, np.nan, -np.inf, np.nan, np.nan, 2.0],
                 np.float32).reshape(1, 2, 4, 1)
    values, index = run_ours(pool_model(case), [x])
    np.testing.assert_array_equal(values.ravel(), [np.finfo(np.float32).min, 2.0])
    np.testing.assert_array_equal(index.ravel(), [0, 3])


@given(case=unpool_case(xnnpack=True), seed=S.seeds())
def test_unpool_matches_litert_xnnpack(case, seed):
    rng = np.random.default_rng(seed)
    x, index = _data(rng, case["in_shape"]), _window_indices(rng, case)
    model = unpool_model(case["in_shape"], case["f"], case["s"])
    (expected,) = run_litert(model, [x, row_major_to_xnnpack(index, case["f"])], "xnnpack")
    (actual,) = run_ours(model, [x, index.astype(np.float32)])
    np.testing.assert_array_equal(actual, expected)


@given(case=pool_case(xnnpack=True), seed=S.seeds())
def test_pool_then_unpool_matches_litert_xnnpack(case, seed):
    _, h, w, _ = case["in_shape"]
    # XNNPACK's padded-slot indices (padding before > 0) unpool elsewhere: see the docstring
    if (pool_pad_before(case["padding"], h, case["f"][0], case["s"][0])
            or pool_pad_before(case["padding"], w, case["f"][1], case["s"][1])):
        case = dict(case, padding="VALID", in_shape=(case["in_shape"][0],) + tuple(
            ff * max(1, sz // ff) for ff, sz in zip(case["f"], (h, w))) + case["in_shape"][3:])
        case["out_shape"] = (case["in_shape"][0], case["in_shape"][1] // case["f"][0],
                             case["in_shape"][2] // case["f"][1], case["in_shape"][3])
    x = _data(np.random.default_rng(seed), case["in_shape"])
    model = chain_model(case)
    (expected,) = run_litert(model, [x], "xnnpack")
    (actual,) = run_ours(model, [x])
    np.testing.assert_array_equal(actual, expected)


@given(case=unpool_case(), kind=st.sampled_from(["window", "any", "fractional", "int32"]),
       seed=S.seeds())
def test_unpool_matches_numpy(case, kind, seed):
    """Every stride (overlaps: the last in NHWC order wins; gaps), padding and activation (both
    unused), and indices outside the window, negative or fractional (truncated)."""
    rng = np.random.default_rng(seed)
    x = _data(rng, case["in_shape"])
    k = case["f"][0] * case["f"][1]
    index = {"window": lambda: _window_indices(rng, case).astype(np.float32),
             "any": lambda: rng.integers(-3 * k, 4 * k, case["in_shape"]).astype(np.float32),
             "fractional": lambda: rng.uniform(-2, k + 1, case["in_shape"]).astype(np.float32),
             "int32": lambda: rng.integers(-k, 2 * k, case["in_shape"]).astype(np.int32)}[kind]()
    model = unpool_model(case["in_shape"], case["f"], case["s"], case["padding"], case["act"],
                         "int32" if kind == "int32" else "float32")
    (actual,) = run_ours(model, [x, index])
    np.testing.assert_array_equal(actual, numpy_unpool(x, index, case["f"], case["s"]))


def test_unpool_skips_non_finite_and_huge_indices():
    x = np.arange(1, 5, dtype=np.float32).reshape(1, 1, 4, 1)
    index = np.array([np.nan, np.inf, 3e9, 3.0], np.float32).reshape(1, 1, 4, 1)
    (out,) = run_ours(unpool_model((1, 1, 4, 1), (2, 2), (2, 2)), [x, index])
    expected = np.zeros((1, 2, 8, 1), np.float32)
    expected[0, 1, 7, 0] = 4.0
    np.testing.assert_array_equal(out, expected)


def test_unpool_quantized_int32_indices_match_litert_xnnpack():
    case = dict(f=(2, 3), s=(2, 3), in_shape=(1, 3, 2, 2))
    rng = np.random.default_rng(5)
    x, index = _data(rng, case["in_shape"]), _window_indices(rng, case)
    model = unpool_model(case["in_shape"], case["f"], case["s"], index_dtype="int32_q")
    col_major = row_major_to_xnnpack(index, case["f"]).view(np.uint32).astype(np.int32)
    (expected,) = run_litert(model, [x, col_major], "xnnpack")
    (actual,) = run_ours(model, [x, index.astype(np.int32)])
    np.testing.assert_array_equal(actual, expected)


# -- invalid models ---------------------------------------------------------------------------
def _raises(model, op, match, inputs):
    with pytest.raises(ModelError, match=match) as info:
        run_ours(model, inputs)
    assert op in str(info.value)


def test_pool_bad_models():
    x = [np.ones((1, 4, 4, 2), np.float32)]

    def model(options, in_shape=(1, 4, 4, 2), in_dtype=np.float32, index=(np.float32, None),
              out_shape=(1, 2, 2, 2)):
        return one_op_model(POOL, [Input(in_shape, in_dtype)],
                            [Output(out_shape), Output(out_shape, *index)],
                            custom_options=options)
    ok = pool_params_bytes("SAME", (2, 2), (2, 2))
    _raises(model(struct.pack("<4i", 1, 2, 2, 2)), "MaxPoolingWithArgmax2D", "custom_options", x)
    _raises(model(None), "MaxPoolingWithArgmax2D", "custom_options", x)
    _raises(model(struct.pack("<6i", 0, 2, 2, 2, 2, 0)), "MaxPoolingWithArgmax2D", "padding", x)
    _raises(model(struct.pack("<6i", 1, 0, 2, 2, 2, 0)), "MaxPoolingWithArgmax2D", "strides", x)
    _raises(model(struct.pack("<6i", 1, 2, 2, 2, -1, 0)), "MaxPoolingWithArgmax2D", "filter size",
            x)
    _raises(model(struct.pack("<6i", 1, 2, 2, 2, 2, 7)), "MaxPoolingWithArgmax2D", "activation", x)
    _raises(model(struct.pack("<6i", 2, 1, 1, 5, 5, 0)), "MaxPoolingWithArgmax2D", "does not fit",
            x)
    _raises(model(ok, in_shape=(4, 4, 2)), "MaxPoolingWithArgmax2D", "rank 4",
            [np.ones((4, 4, 2), np.float32)])
    _raises(model(ok, in_dtype=np.int32), "MaxPoolingWithArgmax2D", "float32",
            [np.ones((1, 4, 4, 2), np.int32)])
    _raises(model(ok, index=(np.int8, (0.5, 0))), "MaxPoolingWithArgmax2D", "indices", x)
    _raises(model(ok, index=(np.int32, (2.0, 0))), "MaxPoolingWithArgmax2D", "scale 1", x)
    # the 20-byte form (no activation) is accepted, as XNNPACK accepts it
    run_ours(model(struct.pack("<5i", 1, 2, 2, 2, 2)), x)


def test_unpool_bad_models():
    x = np.ones((1, 2, 2, 3), np.float32)

    def model(options, idx_shape=(1, 2, 2, 3), index=(np.float32, None)):
        return one_op_model(UNPOOL, [Input((1, 2, 2, 3)), Input(idx_shape, *index)],
                            [Output((1, 4, 4, 3))], custom_options=options)
    ok = pool_params_bytes("VALID", (2, 2), (2, 2))
    _raises(model(b"\0" * 8), "MaxUnpooling2D", "custom_options", [x, x])
    _raises(model(struct.pack("<6i", 3, 2, 2, 2, 2, 0)), "MaxUnpooling2D", "padding", [x, x])
    _raises(model(struct.pack("<6i", 2, 2, 2, 0, 2, 0)), "MaxUnpooling2D", "filter size", [x, x])
    _raises(model(ok, idx_shape=(1, 2, 3, 3)), "MaxUnpooling2D", "shape",
            [x, np.ones((1, 2, 3, 3), np.float32)])
    _raises(model(ok, idx_shape=(2, 2, 3)), "MaxUnpooling2D", "rank 4",
            [x, np.ones((2, 2, 3), np.float32)])
    _raises(model(ok, index=(np.int64, None)), "MaxUnpooling2D", "indices",
            [x, np.ones((1, 2, 2, 3), np.int64)])
