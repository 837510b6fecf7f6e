"""Object detection post-processing: CUSTOM:TFLite_Detection_PostProcess (an SSD head's box
decoding and multi-class NMS), NON_MAX_SUPPRESSION_V4 and NON_MAX_SUPPRESSION_V5. CPU only:
the official GPU delegate has no kernels for them either, so a model's backbone is delegated
and these run on the CPU after it (partition.py's fallback).

Semantics are those of LiteRT's kernels (tflite/kernels/detection_postprocess.cc,
non_max_suppression.cc and reference/non_max_suppression.h), ties included: LiteRT breaks
ties through libstdc++'s std::partial_sort and std::priority_queue, which are not stable, so
`_StdHeap` below follows libstdc++'s heap algorithms step for step (sift up, sift down by
the larger child then up again) and the order of equal scores comes out the same.

TFLite_Detection_PostProcess
- custom_options: a flexbuffer map with max_detections, max_classes_per_detection,
  nms_score_threshold, nms_iou_threshold, num_classes, y_scale, x_scale, h_scale, w_scale
  (required here: LiteRT reads a missing key as 0, which only makes division by zero or an
  empty result), detections_per_class (default 100) and use_regular_nms (default false).
  Ints may be written as floats and the reverse (flexbuffers' AsInt32/AsFloat convert).
- inputs: box encodings [1, N, >=4] (y, x, h, w first; more columns, keypoints, are ignored),
  class predictions [1, N, C] with C = num_classes or num_classes + 1 (then column 0 is the
  background and is skipped: class k is column k + 1), anchors [N, 4] (ycenter, xcenter, h, w).
- decoding, in double as LiteRT: ycenter = y / y_scale * anchor_h + anchor_y,
  half_h = 0.5 * exp(h / h_scale) * anchor_h (x, w alike), each rounded to float32; the box is
  (ycenter - half_h, xcenter - half_w, ycenter + half_h, xcenter + half_w) in float32. A box
  with ymin > ymax or xmin > xmax (a negative anchor size) is an error, as in LiteRT.
- single-class NMS (both paths): candidates are the boxes with score >= nms_score_threshold,
  stably sorted by decreasing score (ties: lower box index first); greedily selected, each
  removing the later candidates whose IoU with it is > nms_iou_threshold (IoU 0 when either
  box has zero area), until the cap. nms_iou_threshold must lie in (0, 1].
- fast path (use_regular_nms false): each box's score is its best class's; NMS over those,
  capped at max_detections; for each selected box the top min(max_classes_per_detection,
  num_classes) classes by score (std::partial_sort's order for ties; its first maximum when
  one class is kept). Output row max_classes_per_detection * i + k holds the i-th box's k-th
  class. num_detections counts boxes, not rows.
- regular path: NMS per class (capped at min(detections_per_class, max_detections), which
  must be > 0), the classes' selections merged by decreasing score (a stable merge: ties keep
  the lower class first), the best max_detections kept. Rows past max_detections (when
  max_classes_per_detection > 1) are zero here.
- outputs, all float32: boxes [1, D, 4], classes [1, D], scores [1, D], num_detections [1],
  D = max_detections * max_classes_per_detection. Rows not written are zero here; LiteRT's
  fast path leaves them as whatever its arena held (seen: garbage), so tests compare the rows
  LiteRT writes and hold the zeros to this definition.
- quantized inputs: LiteRT dequantizes uint8 box encodings together with uint8 anchors (each
  with its own scale and zero point) and uint8 class predictions; it fails at invoke on int8.
  Here every input is its float view (docs/quantization.md), so int8, or uint8 boxes with float32
  anchors (which LiteRT reads as bytes), mean the dequantized values; uint8 class predictions
  are dequantized in LiteRT's own rounding (`litert_uint8_scores`: its SIMD loop rounds
  twice), since a score one float32 step off decides a threshold or a tie differently.

NON_MAX_SUPPRESSION_V4 / V5 (tf.image.non_max_suppression_padded / _with_scores)
- inputs: boxes [N, 4] float32 (two opposite corners in either order: y1, x1, y2, x2),
  scores [N] float32, max_output_size int32 scalar (>= 0), iou_threshold and score_threshold
  float32 scalars, and for V5 soft_nms_sigma, a float32 scalar (>= 0).
- candidates: score > score_threshold, taken from a max-heap on score (libstdc++'s order for
  equal scores). A candidate is compared with the selected boxes it has not yet met, last
  first: IoU >= iou_threshold drops it; with sigma > 0 each IoU decays its score by
  exp(-0.5 / sigma * iou^2), and a score <= score_threshold drops it. An undecayed candidate
  is selected; a candidate still above the threshold goes back onto the heap (LiteRT pushes
  a selected one back too, so where its IoU with itself stays below iou_threshold - a zero-area
  box, or a threshold above 1 - it is selected again: kept here, as LiteRT does).
- outputs: selected_indices int32 [max_output_size] (V5 also selected_scores float32, the
  decayed scores), zero past valid_outputs, an int32 scalar. A run-time max_output_size
  makes the outputs' shape known only at invoke (DataDependentShape); LiteRT 2.3 pads them
  to it as well.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from flatbuffers import flexbuffers

from tflite_taichi.errors import ModelError

from .base import OpDef, register_op
from .common import flexbuffer_map


# -- libstdc++'s heap algorithms --------------------------------------------------------------
class _StdHeap:
    """libstdc++'s binary heap over a Python list with `less(a, b)` (std::push_heap,
    std::pop_heap, std::make_heap, std::partial_sort): the same moves in the same order, so
    elements that compare equal come out in the order LiteRT's kernels produce them."""

    def __init__(self, less):
        self.less = less

    def _sift_up(self, h, hole, top, value):                  # std::__push_heap
        parent = (hole - 1) // 2
        while hole > top and self.less(h[parent], value):
            h[hole] = h[parent]
            hole = parent
            parent = (hole - 1) // 2
        h[hole] = value

    def _adjust(self, h, hole, length, value):                # std::__adjust_heap
        top, child = hole, hole
        while child < (length - 1) // 2:
            child = 2 * (child + 1)
            if self.less(h[child], h[child - 1]):
                child -= 1
            h[hole] = h[child]
            hole = child
        if length % 2 == 0 and child == (length - 2) // 2:
            child = 2 * (child + 1)
            h[hole] = h[child - 1]
            hole = child - 1
        self._sift_up(h, hole, top, value)

    def _pop_into(self, h, length, result):                    # std::__pop_heap
        value = h[result]
        h[result] = h[0]
        self._adjust(h, 0, length, value)

    def push(self, h, value):                                 # priority_queue::push
        h.append(value)
        self._sift_up(h, len(h) - 1, 0, value)

    def pop(self, h):                                         # priority_queue::pop
        top = h[0]
        if len(h) > 1:
            self._pop_into(h, len(h) - 1, len(h) - 1)
        h.pop()
        return top

    def make(self, h, length):                                # std::__make_heap
        if length < 2:
            return
        for parent in range((length - 2) // 2, -1, -1):
            self._adjust(h, parent, length, h[parent])

    def partial_sort(self, h, middle):                        # std::partial_sort
        self.make(h, middle)                                  # std::__heap_select
        for i in range(middle, len(h)):
            if self.less(h[i], h[0]):
                self._pop_into(h, middle, i)
        for end in range(middle - 1, 0, -1):                  # std::__sort_heap
            self._pop_into(h, end, end)


def decreasing_partial_argsort(values, k: int) -> list:
    """LiteRT's DecreasingPartialArgSort: the indices of the k largest values, largest first;
    k == 1 is its ArgMaxVector (the first maximum), otherwise std::partial_sort."""
    values = [float(v) for v in values]
    if k == 1:
        best = 0
        for i in range(1, len(values)):
            if values[i] > values[best]:
                best = i
        return [best]
    order = list(range(len(values)))
    _StdHeap(lambda i, j: values[i] > values[j]).partial_sort(order, k)
    return order[:k]


# -- IoU, float32 as LiteRT computes it --------------------------------------------------------
def _f32(x):
    return np.asarray(x, np.float32)


class _Boxes:
    """Corners (ymin, xmin, ymax, xmax) [N, 4] in float32 and their areas."""

    def __init__(self, corners):
        self.c = _f32(corners)
        ymin, xmin, ymax, xmax = (self.c[:, k] for k in range(4))
        self.area = (ymax - ymin) * (xmax - xmin)

    def iou(self, i: int, others) -> np.ndarray:
        """IoU of box i with boxes `others`, each step rounded to float32 in LiteRT's order;
        0 where either box has no area."""
        c, others = self.c, np.asarray(others)
        zero = np.float32(0)
        inter_h = np.maximum(np.minimum(c[i, 2], c[others, 2]) - np.maximum(c[i, 0], c[others, 0]),
                             zero)
        inter_w = np.maximum(np.minimum(c[i, 3], c[others, 3]) - np.maximum(c[i, 1], c[others, 1]),
                             zero)
        inter = inter_h * inter_w
        with np.errstate(invalid="ignore", divide="ignore"):
            iou = inter / (self.area[i] + self.area[others] - inter)
        no_area = (self.area[i] <= 0) | (self.area[others] <= 0)
        return np.where(no_area, zero, iou).astype(np.float32)


# -- TFLite_Detection_PostProcess --------------------------------------------------------------
@dataclass(frozen=True)
class PostProcessOptions:
    max_detections: int
    max_classes_per_detection: int
    detections_per_class: int
    nms_score_threshold: float
    nms_iou_threshold: float
    num_classes: int
    y_scale: float
    x_scale: float
    h_scale: float
    w_scale: float
    use_regular_nms: bool


_INT_KEYS = ("max_detections", "max_classes_per_detection", "num_classes")
_FLOAT_KEYS = ("nms_score_threshold", "nms_iou_threshold", "y_scale", "x_scale", "h_scale",
               "w_scale")
DEFAULT_DETECTIONS_PER_CLASS = 100      # LiteRT's kNumDetectionsPerClass


def detection_postprocess_options(**values) -> bytes:
    """custom_options for TFLite_Detection_PostProcess, a flexbuffer map as converters write
    it (ints as ints, thresholds and scales as floats, use_regular_nms as a bool)."""
    out = {}
    for key, v in values.items():
        if key in _FLOAT_KEYS:
            v = float(v)
        elif key == "use_regular_nms":
            v = bool(v)
        elif isinstance(v, (int, np.integer)):
            v = int(v)
        out[key] = v
    return bytes(flexbuffers.Dumps(out))


def _number(op, key, value, kind):
    """A flexbuffer scalar as AsInt32/AsFloat/AsBool read it (numbers convert across kinds)."""
    if isinstance(value, (bool, int, float)) and (kind is float or math.isfinite(value)):
        return kind(value)
    raise ModelError(f"op #{op.index} ({op.name}): custom option '{key}' must be a finite "
                     f"number, got {type(value).__name__} {value!r}")


def _parse_postprocess(op) -> PostProcessOptions:
    what = f"op #{op.index} ({op.name})"
    m = flexbuffer_map(op, "the op's parameters")
    missing = [k for k in _INT_KEYS + _FLOAT_KEYS if k not in m]
    if missing:
        raise ModelError(f"{what}: custom_options lack {', '.join(missing)}")
    values = {k: _number(op, k, m[k], int) for k in _INT_KEYS}
    values.update({k: _number(op, k, m[k], float) for k in _FLOAT_KEYS})
    # the optional keys: absent or null mean LiteRT's defaults
    for key, kind, default in (("detections_per_class", int, DEFAULT_DETECTIONS_PER_CLASS),
                               ("use_regular_nms", bool, False)):
        values[key] = default if m.get(key) is None else _number(op, key, m[key], kind)
    # LiteRT keeps the parameters in float32 (OpData)
    values.update({k: float(np.float32(values[k])) for k in _FLOAT_KEYS})
    return PostProcessOptions(**values)


def _dtype_name(spec) -> str:
    return np.dtype(spec.dtype).name if spec.dtype is not None else "untyped"


def _require_float_view(node, spec, what):
    """float32, or 8-bit quantized (read through its float view)."""
    dtype = np.dtype(spec.dtype) if spec.dtype is not None else None
    if dtype == np.float32 and spec.quantization is None:
        return
    if dtype in (np.dtype(np.uint8), np.dtype(np.int8)) and spec.quantization is not None:
        return
    raise node.fail(f"{what} '{spec.name}' is {_dtype_name(spec)}"
                    f"{' quantized' if spec.quantization is not None else ''}; expected float32 "
                    "or quantized uint8/int8")


def _check_postprocess_options(node):
    o = node.options
    if o.max_detections < 0:
        raise node.fail(f"max_detections must be >= 0, is {o.max_detections}")
    if o.max_classes_per_detection < 1:
        raise node.fail(f"max_classes_per_detection must be >= 1, is "
                        f"{o.max_classes_per_detection}")
    if o.num_classes < 1:
        raise node.fail(f"num_classes must be >= 1, is {o.num_classes}")
    if not 0.0 < o.nms_iou_threshold <= 1.0:
        raise node.fail(f"nms_iou_threshold must lie in (0, 1], is {o.nms_iou_threshold}")
    if o.use_regular_nms and min(o.detections_per_class, o.max_detections) < 1:
        raise node.fail("regular NMS needs detections_per_class and max_detections >= 1, has "
                        f"{o.detections_per_class} and {o.max_detections}")


def _infer_postprocess(node):
    _check_postprocess_options(node)
    o = node.options
    boxes, classes, anchors = node.inputs
    for spec, what in ((boxes, "box encodings"), (classes, "class predictions"),
                       (anchors, "anchors")):
        _require_float_view(node, spec, what)
    if boxes.rank != 3 or boxes.shape[0] != 1 or boxes.shape[2] < 4:
        raise node.fail(f"box encodings '{boxes.name}' must be [1, boxes, >= 4], has shape "
                        f"{list(boxes.shape)}")
    n = boxes.shape[1]
    if classes.rank != 3 or tuple(classes.shape[:2]) != (1, n):
        raise node.fail(f"class predictions '{classes.name}' must be [1, {n}, classes], has "
                        f"shape {list(classes.shape)}")
    if classes.shape[2] - o.num_classes not in (0, 1):
        raise node.fail(f"class predictions '{classes.name}' have {classes.shape[2]} columns; "
                        f"num_classes {o.num_classes} needs {o.num_classes} or "
                        f"{o.num_classes + 1} (with a background column)")
    if tuple(anchors.shape) != (n, 4):
        raise node.fail(f"anchors '{anchors.name}' must be [{n}, 4], have shape "
                        f"{list(anchors.shape)}")
    if len(node.outputs) != 4:
        raise node.fail(f"has {len(node.outputs)} outputs; expected 4 (boxes, classes, scores, "
                        "num_detections)")
    for spec in node.outputs:
        if spec.dtype is None or np.dtype(spec.dtype) != np.float32 or spec.quantization:
            raise node.fail(f"output '{spec.name}' is {_dtype_name(spec)}; the outputs are "
                            "float32")
    d = o.max_detections * o.max_classes_per_detection
    return [(1, d, 4), (1, d), (1, d), (1,)]


def decode_boxes(encodings: np.ndarray, anchors: np.ndarray, o: PostProcessOptions) -> np.ndarray:
    """Center-size encodings [N, >=4] and anchors [N, 4] -> corners [N, 4] (ymin, xmin, ymax,
    xmax) in float32, LiteRT's DecodeCenterSizeBoxes (double math, float32 results)."""
    e = np.asarray(encodings, np.float32)[:, :4].astype(np.float64)
    a = np.asarray(anchors, np.float32).astype(np.float64)
    with np.errstate(all="ignore"):
        ycenter = _f32(e[:, 0] / o.y_scale * a[:, 2] + a[:, 0])
        xcenter = _f32(e[:, 1] / o.x_scale * a[:, 3] + a[:, 1])
        half_h = _f32(0.5 * np.exp(e[:, 2] / o.h_scale) * a[:, 2])
        half_w = _f32(0.5 * np.exp(e[:, 3] / o.w_scale) * a[:, 3])
        return np.stack([ycenter - half_h, xcenter - half_w, ycenter + half_h,
                         xcenter + half_w], axis=1)


def _check_corners(node, corners):
    bad = np.flatnonzero((corners[:, 0] > corners[:, 2]) | (corners[:, 1] > corners[:, 3]))
    if bad.size:
        raise node.fail(f"decoded box {int(bad[0])} has ymin > ymax or xmin > xmax (a negative "
                        f"anchor height or width in '{node.inputs[2].name}'), which LiteRT "
                        "refuses")


def nms_single_class(boxes: _Boxes, scores, score_threshold, iou_threshold, cap) -> list:
    """LiteRT's NonMaxSuppressionSingleClassHelper: the selected box indices, best first."""
    scores = _f32(scores)
    keep = np.flatnonzero(scores >= np.float32(score_threshold))
    order = keep[np.argsort(-scores[keep], kind="stable")]   # DecreasingArgSort: stable
    active = np.ones(order.size, bool)
    selected = []
    for i in range(order.size):
        if len(selected) >= min(order.size, cap) or not active.any():
            break
        if not active[i]:
            continue
        selected.append(int(order[i]))
        active[i] = False
        rest = np.flatnonzero(active[i + 1:]) + i + 1
        if rest.size:
            iou = boxes.iou(order[i], order[rest])
            active[rest[iou > np.float32(iou_threshold)]] = False
    return selected


def _fast_nms(boxes, scores, o, label_offset):
    """(box, class, score) rows, max_classes_per_detection per selected box."""
    per_class = scores[:, label_offset:]
    kept = min(o.max_classes_per_detection, o.num_classes)
    selected = nms_single_class(boxes, per_class.max(axis=1), o.nms_score_threshold,
                                o.nms_iou_threshold, o.max_detections)
    rows = []
    for i, box in enumerate(selected):
        for k, cls in enumerate(decreasing_partial_argsort(per_class[box], kept)):
            rows.append((o.max_classes_per_detection * i + k, box, cls, per_class[box, cls]))
    return rows, len(selected)


def _regular_nms(boxes, scores, o, label_offset):
    cap = min(o.detections_per_class, o.max_detections)
    merged = []             # (score, box, class), best first; a stable merge per class
    for cls in range(o.num_classes):
        column = scores[:, cls + label_offset]
        chosen = nms_single_class(boxes, column, o.nms_score_threshold, o.nms_iou_threshold,
                                  cap)
        merged = sorted(merged + [(column[b], b, cls) for b in chosen], key=lambda r: -r[0])
        merged = merged[:o.max_detections]
    rows = [(i, box, cls, score) for i, (score, box, cls) in enumerate(merged)]
    return rows, len(merged)


def litert_uint8_scores(values, quantization) -> np.ndarray:
    """uint8 class predictions as LiteRT dequantizes them (optimized_ops::Dequantize): its
    SIMD loop, over whole blocks of 8 values, computes q * scale + (-zero_point * scale) in
    float32 (two roundings), the remaining values (q - zero_point) * scale (one rounding, as
    the float view). `values` is the float view, from which q is recovered exactly."""
    scale = np.float32(quantization.scale[0])
    zero_point = int(quantization.zero_point[0])
    flat = np.asarray(values, np.float32).reshape(-1)
    q = np.rint(flat.astype(np.float64) / float(scale)) + zero_point
    blocked = flat.size - flat.size % 8
    out = flat.copy()
    zero_times_scale = np.float32(-zero_point * float(scale))    # int x double, as LiteRT
    out[:blocked] = _f32(q[:blocked].astype(np.float32) * scale) + zero_times_scale
    return out.reshape(np.shape(values))


def _reference_postprocess(node, inputs):
    o = node.options
    encodings, predictions, anchors = (np.asarray(x, np.float32) for x in inputs)
    spec = node.inputs[1]
    if np.dtype(spec.dtype) == np.uint8 and spec.quantization is not None:
        predictions = litert_uint8_scores(predictions, spec.quantization)
    corners = decode_boxes(encodings[0], anchors, o)
    _check_corners(node, corners)
    boxes = _Boxes(corners)
    scores = predictions[0]
    label_offset = scores.shape[1] - o.num_classes
    nms = _regular_nms if o.use_regular_nms else _fast_nms
    rows, count = nms(boxes, scores, o, label_offset)
    d = o.max_detections * o.max_classes_per_detection
    out_boxes = np.zeros((1, d, 4), np.float32)
    out_classes = np.zeros((1, d), np.float32)
    out_scores = np.zeros((1, d), np.float32)
    for row, box, cls, score in rows:
        out_boxes[0, row] = corners[box]
        out_classes[0, row] = cls
        out_scores[0, row] = score
    return [out_boxes, out_classes, out_scores, np.array([count], np.float32)]


DETECTION_POSTPROCESS = register_op(OpDef(
    name="CUSTOM:TFLite_Detection_PostProcess", infer=_infer_postprocess,
    reference=_reference_postprocess, parse=_parse_postprocess, min_inputs=3, max_inputs=3,
    litert_leaves_rows_unwritten=True))


# -- NON_MAX_SUPPRESSION_V4 / V5 -------------------------------------------------------------
def _require_plain(node, i, what, dtype, rank):
    spec = node.inputs[i]
    if spec is None:
        raise node.fail(f"input {i} ({what}) is missing")
    if spec.dtype is None or np.dtype(spec.dtype) != dtype or spec.quantization is not None:
        raise node.fail(f"{what} '{spec.name}' is {_dtype_name(spec)}"
                        f"{' quantized' if spec.quantization is not None else ''}; expected "
                        f"{np.dtype(dtype).name}")
    if spec.rank != rank:
        raise node.fail(f"{what} '{spec.name}' must have rank {rank}, has shape "
                        f"{list(spec.shape)}")
    return spec


def _check_nms_outputs(node, soft):
    want = ([np.int32, np.float32, np.int32] if soft else [np.int32, np.int32])
    names = (["selected_indices", "selected_scores", "valid_outputs"] if soft
             else ["selected_indices", "valid_outputs"])
    if len(node.outputs) != len(want):
        raise node.fail(f"has {len(node.outputs)} outputs; expected {len(want)} "
                        f"({', '.join(names)})")
    for spec, dtype, name in zip(node.outputs, want, names):
        if spec.dtype is None or np.dtype(spec.dtype) != dtype or spec.quantization:
            raise node.fail(f"output {name} '{spec.name}' is {_dtype_name(spec)}; expected "
                            f"{np.dtype(dtype).name}")


def _max_output_size(node) -> int:
    size = int(node.input_value(2, "max_output_size"))
    if size < 0:
        raise node.fail(f"max_output_size (tensor '{node.inputs[2].name}') must be >= 0, is "
                        f"{size}")
    return size


def _infer_nms(node, soft):
    boxes = _require_plain(node, 0, "boxes", np.float32, 2)
    if boxes.shape[1] != 4:
        raise node.fail(f"boxes '{boxes.name}' must be [boxes, 4], has shape "
                        f"{list(boxes.shape)}")
    scores = _require_plain(node, 1, "scores", np.float32, 1)
    if scores.shape[0] != boxes.shape[0]:
        raise node.fail(f"scores '{scores.name}' has {scores.shape[0]} entries for "
                        f"{boxes.shape[0]} boxes")
    _require_plain(node, 2, "max_output_size", np.int32, 0)
    _require_plain(node, 3, "iou_threshold", np.float32, 0)
    _require_plain(node, 4, "score_threshold", np.float32, 0)
    if soft:
        sigma = _require_plain(node, 5, "soft_nms_sigma", np.float32, 0)
        if sigma.value is not None:
            _soft_nms_sigma(node, sigma.value)
    _check_nms_outputs(node, soft)
    size = _max_output_size(node)
    return [(size,), (size,), ()] if soft else [(size,), ()]


def _soft_nms_sigma(node, value) -> np.float32:
    sigma = np.float32(value)
    if not sigma >= 0:
        raise node.fail(f"soft_nms_sigma (tensor '{node.inputs[5].name}') must be >= 0, is "
                        f"{float(sigma)}")
    return sigma


def non_max_suppression(boxes, scores, max_output_size, iou_threshold, score_threshold,
                        sigma=0.0):
    """LiteRT's reference_ops::NonMaxSuppression: (selected indices, their scores)."""
    corners = _f32(boxes).reshape(-1, 4)
    # two opposite corners in either order: min and max per axis, as LiteRT takes them
    boxes = _Boxes(np.concatenate([np.minimum(corners[:, :2], corners[:, 2:]),
                                   np.maximum(corners[:, :2], corners[:, 2:])], axis=1))
    scores = _f32(scores).reshape(-1)
    iou_threshold, score_threshold = np.float32(iou_threshold), np.float32(score_threshold)
    queue = _StdHeap(lambda a, b: a.score < b.score)      # std::priority_queue<Candidate>
    heap = []
    for i in np.flatnonzero(scores > score_threshold):
        queue.push(heap, _Candidate(int(i), scores[i], 0))
    wanted = min(len(heap), int(max_output_size))
    scale = np.float32(-0.5) / sigma if sigma > 0 else np.float32(0)
    selected, selected_scores = [], []
    while len(selected) < wanted and heap:
        candidate = queue.pop(heap)
        score = candidate.score
        hard = False
        for j in range(len(selected) - 1, candidate.suppress_begin - 1, -1):
            iou = boxes.iou(candidate.index, [selected[j]])[0]
            if iou >= iou_threshold:
                hard = True
                break
            if sigma > 0:       # std::exp of a float: expf, correctly rounded as here
                score = np.float32(score * np.float32(math.exp(scale * iou * iou)))
            if score <= score_threshold:
                break
        if hard:
            continue
        met = len(selected)     # the selections this candidate has been compared with
        if score == candidate.score:
            selected.append(candidate.index)
            selected_scores.append(score)
        if score > score_threshold:     # LiteRT pushes a selected candidate back as well
            queue.push(heap, _Candidate(candidate.index, score, met))
    return selected, selected_scores


@dataclass(frozen=True)
class _Candidate:
    index: int
    score: np.float32
    suppress_begin: int


def _reference_nms(node, inputs, soft):
    size = int(np.asarray(inputs[2]))
    if size < 0:
        raise node.fail(f"max_output_size (tensor '{node.inputs[2].name}') must be >= 0, is "
                        f"{size}")
    sigma = _soft_nms_sigma(node, inputs[5]) if soft else np.float32(0)
    chosen, chosen_scores = non_max_suppression(inputs[0], inputs[1], size, inputs[3],
                                                inputs[4], sigma)
    indices = np.zeros(size, np.int32)
    indices[:len(chosen)] = chosen
    valid = np.array(len(chosen), np.int32)
    if not soft:
        return [indices, valid]
    out_scores = np.zeros(size, np.float32)
    out_scores[:len(chosen)] = chosen_scores
    return [indices, out_scores, valid]


NON_MAX_SUPPRESSION_V4 = register_op(OpDef(
    name="NON_MAX_SUPPRESSION_V4", infer=lambda node: _infer_nms(node, soft=False),
    reference=lambda node, inputs: _reference_nms(node, inputs, soft=False),
    options_class="NonMaxSuppressionV4Options", min_inputs=5, max_inputs=5))

NON_MAX_SUPPRESSION_V5 = register_op(OpDef(
    name="NON_MAX_SUPPRESSION_V5", infer=lambda node: _infer_nms(node, soft=True),
    reference=lambda node, inputs: _reference_nms(node, inputs, soft=True),
    options_class="NonMaxSuppressionV5Options", min_inputs=6, max_inputs=6))

__all__ = ["DETECTION_POSTPROCESS", "NON_MAX_SUPPRESSION_V4", "NON_MAX_SUPPRESSION_V5",
           "detection_postprocess_options", "decode_boxes", "non_max_suppression"]
