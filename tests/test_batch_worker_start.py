"""batch's local pool (tflite_taichi/batch/pool.py) when a worker dies while it starts, before it
reports "ready": its slot is started again START_ATTEMPTS times, then retired; the run ends, the
other workers doing the work, or with a BatchError naming each slot when none can start. A pool
that restarted such a slot for ever never ended: the test's time limit fails it."""
import numpy as np
import pytest

from batch_faults import FAULT_ENV, FAULTS, record_retirements
from cases.batch import write_arrays
from cases.demo import demo_case
from tflite_taichi import batch
from tflite_taichi.batch.inputs import input_spec
from tflite_taichi.batch.outputs import read_outputs
from tflite_taichi.batch.pool import START_ATTEMPTS, LocalPool
from tflite_taichi.batch.runner import RunConfig
from tflite_taichi.errors import BatchError
from tflite_taichi.interpreter import Interpreter

GPUS = [{"CUDA_VISIBLE_DEVICES": "0"}, {"CUDA_VISIBLE_DEVICES": "1"}]   # reference: names only
ITEMS = 24


@pytest.fixture
def work(tmp_path):
    """(RunConfig writing into tmp_path/out, the tasks: three of 8 items)."""
    _, model, _ = demo_case(tmp_path, seed=11)
    model = model.read_bytes()
    reference = Interpreter(model_content=model, backend="reference")
    item = tuple(reference.get_input_details()[0]["shape"][1:])
    write_arrays(tmp_path / "in", ITEMS, item, seed=3)
    out = tmp_path / "out"
    out.mkdir()
    config = RunConfig(model=model, backend="reference", precision="fp32", batch_size=4,
                       spec=input_spec(reference), info=batch.output_info(reference),
                       out_dir=str(out), fmt="npz", imports=FAULTS)
    items, _ = batch.discover([str(tmp_path / "in")])
    return config, [(t, items[t * 8:(t + 1) * 8]) for t in range(3)]


@pytest.mark.timeout(300)
def test_a_worker_that_dies_while_starting_is_retired_and_the_others_do_the_work(
        work, tmp_path, monkeypatch):
    """The worker on "GPU 0" exits at every start; the one on "GPU 1" runs nothing until the
    driver has retired slot 0 (batch_faults), so the work cannot run out before that."""
    config, tasks = work
    marker = str(tmp_path / "retired")
    monkeypatch.setenv(FAULT_ENV, f"exit_at_start:0:{marker}")
    record_retirements(monkeypatch, marker)
    report = LocalPool(config, GPUS, retries=0).run(tasks)
    dead, alive = report["workers"]
    assert dead["items"] == 0 and dead["retired"] == (
        f"it died {START_ATTEMPTS} times while starting (last: exit status 1)")
    assert alive["items"] == ITEMS and "retired" not in alive
    assert report["restarts"] == START_ATTEMPTS - 1 and not report["given_up"]
    assert report["notes"] == [f"worker 0 (GPU 0) was retired ({dead['retired']}); the others "
                               "ran its work"]
    outputs = read_outputs(config.out_dir)
    assert len(outputs) == ITEMS
    assert all(np.isfinite(v).all() for row in outputs.values() for v in row.values())


@pytest.mark.timeout(300)
def test_a_run_where_no_worker_can_start_ends_with_an_error_naming_each(work, monkeypatch):
    config, tasks = work
    monkeypatch.setenv(FAULT_ENV, "exit_at_start:*:")
    with pytest.raises(BatchError) as caught:
        LocalPool(config, GPUS, retries=0).run(tasks)
    why = f"it died {START_ATTEMPTS} times while starting (last: exit status 1)"
    assert str(caught.value) == (f"no worker could start: worker 0 (GPU 0): {why}; "
                                 f"worker 1 (GPU 1): {why}")
    assert read_outputs(config.out_dir) == {}
