"""`import tflite_taichi` in fresh processes: median and spread over runs,
beside `import numpy` alone (which it needs) and the `tflite` schema bindings (which it now
imports at the first model read), with the package byte-compiled as pip installs it.

    python bench/import_time.py [--runs 15] [--before CHECKOUT] [--json OUT.json]

--before CHECKOUT times the package of another checkout (a `git worktree` of the commit to
compare with, byte-compiled) in the same interleaved runs, through PYTHONPATH.
"""
import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile

import numpy as np

from start_times import byte_compiled_env

CHILD = """
import sys, time
t = time.perf_counter()
exec(sys.argv[1])
dt = time.perf_counter() - t
print(dt, len([m for m in sys.modules if m.startswith("tflite_taichi")]))
assert "tflite_taichi" not in sys.modules or sys.modules["tflite_taichi"].__file__.startswith(
    sys.argv[2]), sys.modules["tflite_taichi"].__file__
"""

STATEMENTS = {
    "numpy": "import numpy",
    "numpy + tflite (schema)": "import numpy, tflite",
    "import tflite_taichi": "import tflite_taichi",
    "from tflite_taichi import Interpreter": "from tflite_taichi import Interpreter",
}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=15)
    p.add_argument("--before")
    p.add_argument("--json")
    a = p.parse_args(argv)
    env = byte_compiled_env()
    import tflite_taichi
    here = os.path.dirname(os.path.dirname(os.path.abspath(tflite_taichi.__file__)))
    envs = {name: env for name in STATEMENTS}
    roots = {name: here for name in STATEMENTS}
    if a.before:
        import compileall
        for folder in ("tflite_taichi", "ops", "quant"):
            compileall.compile_dir(f"{a.before}/{folder}", quiet=1)
        for name in ("import tflite_taichi", "from tflite_taichi import Interpreter"):
            STATEMENTS[f"{name} (before)"] = STATEMENTS[name]
            envs[f"{name} (before)"] = dict(env, PYTHONPATH=os.pathsep.join(
                filter(None, [os.path.abspath(a.before), env.get("PYTHONPATH")])))
            roots[f"{name} (before)"] = os.path.abspath(a.before)
    rows = {}
    print(f"{platform.node()} python {platform.python_version()}, {a.runs} fresh processes each, "
          "interleaved")
    times = {name: [] for name in STATEMENTS}
    modules = {}
    elsewhere = tempfile.mkdtemp()  # `python -c` imports from its working folder first
    for _ in range(a.runs):         # interleaved, so a busy moment hits every statement alike
        for name, stmt in STATEMENTS.items():
            out = subprocess.run([sys.executable, "-c", CHILD, stmt, roots[name]], env=envs[name],
                                 check=True, capture_output=True, text=True,
                                 cwd=elsewhere).stdout.split()
            times[name].append(float(out[0]) * 1e3)
            modules[name] = int(out[1])
    print(f"{'statement':40} {'median ms':>9} {'min':>6} {'max':>6}  tflite_taichi modules")
    for name, ms in times.items():
        rows[name] = {"median_ms": float(np.median(ms)), "min_ms": min(ms), "max_ms": max(ms),
                      "modules": modules[name], "runs_ms": ms}
        print(f"{name:40} {np.median(ms):9.1f} {min(ms):6.1f} {max(ms):6.1f}  {modules[name]}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"argv": sys.argv, "python": platform.python_version(), "rows": rows}, f,
                      indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
