"""The Interpreter's tf.lite API, held against ai_edge_litert's on the same models."""
import numpy as np
import pytest

from tflite_taichi import Interpreter
from tflite_taichi.builder import ModelBuilder
from tflite_taichi.errors import (BackendUnavailable, InputError, InterpreterStateError,
                                  TfliteTaichiError)
from tflite_taichi.testing import Input, Output, one_op_model
from cases.signatures import two_signature_model

litert = pytest.importorskip("ai_edge_litert.interpreter")

Q_IN, Q_OUT = (0.05, -3), (0.1, 4)


def _float_add():
    return one_op_model("ADD", [Input((1, 4, 3), name="a"), Input((1, 4, 3), name="b")],
                        [Output((1, 4, 3), name="sum")])


def _int8_add():
    return one_op_model("ADD", [Input((2, 5), np.int8, Q_IN, "a"), Input((2, 5), np.int8, Q_IN, "b")],
                        [Output((2, 5), np.int8, Q_OUT, "sum")])


def _dynamic_batch():
    b = ModelBuilder()
    g = b.subgraph()
    x = g.input("x", (1, 3), shape_signature=(-1, 3))
    y = g.tensor("y", (1, 3), shape_signature=(-1, 3))
    g.op("MUL", [x, g.const("k", np.array([1, 2, 3], np.float32))], [y])
    g.output(y)
    b.signature("serving_default", 0, {"x": x}, {"y": y})
    return b.finish()


def _pair(model):
    ours = Interpreter(model_content=model, backend="reference")
    theirs = litert.Interpreter(model_content=model)
    ours.allocate_tensors()
    theirs.allocate_tensors()
    return ours, theirs


def _assert_details_equal(ours, theirs):
    assert len(ours) == len(theirs)
    for o, t in zip(ours, theirs):
        assert set(o) == set(t)
        for key in t:
            if isinstance(t[key], np.ndarray):
                assert o[key].dtype == t[key].dtype and np.array_equal(o[key], t[key]), key
            elif key == "quantization_parameters":
                assert set(o[key]) == set(t[key])
                for k in t[key]:
                    assert np.array_equal(o[key][k], t[key][k]), (key, k)
                    assert type(o[key][k]) is type(t[key][k]), (key, k)
            elif key == "quantization":
                assert o[key][0] == pytest.approx(t[key][0]) and o[key][1] == t[key][1]
            else:
                assert o[key] == t[key] and type(o[key]) is type(t[key]), key


@pytest.mark.parametrize("model", [_float_add, _int8_add, _dynamic_batch])
def test_details_match_litert(model):
    ours, theirs = _pair(model())
    _assert_details_equal(ours.get_input_details(), theirs.get_input_details())
    _assert_details_equal(ours.get_output_details(), theirs.get_output_details())


def test_int8_model_keeps_int8_io_and_matches_litert():
    ours, theirs = _pair(_int8_add())
    rng = np.random.default_rng(1)
    for it in (ours, theirs):
        for d in it.get_input_details():
            it.set_tensor(d["index"], rng.integers(-128, 128, (2, 5)).astype(np.int8))
    rng = np.random.default_rng(1)
    a, b = (rng.integers(-128, 128, (2, 5)).astype(np.int8) for _ in range(2))
    for it in (ours, theirs):
        it.set_tensor(0, a)
        it.set_tensor(1, b)
        it.invoke()
    y, ref = ours.get_tensor(2), theirs.get_tensor(2)
    assert y.dtype == np.int8
    assert np.max(np.abs(y.astype(int) - ref.astype(int))) <= 1


def test_set_tensor_checks_dtype_and_shape_with_the_tensor_name():
    it = Interpreter(model_content=_float_add(), backend="reference")
    it.allocate_tensors()
    with pytest.raises(InputError, match=r"tensor 0 \('a'\).*float64.*float32"):
        it.set_tensor(0, np.zeros((1, 4, 3)))
    with pytest.raises(InputError, match=r"tensor 1 \('b'\).*shape \[4, 3\].*expected \[1, 4, 3\]"):
        it.set_tensor(1, np.zeros((4, 3), np.float32))
    it.set_tensor(2, np.zeros((1, 4, 3), np.float32))     # an output: LiteRT allows it too
    with pytest.raises(InputError, match="out of range"):
        it.set_tensor(17, np.zeros((1, 4, 3), np.float32))
    # still usable after the errors
    it.set_tensor(0, np.ones((1, 4, 3), np.float32))
    it.set_tensor(1, np.ones((1, 4, 3), np.float32))
    it.invoke()
    assert np.all(it.get_tensor(2) == 2)


def test_invoke_and_set_before_allocate_are_state_errors():
    it = Interpreter(model_content=_float_add(), backend="reference")
    with pytest.raises(InterpreterStateError, match="before allocate_tensors"):
        it.invoke()
    with pytest.raises(InterpreterStateError, match="before allocate_tensors"):
        it.set_tensor(0, np.zeros((1, 4, 3), np.float32))


def test_user_arrays_are_never_modified_and_get_tensor_is_a_copy():
    it = Interpreter(model_content=_float_add(), backend="reference")
    it.allocate_tensors()
    a = np.arange(12, dtype=np.float32).reshape(1, 4, 3)
    b = np.asfortranarray(np.ones((1, 4, 3), np.float32))      # non-contiguous is accepted
    a_before, b_before = a.copy(), b.copy()
    it.set_tensor(0, a)
    it.set_tensor(1, b)
    it.invoke()
    out = it.get_tensor(2)
    out[...] = -1
    np.testing.assert_array_equal(it.get_tensor(2), a_before + 1)
    np.testing.assert_array_equal(a, a_before)
    np.testing.assert_array_equal(b, b_before)


def test_tensor_view_of_an_input_sets_it_like_litert():
    ours, theirs = _pair(_float_add())
    for it in (ours, theirs):
        it.tensor(0)()[...] = 2.0
        it.tensor(1)()[...] = 3.0
        it.invoke()
        np.testing.assert_array_equal(it.tensor(2)(), np.full((1, 4, 3), 5.0, np.float32))


def test_resize_tensor_input_propagates_shapes_like_litert():
    ours, theirs = _pair(_dynamic_batch())
    x = np.arange(12, dtype=np.float32).reshape(4, 3)
    for it in (ours, theirs):
        it.resize_tensor_input(0, [4, 3], strict=True)
        it.allocate_tensors()
        it.set_tensor(0, x)
        it.invoke()
    _assert_details_equal(ours.get_output_details(), theirs.get_output_details())
    np.testing.assert_array_equal(ours.get_tensor(1), theirs.get_tensor(1))
    with pytest.raises(InputError, match="shape_signature"):
        ours.resize_tensor_input(0, [4, 5], strict=True)
    with pytest.raises(InputError, match="negative"):
        ours.resize_tensor_input(0, [-2, 3])


def test_signature_runner_matches_litert():
    model = _dynamic_batch()
    ours, theirs = _pair(model)
    assert ours.get_signature_list() == theirs.get_signature_list()
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    got = ours.get_signature_runner("serving_default")(x=x)
    want = theirs.get_signature_runner("serving_default")(x=x)
    assert set(got) == set(want) == {"y"}
    np.testing.assert_array_equal(got["y"], want["y"])
    with pytest.raises(InputError, match="missing"):
        ours.get_signature_runner()(z=x)


def test_signature_on_a_second_subgraph_matches_litert():
    model = two_signature_model()
    ours, theirs = _pair(model)
    assert ours.get_signature_list() == theirs.get_signature_list()
    u_val = np.array([1.5, -2.0], np.float32)
    np.testing.assert_array_equal(ours.get_signature_runner("double")(u=u_val)["v"],
                                  theirs.get_signature_runner("double")(u=u_val)["v"])


def test_backend_and_precision_choices():
    model = _float_add()
    assert Interpreter(model_content=model, backend="reference").backend == "reference"
    with pytest.raises(BackendUnavailable, match="unknown backend"):
        Interpreter(model_content=model, backend="directx")
    with pytest.raises(BackendUnavailable, match="precision"):
        Interpreter(model_content=model, precision="int4")
    with pytest.raises(InputError, match="exactly one"):
        Interpreter()


def test_summary_lists_every_op_on_the_reference_path():
    it = Interpreter(model_content=_float_add(), backend="reference")
    s = it.summary()
    assert s["backend"] == "reference" and s["ops_total"] == 1 and s["ops_delegated"] == 0
    assert s["partitions"] == [] and s["fallback"][0]["op"] == "ADD"
    assert "reference" in s["fallback"][0]["reason"]


def test_errors_share_one_family():
    assert issubclass(InputError, TfliteTaichiError) and issubclass(InputError, ValueError)
    assert issubclass(InterpreterStateError, RuntimeError)


def _kind_models():
    from tflite_taichi.testing import Const, Input, Output, one_op_model
    w8 = Const(np.arange(-6, 6, dtype=np.int8).reshape(3, 4), (0.05, 0))
    return {
        "float32": one_op_model("RELU", [Input((2, 3))], [Output((2, 3))]),
        "full-integer int8": one_op_model("RELU", [Input((2, 3), np.int8, (0.1, 3))],
                                          [Output((2, 3), np.int8, (0.1, 3))]),
        "full-integer uint8": one_op_model("RELU", [Input((2, 3), np.uint8, (0.1, 128))],
                                           [Output((2, 3), np.uint8, (0.1, 128))]),
        "full-integer 16x8 (int16 activations, int8 weights)": one_op_model(
            "RELU", [Input((2, 3), np.int16, (0.001, 0))], [Output((2, 3), np.int16, (0.001, 0))]),
        "dynamic-range (int8 weights, float activations)": one_op_model(
            "FULLY_CONNECTED", [Input((1, 4)), w8, None], [Output((1, 3))]),
    }


@pytest.mark.parametrize("kind", list(_kind_models()))
def test_summary_says_what_kind_of_model_and_whether_it_runs_as_a_float_view(kind):
    it = Interpreter(model_content=_kind_models()[kind], backend="reference")
    s = it.summary()
    assert s["quantization"] == kind
    assert s["float_view"] == kind.startswith("full-integer")
