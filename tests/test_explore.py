"""What the delegate did, drawn in Google's Model Explorer (issue 34): the node data of
`Interpreter.node_data()` and `tflite-taichi inspect --node-data / --explore`.

- The JSON parses with Model Explorer's own node-data classes and round-trips through them
  unchanged; every op of every subgraph of the shared models has an entry in every overlay, and
  every graph and node id is one that Model Explorer's TFLite adapter gives that model.
- The overlays say what the delegate did: partitions, the CPU with its reason, folded ops, the
  fusion groups codegen made, and with profile=True a time per op (an op fused into another
  shows its group's time).
- `--node-data` needs no Model Explorer; `--explore` without it says how to get it.
- Model Explorer's server, started on 127.0.0.1 with a model and our node data, answers its
  HTTP API with both (bounded in time).
"""
import json
import os
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request

import numpy as np
import pytest

from tflite_taichi import Interpreter
from tflite_taichi.node_data import OVERLAYS, graph_ids
from tflite_taichi.testing import model_random_inputs

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = ["face_detection_short_range", "hand_landmark_lite", "iris_landmark", "mobilenet_v1_int8",
          "okay_nabu", "selfie_segmentation"]
# Taichi's CPU backend: the delegate's real partitions and fusions, compiled on this machine
DELEGATED = ["face_detection_short_range", "okay_nabu"]


def adapter_graphs(path: str) -> dict:
    """graph id -> {node id: label} as Model Explorer's own TFLite adapter draws the model."""
    from model_explorer.builtin_tflite_flatbuffer_adapter import BuiltinTfliteFlatbufferAdapter
    collection = BuiltinTfliteFlatbufferAdapter().convert(path, {})["graphCollections"][0]
    return {g["id"]: {n["id"]: n["label"] for n in g["nodes"]} for g in collection.graphs}


def _adapter_label(op_name: str) -> str:
    """The adapter's label of an op: a builtin's name in lower case, a custom op's code."""
    return op_name[len("CUSTOM:"):] if op_name.startswith("CUSTOM:") else op_name.lower()


def round_trip(overlay: dict) -> dict:
    """The overlay through Model Explorer's node-data classes and back to JSON."""
    from model_explorer import node_data_builder as ndb
    graphs = {}
    for graph_id, data in overlay.items():
        fields = dict(data)
        fields["results"] = {k: ndb.NodeDataResult(**r) for k, r in data["results"].items()}
        fields["gradient"] = [ndb.GradientItem(**g) for g in data.get("gradient", [])]
        fields["thresholds"] = [ndb.ThresholdItem(**t) for t in data.get("thresholds", [])]
        graphs[graph_id] = ndb.GraphNodeData(**fields)
    return json.loads(ndb.ModelNodeData(graphsData=graphs).to_json_string())


def _invoke(it, times: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    for _ in range(times):
        for d, x in zip(it.get_input_details(), model_random_inputs(it, rng)):
            it.set_tensor(d["index"], x)
        it.invoke()


@pytest.mark.parametrize("name", SHARED)
def test_every_op_has_an_entry_with_the_adapters_ids(shared_models, name):
    path = os.path.join(shared_models, f"{name}.tflite")
    it = Interpreter(model_path=path, backend="cpu" if name in DELEGATED else "reference")
    it.allocate_tensors()
    data = it.node_data()
    graphs = adapter_graphs(path)
    model = it.model
    assert set(data) == {"where", "why", "fusion"}
    assert graph_ids(model) == list(graphs)         # the same graphs, in subgraph order
    for overlay in data.values():
        parsed = round_trip(overlay)
        for graph_id, ours in overlay.items():     # what we wrote is what their classes hold
            for key, value in ours.items():
                assert parsed[graph_id][key] == value, (graph_id, key)
        assert set(overlay) == set(graphs)
        for sg, graph_id in zip(model.subgraphs, graph_ids(model)):
            ids = set(overlay[graph_id]["results"])
            assert ids == {str(op.index) for op in sg.operators}       # every op, nothing else
            assert ids <= set(graphs[graph_id])                          # no foreign id
            for op in sg.operators:     # the adapter's node of that id is that op
                assert graphs[graph_id][str(op.index)] == _adapter_label(op.name), (graph_id, op.index)


def test_unnamed_subgraphs_get_the_adapters_ids(tmp_path):
    """Model Explorer names an unnamed first subgraph "main" and another "subgraph_<i>"; a
    subgraph nothing calls is never prepared, and says so."""
    from tflite_taichi.builder import ModelBuilder
    builder = ModelBuilder()
    for _ in range(3):
        sg = builder.subgraph()
        sg.name = ""
        x, y = sg.input("x", (1, 4)), sg.tensor("y", (1, 4))
        sg.op("RELU", [x], [y])
        sg.output(y)
    path = tmp_path / "unnamed.tflite"
    path.write_bytes(builder.finish())
    it = Interpreter(model_path=str(path), backend="reference")
    it.allocate_tensors()
    data = it.node_data()
    assert list(adapter_graphs(str(path))) == graph_ids(it.model) == ["main", "subgraph_1", "subgraph_2"]
    assert list(data["where"]) == ["main", "subgraph_1", "subgraph_2"]
    assert data["where"]["main"]["results"]["0"]["value"] == "CPU"
    assert data["where"]["subgraph_2"]["results"]["0"]["value"] == "not prepared"


def test_the_overlays_say_what_the_delegate_did(shared_models):
    it = Interpreter(model_path=os.path.join(shared_models, "okay_nabu.tflite"), backend="cpu")
    it.allocate_tensors()
    summary, data = it.summary(), it.node_data()
    where, why, fusion = (data[k]["main"]["results"] for k in ("where", "why", "fusion"))
    for op in summary["partitions"][0]["ops"]:
        assert where[str(op)]["value"] == "partition 0 (cpu)"
    for row in summary["fallback"]:
        assert where[str(row["index"])]["value"] == "CPU"
        assert why[str(row["index"])]["value"] == row["reason"]
    for row in summary["folded"]:
        assert where[str(row["index"])]["value"] == "folded at prepare"
    names = {op.index: op.name for op in it.model.main.operators}
    for producer, op in summary["partitions"][0]["fused"]:      # an epilogue: its producer's group
        assert fusion[str(op)] == fusion[str(producer)]
        head = int(fusion[str(op)]["value"].split()[0][1:])      # "#58 FULLY_CONNECTED (+2 fused)"
        assert fusion[str(op)]["value"].startswith(f"#{head} {names[head]} (+")
        assert fusion[str(head)] == fusion[str(op)]
    assert summary["partitions"][0]["fused"], "okay_nabu fuses nothing: pick a model that does"
    # the init subgraph (CALL_ONCE's) has its own graph and entries
    assert set(data["where"]["NoOp"]["results"]) == {str(op.index) for op in it.model.subgraphs[1].operators}


def test_profiled_times_per_op_and_group(shared_models):
    it = Interpreter(model_path=os.path.join(shared_models, "okay_nabu.tflite"), backend="cpu",
                     profile=True)
    it.allocate_tensors()
    assert "time" not in it.node_data()                 # nothing timed yet
    _invoke(it, 3)
    data, summary, profile = it.node_data(), it.summary(), it.profile()
    times = data["time"]["main"]["results"]
    assert data["time"]["main"]["gradient"]
    kernels = [k for row in profile["items"] if row["kind"] == "partition" for k in row["kernels"]]
    assert kernels and all(k["ms"] is not None and k["ms"] > 0 for k in kernels)
    for kernel in kernels:                  # each op of a kernel shows the kernel's time
        for op in kernel["ops"]:
            assert times[str(op)]["value"] == pytest.approx(kernel["ms"] * 1e3, abs=1e-3)
    for producer, op in summary["partitions"][0]["fused"]:      # fused: its group's time
        assert times[str(op)]["value"] == times[str(producer)]["value"]
    for row in profile["items"]:
        if row["kind"] == "cpu":
            assert times[str(row["ops"][0])]["value"] == pytest.approx(row["ms"] * 1e3, abs=1e-3)
    for row in summary["folded"]:
        assert times[str(row["index"])]["value"] == 0


def _cli(args, env=None, timeout=600):
    return subprocess.run([sys.executable, "-m", "tflite_taichi", *args], capture_output=True,
                          text=True, timeout=timeout, env=env)


def _without_model_explorer(tmp_path) -> dict:
    """An environment in which `import model_explorer` fails, as where it is not installed."""
    shadow = tmp_path / "shadow"
    shadow.mkdir()
    (shadow / "model_explorer.py").write_text("raise ImportError('not installed (a test)')\n")
    return dict(os.environ, PYTHONPATH=os.pathsep.join([str(shadow), ROOT]))


def test_node_data_needs_no_model_explorer(shared_models, tmp_path):
    env = _without_model_explorer(tmp_path)
    model = os.path.join(shared_models, "okay_nabu.tflite")
    out = tmp_path / "nabu.json"
    run = _cli(["inspect", model, "--node-data", str(out), "--backend", "reference"], env=env)
    assert run.returncode == 0, run.stderr[-2000:]
    for name in ("where", "why", "fusion"):
        path = str(out) if name == "where" else str(tmp_path / f"nabu.{name}.json")
        assert f"node data ({name}): {path}" in run.stdout
        with open(path) as f:
            assert set(json.load(f)) == {"main", "NoOp"}
    explore = _cli(["inspect", model, "--explore"], env=env)
    assert explore.returncode == 2
    assert 'pip install "tflite-taichi[explore]"' in explore.stderr
    assert "--node-data FILE" in explore.stderr


def test_inspect_refuses_explore_flags_alone(shared_models):
    run = _cli(["inspect", os.path.join(shared_models, "okay_nabu.tflite"), "--profile"])
    assert run.returncode == 2 and "--profile: only with --explore or --node-data" in run.stderr


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


SERVER = """
import json, sys
from tflite_taichi.tools import explore
with open(sys.argv[2]) as f:
    data = json.load(f)
explore.serve(sys.argv[1], data, port=int(sys.argv[3]), open_browser=False)
"""


def _get(url: str, timeout: float = 30) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as r:     # noqa: S310 (127.0.0.1)
        return r.read()


def test_model_explorers_server_answers_with_the_model_and_the_node_data(shared_models, tmp_path):
    model = os.path.join(shared_models, "face_detection_short_range.tflite")
    it = Interpreter(model_path=model, backend="reference")
    it.allocate_tensors()
    data = it.node_data()
    data_path = tmp_path / "data.json"
    data_path.write_text(json.dumps(data))
    port = _free_port()
    server = subprocess.Popen([sys.executable, "-c", SERVER, model, str(data_path), str(port)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                if _get(f"{base}/check_health", timeout=5) == b"model_explorer_ok":
                    break
            except OSError:
                pass
            assert server.poll() is None, server.stdout.read()[-2000:]
            assert time.monotonic() < deadline, "Model Explorer's server did not answer in 90 s"
            time.sleep(0.5)
        command = {"extensionId": "builtin_tflite_flatbuffer", "cmdId": "convert",
                   "modelPath": model, "settings": {}, "deleteAfterConversion": False}
        graphs = json.loads(_get(f"{base}/api/v1/send_command?json="
                                 + urllib.parse.quote(json.dumps(command))))
        graph = graphs["graphCollections"][0]["graphs"][0]
        assert graph["id"] == graph_ids(it.model)[0]
        ops = {n["id"] for n in graph["nodes"] if n["label"] not in ("GraphInputs", "GraphOutputs", "pseudo_const")}
        assert ops == set(data["where"][graph["id"]]["results"])
        served = [json.loads(json.loads(_get(f"{base}/api/v1/load_node_data?node_data_index={i}"))["content"])
                  for i in range(len(data))]
        assert served == [data[name] for name in data]          # each overlay, as we gave it
        assert [OVERLAYS[name] for name in data] == [d[graph["id"]]["name"] for d in served]
    finally:
        server.kill()
        server.wait(timeout=30)


@pytest.mark.parametrize("backend", ["vulkan", "opengl"])
def test_profile_times_each_kernel_on_the_gpu_apis(shared_models, tmp_path, backend):
    """`--profile` on lavapipe / llvmpipe: a wait after every kernel (our own Vulkan command
    buffers included), and a time for every op of the partition."""
    out = tmp_path / "nabu.json"
    run = _cli(["inspect", os.path.join(shared_models, "okay_nabu.tflite"), "--node-data", str(out),
                "--backend", backend, "--profile"],
               env=dict(os.environ, EGL_PLATFORM=os.environ.get("EGL_PLATFORM", "surfaceless")))
    assert run.returncode == 0, run.stderr[-2000:]
    with open(out) as f:
        where = json.load(f)["main"]["results"]
    with open(tmp_path / "nabu.time.json") as f:
        times = json.load(f)["main"]["results"]
    with open(tmp_path / "nabu.fusion.json") as f:
        fusion = json.load(f)["main"]["results"]
    working = [node for node, r in where.items() if r["value"].startswith("partition")
               and not fusion[node]["value"].startswith("no work of its own")]
    assert len(working) > 40
    # every op with work of its own has its kernel's time (a reshape addressing its input: none)
    assert all(times[node]["value"] > 0 for node in working), {n: times[n] for n in working}
