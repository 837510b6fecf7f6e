"""The command line: demo, run, inspect (in-process through cli.main, plus one real subprocess)."""
import os
import subprocess
import sys

import numpy as np
import pytest

from tflite_taichi.cli import main
from tflite_taichi.demo import build_demo_model


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
    delegated = int(out.split("delegated=")[1].split()[0])
    # on a GPU every op is delegated; without one, auto leaves what numpy runs faster on numpy
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
    assert main(["inspect", demo_path, "--tensors"]) == 0
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
    assert main(["inspect", os.path.join(shared_models, "mobilenet_v1_int8.tflite")]) == 0
    out = capsys.readouterr().out
    assert "kind: full-integer int8; runs as a float view" in out
    assert "serving_default_keras_tensor:0 [1, 224, 224, 3] int8 scale=0.00784313 zero_point=-1  [runtime]" in out
    assert "int8 per-channel along dim 0: 1000 scales" in out          # the classifier's weights
    lines = [l for l in out.splitlines() if l.endswith("[runtime]") or l.endswith("[constant]")]
    assert len(lines) >= 28 * 2 and all("scale" in l for l in lines)    # every quantized tensor


def test_readme_op_table_lists_every_registered_op():
    from tflite_taichi.ops import REGISTRY
    readme = open(os.path.join(os.path.dirname(__file__), "..", "README.md")).read()
    table = readme.split("## Ops", 1)[1].split("## Real models", 1)[0]
    import re
    ours = [name for name, opdef in REGISTRY.items()        # not the ops tests register
            if opdef.reference.__module__.startswith("tflite_taichi.ops")]
    missing = [name for name in ours if not re.search(rf"(?<![A-Z0-9_]){re.escape(name)}(?![A-Z0-9_])", table)]
    assert not missing, f"README's op table misses {missing}"
