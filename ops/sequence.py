"""Recurrent ops: LSTM (TFLite's builtin LSTM, kernel_type FULL), one time step.

Inputs, in TFLite's order (an omitted optional input is -1):
  0      input                [n_batch, n_input]
  1-4    input-to-gate weights [n_cell, n_input]    input (1) optional: absent = CIFG
  5-8    recurrent weights     [n_cell, n_output]   input (5) optional: absent = CIFG
  9-11   peephole weights      [n_cell]             optional, all or none (9 absent with CIFG)
  12-15  gate biases           [n_cell]             input (12) absent exactly with CIFG
  16     projection weights   [n_output, n_cell]    optional
  17     projection bias      [n_output]            optional, only with projection weights
  18     output_state         n_batch * n_output elements (a variable tensor)
  19     cell_state           n_batch * n_cell elements (a variable tensor)
  20-23  layer-norm coefficients [n_cell]           optional (the 24-input form); present
                                                    iff the forget one is (input one: not CIFG)
Output: [n_batch, n_output]. Options (LSTMOptions): fused_activation_function (the cell
activation, usually TANH), cell_clip and proj_clip (0: no clipping).

The semantics are those of TFLite's float kernel (lstm_eval's LstmStepFloat), per batch row:
  gate_g = W_g x + R_g h + (peephole: w_g * c, for i and f) + b_g
           (layer norm: normalize(W_g x + R_g h + peephole) * ln_g + b_g, where normalize
            subtracts the mean over the cells and divides by sqrt(variance + 1e-8))
  i = sigmoid(gate_i)   (CIFG: i = 1 - f)      f = sigmoid(gate_f)    g = act(gate_c)
  c' = f * c + i * g, clipped to [-cell_clip, cell_clip] when cell_clip > 0
  o = sigmoid(gate_o), its peephole reading the NEW cell state c'
  h' = o * act(c');  output = h' or, with projection, clip(P h' + p_b, proj_clip)
and the op writes output to the output tensor and into output_state, and c' into cell_state.

Differences from LiteRT, on purpose:
- With fused_activation_function NONE, LiteRT's ApplyActivationToVector writes nothing, so its
  h' = o * act(c') becomes o * g (the cell gate left in that scratch buffer). Here NONE is the
  identity: h' = o * c'. Converters emit TANH.
- A quantized LSTM runs as the float view like every op (LiteRT's integer LSTM computes gates
  in 16-bit fixed point with scales from the op's intermediate tensors); hybrid models (float
  input, 8-bit weights) compute with the dequantized weights rather than LiteRT's dynamically
  quantized input.

State: in TFLite, output_state and cell_state are variable tensors, zero when the interpreter
is allocated, then holding the previous invoke's state. Our runtime has no storage for
variable tensors yet and an op returns only its outputs, so this op computes one step from the
state values it is given (correct for a single invoke when they are zero); a model whose state
tensors are variable cannot be invoked until the runtime gives them values. `lstm_step`
returns the new states too, ready for when it can store them.
"""

from dataclasses import dataclass

import numpy as np

from .base import OpDef, register_op
from .common import ACT_TANH, apply_activation, check_activation
from .tiutil import activation, ti

# Input positions (TFLite's lstm_shared.h).
INPUT = 0
INPUT_TO_GATE = (1, 2, 3, 4)          # input, forget, cell, output gates
RECURRENT_TO_GATE = (5, 6, 7, 8)
CELL_TO_GATE = (9, 10, None, 11)      # peepholes: input, forget, (none for cell), output
GATE_BIAS = (12, 13, 14, 15)
PROJECTION_WEIGHTS, PROJECTION_BIAS = 16, 17
OUTPUT_STATE, CELL_STATE = 18, 19
LAYER_NORM = (20, 21, 22, 23)
GATE_NAMES = ("input", "forget", "cell", "output")
LAYER_NORM_EPSILON = np.float32(1e-8)   # lstm_eval's kNormalizationConstant

KERNEL_FULL, KERNEL_BASIC = 0, 1        # tflite.LSTMKernelType


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
class LstmLayout:
    """What an LSTM node's inputs say about its structure (validated by `layout`)."""
    n_batch: int
    n_input: int
    n_cell: int
    n_output: int
    cifg: bool
    peephole: bool
    projection: bool
    projection_bias: bool
    layer_norm: bool


def _present(node, i) -> bool:
    return i < len(node.inputs) and node.inputs[i] is not None


def layout(node) -> LstmLayout:
    """Validate an LSTM node as TFLite's Prepare does; ModelError naming the op otherwise."""
    opts = node.options
    if opts.kernel_type != KERNEL_FULL:
        raise node.fail("kernel_type BASIC (the 5-input LSTM cell) is not supported; "
                        "only the FULL kernel is")
    check_activation(node, opts.fused_activation_function)
    if not opts.cell_clip >= 0 or not opts.proj_clip >= 0:
        raise node.fail(f"cell_clip and proj_clip must be >= 0 (0: no clipping), got "
                        f"{opts.cell_clip} and {opts.proj_clip}")
    if len(node.inputs) not in (20, 24):
        raise node.fail(f"the FULL LSTM kernel takes 20 or 24 inputs, has {len(node.inputs)}")
    if len(node.outputs) != 1:
        raise node.fail(f"has {len(node.outputs)} outputs, the LSTM produces 1")

    def required(i, what):
        if not _present(node, i):
            raise node.fail(f"input {i} ({what}) is required")
        return node.inputs[i]

    def check_shape(i, what, shape):
        spec = node.inputs[i]
        if tuple(spec.shape) != tuple(shape):
            raise node.fail(f"{what} (input {i}) must have shape {list(shape)}, "
                            f"got {list(spec.shape)}")

    x = required(INPUT, "input")
    if x.rank != 2:
        raise node.fail(f"input must have rank 2 [n_batch, n_input], got shape {list(x.shape)}")
    n_batch, n_input = x.shape
    w_o = required(INPUT_TO_GATE[3], "input-to-output weights")
    if w_o.rank != 2:
        raise node.fail(f"input-to-output weights must have rank 2, got shape {list(w_o.shape)}")
    n_cell = w_o.shape[0]
    r_o = required(RECURRENT_TO_GATE[3], "recurrent-to-output weights")
    if r_o.rank != 2:
        raise node.fail(f"recurrent-to-output weights must have rank 2, got shape "
                        f"{list(r_o.shape)}")
    n_output = r_o.shape[1]

    cifg = not _present(node, INPUT_TO_GATE[0])
    if cifg != (not _present(node, RECURRENT_TO_GATE[0])):
        raise node.fail("input-to-input and recurrent-to-input weights must be both present "
                        "or both absent (CIFG)")
    if cifg != (not _present(node, GATE_BIAS[0])):
        raise node.fail("the input gate bias must be present exactly when the input gate "
                        "weights are (absent for CIFG)")
    for g, name in enumerate(GATE_NAMES):
        if g == 0 and cifg:
            continue
        required(INPUT_TO_GATE[g], f"input-to-{name} weights")
        check_shape(INPUT_TO_GATE[g], f"input-to-{name} weights", (n_cell, n_input))
        required(RECURRENT_TO_GATE[g], f"recurrent-to-{name} weights")
        check_shape(RECURRENT_TO_GATE[g], f"recurrent-to-{name} weights", (n_cell, n_output))
        required(GATE_BIAS[g], f"{name} gate bias")
        check_shape(GATE_BIAS[g], f"{name} gate bias", (n_cell,))

    peep = [_present(node, CELL_TO_GATE[g]) for g in (0, 1, 3)]
    peephole = peep[2]
    if cifg and peep[0]:
        raise node.fail("a CIFG LSTM has no input gate, so no cell-to-input (peephole) weights")
    if peep[1:] != [peephole, peephole] or (not cifg and peep[0] != peephole):
        raise node.fail("peephole (cell-to-gate) weights must be all present or all absent")
    for g in (0, 1, 3):
        if _present(node, CELL_TO_GATE[g]):
            check_shape(CELL_TO_GATE[g], f"cell-to-{GATE_NAMES[g]} weights", (n_cell,))

    projection = _present(node, PROJECTION_WEIGHTS)
    projection_bias = _present(node, PROJECTION_BIAS)
    if projection:
        check_shape(PROJECTION_WEIGHTS, "projection weights", (n_output, n_cell))
    elif projection_bias:
        raise node.fail("a projection bias needs projection weights")
    elif n_output != n_cell:
        raise node.fail(f"without projection the output size ({n_output}) must equal the "
                        f"number of cells ({n_cell})")
    if projection_bias:
        check_shape(PROJECTION_BIAS, "projection bias", (n_output,))

    layer_norm = len(node.inputs) == 24 and _present(node, LAYER_NORM[1])
    if layer_norm:
        for g, name in enumerate(GATE_NAMES):
            if g == 0 and cifg:
                if _present(node, LAYER_NORM[0]):
                    raise node.fail("a CIFG LSTM takes no input layer-norm coefficients")
                continue
            required(LAYER_NORM[g], f"{name} layer-norm coefficients")
            check_shape(LAYER_NORM[g], f"{name} layer-norm coefficients", (n_cell,))
    elif len(node.inputs) == 24 and any(_present(node, i) for i in LAYER_NORM):
        raise node.fail("layer-norm coefficients must be all present or all absent "
                        "(the forget gate's decides)")

    for i, spec in enumerate(list(node.inputs) + list(node.outputs)):
        if spec is not None and spec.quantization is None and spec.dtype is not None \
                and not np.issubdtype(np.dtype(spec.dtype), np.floating):
            where = f"input {i}" if i < len(node.inputs) else "the output"
            raise node.fail(f"{where} ('{spec.name}') is {np.dtype(spec.dtype).name}: LSTM "
                            "tensors are float, or quantized integers")

    for i, what, n in ((OUTPUT_STATE, "output_state", n_batch * n_output),
                       (CELL_STATE, "cell_state", n_batch * n_cell)):
        spec = required(i, what)
        size = int(np.prod(spec.shape, dtype=np.int64))
        if size != n:
            raise node.fail(f"{what} (input {i}) must hold {n} elements, got shape "
                            f"{list(spec.shape)}")
    return LstmLayout(n_batch, n_input, n_cell, n_output, cifg, peephole, projection,
                      projection_bias, layer_norm)


def _infer(node):
    shape = layout(node)
    return [(shape.n_batch, shape.n_output)]


def _sigmoid(x):
    with np.errstate(over="ignore"):
        return (np.float32(1) / (np.float32(1) + np.exp(-x))).astype(np.float32)


def _normalize(x):
    """lstm_eval's MeanStddevNormalization along the cells of each batch row."""
    mean = np.mean(x, axis=1, keepdims=True, dtype=np.float32)
    variance = np.mean(np.square(x - mean), axis=1, keepdims=True, dtype=np.float32)
    return ((x - mean) / np.sqrt(variance + LAYER_NORM_EPSILON)).astype(np.float32)


def lstm_step(node, inputs):
    """One LSTM step on the float view: (output, new output_state, new cell_state), shaped
    [n_batch, n_output], like output_state's tensor, like cell_state's tensor."""
    L = layout(node)
    f32 = lambda a: None if a is None else np.asarray(a, np.float32)   # noqa: E731
    get = lambda i: f32(inputs[i]) if i is not None and i < len(inputs) else None  # noqa: E731
    x = get(INPUT)
    h = get(OUTPUT_STATE).reshape(L.n_batch, L.n_output)
    c = get(CELL_STATE).reshape(L.n_batch, L.n_cell)
    act = node.options.fused_activation_function

    def gate(g, cell):
        pre = x @ get(INPUT_TO_GATE[g]).T + h @ get(RECURRENT_TO_GATE[g]).T
        if L.peephole and CELL_TO_GATE[g] is not None:
            pre = pre + get(CELL_TO_GATE[g]) * cell
        if L.layer_norm:
            pre = _normalize(pre) * get(LAYER_NORM[g])
        return (pre + get(GATE_BIAS[g])).astype(np.float32)

    f = _sigmoid(gate(1, c))
    i = np.float32(1) - f if L.cifg else _sigmoid(gate(0, c))
    g = apply_activation(gate(2, None), act)
    c_new = f * c + i * g
    if node.options.cell_clip > 0:
        clip = np.float32(node.options.cell_clip)
        c_new = np.clip(c_new, -clip, clip)
    o = _sigmoid(gate(3, c_new))
    h_new = (o * apply_activation(c_new, act)).astype(np.float32)
    if L.projection:
        out = h_new @ get(PROJECTION_WEIGHTS).T
        if L.projection_bias:
            out = out + get(PROJECTION_BIAS)
        if node.options.proj_clip > 0:
            clip = np.float32(node.options.proj_clip)
            out = np.clip(out, -clip, clip)
    else:
        out = h_new
    out = out.astype(np.float32)
    return (out, out.reshape(node.inputs[OUTPUT_STATE].shape),
            c_new.astype(np.float32).reshape(node.inputs[CELL_STATE].shape))


def _reference(node, inputs):
    return [lstm_step(node, inputs)[0]]


# -- Taichi ----------------------------------------------------------------------------------
# Without projection: one thread per (batch row, cell) computes the four gates (dot products
# over the input and the previous output state), the new cell state and the output, in one
# parallel loop. With projection: one thread per (batch row, output unit) recomputes the cell
# outputs it projects, since a step has no scratch buffer to keep h' in between two loops
# (n_output times the gate work: refused above MAX_PROJECTED_OUTPUTS).
# Layer norm needs statistics over all cells of a row before any gate is final: refused.
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


@ti.data_oriented
class LstmStep:
    def __init__(self, L, opts, refs, out):
        self.L, self.out = L, out
        self.act = int(opts.fused_activation_function)
        self.cell_clip = float(opts.cell_clip)
        self.proj_clip = float(opts.proj_clip)
        self.cifg, self.peephole = L.cifg, L.peephole
        self.projection, self.projection_bias = L.projection, L.projection_bias
        self.n_input, self.n_cell, self.n_output = L.n_input, L.n_cell, L.n_output
        self.x, self.h, self.c = refs[INPUT], refs[OUTPUT_STATE], refs[CELL_STATE]
        # per gate (input, forget, cell, output); the input gate's are unused with CIFG
        self.w = tuple(refs[i] for i in INPUT_TO_GATE)
        self.r = tuple(refs[i] for i in RECURRENT_TO_GATE)
        self.b = tuple(refs[i] for i in GATE_BIAS)
        self.p = tuple(refs[i] if i is not None else None for i in CELL_TO_GATE)
        self.proj_w = refs[PROJECTION_WEIGHTS]
        self.proj_b = refs[PROJECTION_BIAS]
        self.loop = (L.n_batch, L.n_output if L.projection else L.n_cell)

    @ti.func
    def _gate(self, arena: ti.template(), weights: ti.template(), io: ti.template(),
              g: ti.template(), b, k):
        """W_g x + R_g h + bias for batch row b, cell k (no peephole, no activation)."""
        acc = self.b[g].load(arena, weights, io, k)
        for j in range(self.n_input):
            acc += (self.w[g].load(arena, weights, io, k * self.n_input + j)
                    * self.x.load(arena, weights, io, b * self.n_input + j))
        for j in range(self.n_output):
            acc += (self.r[g].load(arena, weights, io, k * self.n_output + j)
                    * self.h.load(arena, weights, io, b * self.n_output + j))
        return acc

    @ti.func
    def _cell(self, arena: ti.template(), weights: ti.template(), io: ti.template(), b, k):
        """h' of batch row b, cell k."""
        c_prev = self.c.load(arena, weights, io, b * self.n_cell + k)
        pre_f = self._gate(arena, weights, io, 1, b, k)
        if ti.static(self.peephole):
            pre_f += self.p[1].load(arena, weights, io, k) * c_prev
        f = _sigmoid_ti(pre_f)
        i = 1.0 - f
        if ti.static(not self.cifg):
            pre_i = self._gate(arena, weights, io, 0, b, k)
            if ti.static(self.peephole):
                pre_i += self.p[0].load(arena, weights, io, k) * c_prev
            i = _sigmoid_ti(pre_i)
        g = _cell_act(self._gate(arena, weights, io, 2, b, k), self.act)
        c_new = f * c_prev + i * g
        if ti.static(self.cell_clip > 0):
            c_new = ti.min(ti.max(c_new, -self.cell_clip), self.cell_clip)
        pre_o = self._gate(arena, weights, io, 3, b, k)
        if ti.static(self.peephole):
            pre_o += self.p[3].load(arena, weights, io, k) * c_new
        return _sigmoid_ti(pre_o) * _cell_act(c_new, self.act)

    @ti.func
    def run(self, arena: ti.template(), weights: ti.template(), io: ti.template()):
        for b, n in ti.ndrange(*self.loop):
            r = 0.0
            if ti.static(self.projection):
                if ti.static(self.projection_bias):
                    r = self.proj_b.load(arena, weights, io, n)
                for k in range(self.n_cell):
                    r += (self.proj_w.load(arena, weights, io, n * self.n_cell + k)
                          * self._cell(arena, weights, io, b, k))
                if ti.static(self.proj_clip > 0):
                    r = ti.min(ti.max(r, -self.proj_clip), self.proj_clip)
            else:
                r = self._cell(arena, weights, io, b, n)
            self.out.store(arena, io, b * self.n_output + n, r)


def _taichi(node, io):
    return LstmStep(layout(node), node.options, io.inputs, io.outputs[0])


# With projection, each output thread recomputes the n_cell cell outputs it projects: beyond
# this many outputs per row that redundancy (n_output times the gate work) costs more than the
# CPU path, so the op stays there.
MAX_PROJECTED_OUTPUTS = 32


def _supports(node):
    L = layout(node)
    if L.layer_norm:
        return ("layer-norm LSTM: its gates need mean and variance over all cells of a row "
                "first, and a step has no scratch buffer to hold them")
    if L.projection and L.n_output > MAX_PROJECTED_OUTPUTS:
        return (f"projection to {L.n_output} outputs: without a scratch buffer for the cell "
                f"outputs each output recomputes them (the delegate takes up to "
                f"{MAX_PROJECTED_OUTPUTS})")
    return None


LSTM = register_op(OpDef(
    name="LSTM", infer=_infer, reference=_reference, parse=_parse, options_class="LSTMOptions",
    taichi=_taichi, supports=_supports, foldable=False, min_inputs=20, max_inputs=24))
