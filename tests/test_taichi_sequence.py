"""LSTM (FULL and BASIC kernels) and UNIDIRECTIONAL_SEQUENCE_LSTM on the delegate (cpu, vulkan,
opengl workers; fp16 on vulkan; gles) vs the reference path, over the attribute space of
tests/test_ops_sequence.py (layer norm, projection, CIFG, peepholes, every activation, clips,
time_major, diagonal recurrent weights, 1 to 8 time steps). One case table (SEQUENCE_ROWS,
tests/cases/sequence.py) drives one property test; each row draws the op inside each example,
so one compile per example covers all three. Most models feed output_state and cell_state as
inputs (random, non-zero) or as zero constants (a first invoke's); as variable tensors (what
LiteRT requires), the delegate keeps them in slots of its io buffer across invokes and the op's
Taichi part writes the last h and c there: sequences of invokes on every backend, and a reset
and a read of the state in between on the cpu backend. Tolerances:
tflite_taichi.testing.TAICHI_RTOL; int8 within one quantization step."""
import warnings

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from tflite_taichi import Interpreter
from tflite_taichi.testing import (TAICHI_EXAMPLES, TAICHI_RTOL, assert_float_close,
                                   check_delegate, check_op, run_sequence, strategies)
from cases.sequence import (BASE_SEQUENCE, SEQUENCE_ROWS, basic_inputs, basic_model, full_case,
                            lstm_inputs as _inputs, lstm_model, x_shape)
from cases.table import row_id

S = strategies()


@pytest.mark.parametrize("row", SEQUENCE_ROWS, ids=row_id)
def test_ops_on_the_delegate(taichi_workers, row):
    check_op(row.cases, workers=taichi_workers)


def test_fp16_on_vulkan(vulkan_workers):
    case = dict(BASE_SEQUENCE, n_output=3, projection=True, projection_bias=True, layer_norm=True,
                n_inputs=24, cell_clip=1.5, time_major=True, n_time=3)
    check_delegate(lstm_model(case, "input"), vulkan_workers, _inputs(case, 1), precision="fp16")
    check_delegate(basic_model(2, 3, 4, 5), vulkan_workers, basic_inputs(2, 3, 4, 6),
                   precision="fp16")


def test_gles(gles_worker):
    case = dict(BASE_SEQUENCE, n_batch=3, n_input=4, n_cell=5, n_output=5, cifg=True, n_time=3)
    check_delegate(lstm_model(case, "input"), [gles_worker], _inputs(case, 2))
    check_delegate(basic_model(2, 3, 4, 7), [gles_worker], basic_inputs(2, 3, 4, 8))


def test_more_cells_than_threads(taichi_workers):
    """40 batch rows of 8 cells: each of the block's MAX_LANES threads takes several items."""
    from tflite_taichi.ops.sequence import MAX_LANES
    case = dict(BASE_SEQUENCE, n_batch=40, n_cell=8, n_output=5, projection=True,
                projection_bias=True, layer_norm=True, n_inputs=24, n_time=3, cifg=True)
    assert 40 * 8 > MAX_LANES
    check_delegate(lstm_model(case, "input"), taichi_workers, _inputs(case, 9))


def test_state_beyond_shared_memory_runs_from_scratch(taichi_workers):
    """A state larger than MAX_SHARED_FLOATS lives in the scratch buffer, a thread per batch
    row, on every arch (as it always does on Taichi's CPU backend): the delegate takes the op
    and its answers are the reference's."""
    from tflite_taichi.ops.sequence import MAX_SHARED_FLOATS
    case = dict(BASE_SEQUENCE, n_batch=700, n_input=1, n_cell=2, n_output=2, peephole=False,
                n_time=2)          # state: 700 * (2 + 2 * 2) floats
    assert 700 * 6 > MAX_SHARED_FLOATS
    summaries = check_delegate(lstm_model(case, "input"), taichi_workers, _inputs(case, 4))
    for summary in summaries.values():
        assert summary["ops_delegated"] == 1


def test_a_fresh_process_partitions_an_lstm_before_taichi_starts():
    """The partitioner asks the LSTM whether its state fits the arch's shared memory before
    anything is compiled, when a process (every process whose kernels come from the cache)
    has not started Taichi's Python runtime: the arch is the backend the process claimed, not
    Taichi's config (which raised AttributeError there). A worker of its own, so that no earlier
    test has started Taichi in it."""
    from tflite_taichi.testing import BackendWorker
    worker = BackendWorker("vulkan")
    try:
        model = lstm_model(BASE_SEQUENCE, "input")
        check_delegate(model, [worker], _inputs(BASE_SEQUENCE, 1))
    finally:
        worker.close()


# -- the state as variable tensors, kept on the delegate ----------------------------------------
@settings(max_examples=TAICHI_EXAMPLES)
@given(case=full_case(layer_norm=False), steps=st.integers(2, 4), seed=S.seeds())
def test_variable_state_stays_on_the_delegate_across_invokes(taichi_workers, case, steps, seed):
    """Each invoke starts from the last one's h and c, which never leave the device: the
    sequence's outputs within the tolerance of the reference's (no layer norm: its
    amplification depends on the state, which changes along the sequence)."""
    model = lstm_model(case, "variable")
    rng = np.random.default_rng(seed)
    sequence = [[rng.uniform(-2, 2, x_shape(case)).astype(np.float32)] for _ in range(steps)]
    expected = run_sequence(Interpreter(model_content=model, backend="reference"), sequence)
    for w in taichi_workers:
        w.submit(model, [], "fp32", sequence=sequence)
        outputs, summary = w.result()
        assert summary["ops_delegated"] == 1, summary["fallback"]
        for step, (ours, theirs) in enumerate(zip(outputs, expected)):
            assert_float_close(ours[0], theirs[0], TAICHI_RTOL["fp32"], what=f"{w.backend} step {step}")


def test_variable_state_is_reset_and_read_from_the_device():
    """reset_all_variables() puts the model's state back (the host's write wins over the
    device's copy); get_tensor of a state tensor fetches it from its slot."""
    case = dict(BASE_SEQUENCE, n_time=3)
    model = lstm_model(case, "variable")
    rng = np.random.default_rng(5)
    xs = [rng.uniform(-2, 2, x_shape(case)).astype(np.float32) for _ in range(4)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ours, ref = (Interpreter(model_content=model, backend=b) for b in ("cpu", "reference"))
    state_tensors = None
    for it in (ours, ref):
        it.allocate_tensors()
    assert ours.summary()["ops_delegated"] == 1
    for k, x in enumerate(xs):
        if k == 2:
            ours.reset_all_variables()
            ref.reset_all_variables()
        outs = []
        for it in (ours, ref):
            it.set_tensor(it.get_input_details()[0]["index"], x)
            it.invoke()
            state_tensors = [d["index"] for d in it.get_tensor_details()
                             if d["name"] in ("output_state", "cell_state")]
            outs.append([it.get_tensor(it.get_output_details()[0]["index"])]
                        + [it.get_tensor(t) for t in state_tensors])
        assert len(state_tensors) == 2
        for a, e in zip(*outs):
            assert_float_close(a, e, TAICHI_RTOL["fp32"], what=f"invoke {k}")
