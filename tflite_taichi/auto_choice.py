"""Where `auto` runs a model on a machine with a GPU: on the GPU backend it chose, or on LiteRT's
CPU kernels, whichever answers a step sooner, measured on this machine and remembered.

A GPU launch costs microseconds and a host round trip more; a small or sequential model (a
wake-word detector, an LSTM classifier, a text classifier) does its whole step on the CPU in less
than that, and an image model does not. No size threshold says which is which on every machine,
so `auto` measures: the GPU's first invokes, then a few LiteRT invokes of the same inputs and
state beside them; the faster side runs from then on (LiteRT as the whole model on its kernels,
Interpreter._become_litert), and the choice is kept in the kernel cache's record of the model
(runtime/cache.ModelCache.remember_choice), so the next process starts on it at once: a model
LiteRT runs faster never loads its GPU kernels at all.

Before anything is compiled, a model is `planned()` onto LiteRT from the start where the
delegate would take no op of its main graph at its declared shapes (auto's cost policy, costs.py,
leaves every op on the CPU: each is cheaper there than a GPU launch), or where LiteRT's whole step,
timed on a scratch interpreter, is under the least any GPU invoke of ours costs (`under_the_floor`:
a wake-word detector of 55 ops takes LiteRT 4-33 us). The second is the only choice a model with
state LiteRT cannot take over mid-stream (resource variables, CALL_ONCE) gets: its first invoke
starts that state on one side for good.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Optional

import numpy as np

# LiteRT's invokes timed beside the GPU's, after one left out (a LiteRT interpreter's first
# invoke packs its weights and starts its threads). The answers LiteRT gave while the kernels
# compiled are not counted: the compile beside them takes the cores LiteRT's threads need
# (16 threads on the H200 measured 10-100x their idle step).
LITERT_STEPS = 5
# the GPU's invokes timed; the first is left out (first dispatches create pipelines and upload
# constants: seconds on vulkan/opengl, not a step's cost)
GPU_STEPS = 5
# ... and until they add up to GPU_SECONDS (at most GPU_MAX_STEPS of them), the choice taken on
# the last GPU_STEPS - 1: a GPU that has idled runs its first milliseconds of work at its idle
# clock (the H200: 345 MHz, 1980 MHz after ~250 ms of work), and five steps of an image model
# measured there at 2-4x its steady step
GPU_SECONDS = 0.3
GPU_MAX_STEPS = 1000
# The least one invoke of ours on a GPU was measured to cost: a one-op model on cuda, the H200,
# 56-112 us (bench/results/runtime_h200.md, cpu_half_h200.md), every other backend and GPU more.
# A model LiteRT runs in less never gains from the GPU, whatever the GPU does with its ops.
GPU_FLOOR_MS = 0.05
# LiteRT is timed before anything compiles only where the main graph's estimated work
# (costs.work_us: numpy's arithmetic on one core) is below this: LiteRT's step was measured at
# 1/2-1/50 of that estimate on every model we have (2 and 16 threads), so above it LiteRT
# cannot come under GPU_FLOOR_MS, and an image model's start pays for no scratch interpreter.
TIMED_BELOW_WORK_US = 50 * 1e3 * GPU_FLOOR_MS


@dataclass(frozen=True)
class Choice:
    runs_on: str            # 'litert' or 'gpu'
    litert_ms: float        # LiteRT's median step (ms)
    gpu_ms: float           # the GPU's median step (ms)
    # 'measured' in this process, 'cached' from an earlier one, 'planned' from the schedule
    how: str = "measured"

    def describe(self) -> str:
        if self.how == "planned" and np.isfinite(self.litert_ms):
            return (f"LiteRT's CPU kernels (LiteRT's step, {self.litert_ms:.3g} ms, is under the "
                    f"least a GPU invoke costs, {self.gpu_ms:.3g} ms)")
        if self.how == "planned":
            return ("LiteRT's CPU kernels (the delegate would take no op of the main graph at "
                    "its declared shapes: each is cheaper on the CPU than a GPU launch, costs.py)")
        if not np.isfinite(self.litert_ms):
            return f"the GPU (LiteRT cannot run the model at these shapes; GPU {self.gpu_ms:.3g} ms a step)"
        faster = "LiteRT's CPU kernels" if self.runs_on == "litert" else "the GPU"
        return (f"{faster} ({self.how}: LiteRT {self.litert_ms:.3g} ms, GPU {self.gpu_ms:.3g} ms "
                "a step)")

    def as_record(self) -> dict:
        return {k: v for k, v in asdict(self).items() if k != "how"}


def planned() -> Choice:
    """LiteRT for a model the delegate would not take (nothing measured: no step times)."""
    return Choice("litert", float("nan"), float("nan"), how="planned")


def under_the_floor(step_ms: float) -> Optional[Choice]:
    """LiteRT, planned, where its step (ms) is under the GPU's floor; else None (measure)."""
    if step_ms < GPU_FLOOR_MS:
        return Choice("litert", step_ms, GPU_FLOOR_MS, how="planned")
    return None


def small_enough_to_time(schedule) -> bool:
    """Whether LiteRT is worth timing before anything compiles: the main graph's estimated
    work, every op of `schedule` (partition.Schedule), is below TIMED_BELOW_WORK_US."""
    from tflite_taichi.costs import work_us
    steps = [step for item in schedule.items for step in getattr(item, "steps", [item])]
    return work_us(steps) < TIMED_BELOW_WORK_US


def time_litert(model, steps: int = LITERT_STEPS) -> float:
    """The median step (ms) of `model` (a fresh litert_cpu.LiteRTModel whose kernels are
    checked), invoked on zeros of its main graph's inputs, its first invoke left out (it packs
    weights and starts threads). Zeros: only the step's cost is wanted, and every input takes
    them (ids, indices, lengths included)."""
    import time
    inputs, outputs = model.main_io()
    inputs = [(t, np.zeros(model.shape(t, 0), model.dtype(t, 0))) for t in inputs]
    model.run(0, inputs, outputs)
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        model.run(0, inputs, outputs)
        times.append(time.perf_counter() - start)
    return float(np.median(times)) * 1e3


def from_record(record) -> Optional[Choice]:
    """A Choice read back from the cache's record (untrusted JSON: None unless well-formed)."""
    if not isinstance(record, dict) or record.get("runs_on") not in ("litert", "gpu"):
        return None
    times = [record.get("litert_ms"), record.get("gpu_ms")]
    if not all(isinstance(t, (int, float)) and not isinstance(t, bool) and np.isfinite(t) and t >= 0
               for t in times):
        return None
    return Choice(record["runs_on"], float(times[0]), float(times[1]), how="cached")


class Chooser:
    """The step times of one subgraph's two sides, until there are enough to choose."""

    def __init__(self):
        self.litert = []            # seconds per invoke LiteRT answered
        self.gpu = []               # seconds per invoke the delegate answered
        self.choice: Optional[Choice] = None

    def add(self, answered_by: Optional[str], seconds: float) -> None:
        if self.choice is not None:
            return
        if answered_by == "litert":
            self.litert.append(seconds)
        elif answered_by == "delegate":
            self.gpu.append(seconds)

    def litert_missing(self) -> int:
        """LiteRT invokes still to time once the GPU's are in (0: none)."""
        return max(LITERT_STEPS - len(self.litert), 0)

    def gpu_timed(self) -> bool:
        return len(self.gpu) >= GPU_STEPS and (sum(self.gpu[1:]) >= GPU_SECONDS
                                               or len(self.gpu) >= GPU_MAX_STEPS)

    def decide(self) -> Choice:
        """The faster side by median step (a tie goes to the GPU, which leaves the CPU free)."""
        litert_ms = float(np.median(self.litert)) * 1e3
        gpu_ms = float(np.median(self.gpu[1:][-(GPU_STEPS - 1):])) * 1e3
        self.choice = Choice("litert" if litert_ms < gpu_ms else "gpu", litert_ms, gpu_ms)
        return self.choice
