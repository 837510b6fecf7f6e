"""The model reader: what it reads (checked against LiteRT where it can be) and what it refuses."""
import numpy as np
import pytest

from tflite_taichi import Interpreter
from tflite_taichi.builder import ModelBuilder
from tflite_taichi.errors import ModelError, TfliteTaichiError, UnsupportedOpError
from tflite_taichi.model import read_model
from tflite_taichi.testing import run_litert, run_ours


def _mul_model(external=False, tamper=None):
    b = ModelBuilder()
    g = b.subgraph()
    x = g.input("x", (2, 3))
    c = g.const("scale", np.array([1.0, 2.0, 3.0], np.float32))
    y = g.tensor("y", (2, 3))
    g.op("MUL", [x, c], [y])
    g.output(y)
    if tamper:
        tamper(b, g)
    return b.finish(external_buffers=external)


def test_reads_tensors_ops_and_constants_as_views():
    data = _mul_model()
    m = read_model(data)
    sg = m.main
    assert [t.name for t in sg.tensors] == ["x", "scale", "y"]
    assert sg.operators[0].name == "MUL" and sg.inputs == (0,) and sg.outputs == (2,)
    const = sg.tensors[1].data
    np.testing.assert_array_equal(const, [1, 2, 3])
    assert not const.flags.owndata and not const.flags.writeable   # a view on the model bytes


def test_external_buffers_after_the_flatbuffer_match_litert():
    data = _mul_model(external=True)
    assert read_model(data).main.tensors[1].data.tolist() == [1.0, 2.0, 3.0]
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_array_equal(run_ours(data, [x])[0], run_litert(data, [x])[0])


def test_model_path_is_memory_mapped(tmp_path):
    path = tmp_path / "m.tflite"
    path.write_bytes(_mul_model())
    it = Interpreter(model_path=str(path), backend="reference")
    it.allocate_tensors()
    it.set_tensor(0, np.ones((2, 3), np.float32))
    it.invoke()
    np.testing.assert_array_equal(it.get_tensor(2), [[1, 2, 3], [1, 2, 3]])


@pytest.mark.parametrize("cut", [0, 4, 7, 20, 100, -8, -1])
def test_truncated_file_is_a_model_error(cut):
    data = _mul_model()
    with pytest.raises(ModelError, match="truncated|too short|malformed|past the end|not a TFLite"):
        read_model(data[:cut])


def test_wrong_identifier_is_a_model_error():
    data = bytearray(_mul_model())
    data[4:8] = b"XXXX"
    with pytest.raises(ModelError, match="not a TFLite model"):
        read_model(bytes(data))


def test_buffer_shorter_than_its_tensor_names_the_tensor():
    def grow(_b, g):
        g.tensors[1].shape = (4,)     # 4 floats declared, 3 stored
    with pytest.raises(ModelError, match=r"tensor 1 \('scale'\).*12 bytes.*needs 16"):
        read_model(_mul_model(tamper=grow))


def test_tensor_index_out_of_range_names_the_op():
    def bad_input(_b, g):
        g.ops[0].inputs[1] = 99
    with pytest.raises(ModelError, match=r"op #0 \(MUL\).*tensor index 99 out of range"):
        read_model(_mul_model(tamper=bad_input))


def test_opcode_index_out_of_range_is_a_model_error():
    def bad_opcode(_b, g):
        g.ops[0].opcode = 7
    with pytest.raises(ModelError, match="opcode index 7 out of range"):
        read_model(_mul_model(tamper=bad_opcode))


def test_buffer_index_out_of_range_names_the_tensor():
    def bad_buffer(_b, g):
        g.tensors[1].buffer = 42
    with pytest.raises(ModelError, match=r"tensor 1 \('scale'\): buffer index 42 out of range"):
        read_model(_mul_model(tamper=bad_buffer))


def test_graph_order_is_checked():
    b = ModelBuilder()
    g = b.subgraph()
    x = g.input("x", (3,))
    mid = g.tensor("mid", (3,))
    y = g.tensor("y", (3,))
    g.op("RELU", [mid], [y])        # reads 'mid' before the op that writes it
    g.op("RELU", [x], [mid])
    g.output(y)
    with pytest.raises(ModelError, match=r"op #0 \(RELU\).*'mid'.*read before it is written.*op #1"):
        read_model(b.finish())


def test_unknown_ops_are_all_reported_at_construction():
    b = ModelBuilder()
    g = b.subgraph()
    x = g.input("x", (3,))
    t1, t2, t3 = g.tensor("a", (3,)), g.tensor("b", (3,)), g.tensor("c", (3,))
    g.op("CUSTOM:MyOp", [x], [t1])
    g.op("HASHTABLE_LOOKUP", [t1], [t2])
    g.op("CUSTOM:MyOp", [t2], [t3])
    g.output(t3)
    with pytest.raises(UnsupportedOpError) as e:
        Interpreter(model_content=b.finish(), backend="reference")
    message = str(e.value)
    assert "CUSTOM:MyOp (op #0, #2)" in message and "HASHTABLE_LOOKUP (op #1)" in message
    assert set(e.value.ops) == {"CUSTOM:MyOp", "HASHTABLE_LOOKUP"}


def test_options_of_the_wrong_table_type_are_refused():
    # ADD carrying Conv2DOptions: a mutated options union must not be read as AddOptions.
    b = ModelBuilder()
    g = b.subgraph()
    x = g.input("x", (3,))
    y = g.tensor("y", (3,))
    g.op("ADD", [x, x], [y], options_class="Conv2DOptions", stride_w=2)
    g.output(y)
    with pytest.raises(ModelError, match=r"op #0 \(ADD\).*expected AddOptions"):
        Interpreter(model_content=b.finish(), backend="reference")


def test_missing_file_and_garbage_input_types():
    with pytest.raises(ModelError, match="cannot read model file"):
        read_model("/nonexistent/model.tflite")
    with pytest.raises(ModelError, match="path or bytes"):
        read_model(12345)


def test_every_error_is_in_one_family():
    for cls in (ModelError, UnsupportedOpError):
        assert issubclass(cls, TfliteTaichiError)
