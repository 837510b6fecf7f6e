"""backend='litert': the whole model on LiteRT's CPU kernels (tflite_taichi/litert_cpu.py), held
to ai_edge_litert's own Interpreter (XNNPACK, the same num_threads) bit for bit: the shared
models, state across invokes and resets, resizes and data-dependent shapes, signatures and
control flow, intermediates, errors, close(), and hostile model bytes (LiteRT parses them
itself: a fuzz run in a subprocess, where a segfault cannot take pytest down)."""
import os
import re
import subprocess
import sys
import time

import numpy as np
import pytest
from ai_edge_litert import interpreter as litert

import plugin_ops  # noqa: F401  (registers CUSTOM:CpuOnlyAbs for our reference path)
from cases.control import delegated_around_if_model
from cases.sequence import BASE_SEQUENCE, lstm_model
from cases.signatures import two_signature_model
from cases.state import accumulator_model, nabu_sequence
from tflite_taichi import Interpreter, litert_cpu
from tflite_taichi.builder import RESOURCE, ModelBuilder
from tflite_taichi.errors import (BackendUnavailable, InputError, InterpreterStateError, ModelError,
                                  NotReadyError)
from tflite_taichi.testing import model_random_inputs

THREADS = 2


# -- helpers -----------------------------------------------------------------------------------
def _ours(model, **kwargs):
    it = Interpreter(model_content=model, backend="litert", num_threads=THREADS, **kwargs)
    it.allocate_tensors()
    return it


def _theirs(model, **kwargs):
    it = litert.Interpreter(model_content=model, num_threads=THREADS, **kwargs)
    it.allocate_tensors()
    return it


def _run(it, inputs):
    for d, x in zip(it.get_input_details(), inputs):
        it.set_tensor(d["index"], x)
    it.invoke()
    return [it.get_tensor(d["index"]) for d in it.get_output_details()]


def _assert_same(ours, theirs, what):
    assert len(ours) == len(theirs), what
    for k, (a, b) in enumerate(zip(ours, theirs)):
        assert a.dtype == b.dtype and a.shape == b.shape, (what, k, a.dtype, a.shape, b.dtype, b.shape)
        np.testing.assert_array_equal(a, b, err_msg=f"{what}: output {k}")


def _unary_chain():
    """x -> RELU -> 'mid' -> MUL(2) -> y."""
    b = ModelBuilder()
    g = b.subgraph()
    x = g.input("x", (2, 3))
    mid = g.tensor("mid", (2, 3))
    g.op("RELU", [x], [mid])
    y = g.tensor("y", (2, 3))
    g.op("MUL", [mid, g.const("two", np.float32(2))], [y])
    g.output(y)
    return b.finish(), mid


def _dynamic_batch():
    """x [B, 4] -> FULLY_CONNECTED (3 units) -> y [B, 3], B resizable."""
    b = ModelBuilder()
    g = b.subgraph()
    x = g.input("x", (1, 4), shape_signature=(-1, 4))
    w = g.const("w", np.arange(12, dtype=np.float32).reshape(3, 4) / 10)
    bias = g.const("bias", np.array([0.5, -1.0, 2.0], np.float32))
    y = g.tensor("y", (1, 3), shape_signature=(-1, 3))
    g.op("FULLY_CONNECTED", [x, w, bias], [y])
    g.output(y)
    return b.finish()


def _boolean_mask():
    """x[x > 0.5] (GREATER -> WHERE -> GATHER_ND): an output of run-time shape."""
    b = ModelBuilder()
    g = b.subgraph()
    x = g.input("x", (2, 3))
    mask = g.tensor("mask", (2, 3), np.bool_)
    g.op("GREATER", [x, g.const("half", np.array(0.5, np.float32))], [mask])
    where = g.tensor("where", (1, 2), np.int64, shape_signature=(-1, 2))
    g.op("WHERE", [mask], [where])
    picked = g.tensor("picked", (1,), shape_signature=(-1,))
    g.op("GATHER_ND", [x, where], [picked])
    g.output(picked)
    return b.finish()


def _custom_op_model():
    b = ModelBuilder()
    g = b.subgraph()
    x = g.input("x", (3,))
    y = g.tensor("y", (3,))
    g.op("CUSTOM:CpuOnlyAbs", [x], [y])
    g.output(y)
    return b.finish()


# -- 1. every shared model, bit-equal to LiteRT ---------------------------------------------
def test_every_shared_model_equals_litert_bit_for_bit(shared_models):
    paths = sorted(os.path.join(shared_models, f) for f in os.listdir(shared_models)
                   if f.endswith(".tflite"))
    assert paths
    for path in paths:
        name = os.path.basename(path)
        model = open(path, "rb").read()
        ours, theirs = _ours(model), _theirs(model)
        assert ours.backend == "litert", name
        rng = np.random.default_rng(0)
        for step in range(3):
            inputs = model_random_inputs(ours, rng)
            for d, x in zip(theirs.get_input_details(), inputs):
                assert x.dtype == d["dtype"], (name, x.dtype, d["dtype"])    # int8 IO in int8
            _assert_same(_run(ours, inputs), _run(theirs, inputs), f"{name} invoke {step}")
        if name == "mobilenet_v1_int8.tflite":
            assert [d["dtype"] for d in ours.get_input_details() + ours.get_output_details()] == [np.int8] * 2


# -- 2. state ---------------------------------------------------------------------------------
def _sequence_then_reset(model, steps, after_reset, **kwargs):
    """Ours and LiteRT's outputs over `steps` invokes, reset_all_variables(), `after_reset`."""
    ours, theirs = _ours(model, **kwargs), _theirs(model, **kwargs)
    for k, inputs in enumerate(steps):
        _assert_same(_run(ours, inputs), _run(theirs, inputs), f"step {k}")
    ours.reset_all_variables()
    theirs.reset_all_variables()
    for k, inputs in enumerate(after_reset):
        _assert_same(_run(ours, inputs), _run(theirs, inputs), f"step {k} after reset_all_variables")
    return ours, theirs


def test_lstm_variable_tensors_follow_litert_through_a_reset():
    model = lstm_model(BASE_SEQUENCE)
    x = [np.random.default_rng(1).uniform(-2, 2, (2, 3, 3)).astype(np.float32)]
    _sequence_then_reset(model, [x] * 3, [x] * 2)
    fresh = _ours(model)        # the state is what differs: the same input, other answers
    assert not np.array_equal(_run(fresh, x)[0], _run(fresh, x)[0])


def test_resource_variables_and_call_once_follow_litert():
    model = accumulator_model((3,), np.array([1, 2, 3], np.float32))
    x = [np.array([0.5, -1, 2], np.float32)]
    ours, _ = _sequence_then_reset(model, [x] * 3, [x] * 2)   # resource variables survive a reset
    np.testing.assert_array_equal(_run(ours, x)[0], (np.array([1, 2, 3]) + 6 * x[0]) * 2)


def test_okay_nabu_streams_as_litert_does_every_tensor_every_step(shared_models):
    """okay_nabu's output is 0 on noise, so every tensor LiteRT keeps is compared, step by step
    (experimental_preserve_all_tensors on both sides)."""
    model = open(os.path.join(shared_models, "okay_nabu.tflite"), "rb").read()
    with pytest.warns(UserWarning, match="preserve_all_tensors"):
        theirs = _theirs(model, experimental_preserve_all_tensors=True)
    ours = _ours(model, experimental_preserve_all_tensors=True)
    tensors = ours.model.main.tensors
    written = [t for op in ours.model.main.operators for t in op.outputs
               if tensors[t].dtype is not None]         # resource handles hold no data
    compared = 0
    for step, inputs in enumerate(nabu_sequence(steps=6) * 2):
        if step == 6:
            ours.reset_all_variables()
            theirs.reset_all_variables()
        _assert_same(_run(ours, inputs), _run(theirs, inputs), f"okay_nabu step {step}")
        for t in written:
            np.testing.assert_array_equal(ours.get_tensor(t), theirs.get_tensor(t),
                                          err_msg=f"okay_nabu step {step} tensor {t}")
            compared += 1
    assert compared >= 12 * 20


# -- 3. resize, data-dependent shapes, inputs kept ------------------------------------------
def test_resize_and_allocate_match_litert_and_keep_inputs():
    model = _dynamic_batch()
    ours, theirs = _ours(model), _theirs(model)
    rng = np.random.default_rng(2)
    for batch in (5, 2, 1):
        for it in (ours, theirs):
            it.resize_tensor_input(0, [batch, 4])
            it.allocate_tensors()
        assert [list(d["shape"]) for d in ours.get_output_details()] == [[batch, 3]] == \
            [list(d["shape"]) for d in theirs.get_output_details()]
        x = [rng.uniform(-1, 1, (batch, 4)).astype(np.float32)]
        want = _run(theirs, x)
        _assert_same(_run(ours, x), want, f"batch {batch}")
        ours.allocate_tensors()             # the same shapes: the input set stays (docs/usage.md)
        ours.invoke()
        _assert_same([ours.get_tensor(ours.get_output_details()[0]["index"])], want,
                     f"batch {batch}, invoked again after allocate_tensors without set_tensor")


def test_data_dependent_output_shapes_come_back_right():
    model = _boolean_mask()
    ours, theirs = _ours(model), _theirs(model)
    for x in (np.full((2, 3), 0.9, np.float32), np.array([[1, 0, 1], [0, 0, 0]], np.float32),
              np.array([[0, 0, 0], [0, 0, 0.75]], np.float32)):
        got = _run(ours, [x])
        _assert_same(got, _run(theirs, [x]), f"mask of {x.tolist()}")
        assert list(ours.get_output_details()[0]["shape"]) == [int((x > 0.5).sum())]
    zeros = np.zeros((2, 3), np.float32)    # none selected (LiteRT's get_tensor refuses it)
    assert _run(ours, [zeros])[0].shape == (0,)
    assert list(ours.get_output_details()[0]["shape"]) == [0]


# -- 4. signatures and control flow -----------------------------------------------------------
def test_signature_runners_run_their_subgraphs_as_litert():
    model = two_signature_model(resizable=True)
    ours, theirs = _ours(model), _theirs(model)
    assert ours.get_signature_list() == theirs.get_signature_list()
    for key, feeds in (("double", {"u": np.array([1.5, -2.0], np.float32)}),
                       ("main", {"x": np.array([-1, 0.5, 2], np.float32)}),
                       ("double", {"u": np.arange(5, dtype=np.float32) - 2})):     # resized
        got = ours.get_signature_runner(key)(**feeds)
        want = theirs.get_signature_runner(key)(**feeds)
        assert got.keys() == want.keys(), key
        for name in want:
            _assert_same([got[name]], [want[name]], f"signature {key} output {name}")


@pytest.mark.parametrize("c, n", [(True, 0), (False, 0), (False, 3), (False, 7)])
def test_if_and_while_run_on_litert_as_litert(c, n):
    model = delegated_around_if_model((2, 3))
    ours, theirs = _ours(model), _theirs(model)
    x = np.random.default_rng(n).uniform(-1, 1, (2, 3)).astype(np.float32)
    inputs = [np.array(c), np.array(n, np.int32), x]
    _assert_same(_run(ours, inputs), _run(theirs, inputs), f"IF {c} WHILE {n}")


# -- 5. intermediates and live views --------------------------------------------------------
def test_an_intermediate_needs_preserve_all_tensors_and_then_equals_litert():
    model, mid = _unary_chain()
    x = [np.array([[-1, 2, -3], [4, -5, 6]], np.float32)]
    ours = _ours(model)
    _run(ours, x)
    with pytest.raises(InterpreterStateError, match=r"'mid'.*experimental_preserve_all_tensors=True"):
        ours.get_tensor(mid)
    ours = _ours(model, experimental_preserve_all_tensors=True)
    with pytest.warns(UserWarning, match="preserve_all_tensors"):
        theirs = _theirs(model, experimental_preserve_all_tensors=True)
    _run(ours, x)
    _run(theirs, x)
    _assert_same([ours.get_tensor(mid)], [theirs.get_tensor(mid)], "intermediate 'mid'")


def test_tensor_views_of_inputs_and_outputs_are_live():
    model, _mid = _unary_chain()
    ours = _ours(model)
    x_index, y_index = ours.get_input_details()[0]["index"], ours.get_output_details()[0]["index"]
    x_view, y_view = ours.tensor(x_index)(), ours.tensor(y_index)()
    for value in (np.array([[1, -2, 3], [-4, 5, -6]], np.float32), np.full((2, 3), 7, np.float32)):
        x_view[...] = value                 # writing the input's view sets it
        ours.invoke()
        np.testing.assert_array_equal(y_view, np.maximum(value, 0) * 2)     # the view follows


# -- 6. errors and the caller's arrays ----------------------------------------------------------
def test_a_custom_op_litert_lacks_is_refused_naming_it():
    with pytest.raises(BackendUnavailable, match="CpuOnlyAbs"):
        Interpreter(model_content=_custom_op_model(), backend="litert")


AUTO_SCRIPT = """
import json, sys, warnings
sys.path.insert(0, sys.argv[1])
import numpy as np
import plugin_ops
from tflite_taichi import Interpreter, backend, litert_cpu
from test_litert_backend import _custom_op_model, _init_stores_a_handle, _unary_chain, _uncalled_assign_of_one_input
from tflite_taichi.errors import ModelError
warnings.simplefilter("ignore")
backend.choose_auto = lambda *a, **k: "cpu"      # as on a machine without a GPU
out = {}
it = Interpreter(model_content=_custom_op_model(), backend="auto")
it.allocate_tensors()
it.set_tensor(0, np.array([-1, 2, -3], np.float32))
it.invoke()
out["custom"] = [it.backend, it.summary()["litert_refused"], it.get_tensor(1).tolist()]
from tflite_taichi.cli import _device_text
out["custom_said"] = _device_text(it, it.summary())     # what `run`'s headline says
out["plain"] = Interpreter(model_content=_unary_chain()[0], backend="auto").backend
it = Interpreter(model_content=_uncalled_assign_of_one_input(), backend="auto")
it.allocate_tensors()
it.set_tensor(0, np.array([-1, 2] * 16, np.float32).reshape(1, 4, 4, 2))
it.invoke()
out["uncalled"] = [it.backend, it.summary()["litert_refused"], it.get_tensor(1).ravel().tolist()]
it = Interpreter(model_content=_init_stores_a_handle(), backend="auto")
try:
    it.allocate_tensors()
    out["handle"] = [it.backend, "allocated"]
except ModelError as e:
    out["handle"] = [it.backend, str(e)]
litert_cpu.available = lambda: False                    # as where LiteRT has no wheels
out["without"] = Interpreter(model_content=_unary_chain()[0], backend="auto").backend
print("RESULT " + json.dumps(out))
"""


def test_auto_without_a_gpu_falls_back_to_taichi_cpu_where_litert_cannot(tmp_path):
    """`auto` with no hardware GPU (forced here, so any machine tests the choice): LiteRT
    where it takes the model; Taichi's cpu (numpy for our custom op) where LiteRT lacks an op,
    summary() saying why, or where LiteRT is not installed, or where LiteRT would crash on the
    model. In a fresh process: Taichi's cpu starts there."""
    script = tmp_path / "auto.py"
    script.write_text(AUTO_SCRIPT)
    tests = os.path.dirname(os.path.abspath(__file__))
    done = subprocess.run([sys.executable, str(script), tests], capture_output=True, text=True,
                          timeout=300)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, done.stdout[-2000:] + done.stderr[-3000:]
    import json
    out = json.loads(lines[0][len("RESULT "):])
    backend, refused, y = out["custom"]
    assert backend == "cpu" and "CpuOnlyAbs" in refused and y == [1, 2, 3], out
    assert out["custom_said"].startswith("cpu (Taichi on the CPU: no hardware GPU was found, and "
                                         "LiteRT cannot run the model: "), out["custom_said"]
    assert "CpuOnlyAbs" in out["custom_said"], out["custom_said"]
    # models LiteRT would crash on (section 9): Taichi's cpu runs them, or says what is wrong
    backend, refused, y = out["uncalled"]
    assert backend == "cpu" and "ASSIGN_VARIABLE" in refused and y == [0, 2] * 16, out
    backend, said = out["handle"]
    assert backend == "cpu" and "op #2 (ASSIGN_VARIABLE): input 1 ('ha')" in said, out
    assert out["plain"] == "litert" and out["without"] == "cpu", out


def test_fp16_and_a_missing_litert_are_refused_with_the_reason(monkeypatch):
    model, _mid = _unary_chain()
    with pytest.raises(BackendUnavailable, match="fp16.*LiteRT's CPU kernels run fp32"):
        Interpreter(model_content=model, backend="litert", precision="fp16")
    monkeypatch.setattr(litert_cpu, "available", lambda: False)
    with pytest.raises(BackendUnavailable, match="pip install ai-edge-litert"):
        Interpreter(model_content=model, backend="litert")


@pytest.mark.parametrize("value, match", [
    (np.zeros((2, 3), np.float64), "got float64 data, the input is float32"),
    (np.zeros((3, 2), np.float32), r"got shape \[3, 2\], expected \[2, 3\]"),
    (np.zeros((2, 3), np.int8), "got int8 data"),
])
def test_wrong_dtype_or_shape_to_set_tensor_is_an_input_error(value, match):
    ours = _ours(_unary_chain()[0])
    with pytest.raises(InputError, match=match):
        ours.set_tensor(0, value)


def test_nothing_the_caller_passed_is_modified():
    model = _dynamic_batch()
    ours = _ours(model)
    x = np.array([[1, -2, 3, -4]], np.float32)
    x.setflags(write=False)                 # a read-only array is fine: it is copied in
    kept = x.copy()
    ours.set_tensor(0, x)
    ours.invoke()
    y = ours.get_tensor(ours.get_output_details()[0]["index"])
    want = y.copy()
    y += 100                                # the caller's copy: the interpreter's stays
    np.testing.assert_array_equal(ours.get_tensor(ours.get_output_details()[0]["index"]), want)
    ours.invoke()
    np.testing.assert_array_equal(x, kept)
    np.testing.assert_array_equal(ours.get_tensor(ours.get_output_details()[0]["index"]), want)


# -- 7. close(), summary ------------------------------------------------------------------------
def test_close_then_allocate_runs_again_and_summary_reports_threads():
    model, _mid = _unary_chain()
    ours = _ours(model)
    x = [np.array([[1, -2, 3], [-4, 5, -6]], np.float32)]
    want = _run(ours, x)
    ours.close()
    with pytest.raises(InterpreterStateError, match="close"):
        ours.invoke()
    ours.allocate_tensors()
    _assert_same(_run(ours, x), want, "after close() and allocate_tensors()")
    executor = ours.summary()["cpu_executor"]
    assert executor["runtime"] == "litert" and executor["threads"] == THREADS, executor
    assert ours.summary()["litert_refused"] is None


def test_close_keeps_resource_variables_as_the_other_backends_do():
    """Resource variables live as long as the interpreter (and CALL_ONCE runs once): close()
    and allocate_tensors() go on from the state, as on the reference path."""
    model = accumulator_model((3,), np.array([1, 2, 3], np.float32))
    x = [np.ones(3, np.float32)]
    answers = {}
    for backend in ("litert", "reference"):
        it = Interpreter(model_content=model, backend=backend)
        it.allocate_tensors()
        _run(it, x)
        it.close()
        it.allocate_tensors()
        answers[backend] = _run(it, x)[0]
    np.testing.assert_array_equal(answers["litert"], answers["reference"])
    np.testing.assert_array_equal(answers["litert"], (np.array([1, 2, 3]) + 2) * 2)


# -- 8. hostile model bytes -----------------------------------------------------------------
FUZZ_CASES = 400                    # about 6 s here
# the same cases every CI run (TFLITE_TAICHI_FUZZ_SEED explores others): the default, and the
# seeds whose variants crashed LiteRT before its guards (litert_cpu.refuse_what_litert_trusts),
# a few seconds each: 1, an ASSIGN_VARIABLE of one input in CALL_ONCE's init subgraph; 29,
# okay_nabu's init assigning a variable a value of another shape. (Seed 25, okay_nabu's init
# storing a resource handle as a value, takes ~20 s: section 9's model holds that class.)
FUZZ_SEED = 0
FUZZ_SEEDS_CRASHED_BEFORE = (1, 29)
FUZZ_SEEDS = ("cnn", "elementwise+defaults", "control", "zoo", "int8", "shared:okay_nabu")
FUZZ_HANG_S = 15.0                  # no progress for this long: the child is stuck
                                    # (a case takes well under 1 s)
BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench")


def _fuzz_corpus():
    """(bench/fuzz.py, its corpus of FUZZ_SEEDS, each as likely)."""
    if BENCH not in sys.path:
        sys.path.insert(0, BENCH)
    import fuzz
    corpus = fuzz.Corpus(include_shared=False)
    corpus.models.update(fuzz.shared_seeds())
    corpus.names = [n for n in FUZZ_SEEDS if n in corpus.models]
    corpus.layouts = {n: corpus.layouts.get(n) or fuzz.walk(corpus.models[n]) for n in corpus.names}
    corpus.weights = [1.0] * len(corpus.names)
    return fuzz, corpus


def _endless_on_the_reference_path(run_seed: int, case_index: int) -> bool:
    """Whether the case is a WHILE that never ends (the reference path says so within 3 s of
    CPU): LiteRT loops on as it does, which is no hang of ours (docs/fuzzing.md)."""
    fuzz, corpus = _fuzz_corpus()
    case = fuzz.make_case(corpus, run_seed, case_index)
    return fuzz.check_model(case.data(corpus), "reference", case.input_seed, 3.0)["outcome"] == "endless_loop"


def _fuzz_child(run_seed: int, start: int, count: int) -> None:
    """Cases start .. start+count-1 through Interpreter(backend='litert'); before each one a
    `CASE i` line, after it `OK i`, `ERR i` (one of ours) or `BAD i ...` (anything else)."""
    import resource
    import warnings
    warnings.simplefilter("ignore")
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)     # a huge allocation fails, not the box
    resource.setrlimit(resource.RLIMIT_AS, (min(4 << 30, hard) if hard > 0 else 4 << 30, hard))
    from tflite_taichi.errors import TfliteTaichiError
    fuzz, corpus = _fuzz_corpus()
    for i in range(start, start + count):
        case = fuzz.make_case(corpus, run_seed, i)
        print(f"CASE {i} {case.model}", flush=True)
        try:
            it = Interpreter(model_content=case.data(corpus), backend="litert", num_threads=1)
            it.allocate_tensors()
            fuzz._random_inputs(it, np.random.default_rng(case.input_seed))
            it.invoke()
            for d in it.get_output_details():
                it.get_tensor(d["index"])
            print(f"OK {i}", flush=True)
        except TfliteTaichiError:
            print(f"ERR {i}", flush=True)
        except Exception as e:          # noqa: BLE001  (the point: anything else is a finding)
            print(f"BAD {i} {type(e).__module__}.{type(e).__name__}: {str(e)[:200]!r}", flush=True)


def _watch(child, last, stuck) -> None:
    """Kills `child` once it has said nothing for FUZZ_HANG_S (`stuck` then set)."""
    while child.poll() is None:
        if time.monotonic() - last[1] > FUZZ_HANG_S:
            stuck.set()
            child.kill()
        time.sleep(0.5)


def _fuzz_run(run_seed: int, cases: int) -> dict:
    """Every case in child processes (a crash ends one child; the next starts after that
    case): {'OK'/'ERR': count, 'BAD'/'CRASH'/'HANG': [what happened]}."""
    import threading
    found = {"OK": 0, "ERR": 0, "BAD": [], "CRASH": [], "HANG": []}     # ERR: ours, or an endless WHILE
    here = os.path.abspath(__file__)
    start = 0
    while start < cases:
        child = subprocess.Popen([sys.executable, here, "fuzz-child", str(run_seed), str(start),
                                  str(cases - start)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True, cwd=os.path.dirname(here))
        last = [None, time.monotonic()]     # the case running, when the child last spoke
        finished = None                     # the last case the child answered for
        stuck = threading.Event()
        threading.Thread(target=_watch, args=(child, last, stuck), daemon=True).start()
        for line in child.stdout:
            kind, _, rest = line.strip().partition(" ")
            last[1] = time.monotonic()
            if kind == "CASE":
                last[0] = rest
            elif kind in ("OK", "ERR"):
                found[kind] += 1
                finished = rest
            elif kind == "BAD":
                found["BAD"].append(f"seed {run_seed} {rest}")
                finished = rest.split()[0]
        code = child.wait()
        stderr = child.stderr.read()
        if code == 0:
            break
        case = int(last[0].split()[0]) if last[0] else start
        what = f"seed {run_seed} case {last[0]} (rc {code}): {stderr.strip()[-300:]}"
        if last[0] and finished == last[0].split()[0]:
            # a heap overwritten by an earlier case is found later, here at the child's exit
            what = (f"seed {run_seed}: the child crashed (rc {code}) after its last case, {last[0]}: "
                    f"a case in {start}..{case} overwrote memory (bisect: python tests/"
                    f"test_litert_backend.py fuzz-child {run_seed} START COUNT): {stderr.strip()[-300:]}")
        if not stuck.is_set():
            found["CRASH"].append(what)
        elif _endless_on_the_reference_path(run_seed, case):
            found["ERR"] += 1           # an endless WHILE: it passes, as in bench/fuzz.py
        else:
            found["HANG"].append(what)
        start = case + 1
    return found


def _fuzz_seeds() -> tuple:
    """TFLITE_TAICHI_FUZZ_SEED alone where it is set, else the fixed seeds."""
    chosen = os.environ.get("TFLITE_TAICHI_FUZZ_SEED")
    return (int(chosen),) if chosen else (FUZZ_SEED,) + FUZZ_SEEDS_CRASHED_BEFORE


@pytest.mark.parametrize("run_seed", _fuzz_seeds())
def test_hostile_model_bytes_never_crash_the_litert_path(run_seed):
    """Mutated and truncated variants of small builder models and okay_nabu (bench/fuzz.py's
    mutators): each runs, or raises one of our errors, in a child process; a crash prints the
    variant's seed and case (rerun: python tests/test_litert_backend.py fuzz-child SEED CASE 1).
    Our prepare must refuse what LiteRT's kernels would crash on before LiteRT prepares it."""
    print(f"\nlitert fuzz seed {run_seed}")
    found = _fuzz_run(run_seed, FUZZ_CASES)
    assert not (found["CRASH"] or found["HANG"] or found["BAD"]), found
    assert found["OK"] + found["ERR"] == FUZZ_CASES, found
    assert found["OK"] > 0 and found["ERR"] > 0, found      # the mutations reach both ends


# -- 9. what LiteRT would crash on is refused before it reads the model ----------------------
# LiteRT's first allocation hands every node of every subgraph to XNNPACK, which reads a node's
# inputs by position, before our prepare saw the subgraphs main does not call; its kernels
# trust what their Prepare is given. Each model below crashed LiteRT (a segfault, or a heap
# overwritten) where it was let through; they run in a child, where a crash cannot end pytest.
def _relu_main(b):
    g = b.subgraph("main")
    x = g.input("x", (1, 4, 4, 2))
    y = g.tensor("y", (1, 4, 4, 2))
    g.op("RELU", [x], [y])
    g.output(y)


def _uncalled_assign_of_one_input():
    """main: RELU; subgraph 1, which nothing calls, assigns a variable without a value."""
    b = ModelBuilder()
    _relu_main(b)
    spare = b.subgraph("spare")
    h = spare.tensor("h", (), RESOURCE)
    spare.op("VAR_HANDLE", [], [h], shared_name="v")
    spare.op("ASSIGN_VARIABLE", [h], [])
    return b.finish()


def _init_stores_a_handle():
    """CALL_ONCE's init stores VAR_HANDLE 'a''s handle (a RESOURCE tensor) as variable 'b''s
    value; main reads 'b' as float data (okay_nabu's init so mutated overwrote LiteRT's heap)."""
    b = ModelBuilder()
    g = b.subgraph("main")
    x = g.input("x", (2,))
    g.op("CALL_ONCE", [], [], init_subgraph_index=1)
    hb = g.tensor("hb", (), RESOURCE)
    g.op("VAR_HANDLE", [], [hb], shared_name="b")
    state = g.tensor("state", (2,))
    g.op("READ_VARIABLE", [hb], [state])
    y = g.tensor("y", (2,))
    g.op("ADD", [state, x], [y])
    g.output(y)
    init = b.subgraph("init")
    ha, hb = init.tensor("ha", (), RESOURCE), init.tensor("hb", (), RESOURCE)
    init.op("VAR_HANDLE", [], [ha], shared_name="a")
    init.op("VAR_HANDLE", [], [hb], shared_name="b")
    init.op("ASSIGN_VARIABLE", [hb, ha], [])
    return b.finish()


def _while_body_omits_an_input():
    """A WHILE whose body's MUL omits its input 0 (-1): MUL's kernel reads it as a tensor."""
    b = ModelBuilder()
    g = b.subgraph("main")
    x = g.input("x", (2,))
    i_out, w_out = g.tensor("i_out", (), np.int32), g.tensor("w_out", (2,))
    g.op("WHILE", [g.const("i0", np.int32(0)), x], [i_out, w_out], cond_subgraph_index=1,
         body_subgraph_index=2)
    g.output(w_out)
    cond = b.subgraph("cond")
    ci = cond.input("i", (), np.int32)
    cond.input("w", (2,))
    go = cond.tensor("go", (), np.bool_)
    cond.op("LESS", [ci, cond.const("n", np.int32(3))], [go])
    cond.output(go)
    body = b.subgraph("body")
    bi, _bw = body.input("i", (), np.int32), body.input("w", (2,))
    ni, nw = body.tensor("i_next", (), np.int32), body.tensor("w_next", (2,))
    body.op("ADD", [bi, body.const("one", np.int32(1))], [ni])
    body.op("MUL", [-1, body.const("half", np.float32(0.5))], [nw])
    body.output(ni, nw)
    return b.finish()


def _variable_of_two_shapes():
    """CALL_ONCE's init assigns variable 'v' a [2, 64] value; main reads and assigns it as
    [8, 64] (okay_nabu's init so mutated overwrote LiteRT's heap)."""
    b = ModelBuilder()
    g = b.subgraph("main")
    x = g.input("x", (8, 64))
    g.op("CALL_ONCE", [], [], init_subgraph_index=1)
    h = g.tensor("h", (), RESOURCE)
    g.op("VAR_HANDLE", [], [h], shared_name="v")
    state = g.tensor("state", (8, 64))
    g.op("READ_VARIABLE", [h], [state])
    total = g.tensor("total", (8, 64))
    g.op("ADD", [state, x], [total])
    g.op("ASSIGN_VARIABLE", [h, total], [])
    g.output(total)
    init = b.subgraph("init")
    hi = init.tensor("h", (), RESOURCE)
    init.op("VAR_HANDLE", [], [hi], shared_name="v")
    init.op("ASSIGN_VARIABLE", [hi, init.const("zeros", np.zeros((2, 64), np.float32))], [])
    return b.finish()


LITERT_CRASHERS = {     # model -> what the refusal says
    "_uncalled_assign_of_one_input": r"subgraph 1 op #1 \(ASSIGN_VARIABLE\) takes 2 inputs, has 1",
    "_init_stores_a_handle": r"subgraph 1 op #2 \(ASSIGN_VARIABLE\) has input 1 \('ha'\) of type RESOURCE",
    "_while_body_omits_an_input": r"subgraph 2 op #1 \(MUL\) omits its input 0",
    "_variable_of_two_shapes": r"variable 'h' is held by subgraph 0 op #2 \(READ_VARIABLE\) as "
                               r"FLOAT32 \[8, 64\] and by subgraph 1 op #1 \(ASSIGN_VARIABLE\) as FLOAT32 \[2, 64\]",
}

CRASHERS_SCRIPT = """
import json, sys, warnings
sys.path.insert(0, sys.argv[1])
import numpy as np
import test_litert_backend as here
from tflite_taichi import Interpreter
warnings.simplefilter("ignore")
for name in sys.argv[2:]:
    print("CASE", name, flush=True)
    try:
        it = Interpreter(model_content=getattr(here, name)(), backend="litert", num_threads=1)
        it.allocate_tensors()
        x = it.get_input_details()[0]
        it.set_tensor(x["index"], np.ones(x["shape"], x["dtype"]))
        it.invoke()
        result = ["ran", ""]
    except Exception as e:
        result = [type(e).__name__, str(e)]
    print("RESULT " + json.dumps([name] + result), flush=True)
"""


@pytest.fixture(scope="module")
def crashers_on_litert(tmp_path_factory):
    """{model: [what backend='litert' did: 'ran' or the exception's type, its message]}, all
    in one child; a model the child did not finish maps to how the child ended."""
    import json
    script = tmp_path_factory.mktemp("crashers") / "crashers.py"
    script.write_text(CRASHERS_SCRIPT)
    tests = os.path.dirname(os.path.abspath(__file__))
    done = subprocess.run([sys.executable, str(script), tests, *LITERT_CRASHERS], capture_output=True,
                          text=True, timeout=300)
    found = {}
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            name, kind, message = json.loads(line[len("RESULT "):])
            found[name] = [kind, message]
    ended = f"the child ended (rc {done.returncode}) before finishing it: {done.stderr[-1500:]}"
    return {name: found.get(name, ["crashed", ended]) for name in LITERT_CRASHERS}


@pytest.mark.parametrize("name", sorted(LITERT_CRASHERS))
def test_what_litert_would_crash_on_is_refused_before_it_reads_the_model(name, crashers_on_litert):
    kind, message = crashers_on_litert[name]
    assert kind == "BackendUnavailable", (name, kind, message)
    assert re.search(LITERT_CRASHERS[name], message), (name, message)


def test_a_handle_stored_as_a_variable_value_is_a_model_error_on_every_path():
    """The reference path (Taichi's cpu, where `auto` falls back) refuses it at prepare."""
    with pytest.raises(ModelError, match=r"op #2 \(ASSIGN_VARIABLE\): input 1 \('ha'\).*without data"):
        Interpreter(model_content=_init_stores_a_handle(), backend="reference").allocate_tensors()


def test_an_omitted_input_runs_on_litert_where_its_kernel_checks_for_it():
    """FULLY_CONNECTED without a bias (-1): its LiteRT kernel tests for the omission
    (OpDef.litert_checks_omitted_inputs), so the model stays on LiteRT and equals it."""
    b = ModelBuilder()
    g = b.subgraph()
    x = g.input("x", (2, 4))
    y = g.tensor("y", (2, 3))
    g.op("FULLY_CONNECTED", [x, g.const("w", np.arange(12, dtype=np.float32).reshape(3, 4) / 10), -1], [y])
    g.output(y)
    model = b.finish()
    ours = _ours(model)
    assert ours.backend == "litert"
    x = [np.random.default_rng(4).uniform(-1, 1, (2, 4)).astype(np.float32)]
    _assert_same(_run(ours, x), _run(_theirs(model), x), "FULLY_CONNECTED without bias")


if __name__ == "__main__" and sys.argv[1:2] == ["fuzz-child"]:
    _fuzz_child(*(int(a) for a in sys.argv[2:5]))


# -- 8. where the io data lives: LiteRT's tensors, until a view is handed out ------------------
# set_tensor / get_tensor copy straight into and out of LiteRT's tensors (the lean path,
# executor.SubgraphState.litert_lean); every other way in or out must see the same data
def test_inputs_set_on_the_lean_path_are_what_every_other_path_sees():
    model, _mid = _unary_chain()
    ours = _ours(model)
    x = np.array([[1, -2, 3], [-4, 5, -6]], np.float32)
    ours.set_tensor(0, x)
    np.testing.assert_array_equal(ours.get_tensor(0), x)               # read back before invoke
    y_index = ours.get_output_details()[0]["index"]
    np.testing.assert_array_equal(ours.get_tensor(y_index), np.zeros((2, 3), np.float32))
    ours.invoke()
    want = np.maximum(x, 0) * 2
    np.testing.assert_array_equal(ours.get_tensor(y_index), want)
    x_view, y_view = ours.tensor(0)(), ours.tensor(y_index)()           # the data moves to the views
    np.testing.assert_array_equal(x_view, x)
    np.testing.assert_array_equal(y_view, want)
    ours.set_tensor(0, -x)                  # set_tensor after a view: the view shows it
    np.testing.assert_array_equal(x_view, -x)
    ours.invoke()
    np.testing.assert_array_equal(y_view, np.maximum(-x, 0) * 2)
    np.testing.assert_array_equal(ours.get_tensor(y_index), np.maximum(-x, 0) * 2)


def test_the_other_byte_order_and_other_index_types_take_the_checked_path():
    model, _mid = _unary_chain()
    ours, theirs = _ours(model), _theirs(model)
    x = np.array([[1.5, -2, 3], [-4, 5.25, -6]], np.float32)
    y_index = ours.get_output_details()[0]["index"]
    ours.set_tensor(np.int64(0), x.astype(">f4"))       # values converted, not bytes reread
    ours.invoke()
    want = _run(theirs, [x])[0]
    np.testing.assert_array_equal(ours.get_tensor(np.int32(y_index)), want)
    for bad in (0.0, "0", None):
        with pytest.raises(InputError, match="out of range"):
            ours.set_tensor(bad, x)
        with pytest.raises(InputError, match="out of range"):
            ours.get_tensor(bad if bad != 0.0 else float(y_index))
    with pytest.raises(InputError, match="neither an input nor an output"):
        ours.set_tensor(_mid, x)
    with pytest.raises(InputError, match=r"got shape \[1, 6\], expected \[2, 3\]"):
        ours.set_tensor(0, x.reshape(1, 6))
    with pytest.raises(InputError, match="got float64 data"):
        ours.set_tensor(0, [[1.0, 2, 3], [4, 5, 6]])
    ours.set_tensor(0, x[:, ::-1])                      # a strided view: its values, in order
    ours.invoke()
    np.testing.assert_array_equal(ours.get_tensor(y_index), np.maximum(x[:, ::-1], 0) * 2)


def test_an_output_set_by_the_caller_reads_back_until_the_next_invoke():
    model, _mid = _unary_chain()
    ours = _ours(model)
    y_index = ours.get_output_details()[0]["index"]
    ours.set_tensor(y_index, np.full((2, 3), 9, np.float32))
    np.testing.assert_array_equal(ours.get_tensor(y_index), np.full((2, 3), 9, np.float32))
    ours.set_tensor(0, np.ones((2, 3), np.float32))
    ours.invoke()
    np.testing.assert_array_equal(ours.get_tensor(y_index), np.full((2, 3), 2, np.float32))


def test_inputs_survive_close_and_a_resize_that_does_not_fit():
    model = _dynamic_batch()
    ours, reference = _ours(model), Interpreter(model_content=model, backend="reference")
    reference.allocate_tensors()
    x = np.array([[1, -2, 3, -4]], np.float32)
    out = ours.get_output_details()[0]["index"]
    for it in (ours, reference):
        it.set_tensor(0, x)
        it.invoke()
    want = reference.get_tensor(out)
    ours.close()
    ours.allocate_tensors()                 # same shapes: the input set before close() stays
    ours.invoke()
    np.testing.assert_array_equal(ours.get_tensor(out), want)
    ours.resize_tensor_input(0, [1, 5])     # FULLY_CONNECTED's weights take 4 features
    with pytest.raises(InputError, match="does not fit the model"):
        ours.allocate_tensors()
    np.testing.assert_array_equal(ours.get_tensor(0), x)
    ours.invoke()
    np.testing.assert_array_equal(ours.get_tensor(out), want)
    ours.resize_tensor_input(0, [1, 4])
    with pytest.raises(NotReadyError, match="before allocate_tensors"):
        ours.set_tensor(0, x)               # a resize asks for allocate_tensors first
    with pytest.raises(NotReadyError, match="before allocate_tensors"):
        ours.invoke()


def test_a_resize_litert_refuses_puts_litert_back_with_the_inputs(monkeypatch):
    """LiteRT resized its tensors, then the allocation failed: the interpreter keeps its previous
    shapes (executor.SubgraphState.allocate), so LiteRT's tensors must go back to them too,
    holding the inputs set before."""
    model = _dynamic_batch()
    ours = _ours(model)
    x = np.array([[1, -2, 3, -4]], np.float32)
    out = ours.get_output_details()[0]["index"]
    ours.set_tensor(0, x)
    ours.invoke()
    want = ours.get_tensor(out)
    real = litert_cpu.LiteRTModel.allocate

    def allocates_then_fails(self, subgraph, shapes):
        real(self, subgraph, shapes)
        if any(s[0] == 3 for s in shapes.values()):
            raise BackendUnavailable("planted: LiteRT cannot allocate this")
    monkeypatch.setattr(litert_cpu.LiteRTModel, "allocate", allocates_then_fails)
    ours.resize_tensor_input(0, [3, 4])
    with pytest.raises(BackendUnavailable, match="planted"):
        ours.allocate_tensors()
    ours.invoke()
    got = ours.get_tensor(out)
    assert got.shape == (1, 3), got.shape
    np.testing.assert_array_equal(got, want)
