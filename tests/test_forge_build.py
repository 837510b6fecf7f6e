"""TFLITE_TAICHI_TAICHI=forge (tflite_taichi/runtime/taichi_build.py): kernels built by taichi-forge's
frontend (our code generator unchanged) and run by its runtime library through the same C API
binding, cold and warm, with the outputs of the reference path; its modules apart from upstream
taichi's in the cache; a switch that cannot be honoured says why. Taichi runs in subprocesses
(the Taichi build is fixed per process). The `forge` extra is installed where CI runs this file."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from cases.demo import demo_case

pytest.importorskip("taichi_forge", reason="the forge extra is not installed (pip install '.[forge]')")

RUN = r'''
import json, sys
import numpy as np
args = json.loads(sys.argv[1])
from tflite_taichi import Interpreter
from tflite_taichi.runtime import cache, capi, session
it = Interpreter(model_path=args["model"], backend=args["backend"], cache_dir=args["cache_dir"])
it.allocate_tensors()
it.set_tensor(it.get_input_details()[0]["index"], np.load(args["input"]))
it.invoke()
np.save(args["output"], it.get_tensor(it.get_output_details()[0]["index"]))
s = it.summary()
print("RESULT " + json.dumps({"cache": s["cache"]["state"], "compiled_in": s["runtime"]["compiled_in"],
      "device": s["runtime"]["device"], "taichi_build": session.SESSION.taichi_build, "taichi": cache.taichi_version(),
      "library": capi.library_path()}))
'''


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    return demo_case(tmp_path_factory.mktemp("forge"), seed=5)


def run(demo, cache_dir, build, backend="cpu", expect_ok=True, env=None):
    tmp, model, _ = demo
    env = {**os.environ, "ENABLE_TAICHI_HEADER_PRINT": "False", "TI_SKIP_VERSION_CHECK": "ON",
           **(env or {})}
    env.pop("TFLITE_TAICHI_TAICHI", None)
    if build is not None:
        env["TFLITE_TAICHI_TAICHI"] = build
    out = tmp / f"y{len(os.listdir(tmp))}.npy"
    args = {"model": str(model), "input": str(tmp / "x.npy"), "output": str(out),
            "backend": backend, "cache_dir": str(cache_dir)}
    proc = subprocess.run([sys.executable, "-c", RUN, json.dumps(args)], capture_output=True,
                          text=True, timeout=600, env=env)
    if not expect_ok:
        return proc
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-2000:] + proc.stderr[-3000:]
    result = json.loads(lines[-1][len("RESULT "):])
    result["y"] = np.load(out)
    return result


def test_forge_builds_and_runs_a_model_cold_and_warm(demo, tmp_path):
    """The demo model on cpu (x64): compiled by forge's frontend in worker processes, loaded by
    forge's runtime library, with the reference path's outputs (the cpu backend's tolerance,
    tests/test_compile_workers.py: float32 sums in another order); warm from its own modules;
    upstream taichi, on the same cache folder, does not take forge's modules (cold again)."""
    cold = run(demo, tmp_path, "forge")
    assert cold["taichi_build"] == "forge", cold
    assert cold["taichi"].startswith("forge-") and "libtaichi_runtime" in cold["library"], cold
    assert cold["cache"] == "cold" and cold["compiled_in"] and cold["device"] == "capi", cold
    np.testing.assert_allclose(cold["y"], demo[2], rtol=1e-5, atol=1e-6)
    warm = run(demo, tmp_path, "forge")
    assert warm["cache"] == "warm" and warm["compiled_in"] is None, warm
    np.testing.assert_array_equal(warm["y"], cold["y"])
    # importing taichi_forge sets TI_LIB_DIR to forge's runtime bitcode for the process and its
    # children: upstream's C API crashed on it (SIGSEGV) before capi.py pointed TI_LIB_DIR at
    # its own library's folder. The child gets it as a process that imported forge passes it on.
    from tflite_taichi.runtime import taichi_build
    upstream = run(demo, tmp_path, None, env={"TI_LIB_DIR": taichi_build.runtime_bitcode_dir()})
    assert upstream["taichi_build"] == "taichi", upstream
    assert upstream["cache"] == "cold" and "libtaichi_c_api" in upstream["library"], upstream
    np.testing.assert_allclose(upstream["y"], demo[2], rtol=1e-5, atol=1e-6)


BLOCK_FORGE = "import sys, importlib.abc\n" \
    "class B(importlib.abc.MetaPathFinder):\n" \
    "    def find_spec(self, name, path=None, target=None):\n" \
    "        if name.startswith('taichi_forge'): raise ImportError('blocked')\n" \
    "sys.meta_path.insert(0, B())\n"


@pytest.mark.parametrize("value, expected", [
    ("forge-but-absent", "taichi-forge is not installed: pip install 'tflite-taichi[forge]'"),
    ("upstream", "TFLITE_TAICHI_TAICHI='upstream': choose 'taichi' or 'forge'"),
])
def test_a_switch_that_cannot_be_honoured_says_why(demo, tmp_path, value, expected):
    """forge asked for where it is not installed (hidden here), or an unknown value: a Taichi
    backend refuses with BackendUnavailable naming the fix; the reference path still runs."""
    _, model, _ = demo
    script = (BLOCK_FORGE if value == "forge-but-absent" else "") + (
        "from tflite_taichi import Interpreter\n"
        "from tflite_taichi.errors import BackendUnavailable\n"
        f"Interpreter(model_path={str(model)!r}, backend='reference').allocate_tensors()\n"
        "try:\n"
        f"    Interpreter(model_path={str(model)!r}, backend='cpu', cache_dir={str(tmp_path)!r})\n"
        "except BackendUnavailable as e:\n"
        "    print('REFUSED', e)\n")
    env = {**os.environ, "TFLITE_TAICHI_TAICHI": "forge" if value == "forge-but-absent" else value}
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "REFUSED" in proc.stdout and expected in proc.stdout, proc.stdout + proc.stderr[-1000:]
