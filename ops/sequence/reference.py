"""The LSTMs' numpy reference on the float view (the CPU fallback and the ground truth the
Taichi steps are held to): TFLite's float kernel (lstm_eval's LstmStepFloat) step by step, and
the BASIC cell; the package's __init__ states the equations.
"""
import numpy as np

from ..common import apply_activation
from .layout import (AUX_INPUT_TO_GATE, CELL_STATE, CELL_TO_GATE, GATE_BIAS, INPUT, INPUT_TO_GATE,
                     KERNEL_BASIC, LAYER_NORM, LAYER_NORM_EPSILON, OUTPUT_STATE, PROJECTION_BIAS,
                     PROJECTION_WEIGHTS, RECURRENT_TO_GATE, basic_layout, layout)


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


def getter(inputs):
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
    get = getter(inputs)
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


def reference_lstm(node, inputs):
    """The outputs, then (FULL kernel) the new output_state and cell_state, which the runtime
    stores into those inputs when they are variable tensors (OpDef.state.state_inputs)."""
    if node.options.kernel_type == KERNEL_BASIC:
        return basic_lstm_cell(node, inputs)
    return list(sequence_lstm(node, inputs))

