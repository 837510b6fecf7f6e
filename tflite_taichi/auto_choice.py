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

Before anything is measured, a model whose main graph the delegate would not take at all at its
declared shapes (auto's cost policy, costs.py, leaves every op on the CPU: each is cheaper there
than a GPU launch) is `planned()` onto LiteRT from the start.
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


@dataclass(frozen=True)
class Choice:
    runs_on: str            # 'litert' or 'gpu'
    litert_ms: float        # LiteRT's median step (ms)
    gpu_ms: float           # the GPU's median step (ms)
    # 'measured' in this process, 'cached' from an earlier one, 'planned' from the schedule
    how: str = "measured"

    def describe(self) -> str:
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
