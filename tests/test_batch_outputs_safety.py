"""tflite-taichi batch's output folder and names, and a run killed mid-way (a
run must never destroy what it did not write): --overwrite removes only what a run of ours wrote, an --out that holds an input is
refused, a killed driver takes its workers with it and --resume finishes the run with every
input once, and outputs whose names collide (with numpy's savez keywords, with `path`, with each
other) are all written, under the names _outputs.json records."""
import json
import os
import re
import subprocess
import sys
import zipfile

import numpy as np
import pytest

from tflite_taichi import batch
from tflite_taichi.builder import ModelBuilder
from tflite_taichi.batch.outputs import TMP_PREFIX
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


# -- output names that collide ---------------------------------------------------------------
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


# -- --overwrite removes only what a run of ours wrote -----------------------------------------
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


# -- a killed driver, its workers, the lock and --resume ----------------------------------------
CRASH_INPUTS = 200


def _children(pid: int) -> list:
    """The pids of `pid`'s worker processes: its child processes (but a multiprocessing
    resource tracker, which is no worker)."""
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
        if ppid == pid and b"resource_tracker" not in cmdline:
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


# -- --out and what is in it: nothing another user could have put there is trusted --------------
OTHER_UID = 65534                        # nobody: CI runs as root, so os.chown makes "theirs"


def _cli_batch(model_path, folder, out, *flags):
    return subprocess.run([sys.executable, "-m", "tflite_taichi", "batch", str(model_path),
                           str(folder), "--out", str(out), "--backend", "reference",
                           "--workers", "1", *flags], capture_output=True, text=True, timeout=300)


def _a_run(tmp_path, fmt="npz"):
    """A finished run of three inputs (one part) into tmp_path/out: (model, arrays, out)."""
    arrays = write_arrays(tmp_path / "in", 3, (FEATURES,), width=3)
    model = colliding_model(["y"])
    out = tmp_path / "out"
    batch.run(model, [str(tmp_path / "in")], str(out), backend="reference", fmt=fmt, workers=1)
    return model, arrays, out


def test_a_link_planted_as_the_lock_is_not_followed(tmp_path):
    model, _, out = _a_run(tmp_path)
    precious = tmp_path / "precious"
    precious.write_text("a file the run must not touch\n")
    os.unlink(out / ".tflite-taichi.lock")
    os.symlink(precious, out / ".tflite-taichi.lock")
    with pytest.raises(BatchError, match="lock .*symbolic link"):
        batch.run(model, [str(tmp_path / "in")], str(out), backend="reference", fmt="npz",
                  overwrite=True)
    assert precious.read_text() == "a file the run must not touch\n"
    assert os.path.islink(out / ".tflite-taichi.lock")


def test_a_linked_errors_folder_is_neither_read_nor_emptied(tmp_path):
    model, _, out = _a_run(tmp_path)
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    records = {"0123456789abcdef0123.jsonl": '{"path": "x", "reason": "theirs"}\n',
               f"{TMP_PREFIX}x.jsonl": "a temporary of theirs\n", "notes.jsonl": "theirs\n"}
    for name, text in records.items():
        (theirs / name).write_text(text)
    os.symlink(theirs, out / "_errors")
    with pytest.raises(BatchError, match="_errors: it is a symbolic link"):
        batch.run(model, [str(tmp_path / "in")], str(out), backend="reference", fmt="npz",
                  overwrite=True)
    assert {p.name: p.read_text() for p in theirs.iterdir()} == records


@pytest.mark.parametrize("how", ["theirs", "world-writable", "their parent"])
def test_an_out_another_user_owns_or_can_write_is_refused(tmp_path, how):
    write_arrays(tmp_path / "in", 1, (FEATURES,), width=3)
    model_path = tmp_path / "m.tflite"
    model_path.write_bytes(colliding_model(["y"]))
    parent = tmp_path / "parent"
    out = parent / "out"
    out.mkdir(parents=True)
    if how == "theirs":
        os.chown(out, OTHER_UID, OTHER_UID)
        said = f"owned by uid {OTHER_UID}, not by you"
    elif how == "world-writable":
        os.chmod(out, 0o777)
        said = "is group- or world-writable (mode 0777)"
    else:
        os.chown(parent, OTHER_UID, OTHER_UID)
        said = f"its parent folder {parent} is owned by uid {OTHER_UID}"
    with pytest.raises(BatchError, match=re.escape(said)):
        batch.run(colliding_model(["y"]), [str(tmp_path / "in")], str(out), backend="reference")
    assert os.listdir(out) == []         # refused before anything was written there
    proc = _cli_batch(model_path, tmp_path / "in", out)
    assert proc.returncode == 2 and said in proc.stderr and f"--out {out}" in proc.stderr
    assert os.listdir(out) == []


@pytest.mark.parametrize("name", ["_outputs.json", ".tflite-taichi.lock", "part"])
def test_a_file_of_another_user_in_out_is_not_trusted(tmp_path, name):
    model, _, out = _a_run(tmp_path)
    if name == "part":
        (name,) = [p.name for p in out.glob("part-*")]
    os.chown(out / name, OTHER_UID, OTHER_UID)
    with pytest.raises(BatchError, match=f"owned by uid {OTHER_UID}"):
        batch.run(model, [str(tmp_path / "in")], str(out), backend="reference", fmt="npz",
                  resume=True)


def test_overwrite_removes_only_the_runs_files_of_ours(tmp_path):
    model, arrays, out = _a_run(tmp_path)
    (part,) = [p.name for p in out.glob("part-*")]
    prefix = part.split("-")[0] + "-" + part.split("-")[1]
    theirs = out / f"{prefix}-000001.npz"          # named as the run's, but another user's
    theirs.write_bytes(b"theirs")
    os.chown(theirs, OTHER_UID, OTHER_UID)
    result = batch.run(model, [str(tmp_path / "in")], str(out), backend="reference", fmt="npz",
                       overwrite=True, workers=1)
    assert result.written == 3 and theirs.read_bytes() == b"theirs"
    assert not (out / part).exists()
    assert sorted(batch.read_outputs(str(out))) == sorted(arrays)


def test_a_manifest_naming_other_prefixes_removes_nothing(tmp_path):
    model, _, out = _a_run(tmp_path)
    with open(out / "_outputs.json") as f:
        manifest = json.load(f)
    manifest["run"]["parts"] = ["results"]     # would make results-000001.npz the run's
    (out / "_outputs.json").write_text(json.dumps(manifest))
    (out / "results-000001.npz").write_bytes(b"a user's results")
    with pytest.raises(BatchError, match="does not record a run as this version writes it"):
        batch.run(model, [str(tmp_path / "in")], str(out), backend="reference", fmt="npz",
                  overwrite=True)
    assert (out / "results-000001.npz").read_bytes() == b"a user's results"


def _planted_part(out, keys, column="y", shape=(FEATURES,), dtype=np.float32, name="000099"):
    """A part under the run's prefix, in place of the run's own (as if it had not been
    written), holding `keys` with zeros."""
    (part,) = [p for p in out.glob("part-*")]
    os.unlink(part)
    from tflite_taichi.batch.outputs import save_npz
    planted = out / f"{part.name[:len('part-12345678')]}-{name}.npz"
    save_npz(str(planted), {"path": np.asarray(keys, dtype=str),
                            column: np.zeros((len(keys), *shape), dtype)})
    return planted


@pytest.mark.parametrize("plant", ["theirs", "not an input", "another output", "another shape",
                                   "twice"])
def test_a_planted_part_cannot_make_resume_skip_inputs(tmp_path, plant):
    model, arrays, out = _a_run(tmp_path)
    keys = sorted(arrays)
    planted = _planted_part(out, {
        "not an input": keys[:2] + [str(tmp_path / "in" / "ghost.npy")],
        "twice": keys[:2] + keys[:1]}.get(plant, keys),
        column="z" if plant == "another output" else "y",
        shape=(FEATURES + 1,) if plant == "another shape" else (FEATURES,))
    if plant == "theirs":
        os.chown(planted, OTHER_UID, OTHER_UID)
    said = {"theirs": f"owned by uid {OTHER_UID}", "not an input": "ghost.npy', not an input",
            "another output": re.escape("its outputs are ['z'], not ['y']"),
            "another shape": r"output 'y' is float32 \[3, 5\], not float32 \[3, 4\]",
            "twice": "twice"}[plant]
    with pytest.raises(BatchError, match=said):
        batch.run(model, [str(tmp_path / "in")], str(out), backend="reference", fmt="npz",
                  resume=True)
    assert planted.exists()


def test_resume_with_other_inputs_is_refused(tmp_path):
    model, _, out = _a_run(tmp_path)
    write_arrays(tmp_path / "more", 1, (FEATURES,), width=3)
    given = [str(tmp_path / "in"), str(tmp_path / "more")]
    with pytest.raises(BatchError, match=r"had other inputs \(\[.*'\], not \[.*more'\]\)"):
        batch.run(model, given, str(out), backend="reference", fmt="npz", resume=True)
    model_path = tmp_path / "m.tflite"
    model_path.write_bytes(model)
    proc = _cli_batch(model_path, tmp_path / "more", out, "--resume", "--format", "npz")
    assert proc.returncode == 2 and "had other inputs" in proc.stderr, proc.stderr


# -- output names: escaped in .npz members, and collisions that chain ---------------------------
NASTY = ["../up", "/abs/x", "a\\b", "50%", "%2F"]


def test_npz_member_names_are_escaped_and_read_back(tmp_path):
    from tflite_taichi.batch.outputs import npz_member, npz_name
    assert [npz_member(n) for n in NASTY] == ["..%2Fup", "%2Fabs%2Fx", "a%5Cb", "50%25", "%252F"]
    assert [npz_name(npz_member(n)) for n in NASTY] == NASTY
    arrays = write_arrays(tmp_path / "in", 2, (FEATURES,), width=3)
    out = tmp_path / "out"
    batch.run(colliding_model(NASTY), [str(tmp_path / "in")], str(out), backend="reference",
              fmt="npz", workers=1)
    (part,) = out.glob("part-*.npz")
    with zipfile.ZipFile(part) as archive:
        members = archive.namelist()
    assert sorted(members) == sorted(["path.npy"] + [npz_member(n) + ".npy" for n in NASTY])
    assert not any("/" in m or "\\" in m for m in members)
    found = batch.read_outputs(str(out))
    for key, x in arrays.items():
        assert sorted(found[key]) == sorted(NASTY)
        for i, name in enumerate(NASTY):
            np.testing.assert_array_equal(found[key][name], x * (i + 1))


@pytest.mark.parametrize("fmt", ["npz", "parquet"])
def test_names_that_collide_twice_are_all_written(tmp_path, fmt):
    arrays = write_arrays(tmp_path / "in", 3, (FEATURES,), width=3)
    out = tmp_path / "out"
    batch.run(colliding_model(["a", "a#2", "a"]), [str(tmp_path / "in")], str(out),
              backend="reference", fmt=fmt, workers=1)
    with open(out / "_outputs.json") as f:
        columns = [o["column"] for o in json.load(f)["outputs"]]
    assert len(set(columns)) == 3 and columns[:2] == ["a", "a#2"]
    found = batch.read_outputs(str(out))
    for key, x in arrays.items():
        assert sorted(found[key]) == sorted(columns)
        for i, column in enumerate(columns):
            np.testing.assert_array_equal(found[key][column], x * (i + 1))
