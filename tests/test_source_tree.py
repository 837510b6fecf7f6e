"""The clone's root is a place users run Python from (the README's `python -m pytest ...`,
`python -m tflite_taichi.fuzz`): there `import tflite_taichi` finds the source folder before the
installed package, and the source tree keeps ops/ and quant/ beside it (issue 14, item 2)."""
import json
import os
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

PROBE = r'''
import json, tflite_taichi, tflite_taichi.ops, tflite_taichi.quant
from tflite_taichi import Interpreter
from tflite_taichi.demo import build_demo_model
it = Interpreter(model_content=build_demo_model(), backend="reference")
it.allocate_tensors(); it.invoke()
print("RESULT " + json.dumps({m.__name__: m.__file__ for m in (tflite_taichi, tflite_taichi.ops, tflite_taichi.quant)}))
'''


def test_the_source_tree_imports_from_its_root(tmp_path):
    # a copy of the source tree: the installed package (editable or not) lives elsewhere
    for folder in ("tflite_taichi", "ops", "quant"):
        shutil.copytree(os.path.join(ROOT, folder), tmp_path / folder,
                        ignore=shutil.ignore_patterns("__pycache__"))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    files = json.loads([l for l in out.stdout.splitlines() if l.startswith("RESULT ")][0][7:])
    for name, path in files.items():       # every part from the same tree, not a mix
        assert os.path.realpath(path).startswith(os.path.realpath(str(tmp_path))), (name, path)
    fuzz = subprocess.run([sys.executable, "-m", "tflite_taichi.fuzz", "--help"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert fuzz.returncode == 0 and "usage" in fuzz.stdout, fuzz.stderr[-2000:]
