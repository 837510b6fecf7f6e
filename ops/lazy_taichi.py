"""`ti` for the ops' Taichi parts, imported only when something is compiled.

`import taichi` and its decorators cost about 0.25 s at import (0.09 s the package, the rest
`@ti.func`'s stack inspection, 114 of them), and a warm start (kernels loaded from the cache
through the C API) or `backend='reference'` compiles nothing. So the ops see this stand-in:

- `@ti.func` and `@ti.data_oriented` record what they decorate and return stand-ins; `ti.template()`
  in an annotation is a marker;
- `realize()` (called by everything that compiles: codegen.build_kernels, Taichi's Python runtime's
  start) imports Taichi and applies the real decorators: every recorded class gets
  `taichi.data_oriented`, every method is replaced by a real Taichi function, every marker by
  `taichi.template()`; free functions keep their stand-in, which forwards to the real one (other
  modules imported it by name);
- any other attribute (`ti.static`, `ti.cast`, `ti.Vector`, ...) is Taichi's own, imported on
  first use: inside a kernel being compiled, Taichi resolves `ti.x` through this object and gets
  exactly its own objects back;
- after `realize()`, the decorators are Taichi's at once.

A method's Taichi function is built as `taichi.func` builds it (`Func(fn, _classfunc=True)` and the
same wrapper), because `taichi.func` detects methods by inspecting its caller's frame, which a
deferred call no longer has; the class-body test here is `__qualname__` in the caller's locals.
"""
import functools
import sys
import threading
import types

_lock = threading.RLock()
_taichi = None                  # the real module, once realized
_classes = []                   # @ti.data_oriented classes waiting for realize()
_funcs = []                     # @ti.func stand-ins waiting for realize()


class _Template:
    """ti.template() before Taichi is imported: replaced in annotations by realize()."""

    def __repr__(self):
        return "ti.template()"


def _make_func(fn, classfunc: bool):
    """What taichi.func(fn) returns, with the method flag given rather than guessed."""
    from taichi.lang.kernel_impl import Func
    fun = Func(fn, _classfunc=classfunc, is_real_function=False)

    @functools.wraps(fn)
    def decorated(*args, **kwargs):
        return fun.__call__(*args, **kwargs)
    decorated._is_taichi_function = True
    decorated._is_real_function = False
    decorated.func = fun
    return decorated


def _fix_annotations(fn) -> None:
    annotations = getattr(fn, "__annotations__", None) or {}
    for name, value in list(annotations.items()):
        if isinstance(value, _Template):
            annotations[name] = _taichi.template()


class _DeferredFunc:
    """@ti.func before Taichi is imported."""

    _is_taichi_function = True
    _is_real_function = False

    def __init__(self, fn, classfunc: bool):
        functools.update_wrapper(self, fn)
        self._fn, self._classfunc, self._real = fn, classfunc, None
        self._owner = self._name = None

    def __set_name__(self, owner, name):
        self._owner, self._name = owner, name

    def _realize(self):
        if self._real is None:
            with _lock:
                if self._real is None:
                    realize()
                    _fix_annotations(self._fn)
                    self._real = _make_func(self._fn, self._classfunc)
                    if self._owner is not None:
                        setattr(self._owner, self._name, self._real)
        return self._real

    def __get__(self, instance, owner=None):
        if instance is None:
            return self
        return types.MethodType(self._realize(), instance)

    def __call__(self, *args, **kwargs):
        return self._realize()(*args, **kwargs)

    @property
    def func(self):                 # Taichi reads `.func.has_print` after a call
        return self._realize().func


def _in_class_body(frame) -> bool:
    return frame is not None and "__qualname__" in frame.f_locals and frame.f_code.co_name != "<module>"


def realize():
    """Import Taichi and apply every decorator recorded so far (idempotent, thread-safe)."""
    global _taichi
    with _lock:
        if _taichi is None:
            import os
            os.environ.setdefault("ENABLE_TAICHI_HEADER_PRINT", "False")
            import taichi
            from . import taichi_frontend
            taichi_frontend.apply()         # source positions built only for errors (its docstring)
            _taichi = taichi
        while _classes:
            _taichi.data_oriented(_classes.pop(0))
        while _funcs:
            _funcs.pop(0)._realize()
        return _taichi


class LazyTaichi:
    """The `ti` the ops use (see the module docstring)."""

    def func(self, fn):
        classfunc = _in_class_body(sys._getframe(1))
        with _lock:
            if _taichi is not None:
                _fix_annotations(fn)
                return _make_func(fn, classfunc)
            deferred = _DeferredFunc(fn, classfunc)
            _funcs.append(deferred)
            return deferred

    def data_oriented(self, cls):
        with _lock:
            if _taichi is not None:
                return _taichi.data_oriented(cls)
            _classes.append(cls)
            return cls

    def template(self):
        return _taichi.template() if _taichi is not None else _Template()

    def __getattr__(self, name):
        return getattr(realize(), name)

    @staticmethod
    def imported() -> bool:
        return _taichi is not None
