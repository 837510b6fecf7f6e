"""A newcomer's third hour: what the command line says is true and consistent. `inspect` says
what `run` on the same backend does; a Ctrl-C is one line and exit status 130; labels say what
they mean (the model's kind, software devices, one sentence for a backend that cannot start,
bench's ratios in words, who runs each CPU op); help matches behaviour (float64 inputs, bench's
--shape across models, demo's temporary file)."""
import json
import os
import re
import signal
import subprocess
import sys
import tempfile

import numpy as np
import pytest

from tflite_taichi.builder import ModelBuilder
from tflite_taichi.cli import _device_text, _print_profile, main
from tflite_taichi.errors import BackendUnavailable
from tflite_taichi.tools import bench
from tflite_taichi.tools.demo import build_demo_model

litert = pytest.importorskip("ai_edge_litert.interpreter")


def _save(tmp_path, name: str, model: bytes) -> str:
    path = tmp_path / name
    path.write_bytes(model)
    return str(path)


def _cli(args, cache, **popen):
    env = {**os.environ, "TFLITE_TAICHI_CACHE_DIR": str(cache)}
    return subprocess.run([sys.executable, "-m", "tflite_taichi", *args], capture_output=True,
                          text=True, timeout=600, env=env, **popen)


def folded_add_model() -> bytes:
    """x + DEQUANTIZE(an fp16 constant) -> RELU: one op folded at load, two at run time."""
    b = ModelBuilder()
    g = b.subgraph()
    x = g.input("x", (1, 8))
    w = g.tensor("w", (1, 8))
    g.op("DEQUANTIZE", [g.const("w16", np.linspace(-1, 1, 8).reshape(1, 8).astype(np.float16))], [w])
    s = g.tensor("s", (1, 8))
    g.op("ADD", [x, w], [s])
    y = g.tensor("y", (1, 8))
    g.op("RELU", [s], [y])
    g.output(y)
    return b.finish()


def _placement(line: str) -> str:
    """What a run headline or inspect's line says after "ran on"/"runs on"."""
    return re.split(r"\b(?:ran|runs) on ", line, maxsplit=1)[1]


# -- 2. inspect and run agree -----------------------------------------------------------------
def test_inspect_says_what_run_does_on_the_default_backend(tmp_path, capsys):
    """`auto` without a GPU runs every op on LiteRT's kernels: inspect must say so, not what
    the delegate could take elsewhere (that is said too, marked as such)."""
    model = _save(tmp_path, "demo.tflite", build_demo_model())
    assert main(["inspect", model]) == 0
    out = capsys.readouterr().out.splitlines()
    said = [line for line in out if line.startswith("  --backend auto runs on ")]
    assert len(said) == 1, out
    assert main(["run", model]) == 0
    headline = capsys.readouterr().out.splitlines()[0]
    assert _placement(said[0]) == _placement(headline), (said, headline)
    assert not any(line.startswith("  the delegate takes") for line in out), out


def test_node_data_and_inspect_count_the_same_placement(tmp_path, capsys):
    model = _save(tmp_path, "demo.tflite", build_demo_model())
    node_data = tmp_path / "where.json"
    assert main(["inspect", model, "--node-data", str(node_data)]) == 0
    out = capsys.readouterr().out
    where = [r["value"] for graph in json.loads(node_data.read_text()).values()
             for r in graph["results"].values()]
    on_litert = sum(value == "CPU (LiteRT)" for value in where)
    assert f"all {on_litert} ops" in out and on_litert == len(where), (out, where)


def test_inspect_run_and_v_agree_on_a_taichi_backend(tmp_path):
    """In subprocesses (a Taichi arch per process), one cache: inspect compiles, run loads."""
    model = _save(tmp_path, "folded.tflite", folded_add_model())
    inspect = _cli(["inspect", model, "--backend", "cpu"], tmp_path / "cache")
    assert inspect.returncode == 0, inspect.stderr
    said = [line for line in inspect.stdout.splitlines() if line.startswith("  --backend cpu runs on ")]
    run = _cli(["run", model, "--backend", "cpu", "-v"], tmp_path / "cache")
    assert run.returncode == 0, run.stderr
    headline, *rest = run.stdout.splitlines()
    assert len(said) == 1 and _placement(said[0]) == _placement(headline), (inspect.stdout, headline)
    assert "2 of 2 ops on the delegate; 1 computed once at load" in headline, headline
    # -v's count line says the folded op the headline's way, not as a part of the CPU's
    info = [line for line in rest if line.startswith("  delegate: INFO: ")]
    assert info and "0 run on the CPU; 1 computed once at load" in info[-1], rest


# -- 4. Ctrl-C --------------------------------------------------------------------------------
def test_ctrl_c_while_compiling_is_one_line_and_status_130(shared_models, tmp_path):
    """SIGINT to the process group (as a terminal's Ctrl-C) once the compile has said it began;
    face_detection compiles for seconds on cpu, the signal lands within them. The command runs
    with SIGINT handled as a terminal's process has it: a suite started in the background (a
    shell's `&`, nohup) passes SIGINT on ignored, and Python then rightly keeps ignoring it."""
    env = {**os.environ, "TFLITE_TAICHI_CACHE_DIR": str(tmp_path / "cold")}
    as_from_a_terminal = ("import runpy, signal, sys; "
                          "signal.signal(signal.SIGINT, signal.default_int_handler); "
                          "sys.argv = ['tflite-taichi'] + sys.argv[1:]; "
                          "runpy.run_module('tflite_taichi', run_name='__main__')")
    proc = subprocess.Popen([sys.executable, "-c", as_from_a_terminal, "run",
                             os.path.join(shared_models, "face_detection_short_range.tflite"),
                             "--backend", "cpu"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env, start_new_session=True)
    try:
        first = proc.stderr.readline()
        assert first.startswith("tflite-taichi: compiling "), first
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, (proc.returncode, err)
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("tflite-taichi run: interrupted while compiling the kernels of "
                               "face_detection_short_range.tflite ("), err
    assert "not cached" in lines[0] and "Traceback" not in err and out == "", (out, err)


def test_first_invoke_after_a_cold_compile_on_a_gpu_api_is_announced(tmp_path):
    model = _save(tmp_path, "demo.tflite", build_demo_model())
    cold = _cli(["run", model, "--backend", "vulkan"], tmp_path / "cache")
    assert cold.returncode == 0, cold.stderr
    lines = cold.stderr.splitlines()
    compiled = next(i for i, line in enumerate(lines) if line.startswith("tflite-taichi: compiled "))
    after = lines[compiled + 1:]
    assert after and after[0].startswith("tflite-taichi: preparing the GPU pipelines"), lines
    warm = _cli(["run", model, "--backend", "vulkan"], tmp_path / "cache")
    assert warm.returncode == 0 and "preparing" not in warm.stderr, warm.stderr


# -- 5. labels --------------------------------------------------------------------------------
def test_the_headline_says_the_models_kind_not_the_storage_precision(shared_models, capsys):
    assert main(["run", os.path.join(shared_models, "mobilenet_v1_int8.tflite"), "--backend", "litert"]) == 0
    headline = capsys.readouterr().out.splitlines()[0]
    assert headline.startswith("mobilenet_v1_int8.tflite (full-integer int8) ran on "), headline
    assert "fp32" not in headline, headline


def test_metal_off_macos_is_one_sentence(tmp_path):
    from tflite_taichi.backend import check_driver
    with pytest.raises(BackendUnavailable, match=r"^backend 'metal' cannot start here: Metal is "
                                                 r"Apple's GPU API.*; use 'auto'"):
        check_driver("metal")
    done = _cli(["run", _save(tmp_path, "demo.tflite", build_demo_model()), "--backend", "metal"],
                tmp_path / "cache")
    assert done.returncode == 2 and done.stdout == "", done
    assert done.stderr.splitlines() == [
        "tflite-taichi: error: BackendUnavailable: backend 'metal' cannot start here: Metal is "
        "Apple's GPU API, which Taichi runs on macOS only; use 'auto' (the best GPU this machine "
        "has, else the CPU) or 'cpu'"], done.stderr


def test_opengl_on_llvmpipe_is_called_a_software_device(monkeypatch):
    from tflite_taichi.runtime import session
    monkeypatch.setitem(session.SESSION.probes, "opengl", (True, True, "llvmpipe (LLVM 15.0.6, 256 bits)"))

    class Ran:
        backend, _requested_backend = "opengl", "opengl"
    text = _device_text(Ran(), {"runtime": {"device": "capi"}})
    assert text.startswith("opengl on llvmpipe (LLVM 15.0.6, 256 bits), a software device"), text


def test_benchs_device_lines_fit_a_terminal():
    long_device = "NVIDIA H200 (" + ", ".join(f"GPU {i}: 139 GiB, driver 565.57.01" for i in range(6)) + ")"
    assert len(long_device) > 200
    results = [{"model": "m", "rows": [{"backend": "cuda", "ok": True, "device": long_device}]}]
    lines = bench.devices_text(results).splitlines()
    assert max(len(line) for line in lines) <= bench.DEVICE_LINE_WIDTH, lines
    assert " ".join(line.strip() for line in lines) == f"cuda: {long_device}"


def test_benchs_ratio_says_faster_or_slower():
    def row(backend, ms):
        return {"backend": backend, "ok": True, "latency_ms": {"median": ms}, "threads": 2}
    results = [{"model": "slow", "rows": [row("litert", 1.0), row("cpu", 18.25)]},
               {"model": "fast", "rows": [row("litert", 2.0), row("cpu", 0.5)]}]
    head, slow, fast = bench.speed_rows(results)
    assert head[-1] == "ours vs LiteRT" and slow[-1] == "18.25x slower" and fast[-1] == "4.00x faster"


def test_the_profile_names_who_runs_each_cpu_op(capsys):
    class Ran:
        def profile(self):
            return {"backend": "cpu", "launches_per_invoke": 1, "items": [
                {"kind": "partition", "ops": [0, 1], "launches": 1, "ms": 0.5},
                {"kind": "cpu", "ops": [2], "op": "CUSTOM:CpuOnlyAbs", "launches": 0, "ms": 0.1},
                {"kind": "cpu", "ops": [3], "op": "TOPK_V2", "launches": 0, "ms": 0.2}]}

        def op_table(self):
            return [{"index": 0, "runs_on": "delegate"}, {"index": 1, "runs_on": "delegate"},
                    {"index": 2, "runs_on": "numpy"}, {"index": 3, "runs_on": "litert"}]
    _print_profile(Ran())
    out = capsys.readouterr().out
    assert "numpy: #2 CUSTOM:CpuOnlyAbs" in out and "litert: #3 TOPK_V2" in out, out
    assert "cpu:" not in out, out


# -- 6. help and behaviour --------------------------------------------------------------------
def test_a_float64_input_is_refused_with_the_fix(tmp_path, capsys):
    model = _save(tmp_path, "demo.tflite", build_demo_model())
    np.save(tmp_path / "x.npy", np.zeros((1, 96, 96, 3)))          # numpy's default: float64
    assert main(["run", model, "--backend", "reference", "--input", f"image={tmp_path / 'x.npy'}"]) == 2
    err = capsys.readouterr().err
    assert (f"--input image: {tmp_path / 'x.npy'} holds float64 data, but input 'image' takes "
            "float32: save it as x.astype(np.float32)") in err, err


def test_bench_shape_applies_to_the_models_with_that_input(tmp_path, capsys):
    from cases.audio import audio_front_end
    audio = _save(tmp_path, "audio.tflite", audio_front_end())
    demo = _save(tmp_path, "demo.tflite", build_demo_model())
    common = ["--backends", "reference", "--runs", "2", "--warmup", "1"]
    assert main(["bench", audio, demo, *common, "--shape", "audio=1,800"]) == 0
    out = capsys.readouterr().out
    assert "audio:" in out and "demo:" in out and "error" not in out, out
    assert main(["bench", audio, demo, *common, "--shape", "sound=1,800"]) == 2
    captured = capsys.readouterr()
    assert "--shape sound: no model given has an input named 'sound'" in captured.err
    assert captured.out == "", captured.out         # refused before anything ran


def test_demo_leaves_no_folder_behind(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    assert main(["demo", "--runs", "1"]) == 0
    assert "auto -> " in capsys.readouterr().out
    assert os.listdir(tmp_path) == [], os.listdir(tmp_path)
