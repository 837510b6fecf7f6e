"""The clone's root is a place users run Python from (the README's `python -m pytest ...`,
`python bench/fuzz.py`): there `import tflite_taichi` finds the source folder before the
installed package, and the links tflite_taichi/ops and tflite_taichi/quant join to it ops/ and
quant/, kept beside it (docs/layout.md says why links; tests/test_package_layout.py holds them)."""
import json
import os
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

PROBE = r'''
import json, tflite_taichi, tflite_taichi.ops, tflite_taichi.quant
from tflite_taichi import Interpreter
from tflite_taichi.tools.demo import build_demo_model
it = Interpreter(model_content=build_demo_model(), backend="reference")
it.allocate_tensors(); it.invoke()
print("RESULT " + json.dumps({m.__name__: m.__file__ for m in (tflite_taichi, tflite_taichi.ops, tflite_taichi.quant)}))
'''


def test_the_source_tree_imports_from_its_root(tmp_path):
    # a copy of the source tree: the installed package (editable or not) lives elsewhere
    for folder in ("tflite_taichi", "ops", "quant"):
        shutil.copytree(os.path.join(ROOT, folder), tmp_path / folder, symlinks=True,
                        ignore=shutil.ignore_patterns("__pycache__"))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    files = json.loads([l for l in out.stdout.splitlines() if l.startswith("RESULT ")][0][7:])
    for name, path in files.items():       # every part from the same tree, not a mix
        assert os.path.realpath(path).startswith(os.path.realpath(str(tmp_path))), (name, path)
    os.makedirs(tmp_path / "bench")        # the fuzzer: a tool in bench/, run from the root
    shutil.copy(os.path.join(ROOT, "bench", "fuzz.py"), tmp_path / "bench")
    fuzz = subprocess.run([sys.executable, os.path.join("bench", "fuzz.py"), "--help"], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=120)
    assert fuzz.returncode == 0 and "usage" in fuzz.stdout, fuzz.stderr[-2000:]


# Files that write models (tests, examples, the demo and zoo, the fuzzer) name ops as data; the
# pipeline never does: what it needs to know about an op is a field of the op's OpDef, so a new
# op touches only ops/.
MODEL_BUILDING_FILES = {"builder.py", "demo.py", "zoo.py", "testing.py", "fuzz.py"}


def _docstring_positions(tree) -> set:
    """(line, column) of every docstring in `tree`: text about ops, not code naming them."""
    import ast
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, str):
                found.add((body[0].value.lineno, body[0].value.col_offset))
    return found


def _op_names_in_code(path: str, names: set) -> list:
    """'file:line: NAME' for each string constant in code (docstrings and comments aside)
    that is a registered op name."""
    import ast
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), filename=path)
    docstrings = _docstring_positions(tree)
    where = os.path.relpath(path, ROOT)
    return [f"{where}:{node.lineno}: {node.value}" for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str)
            and node.value in names and (node.lineno, node.col_offset) not in docstrings]


def test_no_op_name_outside_ops():
    from tflite_taichi import ops
    names = set(ops.load_all())
    found = []
    for folder in ("tflite_taichi", "tflite_taichi/runtime", "tflite_taichi/batch", "quant"):
        for name in sorted(os.listdir(os.path.join(ROOT, folder))):
            if name.endswith(".py") and name not in MODEL_BUILDING_FILES:
                found += _op_names_in_code(os.path.join(ROOT, folder, name), names)
    assert not found, "op names outside ops/ (make them OpDef fields):\n" + "\n".join(found)


def test_the_interpreter_runtime_is_what_ops_may_ask_for():
    """ops.base.Runtime declares what stateful ops use of their interpreter; the interpreter's
    runtime offers each of its members, methods with the same parameters."""
    import inspect
    import typing
    from tflite_taichi.executor import ModelRuntime
    from tflite_taichi.ops.base import Runtime
    runtime = ModelRuntime(model=None, resolved=None, state_of=None)
    for name in typing.get_type_hints(Runtime):         # attributes
        assert hasattr(runtime, name), name
    methods = [n for n, v in vars(Runtime).items() if inspect.isfunction(v) and not n.startswith("_")]
    assert methods, "the Protocol declares no methods"
    for name in methods:
        declared = list(inspect.signature(getattr(Runtime, name)).parameters)
        offered = list(inspect.signature(getattr(ModelRuntime, name)).parameters)
        assert offered == declared, (name, offered, declared)


def test_ruff_is_clean():
    """The linter (pyproject.toml's [tool.ruff]) finds nothing in the repository; it is in the
    test extras, so this runs wherever the suite does."""
    proc = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", ROOT],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_every_package_folder_is_installed():
    """pyproject.toml lists the packages by hand: a folder with an __init__.py that it misses
    works from the clone (editable installs, the source tree) and is missing from a wheel."""
    import re
    text = open(os.path.join(ROOT, "pyproject.toml")).read()
    listed = set(re.findall(r'"(tflite_taichi[\w.]*)"', text.split("packages = [", 1)[1].split("]", 1)[0]))
    roots = {"tflite_taichi": "tflite_taichi", "tflite_taichi.ops": "ops", "tflite_taichi.quant": "quant"}
    found = set()
    for package, folder in roots.items():
        for dirpath, dirnames, filenames in os.walk(os.path.join(ROOT, folder)):
            dirnames[:] = [d for d in dirnames if d != "__pycache__"]
            rel = os.path.relpath(dirpath, os.path.join(ROOT, folder))
            name = package if rel == "." else package + "." + rel.replace(os.sep, ".")
            if "__init__.py" in filenames:
                found.add(name)
    assert found <= listed, sorted(found - listed)



# markers pytest and its plugins define (pytest-timeout's `timeout`)
BUILTIN_MARKERS = {"parametrize", "skip", "skipif", "xfail", "usefixtures", "filterwarnings",
                   "timeout"}


def test_every_declared_marker_is_used_and_no_other():
    """A marker pyproject declares and no test uses says the suite has a split it does not have
    (a `slow` marker sat unused while long runs went unmarked); one a test uses undeclared is a
    typo that selects nothing. Both, read from the sources."""
    import re
    with open(os.path.join(ROOT, "pyproject.toml")) as f:
        block = re.search(r"^markers = \[(.*?)^\]", f.read(), re.S | re.M).group(1)
    declared = set(re.findall(r'^\s*"(\w+):', block, re.M))
    used = set()
    for folder, _dirs, files in os.walk(os.path.join(ROOT, "tests")):
        for name in files:
            if name.endswith(".py"):
                with open(os.path.join(folder, name)) as f:
                    used |= set(re.findall(r"pytest\.mark\.(\w+)", f.read()))
    used -= BUILTIN_MARKERS
    assert declared == used, {"declared, unused": sorted(declared - used),
                              "used, undeclared": sorted(used - declared)}
