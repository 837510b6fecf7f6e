"""The layers' import directions: model <- quant <- ops <- delegate <- interpreter,
nothing upward; and Taichi imported only by what compiles, never by backend='reference'."""
import ast
import os
import subprocess
import sys
import textwrap

import numpy as np

from tflite_taichi.testing import Input, Output, one_op_model

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))

# file (relative to the source tree's root) -> the dotted package its relative imports start from
LOWER_LAYERS = {"tflite_taichi/tensors.py": "tflite_taichi", "tflite_taichi/model.py": "tflite_taichi"}
LOWER_LAYERS.update({f"quant/{name}": "tflite_taichi.quant"
                     for name in sorted(os.listdir(os.path.join(ROOT, "quant"))) if name.endswith(".py")})


def _resolve(node: ast.ImportFrom, package: str) -> str:
    """The absolute module a `from ... import` names (relative levels resolved in `package`)."""
    if not node.level:
        return node.module or ""
    parts = package.split(".")
    base = parts[:len(parts) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def imported_modules(path: str, package: str) -> set:
    """Every module `path` imports, anywhere in it (functions included), as dotted names;
    `from a import b` counts as a.b too, since b may be a module."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), filename=path)
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            module = _resolve(node, package)
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)
    return found


def _reaches(modules: set, target: str) -> list:
    return sorted(m for m in modules if m == target or m.startswith(target + "."))


def test_model_and_quant_import_nothing_from_ops():
    upward = {f: _reaches(imported_modules(os.path.join(ROOT, f), pkg), "tflite_taichi.ops")
              for f, pkg in LOWER_LAYERS.items()}
    upward = {f: mods for f, mods in upward.items() if mods}
    assert not upward, f"imports from ops below it: {upward}"


RUNTIME = ["backend", "cache", "capi", "codegen", "delegate", "device", "executor", "graph",
           "interpreter", "partition", "planner", "vulkan_host"]


def test_ops_never_import_the_runtime_above_them():
    """ops <- delegate: an op learns what it must of the runtime from what it is handed (its
    node, StepIO with its arch, the Runtime protocol), never by importing it."""
    upward = {}
    for name in sorted(os.listdir(os.path.join(ROOT, "ops"))):
        if name.endswith(".py"):
            modules = imported_modules(os.path.join(ROOT, "ops", name), "tflite_taichi.ops")
            found = sum((_reaches(modules, f"tflite_taichi.{m}") for m in RUNTIME), [])
            if found:
                upward[name] = found
    assert not upward, upward


def test_the_executor_sits_below_the_interpreter():
    """The executor (subgraph state, the runtime stateful ops see) knows nothing of the tf.lite
    face above it."""
    modules = imported_modules(os.path.join(ROOT, "tflite_taichi", "executor.py"), "tflite_taichi")
    assert not _reaches(modules, "tflite_taichi.interpreter")
    assert "tflite_taichi.executor" in imported_modules(
        os.path.join(ROOT, "tflite_taichi", "interpreter.py"), "tflite_taichi")


def test_the_tensor_types_depend_on_nothing_but_errors():
    ours = _reaches(imported_modules(os.path.join(ROOT, "tflite_taichi", "tensors.py"), "tflite_taichi"),
                    "tflite_taichi")
    assert set(ours) <= {"tflite_taichi.errors", "tflite_taichi.errors.ModelError"}, ours


def test_the_cache_hashes_ops_and_quant_without_importing_them():
    modules = imported_modules(os.path.join(ROOT, "tflite_taichi", "runtime", "cache.py"),
                               "tflite_taichi")
    assert not _reaches(modules, "tflite_taichi.ops") + _reaches(modules, "tflite_taichi.quant")


def test_the_moved_names_keep_their_old_homes():
    from tflite_taichi import tensors
    from tflite_taichi.ops import base, sparse
    assert base.Quantization is tensors.Quantization
    for name in ("DENSE", "SPARSE_CSR", "DimMetadata", "Sparsity", "densify", "sparsify"):
        assert getattr(sparse, name) is getattr(tensors, name), name


# The child runs float and int8 models on the reference path and reports whether Taichi was
# imported at any point (import tflite_taichi, reading, allocating, invoking, reading outputs).
_REFERENCE_RUN = textwrap.dedent("""
    import sys
    import numpy as np
    import tflite_taichi
    from tflite_taichi import Interpreter
    for path in sys.argv[1:]:
        it = Interpreter(model_path=path, backend="reference")
        it.allocate_tensors()
        for d in it.get_input_details():
            it.set_tensor(d["index"], np.ones(d["shape"], d["dtype"]))
        it.invoke()
        outputs = [it.get_tensor(d["index"]) for d in it.get_output_details()]
        assert all(np.all(np.isfinite(o)) for o in outputs), outputs
    print("taichi imported:", "taichi" in sys.modules)
""")


def test_the_reference_backend_never_imports_taichi(tmp_path):
    models = {
        "float_add": one_op_model("ADD", [Input((1, 4, 3)), Input((1, 4, 3))], [Output((1, 4, 3))]),
        "int8_add": one_op_model("ADD", [Input((2, 5), np.int8, (0.05, -3)), Input((2, 5), np.int8, (0.05, -3))],
                                 [Output((2, 5), np.int8, (0.1, 4))]),
    }
    paths = []
    for name, data in models.items():
        paths.append(str(tmp_path / f"{name}.tflite"))
        with open(paths[-1], "wb") as f:
            f.write(data)
    # a home and caches of its own: the suite writes nothing into the real HOME
    env = dict(os.environ, HOME=str(tmp_path), XDG_CACHE_HOME=str(tmp_path / "xdg"))
    env.pop("TFLITE_TAICHI_CACHE_DIR", None)
    run = subprocess.run([sys.executable, "-c", _REFERENCE_RUN, *paths], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "taichi imported: False" in run.stdout, run.stdout + run.stderr[-2000:]


def test_test_files_import_shared_cases_not_each_other():
    """Shared op cases live in tests/cases/ (one module per family): no test file imports
    another test file."""
    tests = os.path.join(ROOT, "tests")
    found = {}
    for folder in (tests, os.path.join(tests, "cases")):
        for name in sorted(os.listdir(folder)):
            if name.endswith(".py"):
                mods = imported_modules(os.path.join(folder, name), "")
                bad = sorted(m for m in mods if m.split(".")[0].startswith("test_"))
                if bad:
                    found[name] = bad
    assert not found, found


# -- the house, drawn from its imports ----------------------------------------------------------
# Its floors, top first. A module imports from its own floor or below (imports inside functions
# included), never from above, and no modules import each other in a loop: the runtime's line is
# interpreter -> executor -> program_builder -> delegate -> runtime -> codegen -> planner ->
# partition -> graph -> ops -> quant/model -> tensors. Every module of the package stands on a
# floor: a new one is placed here. (Optional third-party dependencies, such as Ray and pyarrow, are not arrows.)
FLOORS = [
    ("the command line", ["__main__", "cli"]),
    ("tools beside the runtime", ["tools", "batch"]),
    ("user helpers", ["cli_inputs", "testing"]),
    ("the tf.lite face", ["__init__", "interpreter", "node_data"]),
    ("the executor", ["executor"]),
    ("the delegate's builder", ["program_builder"]),
    ("the delegate's runner and the CPU executor", ["delegate", "litert_cpu", "litert_islands"]),
    ("the runtime wing", ["backend", "runtime", "_probe"]),
    ("kernel generation", ["codegen"]),
    ("memory planning", ["planner"]),
    ("partitioning", ["partition", "costs", "auto_choice"]),
    ("the prepared graph", ["graph", "variables"]),
    ("model writing", ["builder"]),
    ("the ops", ["ops"]),
    ("the model and quantization", ["quant", "model", "metadata"]),
    ("tensors", ["tensors"]),
    ("the ground", ["switches", "threads", "errors", "version"]),
]


def _package_modules() -> dict:
    """dotted module name -> (file, the package its relative imports start from), for every
    module of tflite_taichi, ops and quant (as installed: tflite_taichi.ops, tflite_taichi.quant)."""
    found = {}
    for top in ("tflite_taichi", "ops", "quant"):
        for folder, dirs, files in os.walk(os.path.join(ROOT, top)):
            dirs[:] = [d for d in dirs if d != "__pycache__"
                       and not os.path.islink(os.path.join(folder, d))]
            for name in files:
                if name.endswith(".py"):
                    rel = os.path.relpath(os.path.join(folder, name), ROOT)[:-3].split(os.sep)
                    dotted = ".".join(rel if rel[0] == "tflite_taichi" else ["tflite_taichi"] + rel)
                    package = dotted.rpartition(".")[0]
                    if name == "__init__.py":
                        dotted = package
                        package = dotted
                    found[dotted] = (os.path.join(folder, name), package)
    return found


def _floor(module: str):
    name = "__init__" if module == "tflite_taichi" else module[len("tflite_taichi."):]
    for level, (_, names) in enumerate(FLOORS):
        if any(name == n or name.startswith(n + ".") for n in names):
            return level
    return None


def _package_arrows() -> dict:
    """module -> the package modules it imports: `from a import b` is a.b where that is a
    module, else a; `import a.b.c` its longest prefix that is a module."""
    modules = _package_modules()

    def module_of(name):
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name

    arrows = {}
    for module, (path, package) in modules.items():
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), filename=path)
        targets = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                targets.update(module_of(alias.name) for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = _resolve(node, package)
                targets.update(module_of(f"{base}.{alias.name}") for alias in node.names)
        arrows[module] = {t for t in targets if t.startswith("tflite_taichi") and t != module}
    return arrows


def test_the_delegate_builds_in_one_module_and_runs_in_another():
    """As TFLite's GPU delegate splits InferenceBuilder from the InferenceRunner that only sets
    objects and runs: program_builder.py plans, compiles and allocates and hands over a
    delegate.Program; delegate.py (the runner) imports neither kernel generation nor the
    kernels' getting (cache, compile, load), nor the builder; the executor builds through the
    builder alone."""
    runner = imported_modules(os.path.join(ROOT, "tflite_taichi", "delegate.py"), "tflite_taichi")
    building = (_reaches(runner, "tflite_taichi.codegen") + _reaches(runner, "tflite_taichi.program_builder")
                + [m for m in runner if m == "tflite_taichi.runtime.kernels.ProgramKernels"])
    assert not building, building
    builder = imported_modules(os.path.join(ROOT, "tflite_taichi", "program_builder.py"), "tflite_taichi")
    assert {"tflite_taichi.delegate.Program", "tflite_taichi.codegen",
            "tflite_taichi.runtime.kernels.ProgramKernels"} <= builder
    executor = imported_modules(os.path.join(ROOT, "tflite_taichi", "executor.py"), "tflite_taichi")
    assert "tflite_taichi.program_builder.build_program" in executor
    assert "tflite_taichi.delegate.Program" not in executor


def test_every_module_stands_on_a_floor():
    assert not [m for m in _package_modules() if _floor(m) is None]


def test_no_arrow_runs_back_up():
    upward = sorted(f"{a} -> {b}" for a, targets in _package_arrows().items() for b in targets
                    if _floor(b) < _floor(a))
    assert not upward, "imports from a higher floor (FLOORS):\n" + "\n".join(upward)


def test_no_import_loop():
    arrows = _package_arrows()
    state, loops = {}, []

    def visit(module, path):
        state[module] = "open"
        for target in sorted(arrows.get(module, ())):
            if state.get(target) == "open":
                loops.append(path[path.index(target):] + [target])
            elif target not in state:
                visit(target, path + [target])
        state[module] = "done"

    for module in sorted(arrows):
        if module not in state:
            visit(module, [module])
    assert not loops, "\n".join(" -> ".join(loop) for loop in loops)


def test_the_floors_catch_an_arrow_up():
    """The check itself: a module of a low floor that imported the interpreter is caught."""
    arrows = _package_arrows()
    arrows["tflite_taichi.graph"].add("tflite_taichi.interpreter")
    upward = [a for a, targets in arrows.items() for b in targets if _floor(b) < _floor(a)]
    assert upward == ["tflite_taichi.graph"]
