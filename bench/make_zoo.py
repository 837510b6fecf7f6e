"""Writes every zoo model (tflite_taichi.tools.zoo) at its full size, float32 and int8, as .tflite files
into OUT_DIR (NAME_fp32.tflite, NAME_int8.tflite, as ../shared/models names them), printing each
file's size and op counts and the total: the benchmark machine carries at most ~60 MB per run.

    python bench/make_zoo.py OUT_DIR [--only mobilenet_v2,deeplab_v3]

Models without an int8 form (zoo.FLOAT_ONLY) are written as float32 only, and say why.
"""
import argparse
import collections
import os
import sys
import time

from tflite_taichi.tools import zoo
from tflite_taichi.model import read_model

CARRY_LIMIT = 60e6          # bytes of files one benchmark run carries to the device machine


def op_counts(model: bytes) -> str:
    counts = collections.Counter(op.name for op in read_model(model).main.operators)
    return ", ".join(f"{name}x{n}" for name, n in counts.most_common())


def write(out_dir: str, name: str, int8: bool) -> int:
    start = time.perf_counter()
    model = zoo.build(name, int8=int8)
    path = os.path.join(out_dir, f"{name}_{'int8' if int8 else 'fp32'}.tflite")
    with open(path, "wb") as f:
        f.write(model)
    ops = len(read_model(model).main.operators)
    print(f"{os.path.basename(path):32s} {len(model) / 1e6:7.2f} MB  {ops:4d} ops  "
          f"({time.perf_counter() - start:.1f} s)  {op_counts(model)}", flush=True)
    return len(model)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out_dir")
    p.add_argument("--only", default=",".join(zoo.MODELS),
                   help=f"comma-separated zoo models (default: all of {', '.join(zoo.MODELS)})")
    args = p.parse_args(argv)
    names = [n for n in args.only.split(",") if n]
    unknown = [n for n in names if n not in zoo.MODELS]
    if unknown:
        p.error(f"unknown zoo models {unknown}; choose from {', '.join(zoo.MODELS)}")
    os.makedirs(args.out_dir, exist_ok=True)
    total = 0
    for name in names:
        total += write(args.out_dir, name, int8=False)
        if name in zoo.FLOAT_ONLY:
            print(f"{name}_int8.tflite: not written: {zoo.FLOAT_ONLY[name]}", flush=True)
        else:
            total += write(args.out_dir, name, int8=True)
    print(f"total {total / 1e6:.2f} MB in {args.out_dir}")
    if total > CARRY_LIMIT:
        print(f"more than the ~{CARRY_LIMIT / 1e6:.0f} MB a benchmark run carries: split the "
              "models over runs with --only")
    return 0


if __name__ == "__main__":
    sys.exit(main())
