"""Keras recurrent layers as TensorFlow 2.18's converter writes them by default:
tests/data/keras/*.tflite, made by make_keras_rnns.py there. Keras 3's LSTM and GRU are not fused
into UNIDIRECTIONAL_SEQUENCE_LSTM: each layer is a WHILE whose body reads step i with GATHER and
writes it, with return_sequences, as CONCATENATION(SLICE(.., 0, i), h, SLICE(.., i + 1, end)): a
shape that only the run-time counter decides, which the WHILE checks at every iteration.
Held to LiteRT (XNNPACK) on the reference path with the usual float32 tolerance
(testing.FLOAT_RTOL), and around the delegate (the loops stay on the CPU, the rest is delegated)
to the reference."""
import os

import numpy as np
import pytest

from tflite_taichi import Interpreter
from tflite_taichi.errors import ModelError
from tflite_taichi.testing import assert_float_close, check_against_litert, check_delegate
from cases.control import _while_with_body

litert = pytest.importorskip("ai_edge_litert.interpreter")

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "keras")
FIXED_LENGTH = ["keras_lstm", "keras_rnn_lstmcell", "keras_gru", "keras_bilstm"]


def _model(name: str) -> bytes:
    with open(os.path.join(DATA, f"{name}.tflite"), "rb") as f:
        return f.read()


@pytest.mark.parametrize("name", FIXED_LENGTH)
def test_a_converted_keras_rnn_matches_litert(name):
    model = _model(name)
    for seed in range(3):
        check_against_litert(model, seed=seed)
    whiles = [op for op in _ops(model) if op == "WHILE"]
    assert whiles, f"{name}: the converter's loop is gone; the fixture no longer tests WHILE"


def _ops(model: bytes) -> list:
    """The main graph's ops (on the reference path every op is a CPU step of summary())."""
    return [f["op"] for f in Interpreter(model_content=model, backend="reference").summary()["fallback"]]


def test_a_keras_lstm_of_any_length_runs_every_length_like_litert():
    """[1, None, 4] input: one interpreter resized to 7, 3, 1 and 12 steps; every step's output
    (return_sequences) against LiteRT's, resized the same way."""
    model = _model("keras_lstm_any_length")
    ours = Interpreter(model_content=model, backend="reference")
    index = ours.get_input_details()[0]["index"]
    assert list(ours.get_input_details()[0]["shape_signature"]) == [1, -1, 4]
    rng = np.random.default_rng(0)
    for steps in (7, 3, 1, 12):
        x = rng.uniform(-3, 3, (1, steps, 4)).astype(np.float32)
        theirs = litert.Interpreter(model_content=model)
        theirs.resize_tensor_input(theirs.get_input_details()[0]["index"], [1, steps, 4])
        theirs.allocate_tensors()
        theirs.set_tensor(theirs.get_input_details()[0]["index"], x)
        theirs.invoke()
        expected = theirs.get_tensor(theirs.get_output_details()[0]["index"])
        ours.resize_tensor_input(index, [1, steps, 4])
        ours.allocate_tensors()
        ours.set_tensor(index, x)
        ours.invoke()
        actual = ours.get_tensor(ours.get_output_details()[0]["index"])
        assert actual.shape == (1, steps, 3)
        assert_float_close(actual, expected, what=f"{steps} steps")


@pytest.mark.parametrize("name", ["keras_lstm", "keras_bilstm"])
def test_a_converted_keras_rnn_around_the_delegate(taichi_workers, name):
    summaries = check_delegate(_model(name), taichi_workers, expect_all_delegated=False)
    for backend, s in summaries.items():   # the loops on the CPU, the dense head delegated
        assert "WHILE" in {f["op"] for f in s["fallback"]}, (backend, s["fallback"])
        assert s["ops_delegated"] >= 1, backend
        # each loop's body delegated but for its int32 counter steps and the GATHER of step i
        # by the counter (the delegate carries no int32 data); every step ran on the delegate
        bodies = [c for c in s["calls"] if c["ops_total"] == 19]
        assert len(bodies) == (2 if name == "keras_bilstm" else 1), s["calls"]
        for body in bodies:
            assert body["ops_delegated"] == 16, (backend, body)
            assert sorted(f["op"] for f in body["fallback"]) == ["ADD", "ADD", "GATHER"], body
            assert body["runs_on_delegate"] == (6 if name == "keras_lstm" else 5), (backend, body)


def _growing_loop() -> bytes:
    """x: [2] float (test_ops_control's WHILE on [2], while any x < 10); the body returns
    SLICE(x + 1, [0], [int(x[0])]): its shape is decided by the data, so only the invoke can
    tell that x = [1, ...] makes it [1]. (x + 1 moves the loop on: unchecked, the second
    iteration asks for 2 elements of a [1], an error of SLICE's, not an endless loop.)"""
    def body(sg, v):
        start, one = sg.const("b0", np.array([0], np.int32)), sg.const("s1", np.array([1], np.int32))
        head = sg.tensor("head", (1,))
        sg.op("SLICE", [v[0], start, one], [head])
        size = sg.tensor("size", (1,), np.int32)
        sg.op("CAST", [head], [size])
        bumped = sg.tensor("bumped", (2,))
        sg.op("ADD", [v[0], sg.const("one", np.array(1.0, np.float32))], [bumped])
        out = sg.tensor("out", (2,))
        sg.op("SLICE", [bumped, start, size], [out])
        return [out]
    return _while_with_body(body)


def test_a_loop_carried_tensor_that_changes_shape_at_run_time_is_a_model_error():
    it = Interpreter(model_content=_growing_loop(), backend="reference")
    it.allocate_tensors()
    it.set_tensor(it.get_input_details()[0]["index"], np.array([1.0, 5.0], np.float32))
    with pytest.raises(ModelError, match=r"op #0 \(WHILE\): body subgraph 2 turns loop-carried "
                                         r"'x' of shape \[2\] into \[1\] \('out'\).*change shape"):
        it.invoke()
