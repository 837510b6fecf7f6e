"""Scenarios run on each Taichi backend in a subprocess of their own (Taichi is one runtime per
process), all backends at once: test_inputs.py and test_concurrency.py. A test module defines
`run_all(backend) -> {name: "ok" or traceback}` (from `run_scenarios`) and gets every backend's
answers from `in_subprocesses`."""
import json
import os
import subprocess
import sys
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))


def run_scenarios(scenarios: dict, backend: str) -> dict:
    """{name: "ok" or the traceback} of each scenario(backend)."""
    out = {}
    for name, fn in scenarios.items():
        try:
            fn(backend)
            out[name] = "ok"
        except BaseException:
            out[name] = traceback.format_exc()
    return out


def in_subprocesses(module: str, backends) -> dict:
    """backend -> `module.run_all(backend)`'s dict, or the end of the subprocess's output when it
    failed. The subprocesses run in tests/, not the checkout's root: its tflite_taichi/ lacks
    ops/ (only the installed package has it)."""
    child = (f"import json, sys; sys.path.insert(0, sys.argv[1]); import {module} as t; "
             "print('RESULT ' + json.dumps(t.run_all(sys.argv[2])), flush=True)")
    env = dict(os.environ, ENABLE_TAICHI_HEADER_PRINT="False")
    procs = {b: subprocess.Popen([sys.executable, "-c", child, HERE, b], stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True, env=env, cwd=HERE)
             for b in backends}
    results = {}
    for backend, proc in procs.items():
        out, _ = proc.communicate(timeout=300)
        lines = [line for line in out.splitlines() if line.startswith("RESULT ")]
        results[backend] = json.loads(lines[-1][7:]) if lines and proc.returncode == 0 else out[-3000:]
    return results
