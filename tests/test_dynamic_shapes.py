"""Dynamic shapes: a model whose input has -1 in its shape_signature runs after
resize_tensor_input, shapes propagated by every op's infer (and through IF/WHILE subgraphs),
against LiteRT; on the reference path and on the delegate (re-planned and recompiled per
shape); invalid resizes are clear errors that leave the interpreter usable."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tflite_taichi import Interpreter
from tflite_taichi.builder import ModelBuilder
from tflite_taichi.errors import InputError
from tflite_taichi.testing import (TAICHI_EXAMPLES, examples, assert_float_close, assert_quantized_close,
                                   check_against_litert, check_delegate, random_input, run_litert,
                                   strategies)

litert = pytest.importorskip("ai_edge_litert.interpreter")
S = strategies()
CIN, COUT = 3, 4
MODEL_RTOL, MODEL_INT8_UNITS = 1e-4, 3       # whole models, as tests/test_models.py


def conv_mean_model(seed=0):
    """x (-1, -1, -1, 3) -> CONV_2D 3x3 SAME -> RESHAPE to (n, h*w, 4), the target built as
    converters do (SHAPE -> STRIDED_SLICE -> SQUEEZE -> PACK, folded at prepare) -> MEAN over
    the pixels -> (n, 4). Declared for a 1x8x8x3 input."""
    rng = np.random.default_rng(seed)
    b = ModelBuilder()
    g = b.subgraph()
    x = g.input("x", (1, 8, 8, CIN), shape_signature=(-1, -1, -1, CIN))
    y = g.tensor("conv", (1, 8, 8, COUT), shape_signature=(-1, -1, -1, COUT))
    g.op("CONV_2D", [x, g.const("filter", rng.uniform(-1, 1, (COUT, 3, 3, CIN)).astype(np.float32)),
                     g.const("bias", rng.uniform(-1, 1, COUT).astype(np.float32))], [y],
         padding="SAME", stride_h=1, stride_w=1, fused_activation_function="RELU")
    shape = g.tensor("shape", (4,), np.int32)
    g.op("SHAPE", [y], [shape], out_type="INT32")
    n1 = g.tensor("n1", (1,), np.int32)
    g.op("STRIDED_SLICE", [shape] + [g.const(k, np.array([v], np.int32))
                                     for k, v in (("begin", 0), ("end", 1), ("strides", 1))], [n1])
    n = g.tensor("n", (), np.int32)
    g.op("SQUEEZE", [n1], [n], squeeze_dims=[0])
    target = g.tensor("target", (3,), np.int32)
    g.op("PACK", [n, g.const("minus_one", np.int32(-1)), g.const("cout", np.int32(COUT))], [target],
         values_count=3, axis=0)
    r = g.tensor("pixels", (1, 64, COUT), shape_signature=(-1, -1, COUT))
    g.op("RESHAPE", [y, target], [r])
    m = g.tensor("mean", (1, COUT), shape_signature=(-1, COUT))
    g.op("MEAN", [r, g.const("axis", np.array([1], np.int32))], [m], keep_dims=False)
    g.output(m)
    return b.finish()


MODEL = conv_mean_model()
shapes = st.tuples(st.integers(1, 3), st.integers(1, 9), st.integers(1, 9)).map(lambda s: s + (CIN,))


@given(shape=shapes, seed=S.seeds())
def test_resized_conv_reshape_mean_matches_litert(shape, seed):
    x = np.random.default_rng(seed).uniform(-1, 1, shape).astype(np.float32)
    out = check_against_litert(MODEL, [x])         # both resize the input from 1x8x8x3 first
    assert out[0].shape == (shape[0], COUT)


def _litert(model):
    return litert.Interpreter(model_content=model, experimental_op_resolver_type=litert.OpResolverType.BUILTIN_REF)


def _resize_and_run(it, shape, x):
    it.resize_tensor_input(it.get_input_details()[0]["index"], shape)
    it.allocate_tensors()
    it.set_tensor(it.get_input_details()[0]["index"], x)
    it.invoke()
    return it.get_tensor(it.get_output_details()[0]["index"])


@settings(max_examples=examples(20))
@given(sequence=st.lists(shapes, min_size=2, max_size=5), seed=S.seeds())
def test_one_interpreter_resized_again_and_again_matches_litert(sequence, seed):
    rng = np.random.default_rng(seed)
    ours, theirs = Interpreter(model_content=MODEL, backend="reference"), _litert(MODEL)
    for it in (ours, theirs):
        it.allocate_tensors()
    for shape in sequence:
        x = rng.uniform(-1, 1, shape).astype(np.float32)
        got, want = _resize_and_run(ours, shape, x), _resize_and_run(theirs, shape, x)
        assert_float_close(got, want, what=f"after resizing to {shape}")
        for a, e in zip(ours.get_output_details(), theirs.get_output_details()):
            np.testing.assert_array_equal(a["shape"], e["shape"])
            np.testing.assert_array_equal(a["shape_signature"], e["shape_signature"])


@pytest.mark.parametrize("bad, message", [
    ([2, 5, 7], r"op #0 \(CONV_2D\): input must have rank 4"),
    ([2, 5, 7, 5], r"op #0 \(CONV_2D\): input channels \(5\)"),
])
def test_an_invalid_resize_is_an_input_error_and_the_interpreter_stays_usable(bad, message):
    """LiteRT fails allocate_tensors and is unusable until a valid resize; here the error
    names the input and the op, and the previous shapes stay in force."""
    it = Interpreter(model_content=MODEL, backend="reference")
    x = np.random.default_rng(0).uniform(-1, 1, (2, 4, 4, CIN)).astype(np.float32)
    before = _resize_and_run(it, x.shape, x)
    it.resize_tensor_input(0, bad)
    with pytest.raises(InputError, match=rf"resizing input 'x' to \[{', '.join(map(str, bad))}\] does "
                                         rf"not fit the model: {message}.*keeps its previous input shapes"):
        it.allocate_tensors()
    assert list(it.get_input_details()[0]["shape"]) == [2, 4, 4, CIN]
    it.invoke()                                    # the last input set is still there
    np.testing.assert_array_equal(it.get_tensor(it.get_output_details()[0]["index"]), before)
    x2 = x[:1, :3]
    assert_float_close(_resize_and_run(it, x2.shape, x2), run_litert(MODEL, [x2])[0])
    with pytest.raises(InputError, match=r"not allowed by its shape_signature \[-1, -1, -1, 3\]"):
        it.resize_tensor_input(0, [1, 2, 2, 4], strict=True)


def test_an_invalid_first_allocate_is_the_op_error():
    """Nothing to fall back to before a first successful allocate_tensors."""
    it = Interpreter(model_content=MODEL, backend="reference")
    it.resize_tensor_input(0, [1, 4, 4])
    with pytest.raises(Exception, match=r"op #0 \(CONV_2D\): input must have rank 4"):
        it.allocate_tensors()


def if_while_model():
    """x (-1, 3): IF c: x*2 else WHILE i < 3: x + 1; declared for 2x3, subgraphs too."""
    b = ModelBuilder()
    g = b.subgraph("main")
    c = g.input("c", (), np.bool_)
    x = g.input("x", (2, 3), shape_signature=(-1, 3))
    y = g.tensor("y", (2, 3), shape_signature=(-1, 3))
    g.op("IF", [c, x], [y], then_subgraph_index=1, else_subgraph_index=2)
    z = g.tensor("z", (2, 1, 3), shape_signature=(-1, 1, 3))
    g.op("EXPAND_DIMS", [y, g.const("axis", np.int32(1))], [z])
    g.output(z)
    t = b.subgraph("then")
    tx = t.input("x", (2, 3))
    ty = t.tensor("y", (2, 3))
    t.op("MUL", [tx, t.const("two", np.float32(2))], [ty])
    t.output(ty)
    e = b.subgraph("else")
    ex = e.input("x", (2, 3))
    outs = [e.tensor("i_out", (), np.int32), e.tensor("x_out", (2, 3))]
    e.op("WHILE", [e.const("i0", np.int32(0)), ex], outs, cond_subgraph_index=3, body_subgraph_index=4)
    e.output(outs[1])
    cond = b.subgraph("cond")
    ci = cond.input("i", (), np.int32)
    cond.input("x", (2, 3))
    go = cond.tensor("go", (), np.bool_)
    cond.op("LESS", [ci, cond.const("three", np.int32(3))], [go])
    cond.output(go)
    body = b.subgraph("body")
    bi, bx = body.input("i", (), np.int32), body.input("x", (2, 3))
    i_next, x_next = body.tensor("i_next", (), np.int32), body.tensor("x_next", (2, 3))
    body.op("ADD", [bi, body.const("one", np.int32(1))], [i_next])
    body.op("ADD", [bx, body.const("one_f", np.float32(1))], [x_next])
    body.output(i_next, x_next)
    return b.finish()


@settings(max_examples=examples(20))
@given(rows=st.integers(1, 6), cond=st.booleans(), seed=S.seeds())
def test_resizes_propagate_through_if_and_while_subgraphs_like_litert(rows, cond, seed):
    x = np.random.default_rng(seed).uniform(-1, 1, (rows, 3)).astype(np.float32)
    out = check_against_litert(if_while_model(), [np.array(cond), x])
    assert out[0].shape == (rows, 1, 3)


# -- on the delegate --------------------------------------------------------------------------
@settings(max_examples=max(TAICHI_EXAMPLES // 2, 3))   # re-planning; the kernels have their tests
@given(shape=shapes, seed=S.seeds())
def test_resized_model_is_replanned_on_the_delegate(taichi_workers, shape, seed):
    """Each worker's interpreter resizes the 1x8x8x3 input before allocate_tensors: the
    partition is planned and compiled for the new shape, every op delegated."""
    x = np.random.default_rng(seed).uniform(-1, 1, shape).astype(np.float32)
    summaries = check_delegate(MODEL, taichi_workers, [x])
    for summary in summaries.values():
        assert summary["ops_delegated"] == 3 and len(summary["partitions"]) == 1


RESIZER = r'''
import json, sys, warnings
import numpy as np
warnings.simplefilter("ignore")
from tflite_taichi import Interpreter
from tflite_taichi.errors import InputError
args = json.loads(sys.argv[1])
it = Interpreter(model_path=args["model"], backend=args["backend"])
it.allocate_tensors()
results = []
for shape in args["shapes"]:
    try:
        it.resize_tensor_input(0, shape)
        it.allocate_tensors()
        x = np.random.default_rng(len(results)).uniform(-1, 1, shape).astype(np.float32)
        it.set_tensor(0, x)
    except InputError as e:
        it.invoke()          # still usable: the previous shapes and input
        results.append({"error": str(e), "shape": it.get_input_details()[0]["shape"].tolist()})
        continue
    it.invoke()
    results.append({"out": it.get_tensor(it.get_output_details()[0]["index"]).tolist(),
                    "delegated": it.summary()["ops_delegated"]})
print("RESULT " + json.dumps(results), flush=True)
'''


def test_one_delegated_interpreter_through_several_resizes(tmp_path):
    """One Taichi interpreter (the first backend under test) resized four times, once
    invalidly: recompiled per shape, matching LiteRT, usable after the invalid resize."""
    from conftest import TAICHI_BACKENDS
    if not TAICHI_BACKENDS:
        pytest.skip("no Taichi backend under test")
    path = tmp_path / "model.tflite"
    path.write_bytes(MODEL)
    sequence = [[2, 5, 7, CIN], [1, 3, 3, CIN], [1, 3, 3], [3, 2, 6, CIN]]
    env = dict(os.environ, ENABLE_TAICHI_HEADER_PRINT="False")
    proc = subprocess.run([sys.executable, "-c", RESIZER, json.dumps(
        {"model": str(path), "backend": TAICHI_BACKENDS[0], "shapes": sequence})],
        capture_output=True, text=True, timeout=300, env=env,
        cwd=tmp_path)       # not the checkout: its tflite_taichi/ lacks ops/ (the installed one has it)
    lines = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout + proc.stderr
    results = json.loads(lines[0][len("RESULT "):])
    for i, (shape, result) in enumerate(zip(sequence, results)):
        if len(shape) != 4:
            assert "op #0 (CONV_2D): input must have rank 4" in result["error"]
            assert result["shape"] == [1, 3, 3, CIN]
            continue
        x = np.random.default_rng(i).uniform(-1, 1, shape).astype(np.float32)
        assert result["delegated"] == 3
        assert_float_close(np.array(result["out"], np.float32), run_litert(MODEL, [x])[0],
                           what=f"{TAICHI_BACKENDS[0]} after resizing to {shape}")


@pytest.mark.models
@pytest.mark.parametrize("name", ["mobilenet_v1_fp32", "mobilenet_v1_int8"])
def test_mobilenet_with_its_dynamic_batch_resized_matches_litert(shared_models, name):
    """The converter left batch -1 in mobilenet_v1's input signature: batch 3, strictly."""
    path = os.path.join(shared_models, f"{name}.tflite")
    ours, theirs = Interpreter(model_path=path, backend="reference"), litert.Interpreter(model_path=path)
    assert list(ours.get_input_details()[0]["shape_signature"]) == [-1, 224, 224, 3]
    detail = ours.get_input_details()[0]
    x = random_input(dict(detail, shape=np.array([3, 224, 224, 3])), np.random.default_rng(0), 0.0, 1.0)
    for it in (ours, theirs):
        it.resize_tensor_input(detail["index"], [3, 224, 224, 3], strict=True)
        it.allocate_tensors()
        it.set_tensor(detail["index"], x)
        it.invoke()
    got = ours.get_tensor(ours.get_output_details()[0]["index"])
    want = theirs.get_tensor(theirs.get_output_details()[0]["index"])
    assert got.shape == want.shape == (3, 1000)
    if got.dtype == np.int8:
        assert_quantized_close(got, want, MODEL_INT8_UNITS, what=name)
    else:
        assert_float_close(got, want, MODEL_RTOL, what=name)


# -- data-dependent shapes: WHERE of a run-time condition and what reads it -------------------
def boolean_mask_model(rows, cols, threshold):
    """x[x > threshold] as converters write tf.boolean_mask: GREATER -> WHERE -> GATHER_ND (the
    last two of run-time shape [n, 2] and [n]), then SUM of the selected values ([] again a
    fixed shape, inferred at invoke all the same); MUL(x, x) beside them is static."""
    b = ModelBuilder()
    g = b.subgraph()
    x = g.input("x", (rows, cols))
    mask = g.tensor("mask", (rows, cols), np.bool_)
    g.op("GREATER", [x, g.const("threshold", np.array(threshold, np.float32))], [mask])
    where = g.tensor("where", (1, 2), np.int64, shape_signature=(-1, 2))
    g.op("WHERE", [mask], [where])
    picked = g.tensor("picked", (1,), shape_signature=(-1,))
    g.op("GATHER_ND", [x, where], [picked])
    total = g.tensor("total", ())
    g.op("SUM", [picked, g.const("axis", np.array([0], np.int32))], [total], keep_dims=False)
    square = g.tensor("square", (rows, cols))
    g.op("MUL", [x, x], [square])
    g.output(picked, total, square)
    return b.finish()


@given(rows=st.integers(1, 6), cols=st.integers(1, 6), threshold=st.floats(-0.9, 0.9), seed=S.seeds())
def test_boolean_mask_matches_litert_invoke_after_invoke(rows, cols, threshold, seed):
    """The same interpreter, three invokes with different numbers of selected elements."""
    model = boolean_mask_model(rows, cols, threshold)
    ours = Interpreter(model_content=model, backend="reference")
    ours.allocate_tensors()
    theirs = litert.Interpreter(model_content=model)
    theirs.allocate_tensors()
    rng = np.random.default_rng(seed)
    for _ in range(3):
        x = rng.uniform(-1, 1, (rows, cols)).astype(np.float32)
        x.flat[0] = 1.0                     # at least one selected (LiteRT cannot return empty tensors)
        for it in (ours, theirs):
            it.set_tensor(it.get_input_details()[0]["index"], x)
            it.invoke()
        picked = theirs.get_tensor(theirs.get_output_details()[0]["index"])
        for d_ours, d_theirs in zip(ours.get_output_details(), theirs.get_output_details()):
            a, e = ours.get_tensor(d_ours["index"]), theirs.get_tensor(d_theirs["index"])
            assert list(d_ours["shape"]) == list(d_theirs["shape"]) == list(e.shape)
            # the SUM's rounding scales with its terms, not its result: numpy sums pairwise,
            # LiteRT in order, and a sum that cancels (0.0009 from terms near 1, a draw that
            # failed) differs by the terms' ulps. So its scale is the sum of |terms|.
            floor = float(np.sum(np.abs(picked))) if d_ours["name"] == "total" else 0.0
            assert_float_close(a, e, what=d_ours["name"], floor=floor)


def test_boolean_mask_with_nothing_selected_gives_empty_outputs():
    model = boolean_mask_model(2, 3, 0.5)
    it = Interpreter(model_content=model, backend="reference")
    it.allocate_tensors()
    it.set_tensor(it.get_input_details()[0]["index"], np.zeros((2, 3), np.float32))
    it.invoke()
    picked, total, square = (it.get_tensor(d["index"]) for d in it.get_output_details())
    assert picked.shape == (0,) and total == 0 and square.shape == (2, 3)


def test_data_dependent_ops_stay_on_the_cpu_and_the_rest_is_delegated(taichi_workers):
    model = boolean_mask_model(4, 5, 0.0)
    x = np.random.default_rng(3).uniform(-1, 1, (4, 5)).astype(np.float32)
    summaries = check_delegate(model, taichi_workers, [x], expect_all_delegated=False)
    for backend, summary in summaries.items():
        on_cpu = {row["op"]: row["reason"] for row in summary["fallback"]}
        assert set(on_cpu) == {"WHERE", "GATHER_ND", "SUM"}, (backend, on_cpu)
        assert all("data-dependent" in reason for reason in on_cpu.values()), on_cpu
        assert summary["ops_delegated"] == 2        # GREATER and MUL


# -- shape-deciding inputs known only at invoke ------------------------------------------------
def _run_time_parameter_cases():
    """(op, model, inputs): ops whose output shape depends on an input that is a run-time tensor
    here (a computed shape, paddings, begin, a loop counter in a converted WHILE body). They used
    to be refused at allocate ("must be known before invoke"); LiteRT runs them, and so do we,
    inferring the op again at every invoke (converted Keras recurrent layers need it)."""
    from tflite_taichi.testing import Const, Input, Output, one_op_model
    rng = np.random.default_rng(3)
    x23 = rng.uniform(-1, 1, (2, 3)).astype(np.float32)
    i32 = lambda v: np.array(v, np.int32)              # noqa: E731
    return [
        ("RESHAPE", one_op_model("RESHAPE", [Input((2, 3)), Input((2,), np.int32)], [Output((3, 2))]),
         [x23, i32([3, 2])]),
        ("TRANSPOSE", one_op_model("TRANSPOSE", [Input((2, 3)), Input((2,), np.int32)], [Output((3, 2))]),
         [x23, i32([1, 0])]),
        ("TILE", one_op_model("TILE", [Input((2, 3)), Input((2,), np.int32)], [Output((4, 3))]),
         [x23, i32([2, 1])]),
        ("FILL", one_op_model("FILL", [Input((2,), np.int32), Input(())], [Output((2, 3))]),
         [i32([2, 3]), np.array(1.5, np.float32)]),
        ("RANGE", one_op_model("RANGE", [Input((), np.int32), Const(i32(5)), Const(i32(1))],
                               [Output((5,), np.int32)]), [i32(1)]),
        ("REVERSE_V2", one_op_model("REVERSE_V2", [Input((2, 3)), Input((1,), np.int32)],
                                    [Output((2, 3))]), [x23, i32([1])]),
        ("BATCH_TO_SPACE_ND", one_op_model("BATCH_TO_SPACE_ND", [
            Input((4, 2, 2, 1)), Input((2,), np.int32), Const(i32([[0, 0], [0, 0]]))], [Output((1, 4, 4, 1))]),
         [rng.uniform(-1, 1, (4, 2, 2, 1)).astype(np.float32), i32([2, 2])]),
        ("PAD", one_op_model("PAD", [Input((2, 3)), Input((2, 2), np.int32)], [Output((4, 3))]),
         [x23, i32([[1, 1], [0, 2]])]),
        ("STRIDED_SLICE", one_op_model("STRIDED_SLICE", [
            Input((4, 5)), Input((2,), np.int32), Const(i32([3, 4])), Const(i32([1, 1]))], [Output((1, 1))]),
         [rng.uniform(-1, 1, (4, 5)).astype(np.float32), i32([1, 2])]),
        ("SLICE", one_op_model("SLICE", [Input((4, 5)), Input((2,), np.int32), Input((2,), np.int32)],
                               [Output((2, 3))]),
         [rng.uniform(-1, 1, (4, 5)).astype(np.float32), i32([1, 2]), i32([2, 3])]),
        ("TRANSPOSE_CONV", one_op_model("TRANSPOSE_CONV", [
            Input((4,), np.int32), Const(rng.uniform(-1, 1, (2, 3, 3, 3)).astype(np.float32)),
            Input((1, 3, 4, 3))], [Output((1, 6, 8, 2))], padding="SAME", stride_h=2, stride_w=2),
         [i32([1, 6, 8, 2]), rng.uniform(-1, 1, (1, 3, 4, 3)).astype(np.float32)]),
        ("SPLIT", one_op_model("SPLIT", [Input((), np.int32), Input((4, 6))], [Output((2, 6))] * 2,
                               num_splits=2), [i32(0), rng.uniform(-1, 1, (4, 6)).astype(np.float32)]),
    ]


@pytest.mark.parametrize("op, model, inputs", _run_time_parameter_cases(),
                         ids=[c[0] for c in _run_time_parameter_cases()])
def test_a_shape_given_at_run_time_is_inferred_at_invoke_like_litert(op, model, inputs):
    ours = check_against_litert(model, inputs)      # values, and shapes (assert_float_close)
    assert [np.shape(y) for y in ours] == [np.shape(y) for y in run_litert(model, inputs)]
