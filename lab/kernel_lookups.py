"""Where does a start stop? Each kernel lookup of an allocate timed, every thread's stack dumped
after a deadline (issue 28: the zoo's mobilenet_v3_large on NVIDIA's OpenGL,
bench/results/start_times_zoo_h200.md).

A kernel lookup (`ti_get_aot_module_kernel`) is where Taichi's runtimes finish a kernel for the
device: GL compiles its shaders there, the LLVM backends their machine code. Map a kernel name
(`p{partition}_k{chunk}`) to its ops with the program's `codes[partition].chunks[chunk]`.

    TFLITE_TAICHI_COMPILE_WORKERS=0 python3 lab/kernel_lookups.py MODEL BACKEND [DEADLINE_S=60]
"""
import faulthandler
import sys
import time

import numpy as np

from tflite_taichi import Interpreter
from tflite_taichi.runtime import device

_lookup = device.CapiDevice.kernel


def timed_lookup(self, module, name):
    start = time.time()
    print("lookup", name, end=" ", flush=True)
    kernel = _lookup(self, module, name)
    print(round(time.time() - start, 3), flush=True)
    return kernel


def main() -> None:
    model, backend = sys.argv[1], sys.argv[2]
    faulthandler.dump_traceback_later(float(sys.argv[3]) if len(sys.argv) > 3 else 60, exit=True)
    device.CapiDevice.kernel = timed_lookup
    start = time.time()
    it = Interpreter(model_path=model, backend=backend)
    print("constructed", round(time.time() - start, 2), flush=True)
    it.allocate_tensors()
    print("allocated", round(time.time() - start, 2), flush=True)
    for d in it.get_input_details():
        it.set_tensor(d["index"], np.zeros(d["shape"], d["dtype"]))
    it.invoke()
    print("first result", round(time.time() - start, 2), flush=True)


if __name__ == "__main__":
    main()
