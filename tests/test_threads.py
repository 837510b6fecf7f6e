"""One thread budget (tflite_taichi/threads.py): `num_threads` as LiteRT means it, the usable cores
those of the process's CPU affinity, numpy's BLAS bounded by the budget inside an invoke (one
thread on the `cpu` backend, whose own pool has the cores), and the process's BLAS setting back
after the invoke. The BLAS count is read inside the invoke (a probe op's reference), with the
process set to a count other than the budget, so a budget that is not applied is seen."""
import json
import os
import subprocess
import sys
import warnings

import numpy as np
import pytest
from threadpoolctl import ThreadpoolController

from tflite_taichi import Interpreter, OpDef, register_op, threads
from tflite_taichi.builder import ModelBuilder
from tflite_taichi.errors import InputError

SEEN = []      # BLAS threads seen by the probe op's reference, one entry per run


def _blas_threads() -> list:
    return [lib.num_threads for lib in ThreadpoolController().select(user_api="blas").lib_controllers]


def _probe(node, inputs):
    SEEN.append(_blas_threads())
    return [np.abs(inputs[0])]


# a user op with a reference and no Taichi part: it runs on the numpy path on every backend
register_op(OpDef(name="CUSTOM:BlasProbe", infer=lambda node: [node.inputs[0].shape],
                  reference=_probe), replace=True)


def probe_model() -> bytes:
    b = ModelBuilder()
    g = b.subgraph()
    x = g.input("x", (1, 8))
    h = g.tensor("h", (1, 8))
    y = g.tensor("y", (1, 8))
    g.op("ADD", [x, g.const("one", np.ones((1, 8), np.float32))], [h])
    g.op("CUSTOM:BlasProbe", [h], [y])
    g.output(y)
    return b.finish()


def _blas_set_to(threads: int):
    """numpy's BLAS set to `threads` threads for the block; the process's setting back after."""
    controller = ThreadpoolController()
    assert controller.select(user_api="blas").lib_controllers, \
        "numpy's BLAS is not visible to threadpoolctl: the budget cannot be checked"
    limited = controller.limit(limits=threads, user_api="blas")
    if set(_blas_threads()) != {threads}:
        limited.restore_original_limits()
        pytest.fail(f"this machine's BLAS cannot run {threads} threads ({_blas_threads()})")
    return limited


@pytest.fixture
def blas_at_two():
    """numpy's BLAS set to 2 threads for the test, the process's setting restored after."""
    with _blas_set_to(2):
        yield


def test_resolve_means_what_litert_means():
    assert threads.resolve(3) == 3
    assert threads.resolve(0) == 1                       # LiteRT: 0 disables multithreading
    assert threads.resolve(None) == threads.usable_cores()
    assert threads.resolve(-1) == threads.usable_cores()
    assert 1 <= threads.usable_cores()


@pytest.mark.parametrize("bad", [-2, 1.5, "2"])
def test_num_threads_is_checked(bad):
    with pytest.raises(InputError, match="num_threads"):
        Interpreter(model_content=probe_model(), backend="reference", num_threads=bad)


def test_blas_limited_restores(blas_at_two):
    with threads.blas_limited(1):
        assert set(_blas_threads()) == {1}
    assert set(_blas_threads()) == {2}
    with threads.blas_limited(None):                     # no budget: untouched
        assert set(_blas_threads()) == {2}


def _budget(backend, num_threads) -> int:
    """What BLAS must run inside an invoke: one thread beside Taichi's CPU pool, else the
    interpreter's budget."""
    return 1 if backend == "cpu" else threads.resolve(num_threads)


@pytest.mark.parametrize("backend, num_threads", [
    ("reference", 1),            # the numpy path alone: the budget
    ("reference", None),         # every usable core
    ("reference", 0),            # LiteRT's "no multithreading"
    ("cpu", 2),                  # Taichi's pool runs the ADD: BLAS gets one thread
])
def test_invoke_runs_blas_within_the_budget(backend, num_threads):
    inside = _budget(backend, num_threads)
    outside = 2 if inside == 1 else 1            # a process setting the budget differs from
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")             # the delegate's INFO on the CPU op
        it = Interpreter(model_content=probe_model(), backend=backend, num_threads=num_threads)
        it.allocate_tensors()
    x = np.arange(8, dtype=np.float32).reshape(1, 8) - 4
    with _blas_set_to(outside):
        SEEN.clear()
        it.set_tensor(it.get_input_details()[0]["index"], x)
        it.invoke()
        np.testing.assert_array_equal(it.get_tensor(it.get_output_details()[0]["index"]),
                                      np.abs(x + 1))
        assert SEEN and set(SEEN[-1]) == {inside}, (SEEN, outside)
        assert set(_blas_threads()) == {outside}         # the process's setting is back


# A process pinned to one core (its affinity set before anything is imported, as taskset or a
# container would): usable_cores() is 1, and an invoke with the default budget runs BLAS on one
# thread though the process's BLAS is set to 2. argv: the tests folder.
ONE_CORE = r"""
import json, os, sys
os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
sys.path.insert(0, sys.argv[1])
import numpy as np
from threadpoolctl import ThreadpoolController
import test_threads
from tflite_taichi import Interpreter, threads
it = Interpreter(model_content=test_threads.probe_model(), backend="reference")
it.allocate_tensors()
with ThreadpoolController().limit(limits=2, user_api="blas"):
    it.set_tensor(it.get_input_details()[0]["index"], np.zeros((1, 8), np.float32))
    it.invoke()
print("RESULT " + json.dumps({"usable": threads.usable_cores(), "budget": threads.resolve(None),
                              "inside": test_threads.SEEN[-1]}), flush=True)
"""


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no CPU affinity call here")
def test_usable_cores_are_the_affinitys(tmp_path):
    done = subprocess.run([sys.executable, "-c", ONE_CORE, os.path.dirname(__file__)],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    lines = [l for l in done.stdout.splitlines() if l.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stdout[-2000:] + done.stderr[-3000:]
    result = json.loads(lines[-1][7:])
    assert result == {"usable": 1, "budget": 1, "inside": [1] * len(result["inside"])}, result
    assert result["inside"], result                      # BLAS was seen
