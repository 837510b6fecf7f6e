"""A schedule on a GPU backend: delegated partitions, and between them the ops the delegate does
not take. Runs of those ops are islands on LiteRT's CPU kernels (tflite_taichi/litert_islands.py,
as TFLite's own kernels run what the official GPU delegate leaves), float and int8, held to
LiteRT's run of the whole model; ops LiteRT cannot run (a user's op), or a machine without
LiteRT, keep them on numpy, said in summary(). Vulkan on this machine (lavapipe), one fresh
process per case (one Taichi arch each)."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import plugin_ops  # noqa: F401  (CUSTOM:CpuOnlyAbs: our reference path has it, LiteRT does not)
from tflite_taichi.builder import ModelBuilder
from tflite_taichi.testing import assert_float_close, run_sequence

Q_X, Q_Y = (0.05, -3), (0.1, 2)       # int8 quantization of the input and of MUL's output


def topk_between_partitions(int8: bool = False, custom: bool = False) -> bytes:
    """x [2, 8] -> RELU (delegated) -> TOPK_V2 k=3 and ARG_MAX of its values (the CPU: an island
    of two ops) -> MUL 2 (delegated) -> y; the island's indices and arg-max are outputs too.
    `custom`: ABS as CUSTOM:CpuOnlyAbs first in the island (a kernel LiteRT lacks)."""
    b = ModelBuilder()
    g = b.subgraph()
    dtype, qx, qy = (np.int8, Q_X, Q_Y) if int8 else (np.float32, None, None)
    x = g.input("x", (2, 8), dtype, qx)
    r = g.tensor("r", (2, 8), dtype, qx)
    g.op("RELU", [x], [r])
    if custom:
        a = g.tensor("a", (2, 8), dtype, qx)
        g.op("CUSTOM:CpuOnlyAbs", [r], [a])
        r = a
    values = g.tensor("values", (2, 3), dtype, qx)
    idx = g.tensor("idx", (2, 3), np.int32)
    g.op("TOPK_V2", [r, g.const("k", np.array(3, np.int32))], [values, idx])
    am = g.tensor("am", (2,), np.int32)
    g.op("ARG_MAX", [values, g.const("axis", np.array(1, np.int32))], [am], output_type="INT32")
    two = g.const("two", np.array([2], np.int8) if int8 else np.float32(2),
                  quantization=(1.0, 0) if int8 else None)
    y = g.tensor("y", (2, 3), dtype, qy)
    g.op("MUL", [values, two], [y])
    g.output(y, idx, am)
    return b.finish()


RUN = r'''
import json, sys, warnings
import numpy as np
args = json.loads(sys.argv[1])
sys.path.insert(0, args["tests"])
import plugin_ops  # noqa: F401
if args.get("no_litert"):
    from tflite_taichi import litert_cpu
    litert_cpu.available = lambda: False
from tflite_taichi import Interpreter
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    it = Interpreter(model_path=args["model"], backend="vulkan", cache_dir=False,
                     max_delegated_partitions=2)    # RELU and MUL, the island between
    it.allocate_tensors()
xs = np.load(args["inputs"])
record = {"outputs": [], "paths": []}
for x in xs:
    it.set_tensor(it.get_input_details()[0]["index"], x)
    it.invoke()
    record["paths"].append(it.summary()["answered_by"])
    record["outputs"].append([it.get_tensor(d["index"]).tolist() for d in it.get_output_details()])
s = it.summary()
record["islands"] = s["litert_islands"]
record["runs_on"] = {f["op"]: f["runs_on"] for f in s["fallback"]}
record["delegated"] = s["ops_delegated"]
record["op_table"] = [row["runs_on"] for row in it.op_table()]
main_graph = list(it.node_data()["where"].values())[0]["results"]   # subgraph 0 first
record["node_data"] = [main_graph[str(op.index)]["value"] for op in it.model.main.operators]
if args.get("cli"):                 # `tflite-taichi run`'s headline says where they ran
    import contextlib, io
    from tflite_taichi.cli import main
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        main(["run", args["model"], "--backend", "vulkan"])
    record["cli"] = out.getvalue().splitlines()[0]
print("RESULT " + json.dumps(record), flush=True)
'''


def _run(tmp_path, model: bytes, xs, **options) -> dict:
    path = tmp_path / "model.tflite"
    path.write_bytes(model)
    np.save(tmp_path / "xs.npy", xs)
    proc = subprocess.run([sys.executable, "-c", RUN, json.dumps({
        "model": str(path), "inputs": str(tmp_path / "xs.npy"),
        "tests": os.path.dirname(__file__), **options})], capture_output=True, text=True,
        timeout=600, env={**os.environ, "ENABLE_TAICHI_HEADER_PRINT": "False"})
    lines = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-2000:] + proc.stderr[-3000:]
    return json.loads(lines[-1][len("RESULT "):])


def _litert(model: bytes, xs) -> list:
    from ai_edge_litert.interpreter import Interpreter as LiteRT
    return run_sequence(LiteRT(model_content=model), [[x] for x in xs])


def _inputs(int8: bool):
    rng = np.random.default_rng(7)
    if int8:        # distinct codes per row: TOPK's order is then the same on every path
        return np.stack([np.stack([rng.permutation(np.arange(-40, 40, 5, dtype=np.int8))[:8]
                                   for _ in range(2)]) for _ in range(3)])
    return rng.uniform(-1, 1, (3, 2, 8)).astype(np.float32)


@pytest.mark.parametrize("int8", [False, True])
def test_the_ops_between_partitions_run_on_litert_as_litert_runs_them(tmp_path, int8):
    model = topk_between_partitions(int8)
    xs = _inputs(int8)
    record = _run(tmp_path, model, xs, cli=not int8)
    assert record["islands"] == {"islands": [[1, 2]], "refused": None}, record["islands"]
    assert record["runs_on"] == {"TOPK_V2": "litert", "ARG_MAX": "litert"}
    assert record["op_table"] == ["delegate", "litert", "litert", "delegate"]
    assert record["node_data"] == ["partition 0 (vulkan)", "CPU (LiteRT)", "CPU (LiteRT)",
                                   "partition 1 (vulkan)"], record["node_data"]
    if not int8:    # one partition delegated (the default): MUL joins the island
        assert "1 of 4 ops on the delegate, 3 on the CPU (LiteRT's kernels: " in record["cli"], record["cli"]
    assert record["delegated"] == 2 and record["paths"] == ["delegate"] * 3
    for step, (ours, theirs) in enumerate(zip(record["outputs"], _litert(model, xs))):
        y, idx, am = (np.array(v, t.dtype) for v, t in zip(ours, theirs))
        np.testing.assert_array_equal(idx, theirs[1], err_msg=f"step {step}: TOPK's indices")
        np.testing.assert_array_equal(am, theirs[2], err_msg=f"step {step}: ARG_MAX")
        if int8:    # MUL on the delegate rounds its float view to the output's codes: one unit
            assert np.abs(y.astype(int) - theirs[0].astype(int)).max() <= 1, (step, y, theirs[0])
        else:
            assert_float_close(y, theirs[0], what=f"step {step}: y")


def test_an_op_litert_lacks_keeps_the_island_on_numpy_and_says_why(tmp_path):
    model = topk_between_partitions(custom=True)
    xs = _inputs(False)
    record = _run(tmp_path, model, xs)
    assert record["islands"]["islands"] == [], record["islands"]
    assert "CpuOnlyAbs" in record["islands"]["refused"], record["islands"]
    assert set(record["runs_on"].values()) == {"numpy"}
    assert record["op_table"] == ["delegate", "numpy", "numpy", "numpy", "delegate"]
    assert record["node_data"][1:4] == ["CPU"] * 3, record["node_data"]
    reference = [np.abs(np.maximum(x, 0)) for x in xs]
    for step, (ours, x) in enumerate(zip(record["outputs"], reference)):
        top = -np.sort(-x, axis=1)[:, :3]
        assert_float_close(np.array(ours[0], np.float32), top * 2, what=f"step {step}")


def test_without_litert_the_ops_between_partitions_run_on_numpy(tmp_path):
    model = topk_between_partitions()
    xs = _inputs(False)
    record = _run(tmp_path, model, xs, no_litert=True)
    assert record["islands"] == {"islands": [], "refused": None}
    assert set(record["runs_on"].values()) == {"numpy"}
    for step, (ours, theirs) in enumerate(zip(record["outputs"], _litert(model, xs))):
        np.testing.assert_array_equal(np.array(ours[1], np.int32), theirs[1])
        assert_float_close(np.array(ours[0], np.float32), theirs[0], what=f"step {step}")
