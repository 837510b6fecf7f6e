"""Inputs: everything a caller can hand the Interpreter wrongly (dtypes, shapes,
layouts, call order, failing invokes, resizes), each a clear error of the tflite_taichi.errors
family naming the tensor, after which the same interpreter still gives the right answer; nothing
the caller passes in is modified, nothing returned is an alias the runtime writes later. NaN and
Inf pass through as LiteRT passes them.

Every scenario runs on the reference path in this process, and on Taichi cpu and vulkan
(lavapipe) in one subprocess per backend (Taichi is one runtime per process)."""
import os
import warnings

import numpy as np
import pytest

from scenarios import in_subprocesses, run_scenarios

from tflite_taichi import Interpreter
from tflite_taichi.builder import ModelBuilder
from tflite_taichi.errors import InputError, InterpreterStateError, TfliteTaichiError

TAICHI_BACKENDS = [b for b in os.environ.get("TFLITE_TAICHI_TEST_BACKENDS", "cpu,vulkan,opengl").split(",")
                   if b in ("cpu", "vulkan")]

K = np.array([1.0, -2.0, 3.0], np.float32)


def _model() -> bytes:
    """x [B,4,3] (B dynamic), idx int32 [2] -> y = RELU(x * k), g = GATHER(y, idx, axis=1).
    On a Taichi backend MUL and RELU form a delegated partition and GATHER (int32 indices at run
    time) runs on the CPU: a failing GATHER is an invoke that fails after a kernel ran."""
    b = ModelBuilder()
    g = b.subgraph()
    x = g.input("x", (1, 4, 3), shape_signature=(-1, 4, 3))
    idx = g.input("idx", (2,), np.int32)
    m = g.tensor("m", (1, 4, 3), shape_signature=(-1, 4, 3))
    y = g.tensor("y", (1, 4, 3), shape_signature=(-1, 4, 3))
    out = g.tensor("g", (1, 2, 3), shape_signature=(-1, 2, 3))
    g.op("MUL", [x, g.const("k", K)], [m])
    g.op("RELU", [m], [y])
    g.op("GATHER", [y, idx], [out], axis=1)
    g.output(y, out)
    b.signature("serving_default", 0, {"x": x, "idx": idx}, {"y": y, "g": out})
    return b.finish()


MODEL = _model()
X, IDX, M, Y, G = 0, 1, 2, 3, 4          # tensor indices, in the order _model() creates them


def _expected(x, idx):
    y = np.maximum(x * K, 0)
    return y, y[:, idx]


def _new(backend, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")         # the delegate's fallback warning for GATHER
        it = Interpreter(model_content=MODEL, backend=backend, **kwargs)
    return it


def _x(seed, batch=1):
    return np.random.default_rng(seed).uniform(-2, 2, (batch, 4, 3)).astype(np.float32)


def _good_invoke(it, seed=0, batch=1, idx=(3, 0)):
    """The check after every bad thing: set inputs, invoke, outputs as numpy says."""
    x, idx = _x(seed, batch), np.array(idx, np.int32)
    it.set_tensor(X, x)
    it.set_tensor(IDX, idx)
    it.invoke()
    y, g = _expected(x, idx)
    np.testing.assert_allclose(it.get_tensor(Y), y, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(it.get_tensor(G), g, rtol=1e-6, atol=1e-6)


def _raises(cls, names, fn, *args):
    """fn(*args) raises `cls` (a TfliteTaichiError) whose message contains every one of `names`."""
    with pytest.raises(cls) as info:
        fn(*args)
    assert isinstance(info.value, TfliteTaichiError)
    for name in names:
        assert name in str(info.value), (name, str(info.value))
    return str(info.value)


SCENARIOS = {}


def scenario(fn):
    SCENARIOS[fn.__name__] = fn
    return fn


@scenario
def wrong_dtypes(backend):
    it = _new(backend)
    it.allocate_tensors()
    _good_invoke(it)
    x = _x(1)
    for bad in (x.astype(np.float64), x.astype(np.int32), x.astype(np.float16), x.astype(np.complex64),
                x.tolist(), np.empty(x.shape, object), "x"):
        _raises(InputError, ["tensor 0 ('x')", "float32"], it.set_tensor, X, bad)
    _raises(InputError, ["tensor 1 ('idx')", "int32"], it.set_tensor, IDX, np.array([3.0, 0.0], np.float32))
    _raises(InputError, ["tensor 1 ('idx')", "int32"], it.set_tensor, IDX, np.array([3, 0], np.int64))
    _raises(InputError, ["tensor 0 ('x')", "not an array"], it.set_tensor, X, [[1.0, 2.0], [3.0]])
    _raises(InputError, ["out of range"], it.set_tensor, 99, x)
    _raises(InputError, ["tensor 2 ('m')", "neither an input nor an output"], it.set_tensor, 2, x)
    it.set_tensor(Y, x)                 # an output can be set, as in LiteRT (invoke overwrites it)
    _good_invoke(it, seed=2)


@scenario
def wrong_shapes(backend):
    it = _new(backend)
    it.allocate_tensors()
    for bad in (np.zeros((4, 3), np.float32), np.zeros((2, 4, 3), np.float32),
                np.zeros((1, 4, 3, 1), np.float32), np.float32(1.0), np.zeros((1, 3, 4), np.float32)):
        _raises(InputError, ["tensor 0 ('x')", "expected [1, 4, 3]"], it.set_tensor, X, bad)
    _raises(InputError, ["tensor 1 ('idx')", "expected [2]"], it.set_tensor, IDX, np.zeros(3, np.int32))
    _good_invoke(it)


@scenario
def any_layout_is_copied_and_never_modified(backend):
    """Non-contiguous, Fortran-ordered, reversed, read-only, broadcast (zero-stride) and
    big-endian arrays are accepted, copied, and left as they were."""
    it = _new(backend)
    it.allocate_tensors()
    base = np.random.default_rng(3).uniform(-2, 2, (2, 4, 6)).astype(np.float32)
    readonly = base[:1, :, :3].copy()
    readonly.flags.writeable = False
    layouts = {
        "strided": base[:1, :, ::2],
        "fortran": np.asfortranarray(base[:1, :, :3]),
        "reversed": base[1:, ::-1, 3:],
        "readonly": readonly,
        "broadcast": np.broadcast_to(base[0, 0, :3], (1, 4, 3)),
        "big-endian": base[:1, :, :3].astype(">f4"),
    }
    for name, x in layouts.items():
        before, strides = x.copy(), x.strides
        idx = np.array([2, 1], np.int32)
        idx.flags.writeable = False
        it.set_tensor(X, x)
        it.set_tensor(IDX, idx)
        it.invoke()
        y, g = _expected(np.asarray(x, np.float32), idx)
        np.testing.assert_allclose(it.get_tensor(Y), y, rtol=1e-6, atol=1e-6, err_msg=name)
        np.testing.assert_allclose(it.get_tensor(G), g, rtol=1e-6, atol=1e-6, err_msg=name)
        np.testing.assert_array_equal(x, before, err_msg=name)
        assert x.dtype == before.dtype and x.strides == strides, name
    assert not readonly.flags.writeable


@scenario
def call_order(backend):
    it = _new(backend)
    for call, args in ((it.invoke, ()), (it.set_tensor, (X, _x(0))), (it.get_tensor, (Y,)),
                       (it.tensor(X), ()), (it.op_table, ())):
        _raises(InterpreterStateError, ["before allocate_tensors()"], call, *args)
    it.allocate_tensors()
    _good_invoke(it)
    it.resize_tensor_input(X, [2, 4, 3])
    for call, args in ((it.invoke, ()), (it.set_tensor, (X, _x(0, 2))), (it.get_tensor, (Y,))):
        _raises(InterpreterStateError, ["before allocate_tensors() again", "resize_tensor_input"], call, *args)
    it.allocate_tensors()
    _good_invoke(it, batch=2)


@scenario
def failed_invoke(backend):
    """GATHER with an index out of range: the invoke raises; outputs then have no value (LiteRT
    returns whatever its buffers hold, partly overwritten); inputs keep theirs; the next invoke
    with good inputs is right."""
    it = _new(backend)
    it.allocate_tensors()
    _good_invoke(it)
    it.set_tensor(IDX, np.array([1, 9], np.int32))
    _raises(InputError, ["GATHER", "9"], it.invoke)
    for t, name in ((Y, "y"), (G, "g")):
        _raises(InterpreterStateError, [f"tensor {t} ('{name}')", "last invoke() failed", "GATHER"],
                it.get_tensor, t)
    np.testing.assert_array_equal(it.get_tensor(IDX), [1, 9])
    np.testing.assert_array_equal(it.get_tensor(X), _x(0))
    _good_invoke(it, seed=5, idx=(2, 2))
    runner = it.get_signature_runner()
    _raises(InputError, ["GATHER"], lambda: runner(x=_x(6), idx=np.array([-1, 0], np.int32)))
    out = runner(x=_x(6), idx=np.array([0, 1], np.int32))
    np.testing.assert_allclose(out["g"], _expected(_x(6), [0, 1])[1], rtol=1e-6, atol=1e-6)


RESIZE_REFUSED = [  # refused by resize_tensor_input itself
    ([-1, 4, 3], "negative dimension"),
    ([1.5, 4, 3], "not a shape"),
    ("abc", "not a shape"),
    ([2**31, 4, 3], "does not fit in int32"),
    ([2**30, 2**30, 2**30], "bytes"),
    ([1] * 65, "rank 65"),
]
RESIZE_NOT_FITTING = [  # refused by allocate_tensors, which puts the previous shapes back
    ([3], "GATHER"),                        # wrong rank: GATHER's axis 1 does not exist
    ([2, 4, 5], "MUL"),                     # 5 does not broadcast with k's 3
    ([2**24, 2**24, 3], ""),                # 3 PiB: no memory (reference), 32-bit buffers (Taichi)
]


@scenario
def invalid_resizes(backend):
    it = _new(backend)
    it.allocate_tensors()
    for shape, says in RESIZE_REFUSED:
        _raises(InputError, ["input 0 ('x')", says], it.resize_tensor_input, X, shape)
        assert list(it.get_input_details()[0]["shape"]) == [1, 4, 3]
        _good_invoke(it)
    _raises(InputError, ["shape_signature"], it.resize_tensor_input, X, [2, 5, 3], True)
    _raises(InputError, ["not an input"], it.resize_tensor_input, Y, [2, 4, 3])
    it.resize_tensor_input(X, [2, 4, 3])
    it.allocate_tensors()
    _good_invoke(it, batch=2)
    for shape, says in RESIZE_NOT_FITTING:
        it.resize_tensor_input(X, shape)
        _raises(InputError, ["'x' to " + str(shape), says, "keeps its previous input shapes"],
                it.allocate_tensors)
        assert list(it.get_input_details()[0]["shape"]) == [2, 4, 3]
        _good_invoke(it, seed=7, batch=2)        # no allocate needed: the previous state is back


@scenario
def invalid_resize_before_the_first_allocate(backend):
    it = _new(backend)
    it.resize_tensor_input(X, [2, 4, 5])
    _raises(InputError, ["'x' to [2, 4, 5]", "keeps its previous input shapes"], it.allocate_tensors)
    _raises(InterpreterStateError, ["before allocate_tensors()"], it.invoke)
    it.allocate_tensors()                     # the model's own shapes
    assert list(it.get_input_details()[0]["shape"]) == [1, 4, 3]
    _good_invoke(it)


@scenario
def zero_sized_resize(backend):
    """A zero batch is a shape like any other (LiteRT accepts it too): empty outputs."""
    it = _new(backend)
    it.allocate_tensors()
    it.resize_tensor_input(X, [0, 4, 3])
    it.allocate_tensors()
    it.set_tensor(X, np.zeros((0, 4, 3), np.float32))
    it.set_tensor(IDX, np.array([0, 1], np.int32))
    it.invoke()
    assert it.get_tensor(Y).shape == (0, 4, 3) and it.get_tensor(G).shape == (0, 2, 3)
    it.resize_tensor_input(X, [3, 4, 3])
    it.allocate_tensors()
    _good_invoke(it, batch=3)


@scenario
def returned_arrays_are_copies(backend):
    """get_tensor returns a fresh array (as LiteRT does): the next invoke does not change it,
    and writing into it changes nothing inside; inputs and intermediates alike."""
    it = _new(backend, experimental_preserve_all_tensors=True)
    it.allocate_tensors()
    _good_invoke(it, seed=1)
    got = {t: it.get_tensor(t) for t in (X, IDX, M, Y, G)}
    kept = {t: a.copy() for t, a in got.items()}
    _good_invoke(it, seed=2, idx=(1, 1))      # a different invoke
    for t in got:
        np.testing.assert_array_equal(got[t], kept[t], err_msg=f"tensor {t}")
        got[t][...] = 7
    np.testing.assert_allclose(it.get_tensor(M), _x(2) * K, rtol=1e-6)     # untouched inside
    np.testing.assert_array_equal(it.get_tensor(IDX), [1, 1])
    it.invoke()
    y, g = _expected(_x(2), np.array([1, 1]))
    np.testing.assert_allclose(it.get_tensor(G), g, rtol=1e-6, atol=1e-6)
    out = it.get_signature_runner()(x=_x(3), idx=np.array([0, 2], np.int32))
    out["y"][...] = 9
    np.testing.assert_allclose(it.get_tensor(Y), _expected(_x(3), [0, 2])[0], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_reference(name):
    SCENARIOS[name]("reference")


# -- NaN and Inf ------------------------------------------------------------------------------
# Not errors: they flow through the graph. Where LiteRT's kernels agree with each other, ours
# must give what they give (NaN positions and infinities exactly). Where they do not (or where
# their answer is C++ undefined behaviour), ours follows the numpy definition, stated below.
_V = np.array([np.nan, np.inf, -np.inf, 1, 2, -3, 0, np.nan, -np.inf, 5, np.inf, -1, .5, .25, np.nan, np.inf],
              np.float32)
_V2 = np.array([np.nan, 1, 2, 3, -np.inf, 1, 2, 3, np.inf, 1, 2, 3, -1, -2, -3, 4], np.float32)
_Q8 = (0.1, 3)


def _nan_cases() -> dict:
    from tflite_taichi.testing import Const, Input, Output, one_op_model
    img, mat = (1, 4, 4, 1), (4, 4)
    same = lambda op, shape, **o: one_op_model(op, [Input(shape)], [Output(shape)], **o)  # noqa: E731
    pool = dict(padding="VALID", stride_w=2, stride_h=2, filter_width=2, filter_height=2)
    conv = dict(padding="SAME", stride_w=1, stride_h=1)
    return {
        "RELU": (same("RELU", img), [_V.reshape(img)]),
        "RELU6": (same("RELU6", img), [_V.reshape(img)]),
        "LOGISTIC": (same("LOGISTIC", img), [_V.reshape(img)]),
        "TANH": (same("TANH", img), [_V.reshape(img)]),
        "SOFTMAX": (same("SOFTMAX", mat, beta=1.0), [_V.reshape(mat)]),
        "CONV_2D": (one_op_model("CONV_2D", [Input(img), Const(np.ones((2, 3, 3, 1), np.float32)),
                                             Const(np.zeros(2, np.float32))], [Output((1, 4, 4, 2))], **conv),
                    [_V.reshape(img)]),
        "CONV_2D+RELU": (one_op_model("CONV_2D", [Input(img), Const(np.array([1, -1], np.float32).reshape(2, 1, 1, 1)),
                                                  Const(np.zeros(2, np.float32))], [Output((1, 4, 4, 2))],
                                      fused_activation_function="RELU", **conv), [_V2.reshape(img)]),
        "ADD+RELU6": (one_op_model("ADD", [Input(img), Input(img)], [Output(img)], fused_activation_function="RELU6"),
                      [_V2.reshape(img), _V2[::-1].reshape(img).copy()]),
        "FULLY_CONNECTED": (one_op_model("FULLY_CONNECTED", [Input(mat), Const(np.ones((3, 4), np.float32)),
                                                             Const(np.zeros(3, np.float32))], [Output((4, 3))]),
                            [_V.reshape(mat)]),
        "MEAN": (one_op_model("MEAN", [Input(mat), Const(np.array([1], np.int32))], [Output((4,))]), [_V.reshape(mat)]),
        "MAXIMUM": (one_op_model("MAXIMUM", [Input(mat), Input(mat)], [Output(mat)]),
                    [_V.reshape(mat), _V.reshape(mat)[::-1].copy()]),
        "MAX_POOL_2D": (one_op_model("MAX_POOL_2D", [Input(img)], [Output((1, 2, 2, 1))], **pool), [_V.reshape(img)]),
        "REDUCE_MAX": (one_op_model("REDUCE_MAX", [Input(mat), Const(np.array([1], np.int32))], [Output((4,))]),
                       [_V.reshape(mat)]),
        "QUANTIZE": (one_op_model("QUANTIZE", [Input((16,))], [Output((16,), np.int8, _Q8)]), [_V]),
    }


NAN_CASES = _nan_cases()
# LiteRT's kernels that agree on NaN/Inf for the case ("reference": BUILTIN_REF, "xnnpack": the
# default). CONV_2D: the reference kernel clamps +-inf to +-FLT_MAX (its "no activation" range
# is [lowest, max]); XNNPACK, LiteRT's default, keeps inf, as ours.
LITERT_NAN = {"RELU": ("reference", "xnnpack"), "RELU6": ("reference", "xnnpack"),
              "LOGISTIC": ("reference", "xnnpack"), "TANH": ("reference", "xnnpack"),
              "SOFTMAX": ("reference", "xnnpack"), "CONV_2D": ("xnnpack",), "CONV_2D+RELU": ("xnnpack",),
              "ADD+RELU6": ("reference", "xnnpack"), "FULLY_CONNECTED": ("reference", "xnnpack"),
              "MEAN": ("reference", "xnnpack"), "MAXIMUM": ("reference", "xnnpack")}


def _max_pool_2x2(x):
    return x.reshape(1, 2, 2, 2, 2, 1).transpose(0, 1, 3, 2, 4, 5).reshape(1, 2, 2, 4, 1).max(axis=3)


def _quantize_int8(x):
    scale, zp = _Q8
    with np.errstate(invalid="ignore"):
        q = np.clip(np.sign(x / scale) * np.floor(np.abs(x / scale) + 0.5) + zp, -128, 127)
    return np.where(np.isnan(q), zp, q).astype(np.int8)


# Ours where LiteRT gives no one answer (measured, LiteRT 2.3):
# - MAX_POOL_2D: its reference kernel skips NaN and clamps inf to FLT_MAX, XNNPACK returns
#   -inf or 0 for windows holding a NaN; ours: NaN propagates (numpy's max).
# - REDUCE_MAX: the reference kernel skips NaN, XNNPACK propagates it; ours propagates.
# - QUANTIZE to int8: NaN gives -128 (reference kernel) or 127 (XNNPACK), +inf gives -128 in the
#   reference kernel (a float-to-int conversion out of range: undefined behaviour in C++);
#   ours: +-inf saturate to 127/-128, NaN becomes the zero point (real 0).
OWN_NAN = {"MAX_POOL_2D": _max_pool_2x2, "REDUCE_MAX": lambda x: np.max(x, axis=1),
           "QUANTIZE": _quantize_int8}

# MAXIMUM/MINIMUM follow LiteRT's kernels (all of them compute `a > b ? a : b`: a NaN in the
# first operand is dropped, one in the second kept), and the delegate tests NaN explicitly
# (ops/kit.py) rather than trusting ti.max/ti.min (LLVM maxnum drops NaN; SPIR-V leaves it
# undefined; OpenGL's comparisons with NaN were unreliable).
OURS_VS_LITERT_XFAIL = {}
TAICHI_NAN_XFAIL = {}


def _xfail(name, table):
    marks = [pytest.mark.xfail(strict=True, reason=table[name])] if name in table else []
    return pytest.param(name, marks=marks, id=name)


@pytest.mark.parametrize("name", [_xfail(n, OURS_VS_LITERT_XFAIL) for n in LITERT_NAN])
def test_nan_and_inf_pass_through_like_litert(name):
    from tflite_taichi.testing import assert_float_close, run_litert, run_ours
    _litert()
    model, inputs = NAN_CASES[name]
    ours = run_ours(model, [x.copy() for x in inputs])
    for kernels in LITERT_NAN[name]:
        theirs = run_litert(model, inputs, kernels)
        assert_float_close(ours[0], theirs[0], what=f"{name} vs LiteRT {kernels}")


@pytest.mark.parametrize("name", list(OWN_NAN))
def test_nan_and_inf_where_litert_kernels_disagree(name):
    from tflite_taichi.testing import run_ours
    model, inputs = NAN_CASES[name]
    got, want = run_ours(model, inputs)[0], OWN_NAN[name](inputs[0])
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)


def _nan_case_on(backend, name):
    """The Taichi backend's outputs equal the reference's (NaN positions, infinities, values)."""
    from tflite_taichi.testing import assert_float_close, run_ours
    model, inputs = NAN_CASES[name]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = run_ours(model, inputs, backend)
    for a, e in zip(got, run_ours(model, inputs)):
        assert_float_close(a, e, rtol=1e-5, what=f"{name} on {backend}")


def run_all(backend) -> dict:
    """Every scenario on `backend`: {name: "ok" or the traceback} (for the subprocess)."""
    return run_scenarios({**SCENARIOS, **{f"nan:{n}": (lambda b, n=n: _nan_case_on(b, n))
                                          for n in NAN_CASES}}, backend)


@pytest.fixture(scope="module")
def taichi_results():
    """All scenarios on each Taichi backend, the backends' subprocesses running at once."""
    return in_subprocesses("test_inputs", TAICHI_BACKENDS)


@pytest.mark.parametrize("backend", TAICHI_BACKENDS)
@pytest.mark.parametrize("name", list(SCENARIOS))
def test_taichi(taichi_results, backend, name):
    result = taichi_results[backend]
    assert isinstance(result, dict), f"the {backend} subprocess failed:\n{result}"
    assert result[name] == "ok", result[name]


@pytest.mark.parametrize("backend", TAICHI_BACKENDS)
@pytest.mark.parametrize("name", [_xfail(n, TAICHI_NAN_XFAIL) for n in NAN_CASES])
def test_taichi_nan_and_inf_like_the_reference(taichi_results, backend, name):
    result = taichi_results[backend]
    assert isinstance(result, dict), f"the {backend} subprocess failed:\n{result}"
    assert result[f"nan:{name}"] == "ok", result[f"nan:{name}"]


# -- against LiteRT ---------------------------------------------------------------------------
def _litert():
    return pytest.importorskip("ai_edge_litert.interpreter")


def test_get_tensor_returns_a_copy_like_litert():
    litert = _litert()
    for it in (litert.Interpreter(model_content=MODEL), _new("reference")):
        it.allocate_tensors()
        it.set_tensor(X, _x(0))
        it.set_tensor(IDX, np.array([0, 1], np.int32))
        it.invoke()
        a, b = it.get_tensor(Y), it.get_tensor(Y)
        assert a.flags.owndata and a.flags.writeable and not np.shares_memory(a, b), type(it)
        a[...] = 5
        np.testing.assert_array_equal(b, it.get_tensor(Y))


def test_zero_sized_batch_like_litert():
    litert = _litert()
    outs = []
    for it in (litert.Interpreter(model_content=MODEL), _new("reference")):
        it.resize_tensor_input(X, [0, 4, 3])
        it.allocate_tensors()
        it.set_tensor(X, np.zeros((0, 4, 3), np.float32))
        it.set_tensor(IDX, np.array([0, 1], np.int32))
        it.invoke()
        outs.append([it.get_tensor(Y).shape, it.get_tensor(G).shape])
    assert outs[0] == outs[1] == [(0, 4, 3), (0, 2, 3)]
