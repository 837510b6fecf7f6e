"""UNIDIRECTIONAL_SEQUENCE_LSTM at sizes that reach the limits of the devices CI has (cpu,
vulkan on Mesa's lavapipe, opengl on llvmpipe; each in its own worker), against the reference:
- a block whose width is not a power of two (96 cells): Taichi's block_dim must be one on
  OpenGL, where a block of 96 threads failed to compile;
- sequences whose loops pass Mesa's 65535 loop iterations per shader invocation: lavapipe and
  llvmpipe silently end every loop there, so the last time steps were never written (the op
  splits the time loop into dispatches on those archs: ops/sequence/select.py, LOOP_BUDGET),
  with the state in a block's shared memory and with a thread per batch row (a state over
  MAX_SHARED_FLOATS; GLES, which has no barriers).
Tolerance: tflite_taichi.testing.TAICHI_RTOL (the zoo's LSTM is contractive, as a trained one:
float32 rounding does not grow over the sequence)."""

import numpy as np

from tflite_taichi.testing import check_delegate
from tflite_taichi.tools import zoo
from cases.sequence import BASE_SEQUENCE, lstm_model, x_shape


def _inputs(case, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.uniform(-1, 1, x_shape(case)).astype(np.float32)]


def test_block_of_96_cells(taichi_workers):
    case = dict(BASE_SEQUENCE, n_batch=1, n_input=3, n_cell=96, n_output=96, peephole=False,
                n_time=2)
    check_delegate(lstm_model(case, "variable"), taichi_workers, _inputs(case))


def test_every_step_of_a_long_sequence(taichi_workers):
    """Two stacked LSTMs of 64 units over 160 steps (the second one's loops run ~83000
    iterations a thread; loops this long, unlike those of a few units, Mesa does not unroll),
    the last step classified: it was left unwritten on lavapipe and llvmpipe."""
    model = zoo.build("lstm_classifier", steps=160, features=8, units=64)
    check_delegate(model, taichi_workers, zoo.sample_inputs(model, seed=4))


def test_long_sequence_with_layer_norm_and_projection(taichi_workers):
    """The phases the loop count bounds beside the gates (layer-norm statistics, projection),
    and the state carried from one chunk of steps to the next (this LSTM, unlike the zoo's,
    does not forget it)."""
    case = dict(BASE_SEQUENCE, n_batch=1, n_input=4, n_cell=64, n_output=48, peephole=True,
                projection=True, projection_bias=True, layer_norm=True, n_inputs=24,
                cell_clip=3.0, proj_clip=2.0, n_time=200)
    check_delegate(lstm_model(case, "variable"), taichi_workers, _inputs(case))


# 24 rows of 64 cells: h, c and h' take 4608 floats, over the 4096 of shared memory, so each row
# is a thread with its state in scratch; ~33000 loop iterations a step (loops of 64, which Mesa
# does not unroll), 20 steps: ~660000
PER_ROW = dict(BASE_SEQUENCE, n_batch=24, n_input=64, n_cell=64, n_output=64, peephole=False,
               n_time=20)


def test_a_thread_per_row_runs_every_step_of_a_long_sequence(taichi_workers):
    """The state too big for shared memory: a thread per batch row, its time loop in chunks of
    steps too (the last steps were left unwritten on lavapipe and llvmpipe)."""
    check_delegate(lstm_model(PER_ROW, "variable"), taichi_workers, _inputs(PER_ROW))


def test_gles_runs_every_step_of_a_long_sequence(gles_worker):
    """GLES has no block barriers: always a thread per row, on llvmpipe as limited as OpenGL."""
    case = dict(PER_ROW, n_batch=1)
    check_delegate(lstm_model(case, "variable"), [gles_worker], _inputs(case))
