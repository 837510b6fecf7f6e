"""The patch of Taichi 1.7.4's frontend (ops/taichi_frontend.py): positions
in full where an error is reported, source lookups remembered, and nothing touched on another
Taichi version or with the switch off. Each case runs in a fresh process: Taichi's frontend is
one per process and the patch is applied once."""
import os
import subprocess
import sys
import tempfile
import textwrap

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_python(code: str, **env) -> str:
    """`code` run as a script file (Taichi reads its kernels' source from their file)."""
    with tempfile.TemporaryDirectory() as folder:
        script = os.path.join(folder, "case.py")
        with open(script, "w") as f:
            f.write(textwrap.dedent(code))
        return _run(script, env).replace(folder, "FOLDER")   # the same text from any folder


def _run(script: str, env: dict) -> str:
    proc = subprocess.run([sys.executable, script], capture_output=True,
                          text=True, timeout=300, cwd=REPO,
                          env={**os.environ, "ENABLE_TAICHI_HEADER_PRINT": "False", **env})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


BROKEN_KERNEL = """
    import warnings
    from tflite_taichi.ops.lazy_taichi import realize
    from tflite_taichi.ops import taichi_frontend
    ti = realize()
    print("applied", taichi_frontend.applied())
    ti.init(arch=ti.cpu, offline_cache=False, log_level=ti.ERROR)

    @ti.func
    def helper(x):
        return x + not_defined_anywhere

    @ti.kernel
    def broken(a: ti.types.ndarray(dtype=ti.f32, ndim=1)):
        for i in a:
            a[i] = helper(a[i])

    @ti.kernel
    def fine(a: ti.types.ndarray(dtype=ti.f32, ndim=1)):
        for i in a:
            a[i] = a[i] * 2.0 + 1.0

    import numpy as np
    a = np.arange(4, dtype=np.float32)
    fine(a)
    print("fine", a.tolist())
    try:
        broken(a)
    except Exception as e:
        print("ERROR-BEGIN")
        print(e)
        print("ERROR-END")
"""


def _error_text(out: str) -> str:
    return out.split("ERROR-BEGIN", 1)[1].split("ERROR-END", 1)[0]


def test_a_compile_error_still_shows_its_full_position():
    """The patch drops caret lines only while nothing is wrong: an undefined name inside a
    ti.func is reported with its file, line and the caret under the expression, as unpatched."""
    patched = run_python(BROKEN_KERNEL)
    assert "applied True" in patched
    assert "fine [1.0, 3.0, 5.0, 7.0]" in patched
    message = _error_text(patched)
    assert "not_defined_anywhere" in message
    assert "line" in message and "helper" in message
    assert "^^^^" in message                # the caret under the failing expression
    unpatched = run_python(BROKEN_KERNEL, TFLITE_TAICHI_FRONTEND_PATCH="0")
    assert "applied False" in unpatched
    assert "fine [1.0, 3.0, 5.0, 7.0]" in unpatched
    assert _error_text(unpatched) == message


def test_the_patch_replaces_what_it_says_and_is_idempotent():
    out = run_python("""
        import taichi
        from taichi.lang import kernel_impl
        from taichi.lang.ast import ast_transformer_utils as utils
        original = utils.ASTTransformerContext.get_pos_info
        from tflite_taichi.ops import taichi_frontend
        print(taichi_frontend.apply(), taichi_frontend.apply())
        patched = utils.ASTTransformerContext.get_pos_info
        print(patched is not original, patched.__wrapped__ is original)
        print(kernel_impl.textwrap.fill("a\\tb", tabsize=4, width=9999))
    """)
    assert out.splitlines() == ["True True", "True True", "a   b"]


def test_another_taichi_version_is_left_alone():
    """The patch knows Taichi 1.7.4's internals only: on any other version it steps aside."""
    out = run_python("""
        import taichi
        taichi.__version__ = (1, 7, 5)
        from taichi.lang import kernel_impl
        from taichi.lang.ast import ast_transformer_utils as utils
        before = (utils.ASTTransformerContext.get_pos_info, kernel_impl.getsourcelines,
                  kernel_impl.textwrap)
        from tflite_taichi.ops import taichi_frontend
        print(taichi_frontend.apply(), taichi_frontend.applied())
        after = (utils.ASTTransformerContext.get_pos_info, kernel_impl.getsourcelines,
                 kernel_impl.textwrap)
        print(all(a is b for a, b in zip(before, after)))
    """)
    assert out.splitlines() == ["False False", "True"]
