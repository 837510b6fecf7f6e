"""State across invokes: VAR_HANDLE, READ_VARIABLE, ASSIGN_VARIABLE and CALL_ONCE with an init
subgraph, against LiteRT over sequences of invokes (reference path and the delegate, which
keeps the variables in slots of its io buffer and runs their reads and writes in the partition
with the compute; CALL_ONCE and the init subgraph's assignments run on the host), the value
crossing between the device and the host (an IF branch on the reference path reading and
writing the variable the partition writes, a reallocation), and the okay_nabu wake-word model
over ten steps."""
import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cases.state import (accumulator_model, check_nabu_steps, crossing_model, litert_nabu_tensors,
                         nabu_sequence, ring_buffer_model)

from tflite_taichi import Interpreter
from tflite_taichi.builder import RESOURCE, ModelBuilder
from tflite_taichi.errors import ModelError
from tflite_taichi.testing import (TAICHI_EXAMPLES, examples, assert_float_close, assert_quantized_close,
                                   run_sequence, strategies)

litert = pytest.importorskip("ai_edge_litert.interpreter")
S = strategies()


def _litert(model):
    """LiteRT's builtin kernels: its XNNPACK delegate refuses int8 variables whose reads and
    writes use different quantization ("failed to prepare"), the builtin ops define the semantics."""
    return litert.Interpreter(model_content=model, experimental_op_resolver_type=(
        litert.OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES))


def _compare_sequences(ours, theirs, what):
    for step, (a_outs, e_outs) in enumerate(zip(ours, theirs)):
        for a, e in zip(a_outs, e_outs):
            if a.dtype == np.int8:
                assert_quantized_close(a, e, 1, what=f"{what} step {step}")
            else:
                assert_float_close(a, e, what=f"{what} step {step}")


@settings(max_examples=examples(50))
@given(shape=S.shapes(1, 3, 1, 5), steps=st.integers(2, 6), seed=S.seeds())
def test_accumulator_state_persists_like_litert(shape, steps, seed):
    rng = np.random.default_rng(seed)
    initial = rng.uniform(-2, 2, shape).astype(np.float32)
    model = accumulator_model(shape, initial)
    sequence = [[rng.uniform(-1, 1, shape).astype(np.float32)] for _ in range(steps)]
    expected = run_sequence(_litert(model), sequence)
    ours = run_sequence(Interpreter(model_content=model, backend="reference"), sequence)
    _compare_sequences(ours, expected, "accumulator")
    # and it really accumulates: the last output is 2 * (initial + sum of inputs)
    np.testing.assert_allclose(ours[-1][0], 2 * (initial + sum(s[0] for s in sequence)), rtol=1e-5, atol=1e-5)


@st.composite
def ring_cases(draw):
    rows, cols = draw(st.integers(1, 4)), draw(st.integers(1, 6))
    q_in = draw(S.quant_params())
    q_init = draw(S.quant_params())
    q_read = draw(st.sampled_from([q_in, (q_in[0] * 2, 0), draw(S.quant_params())]))
    return rows, cols, q_in, q_init, q_read, draw(st.integers(2, 6)), draw(S.seeds())


@settings(max_examples=examples(50))
@given(ring_cases())
def test_int8_ring_buffer_matches_litert(case):
    rows, cols, q_in, q_init, q_read, steps, seed = case
    model = ring_buffer_model(rows, cols, q_in, q_init, q_read)
    rng = np.random.default_rng(seed)
    sequence = [[rng.integers(-128, 128, (1, 1, cols)).astype(np.int8)] for _ in range(steps)]
    expected = run_sequence(_litert(model), sequence)
    ours = run_sequence(Interpreter(model_content=model, backend="reference"), sequence)
    _compare_sequences(ours, expected, "ring buffer")


def test_variables_survive_reset_and_reallocation_as_in_litert():
    """On the delegate the value lives on the device: the reallocation's new program gets it
    back from the old one's slot as that closes."""
    model = accumulator_model((3,), np.zeros(3, np.float32), scale_out=1.0)
    one = [np.ones(3, np.float32)]
    for it in (_litert(model), Interpreter(model_content=model, backend="reference"),
               Interpreter(model_content=model, backend="cpu")):
        run_sequence(it, [one, one])
        it.reset_all_variables()        # resource variables are not variable tensors: kept
        it.allocate_tensors()
        it.set_tensor(it.get_input_details()[0]["index"], one[0])
        it.invoke()
        np.testing.assert_array_equal(it.get_tensor(it.get_output_details()[0]["index"]), [3, 3, 3])


def test_two_handles_with_one_name_share_the_variable():
    """VAR_HANDLE in the init subgraph and in main name 'acc': one variable (LiteRT's rule)."""
    model = accumulator_model((2,), np.array([5, 7], np.float32), scale_out=1.0)
    out = run_sequence(Interpreter(model_content=model, backend="reference"), [[np.zeros(2, np.float32)]])
    np.testing.assert_array_equal(out[0][0], [5, 7])


def _read_without_init():
    b = ModelBuilder()
    g = b.subgraph()
    x = g.input("x", (2,))
    h = g.tensor("h", (), RESOURCE)
    g.op("VAR_HANDLE", [], [h], shared_name="never_assigned")
    state = g.tensor("state", (2,))
    g.op("READ_VARIABLE", [h], [state])
    out = g.tensor("out", (2,))
    g.op("ADD", [state, x], [out])
    g.output(out)
    return b.finish()


@pytest.mark.parametrize("backend", ["reference", "cpu"])
def test_reading_a_variable_never_assigned_names_it(backend):
    it = Interpreter(model_content=_read_without_init(), backend=backend)
    it.allocate_tensors()
    with pytest.raises(ModelError, match=r"op #1 \(READ_VARIABLE\).*'never_assigned' before any ASSIGN_VARIABLE"):
        it.invoke()
    if backend == "cpu":            # the read was the delegate's (the message is the same)
        assert it.summary()["ops_delegated"] == 2


def test_call_once_to_a_missing_subgraph_is_a_model_error():
    b = ModelBuilder()
    g = b.subgraph()
    x = g.input("x", (2,))
    g.op("CALL_ONCE", [], [], init_subgraph_index=7)
    out = g.tensor("out", (2,))
    g.op("RELU", [x], [out])
    g.output(out)
    it = Interpreter(model_content=b.finish(), backend="reference")
    it.allocate_tensors()
    with pytest.raises(ModelError, match=r"op #0 \(CALL_ONCE\): init subgraph 7 does not exist"):
        it.invoke()


def test_reading_a_resource_handle_is_a_clear_error():
    it = Interpreter(model_content=accumulator_model((2,), np.zeros(2, np.float32)), backend="reference")
    it.allocate_tensors()
    handle = [d["index"] for d in it.get_tensor_details() if d["name"] == "h"][0]
    with pytest.raises(Exception, match="resource handle"):
        it.get_tensor(handle)


@settings(max_examples=examples(10))
@given(shape=S.shapes(1, 2, 1, 4), conds=st.lists(st.booleans(), min_size=3, max_size=8),
       seed=S.seeds())
def test_a_variable_crossing_between_device_and_host_matches_litert(shape, conds, seed):
    """Every order of device writes, host reads and host writes (the IF's branches) over a
    sequence: LiteRT's outputs, on the reference path and on the delegate (cpu backend here;
    the delegate's backends below)."""
    rng = np.random.default_rng(seed)
    model = crossing_model(shape, rng.uniform(-1, 1, shape).astype(np.float32))
    sequence = [[np.array(c), rng.uniform(-1, 1, shape).astype(np.float32)] for c in conds]
    expected = run_sequence(_litert(model), sequence)
    for backend in ("reference", "cpu"):
        it = Interpreter(model_content=model, backend=backend)
        ours = run_sequence(it, sequence)
        _compare_sequences(ours, expected, backend)
        if backend == "cpu":        # the variable's ops ran on the delegate
            assert {f["op"] for f in it.summary()["fallback"]} == {"CALL_ONCE", "IF"}


# -- on the delegate ------------------------------------------------------------------------
def _delegate_sequence(worker, model, sequence, **kwargs):
    worker.submit(model, [], "fp32", sequence=sequence, **kwargs)
    return worker.result()


@settings(max_examples=TAICHI_EXAMPLES)
@given(ring_cases())
def test_state_models_on_the_delegate_match_the_reference(taichi_workers, case):
    rows, cols, q_in, q_init, q_read, steps, seed = case
    rng = np.random.default_rng(seed)
    float_model = accumulator_model((rows, cols), rng.uniform(-1, 1, (rows, cols)).astype(np.float32))
    float_seq = [[rng.uniform(-1, 1, (rows, cols)).astype(np.float32)] for _ in range(steps)]
    int8_model = ring_buffer_model(rows, cols, q_in, q_init, q_read)
    int8_seq = [[rng.integers(-128, 128, (1, 1, cols)).astype(np.int8)] for _ in range(steps)]
    for model, sequence, n_compute in ((float_model, float_seq, 2), (int8_model, int8_seq, 3)):
        expected = run_sequence(Interpreter(model_content=model, backend="reference"), sequence)
        for w in taichi_workers:
            outputs, summary = _delegate_sequence(w, model, sequence)
            # the variable's read and write run in the partition, with the compute
            assert [len(p["ops"]) for p in summary["partitions"]] == [n_compute + 2], summary
            assert {f["op"] for f in summary["fallback"]} == {"CALL_ONCE"}
            _compare_sequences(outputs, expected, f"{w.backend}")
        crossing = crossing_model((rows, cols), rng.uniform(-1, 1, (rows, cols)).astype(np.float32))
        conds = [[np.array(bool(c)), rng.uniform(-1, 1, (rows, cols)).astype(np.float32)]
                 for c in rng.integers(0, 2, steps + 2)]
        expected = run_sequence(Interpreter(model_content=crossing, backend="reference"), conds)
        for w in taichi_workers:
            outputs, summary = _delegate_sequence(w, crossing, conds)
            assert {f["op"] for f in summary["fallback"]} == {"CALL_ONCE", "IF"}, summary
            _compare_sequences(outputs, expected, f"{w.backend}, crossing")


# -- okay_nabu: a streaming int8 wake-word model with 6 variables ----------------------------
@pytest.mark.models
def test_okay_nabu_reference_ten_steps_every_int8_tensor_within_3_units(shared_models):
    path = os.path.join(shared_models, "okay_nabu.tflite")
    sequence = nabu_sequence()
    expected = litert_nabu_tensors(path, sequence)
    it = Interpreter(model_path=path, backend="reference")
    it.allocate_tensors()
    ours = []
    for inputs in sequence:
        it.set_tensor(it.get_input_details()[0]["index"], inputs[0])
        it.invoke()
        ours.append({t: it.get_tensor(t) for t in expected[0]})
    check_nabu_steps(ours, expected, "reference")


@pytest.mark.models
def test_okay_nabu_delegated_ten_steps_every_int8_tensor_within_3_units(shared_models, taichi_workers):
    """One partition: the integer ops and the 12 variable reads and writes; CALL_ONCE (and
    subgraph 1's assignments) on the CPU."""
    path = os.path.join(shared_models, "okay_nabu.tflite")
    sequence = nabu_sequence()
    expected = litert_nabu_tensors(path, sequence)
    model = open(path, "rb").read()
    for w in taichi_workers:
        outputs, summary = _delegate_sequence(w, model, sequence, experimental_preserve_all_tensors=True)
        assert len(summary["partitions"]) == 1 and summary["ops_delegated"] == 54, summary["partitions"]
        assert {f["op"] for f in summary["fallback"]} == {"CALL_ONCE"}
        check_nabu_steps(summary["tensors"], expected, w.backend)
