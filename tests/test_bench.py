"""The benchmark harness (issue #5): structure of what it measures and writes, never speed.

A builder-made model through tflite_taichi.bench on reference, LiteRT and Taichi's cpu (each in
its own subprocesses, --runs 3), through bench/bench.py and through `tflite-taichi bench`.
"""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tflite_taichi import bench
from tflite_taichi.cli import main
from tflite_taichi.testing import Const, Input, Output, one_op_model

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BACKENDS = (["litert"] if bench.litert_available() else []) + ["reference", "cpu"]


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
    lat = row["latency_ms"]
    assert lat["runs"] == runs and len(row["times_ms"]) == runs
    assert 0 < lat["min"] <= lat["p10"] <= lat["median"] <= lat["p90"] <= lat["max"], lat
    assert row["second_invoke_ms"] > 0


def test_every_backend_measured_and_checked_against_the_oracle(result):
    assert result["model"] == "add_relu" and result["runs"] == 3 and result["warmup"] == 2
    assert result["inputs"] == [{"shape": [1, 8, 8, 4], "dtype": "float32"}]
    rows = {r["backend"]: r for r in result["rows"]}
    assert list(rows) == BACKENDS
    for row in rows.values():
        check_row(row)
        assert row["max_rel_diff"] is not None and row["max_rel_diff"] <= 1e-6, row
    assert result["oracle"] == BACKENDS[0]
    assert rows["cpu"]["launches_per_invoke"] == 1 and rows["cpu"]["ops_delegated"] == 1
    assert rows["cpu"]["ops_cpu"] == 0 and rows["cpu"]["partitions"] == 1
    assert rows["reference"]["ops_cpu"] == 1 and rows["reference"]["launches_per_invoke"] == 0
    if "litert" in rows:
        assert rows["litert"]["threads"] == 1 and "launches_per_invoke" not in rows["litert"]


def test_report_files(result, tmp_path):
    report = bench.make_report([result], "python bench/bench.py add_relu --runs 3",
                               bench.machine_info(), note="a test run")
    written = bench.write_report(report, str(tmp_path / "r"))
    md = (tmp_path / "r.md").read_text()
    assert "**Note:** a test run" in md and "python bench/bench.py add_relu --runs 3" in md
    assert "| model | backend | device | cold start s | warm start s | median ms | p10-p90 ms |" in md
    for b in BACKENDS:
        assert f"| add_relu | {b}" in md, md
    for name in ("python", "numpy", "taichi", "tflite-taichi"):
        assert f"{name} " in md.split("Versions:")[1].split("\n")[0]
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["results"][0]["rows"][0]["latency_ms"] == result["rows"][0]["latency_ms"]
    try:
        import matplotlib  # noqa: F401
        assert str(tmp_path / "r.png") in written and (tmp_path / "r.png").stat().st_size > 0
        assert "![median latency" in md
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
    header, row = printed.strip().splitlines()
    assert header.split()[:4] == ["model", "backend", "device", "cold"]
    assert row.split()[:2] == ["add_relu", "reference"]
    check_row(json.loads(out.read_text())["rows"][0])


@pytest.mark.skipif(sys.platform == "darwin", reason="Metal starts on macOS")
def test_a_backend_that_does_not_start_is_a_row_not_a_crash(model_path, capsys):
    assert main(["bench", model_path, "--backends", "reference", "metal", "--runs", "3",
                 "--warmup", "1"]) == 1
    captured = capsys.readouterr()
    assert "metal" in captured.out and "error: does not start here" in captured.out
    assert "Metal needs macOS" in captured.err


def test_unknown_backend_and_relative_diff():
    with pytest.raises(ValueError, match="unknown backend"):
        bench.check_backends(["reference", "tpu"])
    e = np.array([[1.0, -4.0]], np.float32)
    assert bench.relative_diff([e], [e]) == 0.0
    assert bench.relative_diff([e + np.float32(0.5)], [e]) == pytest.approx(0.125)
    assert bench.relative_diff([e[0]], [e]) == float("inf")
    assert bench.relative_diff([np.array([np.nan])], [np.array([1.0])]) == float("inf")
