"""How ops/ is laid out (docs/ops.md, "An op"): the families that grew large are packages whose
parts read alone (the OpDefs in __init__.py; reference.py the numpy reference, which imports no
Taichi; kernels.py the Taichi steps; select.py the per-arch choice), no family reaches into
another's private names, and an OpDef's state declarations are one `State` record."""
import ast
import dataclasses
import os

import pytest

from tflite_taichi import OpDef, State
from tflite_taichi.ops.base import NO_STATE

OPS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "ops")
PACKAGES = ("conv", "sequence", "transforms")
# what a numpy reference must not import: Taichi, or the parts of its family built on it
TAICHI_SIDE = {"taichi", "tflite_taichi.ops.kit", "tflite_taichi.ops.lazy_taichi"}


def _ops_modules() -> dict:
    """dotted name (tflite_taichi.ops.conv.kernels) -> its syntax tree, for every file of ops/."""
    found = {}
    for folder, dirs, files in os.walk(OPS):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                parts = os.path.relpath(path, OPS)[:-3].split(os.sep)
                if parts[-1] == "__init__":
                    parts = parts[:-1]
                with open(path, encoding="utf-8") as f:
                    found[".".join(["tflite_taichi.ops", *parts])] = ast.parse(f.read(), path)
    return found


def _is_package(module: str) -> bool:
    return os.path.isfile(os.path.join(OPS, *module.split(".")[2:], "__init__.py"))


def _absolute(module: str, node: ast.ImportFrom) -> str:
    """The module an ImportFrom in `module` names, relative levels resolved."""
    if not node.level:
        return node.module or ""
    package = module if _is_package(module) else module.rpartition(".")[0]
    for _ in range(node.level - 1):
        package = package.rpartition(".")[0]
    return f"{package}.{node.module}" if node.module else package


def _family(module: str):
    """The op family (or shared module) of ops/ a dotted name belongs to: conv for
    tflite_taichi.ops.conv.kernels; None outside ops/."""
    parts = module.split(".")
    return parts[2] if parts[:2] == ["tflite_taichi", "ops"] and len(parts) > 2 else None


def _is_ops_module(module: str) -> bool:
    path = os.path.join(OPS, *module.split(".")[2:])
    return _family(module) is not None and (_is_package(module) or os.path.isfile(path + ".py"))


def _private_reaches(module: str, tree) -> list:
    """`from <another family> import _name`, and `alias._name` on another family imported as a
    module (`from . import sequence as lstm`)."""
    found, aliases = [], {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            source = _absolute(module, node)
            for alias in node.names:
                if _is_ops_module(f"{source}.{alias.name}"):
                    aliases[alias.asname or alias.name] = f"{source}.{alias.name}"
                elif (alias.name.startswith("_") and _family(source) is not None
                      and _family(source) != _family(module)):
                    found.append(f"{module}: from {source} import {alias.name}")
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id in aliases and node.attr.startswith("_")
                and _family(aliases[node.value.id]) != _family(module)):
            found.append(f"{module}: {node.value.id}.{node.attr} ({aliases[node.value.id]})")
    return found


def test_no_family_reaches_into_another_familys_private_names():
    """What two families share has a public home (ops/common.py, or the family's public
    names), so that a family's private names can change with it alone."""
    modules = _ops_modules()
    assert not [r for m, tree in modules.items() for r in _private_reaches(m, tree)]


def test_the_private_reach_check_sees_both_forms():
    """The check above, on the two forms it looks for (each was in ops/ once)."""
    by_name = ast.parse("from .activations import _TANH_SATURATION\n")
    by_attribute = ast.parse("from . import sequence as lstm\nget = lstm._getter(values)\n")
    within = ast.parse("from .reference import _normalize\n")
    assert _private_reaches("tflite_taichi.ops.arith", by_name)
    assert _private_reaches("tflite_taichi.ops.recurrent", by_attribute)
    assert not _private_reaches("tflite_taichi.ops.sequence.kernels", within)


def _imports(module: str, tree) -> set:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            source = _absolute(module, node)
            names.add(source)
            names.update(f"{source}.{alias.name}" for alias in node.names)
    return names


@pytest.mark.parametrize("family", PACKAGES)
def test_a_split_family_is_a_package_of_parts(family):
    modules = _ops_modules()
    package = f"tflite_taichi.ops.{family}"
    assert _is_package(package), f"ops/{family}/ should be a package"
    parts = {m.rpartition(".")[2] for m in modules if m.startswith(package + ".")}
    assert {"reference", "kernels"} <= parts, parts
    reference = f"{package}.reference"
    reached = _imports(reference, modules[reference])
    taichi_side = {f"{package}.kernels", f"{package}.select"} | TAICHI_SIDE
    assert not {name for name in reached
                if any(name == t or name.startswith(t + ".") for t in taichi_side)}, (
        f"{reference} is the numpy reference: it imports no Taichi")
    kernels = f"{package}.kernels"
    assert f"{package}.select" not in _imports(kernels, modules[kernels]), (
        "select.py chooses among the kernels: kernels.py does not import it")


def test_the_reference_check_sees_a_taichi_import():
    tree = ast.parse("from ..kit import ti\n")
    assert "tflite_taichi.ops.kit.ti" in _imports("tflite_taichi.ops.conv.reference", tree)


def test_opdef_state_is_one_record():
    """The state declarations are State's fields, not OpDef's; each still reads through the op
    (the pipeline asks opdef.stateful), and an op without them declares none."""
    op_fields = {f.name for f in dataclasses.fields(OpDef)}
    state_fields = [f.name for f in dataclasses.fields(State)]
    assert not op_fields & set(state_fields)
    assert "state" in op_fields
    plain = OpDef(name="CUSTOM:Plain", infer=lambda node: [], reference=lambda node, x: [])
    assert plain.state is NO_STATE and not plain.stateful
    for name in state_fields:
        marker = object()
        op = dataclasses.replace(plain, state=State(**{name: marker}))
        assert getattr(op, name) is marker, name
    with pytest.raises(dataclasses.FrozenInstanceError):
        NO_STATE.stateful = True
