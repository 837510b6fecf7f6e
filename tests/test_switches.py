"""The environment switches (tflite_taichi/switches.py): one table, one reader, the cache key
derived from it, bad values refused with the variable's name, the docs generated from it."""
import ast
import os
import re

import pytest

from tflite_taichi import switches
from tflite_taichi.errors import InputError
from tflite_taichi.runtime import cache

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE_FOLDERS = ("tflite_taichi", "ops", "quant")
SOURCE_FOLDERS = PACKAGE_FOLDERS + ("tests", "bench")

# A valid value other than the default for every switch that changes kernels: a new kernel
# switch fails test_every_kernel_switch_is_in_the_cache_key until it has one here.
KERNEL_EXAMPLES = {
    "TFLITE_TAICHI_FUSION": "none",
    "TFLITE_TAICHI_CHUNK_STEPS": "1",
    "TFLITE_TAICHI_IO_CODES": "0",
    "TFLITE_TAICHI_SPIRV_CAPS_OFF": "spirv_has_int64",
    "TFLITE_TAICHI_NO_SHARED_TILES": "1",
    "TFLITE_TAICHI_GEMM_TILES": "32,32,2,2",
    "TFLITE_TAICHI_GEMM_MIN_BLOCKS": "8",
    "TFLITE_TAICHI_POINTWISE_SPLIT": "0",
}


def _python_files(folders=SOURCE_FOLDERS):
    for folder in folders:
        for top, _, names in os.walk(os.path.join(ROOT, folder)):
            for name in names:
                if name.endswith(".py"):
                    yield os.path.join(top, name)


def _environment_reads(path: str) -> list:
    """'file:line' of each read of a TFLITE_TAICHI_* variable from the environment:
    os.environ.get("TFLITE_TAICHI_..."), os.getenv(...), os.environ["TFLITE_TAICHI_..."] (loads)."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read())

    def named(node) -> bool:
        return isinstance(node, ast.Constant) and isinstance(node.value, str) \
            and node.value.startswith(switches.PREFIX)

    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr in ("get", "getenv") and node.args \
                and named(node.args[0]) and "environ" in ast.unparse(node.func.value) + node.func.attr:
            found.append(f"{os.path.relpath(path, ROOT)}:{node.lineno}")
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load) and named(node.slice) \
                and "environ" in ast.unparse(node.value):
            found.append(f"{os.path.relpath(path, ROOT)}:{node.lineno}")
    return found


def test_only_the_switches_module_reads_them():
    """In the package (tests and bench/ set variables for the processes they start, and save
    and restore them: not reads of a switch)."""
    reads = [r for p in _python_files(PACKAGE_FOLDERS) if not p.endswith(os.path.join("tflite_taichi", "switches.py"))
             for r in _environment_reads(p)]
    assert reads == [], "read through tflite_taichi.switches.value instead: " + ", ".join(reads)


def test_the_scan_finds_a_read(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text('import os\nx = os.environ.get("TFLITE_TAICHI_FUSION", "all")\n'
                     'y = os.environ["TFLITE_TAICHI_CHUNK_STEPS"]\nos.environ["TFLITE_TAICHI_X"] = "1"\n')
    assert [r.rsplit(":", 1)[1] for r in _environment_reads(str(probe))] == ["2", "3"]


def test_every_variable_named_anywhere_is_in_the_table():
    names = set()
    for path in list(_python_files()) + [os.path.join(ROOT, "README.md")] + [
            os.path.join(ROOT, "docs", n) for n in os.listdir(os.path.join(ROOT, "docs")) if n.endswith(".md")]:
        with open(path, encoding="utf-8") as f:
            names |= set(re.findall(r"\bTFLITE_TAICHI_[A-Z0-9_]*[A-Z0-9]\b", f.read()))
    unknown = sorted(names - set(switches.SWITCHES) - {"TFLITE_TAICHI_X", "TFLITE_TAICHI_FUSOIN"})
    assert unknown == [], f"named but not in tflite_taichi/switches.py: {unknown}"


def test_every_kernel_switch_is_in_the_cache_key(monkeypatch):
    kernel_switches = {name for name, s in switches.SWITCHES.items() if s.kernels}
    assert kernel_switches == set(KERNEL_EXAMPLES), "give each kernel switch an example value here"
    for name in switches.SWITCHES:
        monkeypatch.delenv(name, raising=False)
    plain = cache.versions()
    for name, example in KERNEL_EXAMPLES.items():
        monkeypatch.setenv(name, example)
        switches.value(name)                        # the example parses
        assert cache.versions() != plain and cache.versions()["switches"] == {name: example}, name
        monkeypatch.delenv(name)
    for name, s in switches.SWITCHES.items():       # the others leave the key as it is
        if not s.kernels and name != "TFLITE_TAICHI_TAICHI":   # (which Taichi: its version is)
            monkeypatch.setenv(name, "0")
    assert cache.versions() == plain


@pytest.mark.parametrize("name, text, words", [
    ("TFLITE_TAICHI_CACHE_MAX_MB", "lots", "not a number"),
    ("TFLITE_TAICHI_GEMM_TILES", "32,32,3,2", "tile sizes must be multiples of the micro tile"),
    ("TFLITE_TAICHI_GEMM_TILES", "32,32", "four positive numbers"),
    ("TFLITE_TAICHI_CHUNK_STEPS", "0", "a number of 1 or more"),
    ("TFLITE_TAICHI_FUSION", "some", "choose 'all' or 'store' or 'none'"),
    ("TFLITE_TAICHI_COMPILE_WORKERS", "-1", "a number of 0 or more"),
])
def test_a_bad_value_is_refused_with_the_variables_name(monkeypatch, name, text, words):
    monkeypatch.setenv(name, text)
    with pytest.raises(InputError, match=re.escape(f"{name}={text!r}: {words}")):
        switches.value(name)


def test_values_are_typed_and_empty_is_the_default(monkeypatch):
    monkeypatch.setenv("TFLITE_TAICHI_GEMM_TILES", " 32,32,2,2 ")
    assert switches.value("TFLITE_TAICHI_GEMM_TILES") == (32, 32, 2, 2)
    monkeypatch.setenv("TFLITE_TAICHI_IO_CODES", "0")
    assert switches.value("TFLITE_TAICHI_IO_CODES") is False
    monkeypatch.setenv("TFLITE_TAICHI_FUSION", "")
    assert switches.value("TFLITE_TAICHI_FUSION") == "all"
    monkeypatch.setenv("TFLITE_TAICHI_TEST_BACKENDS", "")         # empty here means none
    assert switches.value("TFLITE_TAICHI_TEST_BACKENDS") == ()
    monkeypatch.setenv("TFLITE_TAICHI_TEST_BACKENDS", "vulkan,cpu,vulkan")
    assert switches.value("TFLITE_TAICHI_TEST_BACKENDS") == ("vulkan", "cpu")
    monkeypatch.setenv("TFLITE_TAICHI_FUSOIN", "none")
    assert "TFLITE_TAICHI_FUSOIN" in switches.unknown()


def test_a_child_takes_the_callers_switches_exactly(monkeypatch):
    monkeypatch.setenv("TFLITE_TAICHI_FUSION", "none")
    given = switches.inherited()
    monkeypatch.setenv("TFLITE_TAICHI_CHUNK_STEPS", "3")        # set here, not in the caller
    switches.apply(given)
    assert os.environ.get("TFLITE_TAICHI_CHUNK_STEPS") is None
    assert switches.value("TFLITE_TAICHI_FUSION") == "none"


def test_the_docs_are_the_table():
    with open(os.path.join(ROOT, "docs", "switches.md"), encoding="utf-8") as f:
        assert switches.table() in f.read(), "docs/switches.md: paste switches.table() again"


def test_overriding_sets_switches_for_a_block_and_puts_them_back(monkeypatch):
    monkeypatch.setenv("TFLITE_TAICHI_CHUNK_STEPS", "7")
    monkeypatch.delenv("TFLITE_TAICHI_GEMM_TILES", raising=False)
    with switches.overriding({"TFLITE_TAICHI_CHUNK_STEPS": "1", "TFLITE_TAICHI_GEMM_TILES": "32,32,2,2"}):
        assert switches.value("TFLITE_TAICHI_CHUNK_STEPS") == 1
        assert switches.value("TFLITE_TAICHI_GEMM_TILES") == (32, 32, 2, 2)
    assert switches.value("TFLITE_TAICHI_CHUNK_STEPS") == 7
    assert switches.raw("TFLITE_TAICHI_GEMM_TILES") is None
    typo = switches.PREFIX + "CHUNK_STEP"          # (spelled apart: the table's test reads names)
    with pytest.raises(KeyError, match=typo):
        with switches.overriding({typo: "1"}):
            pass
