"""Cases for the detection tests: an SSD head (backbone, box and class convs, anchors) ending in
CUSTOM:TFLite_Detection_PostProcess, float or int8, its input ranges and a test image; the
post-process's options and outputs (test_ops_detection.py, test_taichi_detection.py)."""
import numpy as np
from tflite_taichi.builder import ModelBuilder
from tflite_taichi.ops.detection import detection_postprocess_options
from tflite_taichi.testing import Output, quantize_array


POSTPROCESS = "CUSTOM:TFLite_Detection_PostProcess"


SCALES = dict(y_scale=10.0, x_scale=10.0, h_scale=5.0, w_scale=5.0)


def postprocess_outputs(options):
    d = options["max_detections"] * options["max_classes_per_detection"]
    return [Output((1, d, 4), name="boxes"), Output((1, d), name="classes"),
            Output((1, d), name="scores"), Output((1,), name="num_detections")]


# -- an SSD head, end to end -------------------------------------------------------------------
ANCHORS_PER_CELL = 2


SSD_CLASSES = 3                # plus a background column


def ssd_anchors():
    """Two anchors per cell of a 4x4 and a 2x2 feature map, (ycenter, xcenter, h, w)."""
    rows = []
    for cells in (4, 2):
        for i in range(cells):
            for j in range(cells):
                for size in (1.0 / cells, 1.5 / cells):
                    rows.append([(i + 0.5) / cells, (j + 0.5) / cells, size, size])
    return np.array(rows, np.float32)


class _SsdBuilder:
    """The SSD head's layers, float32 or int8 (`ranges`: each tensor's float range, from a
    float run, for its int8 quantization; weights per tensor, symmetric)."""

    def __init__(self, g, rng, ranges=None):
        self.g, self.rng, self.ranges = g, rng, ranges
        self.quant = {}          # tensor -> (scale, zero point) when int8

    def _q(self, name, lo=None, hi=None):
        if self.ranges is None:
            return None
        lo, hi = self.ranges[name] if lo is None else (lo, hi)
        lo, hi = min(lo, 0.0), max(hi, 0.0)
        scale = max(hi - lo, 1e-3) / 255.0
        return (scale, int(np.clip(round(-128 - lo / scale), -128, 127)))

    def tensor(self, name, shape, q=None):
        q = q if q is not None else self._q(name)
        t = self.g.tensor(name, shape, np.int8 if q else np.float32, q)
        self.quant[t] = q
        return t

    def conv(self, name, x, in_c, out_c, k, stride, out_hw, act="RELU", q=None):
        w = self.rng.normal(0, 0.5, (out_c, k, k, in_c)).astype(np.float32)
        bias = self.rng.normal(0, 0.1, out_c).astype(np.float32)
        y = self.tensor(name, (1, out_hw, out_hw, out_c), q)
        if self.quant[x] is None:
            w_t, b_t = self.g.const(f"{name}_w", w), self.g.const(f"{name}_b", bias)
        else:
            w_scale = float(np.abs(w).max()) / 127
            b_scale = self.quant[x][0] * w_scale
            w_t = self.g.const(f"{name}_w", quantize_array(w, (w_scale, 0)),
                               quantization=(w_scale, 0))
            b_t = self.g.const(f"{name}_b", np.round(bias / b_scale).astype(np.int32),
                               quantization=(b_scale, 0))
        self.g.op("CONV_2D", [x, w_t, b_t], [y], padding="SAME", stride_h=stride,
                  stride_w=stride, fused_activation_function=act)
        return y

    def reshape(self, name, x, shape):
        y = self.tensor(name, shape, self.quant[x])
        self.g.op("RESHAPE", [x, self.g.const(f"{name}_shape", np.array(shape, np.int32))], [y],
                  new_shape=list(shape))
        return y

    def to_float(self, name, x, shape):
        if self.quant[x] is None:
            return x
        y = self.g.tensor(name, shape)
        self.g.op("DEQUANTIZE", [x], [y])
        return y


def ssd_model(regular: bool, ranges=None, seed: int = 0):
    """image [1, 8, 8, 3] -> conv 3x3/2 (4x4x8) -> conv 3x3/2 (2x2x8); on each map 1x1 convs
    to 2 anchors x 4 box values and 2 x 4 class logits, RESHAPE to [1, cells*2, 4|4],
    CONCATENATION over the maps, LOGISTIC on the logits -> TFLite_Detection_PostProcess.
    int8 (`ranges` given): the same layers quantized, concatenated parts sharing one scale
    (as LiteRT requires), then DEQUANTIZE to the float inputs LiteRT's post-process takes."""
    b = ModelBuilder()
    g = b.subgraph()
    layers = _SsdBuilder(g, np.random.default_rng(seed), ranges)
    columns = SSD_CLASSES + 1
    total = len(ssd_anchors())
    image = g.input("image", (1, 8, 8, 3), np.int8 if ranges else np.float32,
                    (1 / 255, -128) if ranges else None)
    layers.quant[image] = (1 / 255, -128) if ranges else None
    maps = [(layers.conv("features_4x4", image, 3, 8, 3, 2, 4), 4)]
    maps.append((layers.conv("features_2x2", maps[0][0], 8, 8, 3, 2, 2), 2))
    box_q, class_q = layers._q("box_encodings"), layers._q("class_logits")
    box_parts, class_parts = [], []
    for features, cells in maps:
        anchors = cells * cells * ANCHORS_PER_CELL
        box = layers.conv(f"box_{cells}", features, 8, ANCHORS_PER_CELL * 4, 1, 1, cells,
                          act="NONE", q=box_q)
        logits = layers.conv(f"class_{cells}", features, 8, ANCHORS_PER_CELL * columns, 1, 1,
                             cells, act="NONE", q=class_q)
        box_parts.append(layers.reshape(f"box_{cells}_flat", box, (1, anchors, 4)))
        class_parts.append(layers.reshape(f"class_{cells}_flat", logits, (1, anchors, columns)))
    boxes = layers.tensor("box_encodings", (1, total, 4), box_q)
    logits = layers.tensor("class_logits", (1, total, columns), class_q)
    g.op("CONCATENATION", box_parts, [boxes], axis=1)
    g.op("CONCATENATION", class_parts, [logits], axis=1)
    scores = layers.tensor("class_predictions", (1, total, columns),
                           (1 / 256, -128) if ranges else None)
    g.op("LOGISTIC", [logits], [scores])
    options = dict(max_detections=5, max_classes_per_detection=1 if regular else 2,
                   detections_per_class=3, nms_score_threshold=0.3, nms_iou_threshold=0.5,
                   num_classes=SSD_CLASSES, use_regular_nms=regular, **SCALES)
    outs = [g.tensor(o.name, o.shape) for o in postprocess_outputs(options)]
    g.op(POSTPROCESS, [layers.to_float("boxes_float", boxes, (1, total, 4)),
                       layers.to_float("scores_float", scores, (1, total, columns)),
                       g.const("anchors", ssd_anchors())], outs,
         custom_options=detection_postprocess_options(**options))
    g.output(*outs)
    return b.finish(), options


def ssd_ranges(regular: bool) -> dict:
    """Each tensor's float range over the test images, from the float model (int8 scales)."""
    from tflite_taichi.interpreter import Interpreter
    model, _ = ssd_model(regular)
    ranges = {}
    for seed in range(3):
        it = Interpreter(model_content=model, backend="reference",
                         experimental_preserve_all_tensors=True)
        it.allocate_tensors()
        it.set_tensor(it.get_input_details()[0]["index"], ssd_image(seed))
        it.invoke()
        for d in it.get_tensor_details():
            if d["dtype"] == np.float32 and d["name"] not in ("anchors",):
                x = it.get_tensor(d["index"])
                lo, hi = ranges.get(d["name"], (np.inf, -np.inf))
                ranges[d["name"]] = (min(lo, float(x.min())), max(hi, float(x.max())))
    return ranges


def ssd_image(seed):
    return np.random.default_rng(seed).uniform(0, 1, (1, 8, 8, 3)).astype(np.float32)
