"""backend='auto' on a GPU keeps on the CPU what numpy runs faster (a launch
and a wait cost more than a small op; tflite_taichi/costs.py, constants measured in bench/results/cost_constants_h200.md)."""
import subprocess
import sys
import textwrap
import warnings

import numpy as np

from cases.conv import big_conv
from tflite_taichi import costs
from tflite_taichi.builder import ModelBuilder
from tflite_taichi.tools.demo import build_tiny_mlp
from tflite_taichi.graph import prepare
from tflite_taichi.partition import build_schedule


mlp = build_tiny_mlp       # FC 32 -> 64 (RELU) -> 10, softmax


def small_chain(n=16):
    """n ADDs of [1, 8] in a chain: a converted loop body's size (16 delegated ops a call)."""
    b = ModelBuilder()
    g = b.subgraph()
    x = g.input("x", (1, 8))
    for i in range(n):
        y = g.tensor(f"y{i}", (1, 8))
        g.op("ADD", [x, g.const(f"c{i}", np.full((1, 8), i, np.float32))], [y])
        x = y
    g.output(x)
    return b.finish()


def _schedule(model, backend, called=False):
    from tflite_taichi import graph as graph_mod
    from tflite_taichi.model import read_model
    m = read_model(model)
    sg = m.subgraphs[0]
    prepared = prepare(sg, graph_mod.resolve_ops(m), {t: tuple(sg.tensors[t].shape) for t in sg.inputs})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return build_schedule(prepared, cost_backend=backend, called=called)


def test_a_tiny_mlp_stays_on_the_cpu_on_every_gpu_backend():
    for backend in ("cuda", "vulkan", "opengl", "gles", "metal"):
        s = _schedule(mlp(), backend)
        assert not s.partitions, backend
        assert all("numpy runs its partition of 3 op(s) faster than " + backend in r
                   for r in s.refused.values()), s.refused


def test_a_large_convolution_goes_to_the_gpu():
    for backend in ("cuda", "vulkan", "opengl"):
        s = _schedule(big_conv(), backend)
        assert len(s.partitions) == 1 and not s.refused, (backend, s.refused)
    steps = _schedule(big_conv(), None).partitions[0].steps
    assert costs.numpy_us(steps) > 5 * costs.gpu_us(steps, "vulkan")       # ~6 ms against 0.8


def test_a_called_subgraph_pays_its_round_trips_in_the_estimate():
    """16 small ops go to cuda as a main graph (84 + 15 x 5.9 us against 16 x 15 on numpy) but
    stay on numpy as a subgraph a WHILE calls at every iteration (costs.CALL_EXTRA_US more a
    call: measured, bench/results/cpu_taichi_h200.md run 6); a large convolution goes either way."""
    assert len(_schedule(small_chain(), "cuda").partitions) == 1
    s = _schedule(small_chain(), "cuda", called=True)
    assert not s.partitions and len(s.refused) == 16, s.refused
    assert len(_schedule(big_conv(), "cuda", called=True).partitions) == 1


def test_without_auto_nothing_moves():
    s = _schedule(mlp(), None)
    assert len(s.partitions) == 1 and not s.refused


def test_auto_on_a_gpu_backend_says_so_in_summary(tmp_path):
    """In a process whose Taichi backend is vulkan (lavapipe here), backend='auto' runs the MLP
    on LiteRT's CPU kernels, planned (the delegate would take none of its ops); where LiteRT is
    not installed, it runs on vulkan and keeps the MLP on numpy: summary() names the reason, and
    the answers are the reference's."""
    path = tmp_path / "mlp.tflite"
    path.write_bytes(mlp())
    script = textwrap.dedent(f"""
        import warnings, numpy as np
        warnings.simplefilter("ignore")
        from tflite_taichi import Interpreter
        x = np.linspace(-1, 1, 32, dtype=np.float32).reshape(1, 32)
        def run(backend):
            it = Interpreter(model_path={str(path)!r}, backend=backend)
            it.allocate_tensors(); it.set_tensor(it.get_input_details()[0]["index"], x); it.invoke()
            return it, it.get_tensor(it.get_output_details()[0]["index"])
        gpu, y_gpu = run("vulkan")
        planned, y_planned = run("auto")
        choice = planned.summary()["auto_choice"]
        assert planned.backend == "litert" and choice["how"] == "planned", choice
        from tflite_taichi import litert_cpu
        litert_cpu.available = lambda: False        # as where LiteRT is not installed
        auto, y_auto = run("auto")
        _, y_ref = run("reference")
        s = auto.summary()
        assert s["backend"] == "vulkan" and s["ops_delegated"] == 0, s
        assert all("numpy runs its partition" in f["reason"] for f in s["fallback"]), s["fallback"]
        assert gpu.summary()["ops_delegated"] == 3
        assert np.array_equal(y_auto, y_ref) and np.allclose(y_gpu, y_ref, rtol=1e-5, atol=1e-6)
        assert np.allclose(y_planned, y_ref, rtol=1e-5, atol=1e-6)
        print("OK")
    """)
    # cwd: not the clone's root, whose tflite_taichi/ folder would shadow the installed package
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600,
                         cwd=tmp_path)
    assert out.returncode == 0 and "OK" in out.stdout, out.stdout[-2000:] + out.stderr[-2000:]
