"""tflite-taichi batch's output folder and names, and a run killed mid-way (issue 26, items 2, 5
and 6): --overwrite removes only what a run of ours wrote, an --out that holds an input is
refused, a killed driver takes its workers with it and --resume finishes the run with every
input once, and outputs whose names collide (with numpy's savez keywords, with `path`, with each
other) are all written, under the names _outputs.json records."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tflite_taichi import batch
from tflite_taichi.builder import ModelBuilder
from tflite_taichi.errors import BatchError
from cases.batch import write_arrays

pytest.importorskip("pyarrow", reason="the batch tests need pyarrow (the test extra)")

FEATURES = 4
# tensor names as a model may have them, and the names they are stored under
COLLIDING = ["file", "allow_pickle", "y", "y", "path", ""]
STORED = ["file", "allow_pickle", "y", "y#3", "path#4", "#5"]


def colliding_model(names=COLLIDING) -> bytes:
    """x [1, 4] (batch resizable) -> one output per name: x * (i + 1)."""
    mb = ModelBuilder()
    sg = mb.subgraph()
    x = sg.input("x", [1, FEATURES], shape_signature=[-1, FEATURES])
    outputs = []
    for i, name in enumerate(names):
        y = sg.tensor(name, [1, FEATURES])
        sg.op("MUL", [x, sg.const(f"c{i}", np.full([FEATURES], i + 1, np.float32))], [y])
        outputs.append(y)
    sg.output(*outputs)
    return mb.finish()


# -- item 6: output names that collide -------------------------------------------------------
def test_the_stored_names_are_unique_and_documented_by_the_rule():
    from tflite_taichi.batch.outputs import output_columns
    assert output_columns(COLLIDING, reserved=("path",)) == STORED
    assert output_columns(["a", "a", "a#1"]) == ["a", "a#1", "a#1#2"]


@pytest.mark.parametrize("fmt", ["npz", "parquet"])
def test_batch_writes_every_output_whatever_its_name(tmp_path, fmt):
    arrays = write_arrays(tmp_path / "in", 5, (FEATURES,), width=3)
    out = str(tmp_path / "out")
    result = batch.run(colliding_model(), [str(tmp_path / "in")], out, backend="reference",
                       batch_size=2, fmt=fmt)
    assert result.written == 5 and result.errors == 0
    found = batch.read_outputs(out)
    assert sorted(found) == sorted(arrays)
    for key, x in arrays.items():
        assert sorted(found[key]) == sorted(STORED)
        for i, column in enumerate(STORED):
            np.testing.assert_array_equal(found[key][column], x * (i + 1))
    with open(os.path.join(out, "_outputs.json")) as f:
        outputs = json.load(f)["outputs"]
    assert [(o["name"], o["column"]) for o in outputs] == list(zip(COLLIDING, STORED))


def test_run_output_writes_every_output_whatever_its_name(tmp_path):
    model = tmp_path / "m.tflite"
    model.write_bytes(colliding_model())
    x = np.arange(FEATURES, dtype=np.float32)[None]
    np.save(tmp_path / "x.npy", x)
    out = tmp_path / "o.npz"
    proc = subprocess.run([sys.executable, "-m", "tflite_taichi", "run", str(model), "--backend",
                           "reference", "--input", f"x={tmp_path / 'x.npy'}", "--output", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    stored = STORED[:4] + ["path", "#5"]        # `path` is reserved in batch outputs only
    with np.load(out, allow_pickle=False) as archive:
        assert sorted(archive.files) == sorted(stored)
        for i, name in enumerate(stored):
            np.testing.assert_array_equal(archive[name], x * (i + 1))
    assert "'y#3'" in proc.stdout


# -- item 2: --overwrite removes only what a run of ours wrote ---------------------------------
def test_overwrite_keeps_the_users_files(tmp_path):
    arrays = write_arrays(tmp_path / "in", 5, (FEATURES,), width=3)
    out = tmp_path / "out"
    model = colliding_model(["y"])
    batch.run(model, [str(tmp_path / "in")], str(out), backend="reference", fmt="npz")
    np.savez(out / "results.npz", path=np.array(["mine"]), y=np.zeros(3))
    (out / "labels.parquet").write_bytes(b"a user's table")
    (out / "train.parquet").mkdir()
    (out / "train.parquet" / "part-0.parquet").write_bytes(b"a user's dataset")
    (out / "_errors").mkdir()
    (out / "_errors" / "notes.jsonl").write_text("a user's notes\n")
    mine = sorted(p.relative_to(out) for p in out.rglob("*")
                  if not p.name.startswith(("part-", "errors.jsonl", "_outputs.json", ".")))
    for fmt in ("npz", "parquet"):       # and again in the other format
        result = batch.run(model, [str(tmp_path / "in")], str(out), backend="reference",
                           fmt=fmt, overwrite=True)
        assert result.written == 5 and result.errors == 0
        assert sorted(p.relative_to(out) for p in out.rglob("*")
                      if not p.name.startswith(("part-", "errors.jsonl", "_outputs.json", "."))) == mine
        found = batch.read_outputs(str(out))           # the user's files are not read as parts
        assert sorted(found) == sorted(arrays)
        assert all(p.name.endswith("." + fmt) for p in out.glob("part-*"))
    assert (out / "train.parquet" / "part-0.parquet").read_bytes() == b"a user's dataset"


def test_an_out_that_is_or_holds_an_input_is_refused(tmp_path):
    folder = tmp_path / "in"
    folder.mkdir()
    for i in range(3):
        np.savez(folder / f"x{i}.npz", x=np.ones(FEATURES, np.float32))
    before = sorted(os.listdir(folder))
    model = colliding_model(["y"])
    with pytest.raises(BatchError, match="is the input"):
        batch.run(model, [str(folder)], str(folder), backend="reference", fmt="npz",
                  overwrite=True)
    with pytest.raises(BatchError, match="holds the input"):
        batch.run(model, [str(folder / "x0.npz")], str(tmp_path), backend="reference",
                  overwrite=True)
    assert sorted(os.listdir(folder)) == before
    proc = subprocess.run([sys.executable, "-m", "tflite_taichi", "batch", "-", str(folder),
                           "--out", str(folder), "--overwrite"], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2 and "is the input" in proc.stderr
    assert sorted(os.listdir(folder)) == before


# -- item 5: a killed driver, its workers, the lock and --resume --------------------------------
CRASH_INPUTS = 200


def _children(pid: int) -> list:
    """The pids of `pid`'s worker processes (multiprocessing's spawned children)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read()
        except (OSError, IndexError, ValueError):
            continue
        if ppid == pid and b"spawn_main" in cmdline:
            found.append(int(entry))
    return found


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _wait(condition, seconds, what):
    import time
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def _crash_a_run(tmp_path, model, folder, out):
    """Start `batch` on `folder` (the last input's task hangs its worker), wait until every
    other task's part is written, check a second run is locked out, SIGKILL the driver and check
    that its workers die with it."""
    from batch_faults import FAULT_ENV, with_tests_on_path
    marker = tmp_path / f"hung-{os.path.basename(out)}"
    env = with_tests_on_path(dict(os.environ, **{FAULT_ENV: f"hang:zz_last.npy:{marker}"}))
    workers = []
    driver = subprocess.Popen([sys.executable, "-m", "tflite_taichi", "batch", model, folder,
                               "--out", out, "--backend", "reference", "--batch", "4",
                               "--workers", "2", "--import", "batch_faults"], env=env,
                              stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        tasks = CRASH_INPUTS // 32       # the complete tasks of 32: the last one holds zz_last
        _wait(lambda: marker.exists() and len([n for n in os.listdir(out)
                                                if n.startswith("part-")]) == tasks, 120,
              "the run to hang on its last task")
        workers = _children(driver.pid)
        assert len(workers) == 2
        parts = sorted(os.listdir(out))
        with pytest.raises(BatchError, match="in use by another batch run"):
            batch.run(model, [folder], out, backend="reference", overwrite=True)
        assert sorted(os.listdir(out)) == parts       # the second run removed nothing
        driver.kill()
        driver.wait()
        _wait(lambda: not any(_alive(pid) for pid in workers), 10, "the workers to die")
    finally:
        driver.kill()
        driver.wait()
        for pid in filter(_alive, workers):     # a failing run's: not left sleeping an hour
            os.kill(pid, 9)


def test_a_killed_driver_takes_its_workers_and_resume_finishes_its_run(tmp_path):
    model = str(tmp_path / "m.tflite")
    with open(model, "wb") as f:
        f.write(colliding_model(["y"]))
    arrays = write_arrays(tmp_path / "in", CRASH_INPUTS, (FEATURES,), width=3)
    np.save(tmp_path / "in" / "zz_last.npy", np.ones(FEATURES, np.float32))
    arrays[str(tmp_path / "in" / "zz_last.npy")] = np.ones(FEATURES, np.float32)
    folder = str(tmp_path / "in")
    for how in (["--resume"], ["--overwrite"]):
        out = str(tmp_path / f"out{how[0]}")
        _crash_a_run(tmp_path, model, folder, out)
        # another --batch: other tasks than the killed run's; each input is still written once
        proc = subprocess.run([sys.executable, "-m", "tflite_taichi", "batch", model, folder,
                               "--out", out, "--backend", "reference", "--batch", "64",
                               "--workers", "2", *how], capture_output=True, text=True,
                              timeout=300)
        assert proc.returncode == 0, proc.stderr
        n = CRASH_INPUTS + 1
        assert f"{n} of {n} inputs written" in proc.stdout
        if how == ["--resume"]:
            assert f"resumed: {CRASH_INPUTS // 32 * 32} input(s)" in proc.stdout
        found = batch.read_outputs(out)                 # raises on an input written twice
        assert sorted(found) == sorted(arrays)
        for key, x in arrays.items():
            np.testing.assert_array_equal(found[key]["y"], x)
        assert batch.read_errors(out) == []


def test_resume_refuses_another_model_and_both_flags(tmp_path):
    write_arrays(tmp_path / "in", 3, (FEATURES,), width=3)
    out = str(tmp_path / "out")
    batch.run(colliding_model(["y"]), [str(tmp_path / "in")], out, backend="reference")
    with pytest.raises(BatchError, match="another model"):
        batch.run(colliding_model(["y", "z"]), [str(tmp_path / "in")], out, backend="reference",
                  resume=True)
    with pytest.raises(BatchError, match="choose one"):
        batch.run(colliding_model(["y"]), [str(tmp_path / "in")], out, backend="reference",
                  resume=True, overwrite=True)
    result = batch.run(colliding_model(["y"]), [str(tmp_path / "in")], out, backend="reference",
                       resume=True)                   # a finished run: nothing is run again
    assert result.resumed == 3 and result.written == 3
    assert len(batch.read_outputs(out)) == 3


def test_resume_runs_again_the_inputs_of_a_torn_part(tmp_path):
    """Ray Data's writer writes in place: a part it was writing when the run died is torn."""
    arrays = write_arrays(tmp_path / "in", 3, (FEATURES,), width=3)
    out = tmp_path / "out"
    model = colliding_model(["y"])
    # one worker: the three inputs in one part (a worker per core would split a small run)
    batch.run(model, [str(tmp_path / "in")], str(out), backend="reference", workers=1)
    (part,) = out.glob("part-*.parquet")
    part.write_bytes(part.read_bytes()[:100])
    result = batch.run(model, [str(tmp_path / "in")], str(out), backend="reference", resume=True)
    assert result.resumed == 0 and result.written == 3 and not part.exists()
    assert sorted(batch.read_outputs(str(out))) == sorted(arrays)
