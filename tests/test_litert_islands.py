"""LiteRT islands (tflite_taichi.litert_islands): a sub-model of some ops of a subgraph runs
exactly what those ops run in the whole model.

The oracle is LiteRT itself: the whole model run with every intermediate kept
(experimental_preserve_all_tensors), each island of the islands model fed those intermediates.
With LiteRT's builtin kernels on both sides (no XNNPACK) the same kernels see the same inputs,
so outputs are bit-equal. With XNNPACK on both sides the test allows XNNPACK_FLOAT_RTOL (see
there). Islands are cut the way the partitioner will: never through an op that keeps state
(island_safe), and never right after an op whose inputs are all constants (XNNPACK holds a
dequantized fp16 weight as a static value it neither writes to its tensor nor hands out: the
partitioner folds those ops into constants before cutting).
"""
import os

import numpy as np
import pytest
from ai_edge_litert.interpreter import Interpreter as LiteRTInterpreter
from ai_edge_litert.interpreter import OpResolverType

from cases.control import delegated_around_if_model
from cases.state import accumulator_model
from tflite_taichi import litert_islands
from tflite_taichi.builder import ModelBuilder
from tflite_taichi.errors import BackendUnavailable, ModelError, TfliteTaichiError
from tflite_taichi.litert_islands import Island, island_index, island_of, island_safe, islands_model
from tflite_taichi.model import read_model

KERNELS = {"builtin": OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES, "xnnpack": OpResolverType.AUTO}

# XNNPACK on both sides: an op's XNNPACK kernel is the same whether the op sits in the whole
# model or in an island, but XNNPACK may fuse neighbours (a convolution with the clamp after
# it) and a cut between them moves where a float32 result is rounded: a few ulps at most, of
# the tensor's largest value. Measured here: 0 on every model (the whole run keeps every
# tensor, so it fuses nothing across a cut either). Integer tensors must stay equal: their
# kernels requantize identically.
XNNPACK_FLOAT_RTOL = 1e-6

SHARED = ["face_detection_short_range", "hand_landmark_lite", "iris_landmark",
          "mobilenet_v1_fp32", "mobilenet_v1_int8", "okay_nabu", "selfie_segmentation"]
# LiteRT has no kernel for these models' MediaPipe custom ops: only the ops before the first
# one can be its oracle, run as an island of all their results
LITERT_LACKS_AN_OP = {"selfie_segmentation"}


def _where_model() -> bytes:
    """x -> GREATER(x, 0) -> WHERE -> GATHER_ND(x, .) -> + 1: the gathered tensor's length is
    known only at run time (an island starting at GATHER_ND resizes its input)."""
    b = ModelBuilder()
    g = b.subgraph("main")
    x = g.input("x", (8,))
    positive = g.tensor("positive", (8,), np.bool_)
    g.op("GREATER", [x, g.const("zero", np.float32(0))], [positive])
    where = g.tensor("where", (8, 1), np.int64, shape_signature=(-1, 1))
    g.op("WHERE", [positive], [where])
    gathered = g.tensor("gathered", (8,), shape_signature=(-1,))
    g.op("GATHER_ND", [x, where], [gathered])
    out = g.tensor("out", (8,), shape_signature=(-1,))
    g.op("ADD", [gathered, g.const("one", np.float32(1))], [out])
    g.output(out)
    return b.finish()


CASES = {"if_while": lambda: delegated_around_if_model((4,)), "where": _where_model}


def _model_bytes(shared_models, name) -> bytes:
    if name in CASES:
        return CASES[name]()
    with open(os.path.join(shared_models, f"{name}.tflite"), "rb") as f:
        return f.read()


# -- LiteRT ---------------------------------------------------------------------------------------
def _litert(data: bytes, kernels: str, preserve: bool = False):
    return LiteRTInterpreter(model_content=data, experimental_op_resolver_type=KERNELS[kernels],
                             experimental_preserve_all_tensors=preserve)


def _feeds(model, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    feeds = {}
    for t in model.main.inputs:
        tensor = model.main.tensors[t]
        if tensor.dtype.kind == "f":
            feeds[t] = rng.standard_normal(tensor.shape).astype(tensor.dtype)
        elif tensor.dtype.kind == "b":
            feeds[t] = np.array(rng.integers(0, 2, tensor.shape), bool)
        elif tensor.dtype == np.int32:      # loop counts and the like: small
            feeds[t] = rng.integers(0, 4, tensor.shape).astype(tensor.dtype)
        else:
            info = np.iinfo(tensor.dtype)
            feeds[t] = rng.integers(info.min, info.max, tensor.shape, endpoint=True).astype(tensor.dtype)
    return feeds


def _run(wrapper, subgraph: int, feeds: dict, outputs) -> dict:
    """Resizes where a fed shape differs, allocates, feeds, invokes; {tensor: value}."""
    for t, value in feeds.items():
        if tuple(wrapper.TensorSize(t, subgraph)) != value.shape:
            wrapper.ResizeInputTensor(t, np.array(value.shape, np.int32), False, subgraph)
    wrapper.AllocateTensors(subgraph)
    for t, value in feeds.items():
        wrapper.SetTensor(t, value, subgraph)
    wrapper.Invoke(subgraph)
    return {t: wrapper.GetTensor(t, subgraph) for t in outputs}


def _written(sg, ops) -> list:
    return [t for i in ops for t in sg.operators[i].outputs]


def _all_constant_inputs(sg, op) -> bool:
    return all(t == -1 or sg.tensors[t].data is not None for t in op.inputs)


def _reference(data, model, kernels, feeds, ops) -> dict:
    """Every tensor main's ops `ops` write, as LiteRT computes them: the whole model with every
    intermediate kept or, where LiteRT lacks an op of it, the ops before that op as one island."""
    sg = model.main
    wanted = [t for t in _written(sg, ops) if not _all_constant_inputs(sg, _producer(sg)[t])]
    if len(ops) == len(sg.operators):
        it = _litert(data, kernels, preserve=True)
        return _run(it._interpreter, 0, feeds, wanted)
    prefix = Island(0, tuple(ops), tuple(feeds), tuple(wanted))
    it = _litert(islands_model(data, model, [prefix]), kernels)
    return _run(it._interpreter, island_index(model, 0), feeds, wanted)


def _producer(sg) -> dict:
    return {t: op for op in sg.operators for t in op.outputs}


# -- cutting islands the way the partitioner will ---------------------------------------------------
def _runnable_ops(name, model) -> list:
    ops = model.main.operators
    if name in LITERT_LACKS_AN_OP:
        ops = ops[:next(op.index for op in ops if op.name.startswith("CUSTOM:"))]
    return [op.index for op in ops]


def _cuttable(sg, runnable, safe) -> list:
    """Positions c (between op c-1 and op c) an island boundary may take: both sides safe, and
    no op before c whose inputs are all constants is read at c or later."""
    last_reader = {}
    for op in sg.operators:
        for t in op.inputs:
            last_reader[t] = op.index
    held_until = 0
    cuts = []
    for c in runnable[1:]:
        op = sg.operators[c - 1]
        if _all_constant_inputs(sg, op):
            held_until = max([held_until] + [last_reader.get(t, 0) for t in op.outputs])
        if c > held_until and safe[c - 1] and safe[c]:
            cuts.append(c)
    return cuts


def _islands(name, model, seed: int):
    """(chunks, single): 2-4 contiguous islands covering main's safe runnable ops, in order,
    cut at seeded random places, and one single-op island."""
    rng = np.random.default_rng(seed)
    sg = model.main
    runnable = _runnable_ops(name, model)
    safe = {i: island_safe(model, 0, i) is None for i in runnable}
    cuts = _cuttable(sg, runnable, safe)
    chosen = sorted(rng.choice(cuts, min(len(cuts), int(rng.integers(1, 4))), replace=False).tolist())
    runs, current = [], []
    for i in runnable:
        if not safe[i] or i in chosen:
            if current:
                runs.append(current)
            current = []
        if safe[i]:
            current.append(i)
    if current:
        runs.append(current)
    producer = _producer(sg)
    singles = [i for i in runnable if safe[i] and not _all_constant_inputs(sg, sg.operators[i])
               and not any(t in producer and _all_constant_inputs(sg, producer[t])
                           for t in sg.operators[i].inputs)]
    single = int(rng.choice(singles))
    return [_within(model, runnable, run) for run in runs], island_of(model, 0, [single])


def _within(model, runnable, ops) -> Island:
    """island_of, less the weights it would hand to ops past LiteRT's reach (ops this test
    leaves off, where LiteRT lacks an op of the model): they are no test of ours."""
    island = island_of(model, 0, ops)
    sg, outside = model.main, set(runnable) - set(ops)
    read = {t for i in outside for t in sg.operators[i].inputs} | set(sg.outputs)
    producer = _producer(sg)
    kept = tuple(t for t in island.outputs if t in read or not _all_constant_inputs(sg, producer[t]))
    return Island(island.subgraph, island.ops, island.inputs, kept)


def _compare(got, want, kernels, what):
    if kernels == "builtin" or want.dtype.kind != "f":
        np.testing.assert_array_equal(got, want, err_msg=what)
    else:
        np.testing.assert_allclose(got, want, rtol=XNNPACK_FLOAT_RTOL,
                                   atol=XNNPACK_FLOAT_RTOL * float(np.max(np.abs(want), initial=0)),
                                   err_msg=what)


MODELS = SHARED + sorted(CASES)


@pytest.mark.parametrize("kernels", sorted(KERNELS))
@pytest.mark.parametrize("name", MODELS)
def test_islands_run_what_the_whole_model_runs(shared_models, name, kernels):
    """Each island, fed the whole model's intermediates, gives the intermediates it computes;
    the islands run one after the other, each fed what the earlier ones gave (and what the
    ops left off islands gave in the whole run), give the model's outputs."""
    data = _model_bytes(shared_models, name)
    model = read_model(data)
    chunks, single = _islands(name, model, seed=len(name))
    islands = chunks + [single]
    assert len(chunks) >= 2 or name == "okay_nabu" or len(model.main.operators) < 4
    feeds = _feeds(model, seed=7)
    runnable = _runnable_ops(name, model)
    want = _reference(data, model, kernels, feeds, runnable)
    known = {**feeds, **want}
    it = _litert(islands_model(data, model, islands), kernels)
    wrapper = it._interpreter
    for k, island in enumerate(islands):
        got = _run(wrapper, island_index(model, k), {t: known[t] for t in island.inputs}, island.outputs)
        for t, value in got.items():
            _compare(value, want[t], kernels, f"{name} island {k} output {t}")

    on_islands = {i for island in chunks for i in island.ops}
    chained = {**feeds, **{t: v for t, v in want.items()
                           if _producer(model.main)[t].index not in on_islands}}
    for k, island in enumerate(chunks):
        chained.update(_run(wrapper, island_index(model, k), {t: chained[t] for t in island.inputs},
                            island.outputs))
    ends = [t for t in (model.main.outputs if len(runnable) == len(model.main.operators)
                        else chunks[-1].outputs) if t in want]
    assert ends
    for t in ends:
        _compare(chained[t], want[t], kernels, f"{name} chained output {t}")


def test_an_island_input_of_run_time_shape_is_resized():
    """WHERE's result has as many rows as x has positive values: the island after it is
    resized to them (the declared shape is 8)."""
    data = _where_model()
    model = read_model(data)
    islands = [island_of(model, 0, [0, 1]), island_of(model, 0, [2, 3])]
    assert islands[1].inputs == (0, 3)
    it = _litert(islands_model(data, model, islands), "builtin")
    x = np.array([-1, 2, -3, 4, 5, -6, -7, -8], np.float32)
    where = _run(it._interpreter, island_index(model, 0), {0: x}, [3])[3]
    out = _run(it._interpreter, island_index(model, 1), {0: x, 3: where}, [model.main.outputs[0]])
    np.testing.assert_array_equal(out[model.main.outputs[0]], [3, 5, 6])


def test_every_shared_model_is_checked(shared_models):
    found = sorted(f[:-len(".tflite")] for f in os.listdir(shared_models) if f.endswith(".tflite"))
    assert found == sorted(SHARED)


@pytest.mark.parametrize("name", SHARED)
def test_constants_keep_their_alignment(shared_models, name):
    """Each constant's data lies as far from a 16-byte boundary as in the original file
    (the head's length is a multiple of it), and the original subgraphs are at their indices."""
    import tflite.Model
    data = _model_bytes(shared_models, name)
    model = read_model(data)
    out = islands_model(data, model, [island_of(model, 0, [_islands(name, model, 0)[1].ops[0]])])
    assert out[4:8] == b"TFL3"
    before, after = tflite.Model.GetRootAs(data, 0), tflite.Model.GetRootAs(out, 0)
    assert after.BuffersLength() == before.BuffersLength()
    for i in range(before.BuffersLength()):
        if before.Buffers(i).DataLength():
            old = before.Buffers(i)._tab.Vector(4)
            new = after.Buffers(i)._tab.Vector(4)
            assert (new - old) % 16 == 0 and out[new:new + 16] == data[old:old + 16], f"buffer {i}"
    islands = read_model(out)
    assert [sg.name for sg in islands.subgraphs[:len(model.subgraphs)]] == [sg.name for sg in model.subgraphs]
    assert len(islands.subgraphs) == len(model.subgraphs) + 1


def test_metadata_and_descriptions_are_carried():
    b = ModelBuilder(description="kept")
    g = b.subgraph("main")
    x = g.input("x", (3,))
    y = g.tensor("y", (3,))
    g.op("RELU", [x], [y])
    g.output(y)
    b.metadata("note", b"hello")
    data = b.finish()
    model = read_model(data)
    out = read_model(islands_model(data, model, [island_of(model, 0, [0])]))
    assert out.description == "kept" and out.metadata == {"note": b"hello"}
    assert out.subgraphs[1].operators[0].name == "RELU"
    assert (out.subgraphs[1].inputs, out.subgraphs[1].outputs) == ((x,), (y,))


# -- what a sub-model cannot express ---------------------------------------------------------------
def _chain_model(external=False) -> bytes:
    """x -> RELU -> a -> ADD(a, 1) -> b -> NEG -> y"""
    b = ModelBuilder()
    g = b.subgraph("main")
    x = g.input("x", (4,))
    a, s, y = g.tensor("a", (4,)), g.tensor("s", (4,)), g.tensor("y", (4,))
    g.op("RELU", [x], [a])
    g.op("ADD", [a, g.const("one", np.ones(4, np.float32))], [s])
    g.op("NEG", [s], [y])
    g.output(y)
    return b.finish(external_buffers=external)


X, A, ONE, S, Y = 0, 1, 4, 2, 3     # _chain_model's tensor indices


def _refused(data, islands, match):
    with pytest.raises(BackendUnavailable, match=match):
        islands_model(data, read_model(data), islands)


def test_the_chain_model_runs_as_islands():
    """The refusals below are of one good model: it runs (so what they refuse is their own)."""
    data = _chain_model()
    model = read_model(data)
    assert [t.name for t in model.main.tensors] == ["x", "a", "s", "y", "one"]
    out = islands_model(data, model, [Island(0, (0, 1), (X,), (S,)), Island(0, (2,), (S,), (Y,))])
    wrapper = _litert(out, "builtin")._interpreter
    x = np.array([-1, 0, 1, 2], np.float32)
    s = _run(wrapper, island_index(model, 0), {X: x}, [S])[S]
    np.testing.assert_array_equal(_run(wrapper, island_index(model, 1), {S: s}, [Y])[Y], -(np.maximum(x, 0) + 1))


def test_refuses_buffers_outside_the_flatbuffer():
    _refused(_chain_model(external=True), [Island(0, (0,), (X,), (A,))], "outside the flatbuffer")


def test_refuses_ops_not_in_the_subgraph():
    _refused(_chain_model(), [Island(0, (3,), (S,), (Y,))], r"op #3 is not in the subgraph")
    _refused(_chain_model(), [Island(1, (0,), (X,), (A,))], r"subgraph 1 is not in the model")
    _refused(_chain_model(), [Island(0, (), (X,), ())], "has no ops")


def test_refuses_ops_out_of_execution_order():
    _refused(_chain_model(), [Island(0, (1, 0), (X,), (S,))], "not in execution order")
    _refused(_chain_model(), [Island(0, (0, 0), (X,), (A,))], "not in execution order")


def test_refuses_an_input_its_own_op_writes():
    _refused(_chain_model(), [Island(0, (0, 1), (X, A), (S,))], "written by the island's own op #0")


def test_refuses_an_output_no_op_of_it_writes():
    _refused(_chain_model(), [Island(0, (1,), (A,), (S, Y))], "output tensor 3 .* written by no op")
    # an input handed straight out is fine
    islands_model(_chain_model(), read_model(_chain_model()), [Island(0, (1,), (A,), (S, A))])


def test_refuses_what_no_one_gives_it():
    _refused(_chain_model(), [Island(0, (1,), (), (S,))], "reads tensor 1 .* not an input")
    _refused(_chain_model(), [Island(0, (1,), (A, ONE), (S,))], "input tensor 4 .* is a constant")
    _refused(_chain_model(), [Island(0, (1,), (A,), (S, 9))], "output tensor 9 is not in")


def test_refuses_resource_variables():
    """VAR_HANDLE, READ_VARIABLE, ASSIGN_VARIABLE touch a resource; CALL_ONCE calls the init
    subgraph that does; the ADD between them does not."""
    data = accumulator_model((2,), np.zeros(2, np.float32))
    model = read_model(data)
    names = {op.name: op.index for op in model.main.operators}
    for name in ("VAR_HANDLE", "READ_VARIABLE", "ASSIGN_VARIABLE"):
        assert "resource tensor" in island_safe(model, 0, names[name])
    assert island_safe(model, 0, names["CALL_ONCE"]).startswith("calls subgraph 1, whose op #0 (VAR_HANDLE)")
    assert island_safe(model, 0, names["ADD"]) is None
    read = model.main.operators[names["READ_VARIABLE"]]
    _refused(data, [Island(0, (read.index,), (read.inputs[0],), read.outputs)], "resource tensor")


def _variable_tensor_model() -> bytes:
    """y = x + v, v a variable tensor; then IF calling a subgraph that reads such a tensor."""
    b = ModelBuilder()
    g = b.subgraph("main")
    x = g.input("x", (2,))
    v = g.tensor("v", (2,), is_variable=True)
    y, z = g.tensor("y", (2,)), g.tensor("z", (2,))
    g.op("ADD", [x, v], [y])
    g.op("IF", [g.const("c", np.bool_(True)), y], [z], then_subgraph_index=1, else_subgraph_index=1)
    g.output(z)
    branch = b.subgraph("branch")
    bx = branch.input("x", (2,))
    bv, by = branch.tensor("v", (2,), is_variable=True), branch.tensor("y", (2,))
    branch.op("ADD", [bx, bv], [by])
    branch.output(by)
    return b.finish()


def test_refuses_variable_tensors():
    data = _variable_tensor_model()
    model = read_model(data)
    assert "variable tensor 1 ('v')" in island_safe(model, 0, 0)
    assert island_safe(model, 0, 1).startswith("calls subgraph 1, whose op #0 (ADD) uses variable tensor")
    _refused(data, [Island(0, (0,), (0,), (2,))], "variable tensor")
    _refused(data, [Island(0, (1,), (2,), (3,))], "calls subgraph 1")


def test_refuses_bytes_of_another_model():
    data = _chain_model()
    other = delegated_around_if_model((4,))
    with pytest.raises(ModelError, match="not the same model"):
        islands_model(other, read_model(data), [Island(0, (0,), (X,), (A,))])
    with pytest.raises(ModelError, match="not the same model"):
        islands_model(data[:-8], read_model(data), [Island(0, (0,), (X,), (A,))])
    same_size = read_model(other)
    same_size.size = len(data)      # bytes of the size read, of other subgraphs
    with pytest.raises(ModelError, match="do not hold the subgraphs of the model read"):
        islands_model(data, same_size, [Island(0, (0,), (X,), (A,))])


# -- hostile bytes ------------------------------------------------------------------------------------
def _mutants(data: bytes, seed: int, count: int):
    """Byte flips, overwritten 32-bit words (offsets, lengths) in the flatbuffer's structure,
    truncations."""
    rng = np.random.default_rng(seed)
    for _ in range(count):
        mutant = bytearray(data)
        kind = rng.integers(0, 3)
        if kind == 0:
            for pos in rng.integers(0, len(data), int(rng.integers(1, 8))):
                mutant[pos] ^= 1 << int(rng.integers(0, 8))
        elif kind == 1:
            pos = int(rng.integers(0, len(data) // 4)) * 4
            word = int(rng.choice([0, 1, 0x7FFFFFFF, 0xFFFFFFFF, len(data), int(rng.integers(0, 1 << 32))]))
            mutant[pos:pos + 4] = word.to_bytes(4, "little")
        else:
            del mutant[int(rng.integers(8, len(data))):]
        yield bytes(mutant)


def test_hostile_bytes_raise_from_the_family():
    """Mutated models, read by read_model where it accepts them, or paired with the reading
    of the unmutated model (bytes and model disagreeing): islands_model answers with bytes or
    one of our errors, never another exception or a hang; the bytes it answers with parse."""
    data = delegated_around_if_model((4,))
    good = read_model(data)
    islands = [island_of(good, 0, [0]), island_of(good, 0, [1, 2])]
    answered = refused = 0
    for mutant in _mutants(data, seed=3, count=400):
        try:
            model = read_model(mutant)
        except TfliteTaichiError:
            model = good
        try:
            out = islands_model(mutant, model, islands)
        except TfliteTaichiError:
            refused += 1
            continue
        answered += 1
        if model is not good:
            assert len(read_model(out).subgraphs) == len(model.subgraphs) + 2
    assert answered and refused


def test_a_buffer_count_past_the_file_is_a_model_error():
    """A mutated buffers length (2**31) stops at the file's end, as a ModelError."""
    import tflite.Model
    data = _chain_model()
    root = tflite.Model.GetRootAs(data, 0)._tab
    field = root.Pos + root.Offset(12)
    length_at = root.Indirect(field)
    mutant = bytearray(data)
    mutant[length_at:length_at + 4] = (0x7FFFFFFF).to_bytes(4, "little")
    with pytest.raises(ModelError):
        islands_model(bytes(mutant), read_model(data), [Island(0, (0,), (X,), (A,))])


def test_island_index_follows_the_original_subgraphs():
    model = read_model(delegated_around_if_model((4,)))
    assert [island_index(model, k) for k in range(2)] == [5, 6]
    assert litert_islands.BUFFER_ALIGNMENT % 16 == 0


def test_refuses_model_fields_this_schema_does_not_know(monkeypatch):
    """A Model table with a field past signature_defs (a newer schema's) cannot be carried: a
    head cannot tell a scalar from an offset it does not know."""
    import flatbuffers
    data = _chain_model()
    model = read_model(data)
    newer = litert_islands._write_head          # a head of the same fields, plus slot 8 = 7

    def head_with_a_newer_field(original, n_subgraphs, islands):
        monkeypatch.setattr(litert_islands, "_MODEL_FIELDS", 9)
        b_end = flatbuffers.Builder.EndObject

        def end_object(b):
            if len(b.current_vtable) == 9:
                b.PrependUint32Slot(8, 7, 0)
            return b_end(b)
        monkeypatch.setattr(flatbuffers.Builder, "EndObject", end_object)
        try:
            return newer(original, n_subgraphs, islands)
        finally:
            monkeypatch.setattr(flatbuffers.Builder, "EndObject", b_end)
            monkeypatch.setattr(litert_islands, "_MODEL_FIELDS", 8)

    mutant = head_with_a_newer_field(litert_islands._Original(data), len(model.subgraphs), []) + data
    assert read_model(mutant).main.name == "main"
    with pytest.raises(BackendUnavailable, match=r"fields \[8\] this schema does not know"):
        islands_model(mutant, read_model(mutant), [Island(0, (0,), (X,), (A,))])
