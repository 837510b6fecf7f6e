"""A compile worker process (compile_workers.py says what it gets and prints).

    python -c BOOTSTRAP tflite_taichi.runtime.compile_worker:main PARENT_PID IDLE_SECONDS < Jobs

(children.python_command: the current folder is not on its sys.path.)
"""
import pickle
import select
import sys

from tflite_taichi.runtime.children import die_with_parent


def _take_switches(variables: dict) -> None:
    """The caller's TFLITE_TAICHI_* variables, exactly (set, changed or removed)."""
    from tflite_taichi import switches
    switches.apply(variables)


def main(argv) -> int:
    die_with_parent(int(argv[1]))
    idle_s = float(argv[2])
    started = None
    stdin = sys.stdin.buffer
    while True:
        if not select.select([stdin], [], [], idle_s)[0]:
            return 0                                    # idle: the caller starts another later
        try:
            job = pickle.load(stdin)
        except EOFError:
            return 0
        _take_switches(job.switches)
        if started is None:
            from tflite_taichi.runtime.device import ensure_python_taichi
            ensure_python_taichi(job.backend, cache_root=job.cache_root)
            started = job.backend
        elif job.backend != started:
            raise RuntimeError(f"this worker compiles for {started}, not {job.backend}")
        from tflite_taichi.runtime.compile_workers import save_module
        for index, folder, kernels in job.modules:
            rel = save_module(job.codes, kernels, folder, job.caps, job.llvm,
                              lambda name: print(f"kernel {name}", flush=True))
            print(f"module {index} {rel}", flush=True)
        print("done", flush=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
