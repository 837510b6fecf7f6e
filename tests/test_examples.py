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
    assert "delegated 3/3 ops" in result.stdout and "check_op: 20 Swish cases passed" in result.stdout


def test_check_op_holds_a_user_op_on_every_backend(taichi_workers):
    sys.path.insert(0, os.path.abspath(EXAMPLES))
    try:
        import custom_op
        from tflite_taichi.testing import Input, Output, check_op, one_op_model

        @st.composite
        def cases(draw):
            shape = tuple(draw(st.lists(st.integers(1, 5), min_size=1, max_size=4)))
            beta = float(np.float32(draw(st.floats(0.1, 4.0))))
            model = one_op_model(custom_op.OP_NAME, [Input(shape)], [Output(shape)],
                                 custom_options=struct.pack("<f", beta))
            return model, [np.random.default_rng(draw(st.integers(0, 99))).normal(0, 3, shape).astype(np.float32)]

        check_op(cases(), workers=taichi_workers, plugins=["custom_op"], max_examples=10)
    finally:
        sys.path.remove(os.path.abspath(EXAMPLES))
