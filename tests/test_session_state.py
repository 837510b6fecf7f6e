"""The process's state lives in one place, the session (tflite_taichi/runtime/session.py): the
modules of runtime/ keep none of their own, and summary() says what the session holds."""
import ast
import json
import os
import subprocess
import sys

from tflite_taichi.runtime import session
from tflite_taichi.testing import Input, Output, one_op_model

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
RUNTIME = os.path.join(ROOT, "tflite_taichi", "runtime")
PACKAGE = os.path.join(ROOT, "tflite_taichi")

# (file, name) -> why it may stay where it is: memo caches of functions whose answer is fixed for
# the process, nothing that a run changes
ALLOWED = {
    ("cache.py", "taichi_version"): "a memo: the Taichi this process runs is fixed at its start",
    ("cache.py", "_package_source_digest"): "a memo: the digest of the sources this process "
                                            "generates kernels from, fixed once imported",
}

CONTAINERS = (ast.Dict, ast.List, ast.Set, ast.DictComp, ast.ListComp, ast.SetComp)
CONTAINER_CALLS = {"dict", "list", "set", "defaultdict", "OrderedDict", "deque", "Counter",
                   "WeakValueDictionary", "WeakKeyDictionary", "WeakSet"}
SYNC_CALLS = {"Lock", "RLock", "Condition", "Semaphore", "BoundedSemaphore", "Event", "local"}
MEMO_DECORATORS = {"lru_cache", "cache", "cached_property"}
MUTATORS = {"append", "extend", "insert", "pop", "popitem", "remove", "clear", "update",
            "setdefault", "add", "discard", "move_to_end", "appendleft", "popleft", "__setitem__"}


def _called_name(node) -> str:
    """The last name of what `node` calls ('Lock' of threading.Lock()), else ''."""
    if not isinstance(node, ast.Call):
        return ""
    func = node.func
    return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")


def _module_bindings(tree: ast.Module) -> dict:
    """name -> the value bound to it by a statement at module level (if/try blocks included)."""
    found, todo = {}, list(tree.body)
    while todo:
        node = todo.pop(0)
        if isinstance(node, (ast.If, ast.Try)):
            todo += node.body + node.orelse + getattr(node, "finalbody", []) + \
                [s for h in getattr(node, "handlers", []) for s in h.body]
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                for name in ast.walk(target):
                    if isinstance(name, ast.Name):
                        found[name.id] = node.value
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            found[node.target.id] = node.value
    return found


def _functions(tree):
    return [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]


def _local_names(function) -> set:
    """Names a function binds itself (arguments, assignments), so not the module's."""
    args = function.args
    names = {a.arg for a in args.args + args.kwonlyargs + getattr(args, "posonlyargs", [])}
    names |= {a.arg for a in (args.vararg, args.kwarg) if a is not None}
    declared = {n for node in ast.walk(function) if isinstance(node, ast.Global) for n in node.names}
    names |= {n.id for n in ast.walk(function) if isinstance(n, ast.Name)
              and isinstance(n.ctx, ast.Store)}
    return names - declared


def _mutated(node) -> str:
    """The name a statement or call mutates in place (x[k] = v, del x[k], x[k] += v, x.pop()),
    else ''."""
    if isinstance(node, ast.Subscript) and isinstance(node.ctx, (ast.Store, ast.Del)) \
            and isinstance(node.value, ast.Name):
        return node.value.id
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
            and node.func.attr in MUTATORS and isinstance(node.func.value, ast.Name):
        return node.func.value.id
    return ""


def module_state(source: str) -> dict:
    """name -> why it is state kept at module level: rebound with `global` in a function, a
    container bound at module level and changed in place, a lock or event at module level (it
    guards state of the module's), or a memo cache (a decorated function that keeps answers)."""
    tree = ast.parse(source)
    bindings = _module_bindings(tree)
    found = {}
    for function in _functions(tree):
        for node in ast.walk(function):
            if isinstance(node, ast.Global):
                found.update({n: "rebound with `global`" for n in node.names})
        local = _local_names(function)
        for node in ast.walk(function):
            name = _mutated(node)
            if name and name not in local and name in bindings:
                found.setdefault(name, "changed in place")
        for decorator in function.decorator_list:
            call = decorator.func if isinstance(decorator, ast.Call) else decorator
            last = call.attr if isinstance(call, ast.Attribute) else getattr(call, "id", "")
            if last in MEMO_DECORATORS:
                found[function.name] = "a memo cache"
    top_level = [n for n in ast.walk(ast.Module(body=[s for s in tree.body if not isinstance(
        s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))], type_ignores=[]))]
    for node in top_level:
        name = _mutated(node)
        if name and name in bindings:
            found.setdefault(name, "changed in place")
    for name, value in bindings.items():
        if _called_name(value) in SYNC_CALLS:
            found[name] = "a lock at module level"
    return {name: why for name, why in found.items()
            if why != "changed in place" or isinstance(bindings[name], CONTAINERS)
            or _called_name(bindings[name]) in CONTAINER_CALLS}


def _runtime_files() -> list:
    return sorted(n for n in os.listdir(RUNTIME) if n.endswith(".py") and n != "session.py")


def _read(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read()


def test_no_runtime_module_keeps_state_outside_the_session():
    """Every piece of mutable process state (devices, the C API library, the compile pool, the
    Taichi build, the cache's eviction counts, a child's parent) is a field of the session; what stays
    at module level is a table that never changes or an allowed memo cache."""
    found = {(name, var): why for name in _runtime_files()
             for var, why in module_state(_read(os.path.join(RUNTIME, name))).items()}
    left = {key: why for key, why in found.items() if key not in ALLOWED}
    assert not left, f"module-level state outside runtime/session.py (put it in Session): {left}"
    stale = sorted(set(ALLOWED) - set(found))
    assert not stale, f"allowed but no longer there (take them off ALLOWED): {stale}"


def test_the_scan_sees_each_kind_of_state():
    """The scan itself: each way of keeping state at module level is caught, tables are not."""
    planted = (
        "import functools, threading\n"
        "TABLE = {'f32': 4}\n"                      # read only: a table
        "_devices = {}\n"
        "_lib = None\n"
        "_lock = threading.Lock()\n"
        "def get(b):\n"
        "    _devices[b] = object()\n"
        "    return TABLE[b]\n"
        "def load():\n"
        "    global _lib\n"
        "    _lib = object()\n"
        "def local_only():\n"
        "    seen = {}\n"
        "    seen['x'] = 1\n"
        "@functools.lru_cache(maxsize=None)\n"
        "def memo():\n"
        "    return 1\n")
    assert module_state(planted) == {"_devices": "changed in place", "_lib": "rebound with `global`",
                                     "_lock": "a lock at module level", "memo": "a memo cache"}


def _imports(path: str) -> set:
    tree = ast.parse(_read(path))
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def test_the_session_imports_nothing_of_the_runtime():
    """The modules that act on the session import it; it imports none of them (the runtime's
    modules would otherwise import each other in a loop through it)."""
    ours = {m for m in _imports(os.path.join(RUNTIME, "session.py")) if m.startswith("tflite_taichi")}
    assert ours <= {"tflite_taichi.errors", "tflite_taichi.errors.BackendUnavailable",
                    "tflite_taichi.errors.InterpreterStateError"}, ours


_RUN = r'''
import json, sys
import numpy as np
from tflite_taichi import Interpreter
it = Interpreter(model_path=sys.argv[1], backend="cpu", cache_dir=sys.argv[2])
it.allocate_tensors()
for d in it.get_input_details():
    it.set_tensor(d["index"], np.ones(d["shape"], d["dtype"]))
it.invoke()
print("RESULT " + json.dumps(it.summary()["runtime"]))
'''


def _cpu_runtime(model: str, cache_dir: str, tmp_path) -> dict:
    env = dict(os.environ, HOME=str(tmp_path), XDG_CACHE_HOME=str(tmp_path / "xdg"),
               ENABLE_TAICHI_HEADER_PRINT="False", TFLITE_TAICHI_COMPILE_WORKERS="1")
    run = subprocess.run([sys.executable, "-c", _RUN, model, cache_dir], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=600)
    lines = [line for line in run.stdout.splitlines() if line.startswith("RESULT ")]
    assert run.returncode == 0 and lines, run.stdout[-2000:] + run.stderr[-3000:]
    return json.loads(lines[-1][len("RESULT "):])


def test_the_summary_says_what_the_session_holds(tmp_path):
    """On cpu (a process of its own: one Taichi arch per process): the backend claimed, the
    device started and its kind, the C API library, the Taichi build, and the compile pool as it
    stands: one worker after a cold start (kernels compiled by it), none in a warm one."""
    model = str(tmp_path / "add.tflite")
    with open(model, "wb") as f:
        f.write(one_op_model("ADD", [Input((1, 8)), Input((1, 8))], [Output((1, 8))]))
    cache_dir = str(tmp_path / "cache")
    cold = _cpu_runtime(model, cache_dir, tmp_path)
    held = cold["session"]
    assert held["backend"] == "cpu" and held["devices"] == {"cpu": cold["device"]}, held
    assert held["capi_library"]["loaded"] == (cold["device"] == "capi"), held
    if held["capi_library"]["loaded"]:
        assert os.path.isfile(held["capi_library"]["path"]), held
    assert held["taichi_build"] == session.SESSION.taichi_build and held["taichi_build_problem"] is None, held
    assert cold["compiled_in"] == "1 worker process", cold
    assert held["compile_pool"] == {"started": True, "workers": 1, "busy": False}, held
    warm = _cpu_runtime(model, cache_dir, tmp_path)
    assert warm["compiled_in"] is None, warm
    assert warm["session"]["compile_pool"] == {"started": False, "workers": 0, "busy": False}, warm
    assert warm["session"]["backend"] == "cpu", warm
