"""Concurrency: interpreters used from several threads at once.

- Two interpreters of one backend in two threads: each gets its own answers, on the reference
  path and on Taichi (cpu and vulkan), kernels compiled in the threads too (Taichi's front end
  is not thread-safe: codegen.TAICHI_LOCK serialises every call into it; without it, two
  threads compiling at once fail with "Kernels cannot call other kernels").
- One interpreter invoked from several threads: its lock runs the calls one at a time (each as
  if alone), and a SignatureRunner call (inputs in, outputs out) is one such call.
Processes sharing a cache_dir: tests/test_cache.py."""
import os
import threading
import time
import traceback
import warnings

import numpy as np
import pytest

from scenarios import in_subprocesses, run_scenarios

from tflite_taichi import Interpreter
from tflite_taichi.builder import ModelBuilder

TAICHI_BACKENDS = [b for b in os.environ.get("TFLITE_TAICHI_TEST_BACKENDS", "cpu,vulkan,opengl").split(",")
                   if b in ("cpu", "vulkan")]
SHAPE = (1, 12, 12, 8)


def _model(seed: int) -> bytes:
    """CONV_2D 3x3 (+RELU) -> MEAN over H, W: a different model per seed."""
    rng = np.random.default_rng(seed)
    b = ModelBuilder()
    g = b.subgraph()
    x = g.input("x", SHAPE)
    c = g.tensor("c", SHAPE)
    y = g.tensor("y", (1, 8))
    g.op("CONV_2D", [x, g.const("w", rng.normal(0, 0.3, (8, 3, 3, 8)).astype(np.float32)),
                     g.const("b", rng.normal(0, 0.1, 8).astype(np.float32))], [c],
         padding="SAME", stride_w=1, stride_h=1, fused_activation_function="RELU")
    g.op("MEAN", [c, g.const("axes", np.array([1, 2], np.int32))], [y])
    g.output(y)
    b.signature("serving_default", 0, {"x": x}, {"y": y})
    return b.finish()


def _inputs(seed: int, n: int) -> list:
    rng = np.random.default_rng(1000 + seed)
    return [rng.uniform(-1, 1, SHAPE).astype(np.float32) for _ in range(n)]


def _expected(model: bytes, xs: list) -> list:
    it = Interpreter(model_content=model, backend="reference")
    it.allocate_tensors()
    out = []
    for x in xs:
        it.set_tensor(0, x)
        it.invoke()
        out.append(it.get_tensor(it.get_output_details()[0]["index"]))
    return out


def _threads(target, n: int) -> list:
    """Run target(i, barrier) in n threads started together; the exceptions they raised."""
    barrier, errors = threading.Barrier(n), []

    def run(i):
        try:
            target(i, barrier)
        except BaseException:
            errors.append(traceback.format_exc())
    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads), "a thread hung"
    return errors


def two_interpreters(backend: str, invokes: int = 15) -> None:
    """Two models, two interpreters, two threads: built, compiled and invoked at the same time."""
    models = [_model(s) for s in (1, 2)]
    inputs = [_inputs(s, invokes) for s in (1, 2)]
    expected = [_expected(m, xs) for m, xs in zip(models, inputs)]

    def work(i, barrier):
        barrier.wait()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            it = Interpreter(model_content=models[i], backend=backend)
        it.allocate_tensors()
        out = it.get_output_details()[0]["index"]
        for x, want in zip(inputs[i], expected[i]):
            it.set_tensor(0, x)
            it.invoke()
            np.testing.assert_allclose(it.get_tensor(out), want, rtol=1e-5, atol=1e-5)
    errors = _threads(work, 2)
    assert not errors, "\n".join(errors)


def one_interpreter(backend: str, threads: int = 3, calls: int = 8) -> None:
    """One interpreter, several threads: SignatureRunner calls each get their own outputs, and
    invoke() never runs twice at once (an instrumented invoke counts overlaps)."""
    model = _model(3)
    inputs = [_inputs(10 + i, calls) for i in range(threads)]
    expected = [_expected(model, xs) for xs in inputs]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        it = Interpreter(model_content=model, backend=backend)
    it.allocate_tensors()
    runner = it.get_signature_runner()
    state, active, overlaps = it._main, [0], []

    def counted(original):
        def instrumented(*args):
            active[0] += 1
            if active[0] > 1:
                overlaps.append(active[0])
            time.sleep(0.002)           # a window for another thread to enter, were it unlocked
            try:
                return original(*args)
            finally:
                active[0] -= 1
        return instrumented
    # every way an invoke reaches the graph: ours, LiteRT's (and its lean path: executor.
    # SubgraphState.invoke_litert_lean, which Interpreter.invoke calls straight)
    for name in ("_invoke", "_invoke_litert", "invoke_litert_lean"):
        setattr(state, name, counted(getattr(state, name)))

    def work(i, barrier):
        barrier.wait()
        for x, want in zip(inputs[i], expected[i]):
            np.testing.assert_allclose(runner(x=x)["y"], want, rtol=1e-5, atol=1e-5)
            it.set_tensor(0, x)         # the tf.lite calls, interleaved between threads
            it.invoke()
            assert it.get_tensor(it.get_output_details()[0]["index"]).shape == (1, 8)
    errors = _threads(work, threads)
    assert not errors, "\n".join(errors)
    assert not overlaps, f"invoke() ran {max(overlaps)} times at once"


def test_two_interpreters_in_two_threads_reference():
    two_interpreters("reference")


def test_one_interpreter_from_several_threads_reference():
    one_interpreter("reference")


def test_two_interpreters_in_two_threads_litert():
    two_interpreters("litert")


def test_one_interpreter_from_several_threads_litert():
    """The lean path (set_tensor / invoke / get_tensor straight to LiteRT) holds the lock too."""
    one_interpreter("litert")


@pytest.mark.parametrize("backend", ["reference", "litert"])
def test_the_lock_is_what_serialises(monkeypatch, backend):
    """The overlap check can fail: without the interpreter's lock, invokes do overlap."""
    import tflite_taichi.interpreter as interp

    class NoLock:
        def acquire(self):
            return True

        def release(self):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False
    monkeypatch.setattr(interp.threading, "RLock", NoLock)
    with pytest.raises(AssertionError):        # mixed-up outputs, or overlapping invokes
        one_interpreter(backend, threads=3, calls=3)


def run_all(backend: str) -> dict:
    return run_scenarios({"two_interpreters": two_interpreters, "one_interpreter": one_interpreter},
                         backend)


@pytest.fixture(scope="module")
def taichi_results():
    """All scenarios on each Taichi backend, the backends' subprocesses running at once."""
    return in_subprocesses("test_concurrency", TAICHI_BACKENDS)


@pytest.mark.parametrize("backend", TAICHI_BACKENDS)
@pytest.mark.parametrize("name", ["two_interpreters", "one_interpreter"])
def test_taichi(taichi_results, backend, name):
    result = taichi_results[backend]
    assert isinstance(result, dict), f"the {backend} subprocess failed:\n{result}"
    assert result[name] == "ok", result[name]
