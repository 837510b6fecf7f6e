"""Constant integer tables compiled into kernels (GATHER's indices, a TRANSPOSE's or a
SCATTER's index maps): a table as the fewest arithmetic runs, walked statically in the kernel,
and the limit beyond which an op refuses it. Shared by the indexing, layout and scatter families.
(No `from __future__ import annotations` here: Taichi reads the ti.func annotations.)"""
import numpy as np

from .kit import ti

MAX_RUNS = 64


def arithmetic_runs(values, limit: int = MAX_RUNS):
    """A 1-D integer sequence as maximal arithmetic runs ((start, base, step), ...), greedily
    from the front (value at j of the run starting at s: base + (j - s) * step); None when it
    takes more than `limit` runs."""
    v = np.asarray(values, dtype=np.int64).reshape(-1)
    n = v.size
    if n == 0:
        return ((0, 0, 0),)
    d = np.diff(v)
    runs, j = [], 0
    while j < n:
        if len(runs) == limit:
            return None
        if j == n - 1:
            runs.append((j, int(v[j]), 0))
            break
        step = int(d[j])
        other = np.flatnonzero(d[j:] != step)
        end = j + int(other[0]) if other.size else n - 1     # last element of this run
        runs.append((j, int(v[j]), step))
        j = end + 1
    return tuple(runs)


@ti.data_oriented
class RunTable:
    """A constant integer table compiled into the kernel: `at(j)` walks the runs (static)."""

    def __init__(self, runs):
        self.starts = tuple(int(r[0]) for r in runs)
        self.bases = tuple(int(r[1]) for r in runs)
        self.steps = tuple(int(r[2]) for r in runs)
        self.n = len(runs)

    @ti.func
    def at(self, j):
        v = self.bases[0] + j * self.steps[0]
        for r in ti.static(range(1, self.n)):
            if j >= self.starts[r]:
                v = self.bases[r] + (j - self.starts[r]) * self.steps[r]
        return v


def runs_reason(values, what: str):
    """Why the delegate refuses a constant table of `values` (None: it takes it)."""
    if arithmetic_runs(values) is None:
        return (f"the constant {what} form more than {MAX_RUNS} arithmetic runs (the delegate "
                "compiles index tables into the kernel)")
    return None
