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
one run).

`top_level_loops(threads)` is the one change to what is compiled: Taichi's
CPU backends give every top-level loop the thread count of the machine that compiles it
(`std::thread::hardware_concurrency()`, baked into the AOT module) unless the loop says
otherwise with `ti.loop_config(parallelize=n)`. While the block is active, every top-level loop
of the kernels compiled gets `parallelize=threads`, and `threads=1` makes it a serial task that
runs in the calling thread, with no dispatch to Taichi's thread pool (what `ti.loop_config(
serialize=True)` does). codegen.PartitionCode.cpu_threads says which, and enters the cache key."""
from __future__ import annotations

import contextlib
import functools
import sys
import threading
import weakref

from tflite_taichi import switches

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


_loops = threading.local()       # .threads: the count for top-level loops; .depth: loops open


@contextlib.contextmanager
def top_level_loops(threads: int):
    """Kernels compiled in this block (this thread) run each top-level loop on `threads` CPU
    threads (1: serially, in the caller's thread); 0 leaves Taichi's default."""
    _hook_loops()
    before = getattr(_loops, "threads", 0), getattr(_loops, "depth", 0)
    _loops.threads, _loops.depth = threads, 0
    try:
        yield
    finally:
        _loops.threads, _loops.depth = before


def _with_loop_threads(build_for, transformer, impl):
    def build_For(ctx, node):
        threads = getattr(_loops, "threads", 0)
        if not threads or transformer.get_decorator(ctx, node.iter) == "static":
            return build_for(ctx, node)         # a static loop unrolls: what it holds is at its level
        if _loops.depth == 0:                   # a ti.func's loops are traced inside its caller's
            builder = impl.get_runtime().compiling_callable.ast_builder()
            builder.parallelize(threads)
            if threads == 1:
                builder.strictly_serialize()
        _loops.depth += 1
        try:
            return build_for(ctx, node)
        finally:
            _loops.depth -= 1
    build_For.__wrapped__ = build_for
    return build_For


def _hook_loops() -> None:
    """Wrap Taichi's `ASTTransformer.build_For` once per process (any Taichi version with that
    builder API: parallelize and strictly_serialize are `ti.loop_config`'s own calls)."""
    global _loops_hooked
    with _lock:
        if _loops_hooked:
            return
        from taichi.lang import impl
        from taichi.lang.ast.ast_transformer import ASTTransformer
        ASTTransformer.build_For = staticmethod(
            _with_loop_threads(ASTTransformer.build_For, ASTTransformer, impl))
        _loops_hooked = True


_loops_hooked = False


def apply() -> bool:
    """Patch Taichi's frontend (idempotent, thread-safe). True when it is patched, False when
    this Taichi is not the version the patch was written for (then nothing is touched)."""
    global _applied

    import taichi
    if (tuple(taichi.__version__) != PATCHED_VERSION
            or not switches.value("TFLITE_TAICHI_FRONTEND_PATCH")):
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
