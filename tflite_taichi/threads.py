"""One thread budget for the CPU work of an invoke.

Two thread pools do our CPU work: numpy's BLAS (OpenBLAS, MKL, ... under the numpy path's
matrix products) and, on the `cpu` backend, Taichi's own pool. OpenBLAS's workers spin for a
while after each call, waiting for the next one; when Taichi's pool runs next, or another job
shares the machine, the spinning threads take the cores the work needs (measured on the 2-core
machine with one busy process beside it, `auto`: iris 31.5 -> 18.4 ms per step, face detection
29.4 -> 14.6, with BLAS held to one thread; bench/results/cpu_taichi_2core.md).

So an invoke runs numpy's BLAS with the interpreter's budget, `num_threads` as LiteRT means it
(the most threads a CPU op may use; None or -1: the runtime's choice, here every core this
process may run on), and with a single thread where Taichi's CPU pool runs in the same invoke.
The BLAS setting is the process's: it is restored when the invoke returns, so nothing outside
our calls changes. threadpoolctl finds and drives the BLAS library numpy loaded; without one
it knows, the numpy path runs as it would anyway.
"""
import contextlib
import os
import threading
from typing import Optional

_lock = threading.Lock()
_blas = None            # threadpoolctl's controllers of the BLAS libraries loaded (found once)


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity, e.g. a container's or taskset's
    limit), not the machine's count."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):            # macOS, Windows: no affinity call
        return max(1, os.cpu_count() or 1)


def resolve(num_threads: Optional[int]) -> int:
    """The thread budget an Interpreter's `num_threads` means: n >= 1 as given, None or -1 the
    usable cores (LiteRT: -1 lets the runtime choose), 0 one thread."""
    if num_threads is None or num_threads < 0:
        return usable_cores()
    return max(1, num_threads)


def _blas_controllers() -> list:
    global _blas
    with _lock:
        if _blas is None:
            try:
                from threadpoolctl import ThreadpoolController
                _blas = ThreadpoolController().select(user_api="blas").lib_controllers
            except Exception:                    # no threadpoolctl or nothing it can drive
                _blas = []
        return _blas


@contextlib.contextmanager
def blas_limited(threads: Optional[int]):
    """numpy's BLAS runs at most `threads` threads inside the block (None: as it is); the
    previous setting comes back after it. Costs a library call per BLAS library, ~1 us, and two
    more only where the setting has to change."""
    if threads is None:
        yield
        return
    changed = []
    for lib in _blas_controllers():
        before = lib.get_num_threads()
        if before is not None and before != threads:
            lib.set_num_threads(threads)
            changed.append((lib, before))
    try:
        yield
    finally:
        for lib, before in changed:
            lib.set_num_threads(before)
