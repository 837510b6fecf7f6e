"""`tflite-taichi batch` as a newcomer meets it on a few inputs: every worker asked for does some
of the work, a pipe hears how the run goes before it ends, a model that cannot run batches is
found before any worker builds kernels for one, messages print plain numbers, float64 array
files are refused with the fix named, and --format's help says what is written."""
import argparse
import json
import os
import selectors
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from batch_faults import FAULT_ENV, FAULTS, with_tests_on_path
from cases.batch import write_arrays
from tflite_taichi import batch
from tflite_taichi.batch.inputs import ItemError, decode, input_spec
from tflite_taichi.batch.outputs import INFO_FILE, output_info
from tflite_taichi.batch.pool import START_WAIT_S, LocalPool
from tflite_taichi.batch.runner import BatchRunner, RunConfig, probe_batching
from tflite_taichi.builder import ModelBuilder
from tflite_taichi.cli import build_parser
from tflite_taichi.interpreter import Interpreter

FEATURES = 4
PIPE_WAIT_S = 240        # a generous bound on a loaded 2-core machine: two workers' start


def relu_model(reshape_to=None) -> bytes:
    """x [1, 4] (the batch dimension resizable) -> RELU -> y; with `reshape_to`, a RESHAPE to
    it after ([1, -1]: a batch of n becomes [1, 4n], not batch-first)."""
    mb = ModelBuilder()
    sg = mb.subgraph()
    x = sg.input("x", [1, FEATURES], shape_signature=[-1, FEATURES])
    y = sg.tensor("y", [1, FEATURES])
    sg.op("RELU", [x], [y])
    if reshape_to is not None:
        out = sg.tensor("out", [1, FEATURES])
        sg.op("RESHAPE", [y, sg.const("shape", np.array(reshape_to, np.int32))], [out])
        y = out
    sg.output(y)
    return mb.finish()


def _config(model: bytes, tmp_path, batch_size: int = 8, note=None) -> RunConfig:
    reader = Interpreter(model_content=model, backend="reference")
    return RunConfig(model=model, backend="reference", precision="fp32", batch_size=batch_size,
                     spec=input_spec(reader), info=output_info(reader), out_dir=str(tmp_path),
                     fmt="npz", batching_note=note)


# -- every worker gets work -----------------------------------------------------------------------
def test_every_worker_of_a_small_run_does_some_of_it(tmp_path):
    """6 inputs, 2 workers: two tasks, one each. The first worker to start used to queue both
    (two tasks per worker) and run all of it while the other started; the summary in
    _outputs.json says which worker did how many."""
    write_arrays(tmp_path / "in", 6, (1, FEATURES), seed=1)
    out = str(tmp_path / "out")
    result = batch.run(relu_model(), [str(tmp_path / "in")], out, backend="reference", workers=2,
                       fmt="npz")
    assert result.written == 6
    assert [w["items"] for w in result.workers] == [3, 3], result.workers
    with open(os.path.join(out, INFO_FILE)) as f:
        summary = json.load(f)["summary"]
    assert [w["items"] for w in summary["workers"]] == [3, 3]


def _pool_with_one_started(tmp_path, pending: int) -> tuple:
    """A LocalPool (no process started) whose worker 0 has started and is idle, worker 1 still
    starting, and `pending` tasks waiting."""
    pool = LocalPool(_config(relu_model(), tmp_path), [{}, {}], retries=0)
    pool.pending = list(range(pending))
    started, starting = pool.workers
    started.ready, started.info, started.idle_since = True, {}, time.monotonic()
    return pool, started, starting


def test_the_last_tasks_are_kept_for_a_worker_still_starting(tmp_path):
    pool, started, starting = _pool_with_one_started(tmp_path, pending=2)
    assert not pool._kept_for_starting_workers(started)     # one of two: its own share
    started.outstanding = [0]
    pool.pending = [1]
    assert pool._kept_for_starting_workers(started)         # the other's share: kept
    starting.retired = "it cannot start an interpreter"
    assert not pool._kept_for_starting_workers(started)     # nobody left to keep it for


def test_an_idle_worker_takes_the_kept_tasks_after_a_while(tmp_path):
    """A worker that never starts (a hung driver) must not hold the run: after START_WAIT_S an
    idle worker takes its share."""
    pool, started, _ = _pool_with_one_started(tmp_path, pending=1)
    assert pool._kept_for_starting_workers(started)
    started.idle_since = time.monotonic() - START_WAIT_S - 1
    assert not pool._kept_for_starting_workers(started)


# -- a pipe hears how the run goes ----------------------------------------------------------------
def test_a_pipe_gets_progress_lines_before_the_run_ends(tmp_path):
    """stderr a pipe, one task hanging (batch_faults): the other task's line arrives while the
    run is still going. Before, a pipe heard nothing until the end."""
    write_arrays(tmp_path / "in", 4, (1, FEATURES), seed=2)
    model = tmp_path / "m.tflite"
    model.write_bytes(relu_model())
    script = textwrap.dedent(f"""
        from tflite_taichi import batch
        batch.run({str(model)!r}, [{str(tmp_path / 'in')!r}], {str(tmp_path / 'out')!r},
                  backend="reference", workers=2, fmt="npz", progress=True, imports={FAULTS!r})
    """)
    env = with_tests_on_path({**os.environ, FAULT_ENV: "hang:a03.npy:"})
    proc = subprocess.Popen([sys.executable, "-c", script], stderr=subprocess.PIPE,
                            stdout=subprocess.DEVNULL, env=env, start_new_session=True)
    lines = []
    try:
        lines = _lines_until(proc, "inputs done", PIPE_WAIT_S)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)     # the run, and its workers (one of them hangs)
        proc.wait()
    assert lines[0] == "batch: 4 input(s); starting 2 worker(s) on reference...", lines
    assert lines[-1].startswith("batch: 2 of 4 inputs done in "), lines
    assert "worker 0: " in lines[-1] and "worker 1: " in lines[-1], lines


def test_the_command_line_in_a_pipe_prints_progress_lines(tmp_path):
    """`tflite-taichi batch` with stderr a pipe (a script, CI's log): the same lines as
    batch.run(progress=True), not silence until the summary."""
    write_arrays(tmp_path / "in", 4, (1, FEATURES), seed=3)
    model = tmp_path / "m.tflite"
    model.write_bytes(relu_model())
    proc = subprocess.run([sys.executable, "-m", "tflite_taichi", "batch", str(model),
                           str(tmp_path / "in"), "--out", str(tmp_path / "out"), "--backend",
                           "reference", "--workers", "2", "--format", "npz"],
                          capture_output=True, text=True, timeout=PIPE_WAIT_S)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stderr.splitlines()
    assert "batch: 4 input(s); starting 2 worker(s) on reference..." in lines, lines
    assert any(line.startswith("batch: 4 of 4 inputs done in ") for line in lines), lines


def _lines_until(proc, text: str, seconds: float) -> list:
    """proc's stderr lines, read as they come, up to the first holding `text`; fails after
    `seconds` or at the end of the stream without one."""
    selector = selectors.DefaultSelector()
    selector.register(proc.stderr, selectors.EVENT_READ)
    deadline, buffer, lines = time.monotonic() + seconds, b"", []
    while time.monotonic() < deadline:
        if not selector.select(timeout=1.0):
            continue
        chunk = os.read(proc.stderr.fileno(), 65536)
        if not chunk:
            break
        buffer += chunk
        *done, buffer = buffer.split(b"\n")
        lines += [line.decode() for line in done]
        if any(text in line for line in lines):
            return lines
    pytest.fail(f"no line with {text!r} on stderr before the run ended or {seconds} s: {lines}")


# -- batching found on the driver; plain numbers --------------------------------------------------
def test_a_model_that_cannot_run_batches_says_so_in_plain_numbers(tmp_path):
    """numpy 2's scalars print as np.int32(1): the shapes in the note are Python ints."""
    model = relu_model(reshape_to=[1, -1])
    reader = Interpreter(model_content=model, backend="reference")
    note = probe_batching(reader, input_spec(reader), output_info(reader), 8)
    assert note == ("one item per invoke: with batch 8 the outputs' shapes are [[1, 32]], "
                    "not batch-first")


def test_workers_build_no_batch_a_model_cannot_run(tmp_path, monkeypatch):
    """The driver's note reaches the worker, which then prepares its interpreter once, for one
    item (on cpu each preparation loads every kernel's machine code: seconds), not first for a
    batch it would not run."""
    model = relu_model(reshape_to=[1, -1])
    reader = Interpreter(model_content=model, backend="reference")
    note = probe_batching(reader, input_spec(reader), output_info(reader), 8)
    allocations = []
    real = Interpreter.allocate_tensors
    monkeypatch.setattr(Interpreter, "allocate_tensors",
                        lambda self: (allocations.append(1), real(self))[1])
    runner = BatchRunner(_config(model, tmp_path, note=note))
    assert runner.group == 1 and runner.describe()["batching"] == note
    assert len(allocations) == 1


def test_a_model_that_runs_batches_is_left_to_the_workers(tmp_path):
    reader = Interpreter(model_content=relu_model(), backend="reference")
    assert probe_batching(reader, input_spec(reader), output_info(reader), 8) is None


# -- float64 array files --------------------------------------------------------------------------
@pytest.mark.parametrize("suffix", [".npy", ".npz"])
def test_float64_array_files_are_refused_naming_the_fix_and_the_file(tmp_path, suffix):
    """As `run` refuses them: float64 into a float32 input would lose precision unsaid."""
    spec = input_spec(Interpreter(model_content=relu_model(), backend="reference"))
    path = str(tmp_path / f"doubles{suffix}")
    value = np.arange(FEATURES, dtype=np.float64)
    if suffix == ".npy":
        np.save(path, value)
    else:
        np.savez(path, x=value)
    with open(path, "rb") as f, pytest.raises(ItemError) as caught:
        decode(spec, path, f.read())
    assert f"in {path} is float64; input 'x' is float32" in str(caught.value)
    assert "array.astype(np.float32)" in str(caught.value)


def test_a_table_of_python_floats_still_feeds_a_float32_input(tmp_path):
    """A table's numbers reach the decoder as Python floats whatever the column held."""
    spec = input_spec(Interpreter(model_content=relu_model(), backend="reference"))
    (value,) = decode(spec, "t.parquet#0", {"x": [0.5, 1.0, 2.0, 3.0]})
    assert value.dtype == np.float32 and value.tolist() == [0.5, 1.0, 2.0, 3.0]


# -- --format's help ------------------------------------------------------------------------------
def test_format_help_says_the_npz_files_are_parts():
    """It said "one .npz per input"; a run writes part files, each a task's inputs stacked
    (one file per input would be 10,000 files for 10,000 inputs, and the part is the unit that
    appears whole, is rewritten on a retry and is kept by --resume)."""
    commands = next(a for a in build_parser()._actions
                    if isinstance(a, argparse._SubParsersAction)).choices
    fmt = next(a for a in commands["batch"]._actions if "--format" in a.option_strings)
    assert "per input" not in fmt.help and "part files" in fmt.help, fmt.help
