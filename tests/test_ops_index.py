"""ops/index.py, the name -> family map by which `import tflite_taichi` leaves the op families
unimported until a model names one of their ops (a fast import)."""
import json
import subprocess
import sys

from tflite_taichi.ops import base, load_all
from tflite_taichi.ops.index import OP_MODULES


def test_the_index_names_the_family_that_registers_each_builtin_op():
    load_all()
    registered = {name: owner.rsplit(".", 1)[1] for name, owner in base._OWNERS.items()
                  if owner and owner.startswith(base._PACKAGE + ".")}
    assert registered == OP_MODULES, (
        "ops/index.py is out of date; its OP_MODULES should read:\n"
        + "\n".join(f'    "{n}": "{registered[n]}",' for n in sorted(registered)))


def test_every_indexed_op_is_a_builtin():
    load_all()
    assert {name for name in OP_MODULES if base.builtin(name) is None} == set()


FRESH = """
import json, sys
import tflite_taichi
from tflite_taichi import Interpreter
before = sorted(m for m in sys.modules if m.startswith("tflite_taichi.ops."))
from tflite_taichi.ops import lookup
conv = lookup("CONV_2D")
after = sorted(m for m in sys.modules if m.startswith("tflite_taichi.ops."))
print(json.dumps({"before": before, "after": after, "conv": conv.name}))
"""


def test_import_leaves_the_op_families_for_first_use():
    """`import tflite_taichi` imports no op family (they were most of its time); looking an
    op up imports its family (and what that family imports), not the others."""
    out = subprocess.run([sys.executable, "-c", FRESH], capture_output=True, text=True,
                         timeout=120, check=True).stdout
    seen = json.loads(out.strip().splitlines()[-1])
    families = set(OP_MODULES.values())
    assert not families & {m.rsplit(".", 1)[1] for m in seen["before"]}, seen["before"]
    loaded = {m.rsplit(".", 1)[1] for m in seen["after"]} & families
    assert seen["conv"] == "CONV_2D" and "conv" in loaded and len(loaded) < len(families) // 2, loaded


USER_FIRST = """
import json
from tflite_taichi import OpDef, register_op
from tflite_taichi.ops import builtin, lookup
import numpy as np
mine = OpDef(name="RELU", infer=lambda node: [node.inputs[0]], reference=lambda node, x: [x])
try:
    register_op(mine)
    refused = False
except ValueError:
    refused = True
register_op(mine, replace=True)
print(json.dumps({"refused": refused, "mine": lookup("RELU") is mine,
                  "builtin_kept": builtin("RELU") is not mine and builtin("RELU") is not None}))
"""


def test_a_user_replacing_a_builtin_before_its_family_loads():
    """Registering a built-in name first imports its family: the user's op is refused without
    replace=True and replaces the built-in with it, exactly as when every family loaded at
    import; the built-in stays what a compile worker process would use."""
    out = subprocess.run([sys.executable, "-c", USER_FIRST], capture_output=True, text=True,
                         timeout=120, check=True).stdout
    assert json.loads(out.strip().splitlines()[-1]) == {
        "refused": True, "mine": True, "builtin_kept": True}
