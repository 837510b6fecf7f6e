"""The command line: demo, run, inspect (in-process through cli.main, plus one real subprocess)."""
import argparse
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from tflite_taichi.cli import main
from tflite_taichi.tools.demo import build_demo_model


@pytest.fixture
def demo_path(tmp_path):
    path = tmp_path / "demo.tflite"
    path.write_bytes(build_demo_model())
    return str(path)


def test_demo_runs_on_the_best_backend_and_matches_reference_and_litert(tmp_path):
    """In a subprocess: the demo initialises a Taichi backend (auto), one arch per process."""
    pytest.importorskip("ai_edge_litert")
    result = subprocess.run([sys.executable, "-m", "tflite_taichi", "demo", "--runs", "2"],
                            capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "auto -> " in out, out
    backend = out.split("auto -> ")[1].split()[0]
    if backend == "litert":     # no hardware GPU, LiteRT installed: every op on its CPU kernels
        assert "summary: backend=litert ops=8 (every op on LiteRT's CPU kernels" in out, out
    else:
        delegated = int(out.split("delegated=")[1].split()[0])
        # on a GPU every op is delegated; without LiteRT and a GPU, auto leaves what numpy runs
        # faster on numpy
        assert delegated == 8 if backend != "cpu" else 1 <= delegated < 8, out
    for label in ("max |auto - reference| = ", "max |reference - LiteRT| = "):
        diff = float(out.split(label)[1].split()[0])
        assert diff < 1e-5 * 1.0, (label, out)     # probabilities: largest magnitude <= 1


def test_run_with_given_inputs_writes_outputs(demo_path, tmp_path, capsys):
    x = np.random.default_rng(3).uniform(0, 1, (1, 96, 96, 3)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    out_file = tmp_path / "out.npz"
    assert main(["run", demo_path, "--backend", "reference", "--input", f"image={tmp_path / 'x.npy'}",
                 "--output", str(out_file), "--runs", "3"]) == 0
    printed = capsys.readouterr().out
    assert "probabilities [1, 10] float32" in printed and "median" in printed
    probs = np.load(out_file)["probabilities"]
    assert probs.shape == (1, 10) and abs(float(probs.sum()) - 1) < 1e-5


def test_run_reports_model_errors_without_a_traceback(tmp_path, capsys):
    bad = tmp_path / "bad.tflite"
    bad.write_bytes(b"\x00" * 40)
    assert main(["run", str(bad)]) == 2
    assert "ModelError" in capsys.readouterr().err


def test_inspect_lists_io_ops_and_support(demo_path, capsys):
    assert main(["inspect", demo_path, "--ops", "--tensors"]) == 0
    out = capsys.readouterr().out
    assert "input  image [1, 96, 96, 3] float32" in out
    assert "CONV_2D x2" in out and "delegate yes" in out
    assert "signature serving_default" in out


def test_console_script_entry_point(demo_path, tmp_path):
    result = subprocess.run([sys.executable, "-m", "tflite_taichi", "run", demo_path, "--backend", "reference"],
                            capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "probabilities" in result.stdout


SHARED = ["face_detection_short_range", "hand_landmark_lite", "iris_landmark", "mobilenet_v1_fp32",
          "mobilenet_v1_int8", "selfie_segmentation", "okay_nabu"]
NOT_YET = {}          # model name -> an op `run` must name as missing


@pytest.mark.models
@pytest.mark.parametrize("name", SHARED)
def test_run_on_every_shared_model(shared_models, name, capsys):
    """`run` works on every shared model it supports, and names the missing ops of the others."""
    code = main(["run", os.path.join(shared_models, f"{name}.tflite"), "--backend", "reference"])
    captured = capsys.readouterr()
    if name in NOT_YET:
        assert code == 2 and "UnsupportedOpError" in captured.err and NOT_YET[name] in captured.err
    else:
        assert code == 0 and "invoke: first" in captured.out


@pytest.mark.models
def test_inspect_shows_each_tensors_quantization_and_the_float_view(shared_models, capsys):
    assert main(["inspect", os.path.join(shared_models, "mobilenet_v1_int8.tflite"), "--tensors"]) == 0
    out = capsys.readouterr().out
    assert "kind: full-integer int8; runs as a float view" in out
    assert "serving_default_keras_tensor:0 [1, 224, 224, 3] int8 scale=0.00784313 zero_point=-1  [runtime]" in out
    assert "int8 per-channel along dim 0: 1000 scales" in out          # the classifier's weights
    lines = [l for l in out.splitlines() if l.endswith("[runtime]") or l.endswith("[constant]")]
    int8 = [l for l in lines if "] int8 " in l]
    assert len(int8) >= 28 * 2 and all("scale" in l for l in int8)     # every quantized tensor


def test_readme_op_table_lists_every_registered_op():
    from tflite_taichi.ops import load_all
    REGISTRY = load_all()
    ops_md = open(os.path.join(os.path.dirname(__file__), "..", "docs", "ops.md")).read()
    table = ops_md.split("# Ops", 1)[1]          # the op table and the notes (moved from README's "## Ops")
    import re
    ours = [name for name, opdef in REGISTRY.items()        # not the ops tests register
            if opdef.reference.__module__.startswith("tflite_taichi.ops")]
    missing = [name for name in ours if not re.search(rf"(?<![A-Z0-9_]){re.escape(name)}(?![A-Z0-9_])", table)]
    assert not missing, f"docs/ops.md's op table misses {missing}"


# -- errors on the command line, in the user's terms ----------------------------------------------
def _signature_model(path):
    """A one-op model whose input tensor is named as the TF converter names it, and its
    signature input as Keras does (`keras_tensor`)."""
    from tflite_taichi.builder import ModelBuilder
    b = ModelBuilder()
    g = b.subgraph("main")
    x = g.input("serving_default_keras_tensor:0", (1, 4))
    y = g.tensor("StatefulPartitionedCall:0", (1, 4))
    g.op("RELU", [x], [y])
    g.output(y)
    b.signature("serving_default", 0, {"keras_tensor": x}, {"output_0": y})
    path.write_bytes(b.finish())
    return str(path)


def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    return err.strip()


def test_run_names_a_missing_input_file_in_one_line(demo_path, tmp_path, capsys):
    missing = tmp_path / "missing.npy"
    assert main(["run", demo_path, "--backend", "reference", "--input", f"image={missing}"]) == 2
    err = _one_line_error(capsys)
    assert err.startswith("tflite-taichi run: error: --input image: no such file") and str(missing) in err


@pytest.mark.parametrize("content, says", [(b"x = 1\n", "is not a .npy file"),
                                           (b"", "is not a .npy file"),
                                           ("npz", "is a .npz archive"),
                                           ("truncated", "is not a readable .npy file")])
def test_run_refuses_an_input_file_that_is_not_npy_in_one_line(demo_path, tmp_path, capsys,
                                                               content, says):
    path = tmp_path / "x.npy"
    if content == "npz":
        np.savez(tmp_path / "x.npz", image=np.zeros((1, 96, 96, 3), np.float32))
        path = tmp_path / "x.npz"
    elif content == "truncated":
        np.save(path, np.zeros((1, 96, 96, 3), np.float32))
        path.write_bytes(path.read_bytes()[:200])
    else:
        path.write_bytes(content)
    assert main(["run", demo_path, "--backend", "reference", "--input", f"image={path}"]) == 2
    err = _one_line_error(capsys)
    assert f"--input image: {path} {says}" in err, err


def test_run_takes_signature_input_names_and_tensor_names(tmp_path, capsys):
    model = _signature_model(tmp_path / "sig.tflite")
    x = np.array([[-1, 2, -3, 4]], np.float32)
    np.save(tmp_path / "x.npy", x)
    for name in ("keras_tensor", "serving_default_keras_tensor:0"):
        out = tmp_path / f"{name.replace(':', '_')}.npz"
        assert main(["run", model, "--backend", "reference", "--input", f"{name}={tmp_path / 'x.npy'}",
                     "--output", str(out)]) == 0, capsys.readouterr().err
        np.testing.assert_array_equal(np.load(out)["StatefulPartitionedCall:0"], np.maximum(x, 0))
    capsys.readouterr()
    assert main(["run", model, "--backend", "reference", "--input", f"keras={tmp_path / 'x.npy'}"]) == 2
    err = _one_line_error(capsys)
    assert "no input named 'keras'" in err and "'keras_tensor'" in err, err
    assert main(["run", model, "--backend", "reference", "--input", f"keras_tensor={tmp_path / 'x.npy'}",
                 "--input", f"serving_default_keras_tensor:0={tmp_path / 'x.npy'}"]) == 2
    assert "name the same input" in _one_line_error(capsys)


@pytest.mark.parametrize("runs", ["0", "-3"])
def test_run_refuses_runs_below_one(demo_path, capsys, runs):
    with pytest.raises(SystemExit) as exit_:
        main(["run", demo_path, "--backend", "reference", "--runs", runs])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1] == f"tflite-taichi run: error: argument --runs: must be at least 1, got {runs}"


def test_top_level_help_names_every_subcommand(capsys):
    from tflite_taichi.cli import build_parser
    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    assert {"run", "inspect", "demo", "bench"} <= set(commands)
    with pytest.raises(SystemExit):
        main(["--help"])
    described = [line for line in capsys.readouterr().out.splitlines() if line.startswith("tflite-taichi: ")]
    assert described == ["tflite-taichi: " + " | ".join(commands)], described


# -- progress while kernels compile --------------------------------------------------------------
# Each in a subprocess (Taichi is one arch per process) with a cache folder of its own, so that
# every kernel compiles (a warm cache compiles nothing and reports nothing); one kernel per op
# step (TFLITE_TAICHI_CHUNK_STEPS=1), so that there are several to count.
def _python(args, folder, **env) -> subprocess.CompletedProcess:
    folder.mkdir()
    env = {**os.environ, "TFLITE_TAICHI_CACHE_DIR": str(folder / "kernels"),
           "TFLITE_TAICHI_CHUNK_STEPS": "1", **env}
    result = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=600,
                            cwd=folder, env=env)
    assert result.returncode == 0, result.stderr
    return result


_PROGRESS_SCRIPT = """
import json
from tflite_taichi import Interpreter
from tflite_taichi.delegate import compile_progress
cold, warm = [], []
with compile_progress(lambda done, total: cold.append([done, total])):
    it = Interpreter(model_path={path!r}, backend="cpu")
    it.allocate_tensors()
with compile_progress(lambda done, total: warm.append([done, total])):
    Interpreter(model_path={path!r}, backend="cpu").allocate_tensors()
runtime = it.summary()["runtime"]
print(json.dumps({{"cold": cold, "warm": warm, "kernels": runtime["launches_per_invoke"],
                  "device": runtime["device"]}}))
"""


@pytest.mark.parametrize("runtime", ["capi", "python"])
def test_compile_progress_reports_each_kernel_once_and_nothing_when_warm(demo_path, tmp_path, runtime):
    import json
    env = {"TFLITE_TAICHI_RUNTIME": "python"} if runtime == "python" else {}
    out = _python(["-c", _PROGRESS_SCRIPT.format(path=demo_path)], tmp_path / "run", **env)
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    n = seen["kernels"]
    assert seen["device"] == runtime and n > 1, seen
    assert seen["cold"] == [[i, n] for i in range(n + 1)], seen
    # a warm cache compiles nothing; the Python runtime compiles in every interpreter
    assert seen["warm"] == ([] if runtime == "capi" else seen["cold"]), seen


_TERMINAL_SCRIPT = """
import io, json, sys
from tflite_taichi import Interpreter, cli

class Terminal(io.StringIO):
    def isatty(self):
        return True

sys.stderr = terminal = Terminal()
code = cli.main(["run", {path!r}, "--backend", "cpu"])
sys.stderr = sys.__stderr__
kernels = Interpreter(model_path={path!r}, backend="cpu").summary()["runtime"]["launches_per_invoke"]
print(json.dumps({{"code": code, "terminal": terminal.getvalue(), "kernels": kernels}}))
"""


def test_run_draws_a_bar_of_kernels_compiled_on_a_terminal_and_two_lines_in_a_pipe(demo_path, tmp_path):
    import json
    out = _python(["-c", _TERMINAL_SCRIPT.format(path=demo_path)], tmp_path / "tty")
    shown = json.loads(out.stdout.strip().splitlines()[-1])
    n = shown["kernels"]
    assert shown["code"] == 0 and n > 1, shown
    bars = [line for line in shown["terminal"].replace("\r", "\n").splitlines()
            if line.startswith("compiling kernels")]
    assert bars and bars[-1].split("|")[-1].split()[0] == f"{n}/{n}", (bars, n)
    # stderr a pipe (a cold cache too): no bar, a line when compiling starts and one at its end
    piped = _python(["-m", "tflite_taichi", "run", demo_path, "--backend", "cpu"], tmp_path / "pipe")
    assert "\r" not in piped.stderr and "compiling kernels" not in piped.stderr, piped.stderr
    lines = [line for line in piped.stderr.splitlines() if "compil" in line]
    assert len(lines) == 2 and lines[0].startswith("tflite-taichi: compiling ") \
        and lines[1].startswith("tflite-taichi: compiled "), piped.stderr


# -- Taichi's warnings about our unrolling -------------------------------------------------------
_UNROLL_SCRIPT = """
import warnings
import numpy as np
from tflite_taichi import Interpreter
from tflite_taichi.builder import ModelBuilder
from tflite_taichi.partition import DelegateWarning

b = ModelBuilder()
g = b.subgraph("main")
x = g.input("x", (1, 8))
y = g.tensor("y", (1, 8))
g.op("ADD_N", [x] * 40, [y])            # ADD_N's step unrolls its 40 inputs
h = y
for i in range(40):                     # a chain of 40 steps, in one kernel below
    out = g.tensor(f"h{{i}}", (1, 8))
    g.op("ABS" if i % 2 else "NEG", [h], [out])
    h = out
g.output(h)
with warnings.catch_warnings(record=True) as seen:
    warnings.simplefilter("always")
    warnings.simplefilter("ignore", DelegateWarning)
    it = Interpreter(model_content=b.finish(), backend="cpu", cache_dir=False)
    it.allocate_tensors()
    it.set_tensor(it.get_input_details()[0]["index"], np.ones((1, 8), np.float32))
    it.invoke()
assert it.summary()["ops_delegated"] == 41, it.summary()
print(it.get_tensor(it.get_output_details()[0]["index"]).tolist())
for w in seen:
    if issubclass(w.category, SyntaxWarning):
        print("WARNING", w.category.__name__, w.filename, w.lineno, str(w.message).split(chr(10))[0])
"""


@pytest.mark.parametrize("runtime", ["capi", "python"])
def test_kernels_that_unroll_more_than_32_steps_compile_without_taichis_syntax_warning(tmp_path, runtime):
    env = {"TFLITE_TAICHI_CHUNK_STEPS": "64", "TFLITE_TAICHI_FUSION": "none",
           **({"TFLITE_TAICHI_RUNTIME": "python"} if runtime == "python" else {})}
    out = _python(["-W", "always::SyntaxWarning", "-c", _UNROLL_SCRIPT], tmp_path / "run", **env)
    assert str([[40.0] * 8]) in out.stdout.splitlines(), out.stdout
    assert "WARNING" not in out.stdout and "SyntaxWarning" not in out.stderr, out.stdout + out.stderr


def test_run_reports_what_getting_ready_cost_cold_then_warm(demo_path, tmp_path):
    """`run` prints its start beside the invoke time: where the kernels were compiled (cold), or
    that they came from the cache (warm, the next process)."""
    env = {**os.environ, "TFLITE_TAICHI_CACHE_DIR": str(tmp_path / "cache"),
           "ENABLE_TAICHI_HEADER_PRINT": "False"}
    lines = []
    for _ in range(2):
        result = subprocess.run([sys.executable, "-m", "tflite_taichi", "run", demo_path, "--backend", "cpu"],
                                capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
        assert result.returncode == 0, result.stderr
        lines.append([l for l in result.stdout.splitlines() if l.strip().startswith("start:")])
    cold, warm = lines
    assert len(cold) == 1 and "kernels compiled in 1 worker process" in cold[0], cold
    assert len(warm) == 1 and "(kernels loaded from the cache)" in warm[0], warm
    assert re.search(r"construct \d+\.\d\d s, allocate_tensors \d+\.\d\d s", warm[0])
