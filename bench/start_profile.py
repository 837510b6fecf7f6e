"""Where a start goes: import, construct, allocate_tensors, first invoke, with cProfile's top
entries for construct + allocate (a developer's tool for the start targets).

    python bench/start_profile.py MODEL --backend vulkan [--top 25]

Run it twice with the same TFLITE_TAICHI_CACHE_DIR: the first run is cold, the second warm.
"""
import argparse
import cProfile
import io
import pstats
import sys
import time

t_start = time.perf_counter()


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model")
    p.add_argument("--backend", default="vulkan")
    p.add_argument("--top", type=int, default=25)
    a = p.parse_args(argv)
    t0 = time.perf_counter()
    import numpy as np
    import warnings
    from tflite_taichi import Interpreter
    warnings.simplefilter("ignore")
    t1 = time.perf_counter()
    prof = cProfile.Profile()
    prof.enable()
    t2 = time.perf_counter()
    it = Interpreter(model_path=a.model, backend=a.backend)
    t3 = time.perf_counter()
    it.allocate_tensors()
    t4 = time.perf_counter()
    prof.disable()
    for d in it.get_input_details():
        it.set_tensor(d["index"], np.zeros(d["shape"], d["dtype"]))
    it.invoke()
    outs = [it.get_tensor(d["index"]) for d in it.get_output_details()]
    t5 = time.perf_counter()
    s = it.summary()
    print(f"{a.model} {a.backend} ({s['cache']['state']}, {s['runtime']['device']}): import "
          f"{t1 - t0:.3f} s, construct {t3 - t2:.3f} s, allocate {t4 - t3:.3f} s, first step "
          f"{t5 - t4:.3f} s; construct to first result {t5 - t2:.3f} s ({len(outs)} outputs)")
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("cumulative").print_stats(a.top)
    print("\n".join(line for line in buf.getvalue().splitlines() if line.strip())[:6000])
    return 0


if __name__ == "__main__":
    sys.exit(main())
