"""The runtime under the delegate: programs on Taichi's C API, buffers that stay on
the device, one wait per invoke (one more per CPU op that reads a partition's result), the
Python-runtime fallback, close() and lifetime, remembered backend probes."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import plugin_ops  # noqa: F401  (registers CUSTOM:CpuOnlyAbs in this process too)
from tflite_taichi import backend as ti_backend
from tflite_taichi.runtime import session
from tflite_taichi.runtime import cache
from tflite_taichi.builder import ModelBuilder
from tflite_taichi.testing import check_delegate

PLUGINS = {"plugins": ["plugin_ops"]}
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def _model(layout: str):
    """'one':   x -> ADD -> RELU -> MUL -> out, all delegated;
    'split':    x -> ADD -> t0 -> RELU -> t1 -> CpuOnlyAbs -> t2; MUL(t2, t0) -> out: two partitions,
                t0 passes from the first to the second without the CPU op reading it;
    'side':     the CPU op on a side branch (a second output): one partition."""
    b = ModelBuilder()
    g = b.subgraph()
    x = g.input("x", (1, 5, 5, 3))
    c = g.const("c", np.linspace(-1, 1, 3).astype(np.float32))
    t0, t1, t2, out = (g.tensor(n, (1, 5, 5, 3)) for n in ("t0", "t1", "t2", "out"))
    g.op("ADD", [x, c], [t0])
    g.op("RELU", [t0], [t1])
    if layout == "one":
        g.op("MUL", [t1, t0], [out])
        g.output(out)
    elif layout == "split":
        g.op("CUSTOM:CpuOnlyAbs", [t1], [t2])
        g.op("MUL", [t2, t0], [out])
        g.output(out)
    else:
        g.op("CUSTOM:CpuOnlyAbs", [t1], [t2])
        g.op("MUL", [t1, t0], [out])
        g.output(out, t2)
    return b.finish()


def _device_kind(backend):
    return "python" if backend == "gles" else "capi"     # the C API has no GLES runtime


def test_one_wait_per_invoke(taichi_workers):
    for backend, s in check_delegate(_model("one"), taichi_workers).items():
        runtime = s["runtime"]
        assert runtime["device"] == _device_kind(backend), (backend, runtime)
        assert runtime["waits_per_invoke"] == runtime["waits_last_invoke"] == 1, (backend, runtime)
        assert runtime["tensors_in"] == 1 and runtime["tensors_out"] == 1, runtime


def test_a_cpu_op_between_partitions_costs_one_more_wait(taichi_workers):
    """The host waits before the CPU op (it reads the first partition's result) and at the end;
    t0, which only the second partition reads, never comes back to the host."""
    for backend, s in check_delegate(_model("split"), taichi_workers, expect_all_delegated=False,
                                     max_delegated_partitions=2, **PLUGINS).items():
        assert [p["ops"] for p in s["partitions"]] == [[0, 1], [3]], backend
        runtime = s["runtime"]
        assert runtime["waits_per_invoke"] == runtime["waits_last_invoke"] == 2, (backend, runtime)
        # in: x and the CPU op's result; out: t1 (the CPU op reads it) and the model output;
        # t0 stays on the device between the partitions
        assert (runtime["tensors_in"], runtime["tensors_out"], runtime["tensors_on_device"]) == (2, 2, 1), runtime


def test_a_cpu_op_on_a_side_branch_waits_once(taichi_workers):
    for backend, s in check_delegate(_model("side"), taichi_workers, expect_all_delegated=False,
                                     **PLUGINS).items():
        assert [p["ops"] for p in s["partitions"]] == [[0, 1, 3]], backend
        runtime = s["runtime"]
        assert runtime["waits_per_invoke"] == runtime["waits_last_invoke"] == 1, (backend, runtime)


PYTHON_RUNTIME = r'''
import json, sys, warnings
import numpy as np
sys.path.insert(0, sys.argv[2])
import plugin_ops
from tflite_taichi import Interpreter
from tflite_taichi.testing import model_inputs, run_ours
model = open(sys.argv[3], "rb").read()
x = model_inputs(model)
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    it = Interpreter(model_content=model, backend=sys.argv[1], max_delegated_partitions=2)
    it.allocate_tensors()
it.set_tensor(it.get_input_details()[0]["index"], x[0])
it.invoke()
y = it.get_tensor(it.get_output_details()[0]["index"])
want = run_ours(model, x)[0]
print("RESULT " + json.dumps({"runtime": it.summary()["runtime"],
                              "err": float(np.max(np.abs(y - want)))}), flush=True)
'''


@pytest.mark.parametrize("backend", [b for b in ("cpu", "vulkan") if b in
                                     os.environ.get("TFLITE_TAICHI_TEST_BACKENDS", "cpu,vulkan,opengl")])
def test_the_python_runtime_fallback_runs_the_same_programs(tmp_path, backend):
    """TFLITE_TAICHI_RUNTIME=python (also what happens, with a warning, where the C API library is
    missing): the same program, buffers and waits, launched through Taichi's Python runtime."""
    path = tmp_path / "split.tflite"
    path.write_bytes(_model("split"))
    env = dict(os.environ, TFLITE_TAICHI_RUNTIME="python", ENABLE_TAICHI_HEADER_PRINT="False")
    result = _result(PYTHON_RUNTIME, backend, HERE, str(path), cwd=tmp_path, env=env)
    assert result["runtime"]["device"] == "python" and result["runtime"]["waits_last_invoke"] == 2
    assert result["err"] <= 1e-6, result


BROKEN_KERNEL = r'''
import json, sys, warnings
sys.path.insert(0, sys.argv[2])
import plugin_ops
from tflite_taichi import Interpreter
from tflite_taichi.errors import KernelError
from tflite_taichi.testing import Input, Output, one_op_model
it = Interpreter(model_content=one_op_model("CUSTOM:BrokenTaichi", [Input((2, 3))], [Output((2, 3))]),
                 backend=sys.argv[1])
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    try:
        it.allocate_tensors()
        error = None
    except KernelError as e:
        error = str(e)
ours = [str(w.message) for w in caught if not issubclass(w.category, DeprecationWarning)]  # Taichi's
print("RESULT " + json.dumps({"error": error, "warnings": ours}), flush=True)
'''


@pytest.mark.parametrize("runtime", ["capi", "python"])
@pytest.mark.parametrize("backend", [b for b in ("cpu", "vulkan") if b in
                                     os.environ.get("TFLITE_TAICHI_TEST_BACKENDS", "cpu,vulkan,opengl")])
def test_an_op_that_does_not_compile_is_one_kernel_error_and_no_warning(tmp_path, backend, runtime):
    """Taichi's frontend refusing an op's code is a KernelError from allocate_tensors(), on the
    C API path (compiled for an AOT module) and on Taichi's Python runtime (compiled at the first
    launch) alike. The C API path used to warn that the C API had refused the module and compile
    everything again through the Python runtime, which failed the same way."""
    env = dict(os.environ, TFLITE_TAICHI_RUNTIME=runtime, ENABLE_TAICHI_HEADER_PRINT="False")
    result = _result(BROKEN_KERNEL, backend, HERE, cwd=tmp_path, env=env)
    assert result["error"] is not None and result["error"].startswith(
        "the Taichi code of op #0 (CUSTOM:BrokenTaichi) did not compile for Taichi's "), result
    assert 'Name "name_this_kernel_never_defines" is not defined' in result["error"], result
    assert result["warnings"] == [], result


# a demo interpreter on sys.argv[1], allocated and invoked once: `it`, `d`, `x`, `first`
DEMO = r'''
import json, sys, warnings
import numpy as np
from tflite_taichi import Interpreter
from tflite_taichi.tools.demo import build_demo_model
from tflite_taichi.errors import InterpreterStateError
warnings.simplefilter("ignore")
it = Interpreter(model_content=build_demo_model(), backend=sys.argv[1])
it.allocate_tensors()
d = it.get_input_details()[0]
x = np.random.default_rng(0).uniform(0, 1, d["shape"]).astype(np.float32)
it.set_tensor(d["index"], x)
it.invoke()
first = it.get_tensor(it.get_output_details()[0]["index"])
'''


def _result(script: str, *args, cwd, env=None) -> dict:
    """The RESULT line of `python -c script args...` as a dict (its output on failure)."""
    out = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True,
                         timeout=300, cwd=cwd, env=env)
    lines = [l for l in out.stdout.splitlines() if l.startswith("RESULT ")]
    assert out.returncode == 0 and lines, out.stdout[-2000:] + out.stderr[-2000:]
    return json.loads(lines[-1][7:])


CLOSE = DEMO + r'''
program = it._main.program
it.close()
out = {"freed": all(b.handle is None for b in program._buffers)}
try:
    it.invoke()
except InterpreterStateError as e:
    out["after_close"] = str(e)
it.allocate_tensors()                      # usable again after a new allocate
it.set_tensor(d["index"], x)
it.invoke()
out["same"] = bool(np.array_equal(first, it.get_tensor(it.get_output_details()[0]["index"])))
with Interpreter(model_content=build_demo_model(), backend=sys.argv[1]) as other:
    other.allocate_tensors()
    inner = other._main.program
out["context_manager_freed"] = all(b.handle is None for b in inner._buffers)
print("RESULT " + json.dumps(out), flush=True)
'''


def test_close_frees_device_memory_and_the_interpreter_can_allocate_again(tmp_path):
    result = _result(CLOSE, "cpu", cwd=tmp_path)
    assert result["freed"] and result["context_manager_freed"], result
    assert "close() freed its memory" in result["after_close"], result
    assert result["same"], result


@pytest.mark.parametrize("backend", [b for b in ("cpu", "vulkan") if b in
                                     os.environ.get("TFLITE_TAICHI_TEST_BACKENDS", "cpu,vulkan,opengl")])
def test_creating_and_destroying_interpreters_does_not_grow_the_process(tmp_path, backend):
    """The short form of bench/lifetime.py (100 cycles may grow RSS by 20 MB at most):
    30 create/allocate/invoke/destroy cycles of one model after 5 to settle. Loaded modules are
    shared within the process (Taichi's gfx runtime frees nothing when one is destroyed: 3.8 MB
    per cycle on lavapipe without that)."""
    out = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "lifetime.py"), "--backend",
                          backend, "--cycles", "30", "--invokes", "200",
                          "--cache-dir", str(tmp_path / "cache")],
                         capture_output=True, text=True, timeout=600, cwd=tmp_path)
    lines = [l for l in out.stdout.splitlines() if l.startswith("RESULT ")]
    assert out.returncode == 0 and lines, out.stdout[-2000:] + out.stderr[-2000:]
    result = json.loads(lines[-1][7:])
    assert result["device"] == "capi"
    assert result["cycles_growth_mb"] <= 3.0, result
    assert result["invokes_growth_mb"] <= 2.0, result


# -- remembered probes ------------------------------------------------------------------------
class _FakeRun:
    """subprocess.run for backend.probe: counts calls, answers like the probe script."""

    def __init__(self, ok=True):
        self.calls, self.ok = 0, ok

    def __call__(self, cmd, **kwargs):
        self.calls += 1
        out = f"PROBE-OK {cmd[-1]} llvmpipe (LLVM 15.0.6, 256 bits)\n" if self.ok else "boom\n"
        return subprocess.CompletedProcess(cmd, 0 if self.ok else 1, out, "")


def test_a_probe_is_remembered_per_driver_stack(tmp_path, monkeypatch):
    """A probe costs a subprocess (0.3-0.8 s); its answer is kept in the cache folder and reused
    by later processes while the driver stack's fingerprint is the same; a changed driver
    variable (or library, manifest, device node) probes again."""
    root = cache.prepare_dir(tmp_path / "cache")
    fake = _FakeRun()
    monkeypatch.setattr(ti_backend.subprocess, "run", fake)
    monkeypatch.setattr(session.SESSION, "probes", {})
    monkeypatch.delenv("LIBGL_ALWAYS_SOFTWARE", raising=False)
    first = ti_backend.probe("opengl", cache_root=root)
    assert first[0] and first[1] and fake.calls == 1          # llvmpipe: software
    monkeypatch.setattr(session.SESSION, "probes", {})       # as a new process
    assert ti_backend.probe("opengl", cache_root=root) == first and fake.calls == 1
    assert ti_backend.probe("vulkan", cache_root=root)[0] and fake.calls == 2   # per backend
    monkeypatch.setattr(session.SESSION, "probes", {})
    monkeypatch.setenv("LIBGL_ALWAYS_SOFTWARE", "1")           # the stack changed: probe again
    ti_backend.probe("opengl", cache_root=root)
    assert fake.calls == 3
    monkeypatch.setattr(session.SESSION, "probes", {})
    record = json.loads((tmp_path / "cache" / cache.PROBES).read_text())
    record["opengl"]["time"] -= cache.PROBE_TTL_S + 1          # too old: probe again
    (tmp_path / "cache" / cache.PROBES).write_text(json.dumps(record))
    ti_backend.probe("opengl", cache_root=root)
    assert fake.calls == 4
    monkeypatch.setattr(session.SESSION, "probes", {})
    (tmp_path / "cache" / cache.PROBES).write_text("{garbage")   # unreadable: probe again
    ti_backend.probe("opengl", cache_root=root)
    assert fake.calls == 5
    monkeypatch.setattr(session.SESSION, "probes", {})
    ti_backend.probe("opengl", cache_root=None)                # no cache folder: nothing kept
    assert fake.calls == 6


def test_a_failed_probe_is_remembered_too(tmp_path, monkeypatch):
    root = cache.prepare_dir(tmp_path / "cache")
    fake = _FakeRun(ok=False)
    monkeypatch.setattr(ti_backend.subprocess, "run", fake)
    monkeypatch.setattr(session.SESSION, "probes", {})
    assert ti_backend.probe("cuda", cache_root=root)[0] is False
    monkeypatch.setattr(session.SESSION, "probes", {})
    assert ti_backend.probe("cuda", cache_root=root) == (False, False, "boom") and fake.calls == 1


GL_THREADS = DEMO + r'''
import threading
out = {}
def other():
    try:
        it.invoke()
        out["other"] = "ran"
    except InterpreterStateError as e:
        out["other"] = str(e)
    try:
        Interpreter(model_content=build_demo_model(seed=2), backend=sys.argv[1]).allocate_tensors()
        out["other_allocate"] = "ran"
    except InterpreterStateError as e:
        out["other_allocate"] = str(e)
t = threading.Thread(target=other, name="worker")
t.start(); t.join()
it.invoke()                                # still fine in its own thread
out["same"] = bool(np.array_equal(first, it.get_tensor(it.get_output_details()[0]["index"])))
print("RESULT " + json.dumps(out), flush=True)
'''


@pytest.mark.parametrize("backend", [b for b in ("opengl",) if b in
                                     os.environ.get("TFLITE_TAICHI_TEST_BACKENDS", "cpu,vulkan,opengl")])
def test_opengl_refuses_other_threads_instead_of_failing_silently(tmp_path, backend):
    """An OpenGL context is current in one thread: called from another, Taichi's runtime found
    no context (a NULL mapping, launches that did nothing; the Python runtime crashed). Such calls
    are refused, naming both threads; the interpreter goes on in its own thread."""
    env = dict(os.environ, EGL_PLATFORM=os.environ.get("EGL_PLATFORM", "surfaceless"))
    result = _result(GL_THREADS, backend, cwd=tmp_path, env=env)
    for what in ("other", "other_allocate"):
        assert "from thread 'worker'" in result[what] and "'MainThread'" in result[what], result
    assert result["same"], result


# the demo on vulkan for more invokes than vulkan_host.FULL_WAIT_EVERY, each checked against
# the reference, counting Taichi's own waits (ti_wait) among the host's
VULKAN_WAITS = r'''
import json, os, warnings
import numpy as np
from tflite_taichi import Interpreter
from tflite_taichi.runtime import device, vulkan_host
from tflite_taichi.tools.demo import build_demo_model
from tflite_taichi.testing import assert_float_close
warnings.simplefilter("ignore")
it = Interpreter(model_content=build_demo_model(), backend="vulkan")
it.allocate_tensors()
ref = Interpreter(model_content=build_demo_model(), backend="reference")
ref.allocate_tensors()
dev = device.current("vulkan")
calls = {"ti_wait": 0}
real_wait = dev.lib.ti_wait
def counting_wait(runtime):
    calls["ti_wait"] += 1
    return real_wait(runtime)
dev.lib.ti_wait = counting_wait
d, o = it.get_input_details()[0], it.get_output_details()[0]
rng = np.random.default_rng(0)
invokes = 2 * vulkan_host.FULL_WAIT_EVERY + 5
for _ in range(invokes):
    x = rng.uniform(0, 1, d["shape"]).astype(np.float32)
    for interpreter in (it, ref):
        interpreter.set_tensor(d["index"], x)
        interpreter.invoke()
    assert_float_close(it.get_tensor(o["index"]), ref.get_tensor(o["index"]))
runtime = it.summary()["runtime"]
print("RESULT " + json.dumps({"invokes": invokes, "ti_wait": calls["ti_wait"],
      **{k: runtime[k] for k in ("vulkan_device", "host_wait", "submit", "perf_boost")}}), flush=True)
'''


@pytest.mark.skipif("vulkan" not in os.environ.get("TFLITE_TAICHI_TEST_BACKENDS", "cpu,vulkan,opengl"),
                    reason="vulkan is not among TFLITE_TAICHI_TEST_BACKENDS")
@pytest.mark.parametrize("wait,submit", [("fence", "ours"), ("fence", "taichi"), ("taichi", "ours")])
def test_vulkan_waits_on_a_fence_and_lets_taichi_clean_up_periodically(tmp_path, wait, submit):
    from tflite_taichi.runtime import vulkan_host
    env = dict(os.environ, TFLITE_TAICHI_VULKAN_WAIT=wait, TFLITE_TAICHI_VULKAN_SUBMIT=submit,
               TFLITE_TAICHI_CACHE_DIR=str(tmp_path / "cache"))
    result = _result(VULKAN_WAITS, cwd=tmp_path, env=env)
    assert result["vulkan_device"], result           # the physical device, named
    if wait == "fence" and submit == "ours":
        # our own command buffers (vulkan_submit.py): Taichi submits nothing, so its wait,
        # which would flush an empty command list, is never needed
        assert result["host_wait"] == "fence" and result["submit"] == "ours", result
        assert result["ti_wait"] == 0, result
    elif wait == "fence":
        assert result["host_wait"] == "fence" and result["submit"].startswith("Taichi's"), result
        # Taichi's own wait (which frees its command buffers) once per FULL_WAIT_EVERY invokes
        assert result["ti_wait"] == result["invokes"] // vulkan_host.FULL_WAIT_EVERY, result
    else:                   # no fence of ours: Taichi submits and waits
        assert result["host_wait"] == "ti_wait" and result["ti_wait"] >= result["invokes"], result
        assert result["submit"] == "Taichi's (no fence of ours)", result
    # NVIDIA devices hold a CUDA context for the clocks; others (lavapipe) say why not
    assert result["perf_boost"].startswith(("on:", "off:", "starting")), result
    if "llvmpipe" in result["vulkan_device"]:
        assert result["perf_boost"] == "off: not an NVIDIA device"
