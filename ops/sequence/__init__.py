"""Recurrent ops: LSTM (TFLite's builtin LSTM: the FULL kernel, one time step, and the BASIC
5-input cell) and UNIDIRECTIONAL_SEQUENCE_LSTM (the FULL kernel over a sequence).

FULL kernel inputs, in TFLite's order (an omitted optional input is -1), for both ops:
  0      input                 LSTM: [n_batch, n_input]; the sequence op: [max_time, n_batch,
                               n_input] (time_major) or [n_batch, max_time, n_input]
  1-4    input-to-gate weights [n_cell, n_input]    input (1) optional: absent = CIFG
  5-8    recurrent weights     [n_cell, n_output]   input (5) optional: absent = CIFG; with the
                               sequence op's diagonal_recurrent_tensors, [n_cell] (then
                               n_output = n_cell and the recurrent term is elementwise)
  9-11   peephole weights      [n_cell]             optional, all or none (9 absent with CIFG)
  12-15  gate biases           [n_cell]             input (12) absent exactly with CIFG
  16     projection weights   [n_output, n_cell]    optional
  17     projection bias      [n_output]            optional, only with projection weights
  18     output_state         n_batch * n_output elements (a variable tensor)
  19     cell_state           n_batch * n_cell elements (a variable tensor)
  20-23  layer-norm coefficients [n_cell]           optional (the 24-input form); present
                                                    iff the forget one is (input one: not CIFG)
Output: LSTM [n_batch, n_output]; the sequence op [max_time, n_batch, n_output] (time_major) or
[n_batch, max_time, n_output]. Options: fused_activation_function (the cell activation, usually
TANH), cell_clip and proj_clip (0: no clipping); the sequence op's time_major and
diagonal_recurrent_tensors.

The semantics are those of TFLite's float kernel (lstm_eval's LstmStepFloat), per batch row and
time step, h and c starting from output_state and cell_state:
  gate_g = W_g x + R_g h + (peephole: w_g * c, for i and f) + b_g
           (layer norm: normalize(W_g x + R_g h + peephole) * ln_g + b_g, where normalize
            subtracts the mean over the cells and divides by sqrt(variance + 1e-8))
  i = sigmoid(gate_i)   (CIFG: i = 1 - f)      f = sigmoid(gate_f)    g = act(gate_c)
  c' = f * c + i * g, clipped to [-cell_clip, cell_clip] when cell_clip > 0
  o = sigmoid(gate_o), its peephole reading the NEW cell state c'
  h' = o * act(c');  output = h' or, with projection, clip(P h' + p_b, proj_clip)
and the output is the next step's h. The op writes each step's output to the output tensor, and
the last h and c into output_state and cell_state (see "State" below).

The BASIC kernel (LSTMOptions.kernel_type BASIC, LiteRT's LstmCell) takes five inputs, input
[n_batch, n_input], prev_activation [n_batch, n_output], weights [4 n_output, n_input +
n_output], biases [4 n_output] and prev_state [n_batch, n_output], and has four outputs:
  concat = [input, prev_activation]                           (output 2, [n_batch, n_in + n_out])
  activ = concat W^T + biases                                 (output 3, [n_batch, 4 n_output])
  i, g, f, o = sigmoid(activ[0]), tanh(activ[1]), sigmoid(activ[2]), sigmoid(activ[3])  (quarters)
  state = i * g + f * prev_state                              (output 1)
  activation = o * tanh(state)                                (output 0)
LiteRT's float BASIC kernel ignores fused_activation_function, cell_clip and proj_clip (it
always uses tanh and never clips; measured), and so does this one. Its tensors are float32 here
(LiteRT also has a uint8/int16 fixed-point form, which this runtime refuses).

Differences from LiteRT, on purpose:
- With fused_activation_function NONE, LiteRT's ApplyActivationToVector writes nothing, so its
  h' = o * act(c') becomes o * g (the cell gate left in that scratch buffer). Here NONE is the
  identity: h' = o * c'. Converters emit TANH.
- A quantized LSTM runs as the float view like every op (LiteRT's integer LSTM computes gates
  in 16-bit fixed point with scales from the op's intermediate tensors); hybrid models (float
  input, 8-bit weights) compute with the dequantized weights rather than LiteRT's dynamically
  quantized input. Over a sequence, h stays float between time steps (only the output tensor
  is snapped to its grid).

Shared with BIDIRECTIONAL_SEQUENCE_LSTM (ops/recurrent.py): `cell_layout` validates one
cell's tensors wherever a `CellInputs` says they sit, `run_cell` runs one over the time steps
(forward or, for a backward cell, reversed), and `_step` takes that op's auxiliary input and,
for its hybrid form, the on-the-fly input quantization (`quantize`). LSTM and
UNIDIRECTIONAL_SEQUENCE_LSTM themselves pass neither, so their hybrid forms keep the float
view described above.

State: in TFLite, output_state and cell_state are variable tensors, zero when the interpreter
is allocated, then holding the previous invoke's last state. The reference returns the new
states after the output and STATE_INPUTS (OpDef.state.state_inputs) names the inputs they overwrite:
the runtime keeps them when those inputs are variable tensors (graph.execute). On the delegate
(OpDef.state.taichi_writes_state) float state tensors live in slots of the io buffer between invokes,
and the Taichi part writes the last h and c into them (StepIO.state), so a stateful LSTM stays
on the device with its neighbours. With the state as ordinary inputs the ops compute from the
values given, on the delegate too. On a machine without a GPU, `auto` keeps the FULL kernel on
numpy (numpy_faster_on_cpu): the zoo's LSTM classifier took 10.2 ms there against 12.5 ms for
this cell on Taichi's cpu backend (2 cores), whose time steps run serially in one thread.

The family reads in five parts: here the OpDefs (options, shapes, state, the Taichi step an
instance gets); layout.py where a cell's tensors sit and their validation; reference.py the
numpy reference; kernels.py the Taichi steps; select.py how the FULL kernel's step runs on an
arch. Names other modules import from `ops.sequence` are re-exported here.
"""
from dataclasses import dataclass

from ..base import OpDef, State, register_op
from .kernels import BasicLstmStep, SequenceLstmStep, state_layout
from .layout import (AUX_INPUT_TO_GATE, BASIC_BIASES, BASIC_INPUT, BASIC_OUTPUTS,  # noqa: F401
                     BASIC_PREV_ACTIVATION, BASIC_PREV_STATE, BASIC_WEIGHTS, CELL_STATE,
                     CELL_TO_GATE, GATE_BIAS, GATE_NAMES, INPUT, INPUT_TO_GATE, KERNEL_BASIC,
                     KERNEL_FULL, LAYER_NORM, LAYER_NORM_EPSILON, OUTPUT_STATE, PROJECTION_BIAS,
                     PROJECTION_WEIGHTS, RECURRENT_TO_GATE, SEQUENCE_OP, STATE_INPUTS,
                     BasicLayout, CellInputs, LstmLayout, basic_layout, cell_layout,
                     check_cell_options, layout)
from .reference import (basic_lstm_cell, getter, lstm_step, reference_lstm,  # noqa: F401
                        run_cell, sequence_lstm)
from .select import (BARRIER_ARCHS, LOOP_BUDGET, LOOP_LIMITED_ARCHS, MAX_LANES,  # noqa: F401
                     MAX_SHARED_FLOATS, MESA_LOOP_LIMIT, block_barriers, block_plan,
                     step_chunks, step_iterations)


@dataclass(frozen=True)
class LSTMOptions:
    fused_activation_function: int = 0
    cell_clip: float = 0.0
    proj_clip: float = 0.0
    kernel_type: int = KERNEL_FULL
    asymmetric_quantize_inputs: bool = False


def _parse(opts) -> LSTMOptions:
    return LSTMOptions(int(opts.FusedActivationFunction()), float(opts.CellClip()),
                       float(opts.ProjClip()), int(opts.KernelType()),
                       bool(opts.AsymmetricQuantizeInputs()))


@dataclass(frozen=True)
class SequenceLSTMOptions:
    fused_activation_function: int = 0
    cell_clip: float = 0.0
    proj_clip: float = 0.0
    time_major: bool = False
    asymmetric_quantize_inputs: bool = False
    diagonal_recurrent_tensors: bool = False
    kernel_type: int = KERNEL_FULL          # always: the sequence op has only the FULL kernel


def _parse_sequence(opts) -> SequenceLSTMOptions:
    return SequenceLSTMOptions(int(opts.FusedActivationFunction()), float(opts.CellClip()),
                               float(opts.ProjClip()), bool(opts.TimeMajor()),
                               bool(opts.AsymmetricQuantizeInputs()),
                               bool(opts.DiagonalRecurrentTensors()))


def _infer(node):
    if node.options.kernel_type == KERNEL_BASIC:
        B = basic_layout(node)
        return [(B.n_batch, B.n_output), (B.n_batch, B.n_output),
                (B.n_batch, B.n_input + B.n_output), (B.n_batch, 4 * B.n_output)]
    return [layout(node).output_shape]


def _infer_sequence(node):
    return [layout(node).output_shape]


def _state_inputs(node):
    return () if node.options.kernel_type == KERNEL_BASIC else STATE_INPUTS[node.op]


def _full_scratch(node):
    if node.options.kernel_type == KERNEL_BASIC:
        B = basic_layout(node)
        return B.n_batch * 4 * B.n_output
    return state_layout(layout(node))[1]


def _taichi(node, io):
    if node.options.kernel_type == KERNEL_BASIC:
        return BasicLstmStep(basic_layout(node), io.inputs, io.outputs, io.scratch)
    L = layout(node)
    return SequenceLstmStep(L, node.options, io.inputs, io.outputs[0], io.scratch,
                            block_plan(L, io.arch), state=io.state)


# the FULL kernel writes its last h and c back into output_state and cell_state, on the
# delegate too (the module docstring's "State")
LSTM_STATE = State(state_inputs=_state_inputs, taichi_writes_state=True)

LSTM = register_op(OpDef(
    name="LSTM", infer=_infer, reference=reference_lstm, parse=_parse, options_class="LSTMOptions",
    taichi=_taichi, scratch=_full_scratch, foldable=False,
    state=LSTM_STATE, numpy_faster_on_cpu=True,
    litert_checks_omitted_inputs=True, min_inputs=5, max_inputs=24))

UNIDIRECTIONAL_SEQUENCE_LSTM = register_op(OpDef(
    name=SEQUENCE_OP, infer=_infer_sequence, reference=reference_lstm, parse=_parse_sequence,
    options_class="UnidirectionalSequenceLSTMOptions", taichi=_taichi,
    scratch=_full_scratch, foldable=False, state=LSTM_STATE,
    numpy_faster_on_cpu=True, litert_checks_omitted_inputs=True, min_inputs=20, max_inputs=24))

