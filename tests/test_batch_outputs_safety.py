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
from tflite_taichi.interpreter import Interpreter

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


def write_inputs(folder, count, seed=0) -> dict:
    """`count` [4] float32 arrays in `folder`; returns {path: array}."""
    os.makedirs(folder, exist_ok=True)
    rng = np.random.default_rng(seed)
    arrays = {}
    for i in range(count):
        path = os.path.join(str(folder), f"a{i:03d}.npy")
        arrays[path] = rng.standard_normal(FEATURES).astype(np.float32)
        np.save(path, arrays[path])
    return arrays


# -- item 6: output names that collide -------------------------------------------------------
def test_the_stored_names_are_unique_and_documented_by_the_rule():
    from tflite_taichi.batch.outputs import output_columns
    assert output_columns(COLLIDING, reserved=("path",)) == STORED
    assert output_columns(["a", "a", "a#1"]) == ["a", "a#1", "a#1#2"]


@pytest.mark.parametrize("fmt", ["npz", "parquet"])
def test_batch_writes_every_output_whatever_its_name(tmp_path, fmt):
    arrays = write_inputs(tmp_path / "in", 5)
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


def test_reference_interpreter_names_match_the_model():
    """The model of these tests has the colliding names it is meant to have."""
    it = Interpreter(model_content=colliding_model(), backend="reference")
    assert [d["name"] for d in it.get_output_details()] == COLLIDING
