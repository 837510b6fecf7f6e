"""Drop-in for code written against tf.lite / ai_edge_litert: the
exceptions LiteRT's callers catch, and get_tensor_details() dicts key by key, held against
LiteRT on the same model bytes."""
import numpy as np
import pytest

from tflite_taichi import Interpreter
from tflite_taichi.builder import RESOURCE, ModelBuilder
from tflite_taichi.errors import InterpreterStateError, NotReadyError, TfliteTaichiError
from tflite_taichi.testing import Input, Output, one_op_model

litert = pytest.importorskip("ai_edge_litert.interpreter")


def _float_add():
    return one_op_model("ADD", [Input((1, 4, 3), name="a"), Input((1, 4, 3), name="b")],
                        [Output((1, 4, 3), name="sum")])


def _where():
    """WHERE(x): the output's shape is [count of true, 1], known only at invoke."""
    b = ModelBuilder()
    g = b.subgraph()
    x = g.input("x", (4,), np.bool_)
    y = g.tensor("y", (1, 1), np.int64, shape_signature=(-1, 1))
    g.op("WHERE", [x], [y])
    g.output(y)
    return b.finish()


def _where_then_add():
    """WHERE's data-dependent output read by ADD: an intermediate of run-time shape."""
    b = ModelBuilder()
    g = b.subgraph()
    x = g.input("x", (4,), np.bool_)
    y = g.tensor("y", (4, 1), np.int64, shape_signature=(-1, 1))
    g.op("WHERE", [x], [y])
    z = g.tensor("z", (4, 1), np.int64, shape_signature=(-1, 1))
    g.op("ADD", [y, y], [z])
    g.output(z)
    return b.finish()


def _reshape_to_a_folded_shape():
    """RESHAPE(x, ADD(const, const)): the target shape is known once constants are folded."""
    b = ModelBuilder()
    g = b.subgraph()
    x = g.input("x", (2, 3))
    target = g.tensor("target", (2,), np.int32)
    g.op("ADD", [g.const("a", np.array([1, 2], np.int32)), g.const("b", np.array([2, 0], np.int32))],
         [target])
    y = g.tensor("y", (1, 1), shape_signature=(-1, -1))
    g.op("RESHAPE", [x, target], [y])
    g.output(y)
    return b.finish()


def _variable():
    """A resource tensor (VAR_HANDLE's output): out = read(var) + x, var <- out."""
    b = ModelBuilder()
    g = b.subgraph()
    x = g.input("x", (2,))
    h = g.tensor("h", (), RESOURCE)
    g.op("VAR_HANDLE", [], [h], shared_name="acc")
    state = g.tensor("state", (2,))
    g.op("READ_VARIABLE", [h], [state])
    out = g.tensor("out", (2,))
    g.op("ADD", [state, x], [out])
    g.op("ASSIGN_VARIABLE", [h, out], [])
    g.output(out)
    return b.finish()


def _sparse_weights(**blocks):
    """FULLY_CONNECTED with its weights stored sparse (CSR rows); `blocks` as sparse_const's."""
    rng = np.random.default_rng(0)
    dense = (rng.uniform(-1, 1, (4, 8)) * (rng.random((4, 8)) < 0.4)).astype(np.float32)
    formats = ("DENSE", "SPARSE_CSR", "DENSE") if blocks else ("DENSE", "SPARSE_CSR")
    b = ModelBuilder()
    g = b.subgraph()
    x = g.input("x", (2, 8))
    w = g.sparse_const("w", dense, formats, **blocks)
    y = g.tensor("y", (2, 4))
    g.op("FULLY_CONNECTED", [x, w, -1], [y])
    g.output(y)
    return b.finish()


def _both(model, allocate=True):
    ours = Interpreter(model_content=model, backend="reference")
    theirs = litert.Interpreter(model_content=model)
    if allocate:
        ours.allocate_tensors()
        theirs.allocate_tensors()
    return ours, theirs


def _raised(call, *args):
    with pytest.raises(Exception) as info:
        call(*args)
    return info.value


# -- what `except ValueError` / `except RuntimeError` code catches -------------------------------
def test_not_ready_is_one_of_ours_and_both_builtins():
    assert issubclass(NotReadyError, InterpreterStateError)
    assert issubclass(NotReadyError, TfliteTaichiError)
    assert issubclass(NotReadyError, ValueError) and issubclass(NotReadyError, RuntimeError)


def _input_value(it):
    d = it.get_input_details()[0]
    return np.zeros(d["shape"], d["dtype"])


def _calls_before_allocate(it):
    return {"set_tensor": (it.set_tensor, 0, _input_value(it)), "get_tensor": (it.get_tensor, 0),
            "tensor()()": (it.tensor(0),), "invoke": (it.invoke,)}


def test_calls_before_allocate_raise_what_litert_raises():
    ours, theirs = _both(_float_add(), allocate=False)
    for (name, (call, *args)), (_, (their_call, *their_args)) in zip(
            _calls_before_allocate(ours).items(), _calls_before_allocate(theirs).items()):
        expected = type(_raised(their_call, *their_args))    # ValueError; invoke: RuntimeError
        error = _raised(call, *args)
        assert isinstance(error, expected) and isinstance(error, InterpreterStateError), name
        assert "before allocate_tensors()" in str(error), name


def test_calls_after_resize_before_allocate_raise_what_litert_raises():
    ours, theirs = _both(_float_add())
    for it in (ours, theirs):
        it.resize_tensor_input(0, [2, 4, 3])
    batch_of_2 = np.zeros((2, 4, 3), np.float32)
    for call in (lambda it: it.set_tensor(0, batch_of_2), lambda it: it.get_tensor(0)):
        assert isinstance(_raised(call, theirs), ValueError)
        error = _raised(call, ours)
        assert isinstance(error, ValueError) and isinstance(error, InterpreterStateError)
        assert "resize_tensor_input" in str(error)


def test_a_static_output_before_invoke_reads_as_in_litert():
    """LiteRT returns the output's buffer (whatever it holds); ours is zeros, of the same shape
    and dtype: code that reads outputs before the first invoke keeps working."""
    ours, theirs = _both(_float_add())
    mine, expected = ours.get_tensor(2), theirs.get_tensor(2)
    assert mine.shape == expected.shape and mine.dtype == expected.dtype
    assert not mine.any()
    assert ours.tensor(2)().shape == theirs.tensor(2)().shape


def test_a_data_dependent_output_before_invoke_is_a_value_error_as_in_litert():
    ours, theirs = _both(_where())
    for read in (lambda it: it.get_tensor(1), lambda it: it.tensor(1)()):
        assert isinstance(_raised(read, theirs), ValueError)    # "Tensor data is null"
        error = _raised(read, ours)
        assert isinstance(error, NotReadyError), error
        assert "tensor 1 ('y')" in str(error) and "invoke()" in str(error)
    x = np.array([True, False, True, True])
    for it in (ours, theirs):
        it.set_tensor(0, x)
        it.invoke()
    np.testing.assert_array_equal(ours.get_tensor(1), theirs.get_tensor(1))
    np.testing.assert_array_equal(ours.tensor(1)(), theirs.tensor(1)())


def test_reading_a_resource_tensor_is_a_value_error_as_in_litert():
    ours, theirs = _both(_variable())
    assert isinstance(_raised(theirs.get_tensor, 1), ValueError)
    error = _raised(ours.get_tensor, 1)
    assert isinstance(error, ValueError) and isinstance(error, TfliteTaichiError)
    assert "tensor 1 ('h')" in str(error) and "resource handle" in str(error)


# -- get_tensor_details() dicts --------------------------------------------------------------
def _assert_same_value(mine, theirs, where):
    assert type(mine) is type(theirs), (where, type(mine), type(theirs))
    if isinstance(theirs, dict):
        assert mine.keys() == theirs.keys(), (where, set(mine) ^ set(theirs))
        for key in theirs:
            _assert_same_value(mine[key], theirs[key], f"{where}[{key!r}]")
    elif isinstance(theirs, (list, tuple)):
        assert len(mine) == len(theirs), where
        for i, (a, b) in enumerate(zip(mine, theirs)):
            _assert_same_value(a, b, f"{where}[{i}]")
    elif isinstance(theirs, np.ndarray):
        assert mine.dtype == theirs.dtype and np.array_equal(mine, theirs), where
    elif isinstance(theirs, float):
        assert mine == pytest.approx(theirs), where
    else:
        assert mine == theirs, where


def _assert_tensor_details_match(model):
    ours, theirs = _both(model)
    mine = ours.get_tensor_details()
    # LiteRT also lists its kernels' scratch tensors after allocate_tensors(), after the model's
    # own (an intended difference, README): the model's tensors are compared
    expected = theirs.get_tensor_details()[:len(mine)]
    assert [d["index"] for d in expected] == list(range(len(mine)))
    _assert_same_value(mine, expected, "details")


def test_a_resource_tensor_is_an_object_tensor_in_the_details_as_in_litert():
    _assert_tensor_details_match(_variable())


@pytest.mark.parametrize("blocks", [{}, {"block_map": (1,), "block_size": (4,)}],
                         ids=["no-blocks", "blocks"])
def test_sparse_constant_details_match_litert(blocks):
    """A sparse constant stored without a block_map vector has no 'block_map' key in LiteRT's
    details; with one, the key holds it."""
    _assert_tensor_details_match(_sparse_weights(**blocks))


def test_shapes_known_only_at_invoke_are_reported_as_in_litert():
    """Before invoke: the shape the file declares (the converter writes 1 for each unknown
    dimension); after: this invoke's, intermediates included."""
    ours, theirs = _both(_where_then_add())
    _assert_same_value(ours.get_tensor_details(), theirs.get_tensor_details(), "before invoke")
    for it in (ours, theirs):
        it.set_tensor(0, np.array([True, False, True, True]))
        it.invoke()
    _assert_same_value(ours.get_tensor_details(), theirs.get_tensor_details(), "after invoke")


def test_a_shape_folded_at_allocate_is_known_before_invoke_unlike_litert():
    """The intended difference (README): LiteRT's prepare leaves RESHAPE's output dynamic and
    reports the declared [1, 1] until invoke; ours folds the ADD and knows [3, 2] at once."""
    ours, theirs = _both(_reshape_to_a_folded_shape())
    assert theirs.get_output_details()[0]["shape"].tolist() == [1, 1]
    assert ours.get_output_details()[0]["shape"].tolist() == [3, 2]
    for it in (ours, theirs):
        it.set_tensor(0, np.arange(6, dtype=np.float32).reshape(2, 3))
        it.invoke()
    _assert_same_value(ours.get_tensor_details(), theirs.get_tensor_details(), "after invoke")
    np.testing.assert_array_equal(ours.get_tensor(4), theirs.get_tensor(4))


# -- LiteRT's argument order, set_tensor on outputs, its op details ------------------------------
def _positional(model: bytes, *args):
    """LiteRT's and ours, made with the same positional arguments."""
    return litert.Interpreter(None, model, *args), Interpreter(None, model, *args)


def test_litert_positional_arguments_in_litert_order():
    """Interpreter(path, content, experimental_delegates, num_threads, ...) as LiteRT takes
    them: an empty delegate list and a thread count run; backend is keyword-only."""
    model = _float_add()
    for it in _positional(model, [], 2):
        it.allocate_tensors()
    ours = Interpreter(None, model, None, 1, None, False, backend="reference")
    assert ours.backend == "reference"


def test_a_non_empty_delegate_list_is_refused_saying_what_to_do():
    with pytest.raises(TfliteTaichiError, match=r"experimental_delegates=\['gpu'\].*pass None "
                                                r"or \[\] and choose it with backend="):
        Interpreter(None, _float_add(), ["gpu"])


def test_a_backend_that_is_not_a_name_is_refused():
    with pytest.raises(TfliteTaichiError, match=r"backend must be a name .*got \[\]"):
        Interpreter(None, _float_add(), backend=[])


def test_an_output_can_be_set_as_in_litert_until_invoke_overwrites_it():
    model = _float_add()
    a = np.arange(12, dtype=np.float32).reshape(1, 4, 3)
    for it in _positional(model):
        it.allocate_tensors()
        out = it.get_output_details()[0]["index"]
        it.set_tensor(out, np.full((1, 4, 3), 7, np.float32))
        np.testing.assert_array_equal(it.get_tensor(out), np.full((1, 4, 3), 7, np.float32))
        for d in it.get_input_details():
            it.set_tensor(d["index"], a)
        it.invoke()
        np.testing.assert_array_equal(it.get_tensor(out), a + a)


def test_an_intermediate_still_cannot_be_set():
    b = ModelBuilder()
    g = b.subgraph()
    x = g.input("x", (2,))
    y = g.tensor("y", (2,))
    g.op("RELU", [x], [y])
    z = g.tensor("z", (2,))
    g.op("TANH", [y], [z])
    g.output(z)
    it = Interpreter(model_content=b.finish(), backend="reference")
    it.allocate_tensors()
    with pytest.raises(TfliteTaichiError, match=r"tensor 1 \('y'\) is neither an input nor an output"):
        it.set_tensor(1, np.zeros(2, np.float32))


def _fc_without_bias_then_tanh() -> bytes:
    """x [1, 4] -> FULLY_CONNECTED (no bias: input -1) -> int8 QUANTIZE -> DEQUANTIZE -> TANH."""
    b = ModelBuilder()
    g = b.subgraph()
    x = g.input("x", (1, 4))
    w = g.const("w", np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4))
    y = g.tensor("y", (1, 3))
    g.op("FULLY_CONNECTED", [x, w, -1], [y])
    q = g.tensor("q", (1, 3), np.int8, (0.02, 3))
    g.op("QUANTIZE", [y], [q])
    d = g.tensor("d", (1, 3))
    g.op("DEQUANTIZE", [q], [d])
    z = g.tensor("z", (1, 3))
    g.op("TANH", [d], [z])
    g.output(z)
    return b.finish()


def test_num_subgraphs_and_ops_details_match_litert():
    """Key by key and value by value; LiteRT appends its XNNPACK delegate's node (op_name
    DELEGATE) after the model's ops, which ours lists alone."""
    from cases.control import _while_with_body
    theirs, ours = _positional(_while_with_body(lambda sg, v: [v[0]]))
    assert ours.num_subgraphs() == theirs.num_subgraphs() == 3
    theirs, ours = _positional(_fc_without_bias_then_tanh())
    theirs.allocate_tensors()
    ours.allocate_tensors()
    expected, actual = theirs._get_ops_details(), ours._get_ops_details()
    assert len(actual) == 4 and all(e["op_name"] == "DELEGATE" for e in expected[4:]), expected
    for e, a in zip(expected, actual):
        assert set(a) == set(e), (a, e)
        assert a["index"] == e["index"] and a["op_name"] == e["op_name"], (a, e)
        for key in ("inputs", "outputs"):
            assert a[key].dtype == e[key].dtype and np.array_equal(a[key], e[key]), (key, a, e)
        assert a["operand_types"] == e["operand_types"] and a["result_types"] == e["result_types"]
    assert list(actual[0]["inputs"]) == [0, 1, -1]
