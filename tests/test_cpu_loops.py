"""The CPU without a GPU. The `cpu` backend's loops: each
top-level loop of a partition runs on the interpreter's thread budget, or serially in the
caller's thread where the partition's work is too small to pay for Taichi's thread-pool dispatch
(costs.cpu_loop_threads); the choice is compiled into the kernels, so it is in the cache key, and
the kernels' answers do not depend on it. `auto`'s choice between numpy and Taichi per op
(costs.numpy_wins_on_cpu). Measured: bench/results/cpu_taichi_2core.md."""
import glob
import os
import re
import warnings

import numpy as np
import pytest

from tflite_taichi import Interpreter, costs
from tflite_taichi.builder import ModelBuilder


def add_chain(n: int, ops: int = 2) -> bytes:
    b = ModelBuilder()
    g = b.subgraph()
    cur = g.input("x", (1, n))
    for k in range(ops):
        y = g.tensor(f"y{k}", (1, n))
        g.op("ADD", [cur, g.const(f"c{k}", np.full((1, n), k + 1, np.float32))], [y])
        cur = y
    g.output(cur)
    return b.finish()


SMALL, BIG = 256, 1 << 18      # work ~0.1 us and ~220 us by costs.work_us


def _task_kinds(cache: str) -> set:
    """The kinds of the x64 tasks compiled into the cache's modules (`..._kernel_<i>_<kind>`)."""
    kinds = set()
    for path in glob.glob(os.path.join(cache, "modules", "*", "module", "*.ll")):
        with open(path) as f:
            kinds |= set(re.findall(r"define [^@]*@\w+_kernel_\d+_([a-z_]+)\b", f.read()))
    return kinds


def _run(model: bytes, cache: str, num_threads=2) -> np.ndarray:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        it = Interpreter(model_content=model, backend="cpu", cache_dir=cache, num_threads=num_threads)
        it.allocate_tensors()
    n = it.get_input_details()[0]["shape"][1]
    x = np.linspace(-1, 1, n, dtype=np.float32).reshape(1, n)
    it.set_tensor(it.get_input_details()[0]["index"], x)
    it.invoke()
    y = it.get_tensor(it.get_output_details()[0]["index"])
    # Taichi compiles with fast math, which may fold the two adds into one: 1 ulp at |y| <= 4
    np.testing.assert_allclose(y, x + np.float32(3), rtol=0, atol=2.0 ** -21)
    return y


def test_the_rule():
    steps_small = _steps(add_chain(SMALL))
    steps_big = _steps(add_chain(BIG))
    assert costs.work_us(steps_small) < costs.SERIAL_BELOW_US < costs.work_us(steps_big)
    assert costs.cpu_loop_threads(steps_small, 4) == 1
    assert costs.cpu_loop_threads(steps_big, 4) == 4
    assert costs.cpu_loop_threads(steps_big, 1) == 1


def _prepared(model: bytes):
    from tflite_taichi import graph as graph_mod
    from tflite_taichi.model import read_model
    m = read_model(model)
    sg = m.subgraphs[0]
    return graph_mod.prepare(sg, graph_mod.resolve_ops(m),
                             {t: tuple(sg.tensors[t].shape) for t in sg.inputs})


def _steps(model: bytes):
    return _prepared(model).steps


@pytest.mark.parametrize("n, num_threads, kind", [
    (SMALL, 2, "serial"),        # small: one serial task, no dispatch to the pool
    (BIG, 2, "range_for"),       # big: a parallel loop on the budget
    (BIG, 1, "serial"),          # a budget of one thread: serial whatever the size
])
def test_compiled_loops_follow_the_rule(tmp_path, n, num_threads, kind):
    _run(add_chain(n), str(tmp_path), num_threads)
    assert _task_kinds(str(tmp_path)) == {kind}


def test_budget_is_in_the_plan_digest(tmp_path):
    """The same model with another budget has another plan: its digest differs. (That the
    modules the cache is asked for differ too is tests/test_cache.py's
    test_the_thread_budget_reaches_the_module_key.)"""
    digests = []
    for threads in (2, 1):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            it = Interpreter(model_content=add_chain(BIG), backend="cpu", cache_dir=str(tmp_path),
                             num_threads=threads)
            it.allocate_tensors()
        digests.append(it._main.program.plan_digest())
    assert digests[0] != digests[1]


def _conv(size: int, channels: int) -> bytes:
    rng = np.random.default_rng(0)
    b = ModelBuilder()
    g = b.subgraph()
    x = g.input("x", (1, size, size, channels))
    y = g.tensor("y", (1, size, size, channels))
    g.op("CONV_2D", [x, g.const("w", rng.uniform(-1, 1, (channels, 3, 3, channels)).astype(np.float32)),
                     g.const("b", np.zeros(channels, np.float32))], [y],
         padding="SAME", stride_h=1, stride_w=1)
    g.output(y)
    return b.finish()


@pytest.mark.parametrize("size, channels, on_numpy", [
    (4, 4, False),       # ~0.1 us of work: numpy's per-op cost and the crossing would dominate
    (128, 16, True),     # ~6 ms of multiply-adds: numpy's im2col + BLAS (numpy_faster_on_cpu)
])
def test_auto_without_gpu_keeps_only_big_ops_on_numpy(size, channels, on_numpy):
    """backend='auto' on a machine without a GPU (the policy, whatever this machine has): an op
    declaring numpy_faster_on_cpu stays on numpy only where its work is worth BLAS
    (costs.NUMPY_CPU_ABOVE_US); a small one joins the Taichi partition (okay_nabu: 5 -> 42 of its
    55 ops delegated, 3.7-5.2 -> 0.5-1.0 ms a step on the 2-core machine)."""
    from tflite_taichi.partition import build_schedule
    prepared = _prepared(_conv(size, channels))
    assert (costs.work_us(prepared.steps) >= costs.NUMPY_CPU_ABOVE_US) == on_numpy
    schedule = build_schedule(prepared, warn=False, reference_ops=frozenset({"CONV_2D"}))
    assert bool(schedule.refused) == on_numpy
