"""The worked extension example: a user's custom op, registered, run, and property-tested."""
import os
import struct
import subprocess
import sys

import numpy as np
from hypothesis import strategies as st

EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "examples")


def test_custom_op_example_runs_on_the_delegate_and_matches_reference(tmp_path):
    result = subprocess.run([sys.executable, os.path.join(EXAMPLES, "custom_op.py"), "--backend", "cpu",
                             "--check"], capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "delegated 3/3 ops" in result.stdout and "check_op: 10 Swish cases passed on cpu" in result.stdout
    # it declares fusion (stores_once, epilogue_inputs): the Swish (#1) runs in the conv's store
    assert "cpu       delegated 3/3 ops, partitions [[0, 1, 2]], fused (producer, op) [[0, 1]]" in result.stdout


def test_custom_op_example_uses_only_public_names():
    """What a user copies from: tflite_taichi's own names and the public op kit, nothing
    private (no module or name starting with an underscore), and no replace=True."""
    import ast
    tree = ast.parse(open(os.path.join(EXAMPLES, "custom_op.py")).read())
    imported = [(n.module, a.name) for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
                for a in n.names if n.module and n.module.startswith("tflite_taichi")]
    assert imported and all(not part.startswith("_") for m, name in imported
                            for part in m.split(".") + [name]), imported
    from tflite_taichi.ops import kit
    assert ("tflite_taichi.ops.kit", "ti") in imported and "ti" in kit.__all__
    assert "replace=True" not in open(os.path.join(EXAMPLES, "custom_op.py")).read()


def test_check_op_holds_a_user_op_on_every_backend(taichi_workers):
    sys.path.insert(0, os.path.abspath(EXAMPLES))
    try:
        import custom_op
        from tflite_taichi.testing import Input, Output, check_op, examples, one_op_model

        @st.composite
        def cases(draw):
            shape = tuple(draw(st.lists(st.integers(1, 5), min_size=1, max_size=4)))
            beta = float(np.float32(draw(st.floats(0.1, 4.0))))
            model = one_op_model(custom_op.OP_NAME, [Input(shape)], [Output(shape)],
                                 custom_options=struct.pack("<f", beta))
            return model, [np.random.default_rng(draw(st.integers(0, 99))).normal(0, 3, shape).astype(np.float32)]

        check_op(cases(), workers=taichi_workers, plugins=["custom_op"], max_examples=examples(10))
    finally:
        sys.path.remove(os.path.abspath(EXAMPLES))


def test_register_op_takes_a_module_imported_twice_and_refuses_a_clash(tmp_path):
    """The example runs as a script and is imported by name (two module objects, one source):
    the same definition registers again without replace=True; another op under a taken name is
    refused unless replaced; infer(node, runtime) is declared, and only for stateful ops."""
    import importlib.util
    import pytest
    from tflite_taichi import OpDef, State, register_op
    from tflite_taichi.ops.base import REGISTRY
    path = os.path.join(EXAMPLES, "custom_op.py")
    for name in ("custom_op_first", "custom_op_second"):
        spec = importlib.util.spec_from_file_location(name, path)
        spec.loader.exec_module(importlib.util.module_from_spec(spec))
    swish = REGISTRY["CUSTOM:Swish"]
    other = OpDef(name="CUSTOM:Swish", infer=lambda node: [node.inputs[0].shape],
                  reference=lambda node, inputs: [inputs[0]])
    with pytest.raises(ValueError, match="already registered .pass replace=True"):
        register_op(other)
    assert REGISTRY["CUSTOM:Swish"] is swish
    with pytest.raises(ValueError, match="infer_takes_runtime is for stateful ops"):
        register_op(OpDef(name="CUSTOM:NeedsRuntime", infer=lambda node, runtime: [],
                          reference=lambda node, inputs: [],
                          state=State(infer_takes_runtime=True)))
    assert "CUSTOM:NeedsRuntime" not in REGISTRY
