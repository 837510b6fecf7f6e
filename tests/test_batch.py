"""tflite_taichi.batch and `tflite-taichi batch`: a folder of inputs through a model in a local
pool of worker processes and on a local Ray cluster (Ray Data), against one Interpreter.

Every run here is checked item by item against one Interpreter of the same backend fed the same
decoded arrays one at a time: outputs must be *equal* (the workers run the same kernels; a batch
of 8 computes each row as a batch of 1 does), every good input written exactly once (read_outputs
refuses a key written twice), every bad one in errors.jsonl with its reason.
"""
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from batch_faults import FAULT_ENV, FAULTS, record_retirements, with_tests_on_path
from tflite_taichi import batch, switches
from tflite_taichi.batch.inputs import ItemError, decode, input_spec, parse_preprocess
from tflite_taichi.builder import ModelBuilder
from tflite_taichi.errors import BatchError
from tflite_taichi.interpreter import Interpreter
from tflite_taichi.metadata import Normalization, input_normalizations, normalization_metadata
from tflite_taichi.model import read_model
from tflite_taichi.testing import assert_float_close
from cases.batch import write_arrays

PIL = pytest.importorskip("PIL.Image", reason="the batch tests need Pillow (the test extra)")
pa = pytest.importorskip("pyarrow", reason="the batch tests need pyarrow (the test extra)")
import pyarrow.parquet as pq  # noqa: E402

SIDE, CHANNELS, FEATURES = 8, 3, 4
ITEM = (SIDE, SIDE, CHANNELS)
NORMALIZATION = Normalization([127.5], [127.5])
VICTIM = "victim_kill_me.npy"       # the input whose batch kills its worker (FAULT_ENV)


def conv_model(normalization=NORMALIZATION, reshape_to=None) -> bytes:
    """x [1, 8, 8, 3] (batch resizable) -> conv 3x3 + relu -> mean over H, W -> [1, 4]; with
    image normalization metadata. reshape_to: a Reshape at the end to this shape ([1, 4] as
    converters write it: the batch cannot grow; [1, -1]: it grows into the second dimension)."""
    mb = ModelBuilder()
    sg = mb.subgraph()
    rng = np.random.default_rng(0)
    x = sg.input("x", [1, SIDE, SIDE, CHANNELS], shape_signature=[-1, SIDE, SIDE, CHANNELS])
    w = sg.const("w", rng.standard_normal((FEATURES, 3, 3, CHANNELS)).astype(np.float32))
    b = sg.const("b", rng.standard_normal(FEATURES).astype(np.float32))
    y = sg.tensor("y", [1, SIDE, SIDE, FEATURES])
    sg.op("CONV_2D", [x, w, b], [y], padding=0, stride_w=1, stride_h=1, fused_activation_function=1)
    z = sg.tensor("z", [1, FEATURES])
    sg.op("MEAN", [y, sg.const("axes", np.array([1, 2], np.int32))], [z], keep_dims=False)
    if reshape_to is not None:
        out = sg.tensor("out", [1, FEATURES])
        sg.op("RESHAPE", [z, sg.const("shape", np.array(reshape_to, np.int32))], [out])
        z = out
    sg.output(z)
    if normalization is not None:
        mb.metadata("TFLITE_METADATA", normalization_metadata([normalization]))
    return mb.finish()


def batch_mixing_model() -> bytes:
    """y = x - mean(x over the first dimension): per item (batch 1) zero; the first dimension
    resizes and the output follows it, but rows are not independent."""
    mb = ModelBuilder()
    sg = mb.subgraph()
    x = sg.input("x", [1, FEATURES], shape_signature=[-1, FEATURES])
    m = sg.tensor("m", [1, FEATURES])
    sg.op("MEAN", [x, sg.const("axes", np.array([0], np.int32))], [m], keep_dims=True)
    y = sg.tensor("y", [1, FEATURES])
    sg.op("SUB", [x, m], [y])
    sg.output(y)
    return mb.finish()


def _png(path, rng, size=(12, 10)):
    pixels = rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    PIL.fromarray(pixels).save(path)


def write_dataset(folder, rng, n_npy=200, with_victim=False) -> dict:
    """A few hundred inputs of every kind, and bad ones; returns {"bad": {path: reason part}}."""
    os.makedirs(folder, exist_ok=True)
    item = (SIDE, SIDE, CHANNELS)
    for i in range(n_npy):
        shape = item if i % 3 else (1, *item)            # with and without the batch dimension
        np.save(os.path.join(folder, f"a{i:04d}.npy"), rng.standard_normal(shape).astype(np.float32))
    if with_victim:
        np.save(os.path.join(folder, VICTIM), rng.standard_normal(item).astype(np.float32))
    sub = os.path.join(folder, "more")
    os.makedirs(sub)
    for i in range(20):
        np.savez(os.path.join(sub, f"z{i:03d}.npz"),
                 serving_x=rng.standard_normal(item).astype(np.float32))
    for i in range(20):
        _png(os.path.join(sub, f"img{i:03d}.png"), rng)
    rows = [rng.standard_normal(item).astype(np.float32).tolist() for _ in range(40)]
    rows[7] = rows[7][:7]                                            # a bad row: 7 x 8 x 3
    pq.write_table(pa.table({"x": rows}), os.path.join(folder, "table.parquet"))
    bad = {os.path.join(folder, "garbage.npy"): "not a .npy file",
           os.path.join(folder, "wrong_shape.npy"): "has shape [5, 5, 3]",
           os.path.join(folder, "ints.npy"): "is int64",
           os.path.join(folder, "doubles.npy"): "is float64; input 'x' is float32",
           os.path.join(sub, "broken.png"): "not a readable image",
           os.path.join(folder, "notes.txt"): "not an input file",
           os.path.join(folder, "table.parquet#7"): "column 'x'"}
    with open(os.path.join(folder, "garbage.npy"), "wb") as f:
        f.write(b"this is not numpy")
    np.save(os.path.join(folder, "wrong_shape.npy"), np.zeros((5, 5, 3), np.float32))
    np.save(os.path.join(folder, "ints.npy"), np.ones(item, np.int64))
    np.save(os.path.join(folder, "doubles.npy"), rng.standard_normal(item))
    with open(os.path.join(sub, "broken.png"), "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n truncated")
    with open(os.path.join(folder, "notes.txt"), "w") as f:
        f.write("not an input")
    return {"bad": bad}


def expected_outputs(model: bytes, folder: str, run_one) -> dict:
    """{key: output} from one interpreter, item by item (run_one: decoded arrays -> outputs)."""
    spec = input_spec(Interpreter(model_content=model, backend="reference"))
    items, _ = batch.discover([folder])
    from tflite_taichi.batch.inputs import TableCache, load_payload
    tables, expected = TableCache(), {}
    for item in items:
        try:
            arrays = decode(spec, item.key, load_payload(item, tables))
        except ItemError:
            continue
        expected[item.key] = run_one([a[None] for a in arrays])[0][0]
    return expected


def reference_one(model, **options):
    """run(arrays) -> outputs, item by item on one interpreter (the reference path, or the
    backend `options` name)."""
    it = Interpreter(model_content=model, **{"backend": "reference", **options})
    it.allocate_tensors()

    def run(arrays):
        for d, a in zip(it.get_input_details(), arrays):
            it.set_tensor(d["index"], a)
        it.invoke()
        return [it.get_tensor(d["index"]).copy() for d in it.get_output_details()]
    return run


def worker_one(worker, model):
    return lambda arrays: worker.run(model, arrays)[0]


def check_run(result, out, expected, bad):
    found = batch.read_outputs(out)          # raises on a key written twice
    assert sorted(found) == sorted(expected), "lost or extra inputs"
    for key, want in expected.items():
        got = found[key]["z"]
        assert got.dtype == want.dtype and np.array_equal(got, want), key
    errors = {e["path"]: e["reason"] for e in batch.read_errors(out)}
    assert sorted(errors) == sorted(bad)
    for path, reason in bad.items():
        assert reason in errors[path], (path, errors[path])
    assert result.written == len(expected) and result.errors == len(bad)
    assert result.items == len(expected) + len(bad)
    with open(os.path.join(out, "_outputs.json")) as f:
        info = json.load(f)
    assert info["outputs"] == [{"name": "z", "column": "z", "shape": [FEATURES],
                                "dtype": "float32", "batch_dim": True}]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    folder = tmp_path_factory.mktemp("inputs")
    info = write_dataset(str(folder), np.random.default_rng(1))
    return str(folder), info["bad"]


@pytest.fixture(scope="module")
def model():
    return conv_model()


@pytest.fixture(scope="module")
def expected_reference(model, dataset):
    return expected_outputs(model, dataset[0], reference_one(model))


@pytest.fixture(scope="module")
def cpu_worker(taichi_workers):
    cpu = [w for w in taichi_workers if w.backend == "cpu"]
    if not cpu:
        pytest.fail("the batch tests need the cpu backend among TFLITE_TAICHI_TEST_BACKENDS")
    return cpu[0]


def test_the_expected_outputs_are_litert_s(model, dataset, expected_reference):
    """The one-interpreter outputs every run is held to equal, held in turn to LiteRT (its
    reference kernels) on the same decoded inputs, at the float tolerance of one op against
    LiteRT (FLOAT_RTOL: the same float32 math in another summation order)."""
    from ai_edge_litert.interpreter import Interpreter as LiteRT, OpResolverType
    it = LiteRT(model_content=model, experimental_op_resolver_type=OpResolverType.BUILTIN_REF)
    it.allocate_tensors()
    spec = input_spec(Interpreter(model_content=model, backend="reference"))
    from tflite_taichi.batch.inputs import TableCache, load_payload
    items, tables = {item.key: item for item in batch.discover([dataset[0]])[0]}, TableCache()
    for key, want in expected_reference.items():
        x = decode(spec, key, load_payload(items[key], tables))[0]
        it.set_tensor(it.get_input_details()[0]["index"], x[None])
        it.invoke()
        assert_float_close(want, it.get_tensor(it.get_output_details()[0]["index"])[0], what=key)
    assert len(expected_reference) == 200 + 20 + 20 + 39     # every good input of every kind


# -- the local pool ------------------------------------------------------------------------------
def both_workers_take_work(monkeypatch, tmp_path):
    """Each of two workers holds a task before either runs one (a slow start, Taichi's on a
    loaded machine, would otherwise leave one without work): imports=FAULTS."""
    monkeypatch.setenv(FAULT_ENV, f"together:2:{tmp_path / 'started'}")


@pytest.mark.parametrize("fmt", ["parquet", "npz"])
def test_local_pool_reference_equals_one_interpreter(model, dataset, expected_reference, tmp_path,
                                                     fmt, monkeypatch):
    folder, bad = dataset
    out = str(tmp_path / "out")
    both_workers_take_work(monkeypatch, tmp_path)
    result = batch.run(model, [folder], out, backend="reference", batch_size=8, workers=2, fmt=fmt,
                       imports=FAULTS)
    check_run(result, out, expected_reference, bad)
    assert {w["items_per_invoke"] for w in result.workers} == {8}
    assert sum(w["items"] for w in result.workers) == result.items - 1   # notes.txt: found, not run
    assert all(w["items"] > 0 for w in result.workers), "both workers took tasks"


def test_local_pool_cpu_equals_one_interpreter(model, dataset, cpu_worker, tmp_path, monkeypatch):
    folder, bad = dataset
    expected = expected_outputs(model, folder, worker_one(cpu_worker, model))
    out = str(tmp_path / "out")
    both_workers_take_work(monkeypatch, tmp_path)
    result = batch.run(model, [folder], out, backend="cpu", batch_size=8, workers=2, imports=FAULTS)
    check_run(result, out, expected, bad)
    assert result.backend == "cpu" and {w["backend"] for w in result.workers} == {"cpu"}
    assert {w["items_per_invoke"] for w in result.workers} == {8}
    assert all(w["items"] > 0 for w in result.workers), "both workers took tasks"


def test_local_pool_killed_worker_loses_nothing(model, tmp_path, monkeypatch):
    folder = str(tmp_path / "in")
    bad = write_dataset(folder, np.random.default_rng(2), n_npy=120, with_victim=True)["bad"]
    expected = expected_outputs(model, folder, reference_one(model))
    marker = str(tmp_path / "killed")
    monkeypatch.setenv(FAULT_ENV, f"kill:{VICTIM}:{marker}")
    out = str(tmp_path / "out")
    result = batch.run(model, [folder], out, backend="reference", batch_size=8, workers=2,
                       imports=FAULTS)
    assert os.path.exists(marker), "the victim's worker was not killed"
    check_run(result, out, expected, bad)
    assert result.restarts == 1


EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")


def test_workers_import_the_modules_that_register_custom_ops(tmp_path, monkeypatch):
    """A model with a custom op (examples/custom_op.py's CUSTOM:Swish): the workers are fresh
    processes, so they run it only when told to import the module that registers it."""
    monkeypatch.syspath_prepend(EXAMPLES)          # spawned workers take this sys.path
    import custom_op
    model = custom_op.build_model(1.5)
    folder = str(tmp_path / "in")
    write_arrays(folder, 12, (16, 16, 3), seed=4)
    expected = expected_outputs(model, folder, reference_one(model))
    out = str(tmp_path / "out")
    result = batch.run(model, [folder], out, backend="reference", batch_size=4, workers=2,
                       imports=["custom_op"])
    found = batch.read_outputs(out)
    assert result.written == 12 and sorted(found) == sorted(expected)
    assert all(np.array_equal(found[k]["pooled"], v) for k, v in expected.items())
    with pytest.raises(BatchError, match="--import no_such_module: ModuleNotFoundError"):
        batch.run(model, [folder], str(tmp_path / "out2"), backend="reference",
                  imports=["no_such_module"])


def test_local_pool_gives_up_only_the_input_that_kills_every_worker(model, tmp_path, monkeypatch):
    folder = str(tmp_path / "in")
    write_arrays(folder, 40, ITEM, seed=3, width=3)
    np.save(os.path.join(folder, VICTIM), np.zeros((SIDE, SIDE, CHANNELS), np.float32))
    monkeypatch.setenv(FAULT_ENV, f"kill:{VICTIM}:")           # no marker: every attempt dies
    out = str(tmp_path / "out")
    result = batch.run(model, [folder], out, backend="reference", batch_size=8, workers=1, retries=1,
                       imports=FAULTS)
    errors = batch.read_errors(out)
    # tasks of 32 in name order: a000..a031, then a032..a039 and the victim; the second is
    # halved at each death (9, 5, 3, 2 items) until the victim runs alone, and only it is lost
    assert [e["path"] for e in errors] == [os.path.join(folder, VICTIM)]
    assert "the worker running it alone died 2 times" in errors[0]["reason"]
    assert sorted(batch.read_outputs(out)) == sorted(
        os.path.join(folder, f"a{i:03d}.npy") for i in range(40))
    assert result.written == 40 and result.restarts == 4 + 2


def test_local_pool_kills_a_hung_worker_and_runs_its_batch_again(model, tmp_path, monkeypatch):
    folder = tmp_path / "in"
    write_arrays(folder, 60, ITEM, seed=12)
    np.save(folder / VICTIM, np.ones((SIDE, SIDE, CHANNELS), np.float32))
    expected = expected_outputs(model, str(folder), reference_one(model))
    marker = tmp_path / "hung"
    monkeypatch.setenv(FAULT_ENV, f"hang:{VICTIM}:{marker}")     # the first attempt sleeps an hour
    out = str(tmp_path / "out")
    result = batch.run(model, [str(folder)], out, backend="reference", batch_size=8, workers=1,
                       task_timeout=3, imports=FAULTS)
    assert marker.exists() and result.restarts == 1 and result.seconds < 60
    found = batch.read_outputs(out)
    assert sorted(found) == sorted(expected)
    assert all(np.array_equal(found[k]["z"], v) for k, v in expected.items())
    # every attempt hangs: given up after the retries, with the reason
    monkeypatch.setenv(FAULT_ENV, f"hang:{VICTIM}:")
    result = batch.run(model, [str(folder)], out, backend="reference", batch_size=8, workers=1,
                       task_timeout=2, retries=0, overwrite=True, imports=FAULTS)
    errors = batch.read_errors(out)
    assert str(folder / VICTIM) in {e["path"] for e in errors}
    assert all("finished nothing for 2 s and was killed" in e["reason"] for e in errors)
    with pytest.raises(BatchError, match="local pool"):
        batch.run(model, [str(folder)], out, backend="reference", ray="", task_timeout=2,
                  overwrite=True)


@pytest.mark.parametrize("reshape_to, why", [([1, FEATURES], "does not take batch 8"),
                                             ([1, -1], "not batch-first")])
def test_batch_falls_back_to_one_item_when_the_batch_cannot_grow(dataset, tmp_path, reshape_to, why):
    model = conv_model(reshape_to=reshape_to)
    folder, bad = dataset
    expected = expected_outputs(model, folder, reference_one(model))
    result = batch.run(model, [folder], str(tmp_path / "out"), backend="reference", batch_size=8,
                       workers=1)
    found = batch.read_outputs(str(tmp_path / "out"))
    assert sorted(found) == sorted(expected)
    assert all(np.array_equal(found[k]["out"], v) for k, v in expected.items())
    worker = result.workers[0]
    assert worker["items_per_invoke"] == 1 and why in worker["batching"]


def test_batch_falls_back_when_rows_are_not_independent(tmp_path):
    model = batch_mixing_model()
    folder = tmp_path / "in"
    write_arrays(folder, 20, (FEATURES,), seed=4)
    result = batch.run(model, [str(folder)], str(tmp_path / "out"), backend="reference",
                       batch_size=8, workers=1)
    found = batch.read_outputs(str(tmp_path / "out"))
    assert len(found) == 20
    # one item at a time, x - mean(x) is zero; a mixed batch of 8 would not be
    assert all(np.array_equal(v["y"], np.zeros(FEATURES, np.float32)) for v in found.values())
    assert result.workers[0]["items_per_invoke"] == 1
    assert "not a batch" in result.workers[0]["batching"]


def test_workers_get_their_gpu(model, tmp_path, monkeypatch):
    """Worker i on GPU i mod G: CUDA_VISIBLE_DEVICES (cuda), and TI_VISIBLE_DEVICE, Taichi's
    Vulkan device index (vulkan); each worker process really starts with its own."""
    from tflite_taichi.batch.pool import LocalPool, worker_environments
    from tflite_taichi.batch.runner import RunConfig
    envs = worker_environments("cuda", 4, ["2", "5"])
    assert [e["CUDA_VISIBLE_DEVICES"] for e in envs] == ["2", "5", "2", "5"]
    assert [e["TI_VISIBLE_DEVICE"] for e in worker_environments("vulkan", 2, ["0", "1"])] == ["0", "1"]
    assert worker_environments("cpu", 2, ["0"]) == [{}, {}]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,1")
    assert batch.gpu_devices() == ["3", "1"]
    # the environment reaches the worker processes (a reference run: no GPU needed)
    folder = tmp_path / "in"
    write_arrays(folder, 80, ITEM, seed=0, zeros=True)
    spec = input_spec(Interpreter(model_content=model, backend="reference"))
    info = batch.output_info(Interpreter(model_content=model, backend="reference"))
    config = RunConfig(model=model, backend="reference", precision="fp32", batch_size=8, spec=spec,
                       info=info, out_dir=str(tmp_path), fmt="npz")
    items, _ = batch.discover([str(folder)])
    for gpu in ("7", "9"):
        report = LocalPool(config, [{"CUDA_VISIBLE_DEVICES": gpu}], retries=0).run([(0, items)])
        assert [w["gpu"] for w in report["workers"]] == [gpu]
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "3,1"       # the driver's own is untouched


def test_the_driver_never_starts_taichi(model, tmp_path):
    """The driver reads the model with the reference path only: the GPU is the workers'."""
    path = tmp_path / "m.tflite"
    path.write_bytes(model)
    folder = tmp_path / "in"
    folder.mkdir()
    np.save(folder / "a.npy", np.zeros((SIDE, SIDE, CHANNELS), np.float32))
    code = ("import sys; from tflite_taichi import batch; "
            f"r = batch.run({str(path)!r}, [{str(folder)!r}], {str(tmp_path / 'out')!r}, "
            "backend='cpu', workers=1); "
            "print(r.written, 'taichi' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split()[-2:] == ["1", "False"], proc.stdout


def test_the_plain_install_runs_arrays_without_the_extras(model, tmp_path):
    """Without Pillow and pyarrow (the batch extra), .npy inputs to .npz outputs still run, and
    what needs them says which extra to install."""
    path = tmp_path / "m.tflite"
    path.write_bytes(model)
    folder = tmp_path / "in"
    folder.mkdir()
    np.save(folder / "a.npy", np.zeros((SIDE, SIDE, CHANNELS), np.float32))
    _png(str(folder / "b.png"), np.random.default_rng(10))
    code = textwrap.dedent(f"""
        import sys
        sys.modules["pyarrow"] = sys.modules["PIL"] = None       # as if not installed
        from tflite_taichi import batch
        from tflite_taichi.errors import BatchError
        for fmt in ("parquet", "npz"):
            try:
                r = batch.run({str(path)!r}, [{str(folder)!r}], {str(tmp_path / "out")!r},
                              backend="reference", workers=1, fmt=fmt)
                print(fmt, "ran")
            except BatchError as e:
                print(fmt, "refused:", e)
        r = batch.run({str(path)!r}, [{str(folder / "a.npy")!r}], {str(tmp_path / "out")!r},
                      backend="reference", workers=1, fmt="npz")
        print("npy ran:", r.written)
        """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert "parquet refused:" in lines[0] and "tflite-taichi[batch]" in lines[0]
    assert "npz refused:" in lines[1] and "images, which need Pillow" in lines[1]
    assert lines[2] == "npy ran: 1"


# -- inputs ----------------------------------------------------------------------------------------
def test_metadata_normalization_round_trip():
    model = read_model(conv_model(Normalization([1.0, 2.0, 3.0], [4.0, 5.0, 6.0])))
    found, problem = input_normalizations(model)
    assert problem is None and found == [Normalization([1.0, 2.0, 3.0], [4.0, 5.0, 6.0])]
    assert input_normalizations(read_model(conv_model(None))) == ([], None)


def test_metadata_normalization_of_real_models(shared_models):
    # MediaPipe's selfie segmenter takes [0, 1]; its face detector [-1, 1] (their metadata)
    selfie = read_model(os.path.join(shared_models, "selfie_segmentation.tflite"))
    face = read_model(os.path.join(shared_models, "face_detection_short_range.tflite"))
    assert input_normalizations(selfie) == ([Normalization([0.0], [255.0])], None)
    assert input_normalizations(face) == ([Normalization([127.5], [127.5])], None)


def test_unreadable_metadata_is_ignored_with_the_reason():
    mb = ModelBuilder()
    sg = mb.subgraph()
    x = sg.input("x", [1, 2])
    y = sg.tensor("y", [1, 2])
    sg.op("RELU", [x], [y])
    sg.output(y)
    mb.metadata("TFLITE_METADATA", b"\x00\x01garbage")
    found, problem = input_normalizations(read_model(mb.finish()))
    assert found == [] and "unreadable" in problem


def test_images_are_resized_and_normalised(tmp_path):
    rng = np.random.default_rng(5)
    path = str(tmp_path / "a.png")
    _png(path, rng, size=(13, 9))
    with open(path, "rb") as f:
        data = f.read()
    spec = input_spec(Interpreter(model_content=conv_model(), backend="reference"))
    got = decode(spec, path, data)[0]
    with PIL.open(path) as image:
        pixels = np.asarray(image.convert("RGB").resize((SIDE, SIDE), PIL.Resampling.BILINEAR))
    assert got.dtype == np.float32 and got.shape == (SIDE, SIDE, CHANNELS)
    assert np.array_equal(got, ((pixels.astype(np.float32) - 127.5) / 127.5).astype(np.float32))
    # --preprocess overrides the metadata
    unit = input_spec(Interpreter(model_content=conv_model(), backend="reference"),
                      parse_preprocess("unit"))
    assert np.array_equal(decode(unit, path, data)[0], pixels.astype(np.float32) / np.float32(255))


def test_images_of_a_float_model_without_normalization_are_refused(tmp_path):
    folder = tmp_path / "in"
    folder.mkdir()
    _png(str(folder / "a.png"), np.random.default_rng(6))
    with pytest.raises(BatchError, match="--preprocess"):
        batch.run(conv_model(normalization=None), [str(folder)], str(tmp_path / "out"),
                  backend="reference")
    result = batch.run(conv_model(normalization=None), [str(folder)], str(tmp_path / "out"),
                       backend="reference", preprocess="mean=0;std=255")
    assert result.written == 1


def test_uint8_images_are_pixels(tmp_path):
    mb = ModelBuilder()
    sg = mb.subgraph()
    x = sg.input("x", [1, SIDE, SIDE, CHANNELS], dtype=np.uint8)
    sg.output(x)
    spec = input_spec(Interpreter(model_content=mb.finish(), backend="reference"))
    path = str(tmp_path / "a.png")
    pixels = np.random.default_rng(7).integers(0, 256, (SIDE, SIDE, CHANNELS), dtype=np.uint8)
    PIL.fromarray(pixels).save(path)
    with open(path, "rb") as f:
        assert np.array_equal(decode(spec, path, f.read())[0], pixels)


@pytest.mark.parametrize("text, mean, std", [("unit", [0.0], [255.0]), ("signed", [127.5], [127.5]),
                                             ("mean=1,2,3;std=4,5,6", [1, 2, 3], [4, 5, 6])])
def test_preprocess_option(text, mean, std):
    assert parse_preprocess(text) == Normalization(mean, std)


@pytest.mark.parametrize("text", ["centered", "mean=1;std=0", "mean=a;std=1"])
def test_preprocess_option_errors(text):
    with pytest.raises(BatchError):
        parse_preprocess(text)


def test_npz_inputs_of_a_two_input_model(tmp_path):
    mb = ModelBuilder()
    sg = mb.subgraph()
    a = sg.input("a", [1, 3])
    b = sg.input("b", [1, 3])
    y = sg.tensor("y", [1, 3])
    sg.op("ADD", [a, b], [y])
    sg.output(y)
    model = mb.finish()
    folder = tmp_path / "in"
    folder.mkdir()
    np.savez(folder / "one.npz", a=np.ones(3, np.float32), b=np.full(3, 2, np.float32))
    np.savez(folder / "missing.npz", a=np.ones(3, np.float32))
    np.save(folder / "single.npy", np.ones(3, np.float32))
    out = str(tmp_path / "out")
    batch.run(model, [str(folder)], out, backend="reference", fmt="npz", workers=1)
    found = batch.read_outputs(out)
    assert list(found) == [str(folder / "one.npz")]
    assert np.array_equal(found[str(folder / "one.npz")]["y"], np.full(3, 3, np.float32))
    errors = {e["path"]: e["reason"] for e in batch.read_errors(out)}
    assert "has no 'b'" in errors[str(folder / "missing.npz")]
    assert "the model has 2 inputs" in errors[str(folder / "single.npy")]


# -- the output folder and the command line ------------------------------------------------------
def test_a_previous_run_is_not_mixed_with(model, tmp_path):
    folder = tmp_path / "in"
    folder.mkdir()
    np.save(folder / "a.npy", np.zeros((SIDE, SIDE, CHANNELS), np.float32))
    out = str(folder / "out")         # inside the inputs: skipped when they are searched
    batch.run(model, [str(folder)], out, backend="reference")
    with pytest.raises(BatchError, match="--overwrite"):
        batch.run(model, [str(folder)], out, backend="reference")
    (folder / "out" / "keep.txt").write_text("a user's file")
    result = batch.run(model, [str(folder)], out, backend="reference", overwrite=True)
    assert (folder / "out" / "keep.txt").exists()
    assert result.items == 1 and result.written == 1 and result.errors == 0
    # a part file copied under another name of the run's is an input written twice
    part = next(p for p in os.listdir(out) if p.endswith(".parquet"))
    copy = os.path.join(out, part[:-len("000000.parquet")] + "000099.parquet")
    with open(os.path.join(out, part), "rb") as src, open(copy, "wb") as dst:
        dst.write(src.read())
    with pytest.raises(BatchError, match="written twice"):
        batch.read_outputs(out)


def test_missing_input_folder_is_an_error(model, tmp_path):
    with pytest.raises(BatchError, match="no such file"):
        batch.run(model, [str(tmp_path / "nowhere")], str(tmp_path / "out"), backend="reference")


def test_cli_batch(tmp_path):
    model = tmp_path / "m.tflite"
    model.write_bytes(conv_model())
    folder = tmp_path / "in"
    write_arrays(folder, 10, ITEM, seed=8, width=1)
    out = tmp_path / "out"
    command = [sys.executable, "-m", "tflite_taichi", "batch", str(model), str(folder),
               "--out", str(out), "--backend", "reference", "--batch", "4", "--workers", "2",
               "--format", "npz"]
    proc = subprocess.run(command, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "10 of 10 inputs written" in proc.stdout and "4 item(s) per invoke" in proc.stdout
    assert "local pool, 2 worker(s)" in proc.stdout       # 10 inputs: two tasks of 5, one each
    assert len(batch.read_outputs(str(out))) == 10
    (folder / "bad.npy").write_bytes(b"junk")
    proc = subprocess.run(command + ["--overwrite"], capture_output=True, text=True)
    assert proc.returncode == 1 and "1 in" in proc.stdout      # some inputs failed: status 1
    proc = subprocess.run(command, capture_output=True, text=True)
    assert proc.returncode == 2 and "--overwrite" in proc.stderr


# -- Ray -------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def ray_cluster(tmp_path_factory):
    """A local Ray cluster of 2 CPUs on this machine for this module; its workers see FAULT_ENV,
    which kills the first actor that runs a batch holding VICTIM (the marker file makes it once)
    where the run imports batch_faults (on the workers' PYTHONPATH).
    RAY_AUTH_MODE=disabled: a loopback cluster of the test's own, and Ray would otherwise write
    a token into ~/.ray (the suite writes nothing into HOME)."""
    ray = pytest.importorskip("ray", reason="the Ray tests need ray[data] (the ray extra; "
                              ".ci/run installs it)")
    marker = str(tmp_path_factory.mktemp("ray") / "killed")
    set_here = {FAULT_ENV: f"kill:{VICTIM}:{marker}", "RAY_AUTH_MODE": "disabled",
                "PYTHONPATH": with_tests_on_path(dict(os.environ))["PYTHONPATH"]}
    saved = {k: os.environ.get(k) for k in set_here}
    os.environ.update(set_here)
    try:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
                 object_store_memory=200 * 2**20)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k)
            else:
                os.environ[k] = v
    yield marker
    ray.shutdown()


def test_ray_reference_equals_one_interpreter(ray_cluster, model, dataset, expected_reference, tmp_path):
    folder, bad = dataset
    out = str(tmp_path / "out")
    result = batch.run(model, [folder], out, backend="reference", batch_size=8, workers=2,
                       ray="", cpus_per_worker=0.5)
    assert result.mode == "ray" and result.ray["actors"] == 2 and result.workers == []
    check_run(result, out, expected_reference, bad)
    # the inputs went to Ray in blocks of about 32 (one block would feed one actor only)
    assert len([n for n in os.listdir(out) if n.endswith(".parquet")]) >= 3


def test_ray_cpu_equals_one_interpreter(ray_cluster, model, dataset, cpu_worker, tmp_path):
    folder, bad = dataset
    expected = expected_outputs(model, folder, worker_one(cpu_worker, model))
    out = str(tmp_path / "out")
    result = batch.run(model, [folder], out, backend="cpu", batch_size=8, workers=2, ray="",
                       cpus_per_worker=0.5)
    check_run(result, out, expected, bad)


def test_ray_killed_actor_loses_nothing(ray_cluster, model, tmp_path):
    folder = str(tmp_path / "in")
    bad = write_dataset(folder, np.random.default_rng(9), n_npy=120, with_victim=True)["bad"]
    expected = expected_outputs(model, folder, reference_one(model))
    out = str(tmp_path / "out")
    result = batch.run(model, [folder], out, backend="reference", batch_size=8, workers=2,
                       ray="", cpus_per_worker=0.5, imports=FAULTS)
    assert os.path.exists(ray_cluster), "the victim's actor was not killed"
    check_run(result, out, expected, bad)


def test_ray_writes_parquet_only(ray_cluster, model, dataset, tmp_path):
    with pytest.raises(BatchError, match="Parquet"):
        batch.run(model, [dataset[0]], str(tmp_path / "out"), backend="reference", ray="", fmt="npz")


def test_cli_batch_on_ray(ray_cluster, model, tmp_path, capsys):
    from tflite_taichi.cli import main
    path = tmp_path / "m.tflite"
    path.write_bytes(model)
    folder = tmp_path / "in"
    write_arrays(folder, 70, ITEM, seed=11)
    out = tmp_path / "out"
    status = main(["batch", str(path), str(folder), "--out", str(out), "--backend", "reference",
                   "--ray", "--workers", "2", "--cpus-per-worker", "0.5", "--batch", "8"])
    printed = capsys.readouterr().out
    assert status == 0, printed
    assert "70 of 70 inputs written" in printed and "Ray, 2 actor(s) of 0 GPU and 0.5 CPU" in printed
    assert len(batch.read_outputs(str(out))) == 70


# -- several GPUs, faked (what one machine without them can hold) ----------------------
def _four_fake_gpus(monkeypatch):
    """The local pool's workers on four GPUs, as on a machine with four: worker i gets
    CUDA_VISIBLE_DEVICES=i (the runs are on the reference path, which needs none)."""
    from tflite_taichi.batch import pool
    real = pool.worker_environments
    monkeypatch.setattr(pool, "worker_environments",
                        lambda backend, workers, devices: real("cuda", workers, ["0", "1", "2", "3"]))


def test_a_gpu_lost_mid_run_retires_its_slot_and_the_others_finish(model, tmp_path, monkeypatch):
    """The worker on GPU 2 dies running its first task, and no worker starts on GPU 2 again:
    its slot is retired, the other three GPUs run its work, nothing is lost or written twice."""
    folder = str(tmp_path / "in")
    bad = write_dataset(folder, np.random.default_rng(3), n_npy=160)["bad"]
    expected = expected_outputs(model, folder, reference_one(model))
    marker = str(tmp_path / "gpu2-lost")
    monkeypatch.setenv(FAULT_ENV, f"lose_gpu:2:{marker}")
    record_retirements(monkeypatch, marker)     # GPUs 0, 1 and 3 wait for GPU 2's slot to go
    _four_fake_gpus(monkeypatch)
    out = str(tmp_path / "out")
    result = batch.run(model, [folder], out, backend="reference", batch_size=8, workers=4,
                       imports=FAULTS)
    assert os.path.exists(marker), "the worker on GPU 2 was not killed"
    check_run(result, out, expected, bad)
    by_gpu = {w.get("gpu"): w for w in result.workers}
    assert sorted(by_gpu) == ["0", "1", "2", "3"]
    assert "GPU 2 is gone" in by_gpu["2"]["retired"]
    assert all(by_gpu[g]["items"] > 0 and "retired" not in by_gpu[g] for g in "013")
    assert any("worker 2 (GPU 2) was retired" in note for note in result.notes)
    assert result.restarts >= 1


def test_the_run_ends_only_when_no_gpu_is_left(model, tmp_path, monkeypatch):
    folder = str(tmp_path / "in")
    write_arrays(tmp_path / "in", 40, ITEM, seed=0, zeros=True)
    _four_fake_gpus(monkeypatch)
    marker = str(tmp_path / "gpu1-missing")
    monkeypatch.setenv(FAULT_ENV, f"no_gpu:1:{marker}")    # one GPU missing from the start
    record_retirements(monkeypatch, marker)
    result = batch.run(model, [folder], str(tmp_path / "one"), backend="reference", batch_size=4,
                       workers=4, imports=FAULTS)
    assert result.written == 40
    assert [w["worker"] for w in result.workers if "retired" in w] == [1]
    monkeypatch.setenv(FAULT_ENV, "no_gpu:*:")             # every GPU missing
    with pytest.raises(BatchError, match=r"no worker could start: worker 0 \(GPU 0\): it cannot "
                                         r"start an interpreter: .*GPU 0 is gone.*; worker 3 \(GPU 3\)"):
        batch.run(model, [folder], str(tmp_path / "none"), backend="reference", batch_size=4,
                  workers=4, imports=FAULTS)


NO_GPU = switches.value("TFLITE_TAICHI_EXPECT_GPU") == "none"


def test_auto_without_a_gpu_runs_the_workers_on_litert(model, dataset, tmp_path):
    """`auto` decided once in the driver as an Interpreter would: on a machine without a
    hardware GPU, LiteRT's CPU kernels, in every worker, one thread each (the cores shared out):
    outputs equal LiteRT's, item by item."""
    from tflite_taichi import backend as backends
    if backends.choose_auto() != "cpu":
        assert not NO_GPU, "TFLITE_TAICHI_EXPECT_GPU=none, yet auto picked a GPU backend"
        pytest.skip("this machine has a hardware GPU: auto does not pick the CPU")
    folder, bad = dataset
    out = str(tmp_path / "out")
    result = batch.run(model, [folder], out, backend="auto", batch_size=1, workers=2)
    assert result.backend == "litert"
    check_run(result, out, expected_outputs(model, folder, reference_one(model, backend="litert",
                                                                      num_threads=1)), bad)
