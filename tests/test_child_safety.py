"""The processes we start import nothing from the folder the user runs from
(tflite_taichi/runtime/children.py): a `select.py`, `pickle.py` or `numpy.py` that someone else
left there must not run, in a compile worker (cpu, vulkan) or in a batch worker, while the user's
PYTHONPATH keeps working in them.

The parent here is a script run by its path (its own folder, not the current one, is its
sys.path[0], as for the `tflite-taichi` console script): whatever a planted module does, it did in
a child of ours."""
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from batch_faults import FAULT_ENV, with_tests_on_path
from cases.demo import demo_case
from tflite_taichi.batch.outputs import read_outputs

PLANTED = ("select", "pickle", "numpy")
ITEMS = 96          # three tasks of 32 (batch's TASK_ITEMS): the second worker gets one too

COMPILE = r'''
import json, sys
import numpy as np
from tflite_taichi import Interpreter
args = json.loads(sys.argv[1])
it = Interpreter(model_path=args["model"], backend=args["backend"])
it.allocate_tensors()
it.set_tensor(it.get_input_details()[0]["index"], np.load(args["input"]))
it.invoke()
print("RESULT " + json.dumps({"compiled_in": it.summary()["runtime"]["compiled_in"],
                              "y": it.get_tensor(it.get_output_details()[0]["index"]).tolist()}))
'''

CLI = "import sys\nfrom tflite_taichi.cli import main\nsys.exit(main())\n"


@pytest.fixture
def planted(tmp_path):
    """(the folder to run from, the folder where a planted module that ran leaves its name)."""
    cwd, markers = tmp_path / "cwd", tmp_path / "markers"
    cwd.mkdir()
    markers.mkdir()
    for name in PLANTED:
        (cwd / f"{name}.py").write_text(textwrap.dedent(f"""\
            open({str(markers / name)!r}, "a").close()
            raise RuntimeError("the planted {name}.py in the current folder was imported")
            """))
    return cwd, markers


def _scripts(tmp_path) -> dict:
    folder = tmp_path / "scripts"
    folder.mkdir(exist_ok=True)
    (folder / "compile.py").write_text(COMPILE)
    (folder / "cli.py").write_text(CLI)
    return {"compile": str(folder / "compile.py"), "cli": str(folder / "cli.py")}


def _env(tmp_path, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TFLITE_TAICHI_")}
    env.update({"ENABLE_TAICHI_HEADER_PRINT": "False",
                "TFLITE_TAICHI_CACHE_DIR": str(tmp_path / "cache"), **extra})
    return env


def _assert_nothing_planted_ran(markers, proc):
    ran = sorted(os.listdir(markers))
    assert not ran, f"planted modules imported by a child: {ran}\n{proc.stderr[-3000:]}"
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]


@pytest.mark.parametrize("backend", ["cpu", "vulkan"])
def test_compile_workers_import_nothing_from_the_current_folder(planted, tmp_path, backend):
    """A cold compile (a fresh cache) through two compile workers, from the planted folder."""
    cwd, markers = planted
    _, model, expected = demo_case(tmp_path, seed=5)
    args = {"model": str(model), "input": str(tmp_path / "x.npy"), "backend": backend}
    env = _env(tmp_path, TFLITE_TAICHI_COMPILE_WORKERS="2", TFLITE_TAICHI_CHUNK_STEPS="1")
    proc = subprocess.run([sys.executable, _scripts(tmp_path)["compile"], json.dumps(args)],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    _assert_nothing_planted_ran(markers, proc)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    result = json.loads(lines[-1][len("RESULT "):])
    assert result["compiled_in"] == "2 worker processes", result["compiled_in"]
    np.testing.assert_allclose(np.array(result["y"], np.float32), expected, rtol=1e-5, atol=1e-6)


def test_cli_run_cold_on_cpu_imports_nothing_from_the_current_folder(planted, tmp_path):
    cwd, markers = planted
    _, model, _ = demo_case(tmp_path, seed=6)
    proc = subprocess.run([sys.executable, _scripts(tmp_path)["cli"], "run", str(model),
                           "--backend", "cpu"], cwd=cwd, env=_env(tmp_path), capture_output=True,
                          text=True, timeout=600)
    _assert_nothing_planted_ran(markers, proc)


def test_batch_workers_import_nothing_from_the_current_folder(planted, tmp_path):
    """`tflite-taichi batch` with two workers: both start and take work (batch_faults' "together",
    which they import through the user's PYTHONPATH), and neither imports a planted module."""
    cwd, markers = planted
    _, model, _ = demo_case(tmp_path, seed=7)
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    x = np.load(tmp_path / "x.npy")
    for i in range(ITEMS):
        np.save(inputs / f"x{i:03d}.npy", x[0] + i)
    started = tmp_path / "started"
    env = with_tests_on_path(_env(tmp_path, **{FAULT_ENV: f"together:2:{started}"}))
    proc = subprocess.run([sys.executable, _scripts(tmp_path)["cli"], "batch", str(model),
                           str(inputs), "--out", str(tmp_path / "out"), "--backend", "reference",
                           "--workers", "2", "--batch", "2", "--format", "npz",
                           "--import", "batch_faults"],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    _assert_nothing_planted_ran(markers, proc)
    assert len(os.listdir(started)) == 2                    # both workers ran a batch
    assert len(read_outputs(str(tmp_path / "out"))) == ITEMS

