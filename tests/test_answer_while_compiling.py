"""Interpreter(answer_while_compiling=True): while a cold program's kernels compile (in worker
processes), invoke() answers on the CPU with the same state (LiteRT's kernels where it can carry
the state, numpy where not); the first invoke after they are loaded runs them; a compile that
fails warns and keeps the CPU answering, and wait_for_kernels() raises it. The subgraphs IF and WHILE call, delegated on their own, answer
the same way. Each case is a fresh process (one Taichi arch per process); the
compile is held behind a gate the script opens, so which path answers each step is certain."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from cases.state import check_nabu_steps, litert_nabu_tensors, nabu_sequence
from ai_edge_litert.interpreter import Interpreter as LiteRTInterpreter
from cases.control import I32, delegated_around_if_model
from cases.sequence import BASE_SEQUENCE, lstm_model

from tflite_taichi import Interpreter
from tflite_taichi.testing import assert_float_close, run_sequence
from tflite_taichi.tools.demo import build_demo_model

TAICHI_BACKENDS = [b for b in os.environ.get("TFLITE_TAICHI_TEST_BACKENDS", "cpu,vulkan,opengl").split(",") if b]

# every compile waits at `gate` until the script opens it
GATE = r'''
import json, sys, threading, warnings
import numpy as np
args = json.loads(sys.argv[1])
from tflite_taichi import Interpreter
from tflite_taichi.runtime import compile_workers
gate = threading.Event()
opener = threading.Timer(90, gate.set)  # a run that waits where it should not ends, and fails
opener.daemon = True
opener.start()
build = compile_workers.build_modules
def gated(*a, **k):
    if not args.get("no_gate"):
        gate.wait()
    if args.get("fail"):
        raise RuntimeError("the compile broke on purpose")
    return build(*a, **k)
compile_workers.build_modules = gated
'''

RUN = GATE + r'''
if args.get("gate_loads"):           # cached modules' loads wait at the gate too (not on
    from tflite_taichi.runtime import kernels   # OpenGL: allocate_tensors() itself loads them)
    loaded = kernels.ProgramKernels._loaded
    def gated_load(*a, **k):
        gate.wait()
        return loaded(*a, **k)
    kernels.ProgramKernels._loaded = gated_load
from tflite_taichi.runtime import device as device_mod      # which thread starts the device
started_in, start_capi = [], device_mod.CapiDevice.__init__
def noted_start(self, *a, **k):
    started_in.append(threading.current_thread().name)
    return start_capi(self, *a, **k)
device_mod.CapiDevice.__init__ = noted_start
steps = np.load(args["inputs"])
record = {"paths": [], "tensors": []}
if args.get("auto_picks"):           # `auto` as on a machine where that GPU is the best one
    from tflite_taichi import backend as ti_backend
    ti_backend.choose_auto = lambda *a, **k: args["auto_picks"]
    from tflite_taichi import auto_choice   # ... whose invoke costs nothing: no model is under
    auto_choice.GPU_FLOOR_MS = 0.0          # its floor (the demo's LiteRT step is ~0.05 ms)
option = {} if args.get("default_option") else {"answer_while_compiling": True}
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    it = Interpreter(model_path=args["model"], backend=args["backend"], cache_dir=args["cache_dir"],
                     experimental_preserve_all_tensors=args.get("preserve", False), **option)
    it.allocate_tensors()
    record["after_allocate"] = it.summary()["runtime"]["kernels"]
    if args.get("close"):            # closed while its kernels compile
        thread = it._main.program.kernels.thread
        it.close()
        gate.set()
        thread.join(300)
        print("RESULT " + json.dumps({"closed": True, "thread_ended": not thread.is_alive()}),
              flush=True)
        sys.exit(0)
    for step, x in enumerate(steps):
        if step == args["open_at"]:
            gate.set()
            if args.get("join"):     # nobody waits: the compile's thread is let end
                it._main.program.kernels.thread.join(300)
            else:
                record["waited"] = it.wait_for_kernels(timeout=300)
        if step == args.get("reset_at"):
            it.reset_all_variables()
        it.set_tensor(it.get_input_details()[0]["index"], x)
        it.invoke()
        record["paths"].append(it.summary()["runtime"]["answered_by"])
        record["tensors"].append({str(t): it.get_tensor(t).tolist() for t in args["tensors"]})
    record["kernels"] = it.summary()["runtime"]["kernels"]
    gate.set()                       # a compile still held would hold the last wait to the timer
    try:
        record["waited_at_end"] = it.wait_for_kernels(timeout=300)
    except Exception as e:
        record["wait_error"] = f"{type(e).__name__}: {e}"
record["warnings"] = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
record["device_started_in"] = started_in[0] if started_in else None
print("RESULT " + json.dumps(record), flush=True)
'''


def run(tmp_path, model, backend, steps, tensors, open_at, **options):
    np.save(tmp_path / "steps.npy", np.stack(steps))
    args = {"model": str(model), "backend": backend, "cache_dir": str(tmp_path / "cache"),
            "inputs": str(tmp_path / "steps.npy"), "tensors": [int(t) for t in tensors],
            "open_at": open_at, **options}
    return _result(RUN, args)


def _result(script: str, args: dict) -> dict:
    """What `script` prints after RESULT, run in a fresh process (one Taichi arch each)."""
    proc = subprocess.run([sys.executable, "-c", script, json.dumps(args)], capture_output=True,
                          text=True, timeout=600,
                          env={**os.environ, "ENABLE_TAICHI_HEADER_PRINT": "False"})
    lines = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    return json.loads(lines[-1][len("RESULT "):])


@pytest.fixture
def demo(tmp_path):
    path = tmp_path / "demo.tflite"
    path.write_bytes(build_demo_model())
    it = Interpreter(model_path=str(path), backend="reference")
    it.allocate_tensors()
    detail = it.get_input_details()[0]
    rng = np.random.default_rng(11)
    steps = [rng.uniform(-1, 1, detail["shape"]).astype(np.float32) for _ in range(3)]
    expected = []
    for x in steps:
        it.set_tensor(detail["index"], x)
        it.invoke()
        expected.append(it.get_tensor(it.get_output_details()[0]["index"]))
    return path, steps, it.get_output_details()[0]["index"], expected


@pytest.mark.models
@pytest.mark.parametrize("backend", TAICHI_BACKENDS)
def test_the_first_invokes_answer_on_the_reference_path_and_the_state_carries_over(
        shared_models, tmp_path, backend):
    """okay_nabu streams its input through 6 variables: 4 steps answered on the reference path
    while the kernels compile, then 6 on the delegate, which continue from the state the
    reference path left; every int8 tensor at every step within 3 units of LiteRT's run of the
    same 10 steps (the bound test_ops_state.py holds each path to alone)."""
    path = os.path.join(shared_models, "okay_nabu.tflite")
    sequence = nabu_sequence()
    expected = litert_nabu_tensors(path, sequence)
    record = run(tmp_path, path, backend, [s[0] for s in sequence], sorted(expected[0]), open_at=4,
                 preserve=True)
    assert record["after_allocate"] == "compiling"
    assert record["paths"] == ["reference"] * 4 + ["delegate"] * 6
    assert record["waited"] is True and record["kernels"] == "ready" and not record["warnings"]
    ours = [{int(t): np.array(v, np.int8) for t, v in step.items()} for step in record["tensors"]]
    check_nabu_steps(ours, expected, f"{backend}, reference then delegate")


@pytest.mark.parametrize("backend", ["vulkan"])    # the executor's switch: any backend will do
def test_the_first_invokes_answer_on_litert_and_the_lstm_state_carries_over(tmp_path, backend):
    """A sequence LSTM (CPU only: its state in two variable tensors) then RELU (delegated): 3
    invokes answer on LiteRT's kernels while the kernels compile, each handed the state the
    host holds and handing the new state back (reset_all_variables() before the third), then 3
    on the delegate, which continue from it.
    The LiteRT answers equal LiteRT's own run of the same sequence bit for bit (the same
    kernels); the delegate's within assert_float_close of it (each path's own tolerance)."""
    model = lstm_model(BASE_SEQUENCE, then="RELU")
    path = tmp_path / "lstm_relu.tflite"
    path.write_bytes(model)
    rng = np.random.default_rng(5)
    shape = Interpreter(model_content=model, backend="reference").get_input_details()[0]["shape"]
    steps = [rng.uniform(-2, 2, shape).astype(np.float32) for _ in range(6)]
    theirs = LiteRTInterpreter(model_content=model)
    theirs.allocate_tensors()
    out = theirs.get_output_details()[0]["index"]
    expected = []
    for k, x in enumerate(steps):
        if k == 2:
            theirs.reset_all_variables()
        theirs.set_tensor(theirs.get_input_details()[0]["index"], x)
        theirs.invoke()
        expected.append(theirs.get_tensor(out))
    record = run(tmp_path, path, backend, steps, [out], open_at=3, reset_at=2)
    assert record["after_allocate"] == "compiling"
    assert record["paths"] == ["litert"] * 3 + ["delegate"] * 3
    assert record["waited"] is True and not record["warnings"]
    for k, (got, want) in enumerate(zip(record["tensors"], expected)):
        ours = np.array(got[str(out)], np.float32)
        if k < 3:
            np.testing.assert_array_equal(ours, want, err_msg=f"{backend}, invoke {k} on LiteRT")
        else:
            assert_float_close(ours, want, what=f"{backend}, invoke {k} on the delegate")


def test_auto_on_a_gpu_answers_while_compiling_by_default_and_named_backends_wait(demo, tmp_path):
    """`auto` where it chose a GPU: the first answers come from LiteRT at once (the option's
    default); a backend named keeps tf.lite's contract: allocate_tensors() returns with the
    kernels loaded, and the delegate answers the first invoke."""
    path, steps, output, expected = demo
    auto = run(tmp_path, path, "auto", steps, [output], open_at=2, auto_picks="vulkan",
               default_option=True)
    assert auto["after_allocate"] == "compiling" and auto["paths"] == ["litert"] * 2 + ["delegate"]
    for got, want in zip(auto["tensors"], expected):
        assert_float_close(np.array(got[str(output)], np.float32), want, what="auto")
    (tmp_path / "named").mkdir()
    named = run(tmp_path / "named", path, "vulkan", steps, [output], open_at=0, default_option=True,
                no_gate=True)
    assert named["after_allocate"] == "ready" and named["paths"] == ["delegate"] * 3


def test_preserve_all_tensors_answers_on_numpy_which_keeps_the_intermediates(demo, tmp_path):
    """LiteRT keeps no intermediates between invokes: with experimental_preserve_all_tensors
    the answers while compiling come from numpy, so get_tensor reads every intermediate."""
    path, steps, output, expected = demo
    record = run(tmp_path, path, "cpu", steps[:1], [output], open_at=99, preserve=True)
    assert record["paths"] == ["reference"]


def test_a_failed_background_compile_warns_keeps_answering_and_wait_raises(demo, tmp_path):
    path, steps, output, expected = demo
    """The compile raises: the invoke after it ended warns (once) and every invoke answers on
    the CPU (LiteRT's kernels); wait_for_kernels() raises the compile's exception."""
    record = run(tmp_path, path, "cpu", steps, [output], open_at=1, fail=True, join=True)
    assert record["paths"] == ["litert"] * 3
    assert record["wait_error"] == "RuntimeError: the compile broke on purpose"
    assert record["kernels"] == "failed (RuntimeError: the compile broke on purpose)"
    failed = [w for w in record["warnings"] if "kernels ready on" in w and "failed" in w]
    assert len(failed) == 1, record["warnings"]
    for got, want in zip(record["tensors"], expected):     # LiteRT's, against numpy's
        assert_float_close(np.array(got[str(output)], np.float32), want, what="LiteRT while failed")


@pytest.mark.parametrize("backend", [b for b in TAICHI_BACKENDS if b != "opengl"])
def test_a_warm_start_answers_on_litert_while_the_device_starts_and_loads(demo, tmp_path, backend):
    """Nothing compiles, yet the device's start (0.7 s for cuda on an H100) and, on cpu and
    cuda, a cached module's load (its machine code compiled: seconds per kernel) are off the
    first result: allocate_tensors() returns at once and LiteRT answers until they are done.
    The loads wait at the gate, so which path answers each step is certain."""
    path, steps, output, expected = demo
    run(tmp_path, path, backend, steps, [output], open_at=0)
    warm = run(tmp_path, path, backend, steps, [output], open_at=1, gate_loads=True)
    assert warm["after_allocate"] == "compiling" and warm["paths"] == ["litert"] + ["delegate"] * 2
    assert warm["waited"] is True and warm["kernels"] == "ready"
    assert warm["device_started_in"] != "MainThread", warm      # the start's or the build's
    for got, want in zip(warm["tensors"], expected):
        np.testing.assert_allclose(np.array(got[str(output)], np.float32), want, rtol=1e-5, atol=1e-6)


@pytest.mark.skipif("opengl" not in TAICHI_BACKENDS, reason="OpenGL is not among the test backends")
def test_on_opengl_a_warm_cache_runs_the_delegate_from_the_first_invoke(demo, tmp_path):
    """A GL context belongs to the thread that makes it (the caller's): its device starts, and
    cached modules load, in allocate_tensors(), in milliseconds."""
    path, steps, output, expected = demo
    run(tmp_path, path, "opengl", steps, [output], open_at=0)
    warm = run(tmp_path, path, "opengl", steps, [output], open_at=99)
    assert warm["after_allocate"] == "ready" and warm["paths"] == ["delegate"] * 3
    assert warm["device_started_in"] == "MainThread", warm
    for got, want in zip(warm["tensors"], expected):
        np.testing.assert_allclose(np.array(got[str(output)], np.float32), want, rtol=1e-5, atol=1e-6)


def test_closed_while_compiling_ends_cleanly(demo, tmp_path):
    path, steps, output, _ = demo
    record = run(tmp_path, path, "vulkan", steps, [output], open_at=0, close=True)
    assert record == {"closed": True, "thread_ended": True}


def test_without_the_option_allocate_waits_for_the_kernels(demo, tmp_path):
    """The default: allocate_tensors() returns with the kernels loaded (summary: ready)."""
    script = r'''
import sys, json
from tflite_taichi import Interpreter
it = Interpreter(model_path=sys.argv[1], backend="cpu", cache_dir=sys.argv[2])
it.allocate_tensors()
print("RESULT", json.dumps(it.summary()["runtime"]["kernels"]))
'''
    path = demo[0]
    proc = subprocess.run([sys.executable, "-c", script, str(path), str(tmp_path / "cache")],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1] == 'RESULT "ready"'


# An IF/WHILE model, its invokes' inputs from an .npz per step; per step its outputs and, per
# called subgraph, how many times its program answered and where its kernels stand.
CALLS_RUN = GATE + r"""
it = Interpreter(model_path=args["model"], backend=args["backend"], cache_dir=args["cache_dir"],
                 answer_while_compiling=True)
it.allocate_tensors()
def calls():
    return {str(c["subgraph"]): [c["runs_on_delegate"], c["kernels"]] for c in it.summary()["calls"]}
record = {"after_allocate": calls(), "steps": []}
for step, path in enumerate(args["steps"]):
    if step == args["open_at"]:
        gate.set()
        record["waited"] = it.wait_for_kernels(timeout=300)
    feeds = np.load(path)
    for d, name in zip(it.get_input_details(), feeds.files):
        it.set_tensor(d["index"], feeds[name])
    it.invoke()
    record["steps"].append({"outputs": [it.get_tensor(d["index"]).tolist()
                                        for d in it.get_output_details()], "calls": calls()})
print("RESULT " + json.dumps(record), flush=True)
"""


@pytest.mark.parametrize("backend", TAICHI_BACKENDS)
def test_if_and_while_answer_on_the_reference_path_while_their_subgraphs_compile(tmp_path, backend):
    """An IF (then: RELU; else: a WHILE whose body adds 0.5) whose called subgraphs' kernels
    are held compiling: two invokes (one per branch) answer on the reference path, no program
    running; then wait_for_kernels() waits for the called subgraphs' kernels too, and the next
    two invokes run them (the then branch once, the body 3 times). Every answer equals the
    reference path's (exactly while it answers)."""
    shape = (2, 3)
    model = delegated_around_if_model(shape, around=False)
    path = tmp_path / "if_while.tflite"
    path.write_bytes(model)
    x = np.linspace(-1.5, 1.0, 6, dtype=np.float32).reshape(shape)
    steps = [[np.array(True), I32(1), x], [np.array(False), I32(2), x],
             [np.array(True), I32(1), -x], [np.array(False), I32(3), -x]]
    paths = []
    for k, inputs in enumerate(steps):
        paths.append(str(tmp_path / f"step{k}.npz"))
        np.savez(paths[-1], *inputs)
    record = _result(CALLS_RUN, {"model": str(path), "backend": backend, "steps": paths,
                                 "open_at": 2, "cache_dir": str(tmp_path / "cache")})
    # subgraphs: 1 then (RELU), 2 else (the WHILE), 3 cond, 4 body (its ADD)
    compiling = {"1": [0, "compiling"], "2": [0, None], "3": [0, None], "4": [0, "compiling"]}
    assert record["after_allocate"] == compiling
    assert [s["calls"] for s in record["steps"][:2]] == [compiling] * 2
    assert record["waited"] is True
    ran = [{"1": [1, "ready"], "2": [0, None], "3": [0, None], "4": [0, "ready"]},
           {"1": [1, "ready"], "2": [0, None], "3": [0, None], "4": [3, "ready"]}]
    assert [s["calls"] for s in record["steps"][2:]] == ran
    expected = run_sequence(Interpreter(model_content=model, backend="reference"), steps)
    for k, (got, want) in enumerate(zip(record["steps"], expected)):
        ours = np.array(got["outputs"][0], np.float32)
        if k < 2:
            np.testing.assert_array_equal(ours, want[0])
        else:
            assert_float_close(ours, want[0], what=f"{backend}, invoke {k} on the delegate")
