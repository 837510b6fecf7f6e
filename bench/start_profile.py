"""Where a start goes: import, construct, allocate_tensors, first invoke, with cProfile's top
entries for construct + allocate (a developer's tool for the start targets).

    python bench/start_profile.py MODEL --backend vulkan [--top 25] [--sample]

Run it twice with the same TFLITE_TAICHI_CACHE_DIR: the first run is cold, the second warm.
`--sample`: instead of cProfile, the main thread's stack sampled every 5 ms from construct to
the first result, reported as the share of wall time inside each of our functions (inclusive)
and where it sat at the bottom: a start that waits on another thread, a subprocess or a driver
shows there, where cProfile only sees the wait's caller.
"""
import argparse
import collections
import cProfile
import io
import os
import pstats
import sys
import threading
import time

t_start = time.perf_counter()


class MainThreadSampler(threading.Thread):
    """Samples the main thread's Python stack every `period` seconds until stop()."""

    def __init__(self, period: float = 0.005):
        super().__init__(daemon=True)
        self.period, self.samples, self._stop_at = period, [], threading.Event()
        self.main_id = threading.main_thread().ident

    def run(self) -> None:
        while not self._stop_at.wait(self.period):
            frame = sys._current_frames().get(self.main_id)
            stack = []
            while frame is not None:
                code = frame.f_code
                stack.append(f"{os.path.basename(code.co_filename)}:{code.co_name}")
                frame = frame.f_back
            self.samples.append(stack)

    def stop(self) -> None:
        self._stop_at.set()
        self.join()

    def report(self, top: int) -> str:
        inclusive, leaf = collections.Counter(), collections.Counter()
        for stack in self.samples:
            for name in set(stack):
                inclusive[name] += 1
            leaf[" <- ".join(stack[:3])] += 1
        n = max(len(self.samples), 1)
        lines = [f"{len(self.samples)} samples, {self.period * 1e3:.0f} ms apart; inclusive:"]
        lines += [f"  {100 * c / n:5.1f}%  {name}" for name, c in inclusive.most_common(top)]
        lines += ["where it sat (innermost three frames):"]
        lines += [f"  {100 * c / n:5.1f}%  {name}" for name, c in leaf.most_common(top // 2)]
        return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model")
    p.add_argument("--backend", default="vulkan")
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--sample", action="store_true", help="sample the main thread's wall time")
    a = p.parse_args(argv)
    t0 = time.perf_counter()
    import numpy as np
    import warnings
    from tflite_taichi import Interpreter
    warnings.simplefilter("ignore")
    t1 = time.perf_counter()
    prof = MainThreadSampler() if a.sample else cProfile.Profile()
    (prof.start if a.sample else prof.enable)()
    t2 = time.perf_counter()
    it = Interpreter(model_path=a.model, backend=a.backend)
    t3 = time.perf_counter()
    it.allocate_tensors()
    t4 = time.perf_counter()
    if not a.sample:
        prof.disable()
    for d in it.get_input_details():
        it.set_tensor(d["index"], np.zeros(d["shape"], d["dtype"]))
    it.invoke()
    outs = [it.get_tensor(d["index"]) for d in it.get_output_details()]
    t5 = time.perf_counter()
    if a.sample:
        prof.stop()
    s = it.summary()
    cache = (s.get("cache") or {}).get("state")
    device = (s.get("runtime") or {}).get("device")
    print(f"{a.model} {a.backend} -> {it.backend} ({cache}, {device}, answered by "
          f"{s.get('answered_by')}): import {t1 - t0:.3f} s, construct {t3 - t2:.3f} s, "
          f"allocate {t4 - t3:.3f} s, first step {t5 - t4:.3f} s; construct to first result "
          f"{t5 - t2:.3f} s ({len(outs)} outputs)")
    if a.sample:
        print(prof.report(a.top))
        return 0
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("cumulative").print_stats(a.top)
    print("\n".join(line for line in buf.getvalue().splitlines() if line.strip())[:6000])
    return 0


if __name__ == "__main__":
    sys.exit(main())
