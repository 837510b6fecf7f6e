"""Where an LSTM cell's tensors sit among a node's inputs (TFLite's lstm_shared.h) and their
validation as TFLite's Prepare does it: what the reference, the Taichi steps and
BIDIRECTIONAL_SEQUENCE_LSTM (ops/recurrent.py) read a node's structure from.
"""
from dataclasses import dataclass, replace
from typing import Optional

import numpy as np

from ..common import check_activation

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

