"""Taichi 1.7.4's Python frontend, made cheaper where its work is for error messages only.

Measured (face_detection_short_range cold on vulkan, this 2-core machine, cProfile): of 10.6 s
in `ti.aot.Module.add_kernel`, 4.0 s went to `ASTTransformerContext.get_pos_info` (a source
position with a caret line, wrapped by `textwrap.TextWrapper`, built for every AST node and
read only if an error is reported) and 3.2 s to `_get_tree_and_ctx` (the source of every
`ti.func` found with `inspect.getsourcelines` and refilled line by line with `textwrap.fill`,
again at each of its 1,808 calls). The H200 profile saw the same 3.5-6.2 s per model.

`apply()` changes two things, only on the Taichi version it was written against (1.7.4: any
other version is left alone, and `apply()` says so by returning False):
- a node's position is `File "...", line N, in f:` plus its source line while nothing is
  wrong; while an exception is being handled (Taichi's Builder reports a failed node from its
  `except` block) the position is built in full, caret and all, by Taichi's own function;
- the source lookups of a function are remembered per function object (the source of a
  function object does not change while it lives), and the per-line refill per line of text.
The kernels compiled are the same: the AST Taichi parses is built from the same text.
`TFLITE_TAICHI_FRONTEND_PATCH=0` leaves Taichi alone (a benchmark switch: before and after in
one run)."""
from __future__ import annotations

import functools
import sys
import threading
import weakref

PATCHED_VERSION = (1, 7, 4)

_lock = threading.Lock()
_applied = False


def _short_position(original):
    def get_pos_info(self, node):
        if sys.exc_info()[1] is not None:       # an error is being reported: the full text
            return original(self, node)
        line = node.lineno + self.lineno_offset
        code = self.src[node.lineno - 1] if 0 < node.lineno <= len(self.src) else ""
        return f'File "{self.file}", line {line}, in {self.func.func.__name__}:\n{code}\n'
    get_pos_info.__wrapped__ = original
    return get_pos_info


def _remembered_per_function(lookup):
    """`lookup(fn)` remembered while `fn` lives (keys are weak: a function that is collected
    takes its entry with it)."""
    known = weakref.WeakKeyDictionary()

    @functools.wraps(lookup)
    def remembered(fn):
        try:
            found = known.get(fn)
        except TypeError:               # not weakly referenceable: not remembered
            return lookup(fn)
        if found is None:
            found = known[fn] = lookup(fn)
        return found
    return remembered


class _RefillingTextwrap:
    """What `taichi.lang.kernel_impl` uses of `textwrap` (fill, dedent), remembered per text."""

    def __init__(self, textwrap):
        self._textwrap = textwrap
        self.fill = functools.lru_cache(maxsize=65536)(textwrap.fill)
        self.dedent = functools.lru_cache(maxsize=4096)(textwrap.dedent)

    def __getattr__(self, name):
        return getattr(self._textwrap, name)


def _source_lines(getsourcelines):
    remembered = _remembered_per_function(lambda fn: tuple(getsourcelines(fn)))

    def lines(fn):
        src, start = remembered(fn)
        return list(src), start        # a fresh list: the caller may change its own
    return lines


def apply() -> bool:
    """Patch Taichi's frontend (idempotent, thread-safe). True when it is patched, False when
    this Taichi is not the version the patch was written for (then nothing is touched)."""
    global _applied
    import os

    import taichi
    if (tuple(taichi.__version__) != PATCHED_VERSION
            or os.environ.get("TFLITE_TAICHI_FRONTEND_PATCH", "1").strip() == "0"):
        return False
    with _lock:
        if _applied:
            return True
        import textwrap
        from taichi.lang import kernel_impl
        from taichi.lang.ast import ast_transformer_utils as utils
        context = utils.ASTTransformerContext
        context.get_pos_info = _short_position(context.get_pos_info)
        kernel_impl.getsourcefile = _remembered_per_function(kernel_impl.getsourcefile)
        kernel_impl.getsourcelines = _source_lines(kernel_impl.getsourcelines)
        kernel_impl.textwrap = _RefillingTextwrap(textwrap)
        _applied = True
        return True


def applied() -> bool:
    return _applied
