"""What taichi-forge's AOT artifact formats would give a warm start on an LLVM arch (issue 28,
item 5), measured outside the package.

Taichi 1.7.4's C API loads a cuda/x64 AOT module as LLVM IR and runs LLVM's O3 passes and
NVPTX (or x64) code generation for each kernel at its lookup: that is most of a warm cuda start
(bench/results/import_time.md). taichi-forge 0.7 (a fork, not what we pin) can export the
same kernels as PTX or cubin, and ships its own AOT runtime (taichi_forge_runtime.aot). This
script builds a model's kernels with OUR code generator running on forge's Python frontend
(TFLITE_TAICHI_TAICHI=forge: `import taichi` answered with `taichi_forge`), saves them with each artifact format, and times a fresh
process loading them through forge's runtime: runtime creation, module load, each kernel's
lookup (where the LLVM work happens for "bc").

    python lab/forge_probe.py MODEL --arch cuda --formats bc,ptx [--loads 3] [--json OUT]

Needs taichi_forge and taichi_forge_runtime importable (PYTHONPATH); not a dependency of the
package.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time


def export(model: str, arch: str, fmt: str, folder: str) -> dict:
    """Build MODEL's delegated kernels on forge (through the Python runtime, cache off) and save
    them as one AOT module of format FMT in FOLDER; their names and the export's time."""
    os.environ["TFLITE_TAICHI_RUNTIME"] = "python"
    os.environ["TFLITE_TAICHI_TAICHI"] = "forge"    # `import taichi` is forge (taichi_build.py)
    from tflite_taichi import Interpreter
    import taichi as ti
    from tflite_taichi.runtime import compile_workers
    it = Interpreter(model_path=model, backend=arch, cache_dir=False)
    it.allocate_tensors()
    program = it._main.program
    compile_workers.aot_module = lambda caps=(): ti.aot.Module(artifact_format=fmt)
    kernels = [(name, i, j) for i, names in enumerate(program.kernel_names())
               for j, name in enumerate(names)]
    start = time.perf_counter()
    rel = compile_workers.save_module(program.codes, kernels, folder, [], True)
    return {"export_s": time.perf_counter() - start, "module": os.path.join(folder, rel),
            "kernels": [name for name, _, _ in kernels],
            "files": sorted(os.listdir(os.path.join(folder, rel)))}


def load(arch: str, module: str, names: list) -> dict:
    """A fresh process's load of MODULE through forge's AOT runtime, timed by phase."""
    t0 = time.perf_counter()
    from taichi_forge_runtime import aot
    t1 = time.perf_counter()
    runtime = aot.Runtime(arch)
    t2 = time.perf_counter()
    loaded = runtime.load_module(module)
    t3 = time.perf_counter()
    per_kernel = []
    for name in names:
        a = time.perf_counter()
        loaded.kernel(name)
        per_kernel.append(time.perf_counter() - a)
    return {"import_s": t1 - t0, "runtime_s": t2 - t1, "module_s": t3 - t2,
            "kernels_s": per_kernel, "total_s": time.perf_counter() - t0}


def _child(args: list) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", json.dumps(args)],
                         capture_output=True, text=True, timeout=900)
    lines = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    if out.returncode != 0 or not lines:
        tail = (out.stderr or out.stdout).strip().splitlines()[-3:]
        return {"error": " | ".join(tail)[:500]}
    return json.loads(lines[-1][len("RESULT "):])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model", nargs="?")
    p.add_argument("--arch", default="cuda")
    p.add_argument("--formats", default="bc,ptx")
    p.add_argument("--loads", type=int, default=3)
    p.add_argument("--json")
    p.add_argument("--child", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.child:
        what, *rest = json.loads(a.child)
        result = export(*rest) if what == "export" else load(*rest)
        print("RESULT " + json.dumps(result), flush=True)
        return 0
    rows = []
    with tempfile.TemporaryDirectory() as top:
        for fmt in a.formats.split(","):
            folder = os.path.join(top, fmt)
            os.mkdir(folder)
            made = _child(["export", os.path.abspath(a.model), a.arch, fmt, folder])
            rows.append({"format": fmt, "stage": "export", **made})
            print(fmt, "export", json.dumps(made), flush=True)
            if "error" in made:
                continue
            for _ in range(a.loads):
                got = _child(["load", a.arch, made["module"], made["kernels"]])
                rows.append({"format": fmt, "stage": "load", **got})
                print(fmt, "load", json.dumps(got), flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"argv": sys.argv, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
