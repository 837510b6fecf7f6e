"""CUSTOM:TFLite_Detection_PostProcess, NON_MAX_SUPPRESSION_V4 and _V5 vs LiteRT's kernels
through one-op models, and an SSD head (conv backbone -> box/class convs -> RESHAPE,
CONCATENATION, LOGISTIC -> the post-process op) end to end.

Data is drawn to make NMS decide things: anchors on a coarse grid with small offsets (boxes
overlap), scores from a few levels (ties between boxes and classes), thresholds equal to one
of the scores (the >= / > boundary), caps below and above the number of boxes. Exact where
the ops choose (indices, classes, counts); boxes and scores within the float tolerance.

Where LiteRT's result is undefined it is not compared: the fast path leaves the rows it does
not write as whatever its arena held, so only the rows it writes are compared and the zeros
here are checked on their own; LiteRT fails on int8 inputs, so int8 models are compared with
LiteRT running the float model on the dequantized values."""
import numpy as np
import pytest
from flatbuffers import flexbuffers
from hypothesis import given, strategies as st

from tflite_taichi.builder import as_quantization
from tflite_taichi.errors import ModelError
from tflite_taichi.ops.detection import detection_postprocess_options
from tflite_taichi.quant import dequantize
from tflite_taichi.testing import (Const, Input, Output, assert_float_close, check_against_litert,
                                   one_op_model, quantize_array, run_litert, run_ours, strategies)
from cases.detection import POSTPROCESS, SCALES, postprocess_outputs, ssd_image, ssd_model, ssd_ranges

S = strategies()


# -- TFLite_Detection_PostProcess: data and models -------------------------------------------
def grid_anchors(rng, n):
    """[n, 4] (ycenter, xcenter, h, w): centres on a 3x3 grid with small offsets and sizes
    near the grid step, so that neighbours overlap by varying amounts."""
    centres = rng.integers(0, 3, (n, 2)) * 0.3 + 0.2 + rng.normal(0, 0.03, (n, 2))
    sizes = rng.uniform(0.2, 0.45, (n, 2))
    return np.concatenate([centres, sizes], axis=1).astype(np.float32)


def tied_scores(rng, shape, levels):
    """Scores on `levels` evenly spaced levels in (0, 1) (ties), or continuous (levels 0)."""
    if levels == 0:
        return rng.uniform(0, 1, shape).astype(np.float32)
    return ((rng.integers(0, levels, shape) + 0.5) / levels).astype(np.float32)


@st.composite
def postprocess_case(draw, regular=None):
    num_classes = draw(st.integers(1, 4))
    background = draw(st.booleans())
    regular = draw(st.booleans()) if regular is None else regular
    options = dict(
        max_detections=draw(st.integers(1 if regular else 0, 6)),
        max_classes_per_detection=draw(st.integers(1, num_classes + 1)),
        nms_iou_threshold=draw(st.sampled_from([0.01, 0.3, 0.5, 0.7, 1.0])),
        num_classes=num_classes, use_regular_nms=regular, **SCALES)
    if draw(st.booleans()):      # else LiteRT's default, 100
        options["detections_per_class"] = draw(st.integers(1, 5))
    return dict(n=draw(st.integers(1, 12)), columns=num_classes + background, options=options,
                levels=draw(st.sampled_from([0, 2, 3, 5])),
                threshold=draw(st.sampled_from(["none", "a score", "high"])),
                extra_columns=draw(st.integers(0, 2)), duplicate=draw(st.booleans()),
                seed=draw(S.seeds()))


def postprocess_data(case):
    """(box encodings [1, n, 4 + extra], class predictions [1, n, columns], anchors,
    options with the score threshold set from the drawn scores). `duplicate`: the last box
    a copy of the first (IoU exactly 1: the threshold 1 is not exceeded)."""
    rng = np.random.default_rng(case["seed"])
    n = case["n"]
    boxes = rng.normal(0, 1.0, (1, n, 4 + case["extra_columns"])).astype(np.float32)
    classes = tied_scores(rng, (1, n, case["columns"]), case["levels"])
    anchors = grid_anchors(rng, n)
    if case.get("duplicate"):
        boxes[0, -1], anchors[-1] = boxes[0, 0], anchors[0]
    options = dict(case["options"])
    options["nms_score_threshold"] = {
        "none": 0.0, "high": 0.9,
        "a score": float(rng.choice(classes.reshape(-1)))}[case["threshold"]]
    return boxes, classes, anchors, options


def postprocess_model(options, box_shape, class_shape, anchors, box_dtype=np.float32,
                      class_dtype=np.float32, box_q=None, class_q=None, anchor_q=None,
                      custom_options=None):
    declared = dict(options, max_detections=max(options["max_detections"], 0),
                    max_classes_per_detection=max(options["max_classes_per_detection"], 0))
    return one_op_model(
        POSTPROCESS,
        [Input(box_shape, box_dtype, box_q, name="box_encodings"),
         Input(class_shape, class_dtype, class_q, name="class_predictions"),
         Const(anchors, anchor_q, name="anchors")],
        postprocess_outputs(declared),
        custom_options=custom_options or detection_postprocess_options(**options))


def written_rows(options, count):
    """The output rows LiteRT writes: the regular path all of the first `count`; the fast
    path, for each of `count` boxes, its first min(max_classes, num_classes) rows."""
    per_box = options["max_classes_per_detection"]
    if options.get("use_regular_nms"):
        return np.arange(count)
    kept = min(per_box, options["num_classes"])
    return np.array([per_box * i + k for i in range(count) for k in range(kept)], np.int64)


def assert_detections_match(actual, expected, options):
    """The same count; on the rows LiteRT writes, the same classes and boxes and scores
    within the float tolerance; every other row zero here."""
    boxes, classes, scores, count = actual
    np.testing.assert_array_equal(count, expected[3], err_msg="num_detections")
    rows = written_rows(options, int(expected[3][0]))
    np.testing.assert_array_equal(classes[0, rows], expected[1][0, rows], err_msg="classes")
    assert_float_close(scores[0, rows], expected[2][0, rows], what="scores")
    assert_float_close(boxes[0, rows], expected[0][0, rows], what="boxes")
    unwritten = np.setdiff1d(np.arange(boxes.shape[1]), rows)
    for what, x in (("boxes", boxes), ("classes", classes), ("scores", scores)):
        assert not x[0, unwritten].any(), f"{what}: rows LiteRT does not write must be zero"


def run_postprocess_case(case, data=None):
    boxes, classes, anchors, options = data or postprocess_data(case)
    model = postprocess_model(options, boxes.shape, classes.shape, anchors)
    actual = run_ours(model, [boxes, classes])
    assert_detections_match(actual, run_litert(model, [boxes, classes]), options)
    return actual


# -- TFLite_Detection_PostProcess: properties -----------------------------------------------
@given(case=postprocess_case(regular=False))
def test_postprocess_fast_nms_matches_litert(case):
    run_postprocess_case(case)


@given(case=postprocess_case(regular=True))
def test_postprocess_regular_nms_matches_litert(case):
    run_postprocess_case(case)


@st.composite
def quant_postprocess_case(draw):
    case = draw(postprocess_case())
    return dict(case, box_q=draw(S.quant_params(np.uint8, scale_range=(0.01, 0.1))),
                class_q=draw(S.quant_params(np.uint8, scale_range=(0.002, 0.02))),
                anchor_q=(draw(st.sampled_from([1 / 256, 1 / 128, 0.003])),
                          draw(st.integers(0, 20))))


@given(case=quant_postprocess_case())
def test_postprocess_uint8_matches_litert(case):
    """uint8 box encodings with uint8 anchors and uint8 class predictions, each with its own
    scale and zero point (dequantized as LiteRT does: many ties)."""
    boxes, classes, anchors, options = postprocess_data(case)
    q_boxes = quantize_array(boxes, case["box_q"], np.uint8)
    q_classes = quantize_array(classes, case["class_q"], np.uint8)
    q_anchors = quantize_array(np.abs(anchors), case["anchor_q"], np.uint8)
    if case["threshold"] == "a score":     # on the grid: LiteRT's rounding decides >=
        grid = dequantize(q_classes, as_quantization(case["class_q"])).reshape(-1)
        options["nms_score_threshold"] = float(grid[case["seed"] % grid.size])
    model = postprocess_model(options, boxes.shape, classes.shape, q_anchors, np.uint8,
                              np.uint8, case["box_q"], case["class_q"], case["anchor_q"])
    expected = run_litert(model, [q_boxes, q_classes])
    assert_detections_match(run_ours(model, [q_boxes, q_classes]), expected, options)


@given(case=postprocess_case(), box_q=S.quant_params(np.int8, scale_range=(0.01, 0.1)),
       class_q=S.quant_params(np.int8, scale_range=(0.002, 0.02)))
def test_postprocess_int8_matches_litert_on_the_float_view(case, box_q, class_q):
    """LiteRT fails on int8 inputs; here they mean their dequantized values: the same result
    as LiteRT's on the float model given those values."""
    boxes, classes, anchors, options = postprocess_data(case)
    q_boxes = quantize_array(boxes, box_q, np.int8)
    q_classes = quantize_array(classes, class_q, np.int8)
    model = postprocess_model(options, boxes.shape, classes.shape, anchors, np.int8, np.int8,
                              box_q, class_q)
    float_model = postprocess_model(options, boxes.shape, classes.shape, anchors)
    expected = run_litert(float_model, [dequantize(q_boxes, as_quantization(box_q)),
                                        dequantize(q_classes, as_quantization(class_q))])
    assert_detections_match(run_ours(model, [q_boxes, q_classes]), expected, options)


def test_postprocess_background_column_and_padding():
    """Column 0 is the background (skipped) when there is one more column than classes;
    classes are numbered from the next column; rows after the detections are zero."""
    anchors = np.array([[0.2, 0.2, 0.2, 0.2], [0.8, 0.8, 0.2, 0.2]], np.float32)
    boxes = np.zeros((1, 2, 4), np.float32)
    classes = np.array([[[0.99, 0.1, 0.6], [0.99, 0.7, 0.2]]], np.float32)
    options = dict(max_detections=3, max_classes_per_detection=1, nms_score_threshold=0.0,
                   nms_iou_threshold=0.5, num_classes=2, **SCALES)
    model = postprocess_model(options, boxes.shape, classes.shape, anchors)
    out_boxes, out_classes, out_scores, count = run_ours(model, [boxes, classes])
    np.testing.assert_array_equal(count, [2])
    np.testing.assert_array_equal(out_classes, [[0, 1, 0]])     # box 1's class 0, box 0's 1
    np.testing.assert_allclose(out_scores, [[0.7, 0.6, 0]], rtol=1e-6)
    np.testing.assert_allclose(out_boxes[0], [[0.7, 0.7, 0.9, 0.9], [0.1, 0.1, 0.3, 0.3],
                                              [0, 0, 0, 0]], rtol=1e-6, atol=1e-7)
    assert_detections_match([out_boxes, out_classes, out_scores, count],
                            run_litert(model, [boxes, classes]), options)


@pytest.mark.parametrize("regular", [False, True])
def test_postprocess_iou_equal_to_the_threshold_keeps_the_box(regular):
    """Suppression needs IoU > nms_iou_threshold: a copy of a box (IoU exactly 1) survives
    the threshold 1, and not 0.99."""
    case = dict(n=4, columns=3, levels=0, threshold="none", extra_columns=0, duplicate=True,
                seed=11, options=dict(GOOD, max_detections=4, use_regular_nms=regular))
    for iou, copies in ((1.0, 2), (0.99, 1)):
        case["options"]["nms_iou_threshold"] = iou
        boxes, classes, anchors, options = postprocess_data(case)
        classes[0, :, 1:] = [[0.9, 0.1], [0.2, 0.3], [0.1, 0.2], [0.8, 0.1]]   # class 0 wins
        out = run_postprocess_case(case, (boxes, classes, anchors, options))
        assert sum(np.array_equal(b, out[0][0, 0]) for b in out[0][0]) == copies


# -- TFLite_Detection_PostProcess: bad options and shapes -----------------------------------
GOOD = dict(max_detections=3, max_classes_per_detection=1, nms_score_threshold=0.0,
            nms_iou_threshold=0.5, num_classes=2, **SCALES)


def bad_postprocess(custom_options=None, n=4, columns=3, anchors_shape=None, box_shape=None,
                    **changes):
    options = {**GOOD, **changes}
    anchors = np.ones(anchors_shape or (n, 4), np.float32)
    model = postprocess_model(options, box_shape or (1, n, 4), (1, n, columns), anchors,
                              custom_options=custom_options)
    return lambda: run_ours(model, [np.zeros(box_shape or (1, n, 4), np.float32),
                                    np.zeros((1, n, columns), np.float32)])


@pytest.mark.parametrize("raw, match", [
    (detection_postprocess_options(**GOOD)[:-5], "not a readable flexbuffer"),
    (b"\x01", "not a readable flexbuffer"),
    (bytes(flexbuffers.Dumps([1, 2, 3])), "must be a flexbuffer map"),
    (detection_postprocess_options(**{k: v for k, v in GOOD.items() if k != "num_classes"}),
     "lack num_classes"),
    (detection_postprocess_options(max_detections=3), "lack max_classes_per_detection"),
    (bytes(flexbuffers.Dumps({**GOOD, "max_detections": "three"})), "'max_detections' must be"),
])
def test_postprocess_malformed_custom_options(raw, match):
    with pytest.raises(ModelError, match=f"TFLite_Detection_PostProcess.*{match}"):
        bad_postprocess(custom_options=raw)()


def test_postprocess_without_custom_options():
    model = one_op_model(POSTPROCESS, [Input((1, 4, 4)), Input((1, 4, 3)),
                                       Const(np.ones((4, 4), np.float32))],
                         postprocess_outputs(GOOD))
    with pytest.raises(ModelError, match="flexbuffer map"):
        run_ours(model, [np.zeros((1, 4, 4), np.float32), np.zeros((1, 4, 3), np.float32)])


@pytest.mark.parametrize("kwargs, match", [
    (dict(num_classes=4), "have 3 columns; num_classes 4"),
    (dict(num_classes=1), "have 3 columns; num_classes 1"),
    (dict(num_classes=0), "num_classes must be >= 1"),
    (dict(nms_iou_threshold=0.0), r"nms_iou_threshold must lie in \(0, 1\]"),
    (dict(nms_iou_threshold=1.5), r"nms_iou_threshold must lie in \(0, 1\]"),
    (dict(max_classes_per_detection=0), "max_classes_per_detection must be >= 1"),
    (dict(max_detections=-1), "max_detections must be >= 0"),
    (dict(use_regular_nms=True, detections_per_class=0), "detections_per_class and max_det"),
    (dict(anchors_shape=(3, 4)), "anchors 'anchors' must be"),
    (dict(anchors_shape=(4, 5)), "anchors 'anchors' must be"),
    (dict(box_shape=(1, 4, 3)), "box encodings 'box_encodings' must be"),
    (dict(box_shape=(2, 4, 4)), "box encodings 'box_encodings' must be"),
])
def test_postprocess_bad_attributes_and_shapes(kwargs, match):
    with pytest.raises(ModelError, match=match):
        bad_postprocess(**kwargs)()


def test_postprocess_negative_anchor_size_fails_at_invoke():
    anchors = np.array([[0.5, 0.5, -0.2, 0.2]], np.float32)
    model = postprocess_model(GOOD, (1, 1, 4), (1, 1, 3), anchors)
    with pytest.raises(ModelError, match="ymin > ymax"):
        run_ours(model, [np.zeros((1, 1, 4), np.float32), np.ones((1, 1, 3), np.float32)])


def test_postprocess_outputs_must_be_float32():
    model = one_op_model(POSTPROCESS, [Input((1, 4, 4)), Input((1, 4, 3)),
                                       Const(np.ones((4, 4), np.float32))],
                         postprocess_outputs(GOOD)[:3] + [Output((1,), np.int32)],
                         custom_options=detection_postprocess_options(**GOOD))
    with pytest.raises(ModelError, match="output 'output_3' is int32"):
        run_ours(model, [np.zeros((1, 4, 4), np.float32), np.zeros((1, 4, 3), np.float32)])


# -- NON_MAX_SUPPRESSION_V4 / V5 -------------------------------------------------------------
@st.composite
def nms_case(draw):
    n = draw(st.integers(0, 10))
    return dict(n=n, size=draw(st.integers(0, n + 3)), levels=draw(st.sampled_from([0, 2, 4])),
                iou=draw(st.sampled_from([-0.1, 0.0, 0.3, 0.5, 0.8, 1.0, 1.2])),
                threshold=draw(st.sampled_from(["low", "a score", "high"])),
                sigma=draw(st.sampled_from([0.0, 0.1, 0.5, 2.0])),
                flat=draw(st.booleans()), duplicate=draw(st.booleans()), seed=draw(S.seeds()))


def nms_data(case):
    """Boxes as two opposite corners in either order, near a few centres (overlaps), maybe a
    copy of box 0, some flat (zero area: LiteRT's IoU 0, and its re-selection of such a box);
    tied scores."""
    rng = np.random.default_rng(case["seed"])
    n = case["n"]
    centres = rng.integers(0, 3, (n, 2)) * 0.5 + rng.normal(0, 0.05, (n, 2))
    half = rng.uniform(0.1, 0.4, (n, 2))
    if case["flat"] and n:
        half[rng.integers(0, n), 0] = 0
    first, second = centres - half, centres + half
    swap = rng.random((n, 1)) < 0.3
    boxes = np.concatenate([np.where(swap, second, first), np.where(swap, first, second)],
                           axis=1).astype(np.float32)
    if case.get("duplicate") and n > 1:      # IoU exactly 1 with box 0, for the threshold 1
        boxes[-1] = boxes[0]
    scores = tied_scores(rng, (n,), case["levels"])
    threshold = {"low": -1.0, "high": 0.95,
                 "a score": float(rng.choice(scores)) if n else 0.5}[case["threshold"]]
    return boxes, scores, np.float32(case["iou"]), np.float32(threshold)


def nms_model(n, size, soft, size_at_run_time=False):
    size_input = (Input((), np.int32, name="max_output_size") if size_at_run_time
                  else Const(np.array(size, np.int32), name="max_output_size"))
    inputs = [Input((n, 4), name="boxes"), Input((n,), name="scores"), size_input,
              Input((), name="iou_threshold"), Input((), name="score_threshold")]
    outputs = [Output((size,), np.int32, name="selected_indices")]
    if soft:
        inputs.append(Input((), name="soft_nms_sigma"))
        outputs.append(Output((size,), name="selected_scores"))
    outputs.append(Output((), np.int32, name="valid_outputs"))
    return one_op_model("NON_MAX_SUPPRESSION_V5" if soft else "NON_MAX_SUPPRESSION_V4",
                        inputs, outputs)


@given(case=nms_case())
def test_nms_v4_matches_litert(case):
    boxes, scores, iou, threshold = nms_data(case)
    model = nms_model(case["n"], case["size"], soft=False)
    check_against_litert(model, [boxes, scores, iou, threshold])


@given(case=nms_case())
def test_nms_v5_matches_litert(case):
    boxes, scores, iou, threshold = nms_data(case)
    model = nms_model(case["n"], case["size"], soft=True)
    check_against_litert(model, [boxes, scores, iou, threshold, np.float32(case["sigma"])])


@pytest.mark.parametrize("soft", [False, True])
def test_nms_max_output_size_at_run_time_matches_litert(soft):
    """A run-time max_output_size: the outputs' shape is known at invoke, padded to it."""
    case = dict(n=8, levels=2, iou=0.5, threshold="low", flat=True, seed=5)
    boxes, scores, iou, threshold = nms_data(case)
    model = nms_model(8, 4, soft, size_at_run_time=True)
    for size in (3, 10):
        inputs = [boxes, scores, np.array(size, np.int32), iou, threshold]
        inputs += [np.float32(0.5)] if soft else []
        out = check_against_litert(model, inputs)
        assert out[0].shape == (size,)


def test_nms_reselects_a_flat_box_as_litert_does():
    """A zero-area box has IoU 0 with itself, so LiteRT's pushing a selected box back onto its
    queue selects it again, before the next box (the cap: as many selections as candidates,
    so box 2 is left out); the same here."""
    boxes = np.array([[0, 0, 1, 1], [0.5, 0.5, 0.5, 0.9], [2, 2, 3, 3]], np.float32)
    scores = np.array([0.9, 0.7, 0.6], np.float32)
    model = nms_model(3, 4, soft=False)
    out = check_against_litert(model, [boxes, scores, np.float32(0.5), np.float32(0)])
    np.testing.assert_array_equal(out[0], [0, 1, 1, 0])
    assert out[1] == 3


def test_nms_iou_equal_to_the_threshold_suppresses():
    """Hard suppression at IoU >= iou_threshold: a copy of a box (IoU exactly 1) is dropped
    at the threshold 1; above it nothing is suppressed, and box 0, pushed back onto LiteRT's
    queue with its score, is selected again before its copy."""
    boxes = np.array([[0, 0, 1, 1], [0, 0, 1, 1]], np.float32)
    scores = np.array([0.9, 0.8], np.float32)
    model = nms_model(2, 2, soft=False)
    for iou, selected in ((1.0, [0, 0]), (1.01, [0, 0])):
        out = check_against_litert(model, [boxes, scores, np.float32(iou), np.float32(0)])
        assert out[0].tolist() == selected and out[1] == (1 if iou == 1.0 else 2)


@pytest.mark.parametrize("change, match", [
    (dict(boxes=Input((4, 3), name="boxes")), r"boxes 'boxes' must be \[boxes, 4\]"),
    (dict(boxes=Input((4, 4), np.int32, name="boxes")), "boxes 'boxes' is int32"),
    (dict(scores=Input((5,), name="scores")), "has 5 entries for 4 boxes"),
    (dict(size=Const(np.array([3], np.int32), name="max_output_size")), "must have rank 0"),
    (dict(size=Const(np.array(-1, np.int32), name="max_output_size")), "must be >= 0, is -1"),
    (dict(iou=Input((1,), name="iou_threshold")), "iou_threshold 'iou_threshold' must have"),
    (dict(sigma=Const(np.array(-0.5, np.float32), name="soft_nms_sigma")), "must be >= 0"),
])
def test_nms_bad_inputs(change, match):
    specs = dict(boxes=Input((4, 4), name="boxes"), scores=Input((4,), name="scores"),
                 size=Const(np.array(3, np.int32), name="max_output_size"),
                 iou=Input((), name="iou_threshold"), threshold=Input((), name="score_threshold"),
                 sigma=Input((), name="soft_nms_sigma"), **{})
    specs.update(change)
    model = one_op_model("NON_MAX_SUPPRESSION_V5", list(specs.values()),
                         [Output((3,), np.int32), Output((3,)), Output((), np.int32)])
    with pytest.raises(ModelError, match=match):
        run_ours(model, [np.zeros(s.shape, s.dtype) for s in specs.values()
                         if isinstance(s, Input)])


def test_nms_negative_sigma_at_run_time_fails_at_invoke():
    model = nms_model(2, 2, soft=True)
    inputs = [np.zeros((2, 4), np.float32), np.ones(2, np.float32), np.float32(0.5),
              np.float32(0), np.float32(-1)]
    with pytest.raises(ModelError, match="soft_nms_sigma.*must be >= 0"):
        run_ours(model, inputs)


@pytest.mark.parametrize("regular", [False, True])
def test_ssd_head_matches_litert(regular):
    model, options = ssd_model(regular)
    for seed in range(3):
        image = ssd_image(seed)
        actual = run_ours(model, [image])
        expected = run_litert(model, [image])
        assert expected[3][0] >= 2, "the test should see several detections"
        assert_detections_match(actual, expected, options)


@pytest.mark.parametrize("regular", [False, True])
def test_int8_ssd_head_matches_litert(regular):
    model, options = ssd_model(regular, ssd_ranges(regular))
    for seed in range(3):
        image = quantize_array(ssd_image(seed), (1 / 255, -128))
        actual = run_ours(model, [image])
        expected = run_litert(model, [image])
        assert expected[3][0] >= 2, "the test should see several detections"
        assert_detections_match(actual, expected, options)
