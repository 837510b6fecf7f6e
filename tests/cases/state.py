"""okay_nabu, a streaming int8 wake-word model with 6 variables (../shared/models): its input
sequences, LiteRT's every int8 tensor at every step, and the check against them (shared by
test_ops_state.py and test_answer_while_compiling.py)."""
import numpy as np
import pytest

from tflite_taichi import Interpreter


def nabu_sequence(steps=10, seed=0):
    rng = np.random.default_rng(seed)
    return [[rng.integers(-128, 128, (1, 3, 40)).astype(np.int8)] for _ in range(steps)]


def litert_nabu_tensors(path, sequence):
    """Every int8 tensor an op writes, at every step, from LiteRT (experimental_preserve_all_tensors
    keeps intermediates readable)."""
    int8 = [t for op in Interpreter(model_path=path, backend="reference").model.main.operators
            for t in op.outputs]
    from ai_edge_litert import interpreter as litert
    with pytest.warns(UserWarning, match="preserve_all_tensors"):
        lite = litert.Interpreter(model_path=path, experimental_preserve_all_tensors=True)
    lite.allocate_tensors()
    int8 = [t for t in int8 if lite.get_tensor_details()[t]["dtype"] == np.int8]
    steps = []
    for inputs in sequence:
        lite.set_tensor(lite.get_input_details()[0]["index"], inputs[0])
        lite.invoke()
        steps.append({t: lite.get_tensor(t) for t in int8})
    return steps


def check_nabu_steps(ours_by_step, litert_by_step, what):
    """The output alone is 0 on any noise input (no wake word), so every int8 tensor is held
    to 3 units at every step: the FC logits, the state windows, the convolutions."""
    compared = 0
    for step, (ours, theirs) in enumerate(zip(ours_by_step, litert_by_step)):
        for t, e in theirs.items():
            if t in ours:
                diff = np.abs(ours[t].astype(int) - e.astype(int))
                assert diff.max() <= 3, f"{what} step {step}: tensor {t} differs by {diff.max()} units"
                compared += 1
    assert compared >= 10 * 40, compared
