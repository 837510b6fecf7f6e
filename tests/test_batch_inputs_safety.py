"""tflite-taichi batch against inputs that would cost more than themselves (a hostile or
huge input must not take the run down): a bad input is one row in errors.jsonl with its reason, never its
worker's death nor its task's neighbours', nor the driver's or a worker's wait or memory.

A non-UTF-8 file name runs (keyed with its bytes as \\xNN); a tiny .npy declaring 400 GB and a
tiny PNG declaring 30000 x 30000 pixels are item errors; an input that kills every worker
running it is halved out of its task and costs one row; an .npz's unused or inflating members
are never inflated; FIFOs and a link to /dev/zero are listed, not read; a symlinked subfolder inside the
input folder is searched, one outside it and a link loop listed.
"""
import io
import os
import struct
import subprocess
import sys
import textwrap
import tracemalloc
import zipfile
import zlib

import numpy as np
import pytest

from tflite_taichi import batch
from tflite_taichi.batch.inputs import ItemError, decode, discover, input_spec
from batch_faults import FAULT_ENV, FAULTS
from tflite_taichi.builder import ModelBuilder
from tflite_taichi.interpreter import Interpreter
from tflite_taichi.metadata import Normalization, normalization_metadata
from cases.batch import write_arrays

pytest.importorskip("PIL.Image", reason="the batch tests need Pillow (the test extra)")
pytest.importorskip("pyarrow", reason="the batch tests need pyarrow (the test extra)")

SIDE, CHANNELS = 4, 3
ITEM = (SIDE, SIDE, CHANNELS)


def mean_model() -> bytes:
    """x [1, 4, 4, 3] (batch resizable, image normalization metadata) -> mean over H, W [1, 3]."""
    mb = ModelBuilder()
    sg = mb.subgraph()
    x = sg.input("x", [1, *ITEM], shape_signature=[-1, *ITEM])
    y = sg.tensor("y", [1, CHANNELS])
    sg.op("MEAN", [x, sg.const("axes", np.array([1, 2], np.int32))], [y], keep_dims=False)
    sg.output(y)
    mb.metadata("TFLITE_METADATA", normalization_metadata([Normalization([127.5], [127.5])]))
    return mb.finish()


@pytest.fixture(scope="module")
def model():
    return mean_model()


@pytest.fixture(scope="module")
def spec(model):
    return input_spec(Interpreter(model_content=model, backend="reference"))


def npy_declaring(shape, dtype="<f4") -> bytes:
    """A .npy header declaring `shape` and no data: a few hundred bytes."""
    f = io.BytesIO()
    np.lib.format.write_array_header_1_0(f, {"descr": dtype, "fortran_order": False,
                                            "shape": tuple(shape)})
    return f.getvalue()


def png_declaring(width, height) -> bytes:
    """A 69-byte PNG whose header declares width x height RGB pixels (no pixel data)."""
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + \
            struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"")) + \
        chunk(b"IEND", b"")


def expect_means(arrays: dict, found: dict) -> None:
    assert sorted(found) == sorted(arrays)
    for key, value in arrays.items():
        np.testing.assert_allclose(found[key]["y"], value.mean(axis=(0, 1)), rtol=1e-5, atol=1e-6)


# -- one bad input costs one row ----------------------------------------------------------------
@pytest.mark.parametrize("fmt", ["parquet", "npz"])
def test_a_file_name_that_is_not_utf8_runs_keyed_with_its_bytes(model, tmp_path, fmt):
    folder = tmp_path / "in"
    arrays = write_arrays(folder, 3, ITEM, width=3)
    value = np.full(ITEM, 2.0, np.float32)
    odd = os.path.join(os.fsencode(str(folder)), b"odd\xff\xfe.npy")
    with open(odd, "wb") as f:
        np.save(f, value)
    with open(os.path.join(os.fsencode(str(folder)), b"junk\xff.npy"), "wb") as f:
        f.write(b"not numpy")
    out = str(tmp_path / "out")
    result = batch.run(model, [str(folder)], out, backend="reference", workers=1, fmt=fmt)
    key = os.path.join(str(folder), "odd\\xff\\xfe.npy")       # the bytes shown as \xNN
    expect_means({**arrays, key: value}, batch.read_outputs(out))
    errors = batch.read_errors(out)                                # errors.jsonl takes the key
    assert [e["path"] for e in errors] == [os.path.join(str(folder), "junk\\xff.npy")]
    assert "not a .npy file" in errors[0]["reason"]
    assert result.written == 4 and result.restarts == 0


def test_an_npy_header_declaring_400_gb_is_refused_unread(spec):
    data = npy_declaring((100_000, 1_000_000))                   # 4e11 bytes of float32
    assert len(data) < 200
    with pytest.raises(ItemError, match=r"has shape \[100000, 1000000\]"):
        decode(spec, "huge.npy", data)
    # the right shape with its data cut short, and a header that lies about the dtype
    with pytest.raises(ItemError, match="truncated: 0 bytes of the 192"):
        decode(spec, "short.npy", npy_declaring((1, *ITEM)))
    with pytest.raises(ItemError, match="is object"):
        decode(spec, "objects.npy", npy_declaring(ITEM, "|O"))


def test_a_png_declaring_30000_squared_pixels_is_an_item_error(spec):
    data = png_declaring(30000, 30000)
    assert len(data) < 80
    with pytest.raises(ItemError, match="too large to decode"):
        decode(spec, "bomb.png", data)


def test_bad_inputs_are_rows_and_their_neighbours_are_written(model, tmp_path):
    """One task of 32 holding the 400 GB .npy and the 30000^2 PNG: both are item errors; the
    worker lives, and its task's other inputs are written."""
    folder = tmp_path / "in"
    arrays = write_arrays(folder, 30, ITEM, width=3)
    (folder / "huge.npy").write_bytes(npy_declaring((100_000, 1_000_000)))
    (folder / "bomb.png").write_bytes(png_declaring(30000, 30000))
    out = str(tmp_path / "out")
    result = batch.run(model, [str(folder)], out, backend="reference", workers=1, retries=0)
    expect_means(arrays, batch.read_outputs(out))
    reasons = {os.path.basename(e["path"]): e["reason"] for e in batch.read_errors(out)}
    assert sorted(reasons) == ["bomb.png", "huge.npy"]
    assert "too large to decode" in reasons["bomb.png"] and "has shape" in reasons["huge.npy"]
    assert result.restarts == 0


def test_a_decoder_s_memory_error_is_the_item_s(model, spec, tmp_path, monkeypatch):
    """Whatever decoding one input raises (MemoryError, a decoder's bug) is that item's error."""
    from tflite_taichi.batch import runner as runner_module
    config = runner_module.RunConfig(model=model, backend="reference", precision="fp32",
                                     batch_size=4, spec=spec, info=batch.output_info(
                                         Interpreter(model_content=model, backend="reference")),
                                     out_dir=str(tmp_path), fmt="parquet")
    run = runner_module.BatchRunner(config)
    real = runner_module.decode

    def decode_or_fail(spec, key, payload):
        if key == "oom.npy":
            raise MemoryError("Unable to allocate 373. GiB")
        if key == "bug.npy":
            raise IndexError("a decoder's bug")
        return real(spec, key, payload)
    monkeypatch.setattr(runner_module, "decode", decode_or_fail)
    good = io.BytesIO()
    np.save(good, np.ones(ITEM, np.float32))
    keys, outputs, errors = run.run([("a.npy", good.getvalue()), ("oom.npy", b""),
                                     ("bug.npy", b""), ("b.npy", good.getvalue())])
    assert keys == ["a.npy", "b.npy"] and outputs[0].shape == (2, CHANNELS)
    assert errors == [("oom.npy", "cannot be decoded (MemoryError: Unable to allocate 373. GiB)"),
                      ("bug.npy", "cannot be decoded (IndexError: a decoder's bug)")]


def test_an_input_that_kills_every_worker_costs_one_row(model, tmp_path, monkeypatch):
    """Its task (32 inputs) is halved at each death until it runs alone: the other 31 are
    written, and it is given up after the retries with the reason."""
    folder = tmp_path / "in"
    arrays = write_arrays(folder, 31, ITEM, width=3)
    np.save(folder / "z_kills.npy", np.zeros(ITEM, np.float32))
    monkeypatch.setenv(FAULT_ENV, "kill:z_kills.npy:")           # every attempt dies
    out = str(tmp_path / "out")
    result = batch.run(model, [str(folder)], out, backend="reference", batch_size=8, workers=1,
                       retries=2, imports=FAULTS)
    expect_means(arrays, batch.read_outputs(out))
    errors = batch.read_errors(out)
    assert [e["path"] for e in errors] == [str(folder / "z_kills.npy")]
    assert "the worker running it alone died 3 times (last: exit status -9)" in errors[0]["reason"]
    assert result.written == 31 and result.restarts == 5 + 3      # 32, 16, 8, 4, 2; then alone


# -- what is read, and how much -----------------------------------------------------------------
def _zip_member(archive: zipfile.ZipFile, name: str, header: bytes, data_bytes: int) -> None:
    """A deflated member: `header`, then `data_bytes` zero bytes (written in pieces: the
    test itself never holds them)."""
    with archive.open(name, "w", force_zip64=True) as member:
        member.write(header)
        piece = bytes(1 << 20)
        for _ in range(data_bytes >> 20):
            member.write(piece)


def _peak_bytes(action) -> int:
    tracemalloc.start()
    try:
        action()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_an_npz_is_checked_from_its_members_headers_before_inflating(spec):
    value = np.arange(np.prod(ITEM), dtype=np.float32).reshape(ITEM)
    inflated = 128 << 20
    f = io.BytesIO()
    with zipfile.ZipFile(f, "w", zipfile.ZIP_DEFLATED) as archive:
        np.lib.format.write_array(archive.open("x.npy", "w"), value)
        _zip_member(archive, "junk.npy", npy_declaring((inflated // 4,)), inflated)   # unused
    data = f.getvalue()
    assert len(data) < 1 << 20
    arrays = []
    peak = _peak_bytes(lambda: arrays.append(decode(spec, "bomb.npz", data)))
    np.testing.assert_array_equal(arrays[0][0], value)
    assert peak < 16 << 20, f"decoding took {peak >> 20} MiB: the unused member was inflated"
    # the input's own member: its header declares too much (refused unread), or the right shape
    # with a mountain of zeros behind it (only the declared bytes are inflated)
    def decoded(header: bytes) -> tuple:
        f = io.BytesIO()
        with zipfile.ZipFile(f, "w", zipfile.ZIP_DEFLATED) as archive:
            _zip_member(archive, "x.npy", header, inflated)
        found = []

        def run():
            try:
                found.append(decode(spec, "bomb.npz", f.getvalue()))
            except ItemError as e:
                found.append(e)
        return _peak_bytes(run), found[0]

    peak, refused = decoded(npy_declaring((inflated // 4,)))
    assert peak < 16 << 20 and isinstance(refused, ItemError) and "has shape" in str(refused)
    peak, arrays = decoded(npy_declaring(ITEM))
    assert peak < 16 << 20 and np.all(arrays[0] == 0)


def test_fifos_and_a_link_to_dev_zero_are_listed_not_read(model, tmp_path):
    """x.npy and x.parquet FIFOs (nobody writes them: opening one waits forever) and z.npy ->
    /dev/zero (never ends): each is a row saying what it is; the run ends, its good inputs
    written. In a child with a time limit and a memory limit: before, it hung or ran out."""
    folder = tmp_path / "in"
    arrays = write_arrays(folder, 3, ITEM, width=3)
    os.mkfifo(folder / "x.npy")
    os.mkfifo(folder / "x.parquet")
    os.symlink("/dev/zero", folder / "z.npy")
    (tmp_path / "model.tflite").write_bytes(model)
    out = tmp_path / "out"
    script = textwrap.dedent(f"""
        import resource
        resource.setrlimit(resource.RLIMIT_AS, (8 << 30, 8 << 30))
        from tflite_taichi import batch
        batch.run({str(tmp_path / 'model.tflite')!r}, [{str(folder)!r}], {str(out)!r},
                  backend="reference", workers=1, retries=0, task_timeout=20)
    """)
    done = subprocess.run([sys.executable, "-c", script], timeout=120, capture_output=True,
                          text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    expect_means(arrays, batch.read_outputs(str(out)))
    reasons = {os.path.basename(e["path"]): e["reason"] for e in batch.read_errors(str(out))}
    assert sorted(reasons) == ["x.npy", "x.parquet", "z.npy"]
    assert "not a regular file (a FIFO)" in reasons["x.npy"]
    assert "not a regular file (a FIFO)" in reasons["x.parquet"]
    assert "not a regular file (a link to /dev/zero, a character device)" in reasons["z.npy"]


def test_a_worker_reads_only_regular_files_of_bounded_size(spec, tmp_path):
    """The worker's own check (the file may have changed since it was found): on the open file."""
    from tflite_taichi.batch.inputs import Item, TableCache, load_payload
    os.mkfifo(tmp_path / "late.npy")
    with pytest.raises(ItemError, match="a FIFO"):
        load_payload(Item("late.npy", str(tmp_path / "late.npy")), TableCache(), spec)
    with pytest.raises(ItemError, match="a character device"):
        load_payload(Item("zero.npy", "/dev/zero"), TableCache(), spec)
    big = tmp_path / "big.npy"
    with open(big, "wb") as f:
        f.truncate(200 << 20)                                    # sparse: no disk used
    with pytest.raises(ItemError, match="more than the"):
        load_payload(Item("big.npy", str(big)), TableCache(), spec)


def test_symlinked_folders_are_searched_once_and_loops_are_listed(tmp_path):
    root = tmp_path / "in"
    (root / "real").mkdir(parents=True)
    write_arrays(root / "kept" / "deep", 2, ITEM, width=3)
    write_arrays(root / "real", 1, ITEM, width=3)
    os.symlink(root / "kept" / "deep", root / "linked")        # a link to a folder inside
    os.symlink(root, root / "real" / "loop")                     # back to an ancestor
    os.symlink(root / "real", root / "s_again")                  # a folder searched already
    os.symlink(tmp_path / "nowhere", root / "dangling.npy")      # a link to nothing
    items, problems = discover([str(root)])
    assert [i.key for i in items] == [str(root / "kept" / "deep" / "a000.npy"),
                                      str(root / "kept" / "deep" / "a001.npy"),
                                      str(root / "real" / "a000.npy")]
    reasons = dict(problems)
    assert sorted(reasons) == [str(root / "dangling.npy"), str(root / "linked"),
                               str(root / "real" / "loop"), str(root / "s_again")]
    assert "a link to a folder searched already" in reasons[str(root / "real" / "loop")]
    assert reasons[str(root / "real" / "loop")].endswith(", a loop)")
    assert "searched already (" + str(root / "real") in reasons[str(root / "s_again")]
    assert "searched already (" + str(root / "kept" / "deep") in reasons[str(root / "linked")]
    assert "a link to " in reasons[str(root / "dangling.npy")]


def test_a_link_to_a_folder_outside_the_input_folder_is_listed_not_followed(tmp_path):
    """One link to /usr/share once made 50,265 inputs: a link to a folder is followed only
    inside the input folder given; a link to a file is one input, and is read."""
    root, elsewhere = tmp_path / "in", tmp_path / "elsewhere"
    write_arrays(root, 1, ITEM, width=3)
    write_arrays(elsewhere / "tree", 3, ITEM, width=3)
    os.symlink(elsewhere / "tree", root / "outside")
    os.symlink("/usr/share", root / "usr_share")
    os.symlink(elsewhere / "tree" / "a000.npy", root / "one.npy")
    items, problems = discover([str(root)])
    assert [i.key for i in items] == [str(root / "a000.npy"), str(root / "one.npy")]
    reasons = dict(problems)
    assert sorted(reasons) == [str(root / "outside"), str(root / "usr_share")]
    assert reasons[str(root / "outside")] == (
        f"a link to a folder outside the input folder ({elsewhere / 'tree'}): not followed; "
        "give that folder as an input to run what it holds")
    items, problems = discover([str(root / "outside")])       # given, it is searched
    assert len(items) == 3 and problems == []


def test_under_ray_a_name_that_is_not_utf8_is_a_row(tmp_path):
    """Ray Data's readers take UTF-8 paths only: such a file is listed, the others go to Ray."""
    from tflite_taichi.batch.ray_data import ray_readable
    folder = tmp_path / "in"
    write_arrays(folder, 1, ITEM, width=3)
    with open(os.path.join(os.fsencode(str(folder)), b"odd\xff.npy"), "wb") as f:
        np.save(f, np.zeros(ITEM, np.float32))
    items, _ = discover([str(folder)])
    taken, refused = ray_readable(items)
    assert [i.key for i in taken] == [str(folder / "a000.npy")]
    assert refused == [(str(folder / "odd\\xff.npy"),
                        "its name is not UTF-8, which Ray Data's readers need (the local pool, "
                        "without --ray, runs it)")]


def test_a_split_task_s_files_are_removed_before_its_halves_run(model, spec, tmp_path):
    """A worker may die after writing its task's part file or error part: the halves write
    those inputs again under their own names, so the task's files must go (no input twice)."""
    import collections

    from tflite_taichi.batch.inputs import Item
    from tflite_taichi.batch.outputs import ERROR_PARTS, error_part_name
    from tflite_taichi.batch.pool import LocalPool, part_name
    from tflite_taichi.batch.runner import RunConfig
    out = tmp_path / "out"
    (out / ERROR_PARTS).mkdir(parents=True)
    items = [Item(f"k{i}.npy", f"k{i}.npy") for i in range(5)]
    written = [out / f"{part_name(3)}.parquet",
               out / ERROR_PARTS / (error_part_name([i.key for i in items]) + ".jsonl")]
    for path in written:
        path.write_text("a dead worker's")
    config = RunConfig(model=model, backend="reference", precision="fp32", batch_size=1,
                       spec=spec, info=[], out_dir=str(out), fmt="parquet")
    pool = LocalPool(config, [{}], retries=2)
    pool.by_id, pool.finished, pool.pending, pool.next_id = \
        {3: items}, set(), collections.deque(), 4
    pool._split(3)
    assert not any(path.exists() for path in written)
    assert list(pool.pending) == [(4, items[:2]), (5, items[2:])] and pool.finished == {3}
