"""Models as a user brings them, written with our own builder: the benchmark and test models of
the README's GPU table, float32 and full-integer int8, with seeded random weights where no file exists.

Each follows the op structure TF's TFLiteConverter writes for its original:
- `mobilenet_v2`: keras.applications.MobileNetV2;
- `mobilenet_v3_small`, `mobilenet_v3_large`: keras.applications.MobileNetV3* without the
  Rescaling layer (include_preprocessing=False: the input is already in [-1, 1]);
- `efficientnet_lite0`: the TPU repository's efficientnet_lite_builder (ReLU6, no
  squeeze-excite, stem and head fixed at 32 and 1280 filters), with a softmax on its logits;
- `deeplab_v3`: deeplabv3_257_mv_gpu.tflite, DeepLab v3 on a MobileNet v2 of depth multiplier
  0.5 at output stride 16 (native dilated depthwise convs in the last blocks, as the converter
  writes them today), its ASPP-lite head (image pooling + a 1x1 branch) and 21 classes;
- `posenet`: PoseNet's MobileNet v1 trunk with atrous convs for output stride 16 (the released
  posenet_mobilenet_v1_100_257x257 file is stride 32) and its four raw heads;
- `lstm_classifier`: two keras.layers.LSTM (the second returning its last step) then Dense +
  softmax, as the converter fuses Keras LSTMs (float32 only: see FLOAT_ONLY).
What the converter does to them is kept: BatchNorm folded into the conv weights and biases,
ReLU/ReLU6 fused into CONV_2D/DEPTHWISE_CONV_2D, Keras's ZeroPadding2D + VALID before a strided
depthwise conv folded into SAME (as in the shared mobilenet_v1 files), hard-swish as the
HARD_SWISH op, op versions as its op_version.cc writes them.

Weights are seeded and He-initialised (the LSTMs: Keras's Glorot and orthogonal initialisers),
then each layer's folded BatchNorm scales them to a unit root mean square output on a few
representative inputs (LSUV: every op is evaluated on our reference path as it is added), with
a random gain near 1 and shift per channel: so activations neither vanish nor explode through
~120 layers, and a classifier's logits spread as a trained one's (LOGIT_SPREAD).

int8 is calibrated as the converter's post-training quantization does it: the float model runs
on our reference path over a representative dataset (`sample_inputs`: seeded picture-like
inputs in [-1, 1]), every activation tensor's min/max (widened to include 0) gives its
asymmetric int8 scale and nudged zero point; the ops that compute on the raw integers (RESHAPE,
STRIDED_SLICE, AVERAGE_POOL_2D, RESIZE_BILINEAR, CONCATENATION) share one quantization between
inputs and outputs (their ranges' union), SOFTMAX and LOGISTIC outputs are fixed at 1/256, -128;
conv, depthwise and fully-connected weights are symmetric per output channel (narrow range, zero
point 0; quantized_dimension 0 for OHWI filters and [out, in] matrices, 3 for 1HWO depthwise
filters), biases int32 at input_scale * weight_scale[c], other constants asymmetric. The model's
input and output are int8 (inference_input_type/inference_output_type int8).

    model = build("mobilenet_v2", int8=True, input_size=96, alpha=0.35, classes=10)
    inputs = sample_inputs(model, seed=1)        # one array per model input, int8 here

MODELS maps each name to its function; FLOAT_ONLY names the models without an int8 form, and why.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from tflite_taichi.builder import ModelBuilder
from tflite_taichi.ops.base import Quantization
from tflite_taichi.quant import quantize, round_half_away

# Tensor roles, which decide how int8 stores a tensor.
ACTIVATION = "activation"   # computed at run time: calibrated asymmetric int8
WEIGHTS = "weights"         # conv/depthwise/fully-connected filters: symmetric per channel
BIAS = "bias"               # int32 at input_scale * weight_scale
OPERAND = "operand"         # any other float constant (ADD/MUL operands): asymmetric int8
INDICES = "indices"         # int32 shapes, axes, sizes: never quantized
STATE = "state"             # an LSTM's variable state (float models only)

# Ops that compute on the raw integers, so the converter gives inputs and outputs one quantization.
SAME_SCALE_OPS = {"RESHAPE", "STRIDED_SLICE", "AVERAGE_POOL_2D", "RESIZE_BILINEAR", "CONCATENATION"}
# Outputs LiteRT's int8 kernels insist on.
FIXED_OUTPUT_QUANTIZATION = {"SOFTMAX": (1 / 256, -128), "LOGISTIC": (1 / 256, -128)}
# op_version.cc: the version of each op with int8 inputs (float ones are 1, but for below).
INT8_VERSIONS = {"CONV_2D": 3, "DEPTHWISE_CONV_2D": 3, "FULLY_CONNECTED": 4, "ADD": 2, "MUL": 2,
                 "MEAN": 2, "SOFTMAX": 2, "AVERAGE_POOL_2D": 2, "RESIZE_BILINEAR": 2,
                 "CONCATENATION": 2, "STRIDED_SLICE": 2, "LOGISTIC": 2}
# The narrowest range a calibrated tensor gets: an all-zero tensor needs a nonzero scale.
MIN_RANGE = 1e-6
CALIBRATION_SAMPLES = 16
INIT_SAMPLES = 4              # representative inputs the weights are scaled on
# A folded BatchNorm's per-channel gain and shift (gamma / sqrt(var + eps), beta - mean * that).
BN_GAIN = (0.8, 1.2)
BN_SHIFT_STD = 0.2
# The root mean square of a classifier's logits on the representative inputs: a trained
# classifier's are spread (softmax peaks well above 1/classes), and so its int8 softmax output
# spans more than its lowest code.
LOGIT_SPREAD = 3.0
LSTM_BIAS_STD = 0.1
HARD_SWISH_SPREAD = 3.0      # pre-activation root mean square before a hard-swish (_spread)
TEXTURE_STD = 0.06           # per octave of a representative picture's texture


# -- the graph --------------------------------------------------------------------------------
@dataclass(eq=False)
class _Tensor:
    name: str
    shape: tuple
    role: str = ACTIVATION
    value: Optional[np.ndarray] = None     # a constant's float (or int32) value
    axis: int = 0                          # WEIGHTS: the output-channel dimension


@dataclass(eq=False)
class _Op:
    name: str
    inputs: list                           # _Tensor, or None for an omitted optional input
    outputs: list
    options: dict = field(default_factory=dict)


class _Net:
    """A float network as the converter would see it (written as float32 or int8 by _write),
    built eagerly: every op is evaluated as it is added, on INIT_SAMPLES representative
    inputs, so that layers can scale their weights by their own outputs (_fold_batch_norm)."""

    def __init__(self, description: str, seed: int):
        self.description = description
        self.rng = np.random.default_rng(seed)
        self.ops: list = []
        self.inputs: list = []
        self.outputs: list = []
        self.values: dict = {}          # tensor -> its values on the representative inputs

    def input(self, name, shape) -> _Tensor:
        t = _Tensor(name, tuple(shape))
        self.inputs.append(t)
        self.values[t] = [_natural_input(t.shape, self.rng) for _ in range(INIT_SAMPLES)]
        return t

    def output(self, *tensors):
        self.outputs.extend(tensors)

    def op(self, op, inputs, shape, name, **options) -> _Tensor:
        new = _Op(op, list(inputs), [_Tensor(name, tuple(shape))], options)
        self.values[new.outputs[0]] = self._evaluate(new)
        self.ops.append(new)
        return new.outputs[0]

    def evaluate(self, op, inputs, shape, **options) -> np.ndarray:
        """What an op would output on the representative inputs (stacked), without adding it."""
        return np.stack(self._evaluate(_Op(op, list(inputs), [_Tensor("output", tuple(shape))], options)))

    def _evaluate(self, op) -> list:
        """A one-op model of `op` on our reference path, once per representative input."""
        from tflite_taichi.interpreter import Interpreter
        one = _Net("one op", 0)
        one.inputs = [t for t in op.inputs if t is not None and t.role == ACTIVATION]
        one.ops, one.outputs = [op], op.outputs
        it = Interpreter(model_content=_write(one)[0], backend="reference")
        it.allocate_tensors()
        outputs = []
        for sample in range(INIT_SAMPLES):
            it.reset_all_variables()
            for d, t in zip(it.get_input_details(), one.inputs):
                it.set_tensor(d["index"], self.values[t][sample])
            it.invoke()
            outputs.append(it.get_tensor(it.get_output_details()[0]["index"]))
        return outputs

    def activations(self) -> list:
        """Every run-time tensor, inputs first, in the order the ops write them."""
        return self.inputs + [t for op in self.ops for t in op.outputs]


def _const(name, value, role, axis=0) -> _Tensor:
    dtype = np.int32 if role == INDICES else np.float32
    value = np.asarray(value, dtype)
    return _Tensor(name, value.shape, role, value, axis)


def _state(name, shape) -> _Tensor:
    return _Tensor(name, tuple(shape), STATE)


# -- layers -----------------------------------------------------------------------------------
def _make_divisible(value, divisor=8):
    """Keras applications' channel rounding: to a multiple of `divisor`, never 10% below."""
    rounded = max(divisor, int(value + divisor / 2) // divisor * divisor)
    return rounded + divisor if rounded < 0.9 * value else rounded


def _he(rng, shape, fan_in):
    return (rng.standard_normal(shape) * math.sqrt(2.0 / fan_in)).astype(np.float32)


def _activate(net, x, activation, name):
    """The activation a conv's converter output leaves after it: ReLU and ReLU6 are fused into
    the conv; hard-swish is an op of its own (the converter matches x * relu6(x + 3) / 6 to
    HARD_SWISH: x has two uses, so nothing is fused)."""
    return net.op("HARD_SWISH", [x], x.shape, f"{name}/hard_swish") if activation == "HARD_SWISH" else x


def _spread(activation) -> float:
    """The root mean square of a layer's pre-activations: 1, but 3 before a hard-swish, whose
    quadratic stretch around 0 (x/2 + x^2/6) would otherwise turn a picture's 25% more
    contrast into 6x larger logits through MobileNet v3 (measured); at 3 it works mostly
    where it is linear or zero, as a ReLU does."""
    return HARD_SWISH_SPREAD if activation == "HARD_SWISH" else 1.0


def _fused(activation) -> str:
    return "NONE" if activation == "HARD_SWISH" else activation


def _fold_batch_norm(rng, weights, axis, pre_activation, spread=1.0):
    """(weights, bias) of a layer with a BatchNorm folded in: He weights scaled so that the
    layer's output on the representative input `pre_activation` has a root mean square of
    `spread` (LSUV, Mishkin & Matas 2016), times a random gain near 1 per channel, plus a
    random shift. So no layer's output vanishes or explodes however deep it sits. Scaling
    without centring: centring each channel by its own statistics, as a BatchNorm's moving
    averages would, makes a random network chaotic (measured: a 1e-3 input perturbation grew
    40x through MobileNet v2, 2x without), and int8 rounding differences with it."""
    channels = weights.shape[axis]
    rms = np.sqrt(np.mean(np.square(pre_activation, dtype=np.float64)))
    gain = spread * rng.uniform(*BN_GAIN, channels) / rms
    shape = [1] * weights.ndim
    shape[axis] = channels
    return ((weights * gain.reshape(shape)).astype(np.float32),
            rng.normal(0, BN_SHIFT_STD, channels).astype(np.float32))


def _same_size(size, stride):
    return -(-size // stride)


def _conv(net, x, filters, name, kernel=1, stride=1, activation="NONE", bias_offset=0.0,
          spread=None):
    """Conv2D (SAME) + its folded BatchNorm (a conv with a bias of its own is scaled the same
    way) + `activation` (NONE, RELU, RELU6: fused; HARD_SWISH: an op after it). `bias_offset`:
    a constant ADD after the conv, which the converter folds into the bias."""
    _, h, w, cin = x.shape
    weights = _he(net.rng, (filters, kernel, kernel, cin), kernel * kernel * cin)
    return _layer(net, "CONV_2D", x, weights, 0, (1, _same_size(h, stride), _same_size(w, stride), filters),
                  name, activation, spread or _spread(activation), bias_offset,
                  padding="SAME", stride_w=stride, stride_h=stride)


def _depthwise(net, x, name, kernel=3, stride=1, dilation=1, activation="RELU6"):
    """DepthwiseConv2D (SAME, depth multiplier 1, atrous at `dilation`) + folded BatchNorm +
    `activation` (as for _conv)."""
    _, h, w, channels = x.shape
    weights = _he(net.rng, (1, kernel, kernel, channels), kernel * kernel)
    return _layer(net, "DEPTHWISE_CONV_2D", x, weights, 3,
                  (1, _same_size(h, stride), _same_size(w, stride), channels), name, activation,
                  _spread(activation), padding="SAME", stride_w=stride, stride_h=stride,
                  depth_multiplier=1, dilation_w_factor=dilation, dilation_h_factor=dilation)


def _dense(net, x, units, name):
    """keras.layers.Dense (the classifier): FULLY_CONNECTED with [units, in] weights, scaled
    to logits of root mean square LOGIT_SPREAD."""
    weights = _he(net.rng, (units, x.shape[-1]), x.shape[-1])
    return _layer(net, "FULLY_CONNECTED", x, weights, 0, x.shape[:-1] + (units,), name, "NONE",
                  LOGIT_SPREAD, keep_num_dims=False)


def _layer(net, op, x, weights, axis, shape, name, activation, spread, bias_offset=0.0, **options):
    """`op` (x, weights, bias) with its BatchNorm folded in (_fold_batch_norm, measured on the
    op's output with a zero bias), then `activation`."""
    channels = weights.shape[axis]
    raw = net.evaluate(op, [x, _const("weights", weights, WEIGHTS, axis),
                            _const("bias", np.zeros(channels), BIAS)], shape, **options)
    weights, bias = _fold_batch_norm(net.rng, weights, axis, raw, spread)
    y = net.op(op, [x, _const(f"{name}/weights", weights, WEIGHTS, axis),
                    _const(f"{name}/bias", bias + bias_offset, BIAS)], shape, name,
               fused_activation_function=_fused(activation), **options)
    return _activate(net, y, activation, name)


def _add(net, a, b, name):
    return net.op("ADD", [a, b], a.shape, name, fused_activation_function="NONE")


def _mul(net, a, b, name):
    return net.op("MUL", [a, b], a.shape, name, fused_activation_function="NONE")


def _global_mean(net, x, name, keep_dims):
    """GlobalAveragePooling2D: MEAN over height and width."""
    out = (1, 1, 1, x.shape[3]) if keep_dims else (1, x.shape[3])
    return net.op("MEAN", [x, _const(f"{name}/reduction_indices", [1, 2], INDICES)], out, name,
                  keep_dims=keep_dims)


def _softmax(net, x, name):
    return net.op("SOFTMAX", [x], x.shape, name, beta=1.0)


def _reshape(net, x, shape, name):
    return net.op("RESHAPE", [x, _const(f"{name}/shape", shape, INDICES)], tuple(shape), name)


# -- MobileNet v2 / DeepLab v3 ----------------------------------------------------------------
# (expansion, filters, repeats, stride) of MobileNet v2's inverted residual blocks
MOBILENET_V2_BLOCKS = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1),
                       (6, 160, 3, 2), (6, 320, 1, 1)]


class _Strides:
    """TF-Slim's and PoseNet's output-stride rule: once the network's stride reaches
    `output_stride`, later strides turn into atrous rates (stride 1, dilation multiplied)."""

    def __init__(self, output_stride=None):
        self.output_stride = output_stride
        self.current = 1
        self.rate = 1

    def next(self, stride):
        """(stride, dilation) of the next strided layer."""
        if self.output_stride is not None and self.current == self.output_stride:
            rate, self.rate = self.rate, self.rate * stride
            return 1, rate
        self.current *= stride
        return stride, 1


def _inverted_residual(net, x, expansion, filters, stride, dilation, name, kernel=3, sep="_"):
    """MobileNet v2's block (EfficientNet-lite's MBConv too): 1x1 expand + ReLU6 (not with
    expansion 1), depthwise kernel x kernel + ReLU6, linear 1x1 projection, residual ADD when
    shapes allow. Its tensors are named NAME + sep + part (Keras's names for each model)."""
    shortcut, cin = x, x.shape[3]
    if expansion != 1:
        x = _conv(net, x, expansion * cin, f"{name}{sep}expand", activation="RELU6")
    x = _depthwise(net, x, f"{name}{sep}depthwise", kernel=kernel, stride=stride,
                   dilation=dilation)
    x = _conv(net, x, filters, f"{name}{sep}project")
    if stride == 1 and cin == filters:
        x = _add(net, shortcut, x, f"{name}{sep}add")
    return x


def _mobilenet_v2_features(net, x, alpha, output_stride=None):
    strides = _Strides(output_stride)
    stride, _ = strides.next(2)
    x = _conv(net, x, _make_divisible(32 * alpha), "Conv1", kernel=3, stride=stride,
              activation="RELU6")
    block = 0
    for expansion, filters, repeats, first_stride in MOBILENET_V2_BLOCKS:
        for i in range(repeats):
            stride, dilation = strides.next(first_stride if i == 0 else 1)
            x = _inverted_residual(net, x, expansion, _make_divisible(filters * alpha), stride,
                                   dilation, f"block_{block}")
            block += 1
    return x


def mobilenet_v2(input_size=224, alpha=1.0, classes=1000, int8=False, seed=0) -> bytes:
    """keras.applications.MobileNetV2: input [1, S, S, 3] in [-1, 1], softmax over `classes`."""
    net = _Net(f"MobileNetV2 alpha {alpha} {input_size}x{input_size}", seed)
    x = _mobilenet_v2_features(net, net.input("input", (1, input_size, input_size, 3)), alpha)
    last = _make_divisible(1280 * alpha) if alpha > 1.0 else 1280
    x = _conv(net, x, last, "Conv_1", activation="RELU6")
    x = _global_mean(net, x, "global_average_pooling2d", keep_dims=False)
    net.output(_softmax(net, _dense(net, x, classes, "predictions"), "predictions/Softmax"))
    return _finish(net, int8)


def deeplab_v3(input_size=257, alpha=0.5, classes=21, aspp_filters=256, int8=False, seed=0) -> bytes:
    """deeplabv3_257_mv_gpu.tflite: MobileNet v2 (depth multiplier `alpha`) at output stride 16,
    the image-pooling branch (AVERAGE_POOL_2D over the whole feature map -> 1x1 conv ->
    RESIZE_BILINEAR back) beside a 1x1 branch, CONCATENATION, a 1x1 projection, 1x1 logits, and
    RESIZE_BILINEAR (align_corners, as DeepLab resizes) to the input's size."""
    net = _Net(f"DeepLab v3 MobileNetV2 {alpha} {input_size}x{input_size}", seed)
    features = _mobilenet_v2_features(net, net.input("input", (1, input_size, input_size, 3)),
                                      alpha, output_stride=16)
    _, fh, fw, channels = features.shape
    pooled = net.op("AVERAGE_POOL_2D", [features], (1, 1, 1, channels), "image_pooling/AvgPool",
                    padding="VALID", stride_w=1, stride_h=1, filter_width=fw, filter_height=fh,
                    fused_activation_function="NONE")      # DeepLab's image_pooling_stride [1, 1]
    pooled = _conv(net, pooled, aspp_filters, "image_pooling", activation="RELU")
    pooled = _resize_bilinear(net, pooled, (fh, fw), "image_pooling/ResizeBilinear")
    aspp0 = _conv(net, features, aspp_filters, "aspp0", activation="RELU")
    x = net.op("CONCATENATION", [pooled, aspp0], (1, fh, fw, 2 * aspp_filters), "concat",
               axis=3, fused_activation_function="NONE")
    x = _conv(net, x, aspp_filters, "concat_projection", activation="RELU")
    x = _conv(net, x, classes, "logits")
    net.output(_resize_bilinear(net, x, (input_size, input_size), "ResizeBilinear"))
    return _finish(net, int8)


def _resize_bilinear(net, x, size, name):
    return net.op("RESIZE_BILINEAR", [x, _const(f"{name}/size", size, INDICES)],
                  (1, size[0], size[1], x.shape[3]), name, align_corners=True,
                  half_pixel_centers=False)


# -- MobileNet v3 -----------------------------------------------------------------------------
# (expansion, filters, kernel, stride, squeeze-excite, activation) per block
MOBILENET_V3_SMALL = [(1, 16, 3, 2, True, "RELU"), (72 / 16, 24, 3, 2, False, "RELU"),
                      (88 / 24, 24, 3, 1, False, "RELU"), (4, 40, 5, 2, True, "HARD_SWISH"),
                      (6, 40, 5, 1, True, "HARD_SWISH"), (6, 40, 5, 1, True, "HARD_SWISH"),
                      (3, 48, 5, 1, True, "HARD_SWISH"), (3, 48, 5, 1, True, "HARD_SWISH"),
                      (6, 96, 5, 2, True, "HARD_SWISH"), (6, 96, 5, 1, True, "HARD_SWISH"),
                      (6, 96, 5, 1, True, "HARD_SWISH")]
MOBILENET_V3_LARGE = [(1, 16, 3, 1, False, "RELU"), (4, 24, 3, 2, False, "RELU"),
                      (3, 24, 3, 1, False, "RELU"), (3, 40, 5, 2, True, "RELU"),
                      (3, 40, 5, 1, True, "RELU"), (3, 40, 5, 1, True, "RELU"),
                      (6, 80, 3, 2, False, "HARD_SWISH"), (2.5, 80, 3, 1, False, "HARD_SWISH"),
                      (2.3, 80, 3, 1, False, "HARD_SWISH"), (2.3, 80, 3, 1, False, "HARD_SWISH"),
                      (6, 112, 3, 1, True, "HARD_SWISH"), (6, 112, 3, 1, True, "HARD_SWISH"),
                      (6, 160, 5, 2, True, "HARD_SWISH"), (6, 160, 5, 1, True, "HARD_SWISH"),
                      (6, 160, 5, 1, True, "HARD_SWISH")]


def _squeeze_excite(net, x, squeezed, name):
    """MobileNet v3's squeeze-excite: MEAN (keep_dims) -> 1x1 conv + ReLU -> 1x1 conv ->
    hard-sigmoid -> MUL. Keras's hard-sigmoid is relu6(x + 3) * (1 / 6); the converter folds
    the + 3 into the conv's bias (its FuseBinaryOpToPrecedingAffine pattern: the conv has no
    activation and one use) and fuses the RELU6 into the conv, leaving MUL by 1/6."""
    s = _global_mean(net, x, f"{name}/AvgPool", keep_dims=True)
    s = _conv(net, s, squeezed, f"{name}/Conv", activation="RELU")
    s = _conv(net, s, x.shape[3], f"{name}/Conv_1", activation="RELU6", bias_offset=3.0)
    s = _mul(net, s, _const(f"{name}/one_sixth", 1 / 6, OPERAND), f"{name}/hard_sigmoid")
    return _mul(net, x, s, f"{name}/Mul")


def _mobilenet_v3_block(net, x, expansion, filters, kernel, stride, se, activation, name,
                        expand=True):
    shortcut, cin = x, x.shape[3]
    if expand:
        x = _conv(net, x, _make_divisible(cin * expansion), f"{name}/expand", activation=activation)
    x = _depthwise(net, x, f"{name}/depthwise", kernel=kernel, stride=stride, activation=activation)
    if se:
        x = _squeeze_excite(net, x, _make_divisible(x.shape[3] * 0.25), f"{name}/squeeze_excite")
    x = _conv(net, x, filters, f"{name}/project")
    if stride == 1 and cin == filters:
        x = _add(net, shortcut, x, f"{name}/Add")
    return x


def _mobilenet_v3(blocks, last_point, name, input_size, alpha, classes, int8, seed) -> bytes:
    net = _Net(f"{name} alpha {alpha} {input_size}x{input_size}", seed)
    x = net.input("input", (1, input_size, input_size, 3))
    x = _conv(net, x, 16, "Conv", kernel=3, stride=2, activation="HARD_SWISH")
    for i, (expansion, filters, kernel, stride, se, activation) in enumerate(blocks):
        x = _mobilenet_v3_block(net, x, expansion, _make_divisible(filters * alpha), kernel,
                                stride, se, activation, f"expanded_conv_{i}", expand=i > 0)
    x = _conv(net, x, _make_divisible(x.shape[3] * 6), "Conv_1", activation="HARD_SWISH")
    x = _global_mean(net, x, "global_average_pooling2d", keep_dims=True)
    last_point = _make_divisible(last_point * alpha) if alpha > 1.0 else last_point
    x = _conv(net, x, last_point, "Conv_2", activation="HARD_SWISH")
    x = _conv(net, x, classes, "Logits", spread=LOGIT_SPREAD)
    x = _reshape(net, x, (1, classes), "flatten")
    net.output(_softmax(net, x, "Predictions"))
    return _finish(net, int8)


def mobilenet_v3_small(input_size=224, alpha=1.0, classes=1000, int8=False, seed=0) -> bytes:
    """keras.applications.MobileNetV3Small (include_preprocessing=False)."""
    return _mobilenet_v3(MOBILENET_V3_SMALL, 1024, "MobileNetV3Small", input_size, alpha,
                         classes, int8, seed)


def mobilenet_v3_large(input_size=224, alpha=1.0, classes=1000, int8=False, seed=0) -> bytes:
    """keras.applications.MobileNetV3Large (include_preprocessing=False)."""
    return _mobilenet_v3(MOBILENET_V3_LARGE, 1280, "MobileNetV3Large", input_size, alpha,
                         classes, int8, seed)


# -- EfficientNet-lite0 -----------------------------------------------------------------------
# (repeats, kernel, stride, expansion, filters) of EfficientNet-B0's MBConv stages
EFFICIENTNET_BLOCKS = [(1, 3, 1, 1, 16), (2, 3, 2, 6, 24), (2, 5, 2, 6, 40), (3, 3, 2, 6, 80),
                       (3, 5, 1, 6, 112), (4, 5, 2, 6, 192), (1, 3, 1, 6, 320)]


def efficientnet_lite0(input_size=224, classes=1000, int8=False, seed=0) -> bytes:
    """EfficientNet-lite0: B0's MBConv stages with ReLU6 and without squeeze-excite."""
    net = _Net(f"EfficientNet-lite0 {input_size}x{input_size}", seed)
    x = net.input("images", (1, input_size, input_size, 3))
    x = _conv(net, x, 32, "stem", kernel=3, stride=2, activation="RELU6")
    block = 0
    for repeats, kernel, first_stride, expansion, filters in EFFICIENTNET_BLOCKS:
        for i in range(repeats):
            x = _inverted_residual(net, x, expansion, filters, first_stride if i == 0 else 1, 1,
                                   f"blocks_{block}", kernel=kernel, sep="/")
            block += 1
    x = _conv(net, x, 1280, "head", activation="RELU6")
    x = _global_mean(net, x, "head/global_average_pooling", keep_dims=False)
    net.output(_softmax(net, _dense(net, x, classes, "head/dense"), "Softmax"))
    return _finish(net, int8)


# -- PoseNet ----------------------------------------------------------------------------------
# (filters, stride) of MobileNet v1's depthwise-separable layers, after its 3x3 stem
MOBILENET_V1_LAYERS = [(64, 1), (128, 2), (128, 1), (256, 2), (256, 1), (512, 2), (512, 1),
                       (512, 1), (512, 1), (512, 1), (512, 1), (1024, 2), (1024, 1)]
POSENET_KEYPOINTS = 17
POSENET_EDGES = 16           # the skeleton's parent-child pairs, each way


def posenet(input_size=257, alpha=1.0, output_stride=16, int8=False, seed=0) -> bytes:
    """PoseNet: MobileNet v1 (ReLU6) with strides past `output_stride` turned into atrous
    rates, then four 1x1 heads with biases and no activation: heatmaps (17 keypoints' logits),
    offsets (2 x 17), forward and backward displacements (2 x 16 edges each)."""
    net = _Net(f"PoseNet MobileNetV1 {alpha} {input_size}x{input_size} stride {output_stride}", seed)
    strides = _Strides(output_stride)
    stride, _ = strides.next(2)
    x = _conv(net, net.input("image", (1, input_size, input_size, 3)), _make_divisible(32 * alpha),
              "Conv2d_0", kernel=3, stride=stride, activation="RELU6")
    for i, (filters, layer_stride) in enumerate(MOBILENET_V1_LAYERS, start=1):
        stride, dilation = strides.next(layer_stride)
        x = _depthwise(net, x, f"Conv2d_{i}_depthwise", stride=stride, dilation=dilation)
        x = _conv(net, x, _make_divisible(filters * alpha), f"Conv2d_{i}_pointwise",
                  activation="RELU6")
    heads = [("heatmap", POSENET_KEYPOINTS), ("offset", 2 * POSENET_KEYPOINTS),
             ("displacement_fwd", 2 * POSENET_EDGES), ("displacement_bwd", 2 * POSENET_EDGES)]
    net.output(*[_conv(net, x, channels, name) for name, channels in heads])
    return _finish(net, int8)


# -- LSTM classifier --------------------------------------------------------------------------
FLOAT_ONLY = {"lstm_classifier": (
    "LiteRT's full-integer LSTM keeps 16-bit cell state and gate scales in intermediate "
    "tensors that our float view does not model (ops/sequence/), so an int8 LSTM could not "
    "be held to LiteRT")}


def lstm_classifier(steps=64, features=32, units=128, classes=10, int8=False, seed=0) -> bytes:
    """Two keras.layers.LSTM(units) (the first returning sequences) then Dense + softmax, as
    the converter fuses Keras LSTMs: UNIDIRECTIONAL_SEQUENCE_LSTM with 24 inputs (no
    peepholes, projection or layer norm), TANH, cell_clip 10, batch-major, variable states;
    the second layer's last step taken by STRIDED_SLICE. Input [1, steps, features]."""
    if int8:
        raise NotImplementedError(f"lstm_classifier has no int8 form: {FLOAT_ONLY['lstm_classifier']}")
    net = _Net(f"LSTM classifier {steps}x{features} -> {units} -> {classes}", seed)
    x = net.input("sequence", (1, steps, features))
    x = _lstm(net, _lstm(net, x, units, "lstm"), units, "lstm_1")
    last = net.op("STRIDED_SLICE", [x, _const("lstm_1/last/begin", [0, -1, 0], INDICES),
                                    _const("lstm_1/last/end", [0, 0, 0], INDICES),
                                    _const("lstm_1/last/strides", [1, 1, 1], INDICES)],
                  (1, units), "lstm_1/last", begin_mask=5, end_mask=5, shrink_axis_mask=2)
    net.output(_softmax(net, _dense(net, last, classes, "dense"), "dense/Softmax"))
    return _finish(net, int8)


def _lstm(net, x, units, name):
    """keras.layers.LSTM(return_sequences=True) as UNIDIRECTIONAL_SEQUENCE_LSTM: gates i, f, c,
    o; Glorot-uniform input weights, orthogonal recurrent weights, forget-gate bias 1 (plus a
    little noise on every bias, as after training)."""
    features = x.shape[2]
    limit = math.sqrt(6 / (features + 4 * units))
    kernel = net.rng.uniform(-limit, limit, (4 * units, features)).astype(np.float32)
    recurrent = np.linalg.qr(net.rng.standard_normal((4 * units, units)))[0].astype(np.float32)
    bias = net.rng.normal(0, LSTM_BIAS_STD, 4 * units).astype(np.float32)
    bias[units:2 * units] += 1.0
    gates = "ifco"
    inputs = [x]
    inputs += [_const(f"{name}/input_to_{g}", w, WEIGHTS) for g, w in zip(gates, np.split(kernel, 4))]
    inputs += [_const(f"{name}/recurrent_to_{g}", w, WEIGHTS) for g, w in zip(gates, np.split(recurrent, 4))]
    inputs += [None] * 3                                         # peepholes
    inputs += [_const(f"{name}/bias_{g}", b, BIAS) for g, b in zip(gates, np.split(bias, 4))]
    inputs += [None] * 2                                         # projection
    inputs += [_state(f"{name}/output_state", (1, units)), _state(f"{name}/cell_state", (1, units))]
    inputs += [None] * 4                                         # layer norm
    return net.op("UNIDIRECTIONAL_SEQUENCE_LSTM", inputs, (1, x.shape[1], units), name,
                  fused_activation_function="TANH", cell_clip=10.0, proj_clip=0.0,
                  time_major=False)


# -- registry ---------------------------------------------------------------------------------
MODELS = {
    "mobilenet_v2": mobilenet_v2,
    "mobilenet_v3_small": mobilenet_v3_small,
    "mobilenet_v3_large": mobilenet_v3_large,
    "efficientnet_lite0": efficientnet_lite0,
    "deeplab_v3": deeplab_v3,
    "posenet": posenet,
    "lstm_classifier": lstm_classifier,
}


def build(name: str, int8: bool = False, **kwargs) -> bytes:
    """The zoo model `name` (a key of MODELS) as .tflite bytes; kwargs go to its function."""
    if name not in MODELS:
        raise KeyError(f"no zoo model {name!r}; choose one of {', '.join(MODELS)}")
    return MODELS[name](int8=int8, **kwargs)


# -- inputs -----------------------------------------------------------------------------------
def sample_inputs(model: bytes, seed: int = 0) -> list:
    """One natural-looking input per model input, in [-1, 1] (quantized for an int8 input):
    a [1, H, W, 3] picture (a synthetic portrait with seeded noise, shading and contrast) or a
    [1, T, F] sequence (seeded sums of slow sinusoids plus noise). The zoo's representative
    dataset, and what tests feed its models."""
    from tflite_taichi.interpreter import Interpreter
    rng = np.random.default_rng(seed)
    inputs = []
    for d in Interpreter(model_content=model, backend="reference").get_input_details():
        x = _natural_input(tuple(d["shape"]), rng)
        if np.dtype(d["dtype"]) == np.int8:
            scale, zero_point = d["quantization"]
            x = quantize(x, _quantization(scale, zero_point), np.int8)
        inputs.append(x)
    return inputs


def _natural_input(shape, rng) -> np.ndarray:
    return _picture(shape, rng) if len(shape) == 4 else _sequence(shape, rng)


def _picture(shape, rng) -> np.ndarray:
    """A synthetic portrait under a random contrast and brightness, with texture at every
    scale (seeded noise octaves of equal amplitude, as natural images' 1/f spectrum has)."""
    from tflite_taichi.testing import synthetic_portrait
    _, h, w, _ = shape
    picture = synthetic_portrait(h, w, rng)
    octaves = range(2, max(3, int(math.log2(min(h, w))) + 1))
    texture = sum(_upsample(rng.normal(0, TEXTURE_STD, (2 ** k, 2 ** k, 3)), h, w) for k in octaves)
    contrast, brightness = rng.uniform(0.7, 1.3), rng.uniform(-0.15, 0.15)
    picture = np.clip((picture - 0.5) * contrast + 0.5 + brightness + texture, 0, 1)
    return (2 * picture - 1).astype(np.float32)


def _upsample(grid, h, w) -> np.ndarray:
    """A smooth [1, h, w, C] field: `grid` [gh, gw, C] bilinearly interpolated."""
    gh, gw, _ = grid.shape
    ys, xs = np.linspace(0, gh - 1, h), np.linspace(0, gw - 1, w)
    y0, x0 = np.minimum(ys.astype(int), gh - 2), np.minimum(xs.astype(int), gw - 2)
    fy, fx = (ys - y0)[:, None, None], (xs - x0)[None, :, None]
    top = grid[y0][:, x0] * (1 - fx) + grid[y0][:, x0 + 1] * fx
    bottom = grid[y0 + 1][:, x0] * (1 - fx) + grid[y0 + 1][:, x0 + 1] * fx
    return (top * (1 - fy) + bottom * fy)[None]


def _sequence(shape, rng) -> np.ndarray:
    _, steps, features = shape
    t = np.arange(steps)[:, None]
    frequency = rng.uniform(0.02, 0.2, features)
    phase = rng.uniform(0, 2 * np.pi, features)
    x = 0.7 * np.sin(2 * np.pi * frequency * t + phase) + rng.normal(0, 0.1, (steps, features))
    return np.clip(x, -1, 1)[None].astype(np.float32)


# -- writing: float32, and int8 from calibrated ranges ----------------------------------------
def _finish(net: _Net, int8: bool) -> bytes:
    model, indices = _write(net)
    if not int8:
        return model
    samples = [sample_inputs(model, seed) for seed in range(CALIBRATION_SAMPLES)]
    ranges = _calibrate(model, net, indices, samples)
    return _write(net, _quantize(net, ranges))[0]


def _calibrate(model, net, indices, samples) -> dict:
    """Each activation's (min, max) over the representative dataset, on our reference path."""
    from tflite_taichi.interpreter import Interpreter
    it = Interpreter(model_content=model, backend="reference")
    it.allocate_tensors()
    ranges = {}
    for inputs in samples:
        for d, x in zip(it.get_input_details(), inputs):
            it.set_tensor(d["index"], x)
        it.invoke()
        for t in net.activations():
            value = it.get_tensor(indices[t])
            lo, hi = ranges.get(t, (np.inf, -np.inf))
            ranges[t] = (min(lo, float(value.min())), max(hi, float(value.max())))
    return ranges


def _quantize(net: _Net, ranges: dict) -> dict:
    """The int8 model's quantization of every tensor (constants' too), keyed by tensor."""
    groups = _same_scale_groups(net)
    quant = {}
    for t in net.activations():
        members = groups[t]
        lo = min(ranges[m][0] for m in members)
        hi = max(ranges[m][1] for m in members)
        quant[t] = _asymmetric(lo, hi)
    for op in net.ops:
        fixed = FIXED_OUTPUT_QUANTIZATION.get(op.name)
        if fixed is not None:
            quant[op.outputs[0]] = _quantization(*fixed)
    for op in net.ops:
        for t in op.inputs:
            if t is None or t.role in (ACTIVATION, INDICES):
                continue
            if t.role == WEIGHTS:
                quant[t] = _symmetric_per_channel(t.value, t.axis)
            elif t.role == BIAS:
                x, w = op.inputs[0], op.inputs[1]
                quant[t] = _quantization(quant[x].scale * quant[w].scale, 0)   # in float32, as the converter
            else:
                quant[t] = _asymmetric(float(t.value.min()), float(t.value.max()))
    return quant


def _same_scale_groups(net) -> dict:
    """tensor -> the set of tensors that must share its quantization (SAME_SCALE_OPS chains)."""
    groups = {t: {t} for t in net.activations()}
    for op in net.ops:
        if op.name in SAME_SCALE_OPS:
            tied = [t for t in op.inputs if t is not None and t.role == ACTIVATION] + op.outputs
            merged = set().union(*(groups[t] for t in tied))
            for t in merged:
                groups[t] = merged
    return groups


def _quantization(scale, zero_point, axis=0) -> Quantization:
    scale = np.atleast_1d(np.asarray(scale, np.float32))
    zero_point = np.broadcast_to(np.asarray(zero_point, np.int64), scale.shape).copy()
    return Quantization(scale=scale, zero_point=zero_point, quantized_dimension=axis)


def _asymmetric(lo: float, hi: float) -> Quantization:
    """The converter's int8 activation parameters for a calibrated range: the range widened to
    include 0, scale (max - min) / 255, and the zero point from whichever end gives the smaller
    error, nudged to an integer (MLIR quant's getNudgedScaleAndZeroPoint)."""
    lo, hi = min(lo, 0.0), max(hi, 0.0)
    if hi - lo < MIN_RANGE:
        lo, hi = lo - MIN_RANGE / 2, hi + MIN_RANGE / 2
    scale = (hi - lo) / 255.0
    from_min, from_max = -128 - lo / scale, 127 - hi / scale
    use_min = 128 + abs(lo / scale) < 127 + abs(hi / scale)
    zero_point = float(round_half_away(np.float64(from_min if use_min else from_max)))
    return _quantization(scale, int(np.clip(zero_point, -128, 127)))


def _symmetric_per_channel(weights, axis) -> Quantization:
    """Symmetric narrow-range int8 per output channel: scale max|w| / 127, zero point 0."""
    others = tuple(i for i in range(weights.ndim) if i != axis)
    return _quantization(np.abs(weights).max(axis=others) / 127.0, 0, axis)


def _version(op, quant) -> int:
    if quant is None:
        dilated = op.options.get("dilation_w_factor", 1) != 1 or op.options.get("dilation_h_factor", 1) != 1
        return 2 if op.name == "DEPTHWISE_CONV_2D" and dilated else 1
    if op.name == "MUL":
        a, b, out = (float(quant[t].scale[0]) for t in (*op.inputs, op.outputs[0]))
        return 3 if a * b / out >= 1 else 2            # a rescale of 1 or more: version 3
    return INT8_VERSIONS.get(op.name, 1)


def _write(net: _Net, quant: Optional[dict] = None):
    """(model bytes, {tensor: index}) of `net`: float32, or int8 with `quant` (see _quantize)."""
    b = ModelBuilder(description=net.description)
    g = b.subgraph("main")
    indices = {}

    def index(t) -> int:
        if t is None:
            return -1
        if t not in indices:
            indices[t] = _write_tensor(g, t, None if quant is None else quant.get(t))
        return indices[t]

    for t in net.inputs:
        indices[t] = g.input(t.name, t.shape, *_storage(t, None if quant is None else quant[t]))
    for op in net.ops:
        ins = [index(t) for t in op.inputs]
        g.op(op.name, ins, [index(t) for t in op.outputs], version=_version(op, quant), **op.options)
    g.output(*[indices[t] for t in net.outputs])
    b.signature("serving_default", 0, {t.name: indices[t] for t in net.inputs},
                {t.name: indices[t] for t in net.outputs})
    return b.finish(), indices


def _storage(t, q) -> tuple:
    """(dtype, quantization) a tensor is stored with."""
    if t.role == INDICES:
        return np.int32, None
    if q is None:
        return np.float32, None
    return (np.int32 if t.role == BIAS else np.int8), q


def _write_tensor(g, t, q) -> int:
    dtype, q = _storage(t, q)
    if t.role == STATE:
        return g.tensor(t.name, t.shape, dtype, is_variable=True)
    if t.value is None:
        return g.tensor(t.name, t.shape, dtype, q)
    value = t.value if q is None else _quantized_value(t.value, q, dtype)
    return g.const(t.name, value, dtype, q)


def _quantized_value(value, q, dtype) -> np.ndarray:
    if dtype == np.int32:       # a bias: its scales are too fine for float32's division
        scale = q.broadcastable(np.ndim(value))[0].astype(np.float64)
        limit = np.iinfo(np.int32)
        return np.clip(round_half_away(value / scale), limit.min, limit.max).astype(np.int32)
    return quantize(value, q, dtype)
