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
states after the output and STATE_INPUTS (OpDef.state_inputs) names the inputs they overwrite:
the runtime keeps them when those inputs are variable tensors (graph.execute). On the delegate
(OpDef.taichi_writes_state) float state tensors live in slots of the io buffer between invokes,
and the Taichi part writes the last h and c into them (StepIO.state), so a stateful LSTM stays
on the device with its neighbours. With the state as ordinary inputs the ops compute from the
values given, on the delegate too. On a machine without a GPU, `auto` keeps the FULL kernel on
numpy (numpy_faster_on_cpu): the zoo's LSTM classifier took 10.2 ms there against 12.5 ms for
this cell on Taichi's cpu backend (2 cores), whose time steps run serially in one thread.
"""
from dataclasses import dataclass, replace
from typing import Optional

import numpy as np

from .base import OpDef, register_op
from .common import ACT_TANH, apply_activation, check_activation
from .kit import activation, ti

# Input positions (TFLite's lstm_shared.h).
INPUT = 0
INPUT_TO_GATE = (1, 2, 3, 4)          # input, forget, cell, output gates
RECURRENT_TO_GATE = (5, 6, 7, 8)
CELL_TO_GATE = (9, 10, None, 11)      # peepholes: input, forget, (none for cell), output
GATE_BIAS = (12, 13, 14, 15)
PROJECTION_WEIGHTS, PROJECTION_BIAS = 16, 17
OUTPUT_STATE, CELL_STATE = 18, 19
LAYER_NORM = (20, 21, 22, 23)
# Not an input of these ops: where CellInputs puts a bidirectional op's auxiliary input weights.
AUX_INPUT_TO_GATE = (24, 25, 26, 27)
GATE_NAMES = ("input", "forget", "cell", "output")
LAYER_NORM_EPSILON = np.float32(1e-8)   # lstm_eval's kNormalizationConstant
# The inputs a FULL-kernel op overwrites with its last state (TFLite's variable tensors).
STATE_INPUTS = {"LSTM": (OUTPUT_STATE, CELL_STATE),
                "UNIDIRECTIONAL_SEQUENCE_LSTM": (OUTPUT_STATE, CELL_STATE)}

# BASIC kernel positions (lstm.cc's basic namespace).
BASIC_INPUT, BASIC_PREV_ACTIVATION, BASIC_WEIGHTS, BASIC_BIASES, BASIC_PREV_STATE = range(5)
BASIC_OUTPUTS = ("activation", "state", "concat_temp", "activation_temp")

KERNEL_FULL, KERNEL_BASIC = 0, 1        # tflite.LSTMKernelType
SEQUENCE_OP = "UNIDIRECTIONAL_SEQUENCE_LSTM"


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


@dataclass(frozen=True)
class LstmLayout:
    """What a FULL-kernel node's inputs say about its structure (validated by `layout`)."""
    n_batch: int
    n_input: int
    n_cell: int
    n_output: int
    cifg: bool
    peephole: bool
    projection: bool
    projection_bias: bool
    layer_norm: bool
    n_time: int = 1            # time steps (1 for LSTM)
    time_major: bool = True    # input and output [time, batch, ...] (LSTM: trivially)
    diagonal: bool = False     # recurrent weights are [n_cell] diagonals
    sequence: bool = False     # UNIDIRECTIONAL_SEQUENCE_LSTM: rank-3 input and output

    @property
    def output_shape(self) -> tuple:
        if not self.sequence:
            return (self.n_batch, self.n_output)
        if self.time_major:
            return (self.n_time, self.n_batch, self.n_output)
        return (self.n_batch, self.n_time, self.n_output)


def _present(node, i) -> bool:
    return i < len(node.inputs) and node.inputs[i] is not None


@dataclass(frozen=True)
class CellInputs:
    """Where one LSTM cell's tensors sit among a node's inputs. LSTM and
    UNIDIRECTIONAL_SEQUENCE_LSTM hold them in TFLite's order (lstm_shared.h, the positions
    above); BIDIRECTIONAL_SEQUENCE_LSTM holds a set per direction: `positions` maps each
    position above to the node's input (or -1: that op has no such input), and `label`
    ("forward ", "backward ") names the direction in messages."""
    node: object
    positions: Optional[tuple] = None      # None: the positions above
    label: str = ""

    def index(self, i) -> int:
        return i if self.positions is None else self.positions[i]

    def present(self, i) -> bool:
        j = self.index(i)
        return j >= 0 and _present(self.node, j)

    def spec(self, i):
        return self.node.inputs[self.index(i)] if self.present(i) else None

    def where(self, i, what) -> str:
        return f"input {self.index(i)} ({self.label}{what})"

    def values(self, inputs) -> list:
        """The node's input values rearranged to the positions above (None where absent)."""
        return [inputs[self.index(i)] if self.present(i) else None
                for i in range(len(self.positions or range(24)))]


def _check_float_tensors(node, what_op):
    for i, spec in enumerate(list(node.inputs) + list(node.outputs)):
        if spec is not None and spec.quantization is None and spec.dtype is not None \
                and not np.issubdtype(np.dtype(spec.dtype), np.floating):
            where = f"input {i}" if i < len(node.inputs) else "the output"
            raise node.fail(f"{where} ('{spec.name}') is {np.dtype(spec.dtype).name}: {what_op} "
                            "tensors are float, or quantized integers")


def check_cell_options(node, opts):
    """The options every FULL-kernel cell takes: activation and clips."""
    check_activation(node, opts.fused_activation_function)
    if not opts.cell_clip >= 0 or not opts.proj_clip >= 0:
        raise node.fail(f"cell_clip and proj_clip must be >= 0 (0: no clipping), got "
                        f"{opts.cell_clip} and {opts.proj_clip}")


def layout(node) -> LstmLayout:
    """Validate a FULL-kernel LSTM or UNIDIRECTIONAL_SEQUENCE_LSTM node as TFLite's Prepare
    does; ModelError naming the op otherwise."""
    opts = node.options
    sequence = node.op == SEQUENCE_OP
    if opts.kernel_type != KERNEL_FULL:
        raise node.fail("kernel_type BASIC takes the 5-input LSTM cell (see basic_layout)")
    check_cell_options(node, opts)
    if len(node.inputs) not in (20, 24):
        raise node.fail(f"the FULL LSTM kernel takes 20 or 24 inputs, has {len(node.inputs)}")
    if len(node.outputs) != 1:
        raise node.fail(f"has {len(node.outputs)} outputs, the LSTM produces 1")
    x = node.inputs[INPUT]
    if x is None:
        raise node.fail(f"input {INPUT} (input) is required")
    n_time, time_major = 1, True
    if sequence:
        if x.rank != 3:
            raise node.fail("input must have rank 3 ([max_time, n_batch, n_input] when "
                            "time_major, else [n_batch, max_time, n_input]), got shape "
                            f"{list(x.shape)}")
        time_major = bool(opts.time_major)
        n_time, n_batch, n_input = x.shape if time_major else (x.shape[1], x.shape[0], x.shape[2])
    else:
        if x.rank != 2:
            raise node.fail(f"input must have rank 2 [n_batch, n_input], got shape {list(x.shape)}")
        n_batch, n_input = x.shape
    L = cell_layout(CellInputs(node), n_batch, n_input,
                    diagonal=sequence and opts.diagonal_recurrent_tensors,
                    layer_norm_inputs=len(node.inputs) == 24)
    _check_float_tensors(node, "LSTM")
    return replace(L, n_time=n_time, time_major=time_major, sequence=sequence)


def cell_layout(cell: CellInputs, n_batch: int, n_input: int, diagonal: bool = False,
                layer_norm_inputs: bool = False) -> LstmLayout:
    """Validate one cell's weights, biases and states (at `cell`'s positions) as TFLite's
    Prepare does, for inputs of n_input values per batch row."""
    node = cell.node

    def required(i, what):
        if not cell.present(i):
            raise node.fail(f"{cell.where(i, what)} is required")
        return cell.spec(i)

    def check_shape(i, what, shape):
        spec = cell.spec(i)
        if tuple(spec.shape) != tuple(shape):
            raise node.fail(f"{cell.label}{what} (input {cell.index(i)}) must have shape "
                            f"{list(shape)}, got {list(spec.shape)}")

    w_o = required(INPUT_TO_GATE[3], "input-to-output weights")
    if w_o.rank != 2:
        raise node.fail(f"{cell.label}input-to-output weights must have rank 2, got shape "
                        f"{list(w_o.shape)}")
    n_cell = w_o.shape[0]
    r_o = required(RECURRENT_TO_GATE[3], "recurrent-to-output weights")
    if r_o.rank != (1 if diagonal else 2):
        raise node.fail(f"{cell.label}recurrent-to-output weights must have rank "
                        f"{1 if diagonal else 2}"
                        f"{' (diagonal_recurrent_tensors)' if diagonal else ''}, got shape "
                        f"{list(r_o.shape)}")
    n_output = r_o.shape[0] if diagonal else r_o.shape[1]
    recurrent_shape = (n_cell,) if diagonal else (n_cell, n_output)

    cifg = not cell.present(INPUT_TO_GATE[0])
    if cifg != (not cell.present(RECURRENT_TO_GATE[0])):
        raise node.fail(f"{cell.label}input-to-input and recurrent-to-input weights must be "
                        "both present or both absent (CIFG)")
    if cifg != (not cell.present(GATE_BIAS[0])):
        raise node.fail(f"the {cell.label}input gate bias must be present exactly when the "
                        "input gate weights are (absent for CIFG)")
    for g, name in enumerate(GATE_NAMES):
        if g == 0 and cifg:
            continue
        required(INPUT_TO_GATE[g], f"input-to-{name} weights")
        check_shape(INPUT_TO_GATE[g], f"input-to-{name} weights", (n_cell, n_input))
        required(RECURRENT_TO_GATE[g], f"recurrent-to-{name} weights")
        check_shape(RECURRENT_TO_GATE[g], f"recurrent-to-{name} weights", recurrent_shape)
        required(GATE_BIAS[g], f"{name} gate bias")
        check_shape(GATE_BIAS[g], f"{name} gate bias", (n_cell,))

    peep = [cell.present(CELL_TO_GATE[g]) for g in (0, 1, 3)]
    peephole = peep[2]
    if cifg and peep[0]:
        raise node.fail(f"a CIFG {cell.label}LSTM has no input gate, so no cell-to-input "
                        "(peephole) weights")
    if peep[1:] != [peephole, peephole] or (not cifg and peep[0] != peephole):
        raise node.fail(f"{cell.label}peephole (cell-to-gate) weights must be all present or "
                        "all absent")
    for g in (0, 1, 3):
        if cell.present(CELL_TO_GATE[g]):
            check_shape(CELL_TO_GATE[g], f"cell-to-{GATE_NAMES[g]} weights", (n_cell,))

    projection = cell.present(PROJECTION_WEIGHTS)
    projection_bias = cell.present(PROJECTION_BIAS)
    if projection:
        check_shape(PROJECTION_WEIGHTS, "projection weights", (n_output, n_cell))
    elif projection_bias:
        raise node.fail(f"a {cell.label}projection bias needs projection weights")
    elif n_output != n_cell:
        raise node.fail(f"without projection the {cell.label}output size ({n_output}) must "
                        f"equal the number of cells ({n_cell})")
    if projection_bias:
        check_shape(PROJECTION_BIAS, "projection bias", (n_output,))

    layer_norm = layer_norm_inputs and cell.present(LAYER_NORM[1])
    if layer_norm:
        for g, name in enumerate(GATE_NAMES):
            if g == 0 and cifg:
                if cell.present(LAYER_NORM[0]):
                    raise node.fail("a CIFG LSTM takes no input layer-norm coefficients")
                continue
            required(LAYER_NORM[g], f"{name} layer-norm coefficients")
            check_shape(LAYER_NORM[g], f"{name} layer-norm coefficients", (n_cell,))
    elif layer_norm_inputs and any(cell.present(i) for i in LAYER_NORM):
        raise node.fail("layer-norm coefficients must be all present or all absent "
                        "(the forget gate's decides)")

    for i, what, n in ((OUTPUT_STATE, "output_state", n_batch * n_output),
                       (CELL_STATE, "cell_state", n_batch * n_cell)):
        spec = required(i, what)
        size = int(np.prod(spec.shape, dtype=np.int64))
        if size != n:
            raise node.fail(f"{cell.label}{what} (input {cell.index(i)}) must hold {n} "
                            f"elements, got shape {list(spec.shape)}")
    return LstmLayout(n_batch, n_input, n_cell, n_output, cifg, peephole, projection,
                      projection_bias, layer_norm, diagonal=diagonal)


@dataclass(frozen=True)
class BasicLayout:
    n_batch: int
    n_input: int
    n_output: int


def basic_layout(node) -> BasicLayout:
    """Validate a BASIC-kernel LSTM node as lstm.cc's basic::Prepare does."""
    if len(node.inputs) != 5 or any(s is None for s in node.inputs):
        raise node.fail(f"kernel_type BASIC takes 5 inputs (input, prev_activation, weights, "
                        f"biases, prev_state), has {len(node.inputs)}")
    if len(node.outputs) != 4:
        raise node.fail(f"kernel_type BASIC has 4 outputs (activation, state, concat_temp, "
                        f"activation_temp), has {len(node.outputs)}")
    x, h, w, b, c = node.inputs
    for spec, what in ((x, "input"), (h, "prev_activation"), (w, "weights"),
                       (c, "prev_state")):
        if spec.rank != 2:
            raise node.fail(f"{what} must have rank 2, got shape {list(spec.shape)}")
    n_batch, n_input = x.shape
    n_output = h.shape[1]
    for spec, what, shape in ((h, "prev_activation", (n_batch, n_output)),
                              (w, "weights", (4 * n_output, n_input + n_output)),
                              (b, "biases", (4 * n_output,)),
                              (c, "prev_state", (n_batch, n_output))):
        if tuple(spec.shape) != shape:
            raise node.fail(f"{what} must have shape {list(shape)}, got {list(spec.shape)}")
    for spec in list(node.inputs) + list(node.outputs):
        float32 = spec.dtype is not None and np.dtype(spec.dtype) == np.float32
        if not float32 or spec.quantization is not None:
            dtype = np.dtype(spec.dtype).name if spec.dtype is not None else "untyped"
            quantized = " quantized" if spec.quantization is not None else ""
            raise node.fail(f"tensor '{spec.name}' is {dtype}{quantized}: the BASIC LSTM kernel "
                            "is supported in float32 only")
    return BasicLayout(n_batch, n_input, n_output)


def _infer(node):
    if node.options.kernel_type == KERNEL_BASIC:
        B = basic_layout(node)
        return [(B.n_batch, B.n_output), (B.n_batch, B.n_output),
                (B.n_batch, B.n_input + B.n_output), (B.n_batch, 4 * B.n_output)]
    return [layout(node).output_shape]


def _infer_sequence(node):
    return [layout(node).output_shape]


def _sigmoid(x):
    with np.errstate(over="ignore"):
        return (np.float32(1) / (np.float32(1) + np.exp(-x))).astype(np.float32)


def _normalize(x):
    """lstm_eval's MeanStddevNormalization along the cells of each batch row."""
    mean = np.mean(x, axis=1, keepdims=True, dtype=np.float32)
    variance = np.mean(np.square(x - mean), axis=1, keepdims=True, dtype=np.float32)
    return ((x - mean) / np.sqrt(variance + LAYER_NORM_EPSILON)).astype(np.float32)


def _float_product(v, w):
    """v [B, K] times w [N, K] transposed: a float kernel's matmul."""
    return v @ w.T


def _step(L, opts, get, x, h, c, product=_float_product, quantize=None, aux_x=None):
    """One time step on the float view: x [B, I], h [B, O], c [B, C] -> (output [B, O], c').
    A hybrid kernel's `quantize` (v [B, K] -> v as its on-the-fly int8 quantization gives it
    back, per batch row) applies to every vector a weight matrix multiplies: x, aux_x, h and
    h' before the projection; None: the float kernel. aux_x [B, I_aux]: the auxiliary input,
    multiplied by the weights at AUX_INPUT_TO_GATE."""
    act = opts.fused_activation_function
    if quantize is not None:
        x, h_in = quantize(x), quantize(h)
        aux_x = None if aux_x is None else quantize(aux_x)
    else:
        h_in = h

    def gate(g, cell):
        r = get(RECURRENT_TO_GATE[g])
        pre = product(x, get(INPUT_TO_GATE[g]))
        if aux_x is not None:
            pre = pre + product(aux_x, get(AUX_INPUT_TO_GATE[g]))
        pre = pre + (h * r if L.diagonal else product(h_in, r))
        if L.peephole and CELL_TO_GATE[g] is not None:
            pre = pre + get(CELL_TO_GATE[g]) * cell
        if L.layer_norm:
            pre = _normalize(pre) * get(LAYER_NORM[g])
        return (pre + get(GATE_BIAS[g])).astype(np.float32)

    f = _sigmoid(gate(1, c))
    i = np.float32(1) - f if L.cifg else _sigmoid(gate(0, c))
    g = apply_activation(gate(2, None), act)
    c_new = f * c + i * g
    if opts.cell_clip > 0:
        clip = np.float32(opts.cell_clip)
        c_new = np.clip(c_new, -clip, clip)
    o = _sigmoid(gate(3, c_new))
    h_new = (o * apply_activation(c_new, act)).astype(np.float32)
    if L.projection:
        out = product(h_new if quantize is None else quantize(h_new), get(PROJECTION_WEIGHTS))
        if L.projection_bias:
            out = out + get(PROJECTION_BIAS)
        if opts.proj_clip > 0:
            clip = np.float32(opts.proj_clip)
            out = np.clip(out, -clip, clip)
    else:
        out = h_new
    return out.astype(np.float32), c_new.astype(np.float32)


def _getter(inputs):
    def get(i):
        if i is None or i >= len(inputs) or inputs[i] is None:
            return None
        return np.asarray(inputs[i], np.float32)
    return get


def run_cell(L, opts, get, x, h, c, reverse=False, quantize=None, aux_x=None):
    """A cell over time steps: x [T, B, I] (time-major), h [B, O], c [B, C] -> (outputs
    [T, B, O], last h, last c); `reverse`: from the last step to the first (a bidirectional
    op's backward cell; outputs stay at their steps). quantize, aux_x [T, B, I_aux]: _step's."""
    outs = [None] * L.n_time
    steps = range(L.n_time - 1, -1, -1) if reverse else range(L.n_time)
    for t in steps:                     # time steps: each needs the last one's state
        h, c = _step(L, opts, get, x[t], h, c, quantize=quantize,
                     aux_x=None if aux_x is None else aux_x[t])
        outs[t] = h
    y = np.stack(outs) if outs else np.zeros((0, L.n_batch, L.n_output), np.float32)
    return y, h, c


def sequence_lstm(node, inputs):
    """A FULL-kernel op over its time steps on the float view: (output, new output_state, new
    cell_state), shaped like the output tensor, output_state's tensor and cell_state's tensor."""
    L = layout(node)
    get = _getter(inputs)
    x = get(INPUT)
    if L.sequence and not L.time_major:
        x = np.swapaxes(x, 0, 1)
    x = x.reshape(L.n_time, L.n_batch, L.n_input)
    h = get(OUTPUT_STATE).reshape(L.n_batch, L.n_output)
    c = get(CELL_STATE).reshape(L.n_batch, L.n_cell)
    y, h, c = run_cell(L, node.options, get, x, h, c)
    if L.sequence and not L.time_major:
        y = np.swapaxes(y, 0, 1)
    return (np.ascontiguousarray(y).reshape(L.output_shape),
            h.reshape(node.inputs[OUTPUT_STATE].shape), c.reshape(node.inputs[CELL_STATE].shape))


def lstm_step(node, inputs):
    """One LSTM step on the float view: (output, new output_state, new cell_state), shaped
    [n_batch, n_output], like output_state's tensor, like cell_state's tensor."""
    return sequence_lstm(node, inputs)


def basic_lstm_cell(node, inputs):
    """The BASIC kernel's four outputs on the float view (see the module docstring)."""
    B = basic_layout(node)
    x, h, w, b, c = (np.asarray(v, np.float32) for v in inputs)
    concat = np.concatenate([x, h], axis=1)
    activ = (concat @ w.T + b).astype(np.float32)
    O = B.n_output
    i, g = _sigmoid(activ[:, :O]), np.tanh(activ[:, O:2 * O])
    f, o = _sigmoid(activ[:, 2 * O:3 * O]), _sigmoid(activ[:, 3 * O:])
    state = (i * g + f * c).astype(np.float32)
    return [(o * np.tanh(state)).astype(np.float32), state, concat, activ]


def _reference(node, inputs):
    """The outputs, then (FULL kernel) the new output_state and cell_state, which the runtime
    stores into those inputs when they are variable tensors (OpDef.state_inputs)."""
    if node.options.kernel_type == KERNEL_BASIC:
        return basic_lstm_cell(node, inputs)
    return list(sequence_lstm(node, inputs))


def _state_inputs(node):
    return () if node.options.kernel_type == KERNEL_BASIC else STATE_INPUTS[node.op]


# -- Taichi ----------------------------------------------------------------------------------
# The FULL kernel (both ops): one parallel task whose threads walk the time steps together.
# The time steps are serial (each needs all of the previous h), so the threads that share one
# sequence must wait for each other between the phases of a step:
# - on archs with block-shared memory (GPUs): one thread block of up to MAX_LANES threads takes
#   every batch row; the state (h, c, h' before projection, the layer-norm sums and statistics)
#   lives in shared memory, and the phases are separated by block barriers. Per time step:
#     without layer norm: (batch row, cell) items compute the gates (dot products over the input
#       and the previous h), c' and h' = o * act(c');
#     with layer norm: items for the raw input/forget/cell gate sums, (row, gate) items for
#       their mean and variance, items for c' and the raw output gate sum, rows for its
#       statistics, items for h';
#     then (row, output unit) items project h' (or copy it), write the output and the next h.
# - elsewhere (Taichi's CPU backends have neither, GLES no barriers): one thread per batch row
#   runs the same phases alone, its state in the float32 scratch buffer (OpDef.scratch).
# The first step reads output_state and cell_state from their tensors; h stays float32 between
# steps (the reference's float view), whatever the output's storage. Compile time does not grow
# with the sequence (an unrolled time loop compiled each step as its own task: measured 0.5-1 s
# per step on Taichi's cpu backend, lavapipe and llvmpipe), but for one copy of the block's loop
# per chunk of steps on LOOP_LIMITED_ARCHS (see LOOP_BUDGET).
MAX_LANES = 256                 # threads of the block (shared-memory archs)
# Archs where Taichi 1.7 has block barriers (ti.simt.block.sync): not gles, whose shared
# arrays kit.has_shared_memory() reports but whose sync() raises "not supported".
BARRIER_ARCHS = ("cuda", "amdgpu", "vulkan", "metal", "opengl", "dx11")
# Shared memory the state may take: Vulkan guarantees 16 KiB per workgroup, OpenGL 32 KiB.
MAX_SHARED_FLOATS = 4096
# Mesa's software drivers (lavapipe for Vulkan, llvmpipe for OpenGL) end every loop of a shader
# invocation once all its loops together have iterated LP_MAX_TGSI_LOOP_ITERATIONS (65535)
# times, silently: a block that ran the whole sequence left the last steps unwritten. On these
# archs the time loop is split into chunks of steps, each its own top-level loop (a dispatch,
# whose invocations count afresh), the state carried between them in the scratch buffer. A
# quarter of the limit is kept for loops the count below does not see.
MESA_LOOP_LIMIT = 65535
LOOP_BUDGET = MESA_LOOP_LIMIT * 3 // 4
LOOP_LIMITED_ARCHS = ("vulkan", "opengl")


@ti.func
def _sigmoid_ti(v):
    return 1.0 / (1.0 + ti.exp(-ti.min(ti.max(v, -80.0), 80.0)))


@ti.func
def _cell_act(v, act: ti.template()):
    r = v
    if ti.static(act == ACT_TANH):
        r = ti.tanh(ti.min(ti.max(v, -20.0), 20.0))   # tanh(+-20) is +-1 in float32
    else:
        r = activation(v, act)
    return r


def block_barriers(arch: str) -> bool:
    """Whether Taichi arch `arch` gives this op block-shared memory and barriers."""
    from . import kit
    return kit.has_shared_memory(arch) and arch in BARRIER_ARCHS


def _state_layout(L):
    """(offsets, total size) of the state buffers, in float32 elements."""
    B, C, O = L.n_batch, L.n_cell, L.n_output
    off, at = {}, 0
    for name, size in (("h", B * O), ("c", B * C), ("hc", B * C),
                       ("pre", 4 * B * C if L.layer_norm else 0),
                       ("stat", 8 * B if L.layer_norm else 0)):
        off[name] = at
        at += size
    return off, at


def _lanes(L) -> int:
    """Threads of the block: one per widest phase's item, up to MAX_LANES, a power of two
    (Taichi's block_dim must be one on OpenGL, Metal and DX11; CUDA and Vulkan also take
    multiples of 32)."""
    widest = max(L.n_batch * L.n_cell, L.n_batch * L.n_output, 32)
    return min(MAX_LANES, 1 << (widest - 1).bit_length())


def _loop(trips: int, body: int = 0) -> int:
    """Loop iterations a loop of `trips` passes costs, each running `body` iterations of inner
    loops (one more for the exit test)."""
    return trips * (1 + body) + 1


def step_iterations(L, lanes: int, rows: int) -> int:
    """An upper bound on the loop iterations one thread runs per time step (SequenceLstmStep's
    phases: `rows` batch rows shared by `lanes` threads)."""
    def items(width):
        return -(-rows * width // lanes)
    dot = _loop(L.n_input) + (0 if L.diagonal else _loop(L.n_output))
    gates = 4                                          # CIFG has 3: the bound keeps 4
    total = _loop(items(L.n_cell), gates * dot)        # gates, or layer norm's sums
    if L.layer_norm:
        statistics = 4 * 2 * _loop(L.n_cell)           # mean and variance of each gate
        total += 2 * _loop(items(1), statistics) + 2 * _loop(items(L.n_cell), dot)
    total += _loop(items(L.n_output), _loop(L.n_cell) if L.projection else 0)
    return 1 + total


def step_chunks(L, lanes: int, rows: int, arch: str) -> tuple:
    """(first, end) time steps of each chunk: the whole sequence, or on LOOP_LIMITED_ARCHS
    as many steps as LOOP_BUDGET allows a thread (at least one)."""
    if arch not in LOOP_LIMITED_ARCHS:
        return ((0, L.n_time),)
    state_copies = 4 * _loop(-(-rows * max(L.n_cell, L.n_output) // lanes))
    per_chunk = max(1, (LOOP_BUDGET - state_copies) // step_iterations(L, lanes, rows))
    return tuple((t, min(t + per_chunk, L.n_time))
                 for t in range(0, max(L.n_time, 1), per_chunk))


@ti.data_oriented
class SequenceLstmStep:
    def __init__(self, L, opts, refs, out, scratch, shared, state=(), arch="cpu"):
        self.L, self.out, self.s, self.shared = L, out, scratch, shared
        # where the last h and c go (the variable tensors' slots: StepIO.state), if anywhere
        self.h_last = state[0] if state and L.n_time > 0 else None
        self.c_last = state[1] if len(state) > 1 and L.n_time > 0 else None
        self.writes_h, self.writes_c = self.h_last is not None, self.c_last is not None
        self.act = int(opts.fused_activation_function)
        self.cell_clip = float(opts.cell_clip)
        self.proj_clip = float(opts.proj_clip)
        self.cifg, self.peephole, self.layer_norm = L.cifg, L.peephole, L.layer_norm
        self.projection, self.projection_bias = L.projection, L.projection_bias
        self.diagonal, self.time_major = L.diagonal, L.time_major
        self.T, self.B = L.n_time, L.n_batch
        self.n_input, self.n_cell, self.n_output = L.n_input, L.n_cell, L.n_output
        self.x, self.h0, self.c0 = refs[INPUT], refs[OUTPUT_STATE], refs[CELL_STATE]
        # per gate (input, forget, cell, output); the input gate's are unused with CIFG
        self.w = tuple(refs[i] for i in INPUT_TO_GATE)
        self.r = tuple(refs[i] for i in RECURRENT_TO_GATE)
        self.b = tuple(refs[i] for i in GATE_BIAS)
        self.p = tuple(refs[i] if i is not None else None for i in CELL_TO_GATE)
        self.ln = tuple(refs[i] if i < len(refs) else None for i in LAYER_NORM)
        self.proj_w = refs[PROJECTION_WEIGHTS]
        self.proj_b = refs[PROJECTION_BIAS]
        off, self.state_size = _state_layout(L)
        self.h_off, self.c_off, self.hc_off = off["h"], off["c"], off["hc"]
        self.pre_off, self.stat_off = off["pre"], off["stat"]
        # gates whose layer-norm statistics come before the cell update (i unless CIFG, f, c)
        self.early_gates = (1, 2) if L.cifg else (0, 1, 2)
        self.lanes = _lanes(L) if shared else 1
        # only the block is split: one thread per row may pass the budget in a single step
        # (4 n_cell (n_input + n_output) iterations), which chunks of steps cannot bound, so
        # that path still meets Mesa's limit on lavapipe and llvmpipe (gles, or a state too big
        # for shared memory)
        self.chunks = step_chunks(L, self.lanes, L.n_batch, arch) if shared else ((0, L.n_time),)

    # -- the state: shared memory (one block) or this row's part of the scratch buffer --------
    @ti.func
    def _ld(self, arena: ti.template(), weights: ti.template(), io: ti.template(),
            sh: ti.template(), i):
        v = 0.0
        if ti.static(self.shared):
            v = sh[i]
        else:
            v = self.s.load(arena, weights, io, i)
        return v

    @ti.func
    def _st(self, arena: ti.template(), io: ti.template(), sh: ti.template(), i, v):
        if ti.static(self.shared):
            sh[i] = v
        else:
            self.s.store(arena, io, i, v)

    @ti.func
    def _sync(self):
        if ti.static(self.shared):
            ti.simt.block.sync()

    # -- reads -------------------------------------------------------------------------------
    @ti.func
    def _x(self, arena: ti.template(), weights: ti.template(), io: ti.template(), t, b, j):
        flat = 0
        if ti.static(self.time_major):
            flat = (t * self.B + b) * self.n_input + j
        else:
            flat = (b * self.T + t) * self.n_input + j
        return self.x.load(arena, weights, io, flat)

    @ti.func
    def _h(self, arena: ti.template(), weights: ti.template(), io: ti.template(),
           sh: ti.template(), t, b, j):
        """h before time step t (output_state for the first)."""
        v = 0.0
        if t == 0:
            v = self.h0.load(arena, weights, io, b * self.n_output + j)
        else:
            v = self._ld(arena, weights, io, sh, self.h_off + b * self.n_output + j)
        return v

    @ti.func
    def _c(self, arena: ti.template(), weights: ti.template(), io: ti.template(),
           sh: ti.template(), t, b, k):
        """c before time step t (cell_state for the first)."""
        v = 0.0
        if t == 0:
            v = self.c0.load(arena, weights, io, b * self.n_cell + k)
        else:
            v = self._ld(arena, weights, io, sh, self.c_off + b * self.n_cell + k)
        return v

    @ti.func
    def _sum(self, arena: ti.template(), weights: ti.template(), io: ti.template(),
             sh: ti.template(), g: ti.template(), t, b, k):
        """W_g x_t + R_g h for batch row b, cell k (no peephole, no bias)."""
        acc = 0.0
        for j in range(self.n_input):
            acc += (self.w[g].load(arena, weights, io, k * self.n_input + j)
                    * self._x(arena, weights, io, t, b, j))
        if ti.static(self.diagonal):
            acc += self.r[g].load(arena, weights, io, k) * self._h(arena, weights, io, sh, t, b, k)
        else:
            for j in range(self.n_output):
                acc += (self.r[g].load(arena, weights, io, k * self.n_output + j)
                        * self._h(arena, weights, io, sh, t, b, j))
        return acc

    @ti.func
    def _normalized(self, arena: ti.template(), weights: ti.template(), io: ti.template(),
                    sh: ti.template(), g: ti.template(), b, k):
        """Layer norm of gate g's raw sum times its coefficient, plus its bias."""
        raw = self._ld(arena, weights, io, sh, self.pre_off + (g * self.B + b) * self.n_cell + k)
        mean = self._ld(arena, weights, io, sh, self.stat_off + (g * self.B + b) * 2)
        rstd = self._ld(arena, weights, io, sh, self.stat_off + (g * self.B + b) * 2 + 1)
        return ((raw - mean) * rstd * self.ln[g].load(arena, weights, io, k)
                + self.b[g].load(arena, weights, io, k))

    @ti.func
    def _statistics(self, arena: ti.template(), weights: ti.template(), io: ti.template(),
                    sh: ti.template(), g: ti.template(), b):
        """Mean and 1/sqrt(variance + eps) of gate g's raw sums over the cells of row b."""
        base = self.pre_off + (g * self.B + b) * self.n_cell
        total = 0.0
        for k in range(self.n_cell):
            total += self._ld(arena, weights, io, sh, base + k)
        mean = total / self.n_cell
        var = 0.0
        for k in range(self.n_cell):
            d = self._ld(arena, weights, io, sh, base + k) - mean
            var += d * d
        var = var / self.n_cell
        self._st(arena, io, sh, self.stat_off + (g * self.B + b) * 2, mean)
        self._st(arena, io, sh, self.stat_off + (g * self.B + b) * 2 + 1,
                 1.0 / ti.sqrt(var + LAYER_NORM_EPSILON))

    @ti.func
    def _clip_cell(self, c):
        r = c
        if ti.static(self.cell_clip > 0):
            r = ti.min(ti.max(c, -self.cell_clip), self.cell_clip)
        return r

    # -- the phases of a time step: `width` items per row of this thread's rows ---------------
    @ti.func
    def _items(self, lane, rows, width):
        """How many of rows * width items lane takes (items lane, lane + lanes, ...)."""
        return (rows * width - lane + self.lanes - 1) // self.lanes

    @ti.func
    def _gates(self, arena: ti.template(), weights: ti.template(), io: ti.template(),
               sh: ti.template(), t, b, k):
        """Without layer norm: c' into the state, h' into hc."""
        c_prev = self._c(arena, weights, io, sh, t, b, k)
        pre_f = (self._sum(arena, weights, io, sh, 1, t, b, k)
                 + self.b[1].load(arena, weights, io, k))
        if ti.static(self.peephole):
            pre_f += self.p[1].load(arena, weights, io, k) * c_prev
        f = _sigmoid_ti(pre_f)
        i = 1.0 - f
        if ti.static(not self.cifg):
            pre_i = (self._sum(arena, weights, io, sh, 0, t, b, k)
                     + self.b[0].load(arena, weights, io, k))
            if ti.static(self.peephole):
                pre_i += self.p[0].load(arena, weights, io, k) * c_prev
            i = _sigmoid_ti(pre_i)
        g = _cell_act(self._sum(arena, weights, io, sh, 2, t, b, k)
                      + self.b[2].load(arena, weights, io, k), self.act)
        c_new = self._clip_cell(f * c_prev + i * g)
        pre_o = (self._sum(arena, weights, io, sh, 3, t, b, k)
                 + self.b[3].load(arena, weights, io, k))
        if ti.static(self.peephole):
            pre_o += self.p[3].load(arena, weights, io, k) * c_new
        self._st(arena, io, sh, self.c_off + b * self.n_cell + k, c_new)
        self._st(arena, io, sh, self.hc_off + b * self.n_cell + k,
                 _sigmoid_ti(pre_o) * _cell_act(c_new, self.act))

    @ti.func
    def _early_sums(self, arena: ti.template(), weights: ti.template(), io: ti.template(),
                    sh: ti.template(), t, b, k):
        """Layer norm, first phase: the raw sums of the input, forget and cell gates."""
        c_prev = self._c(arena, weights, io, sh, t, b, k)
        for g in ti.static(self.early_gates):
            v = self._sum(arena, weights, io, sh, g, t, b, k)
            if ti.static(self.peephole and g != 2):
                v += self.p[g].load(arena, weights, io, k) * c_prev
            self._st(arena, io, sh, self.pre_off + (g * self.B + b) * self.n_cell + k, v)

    @ti.func
    def _cell_update(self, arena: ti.template(), weights: ti.template(), io: ti.template(),
                     sh: ti.template(), t, b, k):
        """Layer norm, third phase: c' and the raw output gate sum."""
        c_prev = self._c(arena, weights, io, sh, t, b, k)
        f = _sigmoid_ti(self._normalized(arena, weights, io, sh, 1, b, k))
        i = 1.0 - f
        if ti.static(not self.cifg):
            i = _sigmoid_ti(self._normalized(arena, weights, io, sh, 0, b, k))
        g = _cell_act(self._normalized(arena, weights, io, sh, 2, b, k), self.act)
        c_new = self._clip_cell(f * c_prev + i * g)
        v = self._sum(arena, weights, io, sh, 3, t, b, k)
        if ti.static(self.peephole):
            v += self.p[3].load(arena, weights, io, k) * c_new
        self._st(arena, io, sh, self.pre_off + (3 * self.B + b) * self.n_cell + k, v)
        self._st(arena, io, sh, self.c_off + b * self.n_cell + k, c_new)

    @ti.func
    def _output_gate(self, arena: ti.template(), weights: ti.template(), io: ti.template(),
                     sh: ti.template(), b, k):
        """Layer norm, last phase: h' into hc."""
        o = _sigmoid_ti(self._normalized(arena, weights, io, sh, 3, b, k))
        c_new = self._ld(arena, weights, io, sh, self.c_off + b * self.n_cell + k)
        self._st(arena, io, sh, self.hc_off + b * self.n_cell + k, o * _cell_act(c_new, self.act))

    @ti.func
    def _emit(self, arena: ti.template(), weights: ti.template(), io: ti.template(),
              sh: ti.template(), t, b, n):
        """Output unit n of row b at step t: h' projected (or h' itself), to the output tensor
        and to h for the next step."""
        r = 0.0
        if ti.static(self.projection):
            if ti.static(self.projection_bias):
                r = self.proj_b.load(arena, weights, io, n)
            for k in range(self.n_cell):
                r += (self.proj_w.load(arena, weights, io, n * self.n_cell + k)
                      * self._ld(arena, weights, io, sh, self.hc_off + b * self.n_cell + k))
            if ti.static(self.proj_clip > 0):
                r = ti.min(ti.max(r, -self.proj_clip), self.proj_clip)
        else:
            r = self._ld(arena, weights, io, sh, self.hc_off + b * self.n_cell + n)
        flat = 0
        if ti.static(self.time_major):
            flat = (t * self.B + b) * self.n_output + n
        else:
            flat = (b * self.T + t) * self.n_output + n
        self.out.store(arena, io, flat, r)
        self._st(arena, io, sh, self.h_off + b * self.n_output + n, r)

    @ti.func
    def _sequence(self, arena: ti.template(), weights: ti.template(), io: ti.template(),
                  sh: ti.template(), lane, row0, rows, first: ti.template(), end: ti.template()):
        """Time steps [first, end) for batch rows [row0, row0 + rows), this thread taking its
        items."""
        C, O = self.n_cell, self.n_output
        for t in range(first, end):
            if ti.static(self.layer_norm):
                for m in range(self._items(lane, rows, C)):
                    e = lane + m * self.lanes
                    self._early_sums(arena, weights, io, sh, t, row0 + e // C, e % C)
                self._sync()
                for m in range(self._items(lane, rows, 1)):
                    b = row0 + lane + m * self.lanes
                    for g in ti.static(self.early_gates):
                        self._statistics(arena, weights, io, sh, g, b)
                self._sync()
                for m in range(self._items(lane, rows, C)):
                    e = lane + m * self.lanes
                    self._cell_update(arena, weights, io, sh, t, row0 + e // C, e % C)
                self._sync()
                for m in range(self._items(lane, rows, 1)):
                    self._statistics(arena, weights, io, sh, 3, row0 + lane + m * self.lanes)
                self._sync()
                for m in range(self._items(lane, rows, C)):
                    e = lane + m * self.lanes
                    self._output_gate(arena, weights, io, sh, row0 + e // C, e % C)
            else:
                for m in range(self._items(lane, rows, C)):
                    e = lane + m * self.lanes
                    self._gates(arena, weights, io, sh, t, row0 + e // C, e % C)
            self._sync()
            for m in range(self._items(lane, rows, O)):
                e = lane + m * self.lanes
                self._emit(arena, weights, io, sh, t, row0 + e // O, e % O)
            self._sync()

    @ti.func
    def _carry(self, arena: ti.template(), weights: ti.template(), io: ti.template(),
               sh: ti.template(), lane, to_shared: ti.template()):
        """The block's h and c between shared memory and the scratch buffer (same offsets), at
        the edge of a chunk of time steps."""
        for m in range(self._items(lane, self.B, self.n_output)):
            i = self.h_off + lane + m * self.lanes
            if ti.static(to_shared):
                sh[i] = self.s.load(arena, weights, io, i)
            else:
                self.s.store(arena, io, i, sh[i])
        for m in range(self._items(lane, self.B, self.n_cell)):
            i = self.c_off + lane + m * self.lanes
            if ti.static(to_shared):
                sh[i] = self.s.load(arena, weights, io, i)
            else:
                self.s.store(arena, io, i, sh[i])
        self._sync()

    @ti.func
    def _write_state(self, arena: ti.template(), weights: ti.template(), io: ti.template(),
                     sh: ti.template(), lane, row0, rows):
        """The last h and c into output_state and cell_state, where the delegate keeps them
        (after every step's reads of the first state: the loop above ends on a barrier)."""
        if ti.static(self.writes_h):
            for m in range(self._items(lane, rows, self.n_output)):
                e = lane + m * self.lanes
                i = (row0 + e // self.n_output) * self.n_output + e % self.n_output
                self.h_last.store(arena, io, i, self._ld(arena, weights, io, sh, self.h_off + i))
        if ti.static(self.writes_c):
            for m in range(self._items(lane, rows, self.n_cell)):
                e = lane + m * self.lanes
                i = (row0 + e // self.n_cell) * self.n_cell + e % self.n_cell
                self.c_last.store(arena, io, i, self._ld(arena, weights, io, sh, self.c_off + i))

    @ti.func
    def run(self, arena: ti.template(), weights: ti.template(), io: ti.template()):
        if ti.static(self.shared):
            for c in ti.static(range(len(self.chunks))):   # a top-level loop (dispatch) each
                ti.loop_config(block_dim=self.lanes)
                for lane in range(self.lanes):            # one block: every batch row
                    sh = ti.simt.block.SharedArray((self.state_size,), ti.f32)
                    if ti.static(self.chunks[c][0] > 0):
                        self._carry(arena, weights, io, sh, lane, True)
                    self._sequence(arena, weights, io, sh, lane, 0, self.B, self.chunks[c][0],
                                   self.chunks[c][1])
                    if ti.static(self.chunks[c][1] < self.T):
                        self._carry(arena, weights, io, sh, lane, False)
                    else:
                        self._write_state(arena, weights, io, sh, lane, 0, self.B)
        else:
            for b in range(self.B):                   # a thread per batch row
                self._sequence(arena, weights, io, self.s, 0, b, 1, 0, self.T)
                self._write_state(arena, weights, io, self.s, 0, b, 1)


def _full_scratch(node):
    if node.options.kernel_type == KERNEL_BASIC:
        B = basic_layout(node)
        return B.n_batch * 4 * B.n_output
    return _state_layout(layout(node))[1]


# -- the BASIC kernel: three parallel loops ----------------------------------------------------
@ti.data_oriented
class BasicLstmStep:
    """concat (one thread per element), the gate sums activ (one thread per row and gate unit:
    written to its output and to scratch), then state and activation (one per row and unit)."""

    def __init__(self, B, refs, outs, scratch):
        self.x, self.h, self.w, self.bias, self.c = refs
        self.out_h, self.out_c, self.out_concat, self.out_activ = outs
        self.s = scratch
        self.B, self.I, self.O = B.n_batch, B.n_input, B.n_output

    @ti.func
    def _concat(self, arena: ti.template(), weights: ti.template(), io: ti.template(), b, j):
        v = 0.0
        if j < self.I:
            v = self.x.load(arena, weights, io, b * self.I + j)
        else:
            v = self.h.load(arena, weights, io, b * self.O + j - self.I)
        return v

    @ti.func
    def run(self, arena: ti.template(), weights: ti.template(), io: ti.template()):
        depth = self.I + self.O
        for b, j in ti.ndrange(self.B, depth):
            self.out_concat.store(arena, io, b * depth + j, self._concat(arena, weights, io, b, j))
        for b, u in ti.ndrange(self.B, 4 * self.O):
            acc = self.bias.load(arena, weights, io, u)
            for j in range(depth):
                acc += (self.w.load(arena, weights, io, u * depth + j)
                        * self._concat(arena, weights, io, b, j))
            self.out_activ.store(arena, io, b * 4 * self.O + u, acc)
            self.s.store(arena, io, b * 4 * self.O + u, acc)
        for b, k in ti.ndrange(self.B, self.O):
            base = b * 4 * self.O + k
            i = _sigmoid_ti(self.s.load(arena, weights, io, base))
            g = _cell_act(self.s.load(arena, weights, io, base + self.O), ACT_TANH)
            f = _sigmoid_ti(self.s.load(arena, weights, io, base + 2 * self.O))
            o = _sigmoid_ti(self.s.load(arena, weights, io, base + 3 * self.O))
            state = i * g + f * self.c.load(arena, weights, io, b * self.O + k)
            self.out_c.store(arena, io, b * self.O + k, state)
            self.out_h.store(arena, io, b * self.O + k, o * _cell_act(state, ACT_TANH))


def _taichi(node, io):
    if node.options.kernel_type == KERNEL_BASIC:
        return BasicLstmStep(basic_layout(node), io.inputs, io.outputs, io.scratch)
    return SequenceLstmStep(layout(node), node.options, io.inputs, io.outputs[0], io.scratch,
                            shared=_state_in_shared_memory(node, io.arch), state=io.state,
                            arch=io.arch)


def _state_in_shared_memory(node, arch: str) -> bool:
    """Whether the state lives in block-shared memory (one block of MAX_LANES threads, with
    barriers) or, where the arch has none or the state does not fit MAX_SHARED_FLOATS, in the
    scratch buffer with a thread per batch row."""
    return block_barriers(arch) and _state_layout(layout(node))[1] <= MAX_SHARED_FLOATS


LSTM = register_op(OpDef(
    name="LSTM", infer=_infer, reference=_reference, parse=_parse, options_class="LSTMOptions",
    taichi=_taichi, scratch=_full_scratch, foldable=False,
    state_inputs=_state_inputs, taichi_writes_state=True, numpy_faster_on_cpu=True,
    litert_checks_omitted_inputs=True, min_inputs=5, max_inputs=24))

UNIDIRECTIONAL_SEQUENCE_LSTM = register_op(OpDef(
    name=SEQUENCE_OP, infer=_infer_sequence, reference=_reference, parse=_parse_sequence,
    options_class="UnidirectionalSequenceLSTMOptions", taichi=_taichi,
    scratch=_full_scratch, foldable=False, state_inputs=_state_inputs, taichi_writes_state=True,
    numpy_faster_on_cpu=True, litert_checks_omitted_inputs=True, min_inputs=20, max_inputs=24))
