"""`auto` on a machine with a GPU measures both sides and runs a model where it answers sooner
(tflite_taichi/auto_choice.py): the choice itself, from step times; the whole loop on this
machine's Vulkan (Mesa's lavapipe, a software device, where LiteRT's CPU kernels are ~100x
faster on the demo model: 0.05 ms against 8 ms a step), with `auto` told that Vulkan is the best
GPU; the choice kept in the kernel cache and taken by the next process from its start; and a
record that is not well-formed, ignored. Each run is a fresh process (one Taichi arch each)."""
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from tflite_taichi.auto_choice import (GPU_MAX_STEPS, GPU_SECONDS, GPU_STEPS, LITERT_STEPS, Choice,
                                        Chooser, from_record)
from cases.scatter import text_classifier
from cases.state import ring_buffer_model
from tflite_taichi.model import read_model
from tflite_taichi.testing import assert_float_close, run_sequence
from tflite_taichi.tools import zoo
from tflite_taichi.tools.demo import build_demo_model


# -- the choice, from step times --------------------------------------------------------------
def _chooser(litert_s, gpu_s):
    chooser = Chooser()
    for s in litert_s:
        chooser.add("litert", s)
    for s in gpu_s:
        chooser.add("delegate", s)
    return chooser


def test_the_faster_median_wins_and_the_gpus_first_step_is_left_out():
    # the GPU's first invoke (pipelines made, constants uploaded) would lose it the choice:
    # with it the median is 3 ms, without it 2 ms, against LiteRT's 2.5 ms
    chooser = _chooser([2.5e-3] * LITERT_STEPS, [5.0, 1e-3, 1e-3, 3e-3, 0.3])
    assert chooser.gpu_timed() and chooser.litert_missing() == 0
    choice = chooser.decide()
    assert choice.runs_on == "gpu" and choice.gpu_ms == pytest.approx(2.0)
    assert _chooser([1e-5] * 3, [1e-3] * GPU_STEPS).decide().runs_on == "litert"
    assert _chooser([1e-3] * 3, [1e-3] * GPU_STEPS).decide().runs_on == "gpu"     # a tie: the GPU
    assert _chooser([1e-3], [1e-3] * 2).litert_missing() == LITERT_STEPS - 1
    assert not _chooser([], [1e-3] * (GPU_STEPS - 1)).gpu_timed()


def test_the_gpu_is_timed_until_its_clocks_are_up():
    """A GPU that idled runs its first milliseconds at its idle clock: its steps count until
    they add up to GPU_SECONDS, and the choice takes the last ones. Here its first steps (4 ms,
    slower than LiteRT's 2 ms) would lose it the choice; at its clocks (1 ms) it wins."""
    chooser = _chooser([2e-3] * LITERT_STEPS, [5.0] + [4e-3] * (GPU_STEPS - 1))
    assert not chooser.gpu_timed()          # 16 ms of work: the clocks are not up yet
    for _ in range(int(GPU_SECONDS / 1e-3)):
        chooser.add("delegate", 1e-3)
    assert chooser.gpu_timed()
    choice = chooser.decide()
    assert choice.runs_on == "gpu" and choice.gpu_ms == pytest.approx(1.0), choice
    # the slow steps are as many as the fast: the last ones decide, not the median of all
    ramp = _chooser([2e-3] * LITERT_STEPS, [5.0] + [0.1] * 4 + [1e-3] * (GPU_STEPS - 1))
    assert ramp.gpu_timed() and ramp.decide().runs_on == "gpu"
    endless = _chooser([], [1e-6] * GPU_MAX_STEPS)      # a step too short to add up: a cap
    assert endless.gpu_timed()


def test_other_answers_do_not_count_and_a_made_choice_is_final():
    chooser = _chooser([], [])
    chooser.add("reference", 1.0)               # numpy answered: neither side's step
    assert chooser.litert == [] and chooser.gpu == []
    chooser = _chooser([1e-5] * 3, [1e-3] * GPU_STEPS)
    made = chooser.decide()
    chooser.add("delegate", 0.0)
    assert chooser.choice is made and len(chooser.gpu) == GPU_STEPS


@pytest.mark.parametrize("record", [
    None, [], "litert", {"runs_on": "cpu", "litert_ms": 1, "gpu_ms": 2},
    {"runs_on": "litert", "litert_ms": "1", "gpu_ms": 2}, {"runs_on": "litert", "litert_ms": 1},
    {"runs_on": "litert", "litert_ms": float("nan"), "gpu_ms": 2},
    {"runs_on": "litert", "litert_ms": 1, "gpu_ms": float("inf")},
    {"runs_on": "litert", "litert_ms": -1, "gpu_ms": 2},
    {"runs_on": "litert", "litert_ms": True, "gpu_ms": 2}])
def test_a_record_that_is_not_well_formed_is_no_choice(record):
    assert from_record(record) is None


def test_a_well_formed_record_is_a_cached_choice():
    choice = from_record({"runs_on": "litert", "litert_ms": 0.05, "gpu_ms": 8})
    assert choice == Choice("litert", 0.05, 8.0, how="cached")
    assert from_record(Choice("gpu", 1, 2).as_record()) == Choice("gpu", 1.0, 2.0, how="cached")


# -- the whole loop on lavapipe ---------------------------------------------------------------
RUN = r'''
import json, sys, warnings
import numpy as np
args = json.loads(sys.argv[1])
from tflite_taichi import backend as ti_backend
ti_backend.choose_auto = lambda *a, **k: "vulkan"   # as where Vulkan is the best GPU
from tflite_taichi import auto_choice
auto_choice.GPU_SECONDS = 0.0       # as a GPU at its clocks: the choice after GPU_STEPS invokes
# the least a GPU invoke costs: 0 (default), as a GPU no model is under; the floor tests give
# 5 ms, 500x the zeros-step of their models, so that a loaded machine does not decide them
auto_choice.GPU_FLOOR_MS = args.get("floor", 0.0)
if args.get("cuda_costs"):          # auto's cost policy as on NVIDIA (cuda's launch is cheaper)
    from tflite_taichi import costs
    costs.GPU["vulkan"] = costs.GPU["cuda"]
if args.get("litert_refuses_shapes"):
    from tflite_taichi import litert_cpu
    from tflite_taichi.errors import ModelError
    def refuse(*a, **k):
        raise ModelError("planted: LiteRT infers other shapes")
    litert_cpu.LiteRTModel.check_shapes = refuse
from tflite_taichi import executor
prepares = []                       # our prepares of the whole model on the host, by whom
for name in ("check_on_host", "planned_schedule"):
    def counted(*a, _call=getattr(executor, name), _name=name, **k):
        prepares.append(_name)
        return _call(*a, **k)
    setattr(executor, name, counted)
from tflite_taichi import Interpreter
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    it = Interpreter(model_path=args["model"], backend="auto", cache_dir=args["cache_dir"])
    record = {"backend": it.backend, "paths": [], "outputs": [], "host_prepares": list(prepares)}
    it.allocate_tensors()
    x = np.load(args["inputs"])
    for step in range(args["steps"]):
        if step == 1:
            record["waited"] = it.wait_for_kernels(timeout=300)
        it.set_tensor(it.get_input_details()[0]["index"], x[step].astype(it.get_input_details()[0]["dtype"]))
        it.invoke()
        record["paths"].append(it.summary()["answered_by"])
        record["outputs"].append(it.get_tensor(it.get_output_details()[0]["index"]).tolist())
    record["choice"] = it.summary()["auto_choice"]
    from tflite_taichi.runtime.session import SESSION
    record["devices"] = sorted(SESSION.devices)     # GPU runtimes this process started
    record["backend_after"] = it.backend
    record["cache"] = it.summary()["cache"]
if args.get("cli"):                 # `tflite-taichi run` says what auto chose, and why
    import contextlib, io, os
    from tflite_taichi.cli import main
    os.environ["TFLITE_TAICHI_CACHE_DIR"] = args["cache_dir"]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        main(["run", args["model"]])
    record["cli"] = out.getvalue()
print("RESULT " + json.dumps(record), flush=True)
'''


def _run(model_path, cache_dir, inputs_path, steps, cli=False, **options) -> dict:
    proc = subprocess.run([sys.executable, "-c", RUN, json.dumps({
        "model": str(model_path), "cache_dir": str(cache_dir), "inputs": str(inputs_path),
        "steps": steps, "cli": cli, **options})], capture_output=True, text=True, timeout=600,
        env={**os.environ, "ENABLE_TAICHI_HEADER_PRINT": "False"})
    lines = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-2000:] + proc.stderr[-3000:]
    return json.loads(lines[-1][len("RESULT "):])


@pytest.fixture
def demo(tmp_path):
    from ai_edge_litert.interpreter import Interpreter as LiteRT
    model = build_demo_model()
    path = tmp_path / "demo.tflite"
    path.write_bytes(model)
    theirs = LiteRT(model_content=model)
    theirs.allocate_tensors()
    shape = theirs.get_input_details()[0]["shape"]
    steps = np.random.default_rng(3).uniform(-1, 1, (12, *shape)).astype(np.float32)
    np.save(tmp_path / "steps.npy", steps)
    expected = []
    for x in steps:
        theirs.set_tensor(theirs.get_input_details()[0]["index"], x)
        theirs.invoke()
        expected.append(theirs.get_tensor(theirs.get_output_details()[0]["index"]))
    return path, tmp_path / "steps.npy", expected


def test_auto_measures_runs_the_faster_side_and_the_next_process_starts_there(demo, tmp_path):
    path, inputs, expected = demo
    cache = tmp_path / "cache"
    first = _run(path, cache, inputs, 4 + GPU_STEPS)
    assert first["backend"] == "vulkan" and first["waited"] is True
    assert first["devices"] == ["vulkan"], first["devices"]
    delegated = [k for k, p in enumerate(first["paths"]) if p == "delegate"]
    assert len(delegated) == GPU_STEPS, first["paths"]     # timed, then LiteRT's from there on
    assert all(p == "litert" for p in first["paths"][delegated[-1] + 1:]), first["paths"]
    assert first["paths"][-1] == "litert"
    choice = first["choice"]
    assert choice["runs_on"] == "litert" and choice["how"] == "measured", choice
    assert choice["litert_ms"] < choice["gpu_ms"], choice
    records = list((cache / "models").glob("*.json"))
    assert [json.loads(r.read_text())["auto_choices"]["0"]["runs_on"] for r in records] == ["litert"]
    second = _run(path, cache, inputs, 3, cli=True)
    assert second["backend"] == "litert" and second["paths"] == ["litert"] * 3, second
    assert second["choice"]["how"] == "cached" and second["choice"]["runs_on"] == "litert"
    headline = second["cli"].splitlines()[0]
    assert re.search(r"all \d+ ops \(auto measured LiteRT's CPU kernels \(cached: LiteRT "
                     r"[\d.e+-]+ ms, GPU [\d.e+-]+ ms a step\)\)", headline), headline
    for k, out in enumerate(first["outputs"] + second["outputs"]):
        step = k if k < len(first["outputs"]) else k - len(first["outputs"])
        assert_float_close(np.array(out, np.float32), expected[step], what=f"answer {k}")


def _litert_sequence(model: bytes, steps) -> list:
    """LiteRT's own first output for `steps`, one invoke each, state carried (its variable tensors)."""
    from ai_edge_litert.interpreter import Interpreter as LiteRT
    return [outs[0] for outs in run_sequence(LiteRT(model_content=model), [[x] for x in steps])]


def test_a_litert_choice_hands_the_model_and_its_state_to_litert(tmp_path):
    """An LSTM classifier, whose h and c (variable tensors) carry from one invoke to the next:
    the GPU's first invokes, LiteRT measured faster, and from the next invoke the whole model
    on LiteRT (backend 'litert', its lean calls) with the state as the GPU left it: every
    answer is LiteRT's own sequence."""
    model = zoo.build("lstm_classifier", steps=32)     # enough steps for a GPU partition
    path = tmp_path / "lstm.tflite"
    path.write_bytes(model)
    steps = zoo.sample_inputs(model, seed=4)[0][None].repeat(4 + GPU_STEPS, axis=0)
    steps = steps + np.random.default_rng(5).normal(0, 0.1, steps.shape).astype(np.float32)
    np.save(tmp_path / "steps.npy", steps)
    record = _run(path, tmp_path / "cache", tmp_path / "steps.npy", len(steps))
    assert record["backend"] == "vulkan" and record["backend_after"] == "litert", record
    assert record["paths"][1:1 + GPU_STEPS] == ["delegate"] * GPU_STEPS, record["paths"]
    assert record["paths"][1 + GPU_STEPS:] == ["litert"] * 3, record["paths"]
    assert record["choice"]["runs_on"] == "litert" and record["cache"] is None, record
    expected = _litert_sequence(model, steps)
    for k, out in enumerate(record["outputs"]):
        assert_float_close(np.array(out, np.float32), expected[k], what=f"answer {k}")


def test_a_model_the_delegate_would_not_take_runs_on_litert_from_the_start(tmp_path):
    """A text classifier (an embedding lookup, a mean, a small dense: each op cheaper on the
    CPU than a GPU launch, costs.py) on a machine with a GPU: planned onto LiteRT before
    anything is compiled or measured, every answer LiteRT's."""
    model = text_classifier("float")
    path = tmp_path / "text.tflite"
    path.write_bytes(model)
    shape = read_model(model).main.tensors[read_model(model).main.inputs[0]].shape
    steps = np.random.default_rng(6).integers(0, 8, (3, *shape)).astype(np.int32)
    np.save(tmp_path / "steps.npy", steps)
    record = _run(path, tmp_path / "cache", tmp_path / "steps.npy", len(steps), cli=True)
    assert record["backend"] == "litert" and record["paths"] == ["litert"] * 3, record
    assert record["host_prepares"] == ["planned_schedule"], record      # not a second one
    assert record["choice"]["how"] == "planned" and record["choice"]["litert_ms"] is None, record
    assert "no op of the main graph" in record["choice"]["text"] and record["cache"] is None
    headline = record["cli"].splitlines()[0]
    assert "(auto planned LiteRT's CPU kernels (the delegate would take no op" in headline, headline
    assert not list((tmp_path / "cache").rglob("*.tcm")), "a GPU kernel was compiled"
    assert record["devices"] == [], "a GPU runtime was started for nothing"
    for k, out in enumerate(record["outputs"]):
        assert_float_close(np.array(out, np.float32), _litert_sequence(model, steps)[k],
                           what=f"answer {k}")


def _stateful_model(name, tmp_path, request) -> str:
    if name == "okay_nabu":
        return os.path.join(request.getfixturevalue("shared_models"), "okay_nabu.tflite")
    path = tmp_path / "ring.tflite"         # zeros shift its nonzero initial rows out
    path.write_bytes(ring_buffer_model(16, 4096, (0.5, 0), (0.5, 0), (0.5, 0)))
    return str(path)


@pytest.mark.parametrize("name", ["okay_nabu", "ring_buffer"])
def test_a_model_litert_runs_under_the_gpus_floor_runs_on_litert_from_the_start(
        tmp_path, request, name):
    """A streaming wake-word detector (okay_nabu: 55 int8 ops) and its streaming pattern alone
    (a ring buffer of int8 rows): resource variables set by CALL_ONCE, so their state cannot
    move to LiteRT once an invoke has started it. With cuda's costs the delegate would take some
    of their ops, but LiteRT's whole step, timed on a scratch interpreter before anything
    compiles, is under the least a GPU invoke costs: each runs on LiteRT from the start, and its
    answers are LiteRT's own sequence (the scratch interpreter's state, zeros shifted in, went
    with it)."""
    path = _stateful_model(name, tmp_path, request)
    model = open(path, "rb").read()
    shape = read_model(model).main.tensors[read_model(model).main.inputs[0]].shape
    steps = np.random.default_rng(8).integers(-128, 128, (4, *shape)).astype(np.int8)
    np.save(tmp_path / "steps.npy", steps)
    record = _run(path, tmp_path / "cache", tmp_path / "steps.npy", len(steps), cli=True,
                  floor=5.0, cuda_costs=True)
    assert record["backend"] == "litert" and record["paths"] == ["litert"] * 4, record
    assert record["host_prepares"] == ["planned_schedule"], record      # not a second one
    choice = record["choice"]
    assert choice["how"] == "planned" and choice["litert_ms"] < choice["gpu_ms"], choice
    assert "under the least a GPU invoke costs" in choice["text"], choice
    assert "(auto planned LiteRT's CPU kernels (LiteRT's step" in record["cli"].splitlines()[0]
    assert not list((tmp_path / "cache").rglob("*.tcm")), "a GPU kernel was compiled"
    assert record["devices"] == [], "a GPU runtime was started for nothing"
    expected = _litert_sequence(model, steps)
    for k, out in enumerate(record["outputs"]):
        np.testing.assert_array_equal(np.array(out, np.int8), expected[k], err_msg=f"answer {k}")
    # without the floor, the same model goes to the GPU: the floor decided, not the cost policy
    measured = _run(path, tmp_path / "cache2", tmp_path / "steps.npy", 1, cuda_costs=True)
    assert measured["backend"] == "vulkan" and measured["choice"] is None, measured


def test_only_a_small_model_is_timed_before_anything_compiles():
    from tflite_taichi.auto_choice import GPU_FLOOR_MS, small_enough_to_time, under_the_floor
    from tflite_taichi.executor import DelegateOptions, planned_schedule
    from tflite_taichi.graph import resolve_ops
    assert under_the_floor(GPU_FLOOR_MS / 2).runs_on == "litert"
    assert under_the_floor(GPU_FLOOR_MS) is None
    small = read_model(text_classifier("float"))
    big = read_model(zoo.build("mobilenet_v2"))
    options = DelegateOptions(backend="vulkan")
    assert small_enough_to_time(planned_schedule(small, resolve_ops(small), options))
    assert not small_enough_to_time(planned_schedule(big, resolve_ops(big), options))


def test_a_tampered_choice_is_ignored_and_measured_again(demo, tmp_path):
    path, inputs, _expected = demo
    cache = tmp_path / "cache"
    _run(path, cache, inputs, 2 + GPU_STEPS)
    [record_path] = list((cache / "models").glob("*.json"))
    record = json.loads(record_path.read_text())
    record["auto_choices"] = {"0": {"runs_on": "litert", "litert_ms": "fast", "gpu_ms": 8}}
    record_path.write_text(json.dumps(record))
    again = _run(path, cache, inputs, 2)
    assert again["backend"] == "vulkan" and again["choice"] is None, again


def test_where_litert_cannot_run_the_shapes_the_gpu_runs_and_nothing_is_kept(demo, tmp_path):
    """LiteRT refuses the interpreter's shapes: numpy answers while compiling, the GPU's invokes
    are timed, the GPU it is for this interpreter, and no choice goes to the cache (another
    process or other shapes may find LiteRT able)."""
    path, inputs, _expected = demo
    cache = tmp_path / "cache"
    record = _run(path, cache, inputs, 3 + GPU_STEPS, litert_refuses_shapes=True)
    assert record["paths"][1:] == ["delegate"] * (2 + GPU_STEPS), record["paths"]
    assert record["paths"][0] in ("reference", "delegate"), record["paths"]
    choice = record["choice"]
    assert choice["runs_on"] == "gpu" and "LiteRT cannot run the model" in choice["text"], choice
    for kept in (cache / "models").glob("*.json"):
        assert "auto_choices" not in json.loads(kept.read_text()), kept.read_text()


# -- a GPU taken at a glance ---------------------------------------------------------------------
# `auto`, which answers on LiteRT while the GPU gets ready, takes a GPU its driver shows in the
# process (backend.GLANCES: cuda's driver on NVIDIA) without the probe subprocess (2.7 s cold on
# an H100); the device's start, in the background, is the probe, kept in the cache folder. Here
# lavapipe stands in: `auto` told that this machine has a GPU node, that Vulkan is the one GPU
# backend, and that its driver shows a device (the glance); its probe would call it software.
GLANCE = r'''
import json, sys, warnings
import numpy as np
args = json.loads(sys.argv[1])
from tflite_taichi import backend as ti_backend
ti_backend.gpu_device_nodes = lambda: ["/dev/a-gpu"]
ti_backend.AUTO_ORDER = ("vulkan",)
glanced = []
def glance():
    glanced.append("vulkan")
    return "a GPU seen at a glance"
ti_backend.GLANCES = {"vulkan": glance}
probed = []
probe = ti_backend.probe
def noted(name, *a, **k):
    probed.append(name)
    return probe(name, *a, **k)
ti_backend.probe = noted
if args.get("refuse"):               # the driver showed a device, and then refuses to start it
    from tflite_taichi.runtime import capi, device
    def refuse(self, *a, **k):
        raise capi.CapiError("planted: the driver refuses")
    device.CapiDevice.__init__ = refuse
from tflite_taichi import auto_choice
# no model is under the GPU's floor: the GPU is tried (or, `floor`, every model is: LiteRT)
auto_choice.GPU_FLOOR_MS = 1e9 if args.get("floor") else 0.0
from tflite_taichi import Interpreter
from tflite_taichi.runtime import cache
x = np.load(args["inputs"])
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    it = Interpreter(model_path=args["model"], cache_dir=args["cache_dir"], **args.get("options", {}))
    record = {"backend": it.backend, "paths": [], "outputs": []}
    it.allocate_tensors()
    for step in range(2):
        if step == 1 and args.get("join"):    # the build ends unwatched: an invoke meets it
            thread = it._main.program.kernels.thread    # (None: the first invoke met it)
            if thread is not None:
                thread.join(300)
        elif step == 1:
            record["waited"] = it.wait_for_kernels(timeout=300)
        it.set_tensor(it.get_input_details()[0]["index"], x[step])
        it.invoke()
        record["paths"].append(it.summary()["answered_by"])
        record["outputs"].append(it.get_tensor(it.get_output_details()[0]["index"]).tolist())
    try:
        it.wait_for_kernels(timeout=300)
    except Exception as e:
        record["wait_error"] = f"{type(e).__name__}: {e}"
record["probed"], record["glanced"] = probed, glanced
record["stored"] = cache.stored_probe(cache.root_for(args["cache_dir"]), "vulkan")
record["warnings"] = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
print("RESULT " + json.dumps(record), flush=True)
'''


def _glance(model_path, cache_dir, inputs_path, env=None, **options) -> dict:
    proc = subprocess.run([sys.executable, "-c", GLANCE, json.dumps({
        "model": str(model_path), "cache_dir": str(cache_dir), "inputs": str(inputs_path),
        **options})], capture_output=True, text=True, timeout=600,
        env={**os.environ, "ENABLE_TAICHI_HEADER_PRINT": "False", **(env or {})})
    lines = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-2000:] + proc.stderr[-3000:]
    return json.loads(lines[-1][len("RESULT "):])


def test_a_gpu_seen_at_a_glance_is_taken_without_its_probe_and_its_start_is_kept(demo, tmp_path):
    path, inputs, expected = demo
    cache = tmp_path / "cache"
    first = _glance(path, cache, inputs)
    assert first["backend"] == "vulkan" and first["probed"] == [], first
    assert first["paths"] == ["litert", "delegate"] and first["waited"] is True, first
    assert first["stored"] == [True, False, "a GPU seen at a glance"], first["stored"]
    again = _glance(path, cache, inputs)        # the start's record decides: no glance, no probe
    assert again["backend"] == "vulkan" and again["probed"] == [], again
    for k, out in enumerate(first["outputs"]):
        assert_float_close(np.array(out, np.float32), expected[k], what=f"answer {k}")


def test_a_gpu_seen_at_a_glance_that_does_not_start_leaves_litert_answering(demo, tmp_path):
    path, inputs, expected = demo
    cache = tmp_path / "cache"
    first = _glance(path, cache, inputs, refuse=True, join=True)
    assert first["backend"] == "vulkan" and first["paths"] == ["litert", "litert"], first
    assert "did not start vulkan" in first["wait_error"] and "planted" in first["wait_error"], first
    assert [w for w in first["warnings"] if "kernels ready on vulkan failed" in w], first["warnings"]
    assert first["stored"][:2] == [False, False] and "planted" in first["stored"][2], first["stored"]
    for k, out in enumerate(first["outputs"]):
        assert_float_close(np.array(out, np.float32), expected[k], what=f"answer {k}")
    after = _glance(path, cache, inputs)        # the failed start is known: no GPU, LiteRT
    assert after["backend"] == "litert" and after["probed"] == [], after


def test_a_glance_is_kept_where_the_model_never_starts_the_gpu(demo, tmp_path):
    """A model `auto` runs on LiteRT (here: under the GPU's floor) never starts the device, so
    no probe is recorded; the glance is kept instead (it cost 0.1-0.16 s of a 0.25 s
    constructor on an H100), under the driver stack's fingerprint."""
    path, inputs, expected = demo
    cache = tmp_path / "cache"
    first = _glance(path, cache, inputs, floor=True)
    assert first["backend"] == "litert" and first["glanced"] == ["vulkan"], first
    assert first["probed"] == [] and first["stored"] is None, first     # no start: no probe
    again = _glance(path, cache, inputs, floor=True)
    assert again["backend"] == "litert" and again["glanced"] == [], again
    assert again["paths"] == ["litert", "litert"], again
    for k, out in enumerate(again["outputs"]):
        assert_float_close(np.array(out, np.float32), expected[k], what=f"answer {k}")
    # a kept glance still starts the GPU where the model needs it, and the start is the probe
    started = _glance(path, cache, inputs)
    assert started["glanced"] == [] and started["backend"] == "vulkan", started
    assert started["paths"] == ["litert", "delegate"], started
    assert started["stored"] == [True, False, "a GPU seen at a glance"], started["stored"]
    # another driver stack (a loader's variable is part of the fingerprint) glances afresh
    other = _glance(path, cache, inputs, floor=True, env={"CUDA_VISIBLE_DEVICES": "7"})
    assert other["glanced"] == ["vulkan"] and other["stored"] is None, other


def test_without_answers_meanwhile_auto_probes_before_it_chooses(demo, tmp_path):
    """answer_while_compiling=False: allocate_tensors() waits for the GPU, so the GPU must be
    known to work first: the probe runs (and calls lavapipe software: no GPU, LiteRT)."""
    path, inputs, _expected = demo
    record = _glance(path, tmp_path / "cache", inputs, options={"answer_while_compiling": False})
    assert record["probed"] == ["vulkan"] and record["backend"] == "litert", record
