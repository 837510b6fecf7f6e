"""The processes we start import nothing from the folder the user runs from
(tflite_taichi/runtime/children.py): a `select.py`, `pickle.py` or `numpy.py` that someone else
left there must not run, in a compile worker (cpu, vulkan), in a batch worker or in a worker of
the Ray cluster a `batch --ray` run starts, while the user's PYTHONPATH keeps working in them.

The parent here is a script run by its path (its own folder, not the current one, is its
sys.path[0], as for the `tflite-taichi` console script): whatever a planted module does, it did in
a child of ours."""
import contextlib
import json
import os
import signal
import stat
import subprocess
import sys
import textwrap
import time
from types import SimpleNamespace

import numpy as np
import pytest

from batch_faults import FAULT_ENV, with_tests_on_path
from cases.batch import write_arrays
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


def _plant(folder) -> tuple:
    """(the folder to run from, the folder where a planted module that ran leaves its name)."""
    cwd, markers = folder / "cwd", folder / "markers"
    cwd.mkdir()
    markers.mkdir()
    for name in PLANTED:
        (cwd / f"{name}.py").write_text(textwrap.dedent(f"""\
            open({str(markers / name)!r}, "a").close()
            raise RuntimeError("the planted {name}.py in the current folder was imported")
            """))
    return cwd, markers


@pytest.fixture
def planted(tmp_path):
    return _plant(tmp_path)


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



# -- Ray -------------------------------------------------------------------------------------------
RAY_ITEMS = 12


@pytest.fixture(scope="module")
def ray_run(tmp_path_factory):
    """One `tflite-taichi batch --ray` run that starts its own Ray cluster (Ray takes 10-20 s to
    start: both Ray tests read this run), from the planted folder under Ubuntu's default umask
    002, with the inputs, --out and a PYTHONPATH entry (where the actors find --import's module)
    given relative to that folder. Returns what the checks need."""
    pytest.importorskip("ray", reason="the Ray tests need ray[data] (the ray extra; "
                        ".ci/run installs it)")
    tmp_path = tmp_path_factory.mktemp("ray-child-safety")
    cwd, markers = _plant(tmp_path)
    _, model, _ = demo_case(tmp_path, seed=8)
    arrays = write_arrays(cwd / "in", RAY_ITEMS, (96, 96, 3), seed=8)
    (cwd / "lib").mkdir()
    (cwd / "lib" / "user_ops.py").write_text("# the user's custom ops would register here\n")
    env = _env(tmp_path, RAY_AUTH_MODE="disabled",          # else a token goes into ~/.ray
               PYTHONPATH="lib")
    env.pop("RAY_ADDRESS", None)                            # a cluster of its own, started here
    command = [sys.executable, _scripts(tmp_path)["cli"], "batch", str(model), "in", "--out", "out",
               "--backend", "reference", "--ray", "--workers", "1", "--cpus-per-worker", "0.5",
               "--batch", "1", "--import", "user_ops"]

    def batch(*extra):
        return _run_watched(command + list(extra), markers, cwd=cwd, env=env, umask=0o002)

    return {"cwd": cwd, "markers": markers, "model": model, "proc": batch(), "again": batch,
            "expected": {os.path.relpath(path, cwd): x for path, x in arrays.items()}}


def _run_watched(command: list, markers, timeout: float = 400, **kwargs):
    """subprocess.run(command), but ended (its process group, where Ray's processes are too) as
    soon as a planted module leaves its marker: Ray retries a worker that fails that way for
    ever, so the run would otherwise end at the timeout only, and leave Ray's agents behind."""
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, **kwargs)
    deadline = time.monotonic() + timeout
    while True:
        try:
            stdout, stderr = proc.communicate(timeout=1)
            return subprocess.CompletedProcess(command, proc.returncode, stdout, stderr)
        except subprocess.TimeoutExpired:
            if os.listdir(markers) or time.monotonic() > deadline:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)


def _reference_outputs(model, arrays: dict) -> dict:
    from tflite_taichi import Interpreter
    it = Interpreter(model_path=str(model), backend="reference")
    it.allocate_tensors()
    inputs, output = it.get_input_details()[0]["index"], it.get_output_details()[0]
    found = {}
    for key, x in arrays.items():
        it.set_tensor(inputs, x[None])
        it.invoke()
        found[key] = it.get_tensor(output["index"])[0]
    return found


def test_ray_workers_import_nothing_from_the_current_folder(ray_run):
    """Ray's workers put the driver's current folder first on their sys.path unless Ray is
    started from elsewhere: the run's read tasks and actors would import the planted numpy.py.
    Started elsewhere, the relative inputs, --out and PYTHONPATH entry still name the same files
    and folder (the actors import user_ops through it), and the outputs' keys are the inputs'
    paths as given."""
    proc = ray_run["proc"]
    _assert_nothing_planted_ran(ray_run["markers"], proc)
    assert f"{RAY_ITEMS} of {RAY_ITEMS} inputs written" in proc.stdout, proc.stdout
    found = read_outputs(str(ray_run["cwd"] / "out"))
    expected = _reference_outputs(ray_run["model"], ray_run["expected"])
    assert sorted(found) == sorted(expected)
    for key, want in expected.items():
        assert np.array_equal(found[key]["probabilities"], want), key


def test_ray_writes_private_parts_under_a_group_writable_umask(ray_run):
    """Under umask 002 Ray Data's writer would make its part files 0664, which a --resume then
    refuses to trust: the Ray runtime a run starts writes 0600, and --resume takes the run."""
    assert ray_run["proc"].returncode == 0, ray_run["proc"].stderr[-3000:]
    out = ray_run["cwd"] / "out"
    parts = [name for name in os.listdir(out) if name.endswith(".parquet")]
    assert parts, os.listdir(out)
    for folder, _, names in os.walk(out):
        for name in names:
            mode = stat.S_IMODE(os.stat(os.path.join(folder, name)).st_mode)
            assert not mode & 0o022, f"{name} is mode {mode:04o}"
    resumed = ray_run["again"]("--resume")
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-3000:]
    assert f"{RAY_ITEMS} of {RAY_ITEMS} inputs written" in resumed.stdout, resumed.stdout
    assert sorted(n for n in os.listdir(out) if n.endswith(".parquet")) == sorted(parts)  # kept


def test_ray_actors_get_a_relative_kernel_cache_folder_as_the_user_meant_it(monkeypatch):
    """Ray's actors run in another folder (above): a relative --cache-dir, or a relative
    $TFLITE_TAICHI_CACHE_DIR, reaches them joined to the folder the user gave it from; an
    absolute default is left to each node's own."""
    from tflite_taichi.batch.ray_data import _absolute_cache_dir
    monkeypatch.setenv("TFLITE_TAICHI_CACHE_DIR", "kernels")
    assert _absolute_cache_dir(None, "/home/u/work") == "/home/u/work/kernels"
    assert _absolute_cache_dir("mine", "/home/u/work") == "/home/u/work/mine"
    monkeypatch.setenv("TFLITE_TAICHI_CACHE_DIR", "/var/cache/k")
    assert _absolute_cache_dir(None, "/home/u/work") is None
    assert _absolute_cache_dir("/srv/k", "/home/u/work") == "/srv/k"


def test_ray_workers_get_pythonpath_as_python_read_it_here(tmp_path, monkeypatch):
    """A cluster started from the private folder inherits PYTHONPATH: each entry goes absolute,
    as Python resolved it for the driver; an empty PYTHONPATH (Python adds nothing for it) must
    not become the current folder, where the planted modules are."""
    from tflite_taichi.batch.ray_data import _absolute_pythonpath
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", "")
    assert _absolute_pythonpath() == ""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(["lib", "", "/opt/ops"]))
    assert _absolute_pythonpath() == os.pathsep.join([str(tmp_path / "lib"), str(tmp_path),
                                                      "/opt/ops"])
    monkeypatch.delenv("PYTHONPATH")
    assert _absolute_pythonpath() is None


def test_ray_without_a_private_folder_to_start_from_is_a_batch_error(tmp_path, monkeypatch):
    """No folder can be made in TMPDIR: the run says so (and where) before it starts Ray."""
    ray = pytest.importorskip("ray", reason="the Ray tests need ray[data] (the ray extra; "
                              ".ci/run installs it)")
    import tempfile
    from tflite_taichi.batch.ray_data import run_ray
    from tflite_taichi.errors import BatchError
    monkeypatch.setattr(ray, "is_initialized", lambda: False)     # a run that would start Ray
    monkeypatch.setattr(ray, "init", lambda **_: pytest.fail("Ray was started"))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "gone"))
    with pytest.raises(BatchError, match=r"private folder to start Ray from in .*gone"):
        run_ray([], SimpleNamespace(out_dir=str(tmp_path)), address="", workers=1,
                gpus_per_worker=0.0, cpus_per_worker=1.0, retries=0, task_items=1,
                progress=False)
