"""The model reader: what it reads (checked against LiteRT where it can be) and what it refuses."""
import re

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


# -- malformed files, in the user's terms --------------------------------------------------------
def _model_with_weights():
    """A model whose file, like a converter's, is mostly constant data (64 KiB of weights)."""
    b = ModelBuilder()
    g = b.subgraph()
    x = g.input("x", (1, 128))
    w = g.const("w", np.linspace(-1, 1, 128 * 128, dtype=np.float32).reshape(128, 128))
    y = g.tensor("y", (1, 128))
    g.op("FULLY_CONNECTED", [x, w, -1], [y])
    g.output(y)
    return b.finish()


@pytest.mark.parametrize("fraction", [0.01, 0.2, 0.5, 0.9, 0.999])
def test_a_truncated_file_says_so_with_its_name_and_sizes(tmp_path, fraction):
    data = _model_with_weights()
    cut = int(len(data) * fraction)
    path = tmp_path / "model.tflite"
    path.write_bytes(data[:cut])
    with pytest.raises(ModelError) as e:
        Interpreter(model_path=str(path), backend="reference")
    message = str(e.value)
    found = re.fullmatch(rf"{re.escape(str(path))} is truncated: .* needs at least (\d+) bytes, "
                         rf"the file has {cut}", message)
    assert found, message
    assert cut < int(found.group(1)) <= len(data), message      # a true lower bound


def test_truncated_bytes_say_so_without_the_decoders_text():
    data = _model_with_weights()
    for cut in range(8, len(data), 997):
        with pytest.raises(ModelError) as e:
            read_model(data[:cut])
        message = str(e.value)
        assert message.startswith("the model is truncated: "), (cut, message)
        assert "unpack_from" not in message and "struct" not in message, (cut, message)


@pytest.mark.parametrize("content, says", [
    (b"x = 1\nprint('not a model')\n", "it looks like text"),
    ("ceci n'est pas un modèle\n".encode(), "it looks like text"),
    (b"version https://git-lfs.github.com/spec/v1\noid sha256:0123\nsize 4526968\n", "git lfs pull"),
    (b"<!DOCTYPE html><html><body>Not Found</body></html>", "HTML page"),
    (b"PK\x03\x04" + bytes(60), "zip archive"),
    (b"\x89HDF\r\n\x1a\n" + bytes(60), "HDF5 file"),
    (bytes(range(200, 256)) * 2, r"its identifier bytes are b'\\xcc\\xcd\\xce\\xcf'"),
], ids=["text", "utf-8 text", "git-lfs pointer", "html", "zip", "hdf5", "binary"])
def test_a_file_of_another_kind_is_named_and_described(tmp_path, content, says):
    path = tmp_path / "model.tflite"
    path.write_bytes(content)
    with pytest.raises(ModelError, match=rf"^{re.escape(str(path))} is not a TFLite model: it does "
                                         rf"not start with a flatbuffer of identifier TFL3 \(.*{says}"):
        read_model(str(path))


def test_empty_and_tiny_files_are_named(tmp_path):
    path = tmp_path / "empty.tflite"
    path.write_bytes(b"")
    with pytest.raises(ModelError, match=rf"^{re.escape(str(path))} is empty"):
        read_model(path)
    path.write_bytes(b"TFL3")
    with pytest.raises(ModelError, match=rf"^{re.escape(str(path))} is too short .*4 bytes"):
        read_model(path)


def test_a_corrupt_flatbuffer_is_a_model_error_in_the_users_terms():
    data = bytearray(_mul_model())
    data[0:4] = (len(data) - 8).to_bytes(4, "little")   # the root table: 8 bytes of the end
    with pytest.raises(ModelError, match="^the model is (corrupt|truncated)"):
        read_model(bytes(data))


def test_reading_the_schema_leaves_flatbuffers_as_it_was():
    """The `tflite` bindings import with flatbuffers' numpy search short-cut (model.py:
    _numpy_found_once): in a fresh process, the search is flatbuffers' own again afterwards,
    and every generated module got the numpy this process runs."""
    import subprocess
    import sys
    script = (
        "import numpy, flatbuffers.compat as compat\n"
        "own = compat.import_numpy\n"
        "from tflite_taichi.model import _schema\n"
        "_schema()\n"
        "import sys\n"
        "assert compat.import_numpy is own, compat.import_numpy\n"
        "assert sys.modules['tflite.Model'].np is numpy and sys.modules['tflite.Conv2DOptions'].np is numpy\n"
        "print('ok')\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]
