"""One thread budget (issue 29, item 1; tflite_taichi/threads.py): `num_threads` as LiteRT means
it, numpy's BLAS bounded by it inside an invoke (one thread on the `cpu` backend, whose own pool
has the cores), and the process's BLAS setting back after the invoke."""
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


@pytest.fixture
def blas_at_two():
    """numpy's BLAS set to 2 threads for the test (the CI machine's cores; a value the budget
    differs from), the process's setting restored after."""
    controller = ThreadpoolController()
    assert controller.select(user_api="blas").lib_controllers, \
        "numpy's BLAS is not visible to threadpoolctl: the budget cannot be checked"
    with controller.limit(limits=2, user_api="blas"):
        if _blas_threads() != [2] * len(_blas_threads()):
            pytest.fail(f"this machine's BLAS cannot run 2 threads ({_blas_threads()})")
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


@pytest.mark.parametrize("backend, num_threads, inside", [
    ("reference", 1, 1),         # the numpy path alone: the budget
    ("reference", None, 2),      # -> every usable core, at most what BLAS was set to run here
    ("cpu", 2, 1),               # Taichi's pool runs the ADD: BLAS gets one thread
])
def test_invoke_runs_blas_within_the_budget(blas_at_two, backend, num_threads, inside):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")             # the delegate's INFO on the CPU op
        it = Interpreter(model_content=probe_model(), backend=backend, num_threads=num_threads)
        it.allocate_tensors()
    x = np.arange(8, dtype=np.float32).reshape(1, 8) - 4
    SEEN.clear()
    it.set_tensor(it.get_input_details()[0]["index"], x)
    it.invoke()
    np.testing.assert_array_equal(it.get_tensor(it.get_output_details()[0]["index"]), np.abs(x + 1))
    expected = min(inside, threads.usable_cores()) if num_threads is None else inside
    assert SEEN and set(SEEN[-1]) == {expected}
    assert set(_blas_threads()) == {2}                   # the process's setting is back
