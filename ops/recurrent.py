"""Speech and sequence ops: SVDF, RNN, UNIDIRECTIONAL_SEQUENCE_RNN and
BIDIRECTIONAL_SEQUENCE_LSTM. CPU only: the official GPU delegate has none of them, and each
keeps state across invokes in variable tensors (OpDef.state.state_inputs; the runtime stores the
new states the reference returns after its outputs, as it does for ops/sequence/'s LSTMs).

Three kinds of instance, as LiteRT's kernels (tensorflow/lite/kernels/svdf.cc, basic_rnn.cc,
unidirectional_sequence_rnn.cc, bidirectional_sequence_lstm.cc):
- float: every tensor float32.
- hybrid: float32 input, state and output with int8 weight matrices (per-tensor symmetric:
  LiteRT reads one scale, so per-channel weights are refused). LiteRT quantizes each vector a
  weight matrix multiplies on the fly, per batch row, and so does the reference here
  (`dynamic_quantize`, the same float32 arithmetic as tensor_utils' SymmetricQuantizeFloats /
  AsymmetricQuantizeFloats): symmetric s = max|v| / 127, q = round(v / s) in [-127, 127], or
  with the op's asymmetric_quantize_inputs s = (max(v, 0) - min(v, 0)) / 255 and a nudged
  zero point, q in [-128, 127]; an all-zero row gives q = 0. The product is then the int8 dot
  product times s and the weight scale, which is the dequantized weights times (q - zp) s.
  Biases, peepholes and SVDF's weights_time are used dequantized (LiteRT dequantizes them).
- integer (SVDF only; LiteRT has no other): int8 input, weights_feature and output, int16
  weights_time and activation state (symmetric), int32 bias; run on the float view, the new
  state column snapped to the state's int16 grid before the time weights read it, as LiteRT's
  integer kernel stores it.

SVDF (inputs: input [B, I], weights_feature [F, I], weights_time [F, M], bias [U] optional,
activation_state [B, F * M] variable; output [B, U] with U = F / rank): per invoke, each
filter's memory of M values shifts left by one and takes W_f x as its newest (last) value;
output = act(bias + the sum over each unit's `rank` consecutive filters of
sum_m state[f, m] * weights_time[f, m]). After the invoke the state holds the shifted memory,
newest value included (LiteRT >= 2.4's order; older kernels shifted after the output).
LiteRT's integer kernel requires fused_activation_function RELU, yet applies no ReLU: it clamps
the rescaled output to the int8 range only (measured: negative outputs come back), and so does
the integer kernel here; the bias is read at scale s_state * s_weights_time whatever its own
scale says (LiteRT adds the raw int32 values to that accumulator).

RNN (inputs: input [B, I], weights [U, I], recurrent_weights [U, U], bias [U], hidden_state
[B, U] variable; output [B, U]): h' = act(W x + R h + bias), which is the output and the new
hidden state. UNIDIRECTIONAL_SEQUENCE_RNN: the same cell over time (input [T, B, I] when
time_major, else [B, T, I]; output likewise with U last), the state carried between steps and
invokes.

BIDIRECTIONAL_SEQUENCE_LSTM (48 inputs): a forward and a backward FULL-kernel LSTM cell
(ops/sequence/'s cell math, no layer norm) over the sequence, the backward one from the last
step to the first, each step's output written at its own step:
  0 input [T, B, I] (time_major, the default) or [B, T, I];  1-17 forward cell (sequence.py's
  positions 1-17);  18-34 backward cell (likewise);  35, 36 forward output and cell state;
  37, 38 backward output and cell state (variables);  39 aux_input (optional);  40-43 forward
  and 44-47 backward auxiliary input-to-gate weights (optional, all or none).
With aux weights, aux_input [T, B, I_aux] adds W_aux aux_x to every gate of both cells
("cross-linked" stacking); with aux_input but no aux weights the backward cell reads aux_input
instead of input (the previous layer's backward output), which must then have input's shape.
Outputs: forward [.., n_fw_output] and backward [.., n_bw_output]; with merge_outputs one
output [.., n_fw_output + n_bw_output], the forward part first. Options as the LSTM's
(fused_activation_function, cell_clip, proj_clip) plus merge_outputs and time_major.
With fused_activation_function NONE the cells follow sequence.py (identity), not LiteRT's
o * g quirk described there; the tests draw the other activations. As LiteRT's Prepare (which
checks both cells' tensors against one size), the two cells must have the same n_cell and
n_output; in a hybrid op every weight matrix and peephole is int8 (LiteRT checks they share
one type), biases float32.

Where LiteRT 2.3 is off (the tests hold these cases to the formulas above instead):
- BIDIRECTIONAL_SEQUENCE_LSTM with merge_outputs and batch-major data (time_major false) and
  more than one batch row leaves the backward half of every row but the first unwritten
  (garbage that changes between runs); the tests compare with its unmerged twin.
- The integer SVDF sums state x weights_time in an int32 that wraps past 2^31 (seen: -128
  where the real sum is far above the int8 range); here the sum does not wrap and the output
  saturates. The tests keep weights_time's integers small enough never to wrap.

State: as sequence.py's LSTMs, the state inputs are variable tensors in LiteRT (zero at
allocate, then each invoke's last state); given as ordinary inputs instead, the ops compute
from the values given and the runtime keeps nothing.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from functools import partial

import numpy as np

from tflite_taichi.quant import fake_quant
from . import sequence as lstm
from .base import OpDef, State, register_op
from .common import ACT_RELU, apply_activation, check_activation


# -- options -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class SVDFOptions:
    rank: int = 1
    fused_activation_function: int = 0
    asymmetric_quantize_inputs: bool = False


@dataclass(frozen=True)
class RNNOptions:
    fused_activation_function: int = 0
    asymmetric_quantize_inputs: bool = False
    time_major: bool = True          # UNIDIRECTIONAL_SEQUENCE_RNN only


@dataclass(frozen=True)
class BidirectionalLSTMOptions:
    fused_activation_function: int = 0
    cell_clip: float = 0.0
    proj_clip: float = 0.0
    merge_outputs: bool = False
    time_major: bool = True
    asymmetric_quantize_inputs: bool = False


def _parse_svdf(opts) -> SVDFOptions:
    return SVDFOptions(int(opts.Rank()), int(opts.FusedActivationFunction()),
                       bool(opts.AsymmetricQuantizeInputs()))


def _parse_rnn(opts) -> RNNOptions:
    return RNNOptions(int(opts.FusedActivationFunction()), bool(opts.AsymmetricQuantizeInputs()))


def _parse_sequence_rnn(opts) -> RNNOptions:
    return RNNOptions(int(opts.FusedActivationFunction()), bool(opts.AsymmetricQuantizeInputs()),
                      bool(opts.TimeMajor()))


def _parse_bidirectional(opts) -> BidirectionalLSTMOptions:
    return BidirectionalLSTMOptions(int(opts.FusedActivationFunction()), float(opts.CellClip()),
                                    float(opts.ProjClip()), bool(opts.MergeOutputs()),
                                    bool(opts.TimeMajor()), bool(opts.AsymmetricQuantizeInputs()))


# -- hybrid kernels: LiteRT's on-the-fly input quantization ------------------------------------
def _round_half_away(v: np.ndarray) -> np.ndarray:
    """std::round of float32 values, exactly (float64: |v| + 0.5 does not round up)."""
    v = np.asarray(v, np.float64)
    return np.sign(v) * np.floor(np.abs(v) + 0.5)


def _symmetric_rows(rows: np.ndarray):
    """SymmetricQuantizeFloats per row: (q, scale, zero point 0), float32 arithmetic."""
    value_range = np.max(np.abs(rows), axis=1, keepdims=True, initial=np.float32(0))
    zero = value_range == 0
    safe = np.where(zero, np.float32(1), value_range)
    scale = np.where(zero, np.float32(1), safe / np.float32(127)).astype(np.float32)
    inverse = (np.float32(127) / safe).astype(np.float32)
    q = np.clip(_round_half_away((rows * inverse).astype(np.float32)), -127, 127)
    return np.where(zero, 0, q), scale, np.zeros_like(scale)


def _asymmetric_rows(rows: np.ndarray):
    """AsymmetricQuantizeFloats per row: the scale in double, rounded to float32, the zero
    point nudged into [-128, 127], q = round(zp + v / s) in float32."""
    rmin = np.minimum(np.min(rows, axis=1, keepdims=True, initial=np.float32(0)), 0)
    rmax = np.maximum(np.max(rows, axis=1, keepdims=True, initial=np.float32(0)), 0)
    rmin, rmax = rmin.astype(np.float64), rmax.astype(np.float64)
    empty = rmin == rmax
    scale64 = np.where(empty, 1.0, (rmax - rmin) / 255.0)
    from_min, from_max = -128.0 - rmin / scale64, 127.0 - rmax / scale64
    use_min = 128.0 + np.abs(rmin / scale64) < 127.0 + np.abs(rmax / scale64)
    zp = np.where(use_min, from_min, from_max)
    zp = np.where(zp <= -128, -128, np.where(zp >= 127, 127, _round_half_away(zp)))
    zp = np.where(empty, 0, zp).astype(np.float32)
    scale = scale64.astype(np.float32)
    inverse = (1.0 / scale.astype(np.float64)).astype(np.float32)
    q = np.clip(_round_half_away((zp + rows * inverse).astype(np.float32)), -128, 127)
    return np.where(empty, 0, q), scale, zp


def dynamic_quantize(v, asymmetric: bool) -> np.ndarray:
    """v [..., K] as LiteRT's hybrid kernels see it: each row of K values quantized to int8 on
    the fly (see the module docstring), given back as (q - zp) * s in float64."""
    v = np.asarray(v, np.float32)
    rows = v.reshape(-1, v.shape[-1]) if v.size else v.reshape(0, max(v.shape[-1], 1))
    q, scale, zp = (_asymmetric_rows if asymmetric else _symmetric_rows)(rows)
    return ((q - zp) * scale.astype(np.float64)).reshape(v.shape)


# -- checks shared by the ops ------------------------------------------------------------------
def _dtype(spec):
    return None if spec is None or spec.dtype is None else np.dtype(spec.dtype)


def _is_float32(spec) -> bool:
    return _dtype(spec) == np.float32 and spec.quantization is None


def _is_int8_weights(spec) -> bool:
    return _dtype(spec) == np.int8 and spec.quantization is not None


def _describe(spec) -> str:
    dtype = _dtype(spec)
    name = dtype.name if dtype is not None else "untyped"
    return f"{name}{' quantized' if spec.quantization is not None else ''}"


def _require(node, i, what):
    spec = node.inputs[i] if i < len(node.inputs) else None
    if spec is None:
        raise node.fail(f"input {i} ({what}) is required")
    return spec


def _check_shape(node, i, what, shape):
    spec = node.inputs[i]
    if tuple(spec.shape) != tuple(shape):
        raise node.fail(f"{what} '{spec.name}' (input {i}) must have shape {list(shape)}, got "
                        f"{list(spec.shape)}")


def _check_rank(node, i, what, rank, form):
    spec = node.inputs[i]
    if spec.rank != rank:
        raise node.fail(f"{what} '{spec.name}' (input {i}) must have rank {rank} {form}, got "
                        f"shape {list(spec.shape)}")


def _weights_kind(node, weights: dict, activations: dict) -> str:
    """'float' (all float32) or 'hybrid' (float32 activations, int8 per-tensor weights):
    weights and activations map input positions (or output positions, as 'output k') to what
    they are; ModelError naming the tensor otherwise."""
    def spec_at(key):
        return node.outputs[int(key[7:])] if isinstance(key, str) else node.inputs[key]

    for key, what in activations.items():
        spec = spec_at(key)
        if spec is not None and not _is_float32(spec):
            raise node.fail(f"{what} '{spec.name}' is {_describe(spec)}; this op takes float32 "
                            "here (int8 weights with float32 activations: a hybrid op)")
    present = {i: node.inputs[i] for i in weights if node.inputs[i] is not None}
    hybrid = [i for i, spec in present.items() if _is_int8_weights(spec)]
    if not hybrid:
        for i, spec in present.items():
            if not _is_float32(spec):
                raise node.fail(f"{weights[i]} '{spec.name}' (input {i}) is {_describe(spec)}; "
                                "expected float32 or quantized int8 weights")
        return "float"
    for i, spec in present.items():
        if not _is_int8_weights(spec):
            raise node.fail(f"{weights[i]} '{spec.name}' (input {i}) is {_describe(spec)}: a "
                            "hybrid op's weight matrices are all quantized int8")
        if spec.quantization.per_channel:
            raise node.fail(f"{weights[i]} '{spec.name}' (input {i}) has per-channel scales; "
                            "LiteRT's hybrid kernel reads one scale per tensor")
        if np.any(spec.quantization.zero_point != 0):
            raise node.fail(f"{weights[i]} '{spec.name}' (input {i}) must be symmetric "
                            "(zero point 0)")
    return "hybrid"


def _check_output_dtype(node, k, kind):
    spec = node.outputs[k]
    if kind != "integer" and not _is_float32(spec):
        raise node.fail(f"output '{spec.name}' is {_describe(spec)}; expected float32")


def _product(kind: str, asymmetric: bool):
    """v [B, K], w [N, K] -> v w^T as the kernel computes it (hybrid: v quantized first)."""
    if kind != "hybrid":
        return lambda v, w: np.asarray(v, np.float32) @ np.asarray(w, np.float32).T
    return lambda v, w: dynamic_quantize(v, asymmetric) @ np.asarray(w, np.float64).T


def _activate(x, act):
    return apply_activation(np.asarray(x, np.float32), act).astype(np.float32)


# -- SVDF -----------------------------------------------------------------------------------------
SVDF_INPUT, SVDF_FEATURE, SVDF_TIME, SVDF_BIAS, SVDF_STATE = range(5)


@dataclass(frozen=True)
class SvdfLayout:
    n_batch: int
    n_input: int
    n_filter: int
    n_memory: int
    n_unit: int
    kind: str            # 'float', 'hybrid' or 'integer'


def svdf_layout(node) -> SvdfLayout:
    """Validate an SVDF node as svdf.cc's Prepare does."""
    opts = node.options
    check_activation(node, opts.fused_activation_function)
    if len(node.outputs) != 1:
        raise node.fail(f"has {len(node.outputs)} outputs, SVDF produces 1")
    x = _require(node, SVDF_INPUT, "input")
    wf = _require(node, SVDF_FEATURE, "weights_feature")
    wt = _require(node, SVDF_TIME, "weights_time")
    _require(node, SVDF_STATE, "activation_state")
    _check_rank(node, SVDF_INPUT, "input", 2, "[n_batch, n_input]")
    _check_rank(node, SVDF_FEATURE, "weights_feature", 2, "[n_filter, n_input]")
    _check_rank(node, SVDF_TIME, "weights_time", 2, "[n_filter, memory_size]")
    n_batch, n_input = x.shape
    n_filter, n_memory = wf.shape[0], wt.shape[1]
    if opts.rank < 1 or n_filter % opts.rank:
        raise node.fail(f"rank {opts.rank} must be >= 1 and divide the {n_filter} filters of "
                        f"weights_feature '{wf.name}'")
    n_unit = n_filter // opts.rank
    _check_shape(node, SVDF_FEATURE, "weights_feature", (n_filter, n_input))
    _check_shape(node, SVDF_TIME, "weights_time", (n_filter, n_memory))
    if node.inputs[SVDF_BIAS] is not None:
        _check_shape(node, SVDF_BIAS, "bias", (n_unit,))
    _check_shape(node, SVDF_STATE, "activation_state", (n_batch, n_filter * n_memory))
    if _dtype(x) == np.int8 and x.quantization is not None:
        kind = _check_integer_svdf(node)
    else:
        kind = _weights_kind(node, {SVDF_FEATURE: "weights_feature", SVDF_TIME: "weights_time"},
                             {SVDF_INPUT: "input", SVDF_BIAS: "bias",
                              SVDF_STATE: "activation_state"})
        _check_output_dtype(node, 0, kind)
    return SvdfLayout(n_batch, n_input, n_filter, n_memory, n_unit, kind)


def _check_integer_svdf(node) -> str:
    """The full-integer SVDF LiteRT has: int8 input/weights_feature/output, int16
    weights_time/state, int32 bias; per-tensor scales; zero points 0 but the input's and
    the output's; fused activation RELU (LiteRT refuses others)."""
    want = {SVDF_FEATURE: ("weights_feature", np.int8), SVDF_TIME: ("weights_time", np.int16),
            SVDF_BIAS: ("bias", np.int32), SVDF_STATE: ("activation_state", np.int16)}
    for i, (what, dtype) in want.items():
        spec = node.inputs[i]
        if spec is None:
            continue
        if _dtype(spec) != dtype or spec.quantization is None:
            raise node.fail(f"{what} '{spec.name}' (input {i}) is {_describe(spec)}; the int8 "
                            f"SVDF takes it quantized {np.dtype(dtype).name}")
    out = node.outputs[0]
    if _dtype(out) != np.int8 or out.quantization is None:
        raise node.fail(f"output '{out.name}' is {_describe(out)}; the int8 SVDF gives "
                        "quantized int8")
    for spec in [s for s in node.inputs if s is not None] + [out]:
        if spec.quantization.per_channel:
            raise node.fail(f"tensor '{spec.name}' has per-channel scales; the int8 SVDF "
                            "reads one scale per tensor")
    for i in (SVDF_FEATURE, SVDF_TIME, SVDF_STATE):
        if np.any(node.inputs[i].quantization.zero_point != 0):
            raise node.fail(f"'{node.inputs[i].name}' (input {i}) must be symmetric (zero "
                            "point 0) in the int8 SVDF")
    if node.options.fused_activation_function != ACT_RELU:
        raise node.fail("the int8 SVDF takes fused_activation_function RELU only (as LiteRT)")
    return "integer"


def _infer_svdf(node):
    L = svdf_layout(node)
    return [(L.n_batch, L.n_unit)]


def _scale(spec) -> float:
    return float(spec.quantization.scale.reshape(-1)[0])


def _reference_svdf(node, inputs):
    L = svdf_layout(node)
    opts = node.options
    x, wf, wt = (np.asarray(inputs[i], np.float32) for i in (0, 1, 2))
    memory = np.asarray(inputs[SVDF_STATE], np.float32).reshape(L.n_batch, L.n_filter, L.n_memory)
    newest = _product(L.kind, opts.asymmetric_quantize_inputs)(x, wf)
    if L.kind == "integer":     # LiteRT stores the new column as int16 before reading it
        spec = node.inputs[SVDF_STATE]
        newest = fake_quant(np.asarray(newest, np.float32), spec.quantization, spec.dtype)
    memory = np.concatenate([memory[:, :, 1:], np.asarray(newest, np.float32)[:, :, None]], axis=2)
    per_filter = np.einsum("bfm,fm->bf", memory.astype(np.float64), wt.astype(np.float64))
    out = per_filter.reshape(L.n_batch, L.n_unit, opts.rank).sum(axis=2)
    bias = _svdf_bias(node, inputs[SVDF_BIAS], L)
    if bias is not None:
        out = out + bias
    if L.kind == "integer":     # LiteRT's integer kernel clamps to int8 only: see the docstring
        out = out.astype(np.float32)
    else:
        out = _activate(out, opts.fused_activation_function)
    return [out, memory.reshape(node.inputs[SVDF_STATE].shape)]


def _svdf_bias(node, bias, L):
    """The bias as the kernel adds it: the int8 kernel reads the int32 data at scale
    s_state * s_weights_time."""
    if bias is None:
        return None
    bias = np.asarray(bias, np.float64)
    if L.kind != "integer":
        return bias
    spec = node.inputs[SVDF_BIAS]
    raw = np.rint(bias / _scale(spec))
    return raw * np.float64(np.float32(_scale(node.inputs[SVDF_STATE]))) * np.float64(
        np.float32(_scale(node.inputs[SVDF_TIME])))


SVDF = register_op(OpDef(
    name="SVDF", infer=_infer_svdf, reference=_reference_svdf, parse=_parse_svdf,
    options_class="SVDFOptions", foldable=False,
    state=State(state_inputs=lambda node: (SVDF_STATE,)), litert_checks_omitted_inputs=True,
    min_inputs=5, max_inputs=5))


# -- RNN and UNIDIRECTIONAL_SEQUENCE_RNN --------------------------------------------------------
RNN_INPUT, RNN_WEIGHTS, RNN_RECURRENT, RNN_BIAS, RNN_STATE = range(5)


@dataclass(frozen=True)
class RnnLayout:
    n_time: int
    n_batch: int
    n_input: int
    n_unit: int
    time_major: bool
    sequence: bool
    kind: str

    @property
    def output_shape(self) -> tuple:
        if not self.sequence:
            return (self.n_batch, self.n_unit)
        if self.time_major:
            return (self.n_time, self.n_batch, self.n_unit)
        return (self.n_batch, self.n_time, self.n_unit)


def rnn_layout(node) -> RnnLayout:
    """Validate an RNN or UNIDIRECTIONAL_SEQUENCE_RNN node as basic_rnn.cc's and
    unidirectional_sequence_rnn.cc's Prepare do."""
    opts = node.options
    sequence = node.op == "UNIDIRECTIONAL_SEQUENCE_RNN"
    check_activation(node, opts.fused_activation_function)
    if len(node.outputs) != 1:
        raise node.fail(f"has {len(node.outputs)} outputs, the op produces 1")
    x = _require(node, RNN_INPUT, "input")
    w = _require(node, RNN_WEIGHTS, "input weights")
    _require(node, RNN_RECURRENT, "recurrent weights")
    _require(node, RNN_BIAS, "bias")
    _require(node, RNN_STATE, "hidden_state")
    n_time, time_major = 1, True
    if sequence:
        _check_rank(node, RNN_INPUT, "input", 3, "([max_time, n_batch, n_input] when "
                    "time_major, else [n_batch, max_time, n_input])")
        time_major = bool(opts.time_major)
        n_time, n_batch, n_input = x.shape if time_major else (x.shape[1], x.shape[0], x.shape[2])
    else:
        _check_rank(node, RNN_INPUT, "input", 2, "[n_batch, n_input]")
        n_batch, n_input = x.shape
    _check_rank(node, RNN_WEIGHTS, "input weights", 2, "[n_unit, n_input]")
    n_unit = w.shape[0]
    _check_shape(node, RNN_WEIGHTS, "input weights", (n_unit, n_input))
    _check_shape(node, RNN_RECURRENT, "recurrent weights", (n_unit, n_unit))
    _check_shape(node, RNN_BIAS, "bias", (n_unit,))
    _check_shape(node, RNN_STATE, "hidden_state", (n_batch, n_unit))
    kind = _weights_kind(node, {RNN_WEIGHTS: "input weights", RNN_RECURRENT: "recurrent weights"},
                         {RNN_INPUT: "input", RNN_BIAS: "bias", RNN_STATE: "hidden_state"})
    _check_output_dtype(node, 0, kind)
    return RnnLayout(n_time, n_batch, n_input, n_unit, time_major, sequence, kind)


def _infer_rnn(node):
    return [rnn_layout(node).output_shape]


def rnn_cell(product, act, x, w, r, bias, h):
    """One step of the basic RNN cell: act(W x + R h + bias)."""
    return _activate(bias.astype(np.float64) + product(x, w) + product(h, r), act)


def _reference_rnn(node, inputs):
    L = rnn_layout(node)
    opts = node.options
    x, w, r, bias = (np.asarray(inputs[i], np.float32) for i in range(4))
    h = np.asarray(inputs[RNN_STATE], np.float32).reshape(L.n_batch, L.n_unit)
    if L.sequence and not L.time_major:
        x = np.swapaxes(x, 0, 1)
    x = x.reshape(L.n_time, L.n_batch, L.n_input)
    product = _product(L.kind, opts.asymmetric_quantize_inputs)
    outs = []
    for t in range(L.n_time):           # each step needs the last one's hidden state
        h = rnn_cell(product, opts.fused_activation_function, x[t], w, r, bias, h)
        outs.append(h)
    y = np.stack(outs) if outs else np.zeros((0, L.n_batch, L.n_unit), np.float32)
    if L.sequence and not L.time_major:
        y = np.swapaxes(y, 0, 1)
    return [np.ascontiguousarray(y).reshape(L.output_shape),
            h.reshape(node.inputs[RNN_STATE].shape)]


RNN_STATE_INPUTS = State(state_inputs=lambda node: (RNN_STATE,))

RNN = register_op(OpDef(
    name="RNN", infer=_infer_rnn, reference=_reference_rnn, parse=_parse_rnn,
    options_class="RNNOptions", foldable=False, state=RNN_STATE_INPUTS,
    min_inputs=5, max_inputs=5))

UNIDIRECTIONAL_SEQUENCE_RNN = register_op(OpDef(
    name="UNIDIRECTIONAL_SEQUENCE_RNN", infer=_infer_rnn, reference=_reference_rnn,
    parse=_parse_sequence_rnn, options_class="SequenceRNNOptions", foldable=False,
    state=RNN_STATE_INPUTS, litert_checks_omitted_inputs=True, min_inputs=5,
    max_inputs=5))


# -- BIDIRECTIONAL_SEQUENCE_LSTM --------------------------------------------------------------
BIDI_INPUT, AUX_INPUT = 0, 39
FW_STATES, BW_STATES = (35, 36), (37, 38)
FW_AUX_WEIGHTS, BW_AUX_WEIGHTS = (40, 41, 42, 43), (44, 45, 46, 47)
BIDI_STATE_INPUTS = FW_STATES + BW_STATES


def _cell_positions(first: int, states: tuple, aux_weights: tuple, input_at: int) -> tuple:
    """A direction's inputs at ops/sequence/'s positions: input, its 17 weights and biases
    from `first` on, its two states, no layer norm, then its auxiliary weights."""
    return (input_at,) + tuple(range(first, first + 17)) + states + (-1,) * 4 + aux_weights


@dataclass(frozen=True)
class BidiLayout:
    forward: lstm.LstmLayout
    backward: lstm.LstmLayout
    forward_inputs: lstm.CellInputs
    backward_inputs: lstm.CellInputs
    cross_linked: bool        # aux weights: aux_input feeds both cells' gates
    kind: str                 # 'float' or 'hybrid'

    def output_shapes(self, merge: bool) -> list:
        F, B = self.forward, self.backward
        lead = (F.n_time, F.n_batch) if F.time_major else (F.n_batch, F.n_time)
        if merge:
            return [lead + (F.n_output + B.n_output,)]
        return [lead + (F.n_output,), lead + (B.n_output,)]


def bidi_layout(node) -> BidiLayout:
    """Validate a BIDIRECTIONAL_SEQUENCE_LSTM node as bidirectional_sequence_lstm.cc's
    Prepare does."""
    opts = node.options
    lstm.check_cell_options(node, opts)
    if len(node.inputs) != 48:
        raise node.fail(f"takes 48 inputs, has {len(node.inputs)}")
    want = 1 if opts.merge_outputs else 2
    if len(node.outputs) != want:
        raise node.fail(f"has {len(node.outputs)} outputs; with merge_outputs "
                        f"{opts.merge_outputs} it produces {want}")
    x = _require(node, BIDI_INPUT, "input")
    _check_rank(node, BIDI_INPUT, "input", 3, "([max_time, n_batch, n_input] when time_major, "
                "else [n_batch, max_time, n_input])")
    n_time, n_batch, n_input = x.shape if opts.time_major else (x.shape[1], x.shape[0], x.shape[2])
    aux = node.inputs[AUX_INPUT]
    cross_linked = _check_aux(node, aux, x)
    stacked = aux is not None and not cross_linked     # the backward cell reads aux_input
    fw = lstm.CellInputs(node, _cell_positions(1, FW_STATES, FW_AUX_WEIGHTS, BIDI_INPUT),
                         "forward ")
    bw = lstm.CellInputs(node, _cell_positions(18, BW_STATES, BW_AUX_WEIGHTS,
                                               AUX_INPUT if stacked else BIDI_INPUT), "backward ")
    cells = []
    for cell in (fw, bw):
        L = lstm.cell_layout(cell, n_batch, n_input)
        cells.append(replace(L, n_time=n_time, time_major=bool(opts.time_major), sequence=True))
        if cross_linked:
            _check_aux_weights(node, cell, L, aux.shape[2])
    if (cells[1].n_cell, cells[1].n_output) != (cells[0].n_cell, cells[0].n_output):
        # LiteRT's Prepare checks both cells' tensors against one size
        raise node.fail(f"the backward cell ({cells[1].n_cell} cells, {cells[1].n_output} "
                        f"outputs) must have the forward cell's sizes ({cells[0].n_cell}, "
                        f"{cells[0].n_output}), as LiteRT requires")
    kind = _bidi_kind(node)
    return BidiLayout(cells[0], cells[1], fw, bw, cross_linked, kind)


def _check_aux(node, aux, x) -> bool:
    """Whether the op is cross-linked (aux weights present); checks aux_input's shape."""
    present = [node.inputs[i] is not None for i in FW_AUX_WEIGHTS[1:] + BW_AUX_WEIGHTS[1:]]
    if any(present) and not all(present):
        raise node.fail("the forget, cell and output auxiliary weights of both directions "
                        "(inputs 41-43, 45-47) must be all present or all absent")
    cross_linked = all(present)
    if cross_linked and aux is None:
        raise node.fail(f"auxiliary weights need aux_input (input {AUX_INPUT})")
    if aux is not None:
        _check_rank(node, AUX_INPUT, "aux_input", 3, "(laid out as the input)")
        if cross_linked and tuple(aux.shape[:2]) != tuple(x.shape[:2]):
            raise node.fail(f"aux_input '{aux.name}' must match the input's first two "
                            f"dimensions {list(x.shape[:2])}, got {list(aux.shape)}")
        if not cross_linked and tuple(aux.shape) != tuple(x.shape):
            raise node.fail(f"aux_input '{aux.name}' without auxiliary weights is the backward "
                            f"cell's input and must have the input's shape {list(x.shape)}, "
                            f"got {list(aux.shape)}")
    return cross_linked


def _check_aux_weights(node, cell, L, n_aux):
    for g, name in enumerate(lstm.GATE_NAMES):
        i = cell.index(lstm.AUX_INPUT_TO_GATE[g])
        if g == 0 and L.cifg:
            continue
        spec = node.inputs[i]
        if spec is None:
            raise node.fail(f"input {i} ({cell.label}aux-input-to-{name} weights) is required")
        _check_shape(node, i, f"{cell.label}aux-input-to-{name} weights", (L.n_cell, n_aux))


def _bidi_kind(node) -> str:
    matrices = {}
    for first, label in ((1, "forward"), (18, "backward")):
        for k, what in enumerate(["input-to-%s weights" % g for g in lstm.GATE_NAMES]
                                 + ["recurrent-to-%s weights" % g for g in lstm.GATE_NAMES]):
            matrices[first + k] = f"{label} {what}"
        for k, g in zip((8, 9, 10), ("input", "forget", "output")):
            matrices[first + k] = f"{label} cell-to-{g} (peephole) weights"
        matrices[first + 15] = f"{label} projection weights"
    for i in FW_AUX_WEIGHTS + BW_AUX_WEIGHTS:
        matrices[i] = "auxiliary weights"
    activations = {BIDI_INPUT: "input", AUX_INPUT: "aux_input"}
    activations.update({i: "state" for i in BIDI_STATE_INPUTS})
    for first in (1, 18):   # the biases
        for i in list(range(first + 11, first + 15)) + [first + 16]:
            activations[i] = "bias"
    kind = _weights_kind(node, matrices, activations)
    for k in range(len(node.outputs)):
        _check_output_dtype(node, k, kind)
    return kind


def _infer_bidi(node):
    return bidi_layout(node).output_shapes(node.options.merge_outputs)


def _time_major(v, L):
    v = np.asarray(v, np.float32)
    return v if L.time_major else np.swapaxes(v, 0, 1)


def _reference_bidi(node, inputs):
    B = bidi_layout(node)
    opts = node.options
    quantize = (partial(dynamic_quantize, asymmetric=opts.asymmetric_quantize_inputs)
                if B.kind == "hybrid" else None)
    aux = None if inputs[AUX_INPUT] is None else _time_major(inputs[AUX_INPUT], B.forward)
    results, states = [], []
    for L, cell, reverse in ((B.forward, B.forward_inputs, False),
                             (B.backward, B.backward_inputs, True)):
        values = cell.values(inputs)
        get = lstm.getter(values)
        x = _time_major(values[lstm.INPUT], L)
        h = get(lstm.OUTPUT_STATE).reshape(L.n_batch, L.n_output)
        c = get(lstm.CELL_STATE).reshape(L.n_batch, L.n_cell)
        y, h, c = lstm.run_cell(L, opts, get, x, h, c, reverse=reverse, quantize=quantize,
                                aux_x=aux if B.cross_linked else None)
        results.append(y if L.time_major else np.swapaxes(y, 0, 1))
        states += [h.reshape(cell.spec(lstm.OUTPUT_STATE).shape),
                   c.reshape(cell.spec(lstm.CELL_STATE).shape)]
    if opts.merge_outputs:
        results = [np.concatenate(results, axis=2)]
    return [np.ascontiguousarray(y) for y in results] + states


BIDIRECTIONAL_SEQUENCE_LSTM = register_op(OpDef(
    name="BIDIRECTIONAL_SEQUENCE_LSTM", infer=_infer_bidi, reference=_reference_bidi,
    parse=_parse_bidirectional, options_class="BidirectionalSequenceLSTMOptions",
    foldable=False, state=State(state_inputs=lambda node: BIDI_STATE_INPUTS),
    litert_checks_omitted_inputs=True, min_inputs=48, max_inputs=48))

__all__ = ["SVDF", "RNN", "UNIDIRECTIONAL_SEQUENCE_RNN", "BIDIRECTIONAL_SEQUENCE_LSTM",
           "dynamic_quantize"]
