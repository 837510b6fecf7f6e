"""The demo model as the subprocess tests use it: written to a folder with a seeded input, and
the reference path's output for it (tests/test_compile_workers.py, tests/test_forge_build.py)."""
import numpy as np

from tflite_taichi import Interpreter
from tflite_taichi.tools.demo import build_demo_model


def demo_case(folder, seed: int) -> tuple:
    """(folder, model path, reference output): demo.tflite and x.npy written into `folder`."""
    model = folder / "demo.tflite"
    model.write_bytes(build_demo_model())
    it = Interpreter(model_path=str(model), backend="reference")
    it.allocate_tensors()
    detail = it.get_input_details()[0]
    x = np.random.default_rng(seed).uniform(-1, 1, detail["shape"]).astype(np.float32)
    np.save(folder / "x.npy", x)
    it.set_tensor(detail["index"], x)
    it.invoke()
    return folder, model, it.get_tensor(it.get_output_details()[0]["index"])
