"""Run a bench script against another copy of the package (A/B of two commits in one machine).

    git archive COMMIT tflite_taichi ops quant | tar -x -C FOLDER
    python bench/with_package.py FOLDER bench/cpu_step.py ARGS...

The editable install's import hook is taken out of this process and FOLDER put first on the path,
so `import tflite_taichi` (and ops, quant) are FOLDER's.
"""
import runpy
import sys

if __name__ == "__main__":
    sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in repr(f).lower()]
    sys.path.insert(0, sys.argv[1])
    script = sys.argv[2]
    sys.argv = sys.argv[2:]
    runpy.run_path(script, run_name="__main__")
