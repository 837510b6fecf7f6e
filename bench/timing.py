"""A user's step, timed the one way every harness here times it: set every input, invoke, get
every output; the median and the p10-p90 spread, in milliseconds.

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))   # a script in bench/ has it
    from timing import step_of, timed, spread_ms, describe

A harness that interleaves several runtimes (so that none always runs right after another) keeps
its own round-robin and times each call with `timed(call, 1)`; the figures still come from
`spread_ms`, so every table in bench/results/ means the same by "median" and "p10-p90".
"""
import time
from typing import Callable, Dict, Iterable, List, Sequence, Tuple

import numpy as np


def step_of(it, feeds: Iterable[Tuple[int, np.ndarray]], outputs: Sequence[int] = None) -> Callable[[], list]:
    """A user's step on a tf.lite-style interpreter: set each (index, array) of `feeds`, invoke,
    get each output (every output of the model unless `outputs` names the indices)."""
    feeds = list(feeds)
    outputs = [d["index"] for d in it.get_output_details()] if outputs is None else list(outputs)

    def step() -> list:
        for index, x in feeds:
            it.set_tensor(index, x)
        it.invoke()
        return [it.get_tensor(i) for i in outputs]
    return step


def timed(call: Callable[[], object], runs: int, warmup: int = 0) -> List[float]:
    """Seconds of each of `runs` calls, after `warmup` untimed ones."""
    for _ in range(warmup):
        call()
    seconds = []
    for _ in range(runs):
        start = time.perf_counter()
        call()
        seconds.append(time.perf_counter() - start)
    return seconds


def spread_ms(seconds: Sequence[float]) -> Dict[str, float]:
    """The median, 10th and 90th percentiles of `seconds`, in milliseconds."""
    ms = np.asarray(seconds, dtype=np.float64) * 1e3
    p10, median, p90 = np.percentile(ms, [10, 50, 90])
    return {"median_ms": float(median), "p10_ms": float(p10), "p90_ms": float(p90)}


def describe(seconds: Sequence[float]) -> str:
    """'median 1.234 ms (p10 1.200, p90 1.300)': one line for a log."""
    s = spread_ms(seconds)
    return f"median {s['median_ms']:.3f} ms (p10 {s['p10_ms']:.3f}, p90 {s['p90_ms']:.3f})"
