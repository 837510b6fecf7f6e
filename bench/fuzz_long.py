"""The long fuzz run: 10,000 mutated models through the reader, allocate and invoke,
each in a worker process with a 5 s limit; writes bench/results/fuzz_long.md (command, machine,
versions, seed, outcomes per mutation class and per seed model, duration) and saves any failing
case, minimised, under --out. Exit status 1 if any case failed.

    python bench/fuzz_long.py --cases 10000 [--seed S] [--jobs 2] [--cpu-share 0.02]

Same options as `python bench/fuzz.py` (see bench/fuzz.py).
"""
import os
import sys

import fuzz     # bench/fuzz.py: a script's own folder is first on sys.path

if __name__ == "__main__":
    here = os.path.dirname(os.path.abspath(__file__))
    sys.exit(fuzz.main(default_cases=10000,
                       default_report=os.path.join(here, "results", "fuzz_long.md"),
                       prog="python bench/fuzz_long.py"))
