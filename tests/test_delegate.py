"""The delegate's mechanics: backends, partitions and their warnings, summary, profiling."""
import os
import subprocess
import sys

import numpy as np
import pytest

import plugin_ops  # noqa: F401  (registers CUSTOM:CpuOnlyAbs in this process too)
from tflite_taichi import Interpreter, switches
from tflite_taichi.runtime import session
from tflite_taichi.builder import ModelBuilder
from tflite_taichi.errors import BackendUnavailable
from tflite_taichi.testing import BackendWorker, check_delegate, model_inputs

PLUGINS = {"plugins": ["plugin_ops"]}


def _chain(with_cpu_op: bool, side_branch: bool = False, middle_op: str = "CUSTOM:CpuOnlyAbs"):
    """x -> ADD -> RELU6 -> [CUSTOM:CpuOnlyAbs] -> MUL -> SUB -> out (five or four ops; another
    middle_op in CpuOnlyAbs's place).
    side_branch: CpuOnlyAbs(RELU6) is a second output instead, still written in graph order
    between RELU6 and MUL, and nothing on the main chain depends on it."""
    b = ModelBuilder()
    g = b.subgraph()
    x = g.input("x", (1, 6, 6, 3))
    c = g.const("c", np.linspace(-1, 1, 3).astype(np.float32))
    t = [g.tensor(f"t{i}", (1, 6, 6, 3)) for i in range(5)]
    g.op("ADD", [x, c], [t[0]])
    g.op("RELU6", [t[0]], [t[1]])
    last = t[1]
    if with_cpu_op:
        g.op(middle_op, [t[1]], [t[2]])
        last = t[1] if side_branch else t[2]
    g.op("MUL", [last, c], [t[3]])
    g.op("SUB", [t[3], x], [t[4]])
    g.output(t[4], *([t[2]] if side_branch else []))
    return b.finish()


def test_an_op_the_delegate_refuses_splits_the_model(taichi_workers):
    model = _chain(with_cpu_op=True)
    summaries = check_delegate(model, taichi_workers, expect_all_delegated=False,
                               max_delegated_partitions=2, **PLUGINS)
    for backend, s in summaries.items():
        assert [p["ops"] for p in s["partitions"]] == [[0, 1], [3, 4]], backend
        assert s["ops_delegated"] == 4 and s["ops_total"] == 5
        assert s["fallback"] == [{"index": 2, "op": "CUSTOM:CpuOnlyAbs",      # LiteRT lacks it
                                  "reason": "no Taichi implementation of this op yet",
                                  "runs_on": "numpy"}]
        assert ("WARNING: op code #2 (CUSTOM:CpuOnlyAbs) cannot be handled by this delegate: "
                "no Taichi implementation of this op yet") in s["warnings"]
        where = ("the delegate's cpu backend (Taichi on the CPU, no GPU)" if backend == "cpu"
                 else f"the GPU delegate ({backend})")     # the GPU is named
        assert any(f"4 of 5 ops run on {where} in 2 partition(s); 1 run on the CPU" in w
                   for w in s["warnings"]), s["warnings"]


def test_a_float64_constant_stays_on_the_cpu_with_its_name(taichi_workers):
    # The weights buffer is float32: a float64 filter used to reach the kernel as a missing ref
    # and fail inside Taichi's compiler. (LiteRT reads such a filter's bytes as float32 and
    # computes garbage; the reference computes in float, so the check is against it.)
    b = ModelBuilder()
    g = b.subgraph()
    x = g.input("x", (1, 4, 4, 2))
    y = g.tensor("y", (1, 4, 4, 3))
    g.op("CONV_2D", [x, g.const("filter64", np.linspace(-1, 1, 6).reshape(3, 1, 1, 2)),
                     g.const("bias", np.zeros(3, np.float32))], [y],
         padding="SAME", stride_h=1, stride_w=1)
    g.output(y)
    summaries = check_delegate(b.finish(), taichi_workers, expect_all_delegated=False)
    for backend, s in summaries.items():
        assert s["fallback"] == [{"index": 0, "op": "CONV_2D", "reason": (
            "constant 'filter64' is float64; the delegate's weights are float32 (or float16)"),
            "runs_on": "numpy"}], backend      # LiteRT's CONV_2D has no float64 filter either


def test_partitions_follow_dependencies_not_graph_order(taichi_workers):
    """As TFLite's partitioner: a CPU op on a side branch does not split the partition; the
    schedule runs it after the partition that feeds it."""
    model = _chain(with_cpu_op=True, side_branch=True)
    for backend, s in check_delegate(model, taichi_workers, expect_all_delegated=False,
                                     profile=True, **PLUGINS).items():
        assert [p["ops"] for p in s["partitions"]] == [[0, 1, 3, 4]], backend
        assert [(i["kind"], i["ops"]) for i in s["profile"]["items"]] == [("partition", [0, 1, 3, 4]),
                                                                         ("cpu", [2])]


def test_max_delegated_partitions_keeps_the_largest(taichi_workers):
    model = _chain(with_cpu_op=True)
    for s in check_delegate(model, taichi_workers, expect_all_delegated=False, **PLUGINS).values():
        assert [p["ops"] for p in s["partitions"]] == [[0, 1]]       # tie: the first one
        assert {f["index"] for f in s["fallback"]} == {2, 3, 4}
        assert "max_delegated_partitions" in s["fallback"][1]["reason"]


def _int8_io_model():
    """int8: y = x + c and s = x - c on the device; a = |s| on the CPU; z = y * a on the device
    again (reading y from io, where the first partition left it); v = |z| and b = |u| on the
    CPU. Outputs y, z, v, b."""
    b = ModelBuilder()
    g = b.subgraph()
    shape = (1, 6, 6, 3)
    x = g.input("x", shape, np.int8, quantization=(0.05, 3))
    u = g.input("u", shape, np.int8, quantization=(0.05, -7))
    c = g.const("c", np.array([-100, 17, 90], np.int8), quantization=(0.01, -1))
    y = g.tensor("y", shape, np.int8, quantization=(0.06, -5))
    s = g.tensor("s", shape, np.int8, quantization=(0.06, 2))
    a = g.tensor("a", shape, np.int8, quantization=(0.03, -128))
    z = g.tensor("z", shape, np.int8, quantization=(0.2, 4))
    v = g.tensor("v", shape, np.int8, quantization=(0.2, -128))
    au = g.tensor("b", shape, np.int8, quantization=(0.03, -128))
    g.op("ADD", [x, c], [y])
    g.op("SUB", [x, c], [s])
    g.op("CUSTOM:CpuOnlyAbs", [s], [a])
    g.op("MUL", [y, a], [z])
    g.op("CUSTOM:CpuOnlyAbs", [z], [v])
    g.op("CUSTOM:CpuOnlyAbs", [u], [au])
    g.output(y, z, v, au)
    return b.finish()


def test_int8_inputs_and_outputs_travel_as_codes_where_no_cpu_op_reads_them(taichi_workers):
    """The device quantizes the model's int8 output y and dequantizes its input x (the host
    casts: TensorRef.codes), also where the second partition reads y from io; u and z, which
    CPU ops read, and v and b, which CPU ops write, stay real values on the host. Held to the
    reference to one unit (check_delegate): a code read as a real value, or a real value stored
    as a code, is off by tens of units."""
    model = _int8_io_model()
    rng = np.random.default_rng(3)
    inputs = [rng.integers(-128, 128, (1, 6, 6, 3)).astype(np.int8) for _ in range(2)]
    for backend, s in check_delegate(model, taichi_workers, inputs, expect_all_delegated=False,
                                     max_delegated_partitions=2, **PLUGINS).items():
        assert [p["ops"] for p in s["partitions"]] == [[0, 1], [3]], backend
        assert s["runtime"]["tensors_as_codes"] == ["x", "y"], backend


def _script_result(path, source: str, *args):
    """Write `source` to `path`, run it (with `args`) in a fresh process in its folder, and
    return its `RESULT <json>` line (its output on failure)."""
    import json
    path.write_text(source)
    out = subprocess.run([sys.executable, str(path), *args], capture_output=True, text=True, timeout=300,
                         cwd=path.parent)
    lines = [l for l in out.stdout.splitlines() if l.startswith("RESULT ")]
    assert lines, out.stdout[-2000:] + out.stderr[-3000:]
    return json.loads(lines[0][7:])


GROUPED_WARNINGS = r"""
import json, logging, warnings
import numpy as np
from tflite_taichi.builder import ModelBuilder
from tflite_taichi import Interpreter
logged = []
class Keep(logging.Handler):
    def emit(self, record):
        logged.append((record.levelname, record.getMessage()))
logging.getLogger("tflite_taichi").addHandler(Keep())
logging.getLogger("tflite_taichi").setLevel(logging.INFO)
b = ModelBuilder()
g = b.subgraph()
t = g.input("x", (1, 8))
for i in range(6):                  # six float64-constant ADDs: one op kind, one reason
    out = g.tensor(f"y{i}", (1, 8))
    g.op("ADD", [t, g.const(f"c{i}", np.ones((1, 8)))], [out])
    t = out
g.output(t)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    it = Interpreter(model_content=b.finish(), backend="cpu")
    it.allocate_tensors()                                   # THE USER'S LINE
lines = [(str(w.message), w.filename, w.lineno) for w in caught if w.category.__name__ == "DelegateWarning"]
print("RESULT " + json.dumps({"lines": lines, "logged": logged, "fallback": len(it.summary()["fallback"])}))
"""


def test_delegate_warnings_come_one_per_op_kind_from_the_users_line(tmp_path):
    """One warning per op kind and reason (TFLite prints one line per kind),
    attributed to the user's call, not to our internals; summary() keeps every op. The
    summary line is news, not a warning: logged at INFO."""
    script = tmp_path / "user_code.py"
    result = _script_result(script, GROUPED_WARNINGS)
    messages = [m for m, _, _ in result["lines"]]
    assert len(messages) == 1, messages                    # the group; the summary is logged
    assert messages[0].startswith("WARNING: 6 ADD ops (op codes #0, #1, #2, #3, #4, #5) cannot be "
                                  "handled by this delegate: constant 'c0' is float64"), messages[0]
    assert len(result["logged"]) == 1, result["logged"]
    level, summary_line = result["logged"][0]
    assert level == "INFO" and summary_line.startswith(
        "0 of 6 ops run on the delegate's cpu backend"), result["logged"]
    source = GROUPED_WARNINGS.splitlines()
    for _, filename, lineno in result["lines"]:
        assert os.path.samefile(filename, script) and "THE USER'S LINE" in source[lineno - 1]
    assert result["fallback"] == 6


def test_a_fully_supported_chain_is_one_kernel_per_partition(taichi_workers):
    """ADD -> RELU6 -> MUL -> SUB: the three element-wise ops after the ADD run inside its
    store (epilogue fusion), so even OpenGL, one kernel per op, launches one."""
    model = _chain(with_cpu_op=False)
    for backend, s in check_delegate(model, taichi_workers, profile=True).items():
        assert [p["ops"] for p in s["partitions"]] == [[0, 1, 2, 3]]
        assert s["partitions"][0]["fused"] == [[0, 1], [1, 2], [2, 3]], backend
        assert s["partitions"][0]["kernels"] == 1, backend
        profile = s["profile"]
        assert profile["launches_per_invoke"] == 1
        assert profile["items"][0]["kind"] == "partition" and profile["items"][0]["ms"] > 0


def test_profile_counts_cpu_ops_too(taichi_workers):
    model = _chain(with_cpu_op=True)
    s = check_delegate(model, taichi_workers[:1], expect_all_delegated=False, profile=True,
                       max_delegated_partitions=2, **PLUGINS)[taichi_workers[0].backend]
    kinds = [(item["kind"], item["ops"]) for item in s["profile"]["items"]]
    assert kinds == [("partition", [0, 1]), ("cpu", [2]), ("partition", [3, 4])]


def test_an_op_whose_taichi_code_does_not_compile_is_a_kernel_error_naming_it(taichi_workers):
    # Taichi's frontend refusing an op's ti.func (here a name it never defines) used to reach
    # the user as Taichi's bare TaichiNameError, after a warning that blamed the C API and a
    # second compile through Taichi's Python runtime that failed the same way
    model = _chain(with_cpu_op=True, middle_op="CUSTOM:BrokenTaichi")
    for worker in taichi_workers:
        worker.submit(model, model_inputs(model), **PLUGINS)
        with pytest.raises(RuntimeError) as raised:
            worker.result()
        message = str(raised.value)
        first = message.split("\n")[0]
        assert first.startswith(f"backend {worker.backend}: KernelError: the Taichi code of "), message
        assert "op #2 (CUSTOM:BrokenTaichi)" in first, message
        assert 'Name "name_this_kernel_never_defines" is not defined' in message, message
        assert "plugin_ops.py" in message, message          # Taichi's pointer to the op's line
        assert "Python runtime instead" not in message, message
        outputs, summary = worker.run(_chain(with_cpu_op=False), model_inputs(model))  # Taichi goes on
        assert summary["ops_delegated"] == 4, worker.backend


def test_a_second_taichi_arch_in_one_process_is_refused(taichi_workers):
    worker = taichi_workers[0]
    other = "vulkan" if worker.backend != "vulkan" else "cpu"
    model = _chain(with_cpu_op=False)
    worker.submit(model, model_inputs(model), backend=other)
    with pytest.raises(RuntimeError, match=f"BackendUnavailable: Taichi already runs on '{worker.backend}'"):
        worker.result()


def test_a_missing_arch_is_an_error_not_a_silent_cpu_fallback():
    # without NVIDIA's driver library, our one sentence (backend.check_driver); with the library
    # but no GPU, Taichi's refusal of the arch
    with pytest.raises(RuntimeError, match="BackendUnavailable: (backend 'cuda' cannot start here: "
                                           "there is no NVIDIA driver|cuda is not available)"):
        BackendWorker("cuda", timeout=120)


def test_fp16_is_refused_on_opengl_and_reference():
    model = _chain(with_cpu_op=False)
    with pytest.raises(BackendUnavailable, match="fp16"):
        Interpreter(model_content=model, backend="reference", precision="fp16")
    with pytest.raises(BackendUnavailable, match="OpenGL/GLES path has no 16-bit"):
        Interpreter(model_content=model, backend="opengl", precision="fp16")


def test_auto_takes_no_software_gpu(tmp_path):
    """auto never picks a software device (Mesa's lavapipe/llvmpipe: on CI the only Vulkan and
    OpenGL devices), and only picks a backend whose probe ran a kernel; else Taichi's CPU."""
    script = tmp_path / "auto.py"
    script.write_text("import json\nfrom tflite_taichi import backend\n"
                      "probes = {n: backend.probe(n) for n in ('cuda', 'vulkan', 'opengl')}\n"
                      "print('AUTO', json.dumps([backend.choose_auto(), probes]))\n")
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300,
                         cwd=tmp_path).stdout
    import json
    chosen, probes = json.loads([l for l in out.splitlines() if l.startswith("AUTO")][0][5:])
    assert chosen == "cpu" or (probes[chosen][0] and not probes[chosen][1]), (chosen, probes)
    for name, (_ok, software, detail) in probes.items():
        if software:
            assert chosen != name, (name, detail)
    if NO_GPU:                    # a machine with Mesa only (CI's): auto must be the CPU
        assert chosen == "cpu" and probes["vulkan"][1] and probes["opengl"][1], probes


# TFLITE_TAICHI_EXPECT_GPU=none says this machine has no hardware GPU (.ci/run sets it): then
# auto must pick the CPU, and a test that could only skip elsewhere must hold here.
NO_GPU = switches.value("TFLITE_TAICHI_EXPECT_GPU") == "none"


@pytest.mark.parametrize("name", ["opengl", "gles"])
def test_a_gl_renderer_is_read_without_libgl(name, tmp_path):
    """With the README's packages there is no libGL.so.1, and the probe used to
    read no renderer and call llvmpipe a GPU. It now asks EGL. Here libGL.so.1 and
    libGLESv2.so.2 are shadowed by a shared object without glGetString (a copy of Python's
    _ctypes module), as good as absent to the probe."""
    import _ctypes
    import shutil
    shadow = tmp_path / "shadow"
    shadow.mkdir()
    for library in ("libGL.so.1", "libGLESv2.so.2"):
        shutil.copy(_ctypes.__file__, shadow / library)
    env = dict(os.environ, EGL_PLATFORM="surfaceless",
               LD_LIBRARY_PATH=os.pathsep.join(filter(None, [str(shadow), os.environ.get("LD_LIBRARY_PATH")])))
    from tflite_taichi import backend
    out = subprocess.run([sys.executable, backend.PROBE_SCRIPT, name], capture_output=True,
                         text=True, timeout=300, env=env, cwd=tmp_path)
    line = [l for l in out.stdout.splitlines() if l.startswith("PROBE-OK")]
    assert line, out.stdout[-1000:] + out.stderr[-2000:]
    renderer = line[0].split(" ", 2)[2].strip()
    assert renderer, "no GL_RENDERER without libGL"
    if NO_GPU:
        assert "llvmpipe" in renderer, renderer


def test_a_device_nobody_can_name_counts_as_software(monkeypatch):
    from tflite_taichi import backend

    def unnamed(cmd, **kwargs):      # what the probe printed where no renderer could be read
        return subprocess.CompletedProcess(cmd, 0, f"PROBE-OK {cmd[-1]} \n", "")
    monkeypatch.setattr(backend.subprocess, "run", unnamed)
    monkeypatch.setattr(session.SESSION, "probes", {})
    ok, software, detail = backend.probe("opengl")
    assert ok and software and "unknown" in detail


def test_auto_probes_nothing_without_a_gpu_device_node(monkeypatch):
    """On Linux, no GPU device node (/dev/dri/renderD*, /dev/nvidia*, ...): no hardware GPU can
    start, so auto chooses the CPU without a probe; with one, it probes."""
    from tflite_taichi import backend
    probed = []
    monkeypatch.setattr(backend, "probe", lambda name, **kw: probed.append(name) or (False, False, "x"))
    monkeypatch.setattr(session.SESSION, "probes", {})     # none known from earlier tests
    monkeypatch.setattr(backend.sys, "platform", "linux")
    monkeypatch.setattr("glob.glob", lambda pattern: [])
    assert backend.gpu_device_nodes() == [] and backend.choose_auto() == "cpu" and probed == []
    monkeypatch.setattr("glob.glob", lambda pattern: ["/dev/dri/renderD128"] if "dri" in pattern else [])
    assert backend.gpu_device_nodes() == ["/dev/dri/renderD128"]
    assert backend.choose_auto() == "cpu" and sorted(probed) == ["cuda", "opengl", "vulkan"]


def test_auto_probes_side_by_side_and_chooses_in_order(monkeypatch):
    """choose_auto's probes are subprocesses: they run at the same time (three of 0.4 s take
    about 0.4 s, not 1.2), and the first hardware GPU in AUTO_ORDER wins whichever ends first."""
    import threading
    import time
    from tflite_taichi import backend
    running, most = [0], [0]
    lock = threading.Lock()

    def slow_probe(cmd, **kwargs):
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        time.sleep(0.4 if cmd[-1] == "cuda" else 0.2)
        with lock:
            running[0] -= 1
        device = {"cuda": "NVIDIA H200", "vulkan": "Found Vulkan Device 0 (NVIDIA H200)"}
        return subprocess.CompletedProcess(cmd, 0, f"PROBE-OK {cmd[-1]} {device.get(cmd[-1], '')}\n"
                                                   + (device[cmd[-1]] if cmd[-1] == "vulkan" else ""), "")
    monkeypatch.setattr(backend.subprocess, "run", slow_probe)
    monkeypatch.setattr(session.SESSION, "probes", {})
    monkeypatch.setattr(backend, "gpu_device_nodes", lambda: ["/dev/nvidia0"])
    start = time.perf_counter()
    assert backend.choose_auto() == "cuda"          # cuda ends last, and still comes first
    assert time.perf_counter() - start < 0.75 and most[0] == 3


def test_auto_decides_by_what_is_known_in_order_and_probes_from_the_first_unknown(monkeypatch):
    """A GPU backend known to work (this process's probe, the cache folder's record, or a
    device start that `auto` took at a glance) that comes first in AUTO_ORDER is chosen with
    no probe of those after it; a known failure is skipped, and only the rest are probed."""
    from tflite_taichi import backend
    probed = []
    monkeypatch.setattr(backend, "probe", lambda name, **kw: probed.append(name) or (True, False, name))
    monkeypatch.setattr(backend, "gpu_device_nodes", lambda: ["/dev/nvidia0"])
    monkeypatch.setattr(session.SESSION, "probes", {"cuda": (True, False, "NVIDIA H200")})
    assert backend.choose_auto() == "cuda" and probed == []
    monkeypatch.setattr(session.SESSION, "probes", {"cuda": (False, False, "no driver")})
    assert backend.choose_auto() == "vulkan" and sorted(probed) == ["opengl", "vulkan"]


AUTO_CPU_SCRIPT = """
import json, sys, warnings
import numpy as np
from tflite_taichi import Interpreter, backend, litert_cpu
if "--without-litert" in sys.argv:      # as where LiteRT has no wheels
    litert_cpu.available = lambda: False
from tflite_taichi.tools.demo import build_demo_model
from tflite_taichi.testing import random_input
warnings.simplefilter("ignore")
if backend.choose_auto() != "cpu":
    print("RESULT " + json.dumps(None))
else:
    model = build_demo_model()
    outs, summaries = {}, {}
    for name in ("auto", "reference"):
        it = Interpreter(model_content=model, backend=name)
        it.allocate_tensors()
        d = it.get_input_details()[0]
        it.set_tensor(d["index"], random_input(d, np.random.default_rng(0), 0.0, 1.0))
        it.invoke()
        outs[name] = it.get_tensor(it.get_output_details()[0]["index"]).tolist()
        summaries[name] = it.summary()
    s = summaries["auto"]
    print("RESULT " + json.dumps({"backend": s["backend"], "fallback": s["fallback"],
                                  "delegated": s["ops_delegated"], "outs": outs}))
"""


def test_auto_without_a_gpu_runs_the_model_on_litert(tmp_path):
    """backend='auto' on a machine without a hardware GPU, LiteRT installed: every op on
    LiteRT's CPU kernels (backend 'litert'), the answers LiteRT's own."""
    result = _script_result(tmp_path / "auto_litert.py", AUTO_CPU_SCRIPT)
    if result is None:
        assert not NO_GPU, "TFLITE_TAICHI_EXPECT_GPU=none, yet auto picked a GPU backend"
        pytest.skip("this machine has a hardware GPU: auto does not pick the CPU")
    assert result["backend"] == "litert" and result["delegated"] == 0, result
    assert result["fallback"] == [], result
    from tflite_taichi.testing import random_input, run_litert
    from tflite_taichi.tools.demo import build_demo_model
    model = build_demo_model()
    d = Interpreter(model_content=model, backend="reference").get_input_details()[0]
    lite = run_litert(model, [random_input(d, np.random.default_rng(0), 0.0, 1.0)], "xnnpack")[0]
    np.testing.assert_array_equal(np.array(result["outs"]["auto"], np.float32), lite)
    np.testing.assert_allclose(result["outs"]["auto"], result["outs"]["reference"], rtol=1e-5, atol=1e-7)


def test_auto_without_a_gpu_or_litert_runs_convolutions_on_numpy(tmp_path):
    """backend='auto' on a machine without a hardware GPU where LiteRT is not installed: Taichi's
    cpu backend, with the ops
    numpy runs faster there (backend.CPU_REFERENCE_OPS, measured in bench/results/cpu_2core.md)
    left on the reference path where their work is big enough (costs.NUMPY_CPU_ABOVE_US: the
    demo's 48x48x16 convolutions), saying why; the small ones (its 24x24 pool, its 16 -> 10 FC)
    join the Taichi partition; the outputs are the reference's."""
    from tflite_taichi.backend import CPU_REFERENCE_OPS
    result = _script_result(tmp_path / "auto_cpu.py", AUTO_CPU_SCRIPT, "--without-litert")
    if result is None:
        assert not NO_GPU, "TFLITE_TAICHI_EXPECT_GPU=none, yet auto picked a GPU backend"
        pytest.skip("this machine has a hardware GPU: auto does not pick the CPU")
    assert result["backend"] == "cpu" and result["delegated"] >= 1, result
    by_policy = {f["op"] for f in result["fallback"] if "numpy" in f["reason"]}
    assert by_policy == {"CONV_2D", "DEPTHWISE_CONV_2D"}
    assert {"AVERAGE_POOL_2D", "FULLY_CONNECTED"} <= CPU_REFERENCE_OPS     # by op, small here
    assert by_policy <= CPU_REFERENCE_OPS
    assert result["delegated"] == 5, result       # ADD, AVERAGE_POOL_2D, MEAN, FC, SOFTMAX
    assert [f["op"] for f in result["fallback"] if f["op"] not in by_policy] == []
    np.testing.assert_allclose(result["outs"]["auto"], result["outs"]["reference"], rtol=1e-5, atol=1e-7)


def test_preserve_all_tensors_makes_intermediates_readable(taichi_workers):
    """experimental_preserve_all_tensors=True (LiteRT's flag) copies every tensor a partition
    writes back to the host; the intermediates then match the reference's."""
    model = _chain(with_cpu_op=False)
    inputs = model_inputs(model)
    ref = Interpreter(model_content=model, backend="reference")
    ref.allocate_tensors()
    ref.set_tensor(0, inputs[0])
    ref.invoke()
    for backend, s in check_delegate(model, taichi_workers, inputs,
                                     experimental_preserve_all_tensors=True).items():
        assert sorted(s["tensors"]) == [2, 3, 5, 6], backend       # every op's output
        for t, value in s["tensors"].items():
            np.testing.assert_allclose(value, ref.get_tensor(t), rtol=1e-5, atol=1e-6)
