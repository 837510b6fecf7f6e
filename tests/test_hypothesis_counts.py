"""Every hypothesis count in tests/ scales with the loaded profile (tests/conftest.py says how):
a test states its count under "ci" through tflite_taichi.testing.examples(n) or TAICHI_EXAMPLES,
never as a bare number, which would run the same count under "thorough" and "explore" as under
"ci" (those profiles would then draw no more of it than CI does). Only the profiles themselves,
registered in tests/conftest.py, say numbers."""
import ast
import os

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))


def _literal_names(tree: ast.Module) -> set:
    """Module-level names bound to a value made of literals alone (N = 20), which a count may
    hide behind."""
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None \
                and _is_fixed(node.value, names):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
    return names


def _is_fixed(expr: ast.AST, literal_names: set) -> bool:
    """Whether `expr` is a number whatever the profile: literals, arithmetic on them, or a name
    bound to such a value. A call or any other name (examples(20), TAICHI_EXAMPLES) scales."""
    if isinstance(expr, ast.Constant):
        return True
    if isinstance(expr, ast.Name):
        return expr.id in literal_names
    if isinstance(expr, ast.UnaryOp):
        return _is_fixed(expr.operand, literal_names)
    if isinstance(expr, ast.BinOp):
        return _is_fixed(expr.left, literal_names) and _is_fixed(expr.right, literal_names)
    if isinstance(expr, ast.IfExp):
        return _is_fixed(expr.body, literal_names) or _is_fixed(expr.orelse, literal_names)
    return False


def _registers_a_profile(call: ast.Call) -> bool:
    return isinstance(call.func, ast.Attribute) and call.func.attr == "register_profile"


def fixed_counts(source: str, filename: str) -> list:
    """'file:line: max_examples=...' for each count in `source` that ignores the profile."""
    tree = ast.parse(source, filename)
    literal_names = _literal_names(tree)
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or _registers_a_profile(node):
            continue
        for keyword in node.keywords:
            if keyword.arg == "max_examples" and _is_fixed(keyword.value, literal_names):
                found.append(f"{filename}:{node.lineno}: max_examples={ast.unparse(keyword.value)}")
    return found


def test_no_test_fixes_its_hypothesis_count():
    found = []
    for root, _, files in os.walk(HERE):
        for name in sorted(files):
            if name.endswith(".py"):
                path = os.path.join(root, name)
                with open(path, encoding="utf-8") as f:
                    found += fixed_counts(f.read(), os.path.relpath(path, os.path.dirname(HERE)))
    assert not found, ("hypothesis counts that ignore the profile (state the CI count as "
                       "examples(n) or TAICHI_EXAMPLES):\n  " + "\n  ".join(found))


@pytest.mark.parametrize("source", [
    "@settings(max_examples=20, deadline=None)\ndef test(): pass",
    "N = 20\n@settings(max_examples=N)\ndef test(): pass",
    "N = 2 * 10\n@settings(deadline=None, max_examples=N // 2)\ndef test(): pass",
    "@settings(max_examples=20 if FAST else 50)\ndef test(): pass",
    "def test():\n    check_op(cases(), max_examples=7)",
    "def test():\n    find(st.integers(), f, settings=settings(max_examples=5))",
])
def test_the_check_sees_a_fixed_count(source):
    assert fixed_counts(source, "t.py"), source


@pytest.mark.parametrize("source", [
    "@settings(max_examples=examples(20))\ndef test(): pass",
    "@settings(max_examples=TAICHI_EXAMPLES)\ndef test(): pass",
    "@settings(max_examples=max(TAICHI_EXAMPLES // 4, 3))\ndef test(): pass",
    "settings.register_profile('ci', max_examples=50)",
    "@settings(deadline=None)\ndef test(): pass",
])
def test_the_check_lets_a_scaled_count_pass(source):
    assert fixed_counts(source, "t.py") == [], source
