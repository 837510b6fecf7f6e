"""What the delegate did, drawn in Google's Model Explorer: the node data of
`Interpreter.node_data()` and `tflite-taichi inspect --node-data / --explore`.

- The JSON parses with Model Explorer's own node-data classes and round-trips through them
  unchanged; every op of every subgraph of the shared models has an entry in every overlay, and
  every graph and node id is one that Model Explorer's TFLite adapter gives that model.
- The overlays say what the delegate did: partitions, the CPU with its reason, folded ops, the
  fusion groups codegen made, and with profile=True a time per op (an op fused into another
  shows its group's time).
- `--node-data` needs no Model Explorer; `--explore` without it says how to get it.
- `--explore` serves Model Explorer's UI on 127.0.0.1 with the model and our node data, to the
  holder of the printed address's token alone: a foreign Host header, a request without the
  token, another local user, reading any other file, uploads and converting another path are
  refused.
- Two or more partitions are numbered and coloured apart, each op in its own.
"""
import contextlib
import http.client
import http.cookies
import json
import os
import pathlib
import queue
import shutil
import socket
import stat
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
import warnings
from typing import Optional

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


def _partitioned_model(partitions: int) -> bytes:
    """x -> [ADD, RELU] -> CpuOnlyAbs -> [ADD, RELU] -> CpuOnlyAbs -> ... : `partitions` runs of
    two delegated ops, each pair apart from the next by an op the delegate cannot take."""
    from tflite_taichi.builder import ModelBuilder
    builder = ModelBuilder()
    sg = builder.subgraph()
    c = sg.const("c", np.linspace(-1, 1, 4).astype(np.float32))
    t = sg.input("x", (1, 4))
    for k in range(partitions):
        if k:
            t = _op(sg, "CUSTOM:CpuOnlyAbs", [t], f"abs{k}")
        t = _op(sg, "RELU", [_op(sg, "ADD", [t, c], f"add{k}")], f"relu{k}")
    sg.output(t)
    return builder.finish()


def _op(sg, name, inputs, output):
    out = sg.tensor(output, (1, 4))
    sg.op(name, inputs, [out])
    return out


@pytest.mark.parametrize("partitions", [2, 8])     # 8: more than node_data's palette of colours
def test_each_partition_has_its_own_number_and_colour(partitions):
    import plugin_ops  # noqa: F401  (registers CUSTOM:CpuOnlyAbs, which the delegate cannot take)
    from tflite_taichi.node_data import CPU_COLOR
    from tflite_taichi.partition import DelegateWarning
    with pytest.warns(DelegateWarning):
        it = Interpreter(model_content=_partitioned_model(partitions), backend="cpu",
                         max_delegated_partitions=partitions)
        it.allocate_tensors()
    summary = it.summary()
    where = it.node_data()["where"]["main"]["results"]
    assert len(summary["partitions"]) == partitions, summary["partitions"]
    colors = []
    for number, partition in enumerate(summary["partitions"]):
        assert len(partition["ops"]) == 2, partition
        for op in partition["ops"]:         # every op of partition `number` says so
            assert where[str(op)]["value"] == f"partition {number} (cpu)", (op, where[str(op)])
        colors.append(where[str(partition["ops"][0])]["bgColor"])
        assert {where[str(op)]["bgColor"] for op in partition["ops"]} == {colors[-1]}
    assert len(set(colors)) == partitions and CPU_COLOR not in colors, colors
    for row in summary["fallback"]:
        assert where[str(row["index"])] == {"value": "CPU", "bgColor": CPU_COLOR}
    assert len(where) == len(it.model.main.operators) == 3 * partitions - 1


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


# Model Explorer's UI through our server (tools/explore_server.py). Every request goes to
# 127.0.0.1, a handful per test, each bounded by REQUEST_TIMEOUT.
REQUEST_TIMEOUT = 60


def _request(port: int, path: str, *, host: Optional[str] = None, cookie: Optional[str] = None,
             method: str = "GET", body: Optional[bytes] = None, headers: Optional[dict] = None):
    """(status, body) of one request to 127.0.0.1:PORT with this Host header and cookie."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=REQUEST_TIMEOUT)
    try:
        sent = {"Host": host or f"127.0.0.1:{port}", **(headers or {})}
        if cookie is not None:
            sent["Cookie"] = cookie
        conn.request(method, path, body=body, headers=sent)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


@contextlib.contextmanager
def _served(model: str, data: dict):
    """Our server on the model and its overlays, on a free port of 127.0.0.1, in a thread."""
    from tflite_taichi.tools import explore
    server = explore.start_server(model, data, port=0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        thread.join(timeout=REQUEST_TIMEOUT)


def _entry(server) -> str:
    """The path of the address the user is given (the token in its query)."""
    return server.url[len(f"http://127.0.0.1:{server.port}"):]


def _cookie(server) -> str:
    """The cookie that the answer to the user's address sets."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=REQUEST_TIMEOUT)
    try:
        conn.request("GET", _entry(server), headers={"Host": f"127.0.0.1:{server.port}"})
        response = conn.getresponse()
        response.read()
        assert response.status == 200
        jar = http.cookies.SimpleCookie(response.getheader("Set-Cookie") or "")
    finally:
        conn.close()
    (name, morsel), = jar.items()
    assert morsel["httponly"] and morsel["samesite"] == "Strict", morsel.OutputString()
    return f"{name}={morsel.value}"


def _convert(model: str, delete: bool = False) -> bytes:
    return json.dumps({"extensionId": "builtin_tflite_flatbuffer", "cmdId": "convert",
                       "modelPath": model, "settings": {}, "deleteAfterConversion": delete}).encode()


JSON = {"Content-Type": "application/json"}


@pytest.fixture
def served_nabu(shared_models):
    """okay_nabu with its node data (backend='reference'), served; its overlays."""
    model = os.path.join(shared_models, "okay_nabu.tflite")
    it = Interpreter(model_path=model, backend="reference")
    it.allocate_tensors()
    data = it.node_data()
    with _served(model, data) as server:
        yield server, model, data


def test_the_server_answers_only_its_loopback_names(served_nabu):
    """A page that rebinds its own name to 127.0.0.1 sends that name as the Host: refused."""
    server, _, _ = served_nabu
    cookie, port = _cookie(server), server.port
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}"):
        assert _request(port, "/check_health", host=host, cookie=cookie) == (200, b"model_explorer_ok")
    for host in (f"attacker.example:{port}", "attacker.example", f"127.0.0.1:{port + 1}",
                 f"localhost.attacker.example:{port}", "127.0.0.1"):
        for path in ("/check_health", "/api/v1/load_node_data?node_data_index=0", _entry(server)):
            status, body = _request(port, path, host=host, cookie=cookie)
            assert status == 403 and b"not this server's loopback address" in body, (host, path, body)


def test_the_server_wants_the_token(served_nabu):
    """Without the token of the printed address (or the cookie it sets), nothing; with it, all."""
    server, model, _ = served_nabu
    cookie, port = _cookie(server), server.port
    name = cookie.split("=")[0]
    paths = ["/", "/index.html", "/check_health", "/api/v1/get_extensions",
             "/api/v1/load_node_data?node_data_index=0",
             "/api/v1/send_command?json=" + urllib.parse.quote(_convert(model).decode())]
    for path in paths:
        assert _request(port, path, cookie=cookie)[0] == 200, path
        for wrong in (None, f"{name}=", f"{name}={server.token[:-1]}", f"{name}={server.token}x",
                      f"tflite_taichi_explore_{port + 1}={server.token}"):
            status, body = _request(port, path, cookie=wrong)
            assert status == 403 and b"no valid token" in body, (path, wrong, body[:200])
        joiner = "&" if "?" in path else "?"
        assert _request(port, f"{path}{joiner}token=not-it")[0] == 403, path
    status, body = _request(port, "/apipost/v1/send_command", method="POST", body=_convert(model),
                            headers=JSON)
    assert status == 403 and b"no valid token" in body


def test_no_other_file_no_upload_even_with_the_token(served_nabu, shared_models, tmp_path):
    server, model, _ = served_nabu
    cookie, port = _cookie(server), server.port
    secret = tmp_path / "secret.txt"
    secret.write_text("not for the browser")
    other_dir = tmp_path / "other"
    other_dir.mkdir()
    other = other_dir / "iris_landmark.tflite"
    shutil.copyfile(os.path.join(shared_models, "iris_landmark.tflite"), other)
    refused = [
        ("GET", f"/api/v1/read_text_file?path={secret}", None),
        ("GET", f"/api/v1/read_text_file?path={model}", None),
        ("GET", f"/api/v1/send_command?json={urllib.parse.quote(_convert(str(other)).decode())}", None),
        ("POST", "/apipost/v1/send_command", _convert(str(other), delete=True)),
        ("POST", "/apipost/v1/send_command", _convert(model + ".json")),
        ("POST", "/apipost/v1/send_command", json.dumps({"extensionId": "builtin_json", "cmdId": "convert",
                                                         "modelPath": str(secret)}).encode()),
        ("POST", "/apipost/v1/upload", b"--b\r\nContent-Disposition: form-data; name=\"file\"; "
                                       b"filename=\"x.tflite\"\r\n\r\nbytes\r\n--b--\r\n"),
        ("POST", "/apipost/v1/update_config", json.dumps({"model_sources": [{"url": str(secret)}]}).encode()),
        ("GET", "/api/v1/load_graphs_json?graph_index=0", None),
        ("GET", "/api/v1/load_node_data?node_data_index=99", None),
        ("GET", "/%2e%2e/server.py", None),                  # the package's own source
        ("GET", "/static_files/../../server.py", None),
        ("GET", f"/{'..%2f' * 12}{str(secret).lstrip('/')}", None),
    ]
    for method, path, body in refused:
        headers = ({"Content-Type": "multipart/form-data; boundary=b"} if "upload" in path else JSON)
        status, answer = _request(port, path, cookie=cookie, method=method, body=body, headers=headers)
        assert status in (403, 404), (method, path, status, answer[:300])
        assert b"not for the browser" not in answer and b"graphCollections" not in answer, (path, answer[:300])
        assert b"import" not in answer, (path, answer[:300])      # no Python source of the package
    status, answer = _request(port, "/apipost/v1/send_command", cookie=cookie, method="POST",
                              body=_convert(model, delete=True), headers=JSON)
    assert status == 200 and b"graphCollections" in answer          # ours, as the UI asks
    assert secret.read_text() == "not for the browser" and other.exists()


def test_a_taken_port_is_an_input_error_naming_it(shared_models):
    from tflite_taichi.errors import InputError
    from tflite_taichi.tools import explore
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(InputError, match=f"--port {port}: 127.0.0.1:{port}: cannot serve"):
            explore.start_server(os.path.join(shared_models, "okay_nabu.tflite"), {}, port=port)


def test_the_browser_is_given_a_page_only_this_user_can_read(monkeypatch):
    """The browser opens a file holding the address: another user would read the token in a
    browser's command line, as in `ps`, if it were given the address itself."""
    import webbrowser
    from tflite_taichi.tools import explore
    opened = []
    monkeypatch.setattr(webbrowser, "open_new_tab", opened.append)
    url = "http://127.0.0.1:8080/?data=%7B%7D&token=abc-DEF_123"
    page = explore.open_in_browser(url)
    try:
        assert opened == [pathlib.Path(page).as_uri()] and "abc-DEF_123" not in opened[0]
        assert stat.S_IMODE(os.stat(page).st_mode) == 0o600
        with open(page, encoding="utf-8") as f:
            assert f'content="0;url={url}"' in f.read().replace("&amp;", "&")
    finally:
        os.remove(page)


NOBODY = 65534


def _ask_as_another_user(port: int, secret: str, model: str) -> dict:
    """What a client running as another user (nobody, where the tests run as root, as in CI; this
    user otherwise) gets from the server: a forked child (no interpreter to exec that nobody may
    not be able to reach) drops to that user and asks for a file, the node data, the model's
    graphs and the UI's page, under each loopback name."""
    command = json.dumps({"extensionId": "builtin_tflite_flatbuffer", "cmdId": "convert",
                          "modelPath": model, "settings": {}, "deleteAfterConversion": False})
    asks = [("GET", "/api/v1/read_text_file?path=" + secret, None),
            ("GET", "/api/v1/load_node_data?node_data_index=0", None),
            ("POST", "/apipost/v1/send_command", command), ("GET", "/", None)]
    read_end, write_end = os.pipe()
    with warnings.catch_warnings():     # the child only makes requests: no lock of another thread
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:                        # the child: leaves through os._exit whatever happens
        try:
            os.close(read_end)
            try:
                report = _ask(port, asks)
            except BaseException as e:  # noqa: BLE001 (reported to the parent, which fails)
                report = {"error": repr(e)}
            os.write(write_end, json.dumps(report).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as f:
        out = f.read()
    os.waitpid(pid, 0)
    return json.loads(out)


def _ask(port: int, asks) -> dict:
    """In the forked child: become nobody (where root), then ask."""
    if os.geteuid() == 0:
        os.setgroups([])
        os.setgid(NOBODY)
        os.setuid(NOBODY)
    answers = []
    for name in ("127.0.0.1", "localhost"):
        for method, path, body in asks:
            status, answer = _request(port, path, host=f"{name}:{port}", method=method, body=body,
                                      headers=JSON)
            answers.append([path, status, answer.decode("utf-8", "replace")[:300]])
    return {"uid": os.getuid(), "answers": answers}


def test_another_local_user_gets_nothing(served_nabu, tmp_path):
    """Another user on the machine, who can connect to 127.0.0.1 too, cannot read a file through
    the server (one only root can read, here), nor get the model or its node data."""
    server, model, _ = served_nabu
    secret = tmp_path / "only_root.txt"
    secret.write_text("root's secret")
    os.chmod(secret, 0o600)
    report = _ask_as_another_user(server.port, str(secret), model)
    assert "error" not in report, report
    assert report["uid"] == (NOBODY if os.geteuid() == 0 else os.getuid())
    assert len(report["answers"]) == 8
    for path, status, body in report["answers"]:
        assert status == 403 and "no valid token" in body, (path, status, body)
        assert "root's secret" not in body and "graphCollections" not in body


def _output_lines(process):
    """The process's stdout, line by line, read in a thread (so a wait for a line is bounded):
    the queue of lines (None at its end) and the thread."""
    lines: queue.Queue = queue.Queue()

    def read():
        for line in process.stdout:
            lines.put(line)
        lines.put(None)
    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    return lines, reader


def _printed_address(process, lines, timeout: float) -> str:
    """The address `inspect --explore --no-browser` prints (its own line), within `timeout`."""
    deadline, seen = time.monotonic() + timeout, []
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
        except queue.Empty:
            break
        if line is None:
            raise AssertionError(f"exited {process.wait()}: {''.join(seen)[-2000:]}")
        seen.append(line)
        if line.startswith("http://127.0.0.1:"):
            return line.strip()
    raise AssertionError(f"no address in {timeout:.0f} s: {''.join(seen)[-2000:]}")


def test_inspect_explore_serves_the_model_and_the_node_data(shared_models):
    """`inspect --explore` as a user runs it: the printed address (its token) opens the UI, and
    the API calls the UI makes answer with the model's graphs and our overlays."""
    model = os.path.join(shared_models, "face_detection_short_range.tflite")
    it = Interpreter(model_path=model, backend="reference")
    it.allocate_tensors()
    data = it.node_data()
    cli = subprocess.Popen([sys.executable, "-m", "tflite_taichi", "inspect", model, "--explore",
                            "--no-browser", "--port", "0", "--backend", "reference"],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines, reader = _output_lines(cli)
    try:
        url = urllib.parse.urlsplit(_printed_address(cli, lines, timeout=300))
        query = urllib.parse.parse_qs(url.query)
        assert set(query) == {"data", "token"}
        shown = json.loads(query["data"][0])        # what the UI loads: the model and the overlays
        assert shown["models"] == [{"url": model, "adapterId": "builtin_tflite_flatbuffer"}]
        assert len(shown["nodeData"]) == len(data)
        port = url.port
        opened = urllib.request.build_opener(urllib.request.HTTPCookieProcessor())

        def get(path, body=None):
            request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=body,
                                             headers=JSON if body else {})
            with opened.open(request, timeout=REQUEST_TIMEOUT) as r:   # noqa: S310 (127.0.0.1)
                return r.read()
        assert b"<app-root" in get(f"/?{url.query}")    # the UI's page; its cookie from now on
        assert get("/check_health") == b"model_explorer_ok"
        adapters = json.loads(get("/api/v1/get_extensions"))
        assert [a["id"] for a in adapters] == ["builtin_tflite_flatbuffer"]
        graphs = json.loads(get("/apipost/v1/send_command", _convert(model)))   # as the UI asks
        graph = graphs["graphCollections"][0]["graphs"][0]
        assert graph["id"] == graph_ids(it.model)[0]
        ops = {n["id"] for n in graph["nodes"] if n["label"] not in ("GraphInputs", "GraphOutputs", "pseudo_const")}
        assert ops == set(data["where"][graph["id"]]["results"])
        served = [json.loads(json.loads(get(f"/api/v1/load_node_data?node_data_index={i}"))["content"])
                  for i in range(len(data))]
        assert served == [data[name] for name in data]          # each overlay, as we gave it
        assert [OVERLAYS[name] for name in data] == [d[graph["id"]]["name"] for d in served]
    finally:
        cli.kill()
        cli.wait(timeout=REQUEST_TIMEOUT)
        reader.join(timeout=REQUEST_TIMEOUT)       # the pipe's end, now the CLI is gone
        cli.stdout.close()


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
