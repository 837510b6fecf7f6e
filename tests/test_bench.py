"""The benchmark harness: structure of what it measures and writes, never speed.

A builder-made model through tflite_taichi.tools.bench on LiteRT CPU, reference and Taichi's cpu (each
in its own subprocesses, --runs 3), through bench/bench.py and through `tflite-taichi bench`;
LiteRT's GPU path where it cannot start (a row that says why, not a crash) and, on LiteRT's CPU
accelerator, the CompiledModel driving it uses; the child's input/output matching.
"""
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from tflite_taichi.tools import bench_child as child
from tflite_taichi import switches
from tflite_taichi.tools import bench
from tflite_taichi.cli import main
from tflite_taichi.testing import Const, Input, Output, one_op_model

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BACKENDS = (["litert"] if bench.litert_available() else []) + ["reference", "cpu"]
needs_litert = pytest.mark.skipif(not bench.litert_available(), reason="ai_edge_litert not installed")
# TFLITE_TAICHI_EXPECT_GPU=none (.ci/run): no hardware GPU here, so a test that would skip on a
# GPU machine must hold (as in tests/test_delegate.py).
NO_GPU = switches.value("TFLITE_TAICHI_EXPECT_GPU") == "none"


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    model = one_op_model("ADD", [Input((1, 8, 8, 4), name="x"),
                                 Const(np.linspace(-1, 1, 4).astype(np.float32))],
                         [Output((1, 8, 8, 4), name="y")], fused_activation_function="RELU")
    path = tmp_path_factory.mktemp("bench") / "add_relu.tflite"
    path.write_bytes(model)
    return str(path)


@pytest.fixture(scope="module")
def result(model_path):
    return bench.bench_model(model_path, BACKENDS, runs=3, warmup=2, threads=1)


def check_row(row, runs=3):
    assert row["ok"], row.get("error")
    for stage in ("cold", "warm"):
        start = row[stage]
        for key in ("import_s", "construct_s", "allocate_s", "first_invoke_s", "start_s"):
            assert start[key] > 0, (stage, key, start)
        parts = start["construct_s"] + start["allocate_s"] + start["first_invoke_s"]
        assert parts <= start["start_s"] + 1e-9, start
    assert row["cold"]["cache_files_before"] == 0          # a new, empty cache folder
    assert row["warm_pct"] == pytest.approx(100 * row["warm"]["start_s"] / row["cold"]["start_s"])
    lat = row["latency_ms"]
    assert lat["runs"] == runs and len(row["times_ms"]) == runs
    assert 0 < lat["min"] <= lat["p10"] <= lat["median"] <= lat["p90"] <= lat["max"], lat
    assert row["second_step_ms"] > 0
    # the invoke alone is timed inside each step: never longer than its step
    inv = row["invoke_ms"]
    assert inv["runs"] == runs and row["invoke_median_ms"] == inv["median"]
    assert 0 < inv["min"] <= lat["min"] and inv["max"] <= lat["max"]
    assert row["matched"] == {"inputs": ["name"], "outputs": ["name"]}


def test_every_backend_measured_and_checked_against_the_oracle(result):
    assert result["model"] == "add_relu" and result["runs"] == 3 and result["warmup"] == 2
    assert result["inputs"] == [{"shape": [1, 8, 8, 4], "dtype": "float32"}]
    rows = {r["backend"]: r for r in result["rows"]}
    assert list(rows) == BACKENDS
    for row in rows.values():
        check_row(row)
        assert row["max_rel_diff"] is not None and row["max_rel_diff"] <= 1e-6, row
    assert result["oracle"] == BACKENDS[0]
    assert rows["cpu"]["ops_delegated"] == 1
    assert rows["cpu"]["ops_cpu"] == 0 and rows["cpu"]["partitions"] == 1
    assert rows["reference"]["ops_cpu"] == 1 and rows["reference"]["launches_per_invoke"] == 0
    if "litert" in rows:
        assert rows["litert"]["threads"] == 1 and "launches_per_invoke" not in rows["litert"]
        assert "waits_per_invoke" not in rows["litert"] and "device_kind" not in rows["litert"]


def test_ours_report_launches_waits_device_kind_and_a_warm_cache(result):
    rows = {r["backend"]: r for r in result["rows"]}
    cpu = rows["cpu"]
    assert cpu["launches_per_invoke"] >= 1
    assert isinstance(cpu["waits_per_invoke"], int) and cpu["waits_per_invoke"] >= 1
    assert cpu["device_kind"] in ("capi", "python")
    # the cold process got a new, empty folder as cache_dir; the warm one the same folder, warm
    assert cpu["cold"]["cache_state"] == "cold" and cpu["cold"]["cache_reason"]
    assert cpu["warm"]["cache_state"] == "warm" == cpu["cache_state"]
    assert cpu["cold"]["cache_dir"] == cpu["warm"]["cache_dir"]
    assert os.path.basename(cpu["cold"]["cache_dir"]).startswith("cache-cpu-")
    assert cpu["warm"]["cache_files_before"] > 0
    assert cpu["cold"]["build_s"] > 0 and cpu["warm"]["build_s"] == 0
    # nothing delegated: no launches, no waits, no device, no cache
    ref = rows["reference"]
    assert ref["waits_per_invoke"] == 0 and ref["device_kind"] is None and ref["cache_state"] is None
    line = next(l for l in bench.table_rows([result]) if l[1] == "cpu")
    head = bench.TABLE_HEAD
    assert line[head.index("waits / invoke")] == str(cpu["waits_per_invoke"])
    assert line[head.index("device kind")] == cpu["device_kind"]
    assert line[head.index("warm-run cache")] == "warm"
    assert line[head.index("warm / cold")] == f"{cpu['warm_pct']:.0f}%"


def test_report_files(result, tmp_path):
    report = bench.make_report([result], "python bench/bench.py add_relu --runs 3",
                               bench.machine_info(), note="a test run")
    written = bench.write_report(report, str(tmp_path / "r"))
    md = (tmp_path / "r.md").read_text()
    assert "**Note:** a test run" in md and "python bench/bench.py add_relu --runs 3" in md
    assert ("| model | backend | device | cold start s | warm start s | warm / cold | warm-run cache "
            "| median ms (step) | p10-p90 ms | min ms | launches / invoke | waits / invoke "
            "| device kind | ops GPU / CPU | max rel. diff |") in md
    assert "| first step s | second step ms | invoke-only median ms |" in md
    assert "set every input, invoke, get every output" in md
    for b in BACKENDS:
        assert f"| add_relu | {b}" in md, md
    for name in ("python", "numpy", "taichi", "tflite-taichi"):
        assert f"{name} " in md.split("Versions:")[1].split("\n")[0]
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["results"][0]["rows"][0]["latency_ms"] == result["rows"][0]["latency_ms"]
    try:
        import matplotlib  # noqa: F401
        assert str(tmp_path / "r.png") in written and (tmp_path / "r.png").stat().st_size > 0
        assert "![median step latency" in md
    except ImportError:
        assert not (tmp_path / "r.png").exists() and "No plot: matplotlib" in md


def test_bench_script_writes_md_and_json(model_path, tmp_path):
    models_dir = os.path.dirname(model_path)
    out = tmp_path / "results" / "run"
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "bench.py"), "add_relu",
                           "--models", models_dir, "--backends", "reference", "--runs", "3",
                           "--warmup", "1", "--out", str(out), "--note", "noisy"],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "add_relu" in proc.stdout and "written:" in proc.stdout
    data = json.loads((tmp_path / "results" / "run.json").read_text())
    (res,) = data["results"]
    assert res["oracle"] == "reference" and [r["backend"] for r in res["rows"]] == ["reference"]
    check_row(res["rows"][0])
    md = (tmp_path / "results" / "run.md").read_text()
    assert "--backends reference --runs 3" in md and "**Note:** noisy" in md


def test_cli_bench_prints_the_table(model_path, tmp_path, capsys):
    out = tmp_path / "cli.json"
    assert main(["bench", model_path, "--backends", "reference", "--runs", "3", "--warmup", "1",
                 "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    header, model, row, ran_on, device = printed.strip().splitlines()
    assert header.split()[:3] == ["runtime", "step", "ms"] and model == "add_relu:"
    assert row.split()[0] == "reference" and float(row.split()[1]) > 0, row
    assert ran_on == "ran on:" and device.split() == ["reference:", "CPU,", "numpy"]
    assert max(len(line) for line in printed.splitlines()) <= 100, printed
    check_row(json.loads(out.read_text())["rows"][0])
    assert main(["bench", model_path, "--backends", "reference", "--runs", "3", "--warmup", "1",
                 "--wide"]) == 0
    header, row = capsys.readouterr().out.strip().splitlines()
    assert header.split()[:4] == ["model", "backend", "device", "cold"]


@pytest.mark.skipif(sys.platform == "darwin", reason="Metal starts on macOS")
def test_a_backend_that_does_not_start_is_a_row_not_a_crash(model_path, capsys):
    assert main(["bench", model_path, "--backends", "reference", "metal", "--runs", "3",
                 "--warmup", "1"]) == 1
    captured = capsys.readouterr()
    assert "metal" in captured.out and "error: does not start here" in captured.out
    assert "Metal needs macOS" in captured.err


@needs_litert
def test_litert_gpu_without_a_hardware_gpu_is_a_row_with_the_reason(model_path):
    """LiteRT GPU cannot start without a hardware GPU (lavapipe: 'No adapters found'): its rows
    say so, the other rows are measured, and the defaults leave it out (it would only cost CI)."""
    defaults = bench.default_backends()
    if "litert_gpu" in defaults:
        assert not NO_GPU, f"TFLITE_TAICHI_EXPECT_GPU=none, yet a GPU backend starts: {defaults}"
        pytest.skip("a hardware GPU backend of ours starts here: LiteRT GPU may too")
    assert defaults[:2] == ["litert", "reference"] and defaults[-1] == "cpu"
    res = bench.bench_model(model_path, ["litert", "litert_gpu", "litert_gpu_fp16", "reference"],
                            runs=2, warmup=1, threads=1)
    rows = {r["backend"]: r for r in res["rows"]}
    assert rows["litert"]["ok"] and rows["reference"]["ok"] and res["oracle"] == "litert"
    for name, precision in (("litert_gpu", "fp32"), ("litert_gpu_fp16", "fp16")):
        row = rows[name]
        assert row["ok"] is False and row["precision"] == precision
        assert row["device"] == f"GPU, LiteRT ML Drift (WebGPU/Vulkan), {precision}"
        error = row["error"]
        assert error.startswith("cold run: "), error
        # the reason from LiteRT's log, not only its exception's source line, nor a dead process
        assert "LiteRT's log" in error and "adapter" in error.lower(), error
        assert "process died" not in error and "killed after" not in error
        assert "cold" not in row and "latency_ms" not in row
    md = bench.render_table([res])
    assert "| add_relu | litert_gpu | GPU, LiteRT ML Drift (WebGPU/Vulkan), fp32 | error: cold run: " in md
    text = bench.render_text([res]).splitlines()
    assert any(l.startswith("add_relu") and "litert_gpu_fp16" in l and "error:" in l for l in text)


@needs_litert
def test_litert_gpu_path_driven_on_litert_cpu_accelerator(model_path, tmp_path):
    """What the litert_gpu row runs (CompiledModel: write / run_by_index / read, inputs and
    outputs matched to the model's), here on LiteRT's CPU accelerator so that it runs anywhere."""
    inputs = bench.make_inputs(model_path)
    npz = str(tmp_path / "inputs.npz")
    np.savez(npz, **{f"input_{i}": x for i, x in enumerate(inputs)})
    cache = str(tmp_path / "cache")
    os.mkdir(cache, 0o700)
    spec = {"model": model_path, "backend": "litert_gpu", "precision": "fp32", "threads": 1,
            "runs": 3, "warmup": 1, "profile": False, "inputs": npz,
            "outputs": str(tmp_path / "out.npz"), "io": bench.model_io(model_path),
            "cache_dir": cache, "accelerator": "cpu", "stage": "warm"}
    result = bench._run_child(spec, str(tmp_path), bench._child_env("litert_gpu", cache), 120, None)
    assert result["ok"], result.get("error")
    assert result["matched"] == {"inputs": ["name"], "outputs": ["name"]}
    assert isinstance(result["fully_accelerated"], bool)
    assert len(result["times_ms"]) == 3 and len(result["invoke_times_ms"]) == 3
    (y,) = bench._load_outputs(spec["outputs"])
    expected = np.maximum(inputs[0] + np.linspace(-1, 1, 4).astype(np.float32), 0)
    assert y.shape == (1, 8, 8, 4) and bench.relative_diff([y], [expected]) <= 1e-6


def test_inputs_and_outputs_matched_by_name_then_shape_then_size():
    model = [{"name": "a", "shape": [1, 4]}, {"name": "b", "shape": [1, 2]},
             {"name": "c", "shape": [2, 3]}]
    # names agree, in another order
    runtime = [{"name": "c", "shape": [2, 3]}, {"name": "a", "shape": [1, 4]},
               {"name": "b", "shape": [1, 2]}]
    assert child.match(model, runtime) == ([1, 2, 0], ["name", "name", "name"])
    # signature names that are not the tensors': by shape, else by size (a flat read)
    runtime = [{"name": "out1", "shape": [6]}, {"name": "out0", "shape": [1, 2]},
               {"name": "a", "shape": [1, 4]}]
    assert child.match(model, runtime) == ([2, 1, 0], ["name", "shape", "size"])
    with pytest.raises(ValueError, match="cannot match"):
        child.match(model, [{"name": "x", "shape": [5]}] * 3)
    with pytest.raises(ValueError, match="3 tensor"):
        child.match(model, runtime[:2])


def test_litert_log_errors(tmp_path):
    log = tmp_path / "x.log"
    log.write_text(
        "INFO: [compiled_model.cc:829] Flatbuffer model initialized\n"
        "WARNING: [compiler_plugin.cc:312] Failed to load plugin at: x.so with error: "
        "ERROR: [litert/compiler/plugin/compiler_plugin.cc:259]\n"
        "ERROR: [delegate_webgpu.cc:359] Failed to initialize WebGPU environment: INTERNAL: No adapters found\n"
        "E0000 00:00:1796118282.264178    6544 delegate_webgpu.cc:736] Failed to get or create delegate\n"
        "ERROR: [delegate_webgpu.cc:359] Failed to initialize WebGPU environment: INTERNAL: No adapters found\n"
        "something: Failed to modify graph with delegate\n")
    assert bench.log_errors(str(log)) == (
        "Failed to initialize WebGPU environment: INTERNAL: No adapters found; "
        "Failed to get or create delegate; Failed to modify graph with delegate")
    assert bench.log_errors(str(tmp_path / "absent.log")) == ""


def test_backends_names_devices_and_relative_diff():
    with pytest.raises(ValueError, match="unknown backend"):
        bench.check_backends(["reference", "tpu"])
    assert bench.check_backends(["litert,litert_gpu", "litert_gpu_fp16", "cpu", "litert"]) == [
        "litert", "litert_gpu", "litert_gpu_fp16", "cpu"]
    # the spelling users type: `tflite-taichi bench --backends litert litert-gpu cuda vulkan`
    assert bench.check_backends(["litert", "litert-gpu", "litert-gpu-fp16"]) == [
        "litert", "litert_gpu", "litert_gpu_fp16"]
    assert bench.precision_of("litert_gpu", "fp16") == "fp32"
    assert bench.precision_of("litert_gpu_fp16") == "fp16" and bench.precision_of("cpu", "fp16") == "fp16"
    if bench.litert_available():
        assert bench.device_of("litert_gpu")["device"] == "GPU, LiteRT ML Drift (WebGPU/Vulkan), fp32"
        assert bench.device_of("litert_gpu_fp16")["device"] == "GPU, LiteRT ML Drift (WebGPU/Vulkan), fp16"
    e = np.array([[1.0, -4.0]], np.float32)
    assert bench.relative_diff([e], [e]) == 0.0
    assert bench.relative_diff([e + np.float32(0.5)], [e]) == pytest.approx(0.125)
    assert bench.relative_diff([e[0]], [e]) == float("inf")
    assert bench.relative_diff([np.array([np.nan])], [np.array([1.0])]) == float("inf")


def _row(backend, median=None, error=None, **extra):
    """A result row as bench_backend writes it: timed (median ms) or failed (error)."""
    if error is not None:
        return {"backend": backend, "ok": False, "error": error, **extra}
    return {"backend": backend, "ok": True, "latency_ms": {"median": median}, **extra}


def test_speed_table_sets_runtimes_side_by_side_with_ours_over_litert():
    """One row per model, the fastest in bold, our fastest backend over the faster LiteRT (a
    user's comparison: no targets of ours), refusals named."""
    results = [
        {"model": "a", "rows": [_row("litert", 1.0, threads=16), _row("litert_gpu", 2.0),
                                _row("cuda", 0.5), _row("vulkan", 2.5)]},
        {"model": "b", "rows": [_row("litert", 1.0, threads=16),
                                _row("litert_gpu", error="cold run: ... Failed to modify graph with delegate"),
                                _row("cuda", 0.9), _row("vulkan", 1.2)]},
        {"model": "c", "rows": [_row("litert", 4.0, threads=16),
                                _row("litert_gpu", error="cold run: INTERNAL: No adapters found; delegate"),
                                _row("cuda", error="killed"), _row("vulkan", 3.0)]},
    ]
    head, a, b, c = bench.speed_rows(results)
    assert head == ["model", "LiteRT CPU 16 thr", "LiteRT GPU", "cuda", "vulkan", "ours vs LiteRT"]
    assert a == ["a", "1.00 ms", "2.00 ms", "**0.50 ms**", "2.50 ms", "2.00x faster"]
    assert b == ["b", "1.00 ms", "refuses the model", "**0.90 ms**", "1.20 ms", "1.11x faster"]
    assert c == ["c", "4.00 ms", "no GPU adapter", "error", "**3.00 ms**", "1.33x faster"]
    text = bench.render_speed_text(results)
    assert "**" not in text and "target" not in text and text.splitlines()[1].split()[:2] == ["a", "1.00"]
    assert bench.render_speed_table(results).splitlines()[2].startswith("| a | 1.00 ms | 2.00 ms | **0.50 ms**")


def test_speed_table_leaves_out_ratios_whose_runtimes_did_not_run():
    results = [{"model": "a", "rows": [_row("reference", 3.0), _row("cpu", 1.5)]}]
    assert bench.speed_rows(results) == [["model", "reference", "cpu"], ["a", "3.00 ms", "**1.50 ms**"]]


@needs_litert
def test_cli_bench_several_models_side_by_side(model_path, tmp_path, capsys):
    """`tflite-taichi bench A B --backends litert litert-gpu reference --out NAME`: both models
    in one table and side by side; LiteRT GPU without a hardware GPU is a row saying so and the
    command still succeeds (only ours or LiteRT CPU failing fails it); NAME.md/.json written."""
    second = tmp_path / "relu.tflite"
    second.write_bytes(one_op_model("RELU", [Input((1, 16), name="x")], [Output((1, 16), name="y")]))
    out, js = tmp_path / "report", tmp_path / "all.json"
    defaults = bench.default_backends()
    if "litert_gpu" in defaults:
        assert not NO_GPU, f"TFLITE_TAICHI_EXPECT_GPU=none, yet a GPU backend starts: {defaults}"
        pytest.skip("a hardware GPU backend of ours starts here: LiteRT GPU may too")
    assert main(["bench", model_path, str(second), "--backends", "litert", "litert-gpu", "reference",
                 "--threads", "1", "--runs", "3", "--warmup", "1", "--out", str(out), "--json", str(js),
                 "--title", "two models"]) == 0
    captured = capsys.readouterr()
    speed = captured.out[captured.out.index("\n\nmodel"):].strip().splitlines()
    assert speed.pop().startswith("written: ")
    assert speed[0].split() == ["model", "LiteRT", "CPU", "1", "thr", "LiteRT", "GPU", "reference",
                                "ours", "vs", "LiteRT"]
    assert [l.split()[0] for l in speed[1:]] == ["add_relu", "relu"]
    assert all(re.search(r" \d+\.\d\dx (faster|slower)$", l) for l in speed[1:]), speed
    assert all("no GPU adapter" in l for l in speed[1:])
    assert "adapter" in captured.err.lower()
    results = json.loads(js.read_text())
    assert [r["model"] for r in results] == ["add_relu", "relu"]
    md = (tmp_path / "report.md").read_text()
    assert md.startswith("# two models") and "Step medians side by side" in md
    assert "tflite-taichi bench " in md and "--title 'two models'" in md
    assert json.loads((tmp_path / "report.json").read_text())["results"][1]["model"] == "relu"


def test_cli_bench_names_a_missing_model(model_path, capsys):
    assert main(["bench", model_path, "no/such/model.tflite", "--backends", "reference"]) == 2
    assert "no model file no/such/model.tflite" in capsys.readouterr().err


# -- bench/: the maintained harnesses, their shared step timer, and lab/ beside them ----------

BENCH = os.path.join(ROOT, "bench")


def _bench_module(name):
    """A module of bench/ (not a package: the harnesses import each other from their folder)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location(f"bench_{name}", os.path.join(BENCH, name + ".py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class _RecordingInterpreter:
    """The tf.lite calls a step makes, in order."""

    def __init__(self):
        self.calls = []

    def get_output_details(self):
        return [{"index": 7}, {"index": 9}]

    def set_tensor(self, index, value):
        self.calls.append(("set", index, float(value[0])))

    def invoke(self):
        self.calls.append(("invoke",))

    def get_tensor(self, index):
        self.calls.append(("get", index))
        return np.full(1, index, np.float32)


def test_the_shared_step_sets_every_input_invokes_once_and_gets_every_output():
    timing = _bench_module("timing")
    it = _RecordingInterpreter()
    step = timing.step_of(it, [(0, np.array([1.0])), (1, np.array([2.0]))])
    assert [float(y[0]) for y in step()] == [7.0, 9.0]
    assert it.calls == [("set", 0, 1.0), ("set", 1, 2.0), ("invoke",), ("get", 7), ("get", 9)]
    it.calls.clear()
    timing.step_of(it, [(0, np.array([3.0]))], outputs=[9])()
    assert it.calls == [("set", 0, 3.0), ("invoke",), ("get", 9)]


def test_the_shared_timer_warms_up_untimed_and_reports_median_and_p10_p90_in_ms():
    timing = _bench_module("timing")
    calls = []
    seconds = timing.timed(lambda: calls.append(1), runs=5, warmup=3)
    assert len(calls) == 8 and len(seconds) == 5 and all(s >= 0 for s in seconds)
    spread = timing.spread_ms([0.001 * k for k in range(1, 12)])      # 1..11 ms
    assert spread == pytest.approx({"median_ms": 6.0, "p10_ms": 2.0, "p90_ms": 10.0})
    assert list(spread) == ["median_ms", "p10_ms", "p90_ms"]
    assert timing.describe([0.001, 0.002, 0.003]) == "median 2.000 ms (p10 1.200, p90 2.800)"


@pytest.mark.parametrize("script", ["cpu_step.py", "profile_invoke.py", "check_models.py",
                                    "batch_throughput.py", "load_control.py"])
def test_the_harnesses_on_the_shared_timer_start(script):
    """Each imports bench/timing.py from its own folder, whatever the working directory."""
    out = subprocess.run([sys.executable, os.path.join(BENCH, script), "--help"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "usage:" in out.stdout, out.stderr[-2000:]


@pytest.mark.parametrize("script", ["conv_shapes.py", "api_calls.py"])
def test_lab_probes_find_the_harnesses_they_build_on_in_bench(script):
    out = subprocess.run([sys.executable, os.path.join(ROOT, "lab", script), "--help"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "usage:" in out.stdout, out.stderr[-2000:]


def test_bench_readme_gives_every_harness_one_line_and_names_only_harnesses_there():
    with open(os.path.join(BENCH, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    named = set(re.findall(r"`([\w.]+\.(?:py|sh))`", readme))
    there = {n for n in os.listdir(BENCH) if n.endswith((".py", ".sh"))}
    assert there - named == set(), f"bench/README.md: give these a line: {sorted(there - named)}"
    assert named - there == set(), f"bench/README.md names what is not in bench/: {sorted(named - there)}"


def _what_users_read():
    paths = [os.path.join(ROOT, "README.md")]
    docs = os.path.join(ROOT, "docs")
    paths += [os.path.join(docs, n) for n in sorted(os.listdir(docs)) if n.endswith(".md")]
    return paths


def test_every_file_the_readme_and_docs_cite_in_bench_and_lab_is_there():
    missing = []
    for path in _what_users_read():
        with open(path, encoding="utf-8") as f:
            text = f.read()
        for cited in set(re.findall(r"\b((?:bench|lab)/[\w./-]*\w\.(?:md|py|sh|json|png))", text)):
            if not os.path.exists(os.path.join(ROOT, cited)):
                missing.append(f"{os.path.relpath(path, ROOT)}: {cited}")
    assert missing == [], missing


ISSUE_NUMBER = re.compile(r"\b[Ii]ssues?\s*#?\d+|\bissue\d+_|\([Ii]ssues?\s*$", re.M)


def test_what_users_read_names_no_issue_numbers():
    """README, docs/, the package (ops/ and quant/ included), the maintained harnesses and the
    tests say the reason (or cite a results file by its subject), never a tracker's number a
    user cannot see. (os.walk follows no links: ops/ and quant/ are walked where they stand.)"""
    paths = _what_users_read()
    for top in ("tflite_taichi", "ops", "quant", "bench", "tests"):
        for folder, _, names in os.walk(os.path.join(ROOT, top)):
            if os.path.basename(folder) == "results":
                continue            # measurements as they were recorded
            paths += [os.path.join(folder, n) for n in names if n.endswith((".py", ".sh"))]
    found = []
    for path in paths:
        with open(path, encoding="utf-8") as f:
            for number, line in enumerate(f, 1):
                if ISSUE_NUMBER.search(line):
                    found.append(f"{os.path.relpath(path, ROOT)}:{number}: {line.strip()}")
    assert found == [], "\n".join(found)
