"""A newcomer's second hour: the command line says what it does in a line or two,
refuses what LiteRT refuses (a wrong-shaped --input), makes up inputs the model accepts, takes
--shape for inputs the model sizes at run time, says when it compiles, and explains its choices.
(LiteRT's argument order, set_tensor on outputs, num_subgraphs and _get_ops_details:
test_litert_compat.py.)"""
import argparse
import ctypes
import os
import subprocess
import sys

import numpy as np
import pytest

from tflite_taichi import batch
from tflite_taichi.builder import ModelBuilder
from tflite_taichi.cli import _device_text, build_parser, main
from tflite_taichi.tools.demo import build_demo_model
from tflite_taichi.errors import BackendUnavailable
from tflite_taichi.interpreter import Interpreter
from tflite_taichi.testing import Input, Output, model_random_inputs, one_op_model, run_litert
from cases.audio import audio_front_end
from cases.batch import write_arrays

litert = pytest.importorskip("ai_edge_litert.interpreter")


def _save(tmp_path, name: str, model: bytes) -> str:
    path = tmp_path / name
    path.write_bytes(model)
    return str(path)


def text_model(vocabulary=50, positions=8) -> bytes:
    """ids [8] int32 -> EMBEDDING_LOOKUP in a [50, 4] table; positions [2, 4] int32 ->
    RESHAPE [8] -> GATHER along the 8 rows of a [8, 4] table: both read ids that must be in
    range (LiteRT refuses the invoke otherwise)."""
    rng = np.random.default_rng(0)
    b = ModelBuilder()
    g = b.subgraph()
    ids = g.input("ids", (8,), np.int32)
    pos = g.input("positions", (2, 4), np.int32)
    emb = g.tensor("emb", (8, 4))
    g.op("EMBEDDING_LOOKUP", [ids, g.const("table", rng.standard_normal((vocabulary, 4)).astype(np.float32))], [emb])
    flat = g.tensor("flat", (8,), np.int32)
    g.op("RESHAPE", [pos, g.const("flat_shape", np.array([8], np.int32))], [flat])
    rows = g.tensor("rows", (8, 4))
    g.op("GATHER", [g.const("rows_table", rng.standard_normal((positions, 4)).astype(np.float32)), flat],
         [rows], axis=0)
    g.output(emb, rows)
    return b.finish()


# -- 1. a wrong-shaped --input is refused, as LiteRT's set_tensor refuses it ---------------------
def test_run_refuses_an_input_of_another_shape_unless_asked_to_resize(tmp_path, capsys):
    model = _save(tmp_path, "demo.tflite", build_demo_model())       # image [1, 96, 96, 3]
    np.save(tmp_path / "x.npy", np.zeros((1, 100, 100, 3), np.float32))
    args = ["run", model, "--backend", "reference", "--input", f"image={tmp_path / 'x.npy'}"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert ("--input image: [1, 100, 100, 3] does not fit input 'image', declared [1, 96, 96, 3]"
            in err and "--resize" in err), err
    assert main(args + ["--resize"]) == 0        # asked for: resized (the demo model pools globally)
    assert "ran on the reference path" in capsys.readouterr().out


# -- 2. the output: one plain line, details with -v, nothing of Taichi's on stdout ----------------
def test_run_prints_a_plain_summary_and_says_when_it_compiles(tmp_path):
    """In a subprocess with a new cache folder, so that its kernels compile (cpu: the arch of
    this test process too, but a subprocess is what a user runs)."""
    model = _save(tmp_path, "demo.tflite", build_demo_model())
    env = {**os.environ, "TFLITE_TAICHI_CACHE_DIR": str(tmp_path / "cache")}
    env.pop("ENABLE_TAICHI_HEADER_PRINT", None)

    def run(*extra):
        done = subprocess.run([sys.executable, "-m", "tflite_taichi", "run", model, "--backend", "cpu",
                               *extra], capture_output=True, text=True, timeout=600, env=env)
        assert done.returncode == 0, done.stderr
        return done.stdout, done.stderr
    out, err = run()
    lines = out.splitlines()
    assert lines[0].startswith("demo.tflite (float32) ran on cpu (Taichi on the CPU)"), out
    assert "[Taichi]" not in out and "DelegateWarning" not in out + err and "sys.exit" not in err, (out, err)
    # a pipe gets a line when kernels start compiling and one when they are done
    assert "tflite-taichi: compiling " in err and "tflite-taichi: compiled " in err, err
    assert len(lines) <= 5, out                 # summary, one line per output, start, invoke
    out, err = run("-v")
    assert "compiling" not in err, err          # cached now
    assert any(line.startswith("  delegate: INFO: ") for line in out.splitlines()), out


def test_the_device_line_says_a_software_device_is_one():
    class Ran:
        backend, _requested_backend = "vulkan", "vulkan"
    summary = {"runtime": {"vulkan_device": "llvmpipe (LLVM 15.0.6, 256 bits) (CPU)"}}
    assert "a software device (the CPU emulating a GPU" in _device_text(Ran(), summary)
    summary = {"runtime": {"vulkan_device": "NVIDIA H200"}}
    assert _device_text(Ran(), summary) == "vulkan (NVIDIA H200)"


def test_a_vulkan_device_name_is_kept_whole():
    from tflite_taichi.backend import _device_name
    assert _device_name("[I 12:00] Found Vulkan Device 0 (NVIDIA H200)") == "NVIDIA H200"
    assert _device_name("Found Vulkan Device 0 (llvmpipe (LLVM 15.0.6, 256 bits))") == \
        "llvmpipe (LLVM 15.0.6, 256 bits)"


def test_a_backend_without_its_driver_says_so_in_one_sentence():
    """Before Taichi is touched (it prints its own C++ warnings, then refuses the arch)."""
    from tflite_taichi.backend import check_driver
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        with pytest.raises(BackendUnavailable, match=r"^backend 'cuda' cannot start here: there is "
                                                     r"no NVIDIA driver .*use 'auto'"):
            check_driver("cuda")
    else:
        check_driver("cuda")                    # the driver is there: nothing to say
    check_driver("vulkan")                      # only CUDA's driver is one library to look for


# -- 3. made-up inputs the model accepts ------------------------------------------------------
def test_made_up_ids_are_within_the_tables_they_index(tmp_path, capsys):
    model = text_model()
    it = Interpreter(model_content=model, backend="reference")
    it.allocate_tensors()
    for seed in range(5):
        ids, positions = model_random_inputs(it, np.random.default_rng(seed))
        assert ids.dtype == np.int32 and 0 <= ids.min() and ids.max() < 50, ids
        assert 0 <= positions.min() and positions.max() < 8, positions
        run_litert(model, [ids, positions], "xnnpack")      # LiteRT takes them (it refuses others)
    assert main(["run", _save(tmp_path, "text.tflite", model), "--backend", "reference"]) == 0
    assert main(["bench", _save(tmp_path, "text.tflite", model), "--backends", "litert",
                 "reference", "--runs", "2", "--warmup", "1"]) == 0


# -- 4. inputs sized at run time --------------------------------------------------------------
def test_a_run_time_sized_input_is_named_with_the_fix(tmp_path, capsys):
    model = _save(tmp_path, "audio.tflite", audio_front_end())
    assert main(["inspect", model]) == 0
    out = capsys.readouterr().out
    assert "input  audio [1, 1] float32 (declared [-1, -1]: -1 is sized at run time" in out, out
    assert "--shape audio=1,16000" in out, out
    assert main(["inspect", model, "--shape", "audio=1,16000", "--backend", "reference"]) == 0
    assert "on a Taichi backend (--backend cpu, vulkan, ...), the delegate would take 2 of 2 ops" \
        in capsys.readouterr().out
    assert main(["run", model, "--backend", "reference"]) == 2
    err = capsys.readouterr().err
    assert "'audio' is declared [-1, -1] (tried as [1, 1]): give a shape with --shape audio=" in err, err
    assert main(["run", model, "--backend", "reference", "--shape", "audio=1,16000"]) == 0
    assert "output y [1, 1, 4000, 2]" in capsys.readouterr().out
    assert main(["run", model, "--backend", "reference", "--shape", "audio=16000"]) == 2
    assert "--shape audio: [16000] does not fit input 'audio', declared [-1, -1]" in capsys.readouterr().err
    assert main(["bench", model, "--backends", "litert", "reference", "--shape", "audio=1,800",
                 "--runs", "2", "--warmup", "1"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "audio:" in out and any(line.startswith("  reference ") for line in out), out
    assert not any("error" in line for line in out), out


# -- 6. batch starts the workers asked for, or says why not -------------------------------------
def test_batch_starts_the_workers_asked_for_or_says_why_not(tmp_path, capsys):
    model = _save(tmp_path, "m.tflite", one_op_model("RELU", [Input((1, 4), name="x")],
                                                      [Output((1, 4), name="y")]))
    write_arrays(tmp_path / "in", 5, (1, 4), seed=2)
    result = batch.run(model, [str(tmp_path / "in")], str(tmp_path / "out"), backend="reference",
                       workers=2)
    # 5 inputs make two tasks (not one of 32), so both workers start; which of them runs which
    # task is a race the faster one wins (each says its count and when it started)
    assert result.written == 5 and len(result.workers) == 2, result.workers
    assert sum(w["items"] for w in result.workers) == 5 and not result.notes, result
    write_arrays(tmp_path / "one", 1, (1, 4), seed=3)
    assert main(["batch", model, str(tmp_path / "one"), "--out", str(tmp_path / "out1"),
                 "--backend", "reference", "--workers", "3"]) == 0
    assert "batch: 1 of the 3 workers started: 1 input(s) give each worker one at least" in capsys.readouterr().out


# -- 7. help, version, inspect's summary --------------------------------------------------------
def test_every_option_of_every_command_says_what_it_does():
    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    for name in ("run", "inspect", "bench", "batch", "demo"):
        for action in commands[name]._actions:
            if action.option_strings and action.dest != "help":
                assert action.help, f"{name} {action.option_strings} has no help text"


def test_version_names_ours_and_the_runtimes_beneath(capsys):
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("tflite-taichi ") and "taichi 1.7.4" in out and "Python " in out, out


def test_inspect_prints_a_summary_first_and_details_on_request(tmp_path, capsys):
    from tflite_taichi.tools import zoo
    model = _save(tmp_path, "mv2.tflite", zoo.build("mobilenet_v2", int8=True))
    assert main(["inspect", model]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) <= 15 and any(line.startswith("  --backend auto runs on ") for line in out), out
    assert out[-1].strip().startswith("(--ops: every op"), out
    assert main(["inspect", model, "--ops"]) == 0
    assert sum(line.startswith("  #") for line in capsys.readouterr().out.splitlines()) > 50
